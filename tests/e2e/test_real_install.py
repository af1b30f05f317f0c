"""Installed for real: ``helm install`` of the chart on a real node, from the project's own image.

The image is the Dockerfile's, built offline as an OCI archive (tools/image/oci.sh) and imported
into the real node's containerd (``ctr images import``, as a user side-loads an image); helm is
the real one (tools/helm) and installs the chart as a user would, with the mock cloud enabled
and every pod placed on the real node (its taint tolerated through the chart's values). Then:

* the provider (2 replicas, leader election), the companion (2) and the mock cloud run as real
  containers of that image, on a read-only root as the user 65532; the virtual node registers
  and becomes Ready, with the leader's pod IP as its InternalIP;
* an unschedulable GPU pod that an OverflowPolicy selects is admitted to the virtual node and
  runs in the mock cloud (the provider reaches the mock cloud by its Service's DNS name);
* ``kubectl logs`` of that cloud pod works: the API server dials the virtual node's InternalIP,
  the leader pod's kubelet API, over the route the real node gives the host to its pod range;
* ``helm upgrade`` with a changed setting rolls both Deployments, and a new provider pod takes
  the lead (and the virtual node stays Ready, the cloud pod Running);
* ``helm uninstall`` runs the pre-delete hook (``vkprovider decommission``): the mock cloud lists
  no live instance before it goes, the virtual Node is gone, and so is every object of the
  release.

The timings (image import, install to virtual node Ready, the whole install) are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.realnode import (
    TOLERATION,
    RealNode,
    find_image_archive,
    find_kubectl,
)
from vkprovider.testing.waiting import eventually

from .bursts import burst_objects

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vkprovider"
POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
Obj = dict[str, Any]


def find_helm() -> Path:
    """helm v4: ``VKP_HELM_BIN``'s, else tools/helm's build (cached)."""
    folder = os.environ.get("VKP_HELM_BIN")
    if not folder:
        done = subprocess.run(["bash", str(REPO / "tools" / "helm" / "build.sh")],
                              capture_output=True, text=True, timeout=1800, check=False)
        assert done.returncode == 0, f"tools/helm/build.sh failed:\n{done.stderr[-4000:]}"
        folder = done.stdout.strip().splitlines()[-1]
    path = Path(folder) / "helm"
    assert path.is_file(), f"{folder} has no helm"
    return path


def run(cluster: LocalCluster, argv: list[str], timeout: float = 600
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


async def helm(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run, cluster, [str(find_helm()), *args])


async def kubectl(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run, cluster, [str(find_kubectl()), *args], 60)


async def pods(kube: KubeClient, namespace: str, selector: str) -> list[Obj]:
    body = await kube.get(f"/api/v1/namespaces/{namespace}/pods",
                          params={"labelSelector": selector})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: Obj) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


async def node_ready(kube: KubeClient, name: str) -> Obj | None:
    with contextlib.suppress(NotFoundError):
        node = await kube.get(f"/api/v1/nodes/{name}")
        conds = node.get("status", {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            return node
    return None


async def lease_holder(kube: KubeClient, namespace: str, lease: str) -> str | None:
    with contextlib.suppress(NotFoundError):
        got = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}")
        return got["spec"].get("holderIdentity")
    return None


def component(name: str) -> str:
    return f"app.kubernetes.io/component={name}"


async def test_helm_install_on_a_real_node_bursts_to_the_mock_cloud_and_uninstalls_clean(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str,
        tmp_path: Path) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    archive = await asyncio.to_thread(find_image_archive)
    timings["image archive (built or cached)"] = time.monotonic() - t0
    t1 = time.monotonic()
    image = await asyncio.to_thread(real_node.import_image, archive)
    timings["ctr images import"] = time.monotonic() - t1
    repository, tag = image.rsplit(":", 1)

    suffix = uuid.uuid4().hex[:6]
    release, vnode = f"ri{suffix}", f"vk-real-{suffix}"
    fullname = f"{release}-vkprovider"
    on_the_real_node = {"nodeSelector": {"kubernetes.io/hostname": real_node.name},
                        "tolerations": [TOLERATION]}
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "node": {"name": vnode, "labels": {"vkprovider.io/pool": namespace}},
        "mockCloud": {"enabled": True, "extraArgs": ["--inventory=H100:us-east:8:2.49"],
                      **on_the_real_node},
        "provider": on_the_real_node,
        "companion": on_the_real_node,
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    installed = False
    try:
        t2 = time.monotonic()
        done = await helm(local_cluster, "install", release, str(CHART), "--namespace", namespace,
                          "--values", str(values_file), "--wait", "--timeout", "8m")
        timings["helm install --wait"] = time.monotonic() - t2
        installed = done.returncode == 0
        assert done.returncode == 0, done.stdout + done.stderr

        node = await eventually(lambda: node_ready(kube, vnode), timeout=120, interval=0.5,
                                what=f"virtual node {vnode} Ready")
        timings["install to virtual node Ready"] = time.monotonic() - t2

        # every pod of the release: a container of the imported image, on the real node
        providers = await pods(kube, namespace, component("virtual-kubelet"))
        companions = await pods(kube, namespace, component("companion"))
        clouds = await pods(kube, namespace, component("mock-cloud"))
        assert (len(providers), len(companions), len(clouds)) == (2, 2, 1)
        for pod in [*providers, *companions, *clouds]:
            assert pod["spec"]["nodeName"] == real_node.name, pod["metadata"]["name"]
            assert ready(pod), pod["metadata"]["name"]
            (status,) = pod["status"]["containerStatuses"]
            assert status["image"].endswith(image) and status["imageID"], status
            security = pod["spec"]["containers"][0]["securityContext"]
            assert security["readOnlyRootFilesystem"] is True and security["runAsUser"] == 65532
            assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(
                real_node.pod_cidr)

        # one provider leads; the node's InternalIP is the leader pod's IP (the kubelet API)
        leader = await eventually(lambda: lease_holder(kube, namespace, f"vkprovider-{vnode}"),
                                  timeout=60, what="the provider's Lease held")
        assert leader in {p["metadata"]["name"] for p in providers}
        leader_ip = next(p["status"]["podIP"] for p in providers
                         if p["metadata"]["name"] == leader)
        internal = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert internal["InternalIP"] == leader_ip
        # the companion's identity is <hostname>-<pid>: the pod's name, then the pid
        holder = await eventually(
            lambda: lease_holder(kube, namespace, f"vkprovider-companion-{vnode}"),
            timeout=60, what="the companion's Lease held")
        assert holder.rsplit("-", 1)[0] in {p["metadata"]["name"] for p in companions}, holder

        # the provider reached the mock cloud (by its Service's DNS name): the node has its GPUs
        async def gpus() -> int:
            got = await kube.get(f"/api/v1/nodes/{vnode}")
            return int(got["status"].get("allocatable", {}).get("nvidia.com/gpu", "0"))

        assert await eventually(gpus, timeout=120, what=f"{vnode} with the mock cloud's GPUs") == 8

        # an overflow: nothing inside fits (no node of this pool but the virtual one)
        policy = f"real-{suffix}"
        overflow, deployment = burst_objects(namespace=namespace, policy=policy)
        await kube.create(POLICIES, overflow)
        await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
        (burst,) = await eventually(
            lambda: pods(kube, namespace, "app=burst"),
            until=lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName") == vnode
            and ps[0]["status"].get("phase") == "Running", timeout=180,
            what=f"the GPU pod Running on {vnode}")
        annotations = burst["metadata"]["annotations"]
        assert annotations["vkprovider.io/overflow-policy"] == policy
        assert annotations["vkprovider.io/provider"] == "mock"
        burst_name = burst["metadata"]["name"]

        # the mock cloud's own account of it, asked at its pod IP: the host routes the node's
        # pod range over the node's link (checked first: without that route this request would
        # take the host's default route, off the machine)
        cloud_ip = clouds[0]["status"]["podIP"]
        route = (await asyncio.to_thread(subprocess.run, ["ip", "-4", "route", "get", cloud_ip],
                                         capture_output=True, text=True, check=True)).stdout
        assert f" dev {real_node.host_if} " in route, route
        cloud_url = f"http://{cloud_ip}:8080"

        async def ledger() -> list[Obj]:
            async with httpx.AsyncClient(base_url=cloud_url, timeout=10) as http:
                resp = await http.get("/admin/ledger")
                resp.raise_for_status()
                body = resp.json()
                return list(body["instances"] if isinstance(body, dict) else body)

        live = [e for e in await ledger() if e["state"] != "deleted"]
        assert [e["uid"] for e in live] == [burst["metadata"]["uid"]]

        # kubectl logs: API server -> the virtual node's InternalIP:10250 -> the leader pod
        got = await eventually(
            lambda: kubectl(local_cluster, "-n", namespace, "logs", burst_name),
            until=lambda r: r.returncode == 0, timeout=60, interval=1,
            what=f"kubectl logs {burst_name}")
        assert "[mock] pulling image example.com/s:1" in got.stdout, got  # the instance's log

        # helm upgrade with a changed setting of each process's config file: both Deployments
        # roll (their checksum/config changes), a new provider pod leads; the mock cloud (its
        # instances in memory) is left alone
        old = {p["metadata"]["name"] for p in [*providers, *companions]}
        checksums = {p["metadata"]["annotations"]["checksum/config"]
                     for p in [*providers, *companions]}
        t3 = time.monotonic()
        done = await helm(local_cluster, "upgrade", release, str(CHART), "--namespace",
                          namespace, "--reuse-values", "--set", "companion.intervalSeconds=3",
                          "--set", "provider.settings.pods.workers=32", "--wait",
                          "--timeout", "8m")
        assert done.returncode == 0, done.stdout + done.stderr
        new_providers = await eventually(
            lambda: pods(kube, namespace, component("virtual-kubelet")),
            until=lambda ps: len(ps) == 2 and all(ready(p) for p in ps)
            and not {p["metadata"]["name"] for p in ps} & old, timeout=180,
            what="two new provider pods Ready")
        new_companions = await pods(kube, namespace, component("companion"))
        assert not {p["metadata"]["name"] for p in new_companions} & old
        for pod in [*new_providers, *new_companions]:
            assert pod["metadata"]["annotations"]["checksum/config"] not in checksums
        assert [p["metadata"]["name"] for p in await pods(kube, namespace,
                                                          component("mock-cloud"))] == [
            clouds[0]["metadata"]["name"]]
        names = {p["metadata"]["name"] for p in new_providers}
        await eventually(lambda: lease_holder(kube, namespace, f"vkprovider-{vnode}"),
                         until=lambda h: h in names, timeout=120,
                         what="a new provider pod leads")
        timings["helm upgrade to new leader"] = time.monotonic() - t3
        await eventually(lambda: node_ready(kube, vnode), timeout=120,
                         what=f"{vnode} Ready after the hand-over")
        after = await pods(kube, namespace, "app=burst")
        assert [(p["metadata"]["name"], p["status"].get("phase")) for p in after] == [
            (burst_name, "Running")]
        live = [e for e in await ledger() if e["state"] != "deleted"]
        assert [e["uid"] for e in live] == [burst["metadata"]["uid"]]  # adopted, not re-created

        # helm uninstall: the pre-delete hook decommissions; the mock cloud is watched until it
        # goes, so its last word is known
        last_seen: list[list[Obj]] = []
        stop_watching = asyncio.Event()

        async def watch_ledger() -> None:
            while not stop_watching.is_set():
                with contextlib.suppress(httpx.HTTPError, OSError):
                    last_seen.append(await ledger())
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch_ledger())
        t4 = time.monotonic()
        done = await helm(local_cluster, "uninstall", release, "--namespace", namespace,
                          "--wait", "--timeout", "6m")
        timings["helm uninstall (decommission hook)"] = time.monotonic() - t4
        stop_watching.set()
        await watcher
        assert done.returncode == 0, done.stdout + done.stderr
        installed = False
        assert last_seen, "the mock cloud was never read during the uninstall"
        assert [e for e in last_seen[-1] if e["state"] != "deleted"] == [], last_seen[-1]
        assert any(e["uid"] == burst["metadata"]["uid"] for e in last_seen[-1])
        with pytest.raises(NotFoundError):
            await kube.get(f"/api/v1/nodes/{vnode}")
        left = await eventually(
            lambda: pods(kube, namespace, f"app.kubernetes.io/instance={release}"),
            until=lambda ps: ps == [], timeout=120, what="the release's pods gone")
        assert left == []
        with pytest.raises(NotFoundError):
            await kube.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{fullname}")
    except BaseException:
        for selector in (component("virtual-kubelet"), component("companion"),
                         component("mock-cloud"), component("decommission")):
            for pod in await pods(kube, namespace, selector):
                got = await kubectl(local_cluster, "-n", namespace, "logs", "--tail=40",
                                    pod["metadata"]["name"])
                print(f"--- {pod['metadata']['name']} log (tail)\n{got.stdout}{got.stderr}")
        events = await kube.get(f"/api/v1/namespaces/{namespace}/events")
        print("--- events\n" + "\n".join(
            f"{e['involvedObject']['name']} {e['reason']}: {e.get('message', '')}"
            for e in events["items"][-40:]))
        raise
    finally:
        if installed:
            await helm(local_cluster, "uninstall", release, "--namespace", namespace,
                       "--no-hooks", "--timeout", "2m")
        for path in (f"{POLICIES}/real-{suffix}", f"/api/v1/nodes/{vnode}"):
            with contextlib.suppress(APIError):
                await kube.delete(path)
        print("\nreal install timings (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in timings.items()))

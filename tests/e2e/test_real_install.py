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
import time
import uuid
from pathlib import Path

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.realnode import RealNode
from vkprovider.testing.waiting import eventually

from .bursts import burst_objects
from .realinstall import (
    CHART,
    Obj,
    component,
    helm,
    import_project_image,
    kubectl,
    lease_holder,
    mock_cloud_api,
    node_ready,
    pods,
    print_release,
    ready,
    real_node_values,
    upgrade_with_a_new_leader,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"


async def test_helm_install_on_a_real_node_bursts_to_the_mock_cloud_and_uninstalls_clean(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str,
        tmp_path: Path) -> None:
    timings: dict[str, float] = {}
    image = await import_project_image(real_node, timings)

    suffix = uuid.uuid4().hex[:6]
    release, vnode = f"ri{suffix}", f"vk-real-{suffix}"
    fullname = f"{release}-vkprovider"
    values_file = real_node_values(real_node=real_node, image=image, virtual_node=vnode,
                                   pool=namespace,
                                   mock_cloud_args=["--inventory=H100:us-east:8:2.49"],
                                   tmp_path=tmp_path)
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

        # the mock cloud's own account of it, asked at its pod IP (see mock_cloud_api)
        ledger = (await mock_cloud_api(kube, real_node, namespace)).ledger

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
        new_providers, new_companions = await upgrade_with_a_new_leader(
            kube, local_cluster, release=release, namespace=namespace, virtual_node=vnode,
            sets=["companion.intervalSeconds=3", "provider.settings.pods.workers=32"])
        assert not {p["metadata"]["name"] for p in [*new_providers, *new_companions]} & old
        for pod in [*new_providers, *new_companions]:
            assert pod["metadata"]["annotations"]["checksum/config"] not in checksums
        assert [p["metadata"]["name"] for p in await pods(kube, namespace,
                                                          component("mock-cloud"))] == [
            clouds[0]["metadata"]["name"]]
        timings["helm upgrade to new leader"] = time.monotonic() - t3
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
        await print_release(kube, local_cluster, namespace)
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

"""``helm install`` of the chart on the real node, from the project's image: the shared steps.

Why it exists: two e2e tests install the chart on the real node as a user would, the install
test (``test_real_install.py``: leader election, logs, upgrade, uninstall) and the story over
kube-proxy with the installed chart (``test_real_story.py``); they import the image, write the
values that place every pod on the real node, run helm and kubectl, and print the release's
logs on a failure the same way, here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import MockCloudAPI
from vkprovider.testing.realnode import TOLERATION, RealNode, find_image_archive, find_kubectl
from vkprovider.testing.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vkprovider"
#: the mock cloud's port in the chart (``mockCloud.port``)
MOCK_CLOUD_PORT = 8080
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


async def upgrade_with_a_new_leader(kube: KubeClient, cluster: LocalCluster, *, release: str,
                                    namespace: str, virtual_node: str,
                                    sets: list[str]) -> tuple[list[Obj], list[Obj]]:
    """``helm upgrade --reuse-values`` with ``sets`` (``--set`` each; a changed setting of each
    process's config rolls both Deployments by their checksum/config), then: two new provider
    pods Ready, no companion pod of before, a new provider pod holding the Lease (the hand-over),
    the virtual node Ready. Returns the new provider and companion pods."""
    before = [*await pods(kube, namespace, component("virtual-kubelet")),
              *await pods(kube, namespace, component("companion"))]
    old = {p["metadata"]["name"] for p in before}
    lease = f"vkprovider-{virtual_node}"
    leader = await lease_holder(kube, namespace, lease)
    assert leader in old, (leader, old)
    done = await helm(cluster, "upgrade", release, str(CHART), "--namespace", namespace,
                      "--reuse-values", *(a for s in sets for a in ("--set", s)),
                      "--wait", "--timeout", "8m")
    assert done.returncode == 0, done.stdout + done.stderr
    providers = await eventually(
        lambda: pods(kube, namespace, component("virtual-kubelet")),
        until=lambda ps: len(ps) == 2 and all(ready(p) for p in ps)
        and not {p["metadata"]["name"] for p in ps} & old, timeout=180,
        what="two new provider pods Ready")
    companions = await pods(kube, namespace, component("companion"))
    assert companions and not {p["metadata"]["name"] for p in companions} & old, companions
    names = {p["metadata"]["name"] for p in providers}
    await eventually(lambda: lease_holder(kube, namespace, lease), until=lambda h: h in names,
                     timeout=120, what="a new provider pod leads")
    await eventually(lambda: node_ready(kube, virtual_node), timeout=120,
                     what=f"{virtual_node} Ready after the hand-over")
    return providers, companions


async def import_project_image(real_node: RealNode, timings: dict[str, float]) -> str:
    """The project's image archive (built or cached) imported into the node's containerd;
    its reference (``repository:tag``). Records both steps' seconds in ``timings``."""
    t0 = time.monotonic()
    archive = await asyncio.to_thread(find_image_archive)
    timings["image archive (built or cached)"] = time.monotonic() - t0
    t1 = time.monotonic()
    image = await asyncio.to_thread(real_node.import_image, archive)
    timings["ctr images import"] = time.monotonic() - t1
    return image


def real_node_values(*, real_node: RealNode, image: str, virtual_node: str, pool: str,
                     mock_cloud_args: list[str], tmp_path: Path,
                     extra: Obj | None = None) -> Path:
    """A values file: the imported image (never pulled), the virtual node ``virtual_node`` in
    the pool ``pool``, the mock cloud enabled with ``mock_cloud_args``, and the provider, the
    companion and the mock cloud on the real node (its taint tolerated); ``extra`` merged
    over the top level's sections."""
    repository, tag = image.rsplit(":", 1)
    on_the_real_node = {"nodeSelector": {"kubernetes.io/hostname": real_node.name},
                        "tolerations": [TOLERATION]}
    values: Obj = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "node": {"name": virtual_node, "labels": {"vkprovider.io/pool": pool}},
        "mockCloud": {"enabled": True, "extraArgs": mock_cloud_args, **on_the_real_node},
        "provider": dict(on_the_real_node),
        "companion": dict(on_the_real_node),
    }
    for section, more in (extra or {}).items():
        values[section] = {**values.get(section, {}), **more}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


async def mock_cloud_api(kube: KubeClient, real_node: RealNode, namespace: str) -> MockCloudAPI:
    """The release's mock cloud pod's API, at its pod IP: the host routes the node's pod range
    over the node's link, no port-forward and no relay (checked first: without that route a
    request would take the host's default route, off the machine)."""
    (cloud,) = await pods(kube, namespace, component("mock-cloud"))
    cloud_ip = cloud["status"]["podIP"]
    route = (await asyncio.to_thread(subprocess.run, ["ip", "-4", "route", "get", cloud_ip],
                                     capture_output=True, text=True, check=True)).stdout
    assert f" dev {real_node.host_if} " in route, route
    return MockCloudAPI(url=f"http://{cloud_ip}:{MOCK_CLOUD_PORT}")


async def print_release(kube: KubeClient, cluster: LocalCluster, namespace: str) -> None:
    """The tail of each release pod's log and the namespace's last Events (after a failure)."""
    for selector in (component("virtual-kubelet"), component("companion"),
                     component("mock-cloud"), component("decommission")):
        for pod in await pods(kube, namespace, selector):
            got = await kubectl(cluster, "-n", namespace, "logs", "--tail=40",
                                pod["metadata"]["name"])
            print(f"--- {pod['metadata']['name']} log (tail)\n{got.stdout}{got.stderr}")
    events = await kube.get(f"/api/v1/namespaces/{namespace}/events")
    print("--- events\n" + "\n".join(
        f"{e['involvedObject']['name']} {e['reason']}: {e.get('message', '')}"
        for e in events["items"][-40:]))

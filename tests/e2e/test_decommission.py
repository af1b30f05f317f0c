"""Uninstalling never leaves money running: ``vkprovider decommission``, as the chart's hook
runs it.

Real control plane, two mock clouds, the provider as a process. Pods run on the virtual node
with a cloud instance each; then the command the chart's pre-delete hook Job runs (its args from
``helm template``, with the hook's own ServiceAccount and RBAC, so a rule it lacks fails here)
runs as a subprocess. Afterwards every mock cloud lists no instance of this node, the Node is
gone and stays gone; an instance of another node in the same account is untouched. Once with
the provider running (``helm uninstall``: the provider deletes the instances, the normal path),
once with the provider stopped first (the Deployment deleted: the command deletes them).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from providers.base import TAG_NODE, InstanceSpec
from providers.mock.client import MockProvider
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import (
    MockCloudProcess,
    ProviderProcess,
    grant_provider_node,
    service_account_kubeconfig,
)
from vkprovider.testing.waiting import eventually

from .conftest import Cluster
from .test_chart import helm, render  # noqa: F401 - helm: the module fixture (built helm)

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide]  # decommission reads every GPUProvider

LEADER_NS = "vkprovider-system"  # the provider's leader_election.namespace (its default)
REPLICAS = 4


async def hook(*, helm_bin: Path, kube: KubeClient, cluster: LocalCluster, objects: Cluster,
               node: str, work: Path) -> tuple[list[str], Path]:
    """The chart's pre-delete hook: its Job's args, and a kubeconfig of its ServiceAccount with
    its RBAC installed as `helm uninstall` creates them (the release in the namespace the
    provider keeps its Leases in, as the chart sets it)."""
    release = f"dc{uuid.uuid4().hex[:6]}"
    objs = render(helm_bin, release=release, namespace=LEADER_NS, work=work,
                  values={"node": {"name": node}})
    hooks = [o for o in objs
             if (o["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"]
    (job,) = [o for o in hooks if o["kind"] == "Job"]
    collections = {"ServiceAccount": f"/api/v1/namespaces/{LEADER_NS}/serviceaccounts",
                   "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                   "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                   "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{LEADER_NS}/roles",
                   "RoleBinding":
                       f"/apis/rbac.authorization.k8s.io/v1/namespaces/{LEADER_NS}/rolebindings"}
    assert {o["kind"] for o in hooks} == {*collections, "Job"}, [o["kind"] for o in hooks]
    for kind, collection in collections.items():
        for obj in (o for o in hooks if o["kind"] == kind):
            await objects.create(collection, obj)
    spec = job["spec"]["template"]["spec"]
    kubeconfig = await service_account_kubeconfig(
        kube=kube, cluster=cluster, namespace=LEADER_NS, name=spec["serviceAccountName"],
        path=work / "decommission.kubeconfig")
    (container,) = spec["containers"]
    return list(container["args"]), kubeconfig


def run_decommission(args: list[str], *, config: Path, kubeconfig: Path
                     ) -> subprocess.CompletedProcess[str]:
    """The hook's command, its config file swapped for the provider's (same node, accounts)."""
    argv = [a for a in args if not a.startswith("--config=")]
    assert len(argv) == len(args) - 1 and "decommission" in argv, args
    done = subprocess.run([sys.executable, "-m", "vkprovider", *argv, f"--config={config}",
                           "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=400, check=False)
    print(f"\n$ vkprovider {' '.join(argv)} (exit {done.returncode})\n{done.stdout}"
          f"{done.stderr[-3000:]}")
    return done


async def node_instances(cloud: MockCloudProcess, node: str) -> list[dict[str, Any]]:
    """What the mock cloud account lists, tagged with ``node`` (its admin view, every state)."""
    return [i for i in await cloud.instances() if (i.get("tags") or {}).get(TAG_NODE) == node]


async def start(*, kube: KubeClient, namespace: str, work: Path, kubeconfig: Path,
                client_ca: Path, clouds: list[MockCloudProcess]
                ) -> tuple[str, ProviderProcess, MockProvider]:
    """Two clouds (the cheaper one holds 2 GPUs: the pods use both), an instance of another
    node, a provider whose node reports often, and REPLICAS pods running on its node."""
    node = f"vk-{uuid.uuid4().hex[:8]}"
    for i, inventory in enumerate(("H100:us-east:2:1.99", "H100:us-east:5:2.49")):
        cloud = MockCloudProcess(work_dir=work, name=f"cloud{i}", boot_delay=0.2,
                                 inventory=inventory)
        await cloud.start()
        clouds.append(cloud)
    provider = ProviderProcess(
        work_dir=work, kubeconfig=kubeconfig, node_name=node, clouds=clouds,
        client_ca_file=client_ca,
        # a short node Lease, so a stopped provider is seen as stopped soon; a status push
        # every second, so a deleted Node is noticed soon
        node={"lease_duration_seconds": 10, "lease_renew_seconds": 2,
              "status_interval_seconds": 1},
        extra={"gpu_providers": {"enabled": False}})
    await grant_provider_node(kube=kube, node=node)  # its Node and Leases, by name (RBAC)
    provider.start()
    try:
        return node, provider, await _run_pods(kube=kube, namespace=namespace, node=node,
                                               clouds=clouds)
    except BaseException:
        provider.stop()  # the caller never saw it: its finally cannot stop it
        raise


async def _run_pods(*, kube: KubeClient, namespace: str, node: str,
                    clouds: list[MockCloudProcess]) -> MockProvider:
    """The node Ready, REPLICAS pods Running on it, an instance of another node beside them."""
    other = await other_node_instance(clouds[1])

    async def get_node() -> dict[str, Any]:
        try:
            return await kube.get(f"/api/v1/nodes/{node}")
        except NotFoundError:
            return {}

    await eventually(get_node, timeout=60,
                     until=lambda n: any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in (n.get("status") or {}).get("conditions") or []),
                     what="the virtual node Ready")
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "burst"},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "burst"}},
                 "template": {
                     "metadata": {"labels": {"app": "burst"},
                                  "annotations": {"vkprovider.io/gpu-type": "H100"}},
                     "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                              "tolerations": [{"key": "virtual-kubelet.io/provider",
                                               "operator": "Exists"}],
                              "containers": [{"name": "c", "image": "example.com/c:1",
                                              "resources": {"limits": {
                                                  "nvidia.com/gpu": "1"}}}]}}}})

    async def running() -> int:
        body = await kube.get(f"/api/v1/namespaces/{namespace}/pods",
                              params={"fieldSelector": f"spec.nodeName={node}"})
        return sum(p["status"].get("phase") == "Running" for p in body["items"])

    await eventually(running, until=lambda n: n == REPLICAS, timeout=120,
                     what=f"{REPLICAS} pods Running on the virtual node")
    counts = [len(await node_instances(c, node)) for c in clouds]
    assert sum(counts) == REPLICAS, f"instances per cloud: {counts}"
    print(f"\ninstances of {node} per cloud: {counts}")
    return other


async def other_node_instance(cloud: MockCloudProcess) -> MockProvider:
    """An instance of another node in the same account: decommission must not touch it."""
    other = MockProvider(name=cloud.name, base_url=cloud.url, owner=f"vk-other-{cloud.port}",
                         api_key=None, timeout=10)
    await other.create(InstanceSpec(name=f"vk-other-{uuid.uuid4().hex[:6]}", image="x:1",
                                    gpu_count=1, gpu_type="H100"))
    assert len(await other.list()) == 1
    return other


async def assert_decommissioned(*, kube: KubeClient, node: str, clouds: list[MockCloudProcess],
                                provider: ProviderProcess | None, other: MockProvider) -> None:
    for cloud in clouds:
        assert await node_instances(cloud, node) == [], f"{cloud.name} still lists instances"
    assert len(await other.list()) == 1, "another node's instance was deleted"
    with pytest.raises(NotFoundError):
        await kube.get(f"/api/v1/nodes/{node}")
    body = await kube.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
    assert body["items"] == [], [p["metadata"]["name"] for p in body["items"]]
    if provider is not None:
        # the running provider noticed the deleted Node and did not register it again
        await eventually(lambda: _text(provider), timeout=30,
                         until=lambda t: "node deleted by vkprovider decommission" in t,
                         what="the provider standing down")
        with pytest.raises(NotFoundError):
            await kube.get(f"/api/v1/nodes/{node}")


async def _text(provider: ProviderProcess) -> str:
    return provider.log_text()


@pytest.mark.parametrize("provider_running", [True, False],
                         ids=["provider-running", "provider-stopped"])
async def test_decommission_leaves_no_instance_and_no_node(
    provider_running: bool, helm: Path, kube: KubeClient,  # noqa: F811
    namespace: str, local_cluster: LocalCluster, provider_kubeconfig: Path,
    cluster_objects: Cluster, tmp_path: Path,
) -> None:
    clouds: list[MockCloudProcess] = []
    provider: ProviderProcess | None = None
    node = ""
    try:
        node, provider, other = await start(kube=kube, namespace=namespace, work=tmp_path,
                                            kubeconfig=provider_kubeconfig,
                                            client_ca=local_cluster.ca_path, clouds=clouds)
        args, kubeconfig = await hook(helm_bin=helm, kube=kube, cluster=local_cluster,
                                      objects=cluster_objects, node=node, work=tmp_path)
        if not provider_running:
            provider.stop()  # the Deployment deleted before anything else
        done = run_decommission(args, config=provider.config_path, kubeconfig=kubeconfig)
        assert done.returncode == 0, done.stdout + done.stderr[-2000:]
        assert "every account lists 0 instances of this node" in done.stdout
        assert "deleted the Node" in done.stdout
        if provider_running:
            assert "deleting the instances directly" not in done.stdout, \
                "the running provider deletes them (the normal path)"
        else:
            assert "the provider is not running: deleting the instances directly" in done.stdout
        await assert_decommissioned(kube=kube, node=node, clouds=clouds,
                                    provider=provider if provider_running else None,
                                    other=other)
        await other.aclose()
    finally:
        if provider is not None:
            provider.stop()
        for cloud in clouds:
            cloud.stop()
        if node:
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"/api/v1/nodes/{node}")


async def test_decommission_fails_naming_what_remains_when_a_cloud_cannot_be_listed(
    kube: KubeClient, namespace: str, local_cluster: LocalCluster, provider_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    """A cloud that does not answer: zero instances cannot be proven there, so the command
    exits 1 within its timeout (8 s: the wait before the verdict, not the behaviour; the deletes
    on the cloud that answers take about a second), names the account, and keeps the Node."""
    clouds: list[MockCloudProcess] = []
    provider: ProviderProcess | None = None
    node = ""
    try:
        node, provider, other = await start(kube=kube, namespace=namespace, work=tmp_path,
                                            kubeconfig=provider_kubeconfig,
                                            client_ca=local_cluster.ca_path, clouds=clouds)
        await other.aclose()
        provider.stop()
        clouds[1].stop()  # its instances keep billing somewhere nobody can see
        done = run_decommission(["decommission", "--config=x", "--timeout=8",
                                 "--provider-grace=0"],
                                config=provider.config_path, kubeconfig=local_cluster.kubeconfig)
        assert done.returncode == 1, done.stdout
        assert "timed out after 8s; the Node is kept" in done.stdout
        assert "cloud1: could not be listed" in done.stdout
        assert await node_instances(clouds[0], node) == [], "what could be deleted was"
        assert (await kube.get(f"/api/v1/nodes/{node}"))["metadata"]["name"] == node
    finally:
        if provider is not None:
            provider.stop()
        for cloud in clouds:
            cloud.stop()
        if node:
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"/api/v1/nodes/{node}")

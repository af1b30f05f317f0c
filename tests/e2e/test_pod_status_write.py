"""The pod status write against the real API server (kube/podstatus_write.py): a replace when
the cached copy is current, the patch when it is stale, and nothing anyone else wrote lost either
way."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from providers.base import Instance, InstanceState
from vkprovider.kube import KubeClient
from vkprovider.kube.podstatus_write import PodStatusWriter, StatusWrite
from vkprovider.node.gpuhealth import CONDITION as GPU_HEALTHY
from vkprovider.node.podstatus import compute_status
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import service_account_kubeconfig

pytestmark = pytest.mark.cluster

GATE = "example.com/load-balancer-ready"
OTHER = "example.com/drained"  # (DisruptionTarget would do, but the controller-manager resets it)


async def make_pod(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{ns}/pods"
    await kube.create(path, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "a"}},
        "spec": {"nodeName": "vk-status-write", "terminationGracePeriodSeconds": 0,
                 "readinessGates": [{"conditionType": GATE}],
                 "containers": [{"name": "c", "image": "busybox:1.36"}]}})
    # another controller (a load balancer's) sets its readiness gate's condition
    await kube.patch(f"{path}/{name}/status",
                     {"status": {"conditions": [{"type": GATE, "status": "True"}]}},
                     patch_type="strategic")
    return await kube.get(f"{path}/{name}")


def running(pod: dict[str, Any], ip: str) -> dict[str, Any]:
    """What the status builders produce: the cached status with our fields set over it."""
    status = dict(pod["status"])
    status.update({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "hostIP": "100.64.0.1", "hostIPs": [{"ip": "100.64.0.1"}]})
    status["conditions"] = [*status.get("conditions", []),
                            {"type": "Ready", "status": "True"}]
    return status


def without_version(pod: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in pod["metadata"].items() if k != "resourceVersion"}
    return {**pod, "metadata": meta}


def condition(pod: dict[str, Any], ctype: str) -> str | None:
    for c in pod["status"].get("conditions") or []:
        if c["type"] == ctype:
            return str(c["status"])
    return None


async def test_a_current_copy_is_replaced_keeping_what_others_wrote(
        kube: KubeClient, namespace: str) -> None:
    pod = await make_pod(kube, namespace, "fresh")
    landed = await PodStatusWriter(kube).write(
        pod=pod, status=running(pod, "100.65.0.1"), annotations={"vkprovider.io/instance": "mi-1"})
    assert landed is StatusWrite.REPLACED
    now = await kube.get(f"/api/v1/namespaces/{namespace}/pods/fresh")
    assert now["status"]["phase"] == "Running"
    assert now["status"]["podIPs"] == [{"ip": "100.65.0.1"}]
    assert condition(now, GATE) == "True" and condition(now, "Ready") == "True"
    assert now["metadata"]["labels"] == {"app": "a"}
    assert now["metadata"]["annotations"]["vkprovider.io/instance"] == "mi-1"
    # its new address replaces the old one (a merge would list both, which is refused)
    landed = await PodStatusWriter(kube).write(pod=now, status=running(now, "100.65.0.2"))
    assert landed is StatusWrite.REPLACED
    now = await kube.get(f"/api/v1/namespaces/{namespace}/pods/fresh")
    assert now["status"]["podIPs"] == [{"ip": "100.65.0.2"}]


async def test_a_stale_copy_falls_back_to_the_patch_and_loses_nobodys_write(
        kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods/stale"
    pod = await make_pod(kube, namespace, "stale")
    # after our cache saw the pod, someone labels it and sets a condition of their own
    await kube.patch(path, {"metadata": {"labels": {"team": "b"}}})
    await kube.patch(f"{path}/status",
                     {"status": {"conditions": [{"type": OTHER, "status": "True",
                                                 "reason": "Drained"}]}},
                     patch_type="strategic")
    landed = await PodStatusWriter(kube).write(
        pod=pod, status=running(pod, "100.65.0.3"), annotations={"vkprovider.io/instance": "mi-3"})
    assert landed is StatusWrite.PATCHED_AFTER_CONFLICT
    now = await kube.get(path)
    assert now["status"]["phase"] == "Running"
    assert now["status"]["podIPs"] == [{"ip": "100.65.0.3"}]
    assert now["metadata"]["labels"] == {"app": "a", "team": "b"}
    assert condition(now, OTHER) == "True" and condition(now, GATE) == "True"
    assert now["metadata"]["annotations"]["vkprovider.io/instance"] == "mi-3"


async def test_a_stale_copy_never_puts_back_what_others_changed_since(
        kube: KubeClient, namespace: str) -> None:
    """The copy our cache holds says the gate is True and the GPU healthy; after it, the gate's
    controller sets its condition False, our GPU watch marks the pod hot and someone removes a
    condition. The status built from the stale copy (which carries their old values) is refused
    as a replace (409) and patched: their writes all stand, ours lands."""
    path = f"/api/v1/namespaces/{namespace}/pods/changed"
    await make_pod(kube, namespace, "changed")
    await kube.patch(f"{path}/status", {"status": {"conditions": [
        {"type": GPU_HEALTHY, "status": "True"}, {"type": OTHER, "status": "True"}]}},
        patch_type="strategic")
    cached = await kube.get(path)
    await kube.patch(f"{path}/status", {"status": {"conditions": [
        {"type": GATE, "status": "False", "reason": "Unhealthy"},
        {"type": GPU_HEALTHY, "status": "False", "reason": "GPUTooHot"},
        {"type": OTHER, "$patch": "delete"}]}}, patch_type="strategic")
    instance = Instance(id="mi-8", name="changed", provider="mock", state=InstanceState.RUNNING,
                        ip="100.64.0.8", started_at=datetime(2026, 1, 1, tzinfo=UTC))
    status = compute_status(pod=cached, instance=instance, node_name="vk-status-write",
                            now=datetime.now(UTC))
    assert condition({"status": status}, GATE) == "True"  # the stale copy's, carried over
    landed = await PodStatusWriter(kube).write(pod=cached, status=status)
    assert landed is StatusWrite.PATCHED_AFTER_CONFLICT
    now = await kube.get(path)
    assert now["status"]["phase"] == "Running"
    assert now["status"]["hostIPs"] == [{"ip": "100.64.0.8"}]
    assert now["status"]["containerStatuses"][0]["containerID"] == "vkprovider://mi-8"
    assert condition(now, GATE) == "False"
    assert condition(now, GPU_HEALTHY) == "False"
    assert condition(now, OTHER) is None
    # the next sweep starts from the fresh copy: Ready follows the gate
    again = compute_status(pod=now, instance=instance, node_name="vk-status-write",
                           now=datetime.now(UTC))
    assert await PodStatusWriter(kube).write(pod=now, status=again) is StatusWrite.REPLACED
    now = await kube.get(path)
    assert condition(now, "Ready") == "False" and condition(now, GATE) == "False"


async def test_a_pod_without_a_version_is_patched_and_a_gone_pod_is_not_an_error(
        kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    pod = await make_pod(kube, namespace, "unversioned")
    writer = PodStatusWriter(kube)
    landed = await writer.write(pod=without_version(pod), status=running(pod, "100.65.0.4"))
    assert landed is StatusWrite.PATCHED
    assert (await kube.get(f"{path}/unversioned"))["status"]["phase"] == "Running"

    gone = await make_pod(kube, namespace, "gone")
    await kube.delete(f"{path}/gone", grace_period_seconds=0)
    for copy in (gone, without_version(gone)):  # the replace, then the patch, finds nothing
        assert await writer.write(pod=copy, status=running(gone, "100.65.0.5")) \
            is StatusWrite.GONE


async def test_rbac_without_update_patches_instead_and_stops_asking(
        kube: KubeClient, namespace: str, local_cluster: LocalCluster, tmp_path: Path) -> None:
    """A provider upgraded before its Role: the replace is refused (403), the status still
    lands as a patch, and the writer does not ask for the replace again."""
    await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                      {"metadata": {"name": "old-role"}})
    await kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", {
        "metadata": {"name": "old-role"},
        "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]})
    await kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": "old-role"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "old-role"},
        "subjects": [{"kind": "ServiceAccount", "name": "old-role", "namespace": namespace}]})
    config = await service_account_kubeconfig(kube=kube, cluster=local_cluster,
                                              namespace=namespace, name="old-role",
                                              path=tmp_path / "old-role.kubeconfig")
    first = await make_pod(kube, namespace, "first")
    second = await make_pod(kube, namespace, "second")
    async with KubeClient.from_kubeconfig(kubeconfig=str(config)) as limited:
        writer = PodStatusWriter(limited)
        assert await writer.write(pod=first, status=running(first, "100.65.0.6")) \
            is StatusWrite.PATCHED
        assert writer.replace_allowed is False
        assert await writer.write(pod=second, status=running(second, "100.65.0.7")) \
            is StatusWrite.PATCHED
    for name, ip in (("first", "100.65.0.6"), ("second", "100.65.0.7")):
        now = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert now["status"]["podIPs"] == [{"ip": ip}]
        assert condition(now, GATE) == "True"

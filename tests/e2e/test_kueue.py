"""Real Kueue (v0.17.0, built from its Go module) beside the local control plane (issue 14).

A ClusterQueue with 8 ``nvidia.com/gpu`` of quota over a ResourceFlavor that names this test's
simulated GPU nodes admits a suspended batch Job; its pods run on those nodes. A Job beyond the
quota stays suspended (Kueue's mutating webhook suspended it at creation) until quota frees. The
validating webhook refuses an invalid ClusterQueue: the webhooks are on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.testing.kueue import GROUP, KueueManager
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster
API = f"/apis/{GROUP}/v1beta2"
QUEUE_LABEL = f"{GROUP}/queue-name"


def gpu_job(*, name: str, queue: str, pods: int, gpus: int,
            suspend: bool | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": pods, "completions": pods, "backoffLimit": 0,
        "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "train", "image": "trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}}, "spec": spec}


def cluster_queue(*, name: str, flavor: str, gpus: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {"matchLabels": {
                         "kubernetes.io/metadata.name": namespace}},
                     "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                         {"name": flavor, "resources": [
                             {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}}


class Queues:
    """A ResourceFlavor on this test's GPU nodes, a ClusterQueue and a LocalQueue over it."""

    def __init__(self, *, kube: KubeClient, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.name = namespace  # cluster-scoped names, unique per test
        self.created: list[str] = []

    async def create(self, *, gpus: int) -> None:
        flavor = {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor",
                  "metadata": {"name": self.name},
                  "spec": {"nodeLabels": {"vkprovider.io/pool": self.namespace}}}
        await self.kube.create(f"{API}/resourceflavors", flavor)
        self.created.append(f"{API}/resourceflavors/{self.name}")
        await self.kube.create(f"{API}/clusterqueues", cluster_queue(
            name=self.name, flavor=self.name, gpus=str(gpus), namespace=self.namespace))
        self.created.append(f"{API}/clusterqueues/{self.name}")
        await self.kube.create(f"{API}/namespaces/{self.namespace}/localqueues", {
            "apiVersion": f"{GROUP}/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "gpus"}, "spec": {"clusterQueue": self.name}})

    async def delete(self) -> None:
        for path in reversed(self.created):  # Kueue drops its finalizer once nothing uses them
            with contextlib.suppress(APIError):
                await self.kube.delete(path)


@pytest_asyncio.fixture
async def queues(kueue: KueueManager, kube: KubeClient, namespace: str
                 ) -> AsyncIterator[Queues]:
    q = Queues(kube=kube, namespace=namespace)
    try:
        yield q
    finally:
        await q.delete()


async def job(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return await kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")


async def job_pods(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/pods",
                          params={"labelSelector": f"batch.kubernetes.io/job-name={name}"})
    return list(body.get("items") or [])


async def workload_of(kube: KubeClient, ns: str, job_name: str) -> dict[str, Any] | None:
    body = await kube.get(f"{API}/namespaces/{ns}/workloads")
    for wl in body.get("items") or []:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o["kind"] == "Job" and o["name"] == job_name for o in owners):
            return dict(wl)
    return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def running(pods: list[dict[str, Any]], count: int) -> bool:
    return len(pods) == count and all(p.get("status", {}).get("phase") == "Running" for p in pods)


async def test_kueue_admits_within_gpu_quota_and_holds_the_rest(
        kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, queues: Queues) -> None:
    nodes = await gpu_nodes.create(count=2, gpus=4)
    await queues.create(gpus=8)
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"

    # A suspended 2-pod x 4-GPU Job: Kueue admits it (quota 8), unsuspends it, and injects the
    # flavor's node labels, so the scheduler puts its pods on this test's GPU nodes.
    await kube.create(jobs, gpu_job(name="gang", queue="gpus", pods=2, gpus=4, suspend=True))
    await eventually(lambda: job(kube, namespace, "gang"),
                     until=lambda j: j["spec"].get("suspend") is False, timeout=60,
                     what="Kueue to admit (unsuspend) Job gang")
    wl = await eventually(lambda: workload_of(kube, namespace, "gang"),
                          until=lambda w: condition(w, "Admitted").get("status") == "True",
                          timeout=30, what="the gang's Workload Admitted")
    assert wl is not None
    assert wl["status"]["admission"]["clusterQueue"] == queues.name
    pods = await eventually(lambda: job_pods(kube, namespace, "gang"),
                            until=lambda ps: running(ps, 2), timeout=60,
                            what="the gang's two pods Running")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(nodes)
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["vkprovider.io/pool"] == namespace

    # Beyond the quota: created without `suspend`, Kueue's mutating webhook suspends it, and it
    # stays suspended with its Workload pending on quota, with no pod.
    await kube.create(jobs, gpu_job(name="extra", queue="gpus", pods=1, gpus=1, suspend=None))
    created = await job(kube, namespace, "extra")
    assert created["spec"]["suspend"] is True, "the job webhook did not suspend Job extra"
    pending = await eventually(
        lambda: workload_of(kube, namespace, "extra"),
        until=lambda w: condition(w, "QuotaReserved").get("status") == "False"
        and "insufficient" in condition(w, "QuotaReserved").get("message", "").lower(),
        timeout=30, what="Job extra's Workload pending on quota")
    assert condition(pending, "Admitted").get("status") != "True"
    assert (await job(kube, namespace, "extra"))["spec"]["suspend"] is True
    assert await job_pods(kube, namespace, "extra") == []

    # Quota frees when the gang goes: then Kueue admits the held Job.
    await kube.delete(f"{jobs}/gang", propagation="Background")
    await eventually(lambda: job(kube, namespace, "extra"),
                     until=lambda j: j["spec"].get("suspend") is False, timeout=60,
                     what="Kueue to admit Job extra once the gang's quota is released")
    await eventually(lambda: job_pods(kube, namespace, "extra"),
                     until=lambda ps: running(ps, 1), timeout=60, what="Job extra's pod Running")


async def test_validating_webhook_refuses_an_invalid_cluster_queue(
        kueue: KueueManager, kube: KubeClient, namespace: str) -> None:
    bad = cluster_queue(name=f"{namespace}-bad", flavor="any", gpus="-1", namespace=namespace)
    with pytest.raises(APIError) as refused:
        await kube.create(f"{API}/clusterqueues", bad)
    assert 'admission webhook "vclusterqueue.kb.io" denied the request' in str(refused.value)
    with pytest.raises(NotFoundError):
        await kube.get(f"{API}/clusterqueues/{namespace}-bad")


async def test_the_companion_discovers_the_kueue_api_the_server_serves(
    kueue: KueueManager, kube: KubeClient,
) -> None:
    """kueueapi.discover (issue 36): Kueue v0.17.0 serves v1beta2, which is what we speak; a
    group nobody serves is "not installed" (None), not an error."""
    from vkprovider.descheduler.kueueapi import discover
    from vkprovider.kube.discovery import served_versions

    found = await served_versions(kube, GROUP)
    assert found is not None and "v1beta2" in found.versions, found
    api = await discover(kube)
    assert api.usable and api.version == "v1beta2" and api.served == found.versions
    assert await served_versions(kube, "no-such-group.vkprovider.io") is None

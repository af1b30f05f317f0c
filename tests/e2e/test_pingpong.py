"""No ping-pong and GPU health (issue 15), against the real control plane and real Kueue v0.17.0.

One simulated 2-GPU node, an inference Deployment (2 replicas x 1 GPU, low priority) that fills
it, one mock cloud. Kueue gangs (1 pod x 2 GPUs, high priority) go through a ClusterQueue with
2 GPUs of quota and an AdmissionCheck that this test serves by hand (as a provisioning or
multi-cluster check would): a gang holds quota with no pod until the test approves it, so the
window in which a naive move-back would bring inference home onto the next gang's GPUs is as
long as the test makes it.

* Gang A runs (it preempts both replicas onto the cloud), gang B is queued behind it. A ends: B
  reserves quota and waits on its check; inference must stay on the cloud (``MoveBackHeld``
  names B), B runs, and once B ends inference comes home. The scheduler preempted inference
  twice (A's victims) and never again. With ``holdWhileQueued: false`` the same story ping-pongs:
  inference comes home during B's wait and B preempts it again.
* A gang queued behind another gang's quota (4-GPU node, quota 4): gang A (2 GPUs) runs,
  gang B (4 GPUs) waits for A's quota. A non-Kueue job that held the node's other 2 GPUs ends:
  they are free while A runs, but B takes them when A releases its 2, so inference stays on
  the cloud (``MoveBackHeld``: "queued behind A") until B has run; the scheduler preempts it
  once.
* A node with a health taint (``AggregatedNodeHealth``, ``PreferNoSchedule`` so the scheduler
  would place a surge pod there) does not count as free: inference stays on the cloud with a
  ``MoveBackHeld`` saying why; untainted, it comes home.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.testing.harness import CompanionProcess
from vkprovider.testing.kueue import GROUP
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_overflow import POLICIES, PRIORITY, gpu_deployment, pods, policy

pytestmark = pytest.mark.cluster
API = f"/apis/{GROUP}/v1beta2"
QUEUE_LABEL = f"{GROUP}/queue-name"
GPUS = 2  # the internal node's, the inference's (2 x 1) and each gang's (1 x 2)


async def inference_home_then_out(*, kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory,
                                  system: System, companion_kubeconfig: Path, objects: Cluster,
                                  move_back: dict[str, Any], node_gpus: int = GPUS
                                  ) -> tuple[str, str, str]:
    """The inside node, inference Running on it, the companion; returns (node, tag, high)."""
    [internal] = await gpu_nodes.create(count=1, gpus=node_gpus)
    await system.start(clouds=1, node_labels={"vkprovider.io/pool": namespace})
    system.companion = CompanionProcess(work_dir=system.work_dir,
                                        kubeconfig=companion_kubeconfig,
                                        node_name=system.node_name, interval=0.5,
                                        move_back_interval=0.5)
    system.companion.start()
    tag = uuid.uuid4().hex[:6]
    low, high = f"inf-{tag}", f"train-{tag}"
    for name, value in ((low, 100), (high, 1000)):
        await objects.create(PRIORITY, {"apiVersion": "scheduling.k8s.io/v1",
                                        "kind": "PriorityClass", "metadata": {"name": name},
                                        "value": value})
    body = policy(f"pp-{tag}", namespace=namespace, app="inference", providers=["cloud0"])
    body["spec"]["moveBack"] = {"enabled": True, "stableFor": "1s", "maxConcurrent": 2,
                                "cooldown": "5s", "timeout": "60s", **move_back}
    body["spec"]["prewarm"] = {"enabled": False}
    await objects.create(POLICIES, body)
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=GPUS, pool=namespace,
                                     priority_class=low))
    await eventually(lambda: pods(kube, namespace, "inference"),
                     until=lambda ps: len(ps) == GPUS and all(
                         p["spec"].get("nodeName") == internal
                         and p["status"].get("phase") == "Running" for p in ps),
                     timeout=90, what="inference Running inside")
    return internal, tag, high


def gang_job(name: str, *, high: str, run_seconds: float, queue: str | None = None,
             gpus: int = GPUS) -> dict[str, Any]:
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                     "suspend": bool(queue),
                     "template": {"metadata": {"labels": {"app": "training", "gang": name},
                                               "annotations": {"vkprovider.io/fake-run-seconds":
                                                               str(run_seconds)}},
                                  "spec": {"restartPolicy": "Never", "priorityClassName": high,
                                           "terminationGracePeriodSeconds": 0,
                                           "containers": [{"name": "t", "image": "trainer:1",
                                                           "resources": {"limits": {
                                                               "nvidia.com/gpu": str(gpus)}}}]}}}}


async def on_cloud(kube: KubeClient, namespace: str, system: System) -> list[dict[str, Any]]:
    return await eventually(lambda: pods(kube, namespace, "inference"),
                            until=lambda ps: len(ps) == GPUS and all(
                                p["spec"].get("nodeName") == system.node_name
                                and p["status"].get("phase") == "Running" for p in ps),
                            timeout=120, interval=0.3, what="inference serving from the cloud")


async def events(kube: KubeClient, namespace: str, **selector: str) -> list[dict[str, Any]]:
    fields = ",".join(f"{k}={v}" for k, v in selector.items())
    body = await kube.get(f"/api/v1/namespaces/{namespace}/events",
                          params={"fieldSelector": fields} if fields else None)
    return list(body["items"])


async def preempted(kube: KubeClient, namespace: str) -> int:
    """Inference replicas the scheduler preempted (its ``Preempted`` events, one per victim)."""
    return sum(1 for e in await events(kube, namespace, reason="Preempted")
               if e["involvedObject"]["name"].startswith("inference-"))


async def gang_pod(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{namespace}/pods",
                          params={"labelSelector": f"gang={name}"})
    return list(body["items"])


#: a gang's run when the story ends it itself (end_gang): longer than any test
UNTIL_ENDED = 600


async def end_gang(kube: KubeClient, namespace: str, name: str) -> None:
    """The gang's run ends now: its pods' fake-run-seconds lowered to 0 (the fake kubelet reads
    it again while they run). A story ends a gang once it has checked what must hold while the
    gang runs, instead of waiting out a run time guessed long enough for those checks."""
    running = await gang_pod(kube, namespace, name)
    assert running, f"gang {name} has no pod to end"
    for p in running:
        await kube.patch(f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}",
                         {"metadata": {"annotations": {"vkprovider.io/fake-run-seconds": "0"}}})


class ManualCheck:
    """An AdmissionCheck served by the test: Active, and Ready per Workload when approved."""

    def __init__(self, kube: KubeClient, name: str) -> None:
        self.kube, self.name = kube, name

    async def activate(self) -> None:
        await self.kube.patch(f"{API}/admissionchecks/{self.name}/status", {"status": {
            "conditions": [{"type": "Active", "status": "True", "reason": "Active",
                            "message": "served by the test", "observedGeneration": 1,
                            "lastTransitionTime": _now()}]}})

    async def approve(self, wl: dict[str, Any]) -> None:
        body = {"apiVersion": f"{GROUP}/v1beta2", "kind": "Workload",
                "metadata": {"name": wl["metadata"]["name"],
                             "namespace": wl["metadata"]["namespace"]},
                "status": {"admissionChecks": [{"name": self.name, "state": "Ready",
                                                "message": "approved by the test",
                                                "lastTransitionTime": _now()}]}}
        await self.kube.request(
            "PATCH", f"{API}/namespaces/{wl['metadata']['namespace']}/workloads/"
                     f"{wl['metadata']['name']}/status",
            params={"fieldManager": "test-manual-check", "force": True}, body=body,
            content_type="application/apply-patch+yaml")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def workload_of(kube: KubeClient, namespace: str, job: str) -> dict[str, Any] | None:
    body = await kube.get(f"{API}/namespaces/{namespace}/workloads")
    for wl in body.get("items") or []:
        if any(o["kind"] == "Job" and o["name"] == job
               for o in wl["metadata"].get("ownerReferences") or []):
            return dict(wl)
    return None


def cond(wl: dict[str, Any] | None, kind: str) -> str | None:
    for c in ((wl or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return str(c["status"])
    return None


async def kueue_setup(kube: KubeClient, namespace: str, tag: str, paths: list[str], *,
                      quota: int = GPUS) -> ManualCheck:
    name = f"pp-{tag}"
    await kube.create(f"{API}/resourceflavors", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name},
        "spec": {"nodeLabels": {"vkprovider.io/pool": namespace}}})
    paths.append(f"{API}/resourceflavors/{name}")
    check = ManualCheck(kube, f"manual-{tag}")
    await kube.create(f"{API}/admissionchecks", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "AdmissionCheck",
        "metadata": {"name": check.name}, "spec": {"controllerName": "example.com/manual"}})
    paths.append(f"{API}/admissionchecks/{check.name}")
    await check.activate()
    await kube.create(f"{API}/clusterqueues", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                     {"name": name, "resources": [{"name": "nvidia.com/gpu",
                                                   "nominalQuota": str(quota)}]}]}],
                 "admissionChecksStrategy": {"admissionChecks": [{"name": check.name}]}}})
    paths.append(f"{API}/clusterqueues/{name}")
    await kube.create(f"{API}/namespaces/{namespace}/localqueues", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus"},
        "spec": {"clusterQueue": name}})
    return check


async def approve_when_reserved(kube: KubeClient, namespace: str, check: ManualCheck,
                                job: str) -> dict[str, Any]:
    wl = await eventually(lambda: workload_of(kube, namespace, job), timeout=60, interval=0.3,
                          until=lambda w: cond(w, "QuotaReserved") == "True",
                          what=f"Workload of {job} holding quota")
    assert wl is not None
    await check.approve(wl)
    return wl


@pytest.mark.parametrize("hold", [True, False], ids=["hold-while-queued", "knob-off"])
async def test_a_queued_gang_keeps_inference_out_until_the_queue_empties(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
    hold: bool,
) -> None:
    internal, tag, high = await inference_home_then_out(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
        move_back={"holdWhileQueued": hold})
    check = await kueue_setup(kube, namespace, tag, kueue_objects)
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    await kube.create(jobs, gang_job("gang-a", high=high, run_seconds=UNTIL_ENDED, queue="gpus"))
    await approve_when_reserved(kube, namespace, check, "gang-a")
    await on_cloud(kube, namespace, system)
    assert await preempted(kube, namespace) == GPUS, "gang A displaced both replicas"
    await kube.create(jobs, gang_job("gang-b", high=high, run_seconds=UNTIL_ENDED, queue="gpus"))
    wl_b = await eventually(lambda: workload_of(kube, namespace, "gang-b"), timeout=30,
                            until=lambda w: w is not None and cond(w, "QuotaReserved") != "True",
                            what="gang B queued behind A")
    assert wl_b is not None
    # A ends; B reserves the quota and waits on its check, with no pod
    await end_gang(kube, namespace, "gang-a")
    await eventually(lambda: gang_pod(kube, namespace, "gang-a"), timeout=60, interval=0.3,
                     until=lambda ps: bool(ps) and all(p["status"].get("phase") == "Succeeded"
                                                       for p in ps), what="gang A finished")
    await eventually(lambda: workload_of(kube, namespace, "gang-b"), timeout=60, interval=0.3,
                     until=lambda w: cond(w, "QuotaReserved") == "True",
                     what="gang B holding quota, its check pending")
    b_name = f"{namespace}/{wl_b['metadata']['name']}"
    if hold:
        held = await eventually(
            lambda: events(kube, namespace, reason="MoveBackHeld"), timeout=30, interval=0.3,
            until=lambda es: any(b_name in e["message"] for e in es),
            what="a MoveBackHeld event naming gang B")
        print("\nMoveBackHeld:", *sorted({e["message"] for e in held}), sep="\n  ")
        assert any(f"Kueue will place {GPUS} GPU(s) of workload {b_name}" in e["message"]
                   for e in held)
        messages = [e["message"] for e in held]
        assert len(messages) == len(set(messages)), "once per change, not per pass"
        for e in held:
            assert e["count"] <= 2, f"repeated per pass: {e['message']} x{e['count']}"
        await asyncio.sleep(4)  # 8 move-back passes with the GPUs free and B's check pending
        assert not [p for p in await pods(kube, namespace, "inference")
                    if p["spec"].get("nodeName") == internal], "inference came home onto B's GPUs"
        assert not await events(kube, namespace, reason="MoveBackStarted")
    else:
        await eventually(lambda: pods(kube, namespace, "inference"), timeout=60, interval=0.3,
                         until=lambda ps: any(p["spec"].get("nodeName") == internal
                                              and p["status"].get("phase") == "Running"
                                              for p in ps),
                         what="inference moving home into B's window (the knob is off)")
    await approve_when_reserved(kube, namespace, check, "gang-b")
    await eventually(lambda: gang_pod(kube, namespace, "gang-b"), timeout=60, interval=0.3,
                     until=lambda ps: bool(ps) and all(p["spec"].get("nodeName") == internal
                                                       for p in ps), what="gang B placed inside")
    # B ends, the queue is empty: inference comes home
    await end_gang(kube, namespace, "gang-b")
    await eventually(lambda: pods(kube, namespace, "inference"), timeout=120, interval=0.5,
                     until=lambda ps: len(ps) == GPUS and all(
                         p["spec"].get("nodeName") == internal
                         and p["status"].get("phase") == "Running" for p in ps),
                     what="inference home after the queue emptied")
    victims = await preempted(kube, namespace)
    print(f"\nholdWhileQueued={hold}: the scheduler preempted {victims} inference replicas "
          f"(gang A's {GPUS}, then {victims - GPUS} more)")
    if hold:
        assert victims == GPUS, "no ping-pong: gang B preempted no inference replica"
    else:
        assert victims > GPUS, "with the knob off, gang B preempted what had come home"


async def test_an_unhealthy_node_does_not_count_as_free_until_untainted(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster,
) -> None:
    internal, _tag, high = await inference_home_then_out(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=cluster_objects, move_back={})
    training = gang_job("training", high=high, run_seconds=UNTIL_ENDED)
    training["spec"]["template"]["spec"]["nodeSelector"] = {"vkprovider.io/pool": namespace}
    await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", training)
    await on_cloud(kube, namespace, system)
    node_path = f"/api/v1/nodes/{internal}"
    taint = {"key": "AggregatedNodeHealth", "value": "False", "effect": "PreferNoSchedule"}
    await kube.patch(node_path, {"spec": {"taints": [taint]}})
    await end_gang(kube, namespace, "training")  # the GPUs free, on a tainted node
    await eventually(lambda: gang_pod(kube, namespace, "training"), timeout=60, interval=0.3,
                     until=lambda ps: bool(ps) and all(p["status"].get("phase") == "Succeeded"
                                                       for p in ps), what="training finished")
    held = await eventually(lambda: events(kube, namespace, reason="MoveBackHeld"), timeout=30,
                            interval=0.3, until=lambda es: any(
                                "unhealthy" in e["message"] for e in es),
                            what="a MoveBackHeld event about the unhealthy node")
    print("\nMoveBackHeld:", *sorted({e["message"] for e in held}), sep="\n  ")
    assert any(f"{internal} (health taint AggregatedNodeHealth=False:PreferNoSchedule)"
               in e["message"] for e in held)
    await asyncio.sleep(4)  # the GPUs are free, the node is Ready and schedulable: 8 passes
    assert all(p["spec"].get("nodeName") == system.node_name
               for p in await pods(kube, namespace, "inference")), "moved onto a sick node"
    assert not await events(kube, namespace, reason="MoveBackStarted")
    await kube.patch(node_path, {"spec": {"taints": []}})
    await eventually(lambda: pods(kube, namespace, "inference"), timeout=120, interval=0.5,
                     until=lambda ps: len(ps) == GPUS and all(
                         p["spec"].get("nodeName") == internal
                         and p["status"].get("phase") == "Running" for p in ps),
                     what="inference home once the node is healthy again")


async def test_a_gang_queued_behind_another_gangs_quota_keeps_inference_out_while_it_runs(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
) -> None:
    node_gpus = 2 * GPUS
    internal, tag, high = await inference_home_then_out(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=cluster_objects, move_back={},
        node_gpus=node_gpus)
    check = await kueue_setup(kube, namespace, tag, kueue_objects, quota=node_gpus)
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    # a job outside Kueue holds the node's other GPUs for now
    filler = gang_job("filler", high=high, run_seconds=600)
    filler["spec"]["template"]["spec"]["nodeSelector"] = {"vkprovider.io/pool": namespace}
    await kube.create(jobs, filler)
    await eventually(lambda: gang_pod(kube, namespace, "filler"), timeout=60, interval=0.3,
                     until=lambda ps: bool(ps) and all(p["status"].get("phase") == "Running"
                                                       for p in ps), what="the filler running")
    await kube.create(jobs, gang_job("gang-a", high=high, run_seconds=UNTIL_ENDED, queue="gpus"))
    wl_a = await approve_when_reserved(kube, namespace, check, "gang-a")
    await on_cloud(kube, namespace, system)
    assert await preempted(kube, namespace) == GPUS, "gang A displaced both replicas"
    await kube.create(jobs, gang_job("gang-b", high=high, run_seconds=3, queue="gpus",
                                     gpus=node_gpus))
    wl_b = await eventually(lambda: workload_of(kube, namespace, "gang-b"), timeout=30,
                            interval=0.3, until=lambda w: w is not None and cond(
                                w, "QuotaReserved") != "True",
                            what="gang B queued behind A's quota")
    assert wl_b is not None
    # the filler goes: 2 GPUs free while A runs
    await kube.delete(f"{jobs}/filler", propagation="Background")
    for p in await gang_pod(kube, namespace, "filler"):
        with contextlib.suppress(APIError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}",
                              grace_period_seconds=0)
    a_name = f"{namespace}/{wl_a['metadata']['name']}"
    b_name = f"{namespace}/{wl_b['metadata']['name']}"
    held = await eventually(
        lambda: events(kube, namespace, reason="MoveBackHeld"), timeout=30, interval=0.3,
        until=lambda es: any(b_name in e["message"] for e in es),
        what="a MoveBackHeld event naming gang B")
    print("\nMoveBackHeld:", *sorted({e["message"] for e in held}), sep="\n  ")
    assert any(f"Kueue will place {GPUS} GPU(s) of workload {b_name} (queued behind {a_name} "
               f"in ClusterQueue pp-{tag})" in e["message"] for e in held)
    await asyncio.sleep(4)  # 8 move-back passes with 2 GPUs free and A running
    assert [p["status"].get("phase") for p in await gang_pod(kube, namespace, "gang-a")] == [
        "Running"], "the window is while gang A runs"
    assert not [p for p in await pods(kube, namespace, "inference")
                if p["spec"].get("nodeName") == internal], "inference came home onto B's GPUs"
    assert not await events(kube, namespace, reason="MoveBackStarted")
    # A ends, B takes the whole node, ends; the queue is empty: inference comes home
    await end_gang(kube, namespace, "gang-a")
    await approve_when_reserved(kube, namespace, check, "gang-b")
    await eventually(lambda: gang_pod(kube, namespace, "gang-b"), timeout=60, interval=0.3,
                     until=lambda ps: bool(ps) and all(p["spec"].get("nodeName") == internal
                                                       for p in ps), what="gang B placed inside")
    await eventually(lambda: pods(kube, namespace, "inference"), timeout=120, interval=0.5,
                     until=lambda ps: len(ps) == GPUS and all(
                         p["spec"].get("nodeName") == internal
                         and p["status"].get("phase") == "Running" for p in ps),
                     what="inference home after the queue emptied")
    victims = await preempted(kube, namespace)
    print(f"\nqueued behind: the scheduler preempted {victims} inference replicas")
    assert victims == GPUS, "no ping-pong: gang B preempted no inference replica"

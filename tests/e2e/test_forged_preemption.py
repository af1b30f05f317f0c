"""A forged ``Preempted`` Event grants nothing; the scheduler's own preemption still does.

Real control plane (its kube-scheduler preempts), a simulated internal GPU node, a mock cloud,
the provider and the companion as processes. The policy waits ``overflowAfter: 300s``: only the
preemption fast path (descheduler/preemption.py) admits sooner.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.semantics.timefmt import parse_time
from vkprovider.testing.cluster import free_port
from vkprovider.testing.harness import CompanionProcess
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_overflow import POLICIES, PRIORITY, gpu_deployment, policy, tolerates

pytestmark = pytest.mark.cluster


async def healthz(port: int) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        try:
            return (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code
        except httpx.TransportError:
            return 0


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def forged_event(namespace: str, *, name: str, uid: str, at: float) -> dict[str, Any]:
    """What a user allowed to create Events can write: every field the scheduler's has."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"forged-{uuid.uuid4().hex[:8]}", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name,
                               "namespace": namespace, "uid": uid},
            "reason": "Preempted", "action": "Preempting", "type": "Normal",
            "message": "Preempted by pod 1234 on node somewhere",
            "reportingComponent": "default-scheduler",
            "reportingInstance": "default-scheduler-forged",
            "source": {"component": "default-scheduler"},
            "firstTimestamp": _iso(at), "lastTimestamp": _iso(at), "count": 1}


async def web_pods(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": "app=web"})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
               for c in pod["status"].get("conditions") or [])


async def test_a_forged_preempted_event_does_not_skip_overflow_after(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster,
) -> None:
    internal = await gpu_nodes.create(count=1, gpus=1)
    await system.start(clouds=1, node_labels={"vkprovider.io/pool": namespace})
    port = free_port()
    system.companion = CompanionProcess(work_dir=system.work_dir, kubeconfig=companion_kubeconfig,
                                        node_name=system.node_name, interval=0.5,
                                        extra_args=("--metrics-port", str(port)))
    system.companion.start()
    # every watch of the companion listed (its /healthz): it sees the preemption as it happens
    # (a companion that was not running then gives no credit, by design)
    await eventually(lambda: healthz(port), until=lambda code: code == 200, timeout=60,
                     what="the companion's watches synced")
    tag = uuid.uuid4().hex[:6]
    low, high = f"web-{tag}", f"train-{tag}"
    for name, value in ((low, 100), (high, 1000)):
        await cluster_objects.create(PRIORITY, {"apiVersion": "scheduling.k8s.io/v1",
                                                "kind": "PriorityClass",
                                                "metadata": {"name": name}, "value": value})
    body = policy(f"slow-{tag}", namespace=namespace, app="web", providers=["cloud0"])
    body["spec"]["overflowAfter"] = "300s"
    policy_path = f"{POLICIES}/{(await cluster_objects.create(POLICIES, body))['metadata']['name']}"
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("web", replicas=2, pool=namespace, priority_class=low))

    def split(ps: list[dict[str, Any]]) -> bool:
        return len(ps) == 2 and sum(p["spec"].get("nodeName") in internal
                                    and p["status"].get("phase") == "Running" for p in ps) == 1 \
            and sum(unschedulable(p) for p in ps) == 1

    ps = await eventually(lambda: web_pods(kube, namespace), until=split, timeout=90,
                          what="one web replica Running inside, one Unschedulable")
    waiting = next(p for p in ps if unschedulable(p))
    running = next(p for p in ps if p is not waiting)
    target = waiting["metadata"]["name"]
    # A credit goes to a pod of the victim's controller made after the preemption (a second's
    # slack): let the waiting pod be clearly older than the preemption below, so that only a
    # forged Event could admit it.
    made = parse_time(waiting["metadata"]["creationTimestamp"]).timestamp()
    await asyncio.sleep(max(0.0, made + 3 - time.time()))

    # The forgeries: an Event naming the waiting replica, and one naming a pod that does not
    # exist by a name its ReplicaSet could generate; both claim to be the scheduler's, both
    # dated before the waiting pod was made.
    sibling = f"{target.rpartition('-')[0]}-zzzzz"
    events = f"/api/v1/namespaces/{namespace}/events"
    for name, uid in ((target, waiting["metadata"]["uid"]), (sibling, str(uuid.uuid4()))):
        await kube.create(events, forged_event(namespace, name=name, uid=uid,
                                               at=time.time() - 60))

    # The real thing, after the forgeries: the scheduler preempts the running replica for a
    # higher-priority pod, and the replacement overflows at once (the fast path works).
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
        "spec": {"priorityClassName": high, "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"vkprovider.io/pool": namespace},
                 "containers": [{"name": "t", "image": "trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})

    async def decisions() -> list[dict[str, Any]]:
        return list((await kube.get(policy_path)).get("status", {}).get("lastDecisions") or [])

    fast = await eventually(decisions, timeout=90, what="the replacement admitted on the fast path",
                            until=lambda ds: any(d["decision"] == "Admitted"
                                                 and "preempted by the scheduler" in d["reason"]
                                                 for d in ds))
    admitted = [d for d in fast if d["decision"] == "Admitted"]
    assert len(admitted) == 1, admitted
    assert running["metadata"]["name"] in admitted[0]["reason"], admitted
    assert target not in admitted[0]["pod"], "the replacement, made after the preemption"
    await eventually(lambda: web_pods(kube, namespace), timeout=90,
                     what="the replacement Running on the virtual node",
                     until=lambda ps: any(p["spec"].get("nodeName") == system.node_name
                                          and p["status"].get("phase") == "Running" for p in ps))

    # The real Event is the scheduler's by the field the companion checks.
    real = [e for e in (await kube.get(events, params={"fieldSelector": "reason=Preempted"}))[
        "items"] if e["involvedObject"]["name"] == running["metadata"]["name"]]
    assert real and all(e.get("reportingComponent") == "default-scheduler" for e in real), real
    print(f"\nthe scheduler's Preempted event: reportingComponent="
          f"{real[0].get('reportingComponent')!r} source={real[0].get('source')!r}")

    # The forged target still waits its overflowAfter: not admitted, not tolerating the node.
    still = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{target}")
    assert not still["metadata"].get("deletionTimestamp")
    assert not tolerates(still), "a forged Event admitted the pod"
    assert still["spec"].get("nodeName") in (None, ""), still["spec"].get("nodeName")
    assert "vkprovider.io/overflow-policy" not in (still["metadata"].get("annotations") or {})
    assert not any(target in d["pod"] for d in await decisions() if d["decision"] == "Admitted")

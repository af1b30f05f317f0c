"""Interruptible (spot) offers (issue 15 item 3): a policy with ``interruptible: Allow`` places
replicas on the mock cloud's cheaper spot offers; an interruption the cloud announces is met by
a replacement that is Ready before the old pod goes (make-before-break, never more than one extra
instance), and an interruption without notice is handled like a crash: the pod fails with
``InstanceInterrupted``, its Deployment replaces it, the reclaimed instance is deleted. Nothing
leaks.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import InvalidError
from vkprovider.placement.policy import PolicyError, parse_overflow_policy
from vkprovider.testing.harness import MockCloudProcess
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_hotgpu import condition
from .test_hotgpu import start as start_stack
from .test_moveback import ReadyWatcher, Sampler, live_instances
from .test_overflow import POLICIES, gpu_deployment, pods, policy

pytestmark = pytest.mark.cluster
CONDITION = "vkprovider.io/InterruptionPlanned"
INTENT = "vkprovider.io/hot-swap"
SPOT = 0.79  # per GPU-hour, against 2.49 on demand


@pytest_asyncio.fixture
async def objects(cluster_objects: Cluster) -> Cluster:
    return cluster_objects


async def start(system: System, namespace: str, companion_kubeconfig: Path) -> MockCloudProcess:
    """One mock cloud selling the same 16 H100 on demand and as spot, the provider (a sweep a
    second) and the companion."""
    return await start_stack(system, namespace, companion_kubeconfig,
                             inventory="H100:us-east:16:2.49", offers=[
                                 {"gpu_type": "H100", "region": "us-east", "count": 16,
                                  "price_per_gpu_hour": 2.49, "spot_price_per_gpu_hour": SPOT}],
                             pods={"status_interval_seconds": 1.0}, kubelet_api={})


class InstanceWatcher(Sampler):
    """Samples the cloud's live (not deleted) instances; keeps the maximum."""

    def __init__(self, system: System) -> None:
        super().__init__()
        self.system = system
        self.maximum = 0

    async def take(self) -> None:
        self.maximum = max(self.maximum, await live_instances(self.system))


async def live_pods(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    """The Deployment's pods that are not finished (a Failed pod stays until it is collected)."""
    return [p for p in await pods(kube, namespace, "inference")
            if p["status"].get("phase") not in ("Failed", "Succeeded")]


async def serving(kube: KubeClient, namespace: str, system: System,
                  n: int) -> list[dict[str, Any]]:
    return await eventually(lambda: live_pods(kube, namespace),
                            until=lambda ps: len(ps) == n and all(
                                p["spec"].get("nodeName") == system.node_name
                                and p["status"].get("phase") == "Running"
                                and condition(p, "Ready").get("status") == "True" for p in ps),
                            timeout=120, interval=0.5, what=f"{n} replicas serving from the cloud")


async def test_spot_replicas_are_replaced_before_a_planned_interruption_and_after_one(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    objects: Cluster,
) -> None:
    cloud = await start(system, namespace, companion_kubeconfig)
    body = policy(f"spot-{uuid.uuid4().hex[:6]}", namespace=namespace, app="inference",
                  providers=["cloud0"])
    body["spec"]["interruptible"] = "Allow"
    body["spec"]["moveBack"] = {"timeout": "90s", "cooldown": "5s"}
    await objects.create(POLICIES, body)
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=2, pool=namespace))
    first = await serving(kube, namespace, system, 2)
    # on spot: the cheaper kind of the one provider
    ledger = {e["id"]: e for e in await cloud.ledger()}
    for p in first:
        entry = ledger[p["metadata"]["annotations"]["vkprovider.io/instance-id"]]
        assert entry["interruptible"] is True and entry["price_per_hour"] == SPOT, entry
    await eventually(lambda: kube.get(dep_path), timeout=60,
                     until=lambda d: int(d.get("status", {}).get("readyReplicas") or 0) == 2,
                     what="the Deployment reporting 2 ready")

    # ---- planned: the cloud announces a reclaim in 120 s ------------------------------------
    doomed = first[0]
    doomed_name = doomed["metadata"]["name"]
    doomed_instance = doomed["metadata"]["annotations"]["vkprovider.io/instance-id"]
    ready, instances = ReadyWatcher(kube, dep_path), InstanceWatcher(system)
    ready.start()
    instances.start()
    await ready.fresh()
    await instances.fresh()
    try:
        await cloud.admin("POST", f"/admin/instances/{doomed_instance}/interruption",
                          json={"in_seconds": 120})
        marked = await eventually(
            lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{doomed_name}"),
            until=lambda p: condition(p, CONDITION).get("status") == "True",
            timeout=30, interval=0.3, what="the pod marked InterruptionPlanned=True")
        cond = condition(marked, CONDITION)
        assert cond.get("reason") == "InterruptionAnnounced"
        assert doomed_instance in str(cond.get("message")) and "cloud0" in str(cond["message"])
        after = await eventually(
            lambda: pods(kube, namespace, "inference"),
            until=lambda ps: len(ps) == 2
            and doomed_name not in {p["metadata"]["name"] for p in ps}
            and all(p["status"].get("phase") == "Running" for p in ps),
            timeout=100, interval=0.5, what="the replica replaced before the interruption")
        dep = await eventually(lambda: kube.get(dep_path), timeout=60,
                               until=lambda d: INTENT not in (d["metadata"].get("annotations")
                                                              or {})
                               and int(d.get("status", {}).get("readyReplicas") or 0) == 2,
                               what="the swap finished, 2 ready")
        await eventually(cloud.ledger, timeout=60, what="the doomed instance deleted",
                         until=lambda led: any(e["id"] == doomed_instance
                                               and e["state"] == "deleted" for e in led))
        await ready.fresh()
        await instances.fresh()
    finally:
        await ready.stop()
        await instances.stop()
    assert ready.minimum is not None and ready.minimum >= 2, \
        f"ready replicas dipped to {ready.minimum} before the planned interruption"
    assert instances.maximum <= 3, f"{instances.maximum} instances for 2 replicas (+1 surge)"
    assert dep["spec"]["replicas"] == 2
    # deleted before the cloud took it: never interrupted
    [gone] = [e for e in await cloud.ledger() if e["id"] == doomed_instance]
    assert gone["interrupted"] is False
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    reasons = {(e["involvedObject"]["kind"], e["reason"]) for e in events}
    assert {("Pod", "InterruptionPlanned"), ("Deployment", "ReplacingInterruptedReplica"),
            ("Deployment", "ReplacedInterruptedReplica")} <= reasons, reasons
    await eventually(lambda: live_instances(system), until=lambda n: n == 2, timeout=60,
                     what="one instance per replica")

    # ---- unplanned: the cloud reclaims one now --------------------------------------------
    victim = after[0]
    victim_name = victim["metadata"]["name"]
    victim_instance = victim["metadata"]["annotations"]["vkprovider.io/instance-id"]
    await cloud.admin("POST", f"/admin/instances/{victim_instance}/interrupt")
    failed = await eventually(
        lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{victim_name}"),
        until=lambda p: p["status"].get("phase") == "Failed",
        timeout=30, interval=0.3, what="the reclaimed pod Failed")
    assert failed["status"].get("reason") == "InstanceInterrupted"
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events",
                             params={"fieldSelector": f"involvedObject.name={victim_name}"}))
    interrupted = [e for e in events["items"] if e["reason"] == "InstanceInterrupted"]
    assert interrupted and interrupted[0]["type"] == "Warning"
    assert "cloud0" in interrupted[0]["message"] and victim_instance in interrupted[0]["message"]
    replaced = await serving(kube, namespace, system, 2)
    assert victim_name not in {p["metadata"]["name"] for p in replaced}
    await eventually(cloud.ledger, timeout=60, what="the reclaimed instance deleted",
                     until=lambda led: any(e["id"] == victim_instance and e["state"] == "deleted"
                                           for e in led))
    await eventually(lambda: live_instances(system), until=lambda n: n == 2, timeout=60,
                     what="one instance per replica, no duplicate")
    # nothing leaks: the Deployment gone, every instance is deleted
    await kube.delete(dep_path)
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=90,
                     what="every cloud instance deleted")


async def test_an_unknown_interruptible_mode_is_refused_by_the_api_server_naming_the_field(
    kube: KubeClient, objects: Cluster,
) -> None:
    body = policy(f"bad-{uuid.uuid4().hex[:6]}", namespace="default", app="x",
                  providers=["cloud0"])
    body["spec"]["interruptible"] = "Sometimes"
    with pytest.raises(InvalidError) as info:
        await objects.create(POLICIES, body)
    causes = [str(c.get("field", "")) for c in
              info.value.body.get("details", {}).get("causes") or []]
    assert "spec.interruptible" in causes, info.value.body
    with pytest.raises(PolicyError) as parsed:  # the companion's reading agrees
        parse_overflow_policy(body)
    assert parsed.value.field == "spec.interruptible"
    body["spec"]["interruptible"] = "Prefer"
    stored = await objects.create(POLICIES, body)
    assert stored["spec"]["interruptible"] == "Prefer"
    del body["spec"]["interruptible"]
    body["metadata"]["name"] += "-d"
    assert (await objects.create(POLICIES, body))["spec"]["interruptible"] == "Never"


async def test_a_policy_that_does_not_opt_in_never_gets_a_spot_instance(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    objects: Cluster,
) -> None:
    cloud = await start(system, namespace, companion_kubeconfig)
    body = policy(f"od-{uuid.uuid4().hex[:6]}", namespace=namespace, app="inference",
                  providers=["cloud0"])  # interruptible left out: Never
    await objects.create(POLICIES, body)
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=2, pool=namespace))
    running = await serving(kube, namespace, system, 2)
    ledger = {e["id"]: e for e in await cloud.ledger()}
    assert len(ledger) == 2
    for p in running:
        entry = ledger[p["metadata"]["annotations"]["vkprovider.io/instance-id"]]
        assert entry["interruptible"] is False and entry["price_per_hour"] == 2.49, entry
    await kube.delete(f"/apis/apps/v1/namespaces/{namespace}/deployments/inference")
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=90,
                     what="every cloud instance deleted")

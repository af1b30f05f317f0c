"""Pre-warm planned again while the check is Pending (issue 15): the surge grows with the
displacement, never shrinks, is recorded before it is scaled, and says so in an Event; and
move-back counts a pre-warm-pending gang's GPUs as taken.

The story from the day bench: 2 nodes x 4 GPUs, 4 inference replicas on n0, a gang of 6 x 1 GPU.
Planned when its quota is reserved: 4 gang pods fit n1's free GPUs, 2 displace 2 replicas:
surge 4 -> 6. The scheduler puts the 2 surge replicas on n1 (there is room), so the gang now
displaces 4; planned once, the gang preempts 4 with only 2 pre-warmed.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from vkprovider.descheduler import prewarm_plan as plan
from vkprovider.descheduler.fit import find_fit, slim_node
from vkprovider.descheduler.kueue_demand import upcoming_claims
from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.descheduler.prewarm import Prewarm

GPU = "nvidia.com/gpu"
NS = "team"


def node(name: str, gpus: int = 4) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "a"}},
            "spec": {"taints": [], "unschedulable": False},
            "status": {"allocatable": {GPU: gpus, "cpu": 64000, "memory": 2**40},
                       "ready": True, "unhealthy": None}}


def pod(name: str, node_name: str | None, *, priority: int = 100) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "creationTimestamp": "2025-01-01T00:00:00Z", "deletionTimestamp": None,
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "inference-abc12",
                                              "controller": True, "uid": "rs-inference"}],
                         "labels": {"app": "inference", "pod-template-hash": "abc12"},
                         "annotations": {}},
            "spec": {"nodeName": node_name, "requests": {GPU: 1, "cpu": 0, "memory": 0},
                     "priority": priority},
            "status": {"phase": "Running" if node_name else "Pending", "ready": True}}


GANG = [plan.GangPod(podset="main", gpus=1, spec={"containers": [
    {"name": "t", "resources": {"limits": {GPU: "1"}}}]}) for _ in range(6)]
NODES = [node("n0"), node("n1"), node("vk", 100)]
HOME = [pod(f"inference-{i}", "n0") for i in range(4)]


def victims(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found = plan.displacement(gang=GANG, priority=1000, nodes=NODES, pods=pods,
                              exclude_nodes=frozenset({"vk"}), prewarmable=lambda _p: True)
    return plan.group_by_deployment(found.victims)


def surging(surge: int, names: tuple[str, ...] = ()) -> plan.Intent:
    return plan.Intent(workload=f"{NS}/gang", workload_uid="w1", check="prewarm", replicas=4,
                       surge=surge, phase=plan.SURGING, started=1000.0, policy="p",
                       victims=names)


PENDING = plan.WorkloadView(quota_reserved=True, check_state="Pending")


# ---- when ---------------------------------------------------------------------------------------


def test_replanning_only_while_every_intent_surges_and_the_check_is_pending() -> None:
    s = plan.Surged(intent=surging(2), ready=5)
    assert plan.replanning(PENDING, [s])
    assert not plan.replanning(PENDING, []), "no surge yet: that is the first plan"
    ready = plan.Surged(intent=surging(2).moved(phase=plan.READY), ready=6)
    assert not plan.replanning(PENDING, [s, ready]), "marked Ready: the plan is final"
    restoring = plan.Surged(intent=surging(2).moved(phase=plan.RESTORING), ready=6)
    assert not plan.replanning(PENDING, [restoring])
    for view in (plan.WorkloadView(quota_reserved=True, check_state="Ready"),
                 plan.WorkloadView(quota_reserved=True, admitted=True, check_state="Pending"),
                 plan.WorkloadView(quota_reserved=False, check_state="Pending"),
                 plan.WorkloadView(quota_reserved=True, finished=True, check_state="Pending"),
                 plan.WorkloadView(exists=False)):
        assert not plan.replanning(view, [s]), view


# ---- how much -----------------------------------------------------------------------------------


def test_the_surge_grows_as_surge_replicas_take_the_free_gpus_then_settles() -> None:
    first = victims(HOME)
    assert {k: len(v) for k, v in first.items()} == {f"{NS}/inference": 2}
    intent = surging(2, tuple(p["metadata"]["name"] for p in first[f"{NS}/inference"]))
    # the scheduler put both surge replicas inside, on the GPUs the gang needs
    now_inside = [*HOME, pod("inference-s1", "n1"), pod("inference-s2", "n1")]
    growth = plan.grow(intents={f"{NS}/inference": intent}, victims=victims(now_inside))
    assert growth and not growth.new
    was, grown = growth.grown[f"{NS}/inference"]
    assert (was.surge, grown.surge, grown.target, grown.replicas) == (2, 4, 8, 4)
    assert len(grown.victims) == 4 and grown.phase == plan.SURGING
    assert grown.started == intent.started, "the timeout still runs from the first surge"
    # two more inside, then the last two can only go to the cloud: 6 and it stays 6
    fuller = [*now_inside, pod("inference-s3", "n1"), pod("inference-s4", "n1")]
    [(_, six)] = plan.grow(intents={f"{NS}/inference": grown},
                           victims=victims(fuller)).grown.values()
    assert six.surge == 6
    settled = [*fuller, pod("inference-s5", "vk"), pod("inference-s6", "vk")]
    assert not plan.grow(intents={f"{NS}/inference": six}, victims=victims(settled))
    # once the gang preempts its 6, 10 - 6 = the 4 desired stay Ready


def test_the_surge_never_shrinks_while_pending() -> None:
    bigger = surging(4, ("inference-0", "inference-1", "inference-2", "inference-3"))
    assert not plan.grow(intents={f"{NS}/inference": bigger}, victims=victims(HOME)), \
        "2 displaced now, 4 surging: kept"


def test_a_deployment_displaced_only_now_is_new() -> None:
    other = {**pod("other-0", "n1"), "metadata": {
        **pod("other-0", "n1")["metadata"], "name": "other-0",
        "ownerReferences": [{"kind": "ReplicaSet", "name": "other-xyz99", "controller": True,
                             "uid": "rs-other"}],
        "labels": {"app": "other", "pod-template-hash": "xyz99"}}}
    growth = plan.grow(intents={f"{NS}/inference": surging(2)},
                       victims={f"{NS}/other": [other]})
    assert list(growth.new) == [f"{NS}/other"] and not growth.grown


def test_the_grown_intent_round_trips_so_a_restart_reads_the_bigger_target() -> None:
    [(_, grown)] = plan.grow(intents={f"{NS}/inference": surging(2)},
                             victims=victims([*HOME, pod("inference-s1", "n1"),
                                              pod("inference-s2", "n1")])).grown.values()
    again = plan.Intent.loads(grown.dumps())
    assert again == grown and again.target == 8
    view = plan.Surged(intent=again, ready=6)
    assert plan.next_action(PENDING, [view], now=1010.0, timeout=60).kind == "surge", \
        "6 Ready is no longer enough: wait for 8"


def test_an_unhealthy_node_the_gang_can_use_has_no_free_gpus_but_its_replicas_are_victims(
) -> None:
    """From the day bench: gpu-node-1 tainted PreferNoSchedule, 2 replicas and 2 free GPUs
    there, gang x8 on 2 x 4 GPUs. Left out as unhealthy, its 2 replicas were not pre-warmed and
    the gang (the scheduler does not know about health) preempted them: a dip to 2 of 4."""
    sick = {**node("n1"), "spec": {"taints": [{"key": "AggregatedNodeHealth", "value": "False",
                                                "effect": "PreferNoSchedule"}],
                                    "unschedulable": False},
            "status": {**node("n1")["status"], "unhealthy": "health taint AggregatedNodeHealth"}}
    pods = [pod("inference-0", "n0"), pod("inference-1", "n0"), pod("inference-2", "n1"),
            pod("inference-3", "n1")]
    gang8 = [*GANG, *GANG[:2]]
    found = plan.displacement(gang=gang8, priority=1000, nodes=[node("n0"), sick], pods=pods,
                              exclude_nodes=frozenset(), prewarmable=lambda _p: True)
    assert sorted(p["metadata"]["name"] for p in found.victims) == [
        "inference-0", "inference-1", "inference-2", "inference-3"]
    assert found.free_pods == 2, "n0's 2 free GPUs; n1's are not counted as free"
    assert len(found.unplaced) == 2, "n1's free GPUs: not counted (never surged for less)"
    tainted = {**sick, "spec": {**sick["spec"], "taints": [
        {"key": "AggregatedNodeHealth", "value": "False", "effect": "NoSchedule"}]}}
    found = plan.displacement(gang=gang8, priority=1000, nodes=[node("n0"), tainted],
                              pods=pods, exclude_nodes=frozenset(), prewarmable=lambda _p: True)
    assert sorted(p["metadata"]["name"] for p in found.victims) == [
        "inference-0", "inference-1"], "NoSchedule: the gang cannot go there, nothing preempted"


# ---- move-back while the check is pending -------------------------------------------------------


def test_move_back_counts_a_pre_warm_pending_gang_as_taken() -> None:
    wl = {"metadata": {"name": "gang", "namespace": NS, "uid": "w1",
                       "creationTimestamp": "2025-01-01T00:00:00Z",
                       "ownerReferences": [{"kind": "Job", "name": "gang", "uid": "job-gang"}]},
          "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 6, "template": {
              "spec": {"containers": [{"name": "t", "resources": {"limits": {GPU: "1"}}}]}}}]},
          "status": {"conditions": [{"type": "QuotaReserved", "status": "True"},
                                    {"type": "Admitted", "status": "False"}],
                     "admissionChecks": [{"name": "prewarm", "state": "Pending"}],
                     "admission": {"clusterQueue": "cq", "podSetAssignments": [
                         {"name": "main", "count": 6, "flavors": {GPU: "gpu-a"},
                          "resourceUsage": {GPU: "6"}}]}}}
    flavors = {"gpu-a": {"metadata": {"name": "gpu-a"}, "spec": {"nodeLabels": {"pool": "a"}}}}
    nodes = [slim_node({"metadata": {"name": n, "labels": {"pool": "a"}}, "spec": {},
                        "status": {"allocatable": {GPU: "4"}, "capacity": {GPU: "4"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}, ())
             for n in ("n0", "n1")]
    inside = [{**p, "spec": {**p["spec"], "requests": {GPU: 1}}} for p in HOME[:2]]
    [claim] = upcoming_claims(workloads=[wl], cluster_queues={}, local_queues={},
                              flavors=flavors, nodes=nodes, pods=inside,
                              exclude_nodes=frozenset())
    assert (claim.gpus, claim.why) == (6, "quota reserved, pods not running")
    spec = {"containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}]}
    fit = find_fit(pod_spec=spec, nodes=nodes, pods=inside, exclude_nodes=frozenset(),
                   claims=[claim])
    assert (fit.node, fit.held_by) == (None, "kueue"), "6 free GPUs, all the gang's"
    fit = find_fit(pod_spec=spec, nodes=nodes, pods=inside, exclude_nodes=frozenset())
    assert fit.node is not None, "without the claim the replica would come home"


# ---- the controller: recorded, then scaled, then told -------------------------------------------


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def patch(self, path: str, body: Any) -> Any:
        self.calls.append(("PATCH", path, body))
        return {}

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.calls.append((method, path, kwargs.get("body")))
        return {}


class FakeEvents:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    async def emit(self, *, obj: dict[str, Any], reason: str, message: str,
                   type_: str = "Normal") -> None:
        self.sent.append((obj.get("kind") or "", reason, message))


POLICY = {"apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
          "metadata": {"name": "p"},
          "spec": {"selector": {"namespaces": [NS]}, "providers": ["cloud0"],
                   "prewarm": {"enabled": True}}}


def controller(pods: list[dict[str, Any]], intent: plan.Intent
               ) -> tuple[Prewarm, FakeClient, FakeEvents, dict[str, Any]]:
    client, events = FakeClient(), FakeEvents()
    store = SimpleNamespace

    moveback = SimpleNamespace(
        metrics=CompanionMetrics(),
        nodes=store(store={n["metadata"]["name"]: n for n in NODES}),
        pods=store(store={f"{NS}/{p['metadata']['name']}": p for p in pods}),
        deployments=store(store={}), hpas=store(store={}))
    admission = SimpleNamespace(policies=store(store={"p": POLICY}),
                                namespaces=store(store={}))
    pw = Prewarm(client=client, events=events, node_names=["vk"],  # type: ignore[arg-type]
                 admission=admission, moveback=moveback)  # type: ignore[arg-type]
    dep = {"metadata": {"name": "inference", "namespace": NS, "resourceVersion": "7",
                        "labels": {plan.LABEL: "true"},
                        "annotations": {plan.INTENT: intent.dumps()}},
           "spec": {"replicas": intent.target}, "status": {"readyReplicas": intent.target}}
    pw.surged.store[f"{NS}/inference"] = dep
    moveback.deployments.store[f"{NS}/inference"] = dep
    return pw, client, events, dep


WORKLOAD = {"metadata": {"name": "gang", "namespace": NS, "uid": "w1",
                         "ownerReferences": [{"kind": "Job", "name": "gang", "uid": "job-gang"}]},
            "spec": {"priority": 1000, "podSets": [{"name": "main", "count": 6, "template": {
                "spec": {"containers": [{"name": "t", "resources": {"limits": {GPU: "1"}}}]}}}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                       "admissionChecks": [{"name": "prewarm", "state": "Pending",
                                            "message": "surging"}]}}


def test_the_controller_records_the_bigger_surge_then_scales_and_tells() -> None:
    intent = surging(2, ("inference-0", "inference-1"))
    pods = [*HOME, pod("inference-s1", "n1"), pod("inference-s2", "n1")]
    pw, client, events, _dep = controller(pods, intent)
    grew = asyncio.run(pw._replan(WORKLOAD, "prewarm", None, pw._policies(),
                                  [(intent, _dep)]))
    assert grew
    record, scale = client.calls[0], client.calls[1]
    assert record[1] == f"/apis/apps/v1/namespaces/{NS}/deployments/inference"
    written = plan.Intent.loads(record[2]["metadata"]["annotations"][plan.INTENT])
    assert (written.surge, written.target) == (4, 8)
    assert record[2]["metadata"]["resourceVersion"] == "7", "a stale read is refused"
    assert scale == ("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/inference/scale",
                     {"spec": {"replicas": 8}}), "scaled only after the intent is recorded"
    reasons = [(kind, reason) for kind, reason, _ in events.sent]
    assert reasons == [("Deployment", "PrewarmGrown"), ("Workload", "PrewarmGrown")]
    assert "surge 4 -> 8 (was -> 6)" in events.sent[0][2]
    check = client.calls[2]
    assert check[0] == "PATCH" and check[1].endswith("/workloads/gang/status")
    message = json.dumps(check[2])
    assert "the gang now displaces more" in message and '"Pending"' in message


def test_the_controller_does_nothing_when_the_plan_did_not_grow() -> None:
    intent = surging(2, ("inference-0", "inference-1"))
    pw, client, events, dep = controller([*HOME, pod("inference-s1", "vk"),
                                          pod("inference-s2", "vk")], intent)
    assert not asyncio.run(pw._replan(WORKLOAD, "prewarm", None, pw._policies(),
                                      [(intent, dep)]))
    assert client.calls == [] and events.sent == []

"""Move-back's fit with what it must hold back (issue 15): GPU health and Kueue's next demand.

Pure: slim nodes, pods and Kueue objects in, a Fit (or claims) out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from vkprovider.descheduler.fit import (
    DEFAULT_HEALTH_TAINTS,
    Claim,
    HealthTaint,
    find_fit,
    node_problem,
    parse_health_taint,
    slim_node,
    slim_pod,
)
from vkprovider.descheduler.kueue_demand import upcoming_claims
from vkprovider.descheduler.prewarm_plan import GangPod, displacement
from vkprovider.descheduler.surge import (
    floor_to_restore,
    hpa_surge_floor,
    outcome_reason,
    pod_gone,
    scale_back,
)

GPU = "nvidia.com/gpu"
HEALTH = tuple(parse_health_taint(t) for t in DEFAULT_HEALTH_TAINTS)
INFERENCE = {"containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}]}


def node(name: str, gpus: int = 4, *, taints: list[dict[str, str]] | None = None,
         allocatable: int | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return slim_node({
        "metadata": {"name": name, "labels": {"pool": "a", **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {"capacity": {GPU: str(gpus), "cpu": "64", "memory": "512Gi"},
                   "allocatable": {GPU: str(gpus if allocatable is None else allocatable),
                                   "cpu": "64", "memory": "512Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}, HEALTH)


def pod(name: str, gpus: int, *, node_name: str | None = None, owner: str = "rs",
        phase: str = "Running") -> dict[str, Any]:
    return slim_pod({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "ownerReferences": [{"kind": "Job", "name": owner, "uid": owner,
                                          "controller": True}]},
        "spec": {"nodeName": node_name, "containers": [
            {"name": "c", "resources": {"limits": {GPU: str(gpus)}}}]},
        "status": {"phase": phase}})


# ---- health ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("AggregatedNodeHealth", HealthTaint(key="AggregatedNodeHealth")),
    ("AggregatedNodeHealth=False", HealthTaint(key="AggregatedNodeHealth", value="False")),
    ("node.kubernetes.io/out-of-service:NoExecute",
     HealthTaint(key="node.kubernetes.io/out-of-service", effect="NoExecute")),
    ("example.com/gpu=bad:PreferNoSchedule",
     HealthTaint(key="example.com/gpu", value="bad", effect="PreferNoSchedule")),
    ("example.com/gpu=:NoSchedule", HealthTaint(key="example.com/gpu", value="",
                                                effect="NoSchedule")),
])
def test_health_taints_use_kubectl_taint_syntax(text: str, expected: HealthTaint) -> None:
    assert parse_health_taint(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize("text, says", [
    ("", r"KEY\[=VALUE\]\[:EFFECT\]"),
    ("bad key", "is not a taint key"),
    ("-x", "is not a taint key"),
    ("k=v v", "is not a taint value"),
    ("k:Sometimes", "effect 'Sometimes' is not one of NoSchedule"),
])
def test_bad_health_taints_are_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_health_taint(text)


def test_a_health_taint_of_any_effect_makes_a_node_unhealthy_even_if_tolerated() -> None:
    sick = node("n1", taints=[{"key": "AggregatedNodeHealth", "value": "False",
                               "effect": "PreferNoSchedule"}])
    assert sick["status"]["unhealthy"] == "health taint AggregatedNodeHealth=False:" \
                                          "PreferNoSchedule"
    tolerant = {**INFERENCE, "tolerations": [{"operator": "Exists"}]}
    assert node_problem(pod_spec=tolerant, node=sick, used={}, need={GPU: 1}) == \
        "n1 is unhealthy: health taint AggregatedNodeHealth=False:PreferNoSchedule"
    assert node_problem(pod_spec=tolerant, node=sick, used={}, need={GPU: 1},
                        ignore_health=True) is None
    assert node("n2", taints=[{"key": "other", "effect": "PreferNoSchedule"}])["status"][
        "unhealthy"] is None
    assert slim_node({"metadata": {"name": "x"}, "spec": {"taints": [
        {"key": "AggregatedNodeHealth", "effect": "NoSchedule"}]}, "status": {}})["status"][
        "unhealthy"] is None, "no health taints configured: nothing is unhealthy"


def test_fewer_allocatable_than_capacity_gpus_is_unhealthy() -> None:
    assert node("n1", gpus=4, allocatable=3)["status"]["unhealthy"] == \
        "3 of 4 nvidia.com/gpu allocatable (a GPU was withdrawn)"
    assert node("n1", gpus=4)["status"]["unhealthy"] is None


def test_move_back_never_counts_gpus_of_unhealthy_nodes_and_says_so() -> None:
    sick = node("n1", taints=[{"key": "AggregatedNodeHealth", "value": "False",
                               "effect": "PreferNoSchedule"}])
    fit = find_fit(pod_spec=INFERENCE, nodes=[sick], pods=[], exclude_nodes=frozenset())
    assert fit.node is None
    assert fit.held_by == "unhealthy"
    assert "on unhealthy nodes: n1 (health taint AggregatedNodeHealth=False:" in fit.held
    withdrawn = node("n2", gpus=4, allocatable=3)
    fit = find_fit(pod_spec=INFERENCE, nodes=[withdrawn], pods=[], exclude_nodes=frozenset())
    assert (fit.node, fit.held_by) == (None, "unhealthy")
    # untainted: counts again
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1")], pods=[], exclude_nodes=frozenset())
    assert (fit.node, fit.held) == ("n1", "")
    # a healthy node beside a sick one: that one is chosen, nothing held
    fit = find_fit(pod_spec=INFERENCE, nodes=[sick, node("n3")], pods=[],
                   exclude_nodes=frozenset())
    assert (fit.node, fit.held) == ("n3", "")


def test_a_node_that_does_not_fit_anyway_is_not_a_hold() -> None:
    full = node("n1", gpus=1, taints=[{"key": "AggregatedNodeHealth", "effect": "NoSchedule"}])
    fit = find_fit(pod_spec=INFERENCE, nodes=[full], pods=[pod("x", 1, node_name="n1")],
                   exclude_nodes=frozenset())
    assert (fit.node, fit.held) == (None, "")


def test_prewarm_displacement_skips_unhealthy_nodes() -> None:
    sick = node("n1", taints=[{"key": "GPUHealth", "effect": "NoSchedule"}])
    found = displacement(gang=[GangPod(podset="main", gpus=2, spec={})], priority=1000,
                         nodes=[sick], pods=[], exclude_nodes=frozenset(),
                         prewarmable=lambda _p: True)
    assert found.free_pods == 0 and found.unplaced, "its free GPUs do not count"


# ---- Kueue's next demand ----------------------------------------------------------------------


def test_a_claim_on_the_free_gpus_holds_the_move_and_names_the_workload() -> None:
    claim = Claim(workload="ns/train-2", pods=(2, 2), nodes=frozenset({"n1"}),
                  why="next in ClusterQueue gpus")
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1")], pods=[], exclude_nodes=frozenset(),
                   claims=[claim])
    assert fit.node is None
    assert fit.held_by == "kueue"
    assert fit.held == "Kueue will place 4 GPU(s) of workload ns/train-2 (next in ClusterQueue " \
                       "gpus) on these nodes"
    assert fit.claims == ("ns/train-2",)


def test_a_claim_leaving_room_or_elsewhere_does_not_hold() -> None:
    small = Claim(workload="ns/t", pods=(2,), nodes=frozenset({"n1"}))
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1")], pods=[], exclude_nodes=frozenset(),
                   claims=[small])
    assert fit.node == "n1"
    other = Claim(workload="ns/t", pods=(4,), nodes=frozenset({"n2"}))
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1"), node("n2")], pods=[],
                   exclude_nodes=frozenset(), claims=[other])
    assert fit.node == "n1", "the gang goes to its flavor's node, the inference to the other"


def test_pending_pods_of_a_claim_are_not_counted_twice() -> None:
    claim = Claim(workload="ns/t", pods=(2,), nodes=frozenset({"n1"}), owners=frozenset({"job"}))
    pending = pod("t-0", 2, owner="job")
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1", gpus=3)], pods=[pending],
                   exclude_nodes=frozenset(), claims=[claim])
    assert fit.node == "n1", "3 free, the gang takes 2, 1 is left for the replica"


def test_policy_headroom_holds_and_says_so() -> None:
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1", gpus=2)], pods=[],
                   exclude_nodes=frozenset(), policy_headroom_gpus=2)
    assert (fit.node, fit.held_by) == (None, "headroom")
    assert "moveBack.headroomGPUs" in fit.held
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1", gpus=3)], pods=[],
                   exclude_nodes=frozenset(), policy_headroom_gpus=2)
    assert fit.node == "n1"


# ---- claims from Kueue's objects --------------------------------------------------------------


def workload(name: str, *, gpus: int = 2, count: int = 2, queue: str = "q",
             reserved: bool = False, admitted: bool = False, finished: bool = False,
             priority: int = 0, created: str = "2025-01-01T00:00:00Z",
             flavor: str = "gpu-a") -> dict[str, Any]:
    conds = [{"type": "QuotaReserved", "status": "True" if reserved or admitted else "False"},
             {"type": "Admitted", "status": "True" if admitted else "False"}]
    if finished:
        conds.append({"type": "Finished", "status": "True"})
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                     "ownerReferences": [{"kind": "Job", "name": name, "uid": f"job-{name}"}]},
        "spec": {"queueName": queue, "priority": priority, "podSets": [
            {"name": "main", "count": count, "template": {"spec": {"containers": [
                {"name": "t", "resources": {"limits": {GPU: str(gpus)}}}]}}}]},
        "status": {"conditions": conds}}
    if reserved or admitted:
        body["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "count": count, "flavors": {GPU: flavor},
             "resourceUsage": {GPU: str(gpus * count)}}]}
    return body


CQ = {"cq": {"metadata": {"name": "cq"}, "spec": {"resourceGroups": [
    {"coveredResources": [GPU], "flavors": [
        {"name": "gpu-a", "resources": [{"name": GPU, "nominalQuota": "4"}]}]}]}}}
LQ = {"ns/q": {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"clusterQueue": "cq"}}}
FLAVORS = {"gpu-a": {"metadata": {"name": "gpu-a"}, "spec": {"nodeLabels": {"pool": "a"}}},
           "elsewhere": {"metadata": {"name": "elsewhere"},
                         "spec": {"nodeLabels": {"pool": "z"}}}}


def claims(workloads: list[dict[str, Any]], pods: list[dict[str, Any]],
           nodes: list[dict[str, Any]] | None = None) -> list[Claim]:
    return upcoming_claims(workloads=workloads, cluster_queues=CQ, local_queues=LQ,
                           flavors=FLAVORS, nodes=nodes or [node("n1"), node("vk")],
                           pods=pods, exclude_nodes=frozenset({"vk"}))


def test_a_reserved_workload_without_pods_is_a_claim_on_its_flavors_nodes() -> None:
    [claim] = claims([workload("b", reserved=True)], [])
    assert (claim.workload, claim.pods, claim.nodes, claim.owners) == (
        "ns/b", (2, 2), frozenset({"n1"}), frozenset({"job-b"}))
    assert claim.why == "quota reserved, pods not running"


def test_bound_pods_are_not_claimed_again_and_a_running_gang_claims_nothing() -> None:
    one = pod("b-0", 2, node_name="n1", owner="job-b")
    [claim] = claims([workload("b", admitted=True)], [one])
    assert claim.pods == (2,) and claim.why == "admitted, pods not running"
    both = [one, pod("b-1", 2, node_name="n1", owner="job-b")]
    assert claims([workload("b", admitted=True)], both) == []


def test_the_head_of_the_queue_that_fits_the_quota_is_a_claim() -> None:
    running = [pod(f"a-{i}", 2, node_name="n1", owner="job-a") for i in range(2)]
    a = workload("a", admitted=True)
    b = workload("b")
    assert claims([a, b], running) == [], "b does not fit the quota while a holds it"
    done = [{**p, "status": {**p["status"], "phase": "Succeeded"}} for p in running]
    [claim] = claims([a, b], done)
    assert (claim.workload, claim.why, claim.pods) == ("ns/b", "next in ClusterQueue cq", (2, 2))
    [claim] = claims([workload("a", admitted=True, finished=True), b], done)
    assert claim.workload == "ns/b"


def test_heads_follow_kueue_order_and_the_quota() -> None:
    low = workload("low", gpus=4, count=1, priority=0, created="2025-01-01T00:00:00Z")
    high = workload("high", gpus=4, count=1, priority=10, created="2025-01-02T00:00:00Z")
    assert [c.workload for c in claims([low, high], [])] == ["ns/high"]
    big = workload("big", gpus=8, count=1, created="2025-01-01T00:00:00Z")
    small = workload("small", gpus=2, count=1, created="2025-01-02T00:00:00Z")
    assert [c.workload for c in claims([big, small], [])] == ["ns/small"], "BestEffortFIFO"
    strict = {"cq": {**CQ["cq"], "spec": {**CQ["cq"]["spec"], "queueingStrategy": "StrictFIFO"}}}
    got = upcoming_claims(workloads=[big, small], cluster_queues=strict, local_queues=LQ,
                          flavors=FLAVORS, nodes=[node("n1")], pods=[],
                          exclude_nodes=frozenset())
    assert got == [], "StrictFIFO: the head that does not fit blocks the queue"


def test_no_kueue_or_other_nodes_means_no_claim() -> None:
    assert upcoming_claims(workloads=[], cluster_queues={}, local_queues={}, flavors={},
                           nodes=[node("n1")], pods=[], exclude_nodes=frozenset()) == []
    assert claims([workload("b", reserved=True, flavor="elsewhere")], []) == []
    unknown_queue = workload("c", queue="nope")
    assert claims([unknown_queue], []) == []


def test_end_to_end_in_pure_form_queued_gang_holds_the_move() -> None:
    running = [pod(f"a-{i}", 2, node_name="n1", owner="job-a", phase="Succeeded")
               for i in range(2)]
    found = claims([workload("a", admitted=True), workload("b")], running)
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1"), node("vk")], pods=running,
                   exclude_nodes=frozenset({"vk"}), claims=found)
    assert (fit.node, fit.held_by) == (None, "kueue")
    assert "workload ns/b (next in ClusterQueue cq)" in fit.held


def test_pending_pods_of_an_admitted_gang_hold_the_move_as_kueue_demand() -> None:
    claim = Claim(workload="ns/t", pods=(4,), nodes=frozenset({"n1"}), owners=frozenset({"job"}),
                  why="admitted, pods not running")
    pending = pod("t-0", 4, owner="job")
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1")], pods=[pending],
                   exclude_nodes=frozenset(), claims=[claim])
    assert (fit.node, fit.held_by) == (None, "kueue")
    assert "4 GPU(s) of workload ns/t (admitted, pods not running)" in fit.held
    fit = find_fit(pod_spec=INFERENCE, nodes=[node("n1")], pods=[pending],
                   exclude_nodes=frozenset())
    assert (fit.node, fit.held) == (None, ""), "without claims: a pending pod, as before"


# ---- taking a surge back (issue 36): relative, never over someone else's change ------------



@pytest.mark.parametrize("current, recorded, surge, back", [
    (5, 4, 1, 4),    # our surge, nothing else: back to N
    (8, 4, 1, 7),    # an HPA scaled up for load meanwhile: keep its 3, remove our 1
    (12, 4, 4, 8),   # kubectl scale 8 -> 12 during a pre-warm of 4: keep the person's 4
    (6, 4, 4, 4),    # a grown intent recorded, the scale to it not written (restart): to N
    (4, 4, 1, 4),    # the surge never written (restart after the intent): nothing to remove
    (3, 4, 1, 3),    # scaled down by someone else: theirs, untouched
])
def test_the_surge_is_taken_back_relative_to_the_count_now(current: int, recorded: int,
                                                             surge: int, back: int) -> None:
    assert scale_back(current=current, recorded=recorded, surge=surge) == back


def test_an_hpa_at_max_replicas_has_no_room_for_a_surge() -> None:
    assert hpa_surge_floor(hpa_min=2, hpa_max=6, replicas=4, surge=1) == 5
    assert hpa_surge_floor(hpa_min=6, hpa_max=9, replicas=4, surge=1) == 6  # floor above N+1
    assert hpa_surge_floor(hpa_min=2, hpa_max=4, replicas=4, surge=1) is None  # 422 otherwise
    assert hpa_surge_floor(hpa_min=2, hpa_max=None, replicas=4, surge=1) == 5


def test_an_hpa_floor_is_restored_only_while_it_is_ours() -> None:
    assert floor_to_restore(current=5, surged_to=5, original=2)
    assert floor_to_restore(current=2, surged_to=5, original=2)  # no-op, catches a stale cache
    assert not floor_to_restore(current=7, surged_to=5, original=2)  # someone changed it


def test_the_replaced_pod_is_judged_from_one_read_of_it() -> None:
    assert pod_gone(None, uid="u1")
    assert pod_gone({"metadata": {"uid": "u2"}}, uid="u1")  # a new pod of the same name
    assert pod_gone({"metadata": {"uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
                    uid="u1")
    assert not pod_gone({"metadata": {"uid": "u1", "deletionTimestamp": None}}, uid="u1")


def test_a_rollback_with_the_internal_replica_ready_says_why_the_cloud_one_stayed() -> None:
    """Seen in the e2e of a kubectl scale 5 -> 7 during a move of 4: the surge replica was ready,
    the scale-back 7 -> 6 made the ReplicaSet remove one of the new replicas still starting, and
    the Warning read "Rolled back ...: the internal replica is ready"."""
    said = outcome_reason(reason="the internal replica is ready", ready=True, gone=False,
                          recorded=4, back=6)
    assert said.startswith("the internal replica is ready, but the ReplicaSet took back a "
                           "replica that was not ready yet instead of the cloud one")
    assert "scaled from 4 to 6 meanwhile" in said
    assert "scaled" not in outcome_reason(reason="r", ready=True, gone=False, recorded=4,
                                          back=4)
    assert outcome_reason(reason="timed out", ready=False, gone=True, recorded=4, back=4) == \
        "timed out; the ReplicaSet removed the cloud replica all the same"
    for ready in (True, None):  # a move that worked, or a recorded one finished after the fact
        assert outcome_reason(reason="r", ready=ready, gone=True, recorded=4, back=4) == "r"
    assert outcome_reason(reason="r", ready=None, gone=False, recorded=4, back=4) == "r"
    assert outcome_reason(reason="r", ready=False, gone=False, recorded=4, back=4) == "r"


# -- the guarded writes of a surge and of taking it back (move-back and hot swap alike) -----


def _dep(*, replicas: int, annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "41", "annotations": annotations},
            "spec": {"replicas": replicas}}


@pytest.mark.parametrize("kind", ["move-back", "hot-swap"])
def test_surge_and_scale_back_bodies_write_only_while_the_intent_is_ours(kind: str) -> None:
    from vkprovider.descheduler.hotswap import INTENT as SWAP_KEY
    from vkprovider.descheduler.hotswap import SwapIntent
    from vkprovider.descheduler.moveback import INTENT as MOVE_KEY
    from vkprovider.descheduler.moveback import Intent
    from vkprovider.descheduler.surge import scale_back_body, surge_body

    intent: Intent | SwapIntent = (Intent(pod="p", pod_uid="u", replicas=3, started=1.0,
                                          policy="pol") if kind == "move-back" else
                                   SwapIntent(pod="p", pod_uid="u", replicas=3, started=1.0,
                                              policy="pol"))
    key = MOVE_KEY if kind == "move-back" else SWAP_KEY
    raw = intent.dumps()
    ours = {key: raw}
    assert surge_body(_dep(replicas=3, annotations=ours), key=key, raw=raw, n=3) == {
        "metadata": {"resourceVersion": "41"}, "spec": {"replicas": 4}}
    # someone scaled since the intent was recorded, or the intent is not (or no longer) ours
    assert surge_body(_dep(replicas=5, annotations=ours), key=key, raw=raw, n=3) is None
    assert surge_body(_dep(replicas=3, annotations={key: "other"}), key=key, raw=raw,
                      n=3) is None
    # an HPA scaled up to 7 meanwhile: only our surge comes off, and the intent says so
    body = scale_back_body(_dep(replicas=7, annotations=ours), key=key, raw=raw, intent=intent)
    assert body is not None and body["spec"] == {"replicas": 6}
    assert body["metadata"]["resourceVersion"] == "41"
    marked = type(intent)(**{**json.loads(body["metadata"]["annotations"][key])})
    assert marked.scaled_back == 6 and marked.replicas == 3
    # nothing of ours left to remove: the intent is marked, the count untouched
    body = scale_back_body(_dep(replicas=3, annotations=ours), key=key, raw=raw, intent=intent)
    assert body is not None and "spec" not in body
    assert scale_back_body(_dep(replicas=4, annotations={}), key=key, raw=raw,
                           intent=intent) is None

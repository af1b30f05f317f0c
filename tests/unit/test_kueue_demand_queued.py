"""Kueue's next demand, a gang queued behind another gang's quota (issue 15, "no ping-pong").

Quota 8, internal GPUs 8: gang x4 runs (holds 4), gang x8 waits. It does not fit the remaining
quota (4) but fits the nominal (8): it is admitted when x4 releases its 4, and then also takes the
4 GPUs free today. Those 4 are a claim now, or move-back brings inference home onto them and
gang x8 preempts it again.
"""

from __future__ import annotations

from typing import Any

import pytest

from vkprovider.descheduler.fit import Claim, find_fit, slim_node, slim_pod
from vkprovider.descheduler.kueue_demand import claimed_pods, upcoming_claims

GPU = "nvidia.com/gpu"
INFERENCE = {"containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}]}


def node(name: str, gpus: int = 4) -> dict[str, Any]:
    return slim_node({
        "metadata": {"name": name, "labels": {"pool": "a"}}, "spec": {},
        "status": {"capacity": {GPU: str(gpus)}, "allocatable": {GPU: str(gpus)},
                   "conditions": [{"type": "Ready", "status": "True"}]}}, ())


def pod(name: str, gpus: int, *, node_name: str | None, owner: str,
        phase: str = "Running") -> dict[str, Any]:
    return slim_pod({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "ownerReferences": [{"kind": "Job", "name": owner, "uid": owner,
                                          "controller": True}]},
        "spec": {"nodeName": node_name, "containers": [
            {"name": "c", "resources": {"limits": {GPU: str(gpus)}}}]},
        "status": {"phase": phase}})


def workload(name: str, *, pods: int, gpus: int = 1, holds: bool = False, admitted: bool = False,
             created: str, priority: int = 0, queue: str = "q") -> dict[str, Any]:
    conds = [{"type": "QuotaReserved", "status": "True" if holds else "False"},
             {"type": "Admitted", "status": "True" if admitted else "False"}]
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                     "ownerReferences": [{"kind": "Job", "name": name, "uid": f"job-{name}"}]},
        "spec": {"queueName": queue, "priority": priority, "podSets": [
            {"name": "main", "count": pods, "template": {"spec": {"containers": [
                {"name": "t", "resources": {"limits": {GPU: str(gpus)}}}]}}}]},
        "status": {"conditions": conds}}
    if holds:
        body["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "count": pods, "flavors": {GPU: "gpu-a"},
             "resourceUsage": {GPU: str(gpus * pods)}}]}
    return body


def cq(quota: int = 8, strategy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": [GPU], "flavors": [
        {"name": "gpu-a", "resources": [{"name": GPU, "nominalQuota": str(quota)}]}]}]}
    if strategy:
        spec["queueingStrategy"] = strategy
    return {"cq": {"metadata": {"name": "cq"}, "spec": spec}}


LQ = {"ns/q": {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"clusterQueue": "cq"}}}
FLAVORS = {"gpu-a": {"metadata": {"name": "gpu-a"}, "spec": {"nodeLabels": {"pool": "a"}}}}
NODES = [node("n0"), node("n1"), node("vk", 100)]


def running(name: str, count: int, *, phase: str = "Running") -> list[dict[str, Any]]:
    return [pod(f"{name}-{i}", 1, node_name=f"n{i // 4}", owner=f"job-{name}", phase=phase)
            for i in range(count)]


def claims(workloads: list[dict[str, Any]], pods: list[dict[str, Any]], *,
           strategy: str | None = None, quota: int = 8) -> list[Claim]:
    return upcoming_claims(workloads=workloads, cluster_queues=cq(quota, strategy),
                           local_queues=LQ, flavors=FLAVORS, nodes=NODES, pods=pods,
                           exclude_nodes=frozenset({"vk"}))


X4 = workload("x4", pods=4, holds=True, admitted=True, created="2025-01-01T00:00:00Z")
X8 = workload("x8", pods=8, created="2025-01-01T00:00:01Z")


@pytest.mark.parametrize("strategy", [None, "BestEffortFIFO", "StrictFIFO"])
def test_a_gang_queued_behind_the_running_gang_claims_what_its_release_does_not_cover(
        strategy: str | None) -> None:
    [claim] = claims([X4, X8], running("x4", 4), strategy=strategy)
    assert claim.workload == "ns/x8"
    assert claim.pods == (1, 1, 1, 1), "8 needed, x4 releases 4: 4 of today's free GPUs"
    assert claim.nodes == frozenset({"n0", "n1"})
    assert claim.owners == frozenset({"job-x8"})
    assert claim.why == "queued behind ns/x4 in ClusterQueue cq"


def test_move_back_is_held_while_the_first_gang_runs_and_the_event_says_why() -> None:
    pods = running("x4", 4)  # on n0; n1's 4 GPUs are free
    found = claims([X4, X8], pods)
    fit = find_fit(pod_spec=INFERENCE, nodes=NODES, pods=pods, exclude_nodes=frozenset({"vk"}),
                   claims=found)
    assert (fit.node, fit.held_by) == (None, "kueue")
    assert fit.held == ("Kueue will place 4 GPU(s) of workload ns/x8 (queued behind ns/x4 in "
                        "ClusterQueue cq) on these nodes")
    # without the queued gang the same GPUs are free: the replica would come home
    fit = find_fit(pod_spec=INFERENCE, nodes=NODES, pods=pods, exclude_nodes=frozenset({"vk"}),
                   claims=claims([X4], pods))
    assert fit.node == "n1"


def test_what_the_release_covers_is_left_free() -> None:
    x6 = workload("x6", pods=6, created="2025-01-01T00:00:01Z")
    [claim] = claims([X4, x6], running("x4", 4))
    assert claim.pods == (1, 1), "x6 takes x4's 4 and 2 of the free ones: 2 stay free"
    fit = find_fit(pod_spec=INFERENCE, nodes=NODES, pods=running("x4", 4),
                   exclude_nodes=frozenset({"vk"}), claims=[claim])
    assert fit.node == "n1"
    x3 = workload("x3", pods=3, created="2025-01-01T00:00:01Z")
    assert [c.workload for c in claims([X4, x3], running("x4", 4))] == ["ns/x3"], \
        "fits the remaining quota: next in the queue, as before"
    assert claims([X4, x3], running("x4", 4))[0].why == "next in ClusterQueue cq"


def test_a_gang_too_big_for_the_nominal_quota_claims_nothing() -> None:
    assert claims([X4, X8], running("x4", 4), quota=6) == []


def test_once_the_holder_finished_the_queued_gang_is_the_next_head() -> None:
    done = running("x4", 4, phase="Succeeded")
    [claim] = claims([X4, X8], done)
    assert (claim.workload, claim.gpus, claim.why) == ("ns/x8", 8, "next in ClusterQueue cq")


def test_strict_fifo_stops_at_the_queued_gang_best_effort_lets_small_ones_pass() -> None:
    x2 = workload("x2", pods=2, created="2025-01-01T00:00:02Z")
    strict = claims([X4, X8, x2], running("x4", 4), strategy="StrictFIFO")
    assert [(c.workload, c.gpus) for c in strict] == [("ns/x8", 4)], \
        "x2 waits behind x8 and takes GPUs x8 releases: no claim on today's"
    best = claims([X4, X8, x2], running("x4", 4))
    assert [(c.workload, c.gpus, c.why) for c in best] == [
        ("ns/x2", 2, "next in ClusterQueue cq"),
        ("ns/x8", 2, "queued behind ns/x4, ns/x2 in ClusterQueue cq")], \
        "x2 fits now and goes first; x8 then waits for x4's 4 and x2's 2: 2 more"


def test_a_chain_of_queued_gangs_counts_each_release_once() -> None:
    x8b = workload("x8b", pods=8, created="2025-01-01T00:00:02Z")
    got = claims([X4, X8, x8b], running("x4", 4))
    assert [(c.workload, c.gpus) for c in got] == [("ns/x8", 4)], \
        "the second x8 runs on the first one's 8 GPUs after it"


def test_kueue_order_priority_first() -> None:
    urgent = workload("urgent", pods=6, created="2025-01-01T00:00:09Z", priority=5)
    got = claims([X4, X8, urgent], running("x4", 4), strategy="StrictFIFO")
    assert [(c.workload, c.gpus) for c in got] == [("ns/urgent", 2)]
    assert got[0].why == "queued behind ns/x4 in ClusterQueue cq"


def test_a_holder_that_has_not_started_is_a_claim_and_the_gang_behind_it_too() -> None:
    reserved = workload("x4", pods=4, holds=True, created="2025-01-01T00:00:00Z")
    got = claims([reserved, X8], [])
    assert [(c.workload, c.gpus, c.why) for c in got] == [
        ("ns/x4", 4, "quota reserved, pods not running"),
        ("ns/x8", 4, "queued behind ns/x4 in ClusterQueue cq")], \
        "x4 takes 4 of the 8 free GPUs, x8 the other 4 after it"


def test_many_holders_are_named_briefly() -> None:
    holders = [workload(f"h{i}", pods=1, holds=True, admitted=True,
                        created=f"2025-01-01T00:00:0{i}Z") for i in range(5)]
    pods = [pod(f"h{i}-0", 1, node_name="n0" if i < 4 else "n1", owner=f"job-h{i}")
            for i in range(5)]
    x8 = workload("x8", pods=8, created="2025-01-01T00:01:00Z")
    [claim] = claims([*holders, x8], pods)
    assert claim.gpus == 3
    assert claim.why == "queued behind ns/h0, ns/h1, ns/h2 and 2 more in ClusterQueue cq"


@pytest.mark.parametrize("pods, covered, claim", [
    ([1] * 8, 4, (1, 1, 1, 1)),
    ([4, 4], 4, (4,)),
    ([4, 4], 6, (4,)),  # whole pods: rounds up
    ([4, 2, 2], 4, (4,)),
    ([4, 2], 0, (4, 2)),
    ([2, 2], 4, ()),
])
def test_claimed_pods_leave_the_smallest_to_the_release(pods: list[int], covered: int,
                                                        claim: tuple[int, ...]) -> None:
    assert claimed_pods(pods, covered=covered) == claim

"""Pre-warm's pure parts (descheduler/prewarm_plan.py): what a gang displaces, which replicas go
first, the intent on a Deployment and the transitions; and spec.prewarm validation."""

from __future__ import annotations

from typing import Any

import pytest

from vkprovider.descheduler import kueueapi
from vkprovider.descheduler import prewarm_plan as plan
from vkprovider.descheduler.backoff import Backoff
from vkprovider.placement import policy as pol

GPU = "nvidia.com/gpu"


def node(name: str, gpus: int, labels: dict[str, str] | None = None, *,
         taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {"pool": "a"}},
            "spec": {"taints": taints or [], "unschedulable": False},
            "status": {"allocatable": {GPU: gpus, "cpu": 64000, "memory": 2**40}, "ready": True}}


def pod(name: str, node_name: str | None, gpus: int = 1, *, priority: int | None = 100,
        deployment: str | None = "inference", ns: str = "team") -> dict[str, Any]:
    owners, labels = [], {"app": deployment or "bare"}
    if deployment:
        owners = [{"kind": "ReplicaSet", "name": f"{deployment}-abc12", "controller": True,
                   "uid": f"rs-{deployment}"}]
        labels["pod-template-hash"] = "abc12"
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "creationTimestamp": f"2025-01-01T00:00:{len(name):02d}Z",
                         "deletionTimestamp": None, "ownerReferences": owners,
                         "labels": labels, "annotations": {}},
            "spec": {"nodeName": node_name, "requests": {GPU: gpus, "cpu": 0, "memory": 0},
                     "priority": priority},
            "status": {"phase": "Running" if node_name else "Pending", "ready": True}}


def gang(count: int, gpus: int, *, node_selector: dict[str, str] | None = None
         ) -> list[plan.GangPod]:
    spec: dict[str, Any] = {"containers": [{"name": "t", "resources": {
        "limits": {GPU: str(gpus)}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return [plan.GangPod(podset="main", gpus=gpus, spec=spec) for _ in range(count)]


def everything(_pod: dict[str, Any]) -> bool:
    return True


# ---- displacement --------------------------------------------------------------------------------


def test_a_gang_that_fits_in_free_gpus_displaces_nothing() -> None:
    nodes = [node("n1", 4), node("n2", 4)]
    pods = [pod("i-0", "n1"), pod("i-1", "n1")]
    found = plan.displacement(gang=gang(2, 2), priority=1000, nodes=nodes, pods=pods,
                              exclude_nodes=frozenset(), prewarmable=everything)
    assert found.victims == [] and found.free_pods == 2 and found.displacing_pods == 0


def test_whole_pods_per_node_free_gpus_spread_over_nodes_do_not_count() -> None:
    # 2 free GPUs on each node: a 4-GPU pod fits on neither without preemption
    nodes = [node("n1", 4), node("n2", 4)]
    pods = [pod("a-0", "n1"), pod("a-1", "n1"), pod("b-0", "n2"), pod("b-1", "n2")]
    found = plan.displacement(gang=gang(1, 4), priority=1000, nodes=nodes, pods=pods,
                              exclude_nodes=frozenset(), prewarmable=everything)
    assert len(found.victims) == 2
    assert {p["spec"]["nodeName"] for p in found.victims} == {"n1"}  # one node, ties by name


def test_lowest_priority_first_and_never_the_gangs_priority_or_above() -> None:
    nodes = [node("n1", 4)]
    pods = [pod("hi", "n1", priority=2000, deployment="critical"),
            pod("mid", "n1", priority=500, deployment="mid"),
            pod("low-0", "n1", priority=100), pod("low-1", "n1", priority=100)]
    found = plan.displacement(gang=gang(1, 2), priority=1000, nodes=nodes, pods=pods,
                              exclude_nodes=frozenset(), prewarmable=everything)
    assert sorted(p["metadata"]["name"] for p in found.victims) == ["low-0", "low-1"]
    found = plan.displacement(gang=gang(1, 4), priority=1000, nodes=nodes, pods=pods,
                              exclude_nodes=frozenset(), prewarmable=everything)
    assert found.victims == [] and found.unplaced, "priority 2000 is never preempted by 1000"


def test_the_node_whose_victims_matter_least_is_chosen() -> None:
    nodes = [node("n1", 2), node("n2", 2)]
    pods = [pod("a", "n1", priority=500, deployment="mid"), pod("b", "n1", priority=500,
                                                                 deployment="mid"),
            pod("c", "n2", priority=100), pod("d", "n2", priority=100)]
    found = plan.displacement(gang=gang(1, 2), priority=1000, nodes=nodes, pods=pods,
                              exclude_nodes=frozenset(), prewarmable=everything)
    assert sorted(p["metadata"]["name"] for p in found.victims) == ["c", "d"]


def test_flavor_labels_selectors_taints_and_virtual_nodes_limit_the_nodes() -> None:
    nodes = [node("n1", 4, {"pool": "a"}), node("n2", 4, {"pool": "b"}),
             node("tainted", 4, {"pool": "b"}, taints=[{"key": "x", "value": "y",
                                                         "effect": "NoSchedule"}]),
             node("vk", 100, {"pool": "b"})]
    pods = [pod(f"a-{i}", "n1") for i in range(4)] + [pod(f"b-{i}", "n2") for i in range(4)]
    workload = {"spec": {"podSets": [{"name": "main", "count": 2, "template": {"spec": {
        "containers": [{"name": "t", "resources": {"limits": {GPU: "2"}}}]}}}]},
                "status": {"admission": {"podSetAssignments": [
                    {"name": "main", "count": 2, "flavors": {GPU: "flavor-b"}}]}}}
    members = plan.gang_of(workload, {"flavor-b": {"pool": "b"}})
    assert [m.spec["nodeSelector"] for m in members] == [{"pool": "b"}] * 2
    found = plan.displacement(gang=members, priority=1000, nodes=nodes, pods=pods,
                              exclude_nodes=frozenset({"vk"}), prewarmable=everything)
    assert sorted(p["metadata"]["name"] for p in found.victims) == ["b-0", "b-1", "b-2", "b-3"]
    assert found.displacing_pods == 2


def test_pods_no_policy_prewarms_are_displaced_but_not_victims_and_claimed_ones_skipped() -> None:
    nodes = [node("n1", 4)]
    pods = [pod("bare", "n1", deployment=None, priority=50), pod("i-0", "n1", priority=10),
            pod("i-1", "n1"), pod("i-2", "n1")]
    found = plan.displacement(gang=gang(1, 2), priority=1000, nodes=nodes, pods=pods,
                              exclude_nodes=frozenset(), claimed=frozenset({"team/i-0"}),
                              prewarmable=lambda p: p["metadata"]["name"] != "bare")
    # i-0 (claimed by another pre-warm) is going anyway; then the lowest priority: bare, i-1
    assert [p["metadata"]["name"] for p in found.others] == ["bare"]
    assert [p["metadata"]["name"] for p in found.victims] == ["i-1"]
    assert "1 of them no OverflowPolicy pre-warms" in found.summary()
    assert plan.group_by_deployment([*found.victims, *found.others]) == {
        "team/inference": found.victims}


# ---- the intent ------------------------------------------------------------------------------


def intent(**changes: Any) -> plan.Intent:
    base = plan.Intent(workload="team/job-gang", workload_uid="w1", check="prewarm",
                       replicas=4, surge=2, phase=plan.SURGING, started=1000.0, policy="p",
                       victims=("inference-a", "inference-b"))
    return base.moved(**changes)


def test_the_intent_round_trips_and_refuses_what_it_did_not_write() -> None:
    i = intent(hpa="inference", hpa_min=4)
    assert plan.Intent.loads(i.dumps()) == i
    assert i.target == 6
    for bad in ("{", "[]", '{"workload": 1}', intent(phase="Done").dumps(),  # type: ignore[arg-type]
                intent(surge=0).dumps()):
        with pytest.raises(ValueError):
            plan.Intent.loads(bad)


def test_admission_admits_surge_pods_at_once_and_holds_replacements_after_ready() -> None:
    surge_pod = pod("inference-new", None)
    assert plan.deployment_of_pod(surge_pod) == "team/inference"
    assert plan.admission_role(surge_pod, {"team/inference": intent()}) == "now"
    assert plan.admission_role(surge_pod, {"team/inference": intent(phase=plan.READY)}) == "hold"
    assert plan.admission_role(surge_pod, {"team/other": intent()}) is None
    assert plan.admission_role(pod("x", None, deployment=None), {"team/inference": intent()}) \
        is None


# ---- the AdmissionCheck's parameters -----------------------------------------------------------


def test_check_parameters_are_refused_by_field() -> None:
    good = pol.parse_overflow_policy({"metadata": {"name": "p"}, "spec": {"providers": ["a"]}})
    off = pol.parse_overflow_policy({"metadata": {"name": "off"}, "spec": {
        "providers": ["a"], "prewarm": {"enabled": False}}})
    policies: dict[str, object] = {"p": good, "off": off}

    def check(**params: str) -> dict[str, Any]:
        return {"spec": {"controllerName": plan.CONTROLLER_NAME, "parameters": params or None}}

    assert plan.check_problem(check(), policies) is None
    assert plan.check_problem(check(apiGroup="vkprovider.io", kind="OverflowPolicy", name="p"),
                              policies) is None
    cases = {
        "spec.parameters.apiGroup": check(apiGroup="kueue.x-k8s.io", kind="OverflowPolicy",
                                          name="p"),
        "spec.parameters.kind": check(apiGroup="vkprovider.io", kind="GPUProvider", name="p"),
    }
    for where, obj in cases.items():
        problem = plan.check_problem(obj, policies)
        assert problem is not None and problem[0] == where, problem
    missing = plan.check_problem(check(apiGroup="vkprovider.io", kind="OverflowPolicy",
                                       name="nope"), policies)
    assert missing == ("spec.parameters.name", "OverflowPolicy nope does not exist")
    disabled = plan.check_problem(check(apiGroup="vkprovider.io", kind="OverflowPolicy",
                                        name="off"), policies)
    assert disabled is not None and "prewarm.enabled false" in disabled[1]


# ---- transitions -------------------------------------------------------------------------------

PENDING = plan.WorkloadView(quota_reserved=True, check_state="Pending")


def act(view: plan.WorkloadView, *surged: plan.Surged, now: float = 1010.0,
        on_timeout: str = "Proceed") -> plan.Action:
    return plan.next_action(view, surged, now=now, timeout=60, on_timeout=on_timeout)


def test_plan_only_for_a_pending_check_with_quota() -> None:
    assert act(PENDING).kind == "plan"
    for view in (plan.WorkloadView(quota_reserved=False, check_state="Pending"),
                 plan.WorkloadView(quota_reserved=True, check_state="Ready"),
                 plan.WorkloadView(quota_reserved=True, admitted=True, check_state="Pending"),
                 plan.WorkloadView(exists=False)):
        assert act(view).kind == "idle", view


def test_surging_until_ready_then_ready_never_a_second_surge() -> None:
    assert act(PENDING, plan.Surged(intent(), ready=5)).kind == "surge"
    assert act(PENDING, plan.Surged(intent(), ready=6)).kind == "ready"
    # a restart after the intents were marked Ready but before the check was written
    assert act(PENDING, plan.Surged(intent(phase=plan.READY), ready=6)).kind == "ready"
    # with an intent recorded, nothing plans again: the surge target stays N + surge
    assert act(PENDING, plan.Surged(intent(), ready=4)).kind != "plan"


def test_timeout_undoes_the_surge_then_proceeds_or_retries() -> None:
    late = act(PENDING, plan.Surged(intent(), ready=4), now=1061.0)
    assert (late.kind, late.check) == ("restore", "Ready")
    assert "2 surge replica(s) not Ready" in late.reason
    retry = act(PENDING, plan.Surged(intent(), ready=4), now=1061.0, on_timeout="Retry")
    assert (retry.kind, retry.check) == ("restore", "Retry")
    # a restart mid-restore finishes it with the recorded outcome
    again = act(PENDING, plan.Surged(intent(phase=plan.RESTORING, outcome="Ready",
                                            message="timed out"), ready=4))
    assert (again.kind, again.check, again.reason) == ("restore", "Ready", "timed out")


def test_after_ready_restore_once_the_gang_runs_or_the_workload_goes() -> None:
    ready = plan.Surged(intent(phase=plan.READY, ready_at=1005.0), ready=6)
    waiting = plan.WorkloadView(quota_reserved=True, check_state="Ready")
    assert act(waiting, ready).kind == "idle"
    admitted = plan.WorkloadView(quota_reserved=True, admitted=True, check_state="Ready")
    assert act(admitted, ready).kind == "idle"
    for view in (plan.WorkloadView(quota_reserved=True, admitted=True, check_state="Ready",
                                   gang_bound=True),
                 plan.WorkloadView(quota_reserved=True, admitted=True, check_state="Ready",
                                   victims_gone=True),
                 plan.WorkloadView(exists=False), plan.WorkloadView(finished=True),
                 plan.WorkloadView(quota_reserved=True, check_state="Retry")):
        action = act(view, ready)
        assert action.kind == "restore" and action.check == "", view
    stuck = act(admitted, ready, now=1066.0)
    assert stuck.kind == "restore" and "within 60s of Ready" in stuck.reason


# ---- spec.prewarm --------------------------------------------------------------------------------


@pytest.mark.parametrize(("prewarm", "field", "message"), [
    ({"timeout": "0s"}, "spec.prewarm.timeout", "must be longer than 0s"),
    ({"timeout": "2h"}, "spec.prewarm.timeout", "must be at most 1h"),
    ({"timeout": "5 minutes"}, "spec.prewarm.timeout", "is not a duration"),
    ({"onTimeout": "Wait"}, "spec.prewarm.onTimeout", "'Proceed' or 'Retry'"),
    ({"enabled": "yes"}, "spec.prewarm.enabled", "boolean"),
])
def test_spec_prewarm_is_validated_naming_the_field(prewarm: dict[str, Any], field: str,
                                                    message: str) -> None:
    with pytest.raises(pol.PolicyError) as refused:
        pol.parse_overflow_policy({"metadata": {"name": "x"},
                                   "spec": {"providers": ["a"], "prewarm": prewarm}})
    assert refused.value.field == field
    assert message in refused.value.message


def test_spec_prewarm_defaults() -> None:
    spec = pol.parse_overflow_policy({"metadata": {"name": "x"},
                                      "spec": {"providers": ["a"]}}).spec
    assert (spec.prewarm.enabled, spec.prewarm.timeout_seconds, spec.prewarm.on_timeout) == (
        True, 300.0, "Proceed")


# ---- restart safety (issue 36): a recorded outcome is applied; timeouts count from quota ------


def test_a_recorded_outcome_is_written_while_the_check_is_still_pending() -> None:
    held = plan.WorkloadView(quota_reserved=True, check_state="Pending")
    assert plan.outcome_to_write(outcome="Retry", view=held) == "Retry"
    assert plan.outcome_to_write(outcome="Ready", view=held) == "Ready"
    assert plan.outcome_to_write(outcome="", view=held) is None  # nothing to tell


def test_an_outcome_kueue_acted_on_is_not_written_twice() -> None:
    # Kueue saw Retry: evicted the Workload, released its quota, reset the check to Pending
    assert plan.outcome_to_write(outcome="Retry", view=plan.WorkloadView(
        quota_reserved=True, check_state="Pending", evicted=True)) is None
    assert plan.outcome_to_write(outcome="Retry", view=plan.WorkloadView(
        quota_reserved=False, check_state="Pending")) is None
    assert plan.outcome_to_write(outcome="Retry", view=plan.WorkloadView(
        quota_reserved=True, check_state="Retry")) is None
    assert plan.outcome_to_write(outcome="Ready", view=plan.WorkloadView(exists=False)) is None


def test_the_timeout_counts_from_quota_reserved_not_from_queueing() -> None:
    wl = {"status": {
        "conditions": [{"type": "QuotaReserved", "status": "True",
                        "lastTransitionTime": "2026-01-01T01:00:00Z"}],
        "admissionChecks": [{"name": "prewarm", "state": "Pending",
                             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    assert plan.waiting_since(wl, "prewarm") == "2026-01-01T01:00:00Z"
    wl["status"]["conditions"][0]["status"] = "False"  # not holding quota: the check's time
    assert plan.waiting_since(wl, "prewarm") == "2026-01-01T00:00:00Z"
    assert plan.waiting_since({}, "prewarm") is None


def test_an_intent_records_that_the_surge_was_taken_back() -> None:
    intent = plan.Intent(workload="ns/w", workload_uid="u", check="c", replicas=4, surge=2,
                         phase=plan.RESTORING, started=1.0, policy="p", scaled_back=4)
    assert plan.Intent.loads(intent.dumps()) == intent
    with pytest.raises(ValueError, match="scaled_back"):
        plan.Intent.loads(intent.dumps().replace('"scaled_back":4', '"scaled_back":"4"'))


# ---- one failing object never starves the others (issue 36) ----------------------------------


def test_a_failing_object_backs_off_alone_doubling_and_is_forgotten_on_success() -> None:
    b = Backoff(base=1.0, cap=8.0)
    assert b.ready("a", now=0) and b.ready("b", now=0)
    assert b.failed("a", now=0) == 1.0
    assert not b.ready("a", now=0.5) and b.ready("b", now=0.5)  # b is not held by a
    assert b.ready("a", now=1.0)
    assert [b.failed("a", now=1.0), b.failed("a", now=3.0), b.failed("a", now=7.0),
            b.failed("a", now=15.0)] == [2.0, 4.0, 8.0, 8.0]  # doubling, capped
    b.succeeded("a")
    assert b.ready("a", now=15.0) and b.failed("a", now=15.0) == 1.0
    b.keep(set())
    assert b.ready("a", now=15.0)


# ---- Kueue's version is checked, not assumed (issue 36) --------------------------------------


def test_the_kueue_api_is_chosen_from_what_the_server_serves() -> None:
    none = kueueapi.choose(None)
    assert none.usable and not none.served and none.base == "/apis/kueue.x-k8s.io/v1beta2"
    both = kueueapi.choose(["v1beta2", "v1beta1"], "v1beta2")
    assert both.usable and both.version == "v1beta2"
    newer_preferred = kueueapi.choose(["v1", "v1beta2"], "v1")
    assert newer_preferred.usable and newer_preferred.version == "v1beta2"  # what we speak
    old = kueueapi.choose(["v1beta1"], "v1beta1")
    assert not old.usable and old.version == "v1beta1"  # to mark our checks, nothing else
    assert "serves kueue.x-k8s.io v1beta1" in old.problem and "v1beta2" in old.problem
    assert "Kueue v0.17.0" in old.problem


def test_an_unsupported_kueue_marks_our_check_inactive_saying_why() -> None:
    check = {"spec": {"controllerName": plan.CONTROLLER_NAME}}
    assert plan.check_active(check, {}) == ("True", "Active", plan.ACTIVE_MESSAGE)
    old = kueueapi.choose(["v1beta1"])
    status, reason, message = plan.check_active(check, {}, kueue_problem=old.problem)
    assert (status, reason) == ("False", "UnsupportedKueueVersion") and message == old.problem
    bad = {"spec": {"controllerName": plan.CONTROLLER_NAME,
                    "parameters": {"apiGroup": "x", "kind": "OverflowPolicy", "name": "p"}}}
    assert plan.check_active(bad, {})[:2] == ("False", "InvalidParameters")

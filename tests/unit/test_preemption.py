"""vkprovider.descheduler.preemption: a credit needs the scheduler's condition and its Event."""

from __future__ import annotations

from typing import Any

from vkprovider.descheduler.fit import slim_pod
from vkprovider.descheduler.preemption import (
    USED_ANNOTATION,
    PreemptionTracker,
    controller_uid,
    disruption,
    event_from_scheduler,
)

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def iso(at: float) -> str:
    from datetime import UTC, datetime
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, *, rs: str | None = "rs-1", created: float = T0 + 5, uid: str | None = None,
        generate: str | None = "web-6d9f7-", reason: str | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "creationTimestamp": iso(created),
                            "uid": uid or f"uid-{name}", "annotations": annotations or {}}
    if rs:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "uid": rs, "controller": True}]
    if generate:
        meta["generateName"] = generate
    conditions = [{"type": "Ready", "status": "True"}]
    if reason:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": reason,
                           "lastTransitionTime": iso(T0)})
    return {"metadata": meta, "spec": {}, "status": {"phase": "Running",
                                                      "conditions": conditions}}


def event(victim: dict[str, Any], *, reporter: str | None = "default-scheduler",
          source: str | None = None, at: float = T0) -> dict[str, Any]:
    meta = victim["metadata"]
    body: dict[str, Any] = {
        "reason": "Preempted", "lastTimestamp": iso(at),
        "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": "ns",
                           "uid": meta["uid"]}}
    if reporter is not None:
        body["reportingComponent"] = reporter
    if source is not None:
        body["source"] = {"component": source}
    return body


class Patches:
    """Records the patches a claim sends (the KubeClient surface claim uses)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.error = error

    async def patch(self, path: str, body: Any) -> dict[str, Any]:
        self.sent.append((path, body))
        if self.error is not None:
            raise self.error
        return {}


def tracker(clock: Clock, client: Any = None) -> PreemptionTracker:
    return PreemptionTracker(client=client, clock=clock, ttl=600)


VICTIM = pod("web-6d9f7-aaaaa", created=T0 - 3600, reason="PreemptionByScheduler")


def test_controller_uid() -> None:
    assert controller_uid(pod("a")) == "rs-1"
    assert controller_uid(pod("a", rs=None)) is None


def test_the_condition_reads_the_same_from_a_full_and_a_slim_pod() -> None:
    assert disruption(VICTIM) == ("PreemptionByScheduler", iso(T0))
    assert disruption(slim_pod(VICTIM)) == ("PreemptionByScheduler", iso(T0))
    assert disruption(slim_pod(pod("x"))) is None and disruption(pod("x")) is None


def test_the_event_must_be_the_schedulers() -> None:
    assert event_from_scheduler(event(VICTIM), {"default-scheduler"})
    assert event_from_scheduler(event(VICTIM, reporter=None, source="default-scheduler"),
                                {"default-scheduler"})
    assert not event_from_scheduler(event(VICTIM, reporter="kubectl"), {"default-scheduler"})
    assert not event_from_scheduler(event(VICTIM, reporter=None), {"default-scheduler"})


def test_condition_and_event_together_admit_one_replacement_made_after_the_preemption() -> None:
    clock = Clock()
    t = tracker(clock)
    t.observe_pod("MODIFIED", slim_pod(VICTIM))
    assert t.credits == {}, "the condition alone grants nothing"
    t._on_event("ADDED", event(VICTIM))
    credit = t.credit_for(pod("web-6d9f7-bbbbb"))
    assert credit is not None and credit.victim_uid == "uid-web-6d9f7-aaaaa"
    assert t.credit_for(pod("old", created=T0 - 60)) is None, "made before the preemption"
    assert t.credit_for(pod("other", rs="rs-2")) is None, "another controller"
    assert t.credit_for(pod("bare", rs=None)) is None


def test_the_event_may_come_first_and_the_victim_may_be_gone_by_then() -> None:
    clock = Clock()
    t = tracker(clock)
    t._on_event("ADDED", event(VICTIM))
    assert t.credits == {}, "the Event alone grants nothing"
    t.observe_pod("DELETED", VICTIM)  # its last state, straight from the watch
    assert t.credit_for(pod("web-6d9f7-bbbbb")) is not None


def test_a_forged_event_grants_nothing() -> None:
    clock = Clock()
    t = tracker(clock)
    pending = pod("web-6d9f7-ppppp", created=T0 - 10)
    # an Event claiming the scheduler's name, naming a pod nobody preempted
    t._on_event("ADDED", event(pending, at=T0 - 60))
    t.observe_pod("MODIFIED", slim_pod(pending))
    # one naming a pod that does not exist, by the replacement's generated name
    t._on_event("ADDED", event(pod("web-6d9f7-zzzzz", uid="nobody"), at=T0 - 60))
    assert t.credits == {}
    assert t.credit_for(pending) is None
    # a real victim's Event, but not the scheduler's
    t.observe_pod("MODIFIED", slim_pod(VICTIM))
    t._on_event("ADDED", event(VICTIM, reporter="kubectl"))
    assert t.credits == {}


def test_other_disruptions_grant_nothing() -> None:
    clock = Clock()
    t = tracker(clock)
    evicted = pod("web-6d9f7-eeeee", reason="EvictionByEvictionAPI")
    t.observe_pod("MODIFIED", slim_pod(evicted))
    t._on_event("ADDED", event(evicted))
    assert t.credits == {}


async def test_claim_marks_the_victim_then_the_credit_is_spent() -> None:
    clock = Clock()
    client = Patches()
    t = tracker(clock, client)
    t.observe_pod("MODIFIED", slim_pod(VICTIM))
    t._on_event("ADDED", event(VICTIM))
    replacement = pod("web-6d9f7-bbbbb")
    credit = t.credit_for(replacement)
    assert credit is not None
    assert await t.claim(credit, replacement="ns/web-6d9f7-bbbbb")
    path, body = client.sent[0]
    assert path == "/api/v1/namespaces/ns/pods/web-6d9f7-aaaaa"
    assert body["metadata"] == {"uid": "uid-web-6d9f7-aaaaa",
                                "annotations": {USED_ANNOTATION: "ns/web-6d9f7-bbbbb"}}
    assert t.credit_for(pod("web-6d9f7-ccccc")) is None, "one credit, one replacement"
    # the watch shows the victim again (its annotation, or a relist): still spent
    t.observe_pod("MODIFIED", slim_pod(VICTIM))
    t._on_event("MODIFIED", event(VICTIM))
    assert t.credits == {}


async def test_a_failed_mark_spends_nothing_and_admits_nothing() -> None:
    from vkprovider.kube.errors import ServerError
    clock = Clock()
    t = tracker(clock, Patches(error=ServerError("boom", status=500)))
    t.observe_pod("MODIFIED", slim_pod(VICTIM))
    t._on_event("ADDED", event(VICTIM))
    credit = t.credit_for(pod("web-6d9f7-bbbbb"))
    assert credit is not None
    assert not await t.claim(credit, replacement="ns/web-6d9f7-bbbbb")
    assert t.credit_for(pod("web-6d9f7-bbbbb")) == credit, "kept for a later pass"


def test_a_restart_does_not_grant_a_spent_credit_again() -> None:
    clock = Clock()
    t = tracker(clock)  # a fresh process: its memory is empty
    marked = pod("web-6d9f7-aaaaa", created=T0 - 3600, reason="PreemptionByScheduler",
                 annotations={USED_ANNOTATION: "ns/web-6d9f7-bbbbb"})
    t.observe_pod("ADDED", slim_pod(marked))  # the relist of the still-terminating victim
    t._on_event("ADDED", event(marked))
    assert t.credits == {}
    assert t.credit_for(pod("web-6d9f7-ccccc")) is None


def test_credits_expire() -> None:
    clock = Clock()
    t = tracker(clock)
    t.observe_pod("MODIFIED", slim_pod(VICTIM))
    t._on_event("ADDED", event(VICTIM))
    clock.now = T0 + 601
    assert t.credit_for(pod("web-6d9f7-bbbbb")) is None
    t.prune()
    assert t.credits == {} and t._victims == {} and t._reported == {}


def test_old_preemptions_from_a_relist_give_no_credit() -> None:
    clock = Clock()
    clock.now = T0 + 3600
    t = tracker(clock)
    t.observe_pod("ADDED", slim_pod(VICTIM))
    t._on_event("ADDED", event(VICTIM, at=T0))
    assert t.credits == {} and t._victims == {} and t._reported == {}


def test_credits_are_bounded() -> None:
    from vkprovider.descheduler import preemption
    clock = Clock()
    t = tracker(clock)
    for i in range(preemption.MAX_REMEMBERED + 5):
        v = pod(f"web-6d9f7-{i:05d}", uid=f"v{i}", reason="PreemptionByScheduler")
        t.observe_pod("MODIFIED", v)
        t._on_event("ADDED", event(v))
    assert len(t.credits) == preemption.MAX_REMEMBERED
    assert "v0" not in t.credits and f"v{preemption.MAX_REMEMBERED + 4}" in t.credits


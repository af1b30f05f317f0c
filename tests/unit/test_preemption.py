"""vkprovider.descheduler.preemption: credits from the scheduler's Preempted events (pure parts)."""

from __future__ import annotations

from typing import Any

from vkprovider.descheduler.preemption import Credit, PreemptionTracker, controller_uid

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def iso(at: float) -> str:
    from datetime import UTC, datetime
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, *, rs: str | None = "rs-1", created: float = T0 + 5,
        generate: str | None = "web-6d9f7-") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "creationTimestamp": iso(created)}
    if rs:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "uid": rs, "controller": True}]
    if generate:
        meta["generateName"] = generate
    return {"metadata": meta}


def tracker(clock: Clock) -> PreemptionTracker:
    return PreemptionTracker(client=None, clock=clock, ttl=600)  # type: ignore[arg-type]


def test_controller_uid() -> None:
    assert controller_uid(pod("a")) == "rs-1"
    assert controller_uid(pod("a", rs=None)) is None


def test_a_credit_admits_one_replacement_made_after_the_preemption() -> None:
    clock = Clock()
    t = tracker(clock)
    credit = Credit(victim="ns/web-6d9f7-aaaaa", at=T0)
    t._add("rs-1", credit)
    assert t.credit_for(pod("old", created=T0 - 60)) is None, "made before the preemption"
    assert t.credit_for(pod("other", rs="rs-2", generate=None)) is None, "another controller"
    replacement = pod("web-6d9f7-bbbbb")
    assert t.credit_for(replacement) == credit
    t.use(replacement, credit)
    assert t.credit_for(pod("web-6d9f7-ccccc")) is None, "one credit, one replacement"


def test_a_victim_gone_before_it_was_read_is_matched_by_its_generated_name() -> None:
    clock = Clock()
    t = tracker(clock)
    t._add("name:ns/web-6d9f7-", Credit(victim="ns/web-6d9f7-aaaaa", at=T0))
    assert t.credit_for(pod("web-6d9f7-bbbbb", rs="rs-unknown")) is not None
    assert t.credit_for(pod("api-1234-bbbbb", rs="rs-unknown", generate="api-1234-")) is None


def test_credits_expire() -> None:
    clock = Clock()
    t = tracker(clock)
    t._add("rs-1", Credit(victim="ns/v", at=T0))
    clock.now = T0 + 601
    assert t.credit_for(pod("web-6d9f7-bbbbb")) is None
    t.prune()
    assert t.credits == {}


def test_old_preempted_events_from_a_relist_give_no_credit() -> None:
    clock = Clock()
    t = tracker(clock)
    t._on_event("ADDED", {"reason": "Preempted", "lastTimestamp": iso(T0 - 3600),
                          "involvedObject": {"kind": "Pod", "name": "v", "namespace": "ns",
                                             "uid": "u-1"}})
    assert t._tasks == set() and t._seen == set()

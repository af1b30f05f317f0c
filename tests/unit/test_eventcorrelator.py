"""The event correlator: dedup, aggregation and the spam filter (the kubelet's rules)."""

from __future__ import annotations

from vkprovider.kube.eventcorrelator import AGGREGATED_PREFIX, EventCorrelator


def correlator(now: list[float], *, burst: int = 25, refill_seconds: float = 300.0,
               aggregate_after: int = 10) -> EventCorrelator:
    return EventCorrelator(clock=lambda: now[0], burst=burst, refill_seconds=refill_seconds,
                           aggregate_after=aggregate_after)


def test_an_exact_repeat_bumps_the_count_of_one_event() -> None:
    now = [0.0]
    c = correlator(now)
    first = c.observe(uid="u", obj_name="p", type_="Warning", reason="NoCapacity", message="m")
    again = c.observe(uid="u", obj_name="p", type_="Warning", reason="NoCapacity", message="m")
    assert first is not None and again is not None
    assert first.new and not again.new
    assert again.name == first.name and again.count == 2
    other = c.observe(uid="v", obj_name="q", type_="Warning", reason="NoCapacity", message="m")
    assert other is not None and other.new and other.name != first.name, "another object"


def test_many_similar_messages_fold_into_one_combined_event() -> None:
    now = [0.0]
    c = correlator(now, aggregate_after=3)
    decisions = [c.observe(uid="u", obj_name="p", type_="Warning", reason="R", message=f"m{i}")
                 for i in range(6)]
    assert all(d is not None for d in decisions)
    assert [d.new for d in decisions if d] == [True, True, True, True, False, False]
    combined = [d for d in decisions[3:] if d]
    assert {d.name for d in combined} == {combined[0].name}, "one object for the rest"
    assert combined[-1].message == f"{AGGREGATED_PREFIX}m5" and combined[-1].count == 3
    now[0] = 601.0  # past the window: messages stand alone again
    fresh = c.observe(uid="u", obj_name="p", type_="Warning", reason="R", message="m9")
    assert fresh is not None and fresh.message == "m9"


def test_the_spam_filter_allows_a_burst_then_one_per_refill() -> None:
    now = [0.0]
    c = correlator(now, burst=5, refill_seconds=10.0)
    got = [c.observe(uid="u", obj_name="p", type_="Normal", reason="R", message="m")
           for _ in range(8)]
    assert sum(d is not None for d in got) == 5 and c.dropped == 3
    now[0] = 10.0
    assert c.observe(uid="u", obj_name="p", type_="Normal", reason="R", message="m") is not None
    assert c.observe(uid="u", obj_name="p", type_="Normal", reason="R", message="m") is None
    assert c.observe(uid="w", obj_name="x", type_="Normal", reason="R", message="m") is not None


def test_forget_makes_the_next_repeat_a_new_event() -> None:
    now = [0.0]
    c = correlator(now)
    first = c.observe(uid="u", obj_name="p", type_="Normal", reason="R", message="m")
    assert first is not None
    c.forget(first.key)
    again = c.observe(uid="u", obj_name="p", type_="Normal", reason="R", message="m")
    assert again is not None and again.new and again.count == 1


def test_a_repeated_message_counts_once_and_keeps_no_set() -> None:
    now = [0.0]
    c = correlator(now, aggregate_after=2)
    for _ in range(5):  # one message again and again: never "too many similar"
        d = c.observe(uid="u", obj_name="p", type_="Warning", reason="R", message="same")
        assert d is not None and not d.message.startswith(AGGREGATED_PREFIX)
    similar = c._similar[("u", "Warning", "R")]
    assert similar.more is None, "one distinct message needs no set"
    c.observe(uid="u", obj_name="p", type_="Warning", reason="R", message="other")
    third = c.observe(uid="u", obj_name="p", type_="Warning", reason="R", message="third")
    assert similar.more == {"same", "other", "third"}
    assert third is not None and third.message == f"{AGGREGATED_PREFIX}third"

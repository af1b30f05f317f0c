"""The spend book: counted from listings, never twice, resumed across restarts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from providers.base import Instance, InstanceState
from vkprovider.node.spend import BadRecord, Counted, SpendBook, decode, encode

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def inst(i: str, *, started: float | None, price: float = 3.6,
         state: InstanceState = InstanceState.RUNNING) -> Instance:
    return Instance(id=i, name=f"vk-{i}", provider="mock", state=state, price_per_hour=price,
                    started_at=None if started is None else at(started))


def test_counts_from_started_at_to_each_list_and_stops_when_the_instance_is_gone() -> None:
    book = SpendBook()
    # $3.60/h is $0.001/s
    assert book.observe(provider="a", instances=[inst("1", started=0)], at=at(10)) == \
        pytest.approx(0.010)
    assert book.observe(provider="a", instances=[inst("1", started=0)], at=at(15)) == \
        pytest.approx(0.005)
    assert book.observe(provider="a", instances=[], at=at(20)) == 0.0  # gone: closed
    assert book.dollars == {"a": pytest.approx(0.015)}


def test_an_instance_not_started_costs_nothing_and_a_failed_one_bills_until_released() -> None:
    book = SpendBook()
    book.observe(provider="a", instances=[inst("1", started=None, state=InstanceState.PENDING)],
                 at=at(10))
    assert book.dollars["a"] == 0.0
    book.observe(provider="a", instances=[inst("1", started=8)], at=at(12))
    assert book.dollars["a"] == pytest.approx(0.004)
    book.observe(provider="a", instances=[inst("1", started=8, state=InstanceState.FAILED)],
                 at=at(14))
    assert book.dollars["a"] == pytest.approx(0.006)


def test_a_list_older_than_the_last_one_counts_nothing_again() -> None:
    book = SpendBook()
    book.observe(provider="a", instances=[inst("1", started=0)], at=at(10))
    assert book.observe(provider="a", instances=[inst("1", started=0)], at=at(9)) == 0.0
    assert book.observe(provider="a", instances=[inst("1", started=0)], at=at(11)) == \
        pytest.approx(0.001)


def test_providers_are_counted_apart() -> None:
    book = SpendBook()
    book.observe(provider="a", instances=[inst("1", started=0)], at=at(10))
    book.observe(provider="b", instances=[inst("1", started=0, price=7.2)], at=at(10))
    assert book.dollars == {"a": pytest.approx(0.01), "b": pytest.approx(0.02)}


def test_a_resumed_book_continues_without_counting_twice_or_losing_a_running_instance() -> None:
    first = SpendBook()
    first.observe(provider="a", instances=[inst("1", started=0)], at=at(10))
    record = decode(encode(first.record()))  # persisted on the Node, read by the successor
    # the successor lists at 30 s: 10-30 s was never counted, 0-10 s was
    second = SpendBook(resumed=record)
    second.observe(provider="a", instances=[inst("1", started=0), inst("2", started=20)],
                   at=at(30))
    assert second.dollars["a"] == pytest.approx(0.030 + 0.010)


def test_record_round_trips_and_bad_records_name_what_is_wrong() -> None:
    rec = {"a": Counted(dollars=1.25, until=at(5))}
    assert decode(encode(rec)) == rec
    with pytest.raises(BadRecord, match="not JSON"):
        decode("{")
    with pytest.raises(BadRecord, match="unknown version 7"):
        decode('{"v": 7, "providers": {}}')
    with pytest.raises(BadRecord, match=r"providers\.a"):
        decode('{"v": 1, "providers": {"a": {"dollars": "x", "until": "2026-01-01T00:00:00Z"}}}')
    with pytest.raises(BadRecord, match="non-negative"):
        decode('{"v": 1, "providers": {"a": {"dollars": -1, "until": "2026-01-01T00:00Z"}}}')
    with pytest.raises(BadRecord, match="timezone-aware"):
        decode('{"v": 1, "providers": {"a": {"dollars": 1, "until": "2026-01-01T00:00"}}}')


def test_open_counts_the_instances_still_billing_and_is_persisted() -> None:
    book = SpendBook()
    book.observe(provider="a", instances=[inst("1", started=0), inst("2", started=None)],
                 at=at(1))
    assert book.record()["a"].open == 1
    assert decode(encode(book.record()))["a"].open == 1
    book.observe(provider="a", instances=[], at=at(2))
    assert book.record()["a"] == Counted(dollars=pytest.approx(0.001), until=at(2), open=0)

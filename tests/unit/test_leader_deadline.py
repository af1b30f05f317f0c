"""Leader election under a partition: every attempt is bounded by the renew deadline.

No cluster: two electors share an in-memory Lease (resourceVersion preconditions, like the API
server); each talks to it through its own link, which a test can cut so that every call hangs
(TCP open, nothing answers). Short real timings (a few hundred ms); the assertions are about
order (the old leader stepped down before the standby took over), not about speed.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any, cast

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import ConflictError, NotFoundError
from vkprovider.kube.leader import LeaderElector

RETRY = 0.05
RENEW = 0.3
LEASE = 0.6
GUARD = 10.0  # seconds: only so that a broken elector fails the test instead of hanging it

Body = dict[str, Any]


class LeaseStore:
    """One Lease, as the API server keeps it: create conflicts, patches need resourceVersion."""

    def __init__(self) -> None:
        self.lease: Body | None = None
        self.version = 0
        self.writes: list[tuple[float, str]] = []  # (monotonic time, holder) of each write

    def get(self) -> Body:
        if self.lease is None:
            raise NotFoundError("lease not found", status=404)
        return copy.deepcopy(self.lease)

    def create(self, body: Body) -> Body:
        if self.lease is not None:
            raise ConflictError("lease exists", status=409)
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        self._wrote()
        return copy.deepcopy(self.lease)

    def patch(self, body: Body) -> Body:
        current = self.get()
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise ConflictError("resourceVersion changed", status=409)
        spec = current.setdefault("spec", {})
        for key, value in (body.get("spec") or {}).items():
            if value is None:
                spec.pop(key, None)
            else:
                spec[key] = value
        self.version += 1
        current["metadata"]["resourceVersion"] = str(self.version)
        self.lease = current
        self._wrote()
        return copy.deepcopy(current)

    def holder(self) -> str | None:
        return None if self.lease is None else self.lease["spec"].get("holderIdentity")

    def _wrote(self) -> None:
        self.writes.append((time.monotonic(), str(self.holder())))


class Link:
    """One replica's connection to the store; ``cut()`` makes every call hang forever."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.partitioned = False
        self.hang_next = 0  # how many calls still to hang even when not partitioned
        self.calls = 0
        self.hanging = 0

    def cut(self) -> None:
        self.partitioned = True

    async def _gate(self) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        if self.partitioned or self.hang_next > 0:
            self.hang_next = max(0, self.hang_next - 1)
            self.hanging += 1
            await asyncio.Event().wait()  # never set: no answer, no error

    async def get(self, path: str, **_: Any) -> Body:
        await self._gate()
        return self.store.get()

    async def create(self, path: str, body: Body) -> Body:
        await self._gate()
        return self.store.create(body)

    async def patch(self, path: str, body: Body, **_: Any) -> Body:
        await self._gate()
        return self.store.patch(body)


def elector(link: Link, identity: str) -> LeaderElector:
    return LeaderElector(client=cast(KubeClient, link), namespace="ns", name="lease",
                         identity=identity, lease_duration=LEASE, renew_deadline=RENEW,
                         retry_period=RETRY)


async def test_a_partitioned_leader_steps_down_before_the_standby_takes_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="vkprovider.kube.leader")
    store = LeaseStore()
    link_a, link_b = Link(store), Link(store)
    a, b = elector(link_a, "a"), elector(link_b, "b")
    timeline: list[str] = []
    a_lost_seen_by_b: list[bool] = []
    b_took_over = asyncio.Event()

    async def standby(lost_a: asyncio.Event) -> None:
        async with b.leading():
            timeline.append("b leads")
            a_lost_seen_by_b.append(lost_a.is_set() and not a.is_leader)
            b_took_over.set()

    async with asyncio.timeout(GUARD):
        async with a.leading() as lost_a:
            timeline.append("a leads")
            b_task = asyncio.create_task(standby(lost_a))
            await asyncio.sleep(3 * RETRY)  # a renews a few times; b stands by
            assert store.holder() == "a" and not b_took_over.is_set()
            renewals = len(store.writes)
            link_a.cut()  # a's renewals now hang: TCP open, nothing answers
            cut_at = time.monotonic()
            await asyncio.wait({asyncio.create_task(lost_a.wait()), b_task},
                               return_when=asyncio.FIRST_COMPLETED)
            timeline.append("a lost" if lost_a.is_set() else "a still leading")
            assert lost_a.is_set(), f"b took over while a still leads: {timeline}"
            assert not a.is_leader
            lost_after = time.monotonic() - cut_at
            calls_at_loss = link_a.calls
        assert not b_took_over.is_set(), "a left its context only after b took over"
        assert link_a.calls == calls_at_loss, "a lost leader asked the API server on its way out"
        await b_task

    assert timeline == ["a leads", "a lost", "b leads"], timeline
    assert a_lost_seen_by_b == [True]
    assert [who for _, who in store.writes][renewals:] == ["b", "None"]  # took over, released
    assert renewals >= 2, "a renewed before the cut"
    assert link_a.hanging >= 1, "a's renewal really hung"
    # a's last write happened before the cut; nobody may hold the Lease until LEASE after it,
    # and a stepped down before that (the order, not a speed: RENEW < LEASE).
    last_a_write = max(t for t, who in store.writes if who == "a")
    first_b_write = min(t for t, who in store.writes if who == "b")
    assert cut_at + lost_after < first_b_write
    assert first_b_write - last_a_write >= LEASE
    messages = [r.getMessage() for r in caplog.records]
    assert "leadership lost" in messages and "stopped leading" in messages


async def test_a_hung_renewal_sets_lost_even_with_no_standby() -> None:
    store = LeaseStore()
    link = Link(store)
    a = elector(link, "a")
    async with asyncio.timeout(GUARD):
        async with a.leading() as lost:
            assert a.is_leader
            link.cut()
            waiter = asyncio.create_task(lost.wait())
            # The renewal hangs forever; only its deadline can end the wait.
            done, _ = await asyncio.wait({waiter}, timeout=GUARD / 2)
            assert waiter in done, "the leader never noticed it could not renew"
            assert not a.is_leader
    assert store.holder() == "a"  # the partitioned leader could not release; the Lease expires


async def test_a_lost_leader_leaves_at_once_without_a_word_to_the_api_server() -> None:
    """After a loss, leaving ``leading()`` makes no request (no release over the link that just
    failed, which would hang until its own deadline), even when the link answers again."""
    store = LeaseStore()
    link = Link(store)
    a = elector(link, "a")
    async with asyncio.timeout(GUARD):
        async with a.leading() as lost:
            link.cut()
            await lost.wait()
            calls = link.calls
            link.partitioned = False  # even an answering link is not used
        assert link.calls == calls
    assert store.holder() == "a"  # not released: the Lease expires, as a crash would leave it


async def test_a_hung_acquire_attempt_does_not_block_the_election() -> None:
    store = LeaseStore()
    link = Link(store)
    link.hang_next = 1  # the very first GET never answers
    a = elector(link, "a")
    async with asyncio.timeout(GUARD):
        acquiring = asyncio.create_task(_lead_once(a))
        try:
            done, _ = await asyncio.wait({acquiring}, timeout=GUARD / 2)
            assert acquiring in done, "the elector is stuck on its first (hung) attempt"
            acquiring.result()
        finally:
            acquiring.cancel()
    assert link.hanging == 1 and link.calls >= 3
    assert store.holder() is None  # released on a clean exit
    assert [who for _, who in store.writes] == ["a", "None"]


async def _lead_once(e: LeaderElector) -> None:
    async with e.leading():
        assert e.is_leader


async def test_a_clean_stop_releases_and_the_standby_takes_over_at_once() -> None:
    store = LeaseStore()
    a, b = elector(Link(store), "a"), elector(Link(store), "b")
    async with asyncio.timeout(GUARD):
        async with a.leading() as lost:
            standby = asyncio.create_task(_lead_once(b))
            await asyncio.sleep(3 * RETRY)
            assert not standby.done()
        assert not lost.is_set()
        await standby
    holders = [who for _, who in store.writes]
    assert holders[0] == "a" and "b" in holders
    assert holders.index("b") > holders.index("None")  # after a's release, not a takeover

"""The keyed work queue: dedup, one worker per key, backoff, never dropping a key."""

from __future__ import annotations

import asyncio

import pytest

from vkprovider.node.workqueue import ShutDown, WorkQueue


async def test_a_key_added_many_times_is_processed_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert await q.get() == "a"
    assert await q.get() == "b"
    assert len(q) == 0


async def test_a_key_changed_while_processing_runs_again_after_done_not_concurrently() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")  # changed while a worker holds it
    assert len(q) == 0, "must not be handed to a second worker"
    q.done(key)
    assert len(q) == 1
    assert await q.get() == "a"


async def test_backoff_grows_and_is_capped_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.05)
    delays = [q.add_rate_limited("a") for _ in range(6)]
    assert delays[:3] == [0.01, 0.02, 0.04]
    assert max(delays) == 0.05
    assert q.failures("a") == 6
    q.forget("a")
    assert q.failures("a") == 0
    assert q.add_rate_limited("a") == 0.01


async def test_a_failing_key_is_retried_forever() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.001, max_delay=0.002)
    for _ in range(50):  # client-go would forget it after 15-20 tries
        q.add_rate_limited("a")
        key = await asyncio.wait_for(q.get(), timeout=1)
        assert key == "a"
        q.done(key)


async def test_add_after_keeps_the_earliest_schedule() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("a", 10)
    q.add_after("a", 0.01)
    q.add_after("a", 5)  # later than the pending one: ignored
    assert await asyncio.wait_for(q.get(), timeout=1) == "a"
    assert q.waiting == 0


async def test_add_now_cancels_a_pending_delay() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("a", 10)
    q.add("a")
    assert await asyncio.wait_for(q.get(), timeout=1) == "a"
    assert q.waiting == 0


async def test_waiting_workers_wake_one_per_key_and_stop_on_shutdown() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str] = []

    async def worker() -> None:
        try:
            while True:
                key = await q.get()
                got.append(key)
                q.done(key)
        except ShutDown:
            return

    workers = [asyncio.create_task(worker()) for _ in range(3)]
    await asyncio.sleep(0)
    for k in "abc":
        q.add(k)
    await asyncio.sleep(0.01)
    assert sorted(got) == ["a", "b", "c"]
    await q.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), timeout=1)


async def test_remove_drops_timers_and_failures() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_rate_limited("a")
    q.remove("a")
    assert q.waiting == 0 and q.failures("a") == 0
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(q.get(), timeout=0.05)


async def test_a_nudge_never_cancels_a_backoff() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_rate_limited("a", at_least=10)
    q.nudge("a")  # the periodic sweep: the pod still backs off
    assert len(q) == 0 and q.backing_off("a")
    q.nudge("b")  # nothing pending: queued at once
    assert await asyncio.wait_for(q.get(), timeout=1) == "b"

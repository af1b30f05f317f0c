"""A keyed work queue: dedup by key, per-key exponential backoff, never drops a key.

Why it exists: reconciles are level-triggered, so a key queued ten times while waiting needs one
reconcile, and a key being processed when it changes must run again afterwards (never two workers
on one pod at once). Failing keys back off exponentially up to a cap and are retried forever:
client-go's "forget after N retries" is what left Virtual Kubelet pods stuck in ProviderFailed.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """The queue was shut down; workers should return."""


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.05, max_delay: float = 60.0) -> None:
        self._base = base_delay
        self._max = max_delay
        self._queue: collections.deque[K] = collections.deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # changed while processing: requeue on done()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._shutdown = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def waiting(self) -> int:
        """Keys scheduled for later (backoff or requeue-after)."""
        return len(self._timers)

    def add(self, key: K) -> None:
        if self._shutdown:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)
        self._wake()

    def nudge(self, key: K) -> None:
        """Queue ``key`` now unless it is backing off: a periodic resync must not cancel a
        backoff (a pod retried every sweep would ignore its growing delay and a cloud's
        Retry-After). An event about the key itself uses :meth:`add`."""
        if key in self._timers:
            return
        self.add(key)

    def backing_off(self, key: K) -> bool:
        return key in self._timers

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` in ``delay`` seconds; an earlier schedule wins over a later one."""
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= when:
                return
            current[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key))

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K, *, at_least: float = 0.0) -> float:
        """Back off ``key``: base * 2**failures, capped; returns the delay chosen."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = float(max(at_least, min(self._max, self._base * (2 ** min(failures, 30)))))
        self.add_after(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (after a success)."""
        self._failures.pop(key, None)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def get(self) -> K:
        while not self._queue:
            if self._shutdown:
                raise ShutDown
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the wake-up on to another worker
                raise
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def remove(self, key: K) -> None:
        """Drop every trace of ``key`` (its object is gone for good)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self._failures.pop(key, None)

    async def shutdown(self) -> None:
        self._shutdown = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

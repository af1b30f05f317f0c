"""Polling helpers for tests: wait until a condition holds, with a deadline and a clear failure.

Why it exists: e2e tests observe a distributed system; they must wait for convergence without
fixed sleeps, and when it does not come, say what was last seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class NotConverged(AssertionError):
    """The condition did not hold before the deadline."""


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    until: Callable[[T], bool] = bool,
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Call ``probe`` until ``until(result)`` is true; return that result or raise NotConverged."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = await probe()
        if until(last):
            return last
        if time.monotonic() > deadline:
            raise NotConverged(f"{what} not reached in {timeout}s; last seen: {last!r}"[:2000])
        await asyncio.sleep(interval)


class Sampler:
    """A background loop that samples something every ``interval`` seconds while a test runs
    (the fewest ready replicas, what was seen before some event): subclasses say what one
    :meth:`sample` does; :meth:`start` and :meth:`stop` run it on the current event loop."""

    interval = 0.2

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> None:
        raise NotImplementedError

    async def _loop(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Cancel the loop (idempotent); an error a sample raised is raised here."""
        if self._task is None:
            return
        task, self._task = self._task, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""The lists of a sweep: every provider at once, each under its own deadline, none under a lock.

Why it exists: a sweep lists every provider to learn what its instances do. Listed one after
another while the sweep held ``providers_lock``, one black-holed cloud (an adapter retries a
hanging list four times, 10-15 s each) froze the status of every pod on every other cloud,
orphan collection, spend records and provider changes for a minute or more.

Here each provider's list is its own task, started by a sweep and left running across sweeps
when it is slow: a sweep starts the lists that are not already running, waits at most ``wait``
seconds for those it started, and hands back every list that has finished since (each once).
A provider whose list is still out is "not listed" for that sweep (nothing is created on it,
its instances keep their last status), exactly as when its list fails. A list that runs past
``deadline`` is cancelled and counts as failed. No call here holds ``providers_lock``: the
caller applies the results under it afterwards, to the providers still served then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from providers.base import Instance, Provider, ProviderError

__all__ = ["LIST_DEADLINE_SECONDS", "ListResult", "Lister"]

#: A list that has not answered in this long is given up (the adapters' own retries of a
#: hanging list end sooner against any cloud that answers at all).
LIST_DEADLINE_SECONDS = 90.0


@dataclass(frozen=True, kw_only=True)
class ListResult:
    """One provider's list: when it started (monotonic and wall) and what it said."""

    name: str  # the name the provider was served under when the list started
    provider: Provider
    started: float  # clock() right before the call: everything created later may be missing
    started_wall: datetime  # the same moment on the wall clock (spend records)
    instances: list[Instance] | None  # None: the list failed
    error: ProviderError | None = None


class Lister:
    """Per-provider list tasks; see the module docstring."""

    def __init__(self, *, clock: Callable[[], float], wait: float,
                 deadline: float = LIST_DEADLINE_SECONDS) -> None:
        self._clock = clock
        self.wait = wait
        self.deadline = deadline
        self._running: dict[int, asyncio.Task[ListResult]] = {}  # id(provider) -> its list

    def in_flight(self) -> int:
        return len(self._running)

    async def round(self, providers: Sequence[tuple[str, Provider]]) -> list[ListResult]:
        """Start a list of each provider not being listed; wait up to ``wait`` seconds for
        those (not for lists left running by earlier rounds); return every finished one."""
        started: list[asyncio.Task[ListResult]] = []
        for name, provider in providers:
            if id(provider) not in self._running:
                task = asyncio.create_task(self._list(name, provider), name=f"list-{name}")
                self._running[id(provider)] = task
                started.append(task)
        if started:
            await asyncio.wait(started, timeout=self.wait)
        done: list[ListResult] = []
        for key, task in list(self._running.items()):
            if task.done():
                del self._running[key]
                done.append(task.result())
        return done

    async def _list(self, name: str, provider: Provider) -> ListResult:
        started, wall = self._clock(), datetime.now(UTC)
        try:
            async with asyncio.timeout(self.deadline):
                instances = await provider.list()
        except ProviderError as exc:
            return ListResult(name=name, provider=provider, started=started, started_wall=wall,
                              instances=None, error=exc)
        except TimeoutError:
            return ListResult(name=name, provider=provider, started=started, started_wall=wall,
                              instances=None, error=ProviderError(
                                  f"list gave no answer in {self.deadline:g}s", provider=name))
        return ListResult(name=name, provider=provider, started=started, started_wall=wall,
                          instances=instances)

    async def aclose(self) -> None:
        tasks = list(self._running.values())
        self._running.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

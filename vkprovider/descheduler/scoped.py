"""Tasks that live only as long as the loop that started them: nothing writes after leadership.

Why it exists: a move-back or a hot-swap runs in a task of its own (several run at once, and a
pass must not wait for them), started by its loop. A task started with ``loop.create_task``
outlives the loop: when the companion loses its leader Lease the loops are cancelled, but such a
move would go on surging and scaling back a Deployment that the new leader is already finishing
(two writers of one intent). A loop keeps its tasks in a :class:`TaskScope` and closes it when
it ends, so cancelling the loop (what the companion does on losing the Lease) cancels every task
it started: none makes a request after that. What a cancelled move leaves behind is its intent
annotation, which the next leader finishes (docs/moveback.md, restart safety).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["TaskScope"]


class TaskScope:
    """The tasks a loop started; :meth:`close` cancels every one that is still running."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every running task (synchronously, before the first await: a second
        cancellation of the caller cannot leave one running) and wait until they ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

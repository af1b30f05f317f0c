"""What ``/healthz`` says about one of the companion's loops, written once.

Why it exists: admission, move-back and pre-warm each report the same three states (watches not
synced, not started, no pass for too long); one function keeps their wording and rules alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

__all__ = ["loop_problem"]


class _Synced(Protocol):
    name: str
    synced: asyncio.Event


def loop_problem(*, loop: str, informers: Iterable[_Synced], beat: float | None, now: float,
                 stale_after: float) -> str | None:
    """Why ``loop`` is not healthy, or None: every watch has synced and the loop showed life
    (``beat``, on the ``time.monotonic`` clock) within ``stale_after`` seconds of ``now``."""
    unsynced = [i.name for i in informers if not i.synced.is_set()]
    if unsynced:
        return f"{loop}: informers not synced: {', '.join(unsynced)}"
    if beat is None:
        return f"{loop}: starting"
    if now - beat > stale_after:
        return f"{loop}: no pass for {now - beat:.0f}s"
    return None

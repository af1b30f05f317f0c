"""A test hook: stop the companion dead right after its k-th write of a move-back or a pre-warm.

Why it exists: the companion promises that a crash between any two of its writes loses nothing
(every move is finished or rolled back by the next process, every pre-warm carried on or undone
with its outcome written to the AdmissionCheck). Killing it from outside at a given
moment is a race; this hook makes the moment exact. With ``VKP_CRASH_AFTER_WRITE=k`` in its
environment, the process calls :func:`os._exit` with status 137 (as after SIGKILL: no cleanup,
no ``finally``) right after the k-th write that a :func:`crash_point` follows, counting from 1
across the process. With a write's name instead (``VKP_CRASH_AFTER_WRITE="pre-warm: check
Ready"``), it exits right after the first write of that name: a sequence whose count varies (an
idempotent write repeated while a watch cache lags) still stops at the same step. Unset (always,
outside tests), :func:`crash_point` does nothing. The variable is read here and nowhere else.
"""

from __future__ import annotations

import logging
import os
import sys

from vkprovider.logs import kv

log = logging.getLogger(__name__)

ENV = "VKP_CRASH_AFTER_WRITE"
EXIT_STATUS = 137  # what a shell reports for SIGKILL


def _limit(text: str | None) -> tuple[int, str]:
    """(k, name) from the variable: a count, or a write's name (k 0), or neither."""
    text = (text or "").strip()
    try:
        return int(text or 0), ""
    except ValueError:
        return 0, text


_after, _name = _limit(os.environ.get(ENV))
_count = 0


def crash_point(what: str) -> None:
    """Mark that a write (``what``) just succeeded; exit dead if it is the one to crash after."""
    global _count
    if _after <= 0 and not _name:
        return
    _count += 1
    if _count == _after or what == _name:
        log.warning("crash point reached: exiting as if killed", extra=kv(write=_count, what=what))
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_STATUS)

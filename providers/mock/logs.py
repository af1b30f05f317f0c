"""What a mock instance's container has printed: its log, computed on demand from the record.

Why it exists: ``GET /instances/{id}/logs`` (tail, since, follow, timestamps) must be cheap on
an instance that has run for a week; the lines are derived from the record's timestamps here
instead of being stored, and the HTTP app only streams them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from providers.mock.records import Phase, Record

__all__ = ["LogLine", "LogView", "format_line"]

@dataclass(frozen=True)
class LogLine:
    at: float
    text: str


class LogView:
    """The lines a record's container has printed by ``now``, indexable without building them.

    Heartbeats are computed on demand so that ``tail_lines`` on a week-old instance is cheap.
    Lines only ever get appended, so an index into one view is valid in every later view.
    """

    def __init__(self, record: Record, *, now: float) -> None:
        r = record
        self._prefix = [LogLine(r.created, f"[mock] pulling image {r.image}")]
        self._started = r.started
        self._heartbeats = 0
        if r.started is not None:
            self._prefix.append(
                LogLine(
                    r.started,
                    f"[mock] started {r.name}: image={r.image} gpus={r.gpu_count}x{r.gpu_type} "
                    f"env_vars={r.env_count}",
                )
            )
            end = min(t for t in (now, r.finished, r.deleting) if t is not None)
            self._heartbeats = max(0, math.floor(end - r.started + 1e-9))
        self._suffix: list[LogLine] = []
        if r.finished is not None:
            if r.phase is Phase.FAILED:
                self._suffix.append(LogLine(r.finished, f"[mock] failed: {r.message}"))
            else:
                self._suffix.append(LogLine(r.finished, f"[mock] exited with code {r.exit_code}"))
        if r.deleting is not None:
            self._suffix.append(LogLine(r.deleting, "[mock] received SIGTERM: deleting"))

    def __len__(self) -> int:
        return len(self._prefix) + self._heartbeats + len(self._suffix)

    def __getitem__(self, index: int) -> LogLine:
        if index < len(self._prefix):
            return self._prefix[index]
        index -= len(self._prefix)
        if index < self._heartbeats:
            assert self._started is not None
            beat = index + 1
            return LogLine(self._started + beat, f"[mock] heartbeat {beat}")
        return self._suffix[index - self._heartbeats]

    def first_at_or_after(self, at: float) -> int:
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if self[mid].at < at:
                lo = mid + 1
            else:
                hi = mid
        return lo



def format_line(line: LogLine, *, timestamps: bool, wall: Callable[[float], datetime]) -> bytes:
    """One line as the kubelet sends it: with an RFC 3339 timestamp (``wall`` of its instant)
    when ``timestamps``."""
    if not timestamps:
        return f"{line.text}\n".encode()
    at = wall(line.at)
    stamp = f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond:06d}000Z"
    return f"{stamp} {line.text}\n".encode()

"""Per-object back-off: one object whose API calls fail is retried later, alone.

Why it exists: a loop that reconciles many objects in one pass (pre-warm's Workloads) used to
abort the whole pass on the first API error, so one broken object (a webhook refusing its writes,
a permission missing in one namespace) starved every other one. Each object now fails on its
own, and is looked at again after a delay that doubles with each consecutive failure (capped);
a success forgets it. Pure: the caller passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays per key: ``base`` seconds after the first failure, doubling, at most ``cap``."""

    base: float = 1.0
    cap: float = 60.0
    _failures: dict[str, int] = field(default_factory=dict)
    _until: dict[str, float] = field(default_factory=dict)

    def ready(self, key: str, *, now: float) -> bool:
        """Whether ``key`` may be tried now (never failed, or its delay has passed)."""
        return now >= self._until.get(key, 0.0)

    def failed(self, key: str, *, now: float) -> float:
        """Record a failure; the delay before ``key`` is tried again."""
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        delay = min(self.cap, self.base * 2.0 ** min(count - 1, 30))
        self._until[key] = now + delay
        return delay

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)
        self._until.pop(key, None)

    def keep(self, keys: set[str]) -> None:
        """Forget keys no longer live (bounded memory)."""
        for key in [k for k in self._failures if k not in keys]:
            self.succeeded(key)

"""What a GPUProvider's ``status`` says, computed without I/O.

Why it exists: ``kubectl get gpup`` is where a platform team sees whether an account works, what
it costs now and what is being skipped. The figures come from what this virtual node saw: the
outcome of its last cloud calls (health), its blocked offers, and its last sweep (instances and
$/h). Keeping the computation pure lets unit tests pin the rules, and lets the writer compare
the desired status with the one stored, so it patches only on change.

Health rules (from the results of list, capacity, create and delete calls):

* ``AuthFailed``: the last auth-relevant answer was an :class:`~providers.base.AuthError`
  (the key is rejected); any later success clears it;
* ``Unreachable``: ``unreachable_after`` transient failures (timeouts, connection errors, 5xx,
  after the adapter's own retries) in a row, no success since;
* ``Degraded``: a transient failure, a rate limit or a quota error within ``window`` seconds;
* ``Healthy``: otherwise. No call made yet: no ``health`` at all (``Ready=Unknown``).

Capacity errors, invalid specs and not-found answers say nothing about the account's health.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from providers.base import (
    AuthError,
    CapacityError,
    InvalidSpec,
    NotFound,
    ProviderError,
    TransientError,
    Unsupported,
)
from vkprovider.placement import policy as pol
from vkprovider.placement.blocks import Block
from vkprovider.semantics.timefmt import format_time

HEALTHY, DEGRADED, UNREACHABLE, AUTH_FAILED = pol.HEALTH_VALUES
MAX_BLOCKED_OFFERS = 100  # the CRD's maxItems

_NOT_HEALTH = (CapacityError, InvalidSpec, NotFound, Unsupported)


class HealthTracker:
    """Folds call outcomes of one account into a health value."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, window: float = 60.0,
                 unreachable_after: int = 3) -> None:
        self._clock = clock
        self._window = window
        self._unreachable_after = unreachable_after
        self._auth_failed = False
        self._streak = 0
        self._failures: deque[float] = deque(maxlen=64)
        self._seen = False

    def record(self, *, error: BaseException | None) -> None:
        if error is None:
            self._seen = True
            self._auth_failed = False
            self._streak = 0
            return
        if isinstance(error, _NOT_HEALTH) or not isinstance(error, ProviderError):
            return
        self._seen = True
        if isinstance(error, AuthError):
            self._auth_failed = True
            return
        self._failures.append(self._clock())
        if isinstance(error, TransientError):
            self._streak += 1

    def health(self) -> str | None:
        if not self._seen:
            return None
        if self._auth_failed:
            return AUTH_FAILED
        if self._streak >= self._unreachable_after:
            return UNREACHABLE
        now = self._clock()
        if any(now - t < self._window for t in self._failures):
            return DEGRADED
        return HEALTHY


def blocked_offers(blocks: Iterable[Block], *, provider: str, wall_offset: float
                   ) -> list[dict[str, str]]:
    """``status.blockedOffers`` for one account; ``wall_offset`` = wall time - block clock."""
    out = []
    for block in sorted((b for b in blocks if b.provider == provider),
                        key=lambda b: (b.until, b.region or "", b.gpu_type or "")):
        until = datetime.fromtimestamp(int(block.until + wall_offset), UTC)
        out.append({"region": block.region or "", "gpuType": block.gpu_type or "",
                    "reason": block.reason, "until": format_time(until)})
    return out[:MAX_BLOCKED_OFFERS]


def ready_condition(*, valid: bool, health: str | None, generation: int) -> dict[str, Any]:
    if not valid:
        status, reason, message = "False", "Invalid", "the object is not valid (see Valid)"
    elif health is None:
        status, reason, message = "Unknown", "NotContacted", "the cloud has not been called yet"
    elif health == AUTH_FAILED:
        status, reason, message = ("False", AUTH_FAILED,
                                   "the cloud rejects the API key; fix the credentials Secret")
    elif health == UNREACHABLE:
        status, reason, message = "False", UNREACHABLE, "the cloud does not answer"
    else:
        status, reason, message = "True", health, f"the cloud answers ({health})"
    return {"type": pol.CONDITION_READY, "status": status, "reason": reason,
            "message": message, "observedGeneration": generation}


def with_transition_times(conditions: Sequence[Mapping[str, Any]],
                          old: Sequence[Mapping[str, Any]], *, now: datetime
                          ) -> list[dict[str, Any]]:
    """Add ``lastTransitionTime``: kept from ``old`` when the condition's status is unchanged."""
    before = {c.get("type"): c for c in old if isinstance(c, Mapping)}
    out = []
    for cond in conditions:
        prev = before.get(cond["type"])
        keep = prev is not None and prev.get("status") == cond["status"] and prev.get(
            "lastTransitionTime")
        out.append({**cond, "lastTransitionTime": prev["lastTransitionTime"] if keep and prev
                    else format_time(now)})
    return out


def build_status(
    *,
    generation: int,
    problems: Sequence[pol.Problem],
    health: str | None,
    running_instances: int,
    price_per_hour: float,
    blocked: list[dict[str, str]],
    old: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    """The ``status`` to write (``old`` is the stored status, for transition times)."""
    valid = not problems
    conditions = [pol.valid_condition(problems, observed_generation=generation),
                  ready_condition(valid=valid, health=health, generation=generation)]
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": with_transition_times(conditions, old.get("conditions") or [], now=now),
        "runningInstances": running_instances,
        "currentPricePerHour": round(price_per_hour, 4),
        "blockedOffers": blocked,
    }
    if health is not None:
        status["health"] = health
    return status


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True if writing ``new`` would change any field of ``old`` that we own."""
    for key, value in new.items():
        current = old.get(key)
        if key == "currentPricePerHour":
            if current is None or abs(float(current) - float(value)) > 1e-6:
                return True
            continue
        if key == "blockedOffers" and not value and not current:
            continue
        if current != value:
            return True
    return False

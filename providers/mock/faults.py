"""Scripted faults of the mock cloud: which endpoints can fail, and the plan of failures to come.

Why it exists: tests script the cloud's failures ("the next two creates answer 429") through
``/admin/faults`` or :attr:`MockCloudState.faults <providers.mock.state.MockCloudState.faults>`;
this module is that plan, consumed request by request. The random faults of a scenario live in
:mod:`providers.mock.scenario` and act in :mod:`providers.mock.state`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from providers.mock.errors import FAULT_CODES, MockCloudError

__all__ = ["ENDPOINTS", "INJECTED_KINDS", "Fault", "FaultPlan"]

#: The endpoints that are counted and can be given faults (admin endpoints are neither).
ENDPOINTS: tuple[str, ...] = (
    "create", "list", "get", "delete", "logs", "metrics", "capacity", "restart",
)

#: The scenario faults counted in ``stats()`` as ``injected_<kind>``.
INJECTED_KINDS = (
    "errors",
    "hangs",
    "rate_limited",
    "lost_creates",
    "capacity_refusals",
    "crashes",
    "slow_deletes",
    "failed_deletes",
    "vanished",
)


@dataclass(kw_only=True)
class Fault:
    """The next ``remaining`` requests to ``endpoint`` answer ``status``."""

    endpoint: str
    status: int
    remaining: int
    retry_after: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "status": self.status,
            "remaining": self.remaining,
            "retry_after": self.retry_after,
        }


class FaultPlan:
    """Scripted failures, consumed in the order they were added."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self.injected = 0

    def add(
        self, *, endpoint: str, status: int, count: int = 1, retry_after: float | None = None
    ) -> None:
        if endpoint != "*" and endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; one of {', '.join(ENDPOINTS)}, *")
        if not 400 <= status <= 599:
            raise ValueError("a fault's status must be 4xx or 5xx")
        if count < 1:
            raise ValueError("a fault's count must be at least 1")
        if retry_after is not None and retry_after < 0:
            raise ValueError("retry_after cannot be negative")
        self._faults.append(
            Fault(endpoint=endpoint, status=status, remaining=count, retry_after=retry_after)
        )

    def clear(self) -> None:
        self._faults.clear()

    def pending(self) -> list[Fault]:
        return list(self._faults)

    def take(self, *, endpoint: str) -> MockCloudError | None:
        """The error the next request to ``endpoint`` must get, if a fault is armed for it."""
        for fault in self._faults:
            if fault.endpoint in ("*", endpoint):
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
                self.injected += 1
                return MockCloudError(
                    status=fault.status,
                    code=FAULT_CODES.get(fault.status, "injected"),
                    message=f"injected fault on {endpoint}",
                    retry_after=fault.retry_after,
                )
        return None

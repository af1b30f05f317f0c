"""The mock cloud's API errors, and how a validation error is told without echoing input.

Why it exists: every layer of the mock cloud (state, faults, HTTP app) fails the same way, with
an error that becomes ``{"error": {"code", "message"}}`` and a status; keeping that type apart
lets each layer raise it without importing the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["FAULT_CODES", "LostResponse", "MockCloudError", "describe_errors", "not_found"]


class MockCloudError(Exception):
    """An API error: becomes ``{"error": {"code", "message"}}`` with ``status``."""

    def __init__(
        self, *, status: int, code: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


class LostResponse(MockCloudError):
    """The duplicate trap fired: the instance was created but its answer is lost (``mode``)."""

    def __init__(self, *, mode: str) -> None:
        super().__init__(
            status=504, code="timeout", message="gateway timeout while creating the instance"
        )
        self.mode = mode


def not_found(instance_id: str) -> MockCloudError:
    return MockCloudError(status=404, code="not_found", message=f"instance {instance_id} not found")


#: The error code an injected status answers with.
FAULT_CODES = {
    401: "unauthorized",
    402: "quota_exceeded",
    403: "forbidden",
    404: "not_found",
    409: "capacity_unavailable",
    429: "rate_limited",
    500: "internal",
    502: "bad_gateway",
    503: "unavailable",
    504: "timeout",
}


def describe_errors(errors: Iterable[Mapping[str, Any]]) -> str:
    """Say what is wrong by location only: pydantic's default echoes the input (maybe a secret)."""
    problems = []
    for err in errors:
        loc = ".".join(str(part) for part in err.get("loc", ()) if part != "body")
        problems.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"

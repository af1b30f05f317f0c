"""API server errors as our own classes, chosen by HTTP status.

Why it exists: callers branch on ``NotFoundError``/``ConflictError``/``GoneError`` rather than on
status codes, and a 429/503's ``Retry-After`` travels with the error to whoever backs off.
"""

from __future__ import annotations

from typing import Any

from vkprovider.errors import VKError


class APIError(VKError):
    """A request to the API server failed. ``status`` is 0 when no response arrived."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        retry_after: float | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        self.body = body or {}


class ConnectionFailed(APIError):
    """No response: connection refused, reset or timed out."""


class BadRequestError(APIError):
    """400: the request itself is wrong."""


class UnauthorizedError(APIError):
    """401: credentials missing or rejected."""


class ForbiddenError(APIError):
    """403: RBAC denies it."""


class NotFoundError(APIError):
    """404."""


class ConflictError(APIError):
    """409: already exists, or a precondition (UID, resourceVersion) failed."""


class GoneError(APIError):
    """410: the resourceVersion is too old; the caller must list again."""


class InvalidError(APIError):
    """422: the object failed validation; the message names the field."""


class TooManyRequestsError(APIError):
    """429: back off for ``retry_after`` seconds."""


class ServerError(APIError):
    """5xx."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    422: InvalidError,
    429: TooManyRequestsError,
}


def error_for(
    *, status: int, body: dict[str, Any] | None, retry_after: float | None, what: str
) -> APIError:
    """Build the error for a failed response; ``what`` says which request it was."""
    body = body or {}
    message = str(body.get("message") or f"HTTP {status}")
    reason = str(body.get("reason") or "")
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    return cls(
        f"{what}: {message}", status=status, reason=reason, retry_after=retry_after, body=body
    )


class InactivityTimeout(ConnectionFailed):
    """A stream delivered nothing for longer than its read timeout."""

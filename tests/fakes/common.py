"""Helpers the adapters' contract tests share: failing transports, teardown, the no-leak check.

Why it exists: every adapter is held to the same edge contract (transport failures become
TransientError, every provider a test makes is closed, the API key never shows in an error,
its cause or a repr); one copy of the helpers keeps those checks the same for every cloud.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import httpx

#: The clouds' published OpenAPI specs, vendored unmodified (provenance: tests/specs/README.md).
VENDORED_SPECS = Path(__file__).resolve().parents[1] / "specs"


def specs_dir() -> Path:
    """``$VKP_SPECS_DIR`` when set (to test against a newer spec), else the vendored copies."""
    env = os.environ.get("VKP_SPECS_DIR")
    return Path(env) if env else VENDORED_SPECS


class _Closable(Protocol):
    async def aclose(self) -> None: ...


_P = TypeVar("_P", bound=_Closable)


#: Transport failures (every kind the adapters tell apart) and what their TransientError says.
TRANSPORT_FAILURES: list[tuple[type[httpx.TransportError], str]] = [
    (httpx.ConnectError, "could not connect"),
    (httpx.ConnectTimeout, "timed out"),
    (httpx.ReadTimeout, "timed out"),
    (httpx.ReadError, "lost the connection"),
    (httpx.RemoteProtocolError, "lost the connection"),
]


class FailingTransport(httpx.AsyncBaseTransport):
    """Raises ``error`` for the first ``failures`` requests (all when None), then delegates.

    ``message`` is formatted with the request's ``url``; ``calls`` counts every request seen.
    """

    def __init__(
        self,
        error: type[httpx.TransportError],
        *,
        failures: int | None = None,
        inner: httpx.AsyncBaseTransport | None = None,
        message: str = "down",
    ) -> None:
        self.error = error
        self.failures = failures
        self.inner = inner
        self.message = message
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.inner is None or self.failures is None or self.calls <= self.failures:
            raise self.error(self.message.format(url=request.url), request=request)
        return await self.inner.handle_async_request(request)


class Providers(Generic[_P]):
    """The providers a fixture made, all closed by :meth:`aclose` at teardown."""

    def __init__(self) -> None:
        self.made: list[_P] = []

    def keep(self, provider: _P) -> _P:
        self.made.append(provider)
        return provider

    async def aclose(self) -> None:
        for provider in self.made:
            await provider.aclose()


def assert_never_shown(secret: str, *things: Any) -> None:
    """``secret`` is in no ``str``/``repr`` of ``things``, nor of an exception's cause."""
    for thing in things:
        shown = [str(thing), repr(thing)]
        cause = getattr(thing, "__cause__", None)
        if cause is not None:
            shown += [str(cause), repr(cause)]
        for text in shown:
            assert secret not in text, text

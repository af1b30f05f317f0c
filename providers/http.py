"""The HTTP edge every cloud adapter shares: :class:`HTTPAdapter` and :class:`RetryPolicy`.

Why it exists: retries, ``Retry-After``, the HTTP status -> typed error classification and secret
scrubbing decide whether a pod runs twice, whether a cloud gets hammered and whether an API key
ends up in a log. They were written once per adapter; now they live in one audited place. Each
adapter keeps what is really its cloud's: parsing its error body (RFC 9457 problem details,
``{success, error, msg}``, ...) and the few rules its API documents on top of the common ones
(e.g. "a create 400 means no capacity"), applied before it falls back to :func:`error_for_status`.

Retries: :class:`~providers.base.TransientError` (timeouts, connection errors, 5xx) is retried
``max_attempts`` times in all with exponential backoff and jitter; a
:class:`~providers.base.RateLimited` is retried after its ``Retry-After`` when that is at most
``retry_after_cap`` seconds (with backoff when the cloud gave none) and raised at once when it
asks for longer, so that the caller can back off as a whole. Nothing else is retried. The
defaults are :data:`providers.options.DEFAULT_RETRY`, the same for every adapter.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import httpx
from tenacity import RetryCallState

from providers.base import (
    AuthError,
    InvalidSpec,
    NotFound,
    ProviderError,
    QuotaError,
    RateLimited,
    TransientError,
)
from providers.options import DEFAULT_RETRY
from providers.transport.asyncnet import fast_transport
from providers.transport.h1 import H1ConnectError, H1Error, H1Pool, H1Timeout

__all__ = [
    "MAX_SERVER_MESSAGE",
    "Answer",
    "HTTPAdapter",
    "RetryOptions",
    "RetryPolicy",
    "error_for_status",
    "parse_retry_after",
]

_T = TypeVar("_T")


class Answer(Protocol):
    """What adapters read of a cloud's answer: the lean pool's
    :class:`~providers.transport.h1.H1Response` on the hot path, an ``httpx.Response`` where
    httpx carries the call (a proxy, a stream)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> bytes: ...
    @property
    def text(self) -> str: ...
    @property
    def is_success(self) -> bool: ...
    def json(self) -> Any: ...

#: How much of a cloud's own error text an error message quotes.
MAX_SERVER_MESSAGE = 300
#: Request headers the lean HTTP/1.1 path writes itself, or must not send: it never decodes
#: compressed answers, so it never asks for them.
#: A path that goes on the wire as written (httpx would escape nothing in it).
_PLAIN_PATH = re.compile(r"/?[A-Za-z0-9._~!$&'()*+,;=:@/-]*")

_H1_SKIP = frozenset({"host", "content-length", "accept-encoding", "connection",
                      "transfer-encoding"})


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def error_for_status(
    status: int, message: str, *, provider: str, retry_after: float | None = None
) -> ProviderError:
    """The typed error for an HTTP status, once the cloud's own rules had their say.

    401/403 -> AuthError, 402 -> QuotaError, 429 -> RateLimited (``retry_after``), 400/422 ->
    InvalidSpec, 404 -> NotFound, 5xx -> TransientError, anything else -> ProviderError.
    """
    if status in (401, 403):
        return AuthError(message, provider=provider)
    if status == 402:
        return QuotaError(message, provider=provider)
    if status == 429:
        return RateLimited(message, provider=provider, retry_after=retry_after)
    if status in (400, 422):
        return InvalidSpec(message, provider=provider)
    if status == 404:
        return NotFound(message, provider=provider)
    if status >= 500:
        return TransientError(message, provider=provider)
    return ProviderError(message, provider=provider)


class RetryOptions(Protocol):
    """The retry knobs an adapter's parsed options carry (same names as the option keys)."""

    @property
    def max_attempts(self) -> int: ...

    @property
    def backoff_initial(self) -> float: ...

    @property
    def backoff_max(self) -> float: ...

    @property
    def retry_after_cap(self) -> float: ...


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """When and how long to retry a call at the HTTP edge (see the module docstring)."""

    max_attempts: int = DEFAULT_RETRY.max_attempts  # one set of defaults for every adapter
    backoff_initial: float = DEFAULT_RETRY.backoff_initial
    backoff_max: float = DEFAULT_RETRY.backoff_max
    retry_after_cap: float = DEFAULT_RETRY.retry_after_cap

    @classmethod
    def of(cls, options: RetryOptions) -> RetryPolicy:
        """The policy an adapter's parsed options ask for."""
        return cls(
            max_attempts=options.max_attempts,
            backoff_initial=options.backoff_initial,
            backoff_max=options.backoff_max,
            retry_after_cap=options.retry_after_cap,
        )

    def should_retry(self, exc: BaseException, *, retry_transient: bool = True) -> bool:
        if isinstance(exc, TransientError):
            return retry_transient
        if isinstance(exc, RateLimited):
            return exc.retry_after is None or exc.retry_after <= self.retry_after_cap
        return False

    def delay(self, exc: BaseException | None, attempt: int) -> float:
        """Seconds before the next try after failed ``attempt`` (1-based): ``Retry-After``
        (capped) after a 429 that gave one, else backoff with jitter."""
        if isinstance(exc, RateLimited) and exc.retry_after is not None:
            return min(exc.retry_after, self.retry_after_cap)
        backoff = self.backoff_initial * 2.0 ** (attempt - 1)
        jitter = random.uniform(0, self.backoff_initial / 2)
        return min(self.backoff_max, backoff) + jitter

    def wait(self, retry_state: RetryCallState) -> float:
        """:meth:`delay` as a tenacity ``wait`` (for callers that drive tenacity themselves)."""
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        return self.delay(exc, retry_state.attempt_number)

    async def call(
        self, operation: Callable[[], Awaitable[_T]], *, retry_transient: bool = True
    ) -> _T:
        """``operation()``, retried as the policy says; the last error is raised as is.

        ``retry_transient=False`` is for calls that are not idempotent (a timeout may hide a
        success): only a 429, which the cloud did not act on, is retried then. The loop is
        written out rather than run by tenacity: building a tenacity retrier per call cost a
        few percent of a call's CPU, and most calls succeed the first time.
        """
        attempt = 1
        while True:
            try:
                return await operation()
            except Exception as exc:
                if attempt >= self.max_attempts or not self.should_retry(
                    exc, retry_transient=retry_transient
                ):
                    raise
                await asyncio.sleep(self.delay(exc, attempt))
            attempt += 1


class HTTPAdapter:
    """The base of the cloud adapters: one httpx client, retries, errors and scrubbing.

    A subclass parses its options first (so a bad option leaks no client), then calls
    ``super().__init__``, and implements :meth:`_status_error` for its cloud's error body,
    building the text with :meth:`_status_message` and ending in :meth:`_classify`. The API key
    goes into ``auth_headers`` (and ``edge_key``, for a cloud whose HTTPS edge authenticates
    with it) and nowhere else; ``secret`` (when given) is replaced by ``***`` in every message
    built here.
    """

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        owner: str,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None,
        retry: RetryPolicy,
        auth_headers: Mapping[str, str] | None = None,
        secret: str | None = None,
        edge_key: str | None = None,
    ) -> None:
        self.name = name
        # the key the cloud's HTTPS edge wants (providers.base.edge_api_key); not in repr
        self._edge_key = edge_key or None
        self.owner = owner
        self._base_url = base_url
        self._timeout = timeout
        self._retry = retry
        self._secret = secret or None
        headers = {"Accept": "application/json", **(auth_headers or {})}
        # The default transport runs on plain asyncio streams (providers/transport/asyncnet.py:
        # less CPU per call); with a proxy in the environment it is None and httpx's own
        # honours it.
        self._transport = transport if transport is not None else fast_transport()
        self._client = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout, transport=self._transport
        )
        # Whole answers on the default transport take the lean HTTP/1.1 path
        # (providers/transport/h1.py); an injected transport (tests, a caller's own) or a proxy
        # keeps httpx.
        url = self._client.base_url
        self._h1 = H1Pool(f"{url.scheme}://{url.netloc.decode('ascii')}") \
            if transport is None and self._transport is not None else None
        # What the client adds to every request, merged once (see _request).
        self._prefix = str(self._client.base_url).rstrip("/") + "/"
        self._headers = dict(self._client.headers)
        self._extensions = {"timeout": self._client.timeout.as_dict()}
        # The lean path's fixed parts: the base URL's path and the headers it sends itself.
        self._h1_base = url.raw_path.decode("ascii").rstrip("/") + "/"
        self._h1_headers = [(k, v) for k, v in self._headers.items()
                            if k.lower() not in _H1_SKIP]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, base_url={self._base_url!r}, "
            f"owner={self.owner!r})"
        )

    def edge_api_key(self) -> str | None:
        """The account's key for the cloud's HTTPS edge (None: its edge wants none)."""
        return self._edge_key

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._h1 is not None:
            await self._h1.aclose()
        await self._client.aclose()

    # -- requests ---------------------------------------------------------------------------

    async def _retrying(
        self, operation: Callable[[], Awaitable[_T]], *, retry_transient: bool = True
    ) -> _T:
        return await self._retry.call(operation, retry_transient=retry_transient)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        op: str = "",
        retry_transient: bool = True,
    ) -> Answer:
        """One API call, retried; a typed error for anything but a 2xx."""

        target = self._h1_target(path, params)

        async def attempt() -> Answer:
            if target is not None:
                return await self._call_h1(method, target, json_body, what=what, op=op)
            if self._transport is None:  # a proxy from the environment: the client knows it
                request = self._client.build_request(method, path, params=params, json=json_body)
                return await self._send(request, what=what, op=op)
            return await self._send_direct(self._build(method, path, params, json_body),
                                           what=what, op=op)

        return await self._retrying(attempt, retry_transient=retry_transient)

    def _h1_target(self, path: str, params: Mapping[str, str] | None) -> str | None:
        """The request target for :meth:`_call_h1`, or None when the call needs httpx: no lean
        pool, a query to encode, an absolute URL or a path httpx would escape."""
        if self._h1 is None or params or not _PLAIN_PATH.fullmatch(path):
            return None
        return self._h1_base + path.lstrip("/")

    async def _call_h1(self, method: str, target: str, json_body: Any, *, what: str,
                       op: str) -> Answer:
        """One call on the lean HTTP/1.1 pool with no httpx request or response built for it
        (their objects, URL and header parsing cost more CPU than the call's own work)."""
        assert self._h1 is not None
        headers = self._h1_headers
        body = None
        if json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False).encode()
            headers = [*headers, ("Content-Type", "application/json")]
        try:
            answer = await self._h1.request(
                method, target, headers=headers,
                body=body if body or method in ("POST", "PUT", "PATCH") else None,
                timeout=self._timeout)
        except H1Error as exc:
            raise self._transport_error(exc, what=what) from exc
        if answer.is_success:
            return answer
        raise self._status_error(answer, what=what, op=op)

    def _build(self, method: str, path: str, params: Mapping[str, str] | None,
               json_body: Any) -> httpx.Request:
        """The request ``self._client.build_request`` would build, without merging the base
        URL, headers, cookies and timeouts again for every call."""
        url = path if path.startswith(("http://", "https://")) else self._prefix + path.lstrip("/")
        return httpx.Request(method, url, params=params, json=json_body,
                             headers=self._headers, extensions=self._extensions)

    async def _send_direct(self, request: httpx.Request, *, what: str,
                           op: str) -> httpx.Response:
        """:meth:`_send` for a whole (not streamed) answer, straight to the transport: the
        client's auth flow, redirect loop and cookie jar do nothing for these APIs but cost
        CPU on every call."""
        assert self._transport is not None
        if self._h1 is not None and request.url.scheme == self._h1.scheme and \
                request.url.netloc.decode("ascii") == self._h1.authority:
            return await self._send_h1(request, what=what, op=op)
        try:
            response = await self._transport.handle_async_request(request)
            response.request = request
            try:
                await response.aread()
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise self._transport_error(exc, what=what) from exc
        if response.is_success:
            return response
        raise self._status_error(response, what=what, op=op)

    async def _send_h1(self, request: httpx.Request, *, what: str, op: str) -> httpx.Response:
        """:meth:`_send_direct` on the lean HTTP/1.1 pool; the answer as an httpx response,
        so that adapters read it the same way."""
        assert self._h1 is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _H1_SKIP]
        body = request.content
        try:
            answer = await self._h1.request(
                request.method, request.url.raw_path.decode("ascii"), headers=headers,
                body=body if body or request.method in ("POST", "PUT", "PATCH") else None,
                timeout=self._timeout)
        except H1Error as exc:
            raise self._transport_error(exc, what=what) from exc
        response = httpx.Response(answer.status_code, headers=list(answer.headers.items()),
                                  content=answer.content, request=request)
        if response.is_success:
            return response
        raise self._status_error(response, what=what, op=op)

    async def _send(
        self, request: httpx.Request, *, what: str, stream: bool = False, op: str = ""
    ) -> httpx.Response:
        """Send once; a 2xx response (still open when ``stream``) or a typed error."""
        try:
            response = await self._client.send(request, stream=stream)
        except httpx.TransportError as exc:
            raise self._transport_error(exc, what=what) from exc
        if response.is_success:
            return response
        try:
            if stream:
                await response.aread()
        except httpx.TransportError as exc:
            raise self._transport_error(exc, what=what) from exc
        finally:
            if stream:
                await response.aclose()
        raise self._status_error(response, what=what, op=op)

    # -- errors -----------------------------------------------------------------------------

    def _transport_error(self, exc: httpx.TransportError | H1Error, *,
                         what: str) -> TransientError:
        if isinstance(exc, httpx.TimeoutException | H1Timeout):
            kind = "timed out"
        elif isinstance(exc, httpx.ConnectError | H1ConnectError):
            kind = "could not connect"
        else:
            kind = "lost the connection"
        return TransientError(
            f"{self.name}: {what} failed: {kind} ({type(exc).__name__})", provider=self.name
        )

    def _status_error(self, response: Answer, *, what: str, op: str) -> ProviderError:
        """The typed error for a non-2xx answer to operation ``op`` (the cloud's own format)."""
        raise NotImplementedError

    def _status_message(self, what: str, status: int, *, label: str = "", detail: str = "") -> str:
        """``<name>: <what> failed: HTTP <status> <label>: <detail>``, scrubbed."""
        message = f"{self.name}: {what} failed: HTTP {status}"
        if label:
            message += f" {label}"
        if detail:
            message += f": {detail}"
        return self._scrub(message)

    def _retry_after(self, response: Answer) -> float | None:
        """How long a 429 asks us to wait (``Retry-After``); None when it does not say."""
        return parse_retry_after(response.headers.get("Retry-After"))

    def _classify(self, response: Answer, message: str) -> ProviderError:
        """:func:`error_for_status` for the response, with its ``Retry-After`` on a 429."""
        status = response.status_code
        retry_after = self._retry_after(response) if status == 429 else None
        return error_for_status(status, message, provider=self.name, retry_after=retry_after)

    def _scrub(self, text: str) -> str:
        """``text`` with the API key replaced by ``***``."""
        return text.replace(self._secret, "***") if self._secret else text

    def _malformed(self, what: str) -> ProviderError:
        return ProviderError(f"{self.name}: {what}: malformed response", provider=self.name)

    def _json(self, response: Answer, *, what: str) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError as exc:
            raise self._malformed(what) from exc
        if not isinstance(data, dict):
            raise self._malformed(what)
        return data

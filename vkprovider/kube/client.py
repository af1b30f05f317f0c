"""An asyncio client for the API server: plain dicts, our own errors.

Why it exists: the official client's models cost ~10x the CPU and ~2.5x the memory of plain dicts
(see docs/architecture.md), and its watch blocks the event loop. Writes are patches, except the
pod status write (a replace guarded by the cached resourceVersion, a patch when that is stale:
:mod:`vkprovider.kube.podstatus_write`); never a read-modify-replace. Transient failures of
single requests are retried at this edge, honouring ``Retry-After``.

CPU per request and per watch event is what limits the provider in a burst (bench/burst.py), so
both paths are lean. Single requests go out on :mod:`providers.transport.h1` (one keep-alive
HTTP/1.1 connection per request in flight, the request in one write, the answer parsed as it
arrives); watches and followed logs on :mod:`providers.transport.h1stream` (chunk framing undone
in the event loop's callback, the reader woken once for all that arrived: 0.44 s less CPU per
3,000-pod burst's 12,000 watch events than reading them through httpx). The bearer token is
read at most every few seconds (:class:`~vkprovider.kube.auth.BearerAuth`) and the retry loop
costs nothing until a request fails. When the environment names a proxy, both go through
``httpx`` instead (its transport honours the proxy variables; :mod:`providers.transport.asyncnet`
under it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import urlencode

import httpx

from providers.transport.asyncnet import fast_transport
from providers.transport.h1 import H1Error, H1Pool, H1Response, H1Timeout
from providers.transport.h1stream import H1Stream, open_stream
from vkprovider.kube import codec
from vkprovider.kube.auth import BearerAuth, Credentials, load_credentials
from vkprovider.kube.errors import (
    APIError,
    ConnectionFailed,
    InactivityTimeout,
    ServerError,
    TooManyRequestsError,
    error_for,
)

Body = dict[str, Any]
PatchType = Literal["merge", "strategic", "json", "apply"]

_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}

_RETRYABLE = (ConnectionFailed, ServerError, TooManyRequestsError)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _wait(exc: BaseException, attempt: int) -> float:
    """Seconds before the next try after failed ``attempt`` (1-based): Retry-After, else backoff."""
    if isinstance(exc, APIError) and exc.retry_after is not None:
        return min(exc.retry_after, 30.0)
    return float(min(0.2 * 2 ** (attempt - 1), 5.0))


class KubeClient:
    """One connection pool to one API server. Create with :meth:`from_kubeconfig`."""

    def __init__(
        self,
        *,
        credentials: Credentials,
        user_agent: str = "vkprovider",
        timeout: float = 30.0,
        max_connections: int = 100,
        retries: int = 4,
    ) -> None:
        self.credentials = credentials
        self.host = credentials.host
        self._retries = retries
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._auth = BearerAuth(credentials)
        # None when the environment names a proxy: then every request goes through the
        # client, whose default transport honours it.
        self._transport = fast_transport(verify=credentials.ssl_context, limits=limits)
        self._http = httpx.AsyncClient(
            base_url=credentials.host,
            verify=credentials.ssl_context,
            auth=self._auth,
            headers={"User-Agent": user_agent, "Accept": "application/json"},
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=limits,
            transport=self._transport,
        )
        # Single requests take the lean HTTP/1.1 path (providers/transport/h1.py) and streams
        # (watches, logs) its streamed form (providers/transport/h1stream.py), unless a proxy is
        # configured.
        self._timeout = timeout
        self._pool = None if self._transport is None else H1Pool(
            credentials.host, ssl_context=credentials.ssl_context,
            max_connections=max_connections, connect_timeout=10.0)
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}

    @classmethod
    def from_kubeconfig(
        cls, *, kubeconfig: str | None = None, context: str | None = None, **kwargs: Any
    ) -> KubeClient:
        return cls(credentials=load_credentials(kubeconfig=kubeconfig, context=context), **kwargs)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- single requests -------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: bool = True,
        want_body: bool = True,
    ) -> Body:
        """Send one request and return the decoded JSON body; raise an :class:`APIError`.
        ``want_body=False`` returns ``{}`` on success without decoding the answer (a pod's
        status patch answers with the whole pod: decoding what nobody reads costs CPU)."""
        attempts = self._retries if retry else 1
        attempt = 1
        while True:
            try:
                return await self._once(method, path, params, body, content_type, want_body)
            except _RETRYABLE as exc:
                if attempt >= attempts:
                    raise
                await asyncio.sleep(_wait(exc, attempt))
            attempt += 1

    async def _once(
        self,
        method: str,
        path: str,
        params: Mapping[str, str | int | bool] | None,
        body: Any,
        content_type: str,
        want_body: bool = True,
    ) -> Body:
        what = f"{method} {path}"
        content = None if body is None else codec.dumps(body)
        try:
            resp = await self._send(method, path, params, content, content_type)
        except (httpx.TransportError, H1Error) as exc:
            raise ConnectionFailed(f"{what}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise error_for(
                status=resp.status_code,
                body=_json_or_none(resp.content),
                retry_after=_retry_after(resp.headers.get("Retry-After")),
                what=what,
            )
        if not resp.content or not want_body:
            return {}
        if "json" not in resp.headers.get("Content-Type", "json"):
            return {"text": resp.text}  # /readyz, /healthz and friends answer plain text
        decoded = codec.loads(resp.content)
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    async def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str | int | bool] | None,
        content: bytes | None,
        content_type: str,
    ) -> httpx.Response | H1Response:
        """One request, its body read, on the lean HTTP/1.1 pool (providers/transport/h1.py):
        httpx's client and transport spend several times its CPU per request on work these
        requests do not need (URL objects, header merging, an auth flow, a redirect loop, a cookie
        jar, httpcore's pool and h11 bookkeeping)."""
        if self._pool is None:  # a proxy from the environment: the client knows it
            headers = {"Content-Type": content_type} if content is not None else None
            return await self._http.request(
                method, path, params=_params(params), content=content, headers=headers
            )
        path, headers = self._target(path, params)
        if content is not None:
            headers["Content-Type"] = content_type
        return await self._pool.request(method, path, headers=headers, body=content,
                                        timeout=self._timeout)

    def _target(self, path: str, params: Mapping[str, str | int | bool] | None
                ) -> tuple[str, dict[str, str]]:
        """The lean path's request target (query encoded) and its headers (auth included)."""
        headers = self._headers.copy()
        auth = self._auth.header()
        if auth:
            headers["Authorization"] = auth
        query = _params(params)
        if query:
            path += ("&" if "?" in path else "?") + urlencode(query)
        return path, headers

    async def get(self, path: str, *, params: Mapping[str, str | int | bool] | None = None) -> Body:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Body, *, want_body: bool = True) -> Body:
        return await self.request("POST", path, body=body, want_body=want_body)

    async def replace(self, path: str, body: Body, *, want_body: bool = True) -> Body:
        """``PUT``: the object's ``metadata.resourceVersion`` is the precondition (409 if stale)."""
        return await self.request("PUT", path, body=body, want_body=want_body)

    async def patch(self, path: str, body: Any, *, patch_type: PatchType = "merge",
                    want_body: bool = True) -> Body:
        return await self.request("PATCH", path, body=body,
                                  content_type=_CONTENT_TYPES[patch_type], want_body=want_body)

    async def delete(
        self,
        path: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
        propagation: str | None = None,
    ) -> Body:
        options: Body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if propagation is not None:
            options["propagationPolicy"] = propagation
        return await self.request("DELETE", path, body=options)

    async def list_all(
        self, path: str, *, params: Mapping[str, str | int | bool] | None = None, page: int = 500
    ) -> tuple[list[Body], str]:
        """List every item (following ``continue``); return items and the list's resourceVersion."""
        items: list[Body] = []
        query: dict[str, str | int | bool] = dict(params or {})
        query["limit"] = page
        while True:
            body = await self.get(path, params=query)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion", ""))
            query["continue"] = cont

    # ---- streams ---------------------------------------------------------------------------

    @asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | None = None,
        read_timeout: float | None = None,
    ) -> AsyncIterator[H1Stream | httpx.Response]:
        """Open a streaming GET (watch, logs). Raises an :class:`APIError` on a failed status,
        :class:`InactivityTimeout` when no byte came for ``read_timeout`` seconds."""
        what = f"GET {path} (stream)"
        if self._pool is None:  # a proxy from the environment: the client knows it
            async with self._httpx_stream(path, params=params, read_timeout=read_timeout,
                                          what=what) as resp:
                yield resp
            return
        path, headers = self._target(path, params)
        head_timeout = read_timeout or self._timeout
        try:
            async with open_stream(self._pool, "GET", path, headers=headers,
                                   head_timeout=head_timeout,
                                   read_timeout=read_timeout) as stream:
                if stream.status_code >= 400:
                    raise _failed(stream.status_code, stream.headers.get("Retry-After"),
                                  await stream.aread(), what=what)
                yield stream
        except H1Timeout as exc:  # no head, or no byte, within read_timeout
            raise InactivityTimeout(f"{what}: no data for {head_timeout:g}s") from exc
        except H1Error as exc:
            raise ConnectionFailed(f"{what}: {type(exc).__name__}: {exc}") from exc

    @asynccontextmanager
    async def _httpx_stream(
        self, path: str, *, params: Mapping[str, str | int | bool] | None,
        read_timeout: float | None, what: str,
    ) -> AsyncIterator[httpx.Response]:
        timeout = httpx.Timeout(30.0, connect=10.0, read=read_timeout)
        try:
            async with self._http.stream(
                "GET", path, params=_params(params), timeout=timeout
            ) as resp:
                if resp.status_code >= 400:
                    raise _failed(resp.status_code, resp.headers.get("Retry-After"),
                                  await resp.aread(), what=what)
                yield resp
        except httpx.ReadTimeout as exc:
            raise InactivityTimeout(f"{what}: no data for {read_timeout}s") from exc
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"{what}: {type(exc).__name__}: {exc}") from exc


def _params(params: Mapping[str, str | int | bool] | None) -> dict[str, str] | None:
    if not params:
        return None
    return {
        k: ("true" if v is True else "false" if v is False else str(v)) for k, v in params.items()
    }


def _failed(status: int, retry_after: str | None, content: bytes, *, what: str) -> APIError:
    """The error for a stream the API server refused, its reason taken from the body."""
    return error_for(status=status, body=_json_or_none(content),
                     retry_after=_retry_after(retry_after), what=what)


def _json_or_none(content: bytes) -> dict[str, Any] | None:
    try:
        decoded = codec.loads(content)
    except ValueError:
        return {"message": content[:200].decode(errors="replace")} if content else None
    return decoded if isinstance(decoded, dict) else None

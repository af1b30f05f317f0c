"""An asyncio client for the API server: httpx, plain dicts, our own errors.

Why it exists: the official client's models cost ~10x the CPU and ~2.5x the memory of plain dicts
(see docs/architecture.md), and its watch blocks the event loop. Everything here is one
``httpx.AsyncClient``; writes are patches (never read-modify-replace); transient failures of
single requests are retried at this edge, honouring ``Retry-After``.

CPU per request is what limits the provider in a burst (bench/burst.py), so the request path is
lean: the connection pool runs on plain asyncio streams (:mod:`providers.asyncnet`: about a
quarter less CPU per request than httpx's anyio-based default, and a request's headers and body
leave in one TLS record), connections are kept alive and reused, the bearer token is read at
most every few seconds (:class:`~vkprovider.kube.auth.BearerAuth`), and the retry loop costs
nothing until a request fails.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx

from providers.asyncnet import fast_transport
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
        self._http = httpx.AsyncClient(
            base_url=credentials.host,
            verify=credentials.ssl_context,
            auth=BearerAuth(credentials),
            headers={"User-Agent": user_agent, "Accept": "application/json"},
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=limits,
            # None when the environment names a proxy: httpx's default transport honours it
            transport=fast_transport(verify=credentials.ssl_context, limits=limits),
        )

    @classmethod
    def from_kubeconfig(
        cls, *, kubeconfig: str | None = None, context: str | None = None, **kwargs: Any
    ) -> KubeClient:
        return cls(credentials=load_credentials(kubeconfig=kubeconfig, context=context), **kwargs)

    async def aclose(self) -> None:
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
    ) -> Body:
        """Send one request and return the decoded JSON body; raise an :class:`APIError`."""
        attempts = self._retries if retry else 1
        attempt = 1
        while True:
            try:
                return await self._once(method, path, params, body, content_type)
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
    ) -> Body:
        what = f"{method} {path}"
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": content_type} if content is not None else None
        try:
            resp = await self._http.request(
                method, path, params=_params(params), content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"{what}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise error_for(
                status=resp.status_code,
                body=_json_or_none(resp.content),
                retry_after=_retry_after(resp.headers.get("Retry-After")),
                what=what,
            )
        if not resp.content:
            return {}
        if "json" not in resp.headers.get("Content-Type", "json"):
            return {"text": resp.text}  # /readyz, /healthz and friends answer plain text
        decoded = json.loads(resp.content)
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    async def get(self, path: str, *, params: Mapping[str, str | int | bool] | None = None) -> Body:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Body) -> Body:
        return await self.request("POST", path, body=body)

    async def patch(self, path: str, body: Any, *, patch_type: PatchType = "merge") -> Body:
        return await self.request("PATCH", path, body=body, content_type=_CONTENT_TYPES[patch_type])

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
    ) -> AsyncIterator[httpx.Response]:
        """Open a streaming GET (watch, logs). Raises an :class:`APIError` on a failed status."""
        what = f"GET {path} (stream)"
        timeout = httpx.Timeout(30.0, connect=10.0, read=read_timeout)
        try:
            async with self._http.stream(
                "GET", path, params=_params(params), timeout=timeout
            ) as resp:
                if resp.status_code >= 400:
                    content = await resp.aread()
                    raise error_for(
                        status=resp.status_code,
                        body=_json_or_none(content),
                        retry_after=_retry_after(resp.headers.get("Retry-After")),
                        what=what,
                    )
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


def _json_or_none(content: bytes) -> dict[str, Any] | None:
    try:
        decoded = json.loads(content)
    except ValueError:
        return {"message": content[:200].decode(errors="replace")} if content else None
    return decoded if isinstance(decoded, dict) else None

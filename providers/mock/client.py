"""The adapter for the mock GPU cloud: :class:`MockProvider`.

Why it exists: it is the reference adapter. It speaks the mock cloud's HTTP API
(:mod:`providers.mock.server`) the way a real adapter speaks a real cloud's: over httpx, with
retries only at the HTTP edge, and with every failure turned into one of the typed errors of
:mod:`providers.base`. Tests of the service run against it, so its behaviour is the contract made
concrete.

Retries: timeouts, connection errors and 5xx (:class:`~providers.base.TransientError`) are
retried ``max_attempts`` times in all with short exponential backoff and jitter. A 429
(:class:`~providers.base.RateLimited`) is retried after its ``Retry-After`` when that is at most
``retry_after_cap`` seconds (with backoff when the cloud gave none), and raised at once when it
asks for longer, so that the caller can back off as a whole. Capacity, quota, auth and spec
errors are never retried. Create may be retried because the cloud is idempotent by name.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from providers.base import (
    TAG_NODE,
    AuthError,
    CapacityError,
    Instance,
    InstanceSpec,
    InstanceState,
    InvalidSpec,
    LogOptions,
    NotFound,
    Offer,
    ProviderError,
    QuotaError,
    RateLimited,
    TransientError,
)

__all__ = ["MockProvider"]

_T = TypeVar("_T")

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "terminating": InstanceState.TERMINATING,
    "failed": InstanceState.FAILED,
}
_MAX_SERVER_MESSAGE = 300


def _parse_retry_after(value: str | None) -> float | None:
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


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return None if value is None else int(value)


def _opt_time(data: Mapping[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    return None if value is None else datetime.fromisoformat(str(value))


class MockProvider:
    """A :class:`~providers.base.Provider` for one mock cloud account, scoped to ``owner``.

    ``transport`` replaces the network (e.g. ``httpx.ASGITransport(app=create_app(...))`` in
    tests). The API key goes into the client's default headers and nowhere else.
    """

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        owner: str,
        api_key: str | None = None,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_attempts: int = 4,
        backoff_initial: float = 0.1,
        backoff_max: float = 2.0,
        retry_after_cap: float = 5.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.name = name
        self.owner = owner
        self._base_url = base_url
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._retry_after_cap = retry_after_cap
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
        )

    def __repr__(self) -> str:
        return (
            f"MockProvider(name={self.name!r}, base_url={self._base_url!r}, owner={self.owner!r})"
        )

    async def __aenter__(self) -> MockProvider:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- the Provider protocol --------------------------------------------------------------

    async def create(self, spec: InstanceSpec) -> Instance:
        """Create (or find, by ``spec.name``) the instance; always tagged with our owner."""
        body: dict[str, Any] = {
            "name": spec.name,
            "image": spec.image,
            "gpu_type": spec.gpu_type,
            "gpu_count": spec.gpu_count,
            "region": spec.region,
            "command": list(spec.command) if spec.command is not None else None,
            "args": list(spec.args) if spec.args is not None else None,
            "env": dict(spec.env),
            "ports": [
                {"container_port": p.container_port, "protocol": p.protocol, "name": p.name}
                for p in spec.ports
            ],
            "cpu_millis": spec.cpu_millis,
            "memory_bytes": spec.memory_bytes,
            "max_price_per_hour": spec.max_price_per_hour,
            "tags": {**spec.tags, TAG_NODE: self.owner},
        }
        what = f"create instance {spec.name!r}"
        response = await self._request("POST", "/instances", what=what, json_body=body)
        return self._instance(self._json(response, what=what), what=what)

    async def list(self) -> list[Instance]:
        """Every live instance tagged with our owner, in one call."""
        what = "list instances"
        response = await self._request(
            "GET", "/instances", what=what, params={"tag": f"{TAG_NODE}={self.owner}"}
        )
        data = self._json(response, what=what)
        try:
            instances = [self._instance(item, what=what) for item in data["instances"]]
        except (KeyError, TypeError) as exc:
            raise self._malformed(what) from exc
        # The cloud filters by tag already; checking again keeps a lax cloud from handing us
        # another node's instances (which our GC would then delete).
        return [i for i in instances if i.tags.get(TAG_NODE) == self.owner]

    async def get(self, instance_id: str) -> Instance:
        """One instance by id (not in the protocol); NotFound when it is gone."""
        what = f"get instance {instance_id}"
        response = await self._request("GET", f"/instances/{instance_id}", what=what)
        return self._instance(self._json(response, what=what), what=what)

    async def delete(self, instance_id: str) -> None:
        """Start deleting the instance; deleting one that is gone is not an error."""
        try:
            await self._request(
                "DELETE", f"/instances/{instance_id}", what=f"delete instance {instance_id}"
            )
        except NotFound:
            return

    async def logs(self, instance_id: str, opts: LogOptions) -> AsyncGenerator[bytes, None]:
        """The container's output as raw byte chunks; with ``follow``, until it stops."""
        params: dict[str, str | int] = {}
        if opts.tail_lines is not None:
            params["tail_lines"] = opts.tail_lines
        if opts.since_seconds is not None:
            params["since_seconds"] = opts.since_seconds
        if opts.limit_bytes is not None:
            params["limit_bytes"] = opts.limit_bytes
        if opts.timestamps:
            params["timestamps"] = "true"
        if opts.follow:
            params["follow"] = "true"
        what = f"logs of instance {instance_id}"
        timeout = httpx.Timeout(self._timeout, read=None) if opts.follow else None

        async def open_stream() -> httpx.Response:
            request = self._client.build_request(
                "GET",
                f"/instances/{instance_id}/logs",
                params=params,
                timeout=timeout if timeout is not None else self._timeout,
            )
            return await self._send(request, what=what, stream=True)

        response = await self._retrying(open_stream)
        try:
            async for chunk in response.aiter_bytes():
                if chunk:
                    yield chunk
        except httpx.TransportError as exc:
            raise self._transport_error(exc, what=what) from exc
        finally:
            await response.aclose()

    async def capacity(self) -> builtins.list[Offer]:
        """Every (gpu_type, region) the cloud sells, with the GPUs free now (possibly 0)."""
        what = "read capacity"
        response = await self._request("GET", "/capacity", what=what)
        data = self._json(response, what=what)
        try:
            return [
                Offer(
                    provider=self.name,
                    gpu_type=str(item["gpu_type"]),
                    region=str(item["region"]),
                    available=int(item["available"]),
                    price_per_gpu_hour=float(item["price_per_gpu_hour"]),
                )
                for item in data["offers"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._malformed(what) from exc

    # -- extras -----------------------------------------------------------------------------

    async def gpu_metrics(self, instance_id: str) -> dict[str, Any]:
        """Per-GPU utilization, tensor activity, memory, temperature and power of an instance.

        The mock cloud's JSON as is: ``{instance_id, state, at, gpus: [{index, uuid, gpu_type,
        gpu_utilization (percent), tensor_active (0-1), memory_used_bytes, memory_total_bytes,
        temperature_c, power_w}]}``.
        """
        what = f"read GPU metrics of instance {instance_id}"
        response = await self._request("GET", f"/instances/{instance_id}/metrics", what=what)
        return self._json(response, what=what)

    # -- the HTTP edge ----------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
    ) -> httpx.Response:
        async def attempt() -> httpx.Response:
            request = self._client.build_request(method, path, params=params, json=json_body)
            return await self._send(request, what=what, stream=False)

        return await self._retrying(attempt)

    async def _retrying(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._max_attempts),
            wait=self._wait,
            retry=retry_if_exception(self._should_retry),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await operation()
        raise AssertionError("unreachable: tenacity reraises the last error")

    def _should_retry(self, exc: BaseException) -> bool:
        if isinstance(exc, TransientError):
            return True
        if isinstance(exc, RateLimited):
            return exc.retry_after is None or exc.retry_after <= self._retry_after_cap
        return False

    def _wait(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, RateLimited) and exc.retry_after is not None:
            return min(exc.retry_after, self._retry_after_cap)
        backoff = self._backoff_initial * 2.0 ** (retry_state.attempt_number - 1)
        return min(self._backoff_max, backoff) + random.uniform(0, self._backoff_initial / 2)

    async def _send(self, request: httpx.Request, *, what: str, stream: bool) -> httpx.Response:
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
        raise self._status_error(response, what=what)

    def _transport_error(self, exc: httpx.TransportError, *, what: str) -> TransientError:
        if isinstance(exc, httpx.TimeoutException):
            kind = "timed out"
        elif isinstance(exc, httpx.ConnectError):
            kind = "could not connect"
        else:
            kind = "lost the connection"
        return TransientError(
            f"{self.name}: {what} failed: {kind} ({type(exc).__name__})", provider=self.name
        )

    def _status_error(self, response: httpx.Response, *, what: str) -> ProviderError:
        status = response.status_code
        code, detail = "", ""
        try:
            error = response.json()["error"]
            code = str(error.get("code", ""))
            detail = str(error.get("message", ""))[:_MAX_SERVER_MESSAGE]
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        message = f"{self.name}: {what} failed: HTTP {status}"
        if code:
            message += f" {code}"
        if detail:
            message += f": {detail}"
        p = self.name
        if status in (401, 403):
            return AuthError(message, provider=p)
        if status == 402 or code == "quota_exceeded":
            return QuotaError(message, provider=p)
        if code == "capacity_unavailable":
            return CapacityError(message, provider=p)
        if status == 429:
            retry_after = _parse_retry_after(response.headers.get("Retry-After"))
            return RateLimited(message, provider=p, retry_after=retry_after)
        if status in (400, 422) or code == "invalid_spec":
            return InvalidSpec(message, provider=p)
        if status == 404:
            return NotFound(message, provider=p)
        if status >= 500:
            return TransientError(message, provider=p)
        return ProviderError(message, provider=p)

    def _malformed(self, what: str) -> ProviderError:
        return ProviderError(f"{self.name}: {what}: malformed response", provider=self.name)

    def _json(self, response: httpx.Response, *, what: str) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError as exc:
            raise self._malformed(what) from exc
        if not isinstance(data, dict):
            raise self._malformed(what)
        return data

    def _instance(self, data: Any, *, what: str) -> Instance:
        try:
            raw_state = str(data["state"])
            exit_code = _opt_int(data, "exit_code")
            if raw_state == "exited":
                state = InstanceState.SUCCEEDED if exit_code == 0 else InstanceState.FAILED
            else:
                state = _STATES[raw_state]
            return Instance(
                id=str(data["id"]),
                name=str(data["name"]),
                provider=self.name,
                state=state,
                tags={str(k): str(v) for k, v in (data.get("tags") or {}).items()},
                gpu_type=_opt_str(data, "gpu_type"),
                gpu_count=int(data.get("gpu_count") or 0),
                region=_opt_str(data, "region"),
                price_per_hour=float(data.get("price_per_hour") or 0.0),
                ip=_opt_str(data, "ip"),
                endpoints=tuple(str(e) for e in data.get("endpoints") or ()),
                created_at=_opt_time(data, "created_at"),
                started_at=_opt_time(data, "started_at"),
                finished_at=_opt_time(data, "finished_at"),
                exit_code=exit_code,
                message=_opt_str(data, "message"),
                restart_count=int(data.get("restart_count") or 0),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed(what) from exc

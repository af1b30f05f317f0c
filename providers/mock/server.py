"""The mock GPU cloud: an in-memory GPU cloud with a small JSON HTTP API.

Why it exists: the service, its placement policies and its garbage collection must be testable
end to end without a real cloud account. This module is that cloud. It behaves like the clouds the
adapters talk to (capacity per GPU type and region, idempotent create by name, slow boots, slow
deletes, failures, rate limits, per-second billing) and it tells the truth about what happened
(a ledger of every instance ever created, call counters), so a test can assert "the pod ran once,
in the cheapest region, and cost 0.50" or "the cloud was never called".

Everything lives in one :class:`MockCloudState` (no module-level singletons; several clouds can
run in one process). Time comes from an injectable monotonic clock: lifecycle transitions are
computed lazily from timestamps, so there are no background tasks, and unit tests advance a
:class:`ManualClock` instead of sleeping. The state's methods never ``await`` while mutating, so
they are atomic under asyncio without locks.

HTTP API (all JSON; an error is ``{"error": {"code": str, "message": str}}``)
------------------------------------------------------------------------------

Every non-admin endpoint needs ``Authorization: Bearer <key>`` when the state has an ``api_key``
(otherwise 401 ``unauthorized``). Admin endpoints need the same key. The key is never echoed.
A request is counted first, then authenticated, then given its armed fault (if any: a scripted
one from ``/admin/faults``, else the scenario's 429 bursts, random errors and hangs), and only
then are its query and body validated, so a stranger gets 401 whatever they send.

Scenario faults (:mod:`providers.mock.scenario`) also act inside the endpoints: capacity
outages shrink offers, a crash rate fails running instances, deletes can be slow or come to
nothing, a create can lose its answer after making the instance (the duplicate trap), and
``GET /instances`` can lag behind creates (``GET /instances/{id}`` and create-by-name do not).

``GET /healthz``
    ``{"ok": true}``; no auth, not counted.
``GET /capacity``
    ``{"offers": [{gpu_type, region, total, available, price_per_gpu_hour}]}``; ``available`` is
    ``total`` minus the GPUs held by live instances (every instance not yet deleted holds its
    GPUs, including exited and failed ones, until it is deleted).
``POST /instances``
    Body: ``name, image, gpu_count`` (required); ``gpu_type, region, regions, command, args,
    env, ports ([{container_port, protocol, name}]), cpu_millis, memory_bytes,
    max_price_per_hour, tags``.
    Idempotent by ``name``: if a live instance (any state, terminating included) has that name it
    is returned with 200; otherwise a new one is created and returned with 201. Without
    ``region`` the cheapest region with enough capacity is chosen, among ``regions`` if given
    (without ``gpu_type``, the cheapest offer of any type). Errors: 400/422 ``invalid_spec``
    (unknown gpu_type, gpu_count < 1 or above ``max_gpus_per_instance``, empty image, bad tag
    value; messages name the field, never its value), 409 ``capacity_unavailable`` (no offer in
    that region, not enough free GPUs, or over ``max_price_per_hour``), 402 ``quota_exceeded``
    (account GPU quota).
``GET /instances?tag=key=value&tag=...&name=...``
    ``{"instances": [...]}``: live instances matching every filter.
``GET /instances/{id}``
    One instance. Instance JSON: ``id, name, state, tags, image, gpu_type, gpu_count, region,
    price_per_hour (whole instance), ip (100.64.x.y, the pod's address), endpoints,
    public_ip, ports, created_at, started_at, finished_at, exit_code, message,
    restart_count``. ``public_ip`` (198.18.x.y, in the benchmarking range 198.18.0.0/15) and
    ``ports`` (``[{container_port, protocol, public_port}]``, one per declared container port
    and protocol) say how the instance is reached from outside: ``public_ip:public_port``. Public
    ports count up from 30000 per instance, skipping the instance's own container ports, so a
    public port never equals a container port. Both are assigned at create, in every state.
    Nothing listens there (yet). ``state`` is one of ``pending``,
    ``running``, ``exited`` (see ``exit_code``), ``failed`` (see ``message``), ``terminating``.
    Timestamps are ISO 8601 UTC or null. Env values are never returned.
``DELETE /instances/{id}``
    202 with the instance in ``terminating`` (gone after ``delete_delay``), or 204 when
    ``delete_delay`` is 0. 404 ``not_found`` for unknown or already gone instances.
``GET /instances/{id}/logs?tail_lines&since_seconds&timestamps&limit_bytes&follow``
    ``text/plain``. The fake container prints a ``pulling image`` line at creation, a start line
    naming image and instance, one ``heartbeat`` line per second of running time, and a final
    line when it exits, fails or is deleted. ``timestamps`` prefixes RFC 3339 timestamps like the
    kubelet. ``follow`` streams new lines until the instance stops, is deleted, the client goes
    away, ``limit_bytes`` is reached or ``follow_max_seconds`` pass.
``GET /instances/{id}/metrics``
    ``{instance_id, state, at, gpus: [{index, uuid, gpu_type, gpu_utilization (percent, 0-100),
    tensor_active (fraction, 0-1), memory_used_bytes, memory_total_bytes, temperature_c,
    power_w}]}``, deterministic from the state's ``seed``, the instance and a 10 s time bucket.
    GPUs are idle unless the instance is running.
``GET /gpu-metrics?tag=k=v``
    ``{instances: [...]}``: the same object for every live instance with those tags, in one call
    (as RunPod's and Vast.ai's instance listings carry GPU figures). Counted as ``metrics``.

Admin endpoints (for tests and for people trying policies):

``POST /admin/instances/{id}/fail`` ``{message, exit_code?}``
    The container fails (state ``failed``); 409 ``invalid_state`` if it already stopped.
``POST /admin/instances/{id}/exit`` ``{exit_code}``
    The container exits (state ``exited``).
``POST /admin/instances/{id}/load`` ``{gpu_utilization: 0..1 | null}``
    Pins the instance's GPU load (e.g. 0.02 to look idle); null restores the default.
``GET|PUT /admin/inventory`` ``{"offers": [{gpu_type, region, count, price_per_gpu_hour}]}``
    Reads or replaces the inventory. Running instances are kept even if they no longer fit.
``GET|PATCH /admin/config`` ``{boot_delay, delete_delay, quota_gpus, max_gpus_per_instance}``
``GET|POST|DELETE /admin/faults``
    POST ``{endpoint, status, count, retry_after}``: the next ``count`` requests to ``endpoint``
    (``create, list, get, delete, logs, metrics, capacity`` or ``*``) answer ``status`` (with a
    ``Retry-After`` header when ``retry_after`` is set) without doing anything.
``GET|PUT|DELETE /admin/scenario``
    PUT takes a scenario (:mod:`providers.mock.scenario`, as JSON) and applies it now: what it
    sets (inventory, delays, seed) and its fault profile, replacing the previous profile; 422
    ``invalid_spec`` names the bad field. GET returns the scenario in force; DELETE turns the
    random faults off (the scripted ``/admin/faults`` stay).
``GET /admin/stats``
    ``{create_calls, list_calls, get_calls, delete_calls, logs_calls, metrics_calls,
    capacity_calls, injected_<kind> (errors, hangs, rate_limited, lost_creates,
    capacity_refusals, crashes, slow_deletes, failed_deletes), unauthorized_calls,
    faults_injected (scripted and scenario), instances_created, live_instances}``.
    Calls are counted when received, including idempotent repeats, rejected and faulted ones.
``GET /admin/ledger``
    ``{create_calls, total_cost, instances: [{id, name, uid, gpu_type, gpu_count, region,
    price_per_hour, state, exit_code, created_at, started_at, stopped_at, cost}]}`` for every
    instance ever created. Billing runs from ``started_at`` (boot finished) to ``stopped_at``
    (the GPUs were released, i.e. the delete finished); a finished but undeleted instance keeps
    costing money, as on a real cloud. Live instances are priced at read time.
``POST /admin/reset``
    Forgets instances, ledger, counters and faults, and restores the constructor's inventory and
    configuration. Instance ids stay unique across resets.

Tags understood by the mock (optional, for scripted workloads):
``mock.vkprovider.io/run-seconds`` (the container exits after that many seconds of running),
``mock.vkprovider.io/exit-code`` (its exit code then, default 0) and
``mock.vkprovider.io/gpu-utilization`` (0..1, like the admin ``load`` endpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import hmac
import math
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import uvicorn
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from providers.base import TAG_UID
from providers.mock.scenario import Faults, Scenario, ScenarioError, parse_scenario

__all__ = [
    "DEFAULT_INVENTORY",
    "ENDPOINTS",
    "PUBLIC_PORT_BASE",
    "TAG_EXIT_CODE",
    "TAG_GPU_UTILIZATION",
    "TAG_RUN_SECONDS",
    "Fault",
    "FaultPlan",
    "InventoryOffer",
    "LostResponse",
    "ManualClock",
    "MockCloudError",
    "MockCloudState",
    "create_app",
    "serve",
    "startup_line",
]

TAG_RUN_SECONDS = "mock.vkprovider.io/run-seconds"
TAG_EXIT_CODE = "mock.vkprovider.io/exit-code"
TAG_GPU_UTILIZATION = "mock.vkprovider.io/gpu-utilization"

#: The endpoints that are counted and can be given faults (admin endpoints are neither).
ENDPOINTS: tuple[str, ...] = ("create", "list", "get", "delete", "logs", "metrics", "capacity")

_GIB = 1024**3
#: GPU memory and board power by GPU type; unknown types get the defaults.
_GPU_MEMORY = {
    "H100": 80 * _GIB,
    "H200": 141 * _GIB,
    "A100": 80 * _GIB,
    "L40S": 48 * _GIB,
    "L4": 24 * _GIB,
    "A10G": 24 * _GIB,
    "RTX4090": 24 * _GIB,
    "T4": 16 * _GIB,
}
_GPU_WATTS = {
    "H100": 700.0,
    "H200": 700.0,
    "A100": 400.0,
    "L40S": 350.0,
    "L4": 72.0,
    "A10G": 150.0,
    "RTX4090": 450.0,
    "T4": 70.0,
}
_DEFAULT_MEMORY = 48 * _GIB
_DEFAULT_WATTS = 300.0
_METRICS_BUCKET_SECONDS = 10.0


class ManualClock:
    """A monotonic clock that moves only when told to; pass it (and its ``sleep``) to the state."""

    def __init__(self, *, start: float = 1000.0) -> None:
        self._now = start

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` and yield to the loop once, instead of waiting."""
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


@dataclass(frozen=True, kw_only=True)
class InventoryOffer:
    """``count`` GPUs of one type in one region, sold at ``price_per_gpu_hour``."""

    gpu_type: str
    region: str
    count: int
    price_per_gpu_hour: float

    def __post_init__(self) -> None:
        if not self.gpu_type or not self.region:
            raise ValueError("an offer needs a gpu_type and a region")
        if self.count < 0 or self.price_per_gpu_hour < 0:
            raise ValueError("an offer's count and price cannot be negative")


DEFAULT_INVENTORY: tuple[InventoryOffer, ...] = (
    InventoryOffer(gpu_type="H100", region="us-east", count=16, price_per_gpu_hour=2.49),
    InventoryOffer(gpu_type="H100", region="eu-west", count=8, price_per_gpu_hour=2.19),
    InventoryOffer(gpu_type="A100", region="us-east", count=16, price_per_gpu_hour=1.29),
    InventoryOffer(gpu_type="A100", region="us-west", count=8, price_per_gpu_hour=1.19),
    InventoryOffer(gpu_type="L40S", region="eu-west", count=8, price_per_gpu_hour=0.89),
    InventoryOffer(gpu_type="L4", region="us-east", count=32, price_per_gpu_hour=0.44),
)


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


def _not_found(instance_id: str) -> MockCloudError:
    return MockCloudError(status=404, code="not_found", message=f"instance {instance_id} not found")


_FAULT_CODES = {
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
                    code=_FAULT_CODES.get(fault.status, "injected"),
                    message=f"injected fault on {endpoint}",
                    retry_after=fault.retry_after,
                )
        return None


#: The scenario faults counted in ``stats()`` as ``injected_<kind>``.
_INJECTED_KINDS = (
    "errors",
    "hangs",
    "rate_limited",
    "lost_creates",
    "capacity_refusals",
    "crashes",
    "slow_deletes",
    "failed_deletes",
)


class _Phase(enum.StrEnum):
    """What the container does; ``terminating`` is reported on top of it while deleting."""

    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"


@dataclass(kw_only=True, eq=False)
class _Record:
    """One instance, live or gone. Times are on the state's monotonic clock."""

    id: str
    seq: int
    name: str
    image: str
    gpu_type: str
    gpu_count: int
    region: str
    price_per_gpu_hour: float
    env_count: int  # env values are never stored
    ports: tuple[int, ...]
    published: tuple[tuple[int, str, int], ...]  # (container port, protocol, public port)
    tags: dict[str, str]
    created: float
    boot_at: float
    run_seconds: float | None
    run_exit_code: int
    load: float | None
    phase: _Phase = _Phase.PENDING
    started: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    message: str | None = None
    deleting: float | None = None
    delete_done: float | None = None
    released: float | None = None
    crash_at: float | None = None  # scenario fault: fails then, if still running
    crash_message: str = ""
    crash_exit_code: int | None = None
    crashed: bool = False
    delete_fails: bool = False  # scenario fault: the pending delete comes to nothing

    @property
    def price_per_hour(self) -> float:
        return self.price_per_gpu_hour * self.gpu_count

    @property
    def ip(self) -> str:
        return f"100.64.{(self.seq // 254) % 256}.{self.seq % 254 + 1}"

    @property
    def public_ip(self) -> str:
        """The address the instance is reached at from outside: in 198.18.0.0/15 (RFC 2544's
        benchmarking range), apart from the pods' 100.64.x.y, one per instance."""
        block = (self.seq // 254) % 512
        return f"198.{18 + block // 256}.{block % 256}.{self.seq % 254 + 1}"

    def advance(self, *, now: float) -> None:
        """Apply every transition due by ``now``, at the time it was due."""
        if self.released is not None:
            return
        if self.deleting is None:
            if self.phase is _Phase.PENDING and now >= self.boot_at:
                self.phase = _Phase.RUNNING
                self.started = self.boot_at
            if self.phase is _Phase.RUNNING and self.started is not None:
                exit_at = (
                    self.started + self.run_seconds if self.run_seconds is not None else math.inf
                )
                crash_at = self.crash_at if self.crash_at is not None else math.inf
                if now >= min(exit_at, crash_at):
                    if crash_at < exit_at:
                        self.crashed = True
                        self.phase = _Phase.FAILED
                        self.finished = max(crash_at, self.started)
                        self.exit_code = self.crash_exit_code
                        self.message = self.crash_message
                    else:
                        self.phase = _Phase.EXITED
                        self.finished = exit_at
                        self.exit_code = self.run_exit_code
        elif self.delete_done is not None and now >= self.delete_done:
            if self.delete_fails:  # the cloud dropped the delete: back to what it was
                self.deleting = self.delete_done = None
                self.delete_fails = False
                self.advance(now=now)
            else:
                self.released = self.delete_done

    def cost(self, *, now: float) -> float:
        if self.started is None:
            return 0.0
        end = self.released if self.released is not None else now
        return self.price_per_hour * max(0.0, end - self.started) / 3600.0


@dataclass(frozen=True)
class _LogLine:
    at: float
    text: str


class _LogView:
    """The lines a record's container has printed by ``now``, indexable without building them.

    Heartbeats are computed on demand so that ``tail_lines`` on a week-old instance is cheap.
    Lines only ever get appended, so an index into one view is valid in every later view.
    """

    def __init__(self, record: _Record, *, now: float) -> None:
        r = record
        self._prefix = [_LogLine(r.created, f"[mock] pulling image {r.image}")]
        self._started = r.started
        self._heartbeats = 0
        if r.started is not None:
            self._prefix.append(
                _LogLine(
                    r.started,
                    f"[mock] started {r.name}: image={r.image} gpus={r.gpu_count}x{r.gpu_type} "
                    f"env_vars={r.env_count}",
                )
            )
            end = min(t for t in (now, r.finished, r.deleting) if t is not None)
            self._heartbeats = max(0, math.floor(end - r.started + 1e-9))
        self._suffix: list[_LogLine] = []
        if r.finished is not None:
            if r.phase is _Phase.FAILED:
                self._suffix.append(_LogLine(r.finished, f"[mock] failed: {r.message}"))
            else:
                self._suffix.append(_LogLine(r.finished, f"[mock] exited with code {r.exit_code}"))
        if r.deleting is not None:
            self._suffix.append(_LogLine(r.deleting, "[mock] received SIGTERM: deleting"))

    def __len__(self) -> int:
        return len(self._prefix) + self._heartbeats + len(self._suffix)

    def __getitem__(self, index: int) -> _LogLine:
        if index < len(self._prefix):
            return self._prefix[index]
        index -= len(self._prefix)
        if index < self._heartbeats:
            assert self._started is not None
            beat = index + 1
            return _LogLine(self._started + beat, f"[mock] heartbeat {beat}")
        return self._suffix[index - self._heartbeats]

    def first_at_or_after(self, at: float) -> int:
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if self[mid].at < at:
                lo = mid + 1
            else:
                hi = mid
        return lo


#: The first public port the mock hands out; an instance's ports count up from here.
PUBLIC_PORT_BASE = 30000


def _publish(ports: Iterable[PortBody]) -> tuple[tuple[int, str, int], ...]:
    """A public port for each declared (container port, protocol), in order: counting up from
    :data:`PUBLIC_PORT_BASE` and skipping the instance's own container ports, so that a public
    port never equals a container port. Deterministic: it depends on the declared ports only."""
    declared = list(dict.fromkeys((p.container_port, p.protocol) for p in ports))
    taken = {port for port, _ in declared}
    published: list[tuple[int, str, int]] = []
    public = PUBLIC_PORT_BASE
    for port, protocol in declared:
        while public in taken:
            public += 1
        published.append((port, protocol, public))
        public += 1
    return tuple(published)


def _parse_tag_float(tags: Mapping[str, str], key: str, *, lo: float, hi: float) -> float | None:
    raw = tags.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:  # also rejects NaN
        raise MockCloudError(
            status=400, code="invalid_spec", message=f"tag {key} must be a number in [{lo}, {hi}]"
        )
    return value


class MockCloudState:
    """The whole mock cloud: inventory, instances, ledger, counters, faults and knobs.

    The knobs are plain attributes, changeable at any time: ``boot_delay`` and ``delete_delay``
    (seconds; 0 means at once), ``quota_gpus`` (max GPUs held at once, None for no quota),
    ``max_gpus_per_instance``, ``follow_poll_interval`` and ``follow_max_seconds`` (for followed
    logs; both on the injected clock). ``faults`` arms scripted failures.

    ``scenario`` (:mod:`providers.mock.scenario`) sets inventory, delays and seed and arms a
    random fault profile (:meth:`apply_scenario`, :meth:`set_faults`). Random faults are drawn
    from ``rng`` (``random.Random(seed)``) only when configured, in request order, so one seed
    and one sequence of requests give one run.
    """

    def __init__(
        self,
        *,
        inventory: Iterable[InventoryOffer] = DEFAULT_INVENTORY,
        api_key: str | None = None,
        boot_delay: float = 0.0,
        delete_delay: float = 0.0,
        quota_gpus: int | None = None,
        max_gpus_per_instance: int = 8,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        start_time: datetime | None = None,
        follow_poll_interval: float = 0.5,
        follow_max_seconds: float = 3600.0,
        scenario: Scenario | None = None,
    ) -> None:
        self._api_key = api_key
        # Real clouds' ids are unique to that cloud only; two mock clouds seeded alike must
        # still hand out different ids, or a test cannot tell a provider that keys instances by
        # id alone (wrong) from one that keys them by (provider, id).
        self._id_salt = secrets.token_hex(4)
        self.seed = seed
        self._initial_seed = seed
        self._initial_scenario = scenario
        self.clock = clock
        self.sleep = sleep
        self._t0 = clock()
        self._wall0 = (start_time or datetime.now(UTC)).astimezone(UTC)
        self._initial_inventory = self._checked_inventory(inventory)
        self._initial_knobs = (boot_delay, delete_delay, quota_gpus, max_gpus_per_instance)
        self.boot_delay: float = boot_delay
        self.delete_delay: float = delete_delay
        self.quota_gpus: int | None = quota_gpus
        self.max_gpus_per_instance: int = max_gpus_per_instance
        self.follow_poll_interval = follow_poll_interval
        self.follow_max_seconds = follow_max_seconds
        self.faults = FaultPlan()
        self.rng = random.Random(seed)
        self.scenario_faults = Faults()
        self._scenario: Scenario | None = None
        self._scenario_t0 = self._t0
        self.injected: dict[str, int] = {}
        self._seq = 0
        self._inventory: dict[tuple[str, str], InventoryOffer] = {}
        self._live: dict[str, _Record] = {}
        self._all: list[_Record] = []
        self.calls: dict[str, int] = {}
        self.unauthorized_calls = 0
        self.reset()

    def __repr__(self) -> str:
        return (
            f"MockCloudState(live={len(self._live)}, created={len(self._all)}, "
            f"auth={'on' if self._api_key else 'off'})"
        )

    # -- time -------------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock()

    def wall(self, at: float) -> datetime:
        """The UTC wall time of a monotonic instant."""
        return self._wall0 + timedelta(seconds=at - self._t0)

    def _iso(self, at: float | None) -> str | None:
        return None if at is None else self.wall(at).isoformat()

    def _tick(self) -> float:
        now = self.clock()
        for record in list(self._live.values()):
            record.advance(now=now)
            if record.released is not None:
                del self._live[record.id]
        return now

    # -- admission --------------------------------------------------------------------------

    def admit(self, *, endpoint: str, authorization: str | None) -> float:
        """Count a request, then reject it if unauthorized or if a fault is armed for it.

        Scripted faults come first, then the scenario's 429 bursts and random errors. Returns
        the seconds the request must hang before it is handled (a scenario fault; usually 0).
        """
        self.calls[endpoint] = self.calls.get(endpoint, 0) + 1
        if not self.authorized(authorization):
            self.unauthorized_calls += 1
            raise MockCloudError(
                status=401, code="unauthorized", message="missing or invalid API key"
            )
        fault = self.faults.take(endpoint=endpoint)
        if fault is not None:
            raise fault
        profile = self.scenario_faults
        elapsed = self.clock() - self._scenario_t0
        for burst in profile.rate_limits:
            if ("*" in burst.endpoints or endpoint in burst.endpoints) and burst.active(
                elapsed=elapsed
            ):
                self._count("rate_limited")
                raise MockCloudError(
                    status=429,
                    code="rate_limited",
                    message=f"rate limited on {endpoint}",
                    retry_after=burst.retry_after,
                )
        own = profile.for_endpoint(endpoint)
        if own is None:
            return 0.0
        if own.error_rate and self.rng.random() < own.error_rate:
            self._count("errors")
            raise MockCloudError(
                status=own.error_status,
                code=_FAULT_CODES.get(own.error_status, "injected"),
                message=f"injected fault on {endpoint}",
            )
        if own.hang_rate and own.hang_seconds and self.rng.random() < own.hang_rate:
            self._count("hangs")
            return own.hang_seconds
        return 0.0

    def _count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1

    # -- scenarios --------------------------------------------------------------------------

    def apply_scenario(self, scenario: Scenario) -> None:
        """Apply a whole scenario: what it sets (inventory, delays, seed) and its fault profile.

        The scenario's clock (``start`` of bursts and outages) restarts now. A ``seed`` re-seeds
        the fault generator (and instance ids) so the run from here on is repeatable.
        """
        if scenario.inventory is not None:
            self.set_inventory(
                InventoryOffer(
                    gpu_type=o.gpu_type,
                    region=o.region,
                    count=o.count,
                    price_per_gpu_hour=o.price_per_gpu_hour,
                )
                for o in scenario.inventory
            )
        if scenario.boot_delay is not None:
            self.boot_delay = scenario.boot_delay
        if scenario.delete_delay is not None:
            self.delete_delay = scenario.delete_delay
        if scenario.seed is not None:
            self.seed = scenario.seed
            self.rng = random.Random(scenario.seed)
        self._scenario = scenario
        self.set_faults(scenario.faults)

    def set_faults(self, faults: Faults | Mapping[str, Any]) -> None:
        """Replace the fault profile (a :class:`Faults` or its dict form) and restart its clock.

        Live instances get new crash times under the new crash rate.
        """
        if not isinstance(faults, Faults):
            try:
                faults = Faults.model_validate(faults)
            except ValidationError as exc:
                raise ScenarioError(
                    f"faults: {_describe_errors(exc.errors())}"
                ) from None
        self.scenario_faults = faults
        if self._scenario is not None:
            self._scenario = self._scenario.model_copy(update={"faults": faults})
        now = self.clock()
        self._scenario_t0 = now
        for record in self._live.values():
            self._draw_crash(record, after=max(now, record.boot_at))

    def clear_faults(self) -> None:
        """No random faults any more (the scripted :attr:`faults` are left as they are)."""
        self.set_faults(Faults())

    def scenario(self) -> dict[str, Any]:
        """The scenario in force, as JSON (what ``PUT /admin/scenario`` takes)."""
        base = self._scenario or Scenario()
        return base.model_copy(update={"faults": self.scenario_faults}).model_dump(mode="json")

    def _draw_crash(self, record: _Record, *, after: float) -> None:
        crash = self.scenario_faults.crash
        if record.phase not in (_Phase.PENDING, _Phase.RUNNING) or record.deleting is not None:
            return
        if crash.rate_per_second <= 0:
            record.crash_at = None
            return
        record.crash_at = after + self.rng.expovariate(crash.rate_per_second)
        record.crash_message = crash.message
        record.crash_exit_code = crash.exit_code

    def authorized(self, authorization: str | None) -> bool:
        if self._api_key is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(token.strip().encode(), self._api_key.encode())

    # -- inventory --------------------------------------------------------------------------

    @staticmethod
    def _checked_inventory(offers: Iterable[InventoryOffer]) -> tuple[InventoryOffer, ...]:
        result = tuple(offers)
        keys = [(o.gpu_type, o.region) for o in result]
        if len(set(keys)) != len(keys):
            raise ValueError("the inventory lists a (gpu_type, region) twice")
        return result

    def set_inventory(self, offers: Iterable[InventoryOffer]) -> None:
        checked = self._checked_inventory(offers)
        self._inventory = {(o.gpu_type, o.region): o for o in checked}

    def inventory(self) -> list[InventoryOffer]:
        return list(self._inventory.values())

    def _free(self, offer: InventoryOffer, used: Mapping[tuple[str, str], int]) -> int:
        """Free GPUs of an offer now: its count (shrunk by any capacity outage of the
        scenario) minus what live instances hold."""
        count = offer.count
        elapsed = self.clock() - self._scenario_t0
        for outage in self.scenario_faults.capacity_outages:
            if outage.covers(gpu_type=offer.gpu_type, region=offer.region) and outage.active(
                elapsed=elapsed
            ):
                count = min(count, outage.count)
        return max(0, count - used.get((offer.gpu_type, offer.region), 0))

    def _used(self) -> dict[tuple[str, str], int]:
        used: dict[tuple[str, str], int] = {}
        for r in self._live.values():
            key = (r.gpu_type, r.region)
            used[key] = used.get(key, 0) + r.gpu_count
        return used

    def capacity(self) -> list[dict[str, Any]]:
        self._tick()
        used = self._used()
        return [
            {
                "gpu_type": o.gpu_type,
                "region": o.region,
                "total": o.count,
                "available": self._free(o, used),
                "price_per_gpu_hour": o.price_per_gpu_hour,
            }
            for o in self._inventory.values()
        ]

    # -- instances --------------------------------------------------------------------------

    def create(self, body: CreateBody) -> tuple[dict[str, Any], bool]:
        """Create an instance, or return the live one with that name; True when created."""
        now = self._tick()
        for existing in self._live.values():
            if existing.name == body.name:
                return self._instance_json(existing), False
        if not body.image.strip():
            raise MockCloudError(status=400, code="invalid_spec", message="image is empty")
        known_types = {o.gpu_type for o in self._inventory.values()}
        if body.gpu_type is not None and body.gpu_type not in known_types:
            raise MockCloudError(
                status=400, code="invalid_spec", message=f"unknown gpu_type {body.gpu_type!r}"
            )
        if body.gpu_count > self.max_gpus_per_instance:
            raise MockCloudError(
                status=400,
                code="invalid_spec",
                message=f"gpu_count {body.gpu_count} exceeds the maximum of "
                f"{self.max_gpus_per_instance} per instance",
            )
        run_seconds = _parse_tag_float(body.tags, TAG_RUN_SECONDS, lo=0.0, hi=math.inf)
        exit_code = _parse_tag_float(body.tags, TAG_EXIT_CODE, lo=0, hi=255)
        load = _parse_tag_float(body.tags, TAG_GPU_UTILIZATION, lo=0.0, hi=1.0)
        offer = self._choose_offer(body)
        if self.quota_gpus is not None:
            held = sum(r.gpu_count for r in self._live.values())
            if held + body.gpu_count > self.quota_gpus:
                raise MockCloudError(
                    status=402,
                    code="quota_exceeded",
                    message=f"GPU quota of {self.quota_gpus} exceeded ({held} in use)",
                )
        self._seq += 1
        digest = hashlib.sha256(f"{self._id_salt}:{self.seed}:{self._seq}".encode()).hexdigest()
        record = _Record(
            id=f"mi-{digest[:12]}",
            seq=self._seq,
            name=body.name,
            image=body.image,
            gpu_type=offer.gpu_type,
            gpu_count=body.gpu_count,
            region=offer.region,
            price_per_gpu_hour=offer.price_per_gpu_hour,
            env_count=len(body.env),
            ports=tuple(p.container_port for p in body.ports),
            published=_publish(body.ports),
            tags=dict(body.tags),
            created=now,
            boot_at=now + max(0.0, self.boot_delay),
            run_seconds=run_seconds,
            run_exit_code=int(exit_code or 0),
            load=load,
        )
        self._draw_crash(record, after=record.boot_at)
        record.advance(now=now)
        self._live[record.id] = record
        self._all.append(record)
        lost = self.scenario_faults.lost_create_responses
        if lost.rate and self.rng.random() < lost.rate:
            self._count("lost_creates")
            raise LostResponse(mode=lost.mode)
        return self._instance_json(record), True

    def _choose_offer(self, body: CreateBody) -> InventoryOffer:
        what = body.gpu_type or "GPU"
        candidates = [
            o
            for o in self._inventory.values()
            if body.gpu_type in (None, o.gpu_type) and body.region in (None, o.region)
            and (body.region is not None or not body.regions or o.region in body.regions)
        ]
        if not candidates:
            raise MockCloudError(
                status=409,
                code="capacity_unavailable",
                message=f"no {what} offer in region {body.region}",
            )
        used = self._used()
        free = [o for o in candidates if self._free(o, used) >= body.gpu_count]
        if not free:
            if any(
                o.count - used.get((o.gpu_type, o.region), 0) >= body.gpu_count
                for o in candidates
            ):
                self._count("capacity_refusals")
            where = f"region {body.region}" if body.region else "any region"
            raise MockCloudError(
                status=409,
                code="capacity_unavailable",
                message=f"not enough free {what} for {body.gpu_count} in {where}",
            )
        if body.max_price_per_hour is not None:
            limit = body.max_price_per_hour
            free = [o for o in free if o.price_per_gpu_hour * body.gpu_count <= limit + 1e-9]
            if not free:
                raise MockCloudError(
                    status=409,
                    code="capacity_unavailable",
                    message=f"no {what} at or below {limit}/hour",
                )
        return min(free, key=lambda o: (o.price_per_gpu_hour, o.region, o.gpu_type))

    def _instance_json(self, r: _Record) -> dict[str, Any]:
        state = "terminating" if r.deleting is not None else r.phase.value
        message = r.message
        if message is None:
            if r.deleting is not None:
                message = "deleting"
            elif r.phase is _Phase.PENDING:
                message = "booting"
            elif r.phase is _Phase.EXITED:
                message = f"exited with code {r.exit_code}"
        endpoints = [f"https://{r.id}.mock.invalid"] + [f"{r.ip}:{p}" for p in r.ports]
        return {
            "id": r.id,
            "name": r.name,
            "state": state,
            "tags": dict(r.tags),
            "image": r.image,
            "gpu_type": r.gpu_type,
            "gpu_count": r.gpu_count,
            "region": r.region,
            "price_per_hour": r.price_per_hour,
            "ip": r.ip,
            "endpoints": endpoints,
            "public_ip": r.public_ip,
            "ports": [
                {"container_port": port, "protocol": protocol, "public_port": public}
                for port, protocol, public in r.published
            ],
            "created_at": self._iso(r.created),
            "started_at": self._iso(r.started),
            "finished_at": self._iso(r.finished),
            "exit_code": r.exit_code,
            "message": message,
            "restart_count": 0,
        }

    def _live_record(self, instance_id: str) -> _Record:
        self._tick()
        record = self._live.get(instance_id)
        if record is None:
            raise _not_found(instance_id)
        return record

    def get(self, instance_id: str) -> dict[str, Any]:
        return self._instance_json(self._live_record(instance_id))

    def list_instances(
        self, *, tags: Mapping[str, str] | None = None, name: str | None = None
    ) -> list[dict[str, Any]]:
        now = self._tick()
        wanted = dict(tags or {})
        lag = self.scenario_faults.list_lag_seconds
        return [
            self._instance_json(r)
            for r in self._live.values()
            if (name is None or r.name == name)
            and all(r.tags.get(k) == v for k, v in wanted.items())
            and now >= r.created + lag
        ]

    def delete(self, instance_id: str) -> dict[str, Any] | None:
        """Start deleting; the instance while it terminates, or None when it is gone at once."""
        record = self._live_record(instance_id)
        now = self.clock()
        if record.deleting is None:
            deletes = self.scenario_faults.deletes
            delay = max(0.0, self.delete_delay)
            if deletes.slow_rate and self.rng.random() < deletes.slow_rate:
                self._count("slow_deletes")
                delay += deletes.slow_seconds
            record.delete_fails = bool(deletes.fail_rate and self.rng.random() < deletes.fail_rate)
            if record.delete_fails:
                self._count("failed_deletes")
            record.deleting = now
            record.delete_done = now + delay
            record.advance(now=now)
        if record.released is not None:
            del self._live[record.id]
            return None
        return self._instance_json(record)

    def fail(self, instance_id: str, *, message: str, exit_code: int | None = None) -> None:
        """Make the container fail now (crash, preemption, image pull error, ...)."""
        record = self._stoppable(instance_id)
        record.phase = _Phase.FAILED
        record.finished = self.clock()
        record.exit_code = exit_code
        record.message = message

    def exit(self, instance_id: str, *, exit_code: int) -> None:
        """Make the container exit now with ``exit_code``."""
        record = self._stoppable(instance_id)
        now = self.clock()
        if record.started is None:
            record.started = now
        record.phase = _Phase.EXITED
        record.finished = now
        record.exit_code = exit_code

    def set_load(self, instance_id: str, *, gpu_utilization: float | None) -> None:
        if gpu_utilization is not None and not 0.0 <= gpu_utilization <= 1.0:
            raise MockCloudError(
                status=400, code="invalid_spec", message="gpu_utilization must be in [0, 1]"
            )
        self._live_record(instance_id).load = gpu_utilization

    def _stoppable(self, instance_id: str) -> _Record:
        record = self._live_record(instance_id)
        if record.deleting is not None or record.phase in (_Phase.EXITED, _Phase.FAILED):
            raise MockCloudError(
                status=409, code="invalid_state", message=f"instance {instance_id} already stopped"
            )
        return record

    # -- logs and metrics -------------------------------------------------------------------

    def log_view(self, instance_id: str) -> tuple[_LogView, bool]:
        """The instance's log so far, and whether it will print no more lines."""
        record = self._live_record(instance_id)
        done = record.deleting is not None or record.phase in (_Phase.EXITED, _Phase.FAILED)
        return _LogView(record, now=self.clock()), done

    def format_line(self, line: _LogLine, *, timestamps: bool) -> bytes:
        if not timestamps:
            return f"{line.text}\n".encode()
        wall = self.wall(line.at)
        stamp = f"{wall:%Y-%m-%dT%H:%M:%S}.{wall.microsecond:06d}000Z"
        return f"{stamp} {line.text}\n".encode()

    def metrics(self, instance_id: str) -> dict[str, Any]:
        return self._metrics_json(self._live_record(instance_id), now=self.clock())

    def metrics_all(self, *, tags: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """GPU figures of every live instance carrying ``tags``, in one answer."""
        now = self._tick()
        wanted = dict(tags or {})
        return [self._metrics_json(r, now=now) for r in self._live.values()
                if all(r.tags.get(k) == v for k, v in wanted.items())]

    def _metrics_json(self, record: _Record, *, now: float) -> dict[str, Any]:
        running = record.phase is _Phase.RUNNING and record.deleting is None
        base = record.load
        if base is None:
            base = random.Random(f"{self.seed}:{record.id}").uniform(0.55, 0.95)
        bucket = 0
        if record.started is not None:
            bucket = int((now - record.started) // _METRICS_BUCKET_SECONDS)
        memory_total = _GPU_MEMORY.get(record.gpu_type, _DEFAULT_MEMORY)
        watts = _GPU_WATTS.get(record.gpu_type, _DEFAULT_WATTS)
        gpus = []
        for index in range(record.gpu_count):
            rng = random.Random(f"{self.seed}:{record.id}:{index}:{bucket}")
            util = min(1.0, max(0.0, base + rng.uniform(-0.03, 0.03))) if running else 0.0
            gpus.append(
                {
                    "index": index,
                    "uuid": f"GPU-{record.id}-{index}",
                    "gpu_type": record.gpu_type,
                    "gpu_utilization": round(util * 100.0, 1),
                    "tensor_active": round(util * 0.8, 3),
                    "memory_used_bytes": int(memory_total * (0.05 + 0.85 * util)) if running else 0,
                    "memory_total_bytes": memory_total,
                    "temperature_c": round(32.0 + 48.0 * util, 1),
                    "power_w": round(watts * (0.1 + 0.9 * util), 1),
                }
            )
        state = "terminating" if record.deleting is not None else record.phase.value
        return {"instance_id": record.id, "state": state, "at": self._iso(now), "gpus": gpus}

    # -- accounting -------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        self._tick()
        result = {f"{endpoint}_calls": self.calls.get(endpoint, 0) for endpoint in ENDPOINTS}
        injected = {**self.injected, "crashes": sum(1 for r in self._all if r.crashed)}
        for kind in _INJECTED_KINDS:
            result[f"injected_{kind}"] = injected.get(kind, 0)
        result.update(
            unauthorized_calls=self.unauthorized_calls,
            faults_injected=self.faults.injected + sum(injected.values()),
            instances_created=len(self._all),
            live_instances=len(self._live),
        )
        return result

    def ledger(self) -> dict[str, Any]:
        now = self._tick()
        entries = []
        for r in self._all:
            if r.released is not None:
                state = "deleted"
            elif r.deleting is not None:
                state = "terminating"
            else:
                state = r.phase.value
            entries.append(
                {
                    "id": r.id,
                    "name": r.name,
                    "uid": r.tags.get(TAG_UID),
                    "gpu_type": r.gpu_type,
                    "gpu_count": r.gpu_count,
                    "region": r.region,
                    "price_per_hour": r.price_per_hour,
                    "state": state,
                    "exit_code": r.exit_code,
                    "created_at": self._iso(r.created),
                    "started_at": self._iso(r.started),
                    "stopped_at": self._iso(r.released),
                    "cost": round(r.cost(now=now), 6),
                }
            )
        total = round(sum(r.cost(now=now) for r in self._all), 6)
        return {
            "create_calls": self.calls.get("create", 0),
            "total_cost": total,
            "instances": entries,
        }

    def config(self) -> dict[str, Any]:
        return {
            "boot_delay": self.boot_delay,
            "delete_delay": self.delete_delay,
            "quota_gpus": self.quota_gpus,
            "max_gpus_per_instance": self.max_gpus_per_instance,
        }

    def reset(self) -> None:
        """Back to the state as constructed (instance ids keep counting up)."""
        self.set_inventory(self._initial_inventory)
        (self.boot_delay, self.delete_delay, self.quota_gpus, self.max_gpus_per_instance) = (
            self._initial_knobs
        )
        self._live.clear()
        self._all.clear()
        self.calls.clear()
        self.unauthorized_calls = 0
        self.faults.clear()
        self.faults.injected = 0
        self.injected.clear()
        self.seed = self._initial_seed
        self.rng = random.Random(self.seed)
        self.scenario_faults = Faults()
        self._scenario = None
        self._scenario_t0 = self.clock()
        if self._initial_scenario is not None:
            self.apply_scenario(self._initial_scenario)


# -- request bodies ---------------------------------------------------------------------------


class PortBody(BaseModel):
    container_port: int = Field(ge=1, le=65535)
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    name: str | None = None


class CreateBody(BaseModel):
    """The create request; unknown fields are ignored so newer clients keep working."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=253)
    image: str = Field(min_length=1)
    gpu_count: int = Field(ge=1)
    gpu_type: str | None = None
    region: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    ports: list[PortBody] = Field(default_factory=list)
    cpu_millis: int = Field(default=0, ge=0)
    memory_bytes: int = Field(default=0, ge=0)
    max_price_per_hour: float | None = Field(default=None, ge=0)
    regions: list[str] | None = None  # without ``region``: choose only among these
    tags: dict[str, str] = Field(default_factory=dict)


class FailBody(BaseModel):
    message: str = "failed"
    exit_code: int | None = None


class ExitBody(BaseModel):
    exit_code: int = 0


class LoadBody(BaseModel):
    gpu_utilization: float | None = Field(default=None, ge=0.0, le=1.0)


class OfferBody(BaseModel):
    gpu_type: str = Field(min_length=1)
    region: str = Field(min_length=1)
    count: int = Field(ge=0)
    price_per_gpu_hour: float = Field(ge=0)


class InventoryBody(BaseModel):
    offers: list[OfferBody]


class FaultBody(BaseModel):
    endpoint: str
    status: int = Field(ge=400, le=599)
    count: int = Field(default=1, ge=1)
    retry_after: float | None = Field(default=None, ge=0)


class ConfigBody(BaseModel):
    boot_delay: float | None = Field(default=None, ge=0)
    delete_delay: float | None = Field(default=None, ge=0)
    quota_gpus: int | None = Field(default=None, ge=0)
    max_gpus_per_instance: int | None = Field(default=None, ge=1)


# -- the HTTP layer ---------------------------------------------------------------------------


_Body = TypeVar("_Body", bound=BaseModel)


def _describe_errors(errors: Iterable[Mapping[str, Any]]) -> str:
    """Say what is wrong by location only: pydantic's default echoes the input (maybe a secret)."""
    problems = []
    for err in errors:
        loc = ".".join(str(part) for part in err.get("loc", ()) if part != "body")
        problems.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"


async def _json_body(request: Request) -> Any:
    """The request's JSON body; a 422 naming ``body`` when it is not JSON."""
    try:
        return await request.json()
    except ValueError:
        raise MockCloudError(
            status=422, code="invalid_spec", message="body: not valid JSON"
        ) from None


async def _parse_body(request: Request, model: type[_Body]) -> _Body:
    """The request's JSON body as ``model``; parsed after admission so auth is checked first."""
    raw = await _json_body(request)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise MockCloudError(
            status=422, code="invalid_spec", message=_describe_errors(exc.errors())
        ) from None


def _error_response(error: MockCloudError) -> JSONResponse:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = format(error.retry_after, "g")
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(
        {"error": {"code": error.code, "message": error.message}},
        status_code=error.status,
        headers=headers,
    )


class _Disconnect(Response):
    """Starts a 201 answer, sends half of it and stops: the server drops the connection.

    Over real HTTP (uvicorn) the client sees the connection closed mid-response; through
    ``httpx.ASGITransport`` it sees a truncated body. Uvicorn logs the incomplete response.
    """

    def __init__(self) -> None:
        super().__init__(status_code=201)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"id": ', "more_body": True})


def _parse_tag_filters(raw: list[str]) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MockCloudError(
                status=400, code="invalid_request", message="a tag filter is key=value"
            )
        tags[key] = value
    return tags


def create_app(*, state: MockCloudState) -> FastAPI:
    """The mock cloud's HTTP API over ``state`` (see the module docstring)."""
    app = FastAPI(
        title="vkprovider mock GPU cloud", docs_url=None, redoc_url=None, openapi_url=None
    )

    async def on_cloud_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MockCloudError)
        if isinstance(exc, LostResponse) and exc.mode == "disconnect":
            return _Disconnect()
        return _error_response(exc)

    async def on_validation_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _error_response(
            MockCloudError(status=422, code="invalid_spec", message=_describe_errors(exc.errors()))
        )

    async def on_http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = "not_found" if exc.status_code == 404 else "http_error"
        return _error_response(
            MockCloudError(status=exc.status_code, code=code, message=str(exc.detail))
        )

    app.add_exception_handler(MockCloudError, on_cloud_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)

    # Admission (count, auth, faults) runs as a route dependency: before query and body
    # validation, so an unauthenticated request gets 401 whatever it sends.
    def admitted(endpoint: str) -> Any:
        async def admit(request: Request) -> None:
            authorization = request.headers.get("authorization")
            hang = state.admit(endpoint=endpoint, authorization=authorization)
            if hang > 0:
                await state.sleep(hang)

        return Depends(admit)

    async def admin(request: Request) -> None:
        if not state.authorized(request.headers.get("authorization")):
            raise MockCloudError(
                status=401, code="unauthorized", message="missing or invalid API key"
            )

    admin_only = [Depends(admin)]

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.get("/capacity", dependencies=[admitted("capacity")])
    async def capacity() -> JSONResponse:
        return JSONResponse({"offers": state.capacity()})

    @app.post("/instances", dependencies=[admitted("create")])
    async def create_instance(request: Request) -> JSONResponse:
        body = await _parse_body(request, CreateBody)
        instance, created = state.create(body)
        return JSONResponse(instance, status_code=201 if created else 200)

    @app.get("/instances", dependencies=[admitted("list")])
    async def list_instances(
        tag: list[str] = Query(default_factory=list),  # noqa: B008
        name: str | None = None,
    ) -> JSONResponse:
        instances = state.list_instances(tags=_parse_tag_filters(tag), name=name)
        return JSONResponse({"instances": instances})

    @app.get("/instances/{instance_id}", dependencies=[admitted("get")])
    async def get_instance(instance_id: str) -> JSONResponse:
        return JSONResponse(state.get(instance_id))

    @app.delete("/instances/{instance_id}", dependencies=[admitted("delete")])
    async def delete_instance(instance_id: str) -> Response:
        instance = state.delete(instance_id)
        if instance is None:
            return Response(status_code=204)
        return JSONResponse(instance, status_code=202)

    @app.get("/instances/{instance_id}/logs", dependencies=[admitted("logs")])
    async def logs(
        request: Request,
        instance_id: str,
        tail_lines: int | None = Query(default=None, ge=0),
        since_seconds: int | None = Query(default=None, ge=0),
        timestamps: bool = False,
        limit_bytes: int | None = Query(default=None, ge=1),
        follow: bool = False,
    ) -> StreamingResponse:
        view, done = state.log_view(instance_id)  # 404 before the stream starts
        start = 0
        if since_seconds is not None:
            start = view.first_at_or_after(state.now() - since_seconds)
        if tail_lines is not None:
            start = max(start, len(view) - tail_lines)

        async def stream() -> AsyncIterator[bytes]:
            budget = limit_bytes
            current, finished, index = view, done, start
            deadline = state.now() + state.follow_max_seconds
            while True:
                chunk = b"".join(
                    state.format_line(current[i], timestamps=timestamps)
                    for i in range(index, len(current))
                )
                index = len(current)
                if budget is not None:
                    chunk = chunk[:budget]
                    budget -= len(chunk)
                if chunk:
                    yield chunk
                if not follow or finished or budget == 0 or state.now() >= deadline:
                    return
                await state.sleep(state.follow_poll_interval)
                if await request.is_disconnected():
                    return
                try:
                    current, finished = state.log_view(instance_id)
                except MockCloudError:
                    return  # deleted while following

        return StreamingResponse(stream(), media_type="text/plain; charset=utf-8")

    @app.get("/instances/{instance_id}/metrics", dependencies=[admitted("metrics")])
    async def metrics(instance_id: str) -> JSONResponse:
        return JSONResponse(state.metrics(instance_id))

    @app.get("/gpu-metrics", dependencies=[admitted("metrics")])
    async def metrics_all(
        tag: list[str] = Query(default_factory=list),  # noqa: B008
    ) -> JSONResponse:
        return JSONResponse({"instances": state.metrics_all(tags=_parse_tag_filters(tag))})

    # -- admin ------------------------------------------------------------------------------

    @app.post("/admin/instances/{instance_id}/fail", dependencies=admin_only)
    async def admin_fail(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, FailBody)
        state.fail(instance_id, message=body.message, exit_code=body.exit_code)
        return JSONResponse(state.get(instance_id))

    @app.post("/admin/instances/{instance_id}/exit", dependencies=admin_only)
    async def admin_exit(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, ExitBody)
        state.exit(instance_id, exit_code=body.exit_code)
        return JSONResponse(state.get(instance_id))

    @app.post("/admin/instances/{instance_id}/load", dependencies=admin_only)
    async def admin_load(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, LoadBody)
        state.set_load(instance_id, gpu_utilization=body.gpu_utilization)
        return JSONResponse(state.get(instance_id))

    def inventory_json() -> dict[str, Any]:
        return {
            "offers": [
                {
                    "gpu_type": o.gpu_type,
                    "region": o.region,
                    "count": o.count,
                    "price_per_gpu_hour": o.price_per_gpu_hour,
                }
                for o in state.inventory()
            ]
        }

    @app.get("/admin/inventory", dependencies=admin_only)
    async def admin_get_inventory() -> JSONResponse:
        return JSONResponse(inventory_json())

    @app.put("/admin/inventory", dependencies=admin_only)
    async def admin_put_inventory(request: Request) -> JSONResponse:
        body = await _parse_body(request, InventoryBody)
        try:
            state.set_inventory(InventoryOffer(**o.model_dump()) for o in body.offers)
        except ValueError as exc:
            raise MockCloudError(status=400, code="invalid_request", message=str(exc)) from None
        return JSONResponse(inventory_json())

    @app.get("/admin/config", dependencies=admin_only)
    async def admin_get_config() -> JSONResponse:
        return JSONResponse(state.config())

    @app.patch("/admin/config", dependencies=admin_only)
    async def admin_patch_config(request: Request) -> JSONResponse:
        body = await _parse_body(request, ConfigBody)
        fields = body.model_fields_set
        if "boot_delay" in fields:
            state.boot_delay = body.boot_delay or 0.0
        if "delete_delay" in fields:
            state.delete_delay = body.delete_delay or 0.0
        if "quota_gpus" in fields:
            state.quota_gpus = body.quota_gpus
        if "max_gpus_per_instance" in fields and body.max_gpus_per_instance is not None:
            state.max_gpus_per_instance = body.max_gpus_per_instance
        return JSONResponse(state.config())

    @app.get("/admin/faults", dependencies=admin_only)
    async def admin_get_faults() -> JSONResponse:
        return JSONResponse({"faults": [f.to_json() for f in state.faults.pending()]})

    @app.post("/admin/faults", dependencies=admin_only)
    async def admin_add_fault(request: Request) -> JSONResponse:
        body = await _parse_body(request, FaultBody)
        try:
            state.faults.add(
                endpoint=body.endpoint,
                status=body.status,
                count=body.count,
                retry_after=body.retry_after,
            )
        except ValueError as exc:
            raise MockCloudError(status=400, code="invalid_request", message=str(exc)) from None
        return JSONResponse(
            {"faults": [f.to_json() for f in state.faults.pending()]}, status_code=201
        )

    @app.delete("/admin/faults", dependencies=admin_only)
    async def admin_clear_faults() -> Response:
        state.faults.clear()
        return Response(status_code=204)

    @app.get("/admin/scenario", dependencies=admin_only)
    async def admin_get_scenario() -> JSONResponse:
        return JSONResponse(state.scenario())

    @app.put("/admin/scenario", dependencies=admin_only)
    async def admin_put_scenario(request: Request) -> JSONResponse:
        raw = await _json_body(request)
        try:
            state.apply_scenario(parse_scenario(raw, source="body"))
        except ScenarioError as exc:
            raise MockCloudError(status=422, code="invalid_spec", message=str(exc)) from None
        except ValueError as exc:
            raise MockCloudError(status=400, code="invalid_request", message=str(exc)) from None
        return JSONResponse(state.scenario())

    @app.delete("/admin/scenario", dependencies=admin_only)
    async def admin_clear_scenario() -> Response:
        state.clear_faults()
        return Response(status_code=204)

    @app.get("/admin/stats", dependencies=admin_only)
    async def admin_stats() -> JSONResponse:
        return JSONResponse(state.stats())

    @app.get("/admin/ledger", dependencies=admin_only)
    async def admin_ledger() -> JSONResponse:
        return JSONResponse(state.ledger())

    @app.post("/admin/reset", dependencies=admin_only)
    async def admin_reset() -> Response:
        state.reset()
        return Response(status_code=204)

    return app


def startup_line(*, url: str, state: MockCloudState) -> str:
    """The one line ``vkprovider mock-cloud`` prints once it listens: where, and what it sells."""
    offers = ", ".join(
        f"{o.count} {o.gpu_type} in {o.region} at ${o.price_per_gpu_hour:g}/GPU-h"
        for o in state.inventory()
    )
    key = "an API key is required" if state._api_key else "no API key needed"
    return f"mock cloud listening on {url}, selling {offers or 'nothing'}; {key}"


async def serve(
    *,
    host: str,
    port: int,
    state: MockCloudState,
    log_level: str = "warning",
    announce: Callable[[str], None] | None = None,
) -> None:
    """Run the mock cloud with uvicorn until cancelled or signalled (await it).

    ``announce`` is called once with :func:`startup_line` when the port is listening.
    """
    config = uvicorn.Config(
        create_app(state=state),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    watcher = (
        asyncio.ensure_future(_announce_once_listening(server, state=state, announce=announce))
        if announce is not None
        else None
    )
    try:
        await server.serve()  # a port it cannot bind exits as uvicorn decides (status 3)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _announce_once_listening(
    server: uvicorn.Server, *, state: MockCloudState, announce: Callable[[str], None]
) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    address = f"[{host}]" if ":" in host else host
    announce(startup_line(url=f"http://{address}:{port}", state=state))

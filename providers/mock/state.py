"""The mock cloud's whole state: inventory, instances, ledger, counters, faults and knobs.

Why it exists: this is the cloud itself, apart from its HTTP face (:mod:`providers.mock.app`):
tests can hold a :class:`MockCloudState`, steer it (inventory, delays, faults, a scenario) and
read the truth (ledger, stats) without going through HTTP. Everything lives in one object (no
module-level singletons; several clouds can run in one process). Time comes from an injectable
monotonic clock and lifecycle transitions are computed lazily from timestamps, so unit tests
advance a :class:`ManualClock` instead of sleeping. The methods never ``await`` while mutating,
so they are atomic under asyncio without locks.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import heapq
import hmac
import itertools
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from providers.base import TAG_UID
from providers.mock.bodies import CreateBody
from providers.mock.edge import EDGE_PORT, EdgeSettings
from providers.mock.errors import (
    FAULT_CODES,
    LostResponse,
    MockCloudError,
    describe_errors,
    not_found,
)
from providers.mock.faults import ENDPOINTS, INJECTED_KINDS, FaultPlan
from providers.mock.gpumetrics import metrics_json
from providers.mock.listeners import ListenerSet
from providers.mock.logs import LogLine, LogView, format_line
from providers.mock.records import (
    PUBLIC_BLOCKS,
    TAG_EXIT_CODE,
    TAG_GPU_UTILIZATION,
    TAG_RUN_SECONDS,
    Phase,
    Record,
    publish_ports,
)
from providers.mock.scenario import Faults, Scenario, ScenarioError

__all__ = [
    "DEFAULT_INVENTORY",
    "ENV_LOAD_SECONDS",
    "InventoryOffer",
    "ManualClock",
    "MockCloudState",
]

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
    """``count`` GPUs of one type in one region, sold at ``price_per_gpu_hour``.

    With ``spot_price_per_gpu_hour`` the same GPUs are also sold as interruptible (spot)
    instances at that price: one pool, two ways to rent it (``capacity`` lists both).
    """

    gpu_type: str
    region: str
    count: int
    price_per_gpu_hour: float
    spot_price_per_gpu_hour: float | None = None

    def __post_init__(self) -> None:
        if not self.gpu_type or not self.region:
            raise ValueError("an offer needs a gpu_type and a region")
        if self.count < 0 or self.price_per_gpu_hour < 0 or (
                self.spot_price_per_gpu_hour is not None and self.spot_price_per_gpu_hour < 0):
            raise ValueError("an offer's count and prices cannot be negative")

    def price(self, *, interruptible: bool) -> float | None:
        """Its price per GPU-hour for that kind of instance; None when not sold that way."""
        return self.spot_price_per_gpu_hour if interruptible else self.price_per_gpu_hour


DEFAULT_INVENTORY: tuple[InventoryOffer, ...] = (
    InventoryOffer(gpu_type="H100", region="us-east", count=16, price_per_gpu_hour=2.49),
    InventoryOffer(gpu_type="H100", region="eu-west", count=8, price_per_gpu_hour=2.19),
    InventoryOffer(gpu_type="A100", region="us-east", count=16, price_per_gpu_hour=1.29),
    InventoryOffer(gpu_type="A100", region="us-west", count=8, price_per_gpu_hour=1.19),
    InventoryOffer(gpu_type="L40S", region="eu-west", count=8, price_per_gpu_hour=0.89),
    InventoryOffer(gpu_type="L4", region="us-east", count=32, price_per_gpu_hour=0.44),
)


#: The container env variable that sets the instance's model server load time (seconds); the
#: one env value the mock reads (the others are never stored).
ENV_LOAD_SECONDS = "MOCK_LOAD_SECONDS"


def _parse_tag_float(tags: Mapping[str, str], key: str, *, lo: float, hi: float) -> float | None:
    return _parse_float(tags, key, what="tag", lo=lo, hi=hi)


def _parse_float(
    values: Mapping[str, str], key: str, *, what: str, lo: float, hi: float
) -> float | None:
    raw = values.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:  # also rejects NaN
        raise MockCloudError(
            status=400, code="invalid_spec",
            message=f"{what} {key} must be a number in [{lo}, {hi}]",
        )
    return value



def image_registry(image: str) -> str:
    """The registry host of an image reference, as the kubelet reads it (``docker.io`` when the
    first path part names no host)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first.lower()
    return "docker.io"

class MockCloudState:
    """The whole mock cloud: inventory, instances, ledger, counters, faults and knobs.

    The knobs are plain attributes, changeable at any time: ``boot_delay`` and ``delete_delay``
    (seconds; 0 means at once), ``quota_gpus`` (max GPUs held at once, None for no quota),
    ``max_gpus_per_instance``, ``follow_poll_interval`` and ``follow_max_seconds`` (for followed
    logs; both on the injected clock), ``load_seconds`` (how long each container's model server
    answers 503 after it starts; the container env ``MOCK_LOAD_SECONDS`` overrides it per
    instance). ``faults`` arms scripted failures.

    Real listeners (:mod:`providers.mock.listeners`) serve each running container's TCP ports
    once :meth:`start_listeners` was called in a running event loop (``serve`` and the
    ``mock_cloud`` fixture do) until :meth:`aclose_listeners`; with ``address_map_dir`` their
    routes are published there as ``mock-<name>.json``.

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
        load_seconds: float = 0.0,
        name: str = "mock",
        address_map_dir: Path | str | None = None,
        public_block: int = 0,
        edge: EdgeSettings | None = None,
    ) -> None:
        if not 0 <= public_block < PUBLIC_BLOCKS:
            raise ValueError(f"public_block must be in 0..{PUBLIC_BLOCKS - 1}, got {public_block}")
        self.public_block = public_block
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
        self._initial_load_seconds = load_seconds
        self.load_seconds: float = load_seconds
        self.name = name
        self._private: dict[str, tuple[str, str]] = {}  # host -> (user, sha256 of password)
        self.listeners = ListenerSet(
            clock=clock,
            address_map_dir=None if address_map_dir is None else Path(address_map_dir),
            owner=f"mock-{name}",
        )
        # hostname-only mode (providers/mock/edge.py): no IP mapping, an HTTPS edge per port
        self.edge = edge
        self.listeners.edge = edge
        self.follow_poll_interval = follow_poll_interval
        self.follow_max_seconds = follow_max_seconds
        self.faults = FaultPlan()
        self.rng = random.Random(seed)
        self.scenario_faults = Faults()
        self._scenario: Scenario | None = None
        self._scenario_t0 = self._t0
        self.injected: dict[str, int] = {}
        self._vanished: dict[int, int] = {}  # vanish entry -> instances it took (scenario)
        self._after_loss: collections.deque[int] = collections.deque()  # scenario: see create
        self._seq = 0
        self._inventory: dict[tuple[str, str], InventoryOffer] = {}
        self._live: dict[str, Record] = {}
        # Indexes over _live, kept by _add/_remove, so that a create or a delete costs the same
        # at 5,000 instances as at 5 (the burst bench measures the mock's CPU beside ours):
        self._names: dict[str, str] = {}  # name -> id
        self._releasing: set[str] = set()  # ids whose delete was asked, not yet released
        # When each live record next changes by itself (Record.next_change), as a heap with
        # lazy deletion: the entry in ``_due_at`` is the one that counts. A tick (ten a
        # second, and before every list) then advances the records that are due, not every
        # live one: at 5,000 instances the full walk was a fifth of the mock's CPU.
        self._due: list[tuple[float, int, str]] = []
        self._due_at: dict[str, float] = {}
        self._due_seq = itertools.count()
        self._held: dict[tuple[str, str], int] = {}  # (gpu type, region) -> GPUs of live ones
        self._all: list[Record] = []
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
        """Apply every live instance's transitions due by now (see :meth:`_advance`)."""
        now = self.clock()
        due, heap, due_at = [], self._due, self._due_at
        while heap and heap[0][0] <= now:
            at, _, instance_id = heapq.heappop(heap)
            if due_at.get(instance_id) != at:
                continue  # rescheduled since: a later entry counts
            del due_at[instance_id]
            record = self._live.get(instance_id)
            if record is not None:
                due.append(record)
        if due:
            self._advance(due, now)
        if self.scenario_faults.vanish:
            self._vanish(now)
        return now

    def _vanish(self, now: float) -> None:
        """The scenario's vanishing instances (``faults.vanish``): released without a delete."""
        gone: list[Record] = []
        for index, rule in enumerate(self.scenario_faults.vanish):
            for record in list(self._live.values()):
                if self._vanished.get(index, 0) >= rule.count:
                    break
                if (record.deleting is None and record.run_started is not None
                        and now >= record.run_started + rule.after
                        and all(record.tags.get(k) == v for k, v in rule.tags.items())):
                    self._vanished[index] = self._vanished.get(index, 0) + 1
                    record.released = now
                    self._remove(record)
                    self._count("vanished")
                    gone.append(record)
        if gone:
            self.listeners.sync_changed(gone)

    def _schedule(self, record: Record) -> None:
        """Note when ``record`` next changes by itself; after anything that may move it."""
        at = record.next_change()
        if at == math.inf or record.id not in self._live:
            self._due_at.pop(record.id, None)
            return
        if self._due_at.get(record.id) != at:
            self._due_at[record.id] = at
            heapq.heappush(self._due, (at, next(self._due_seq), record.id))

    def _advance(self, records: list[Record], now: float) -> None:
        """Apply these records' transitions due by ``now``; the released leave the live set,
        and the listeners of those whose state changed open or close."""
        changed = []
        for record in records:
            phase, deleting = record.phase, record.deleting
            record.advance(now=now)
            if record.released is not None:
                self._remove(record)
                changed.append(record)
                continue
            self._schedule(record)
            if record.phase is not phase or record.deleting is not deleting:
                changed.append(record)
        if changed:
            self.listeners.sync_changed(changed)

    def _add(self, record: Record) -> None:
        self._live[record.id] = record
        self._names[record.name] = record.id
        key = (record.gpu_type, record.region)
        self._held[key] = self._held.get(key, 0) + record.gpu_count

    def _remove(self, record: Record) -> None:
        self._due_at.pop(record.id, None)
        if self._live.pop(record.id, None) is None:
            return
        if self._names.get(record.name) == record.id:
            del self._names[record.name]
        self._releasing.discard(record.id)
        key = (record.gpu_type, record.region)
        self._held[key] = self._held.get(key, 0) - record.gpu_count

    def tick(self, *, full: bool = True) -> None:
        """Apply every transition due by now (what the listeners' ticker calls); ``full`` also
        checks every listener against its container, not only those of changed records."""
        self._tick()
        if full:
            self.listeners.sync(self._live.values())

    # -- listeners --------------------------------------------------------------------------

    def start_listeners(self, *, interval: float = 0.1) -> None:
        """Serve the running containers' ports for real from now on (needs a running loop),
        ticking every ``interval`` seconds so boots and crashes open and close them."""
        self.listeners.start(tick=self.tick, interval=interval)
        self.tick()

    async def aclose_listeners(self) -> None:
        """Close every listener and connection and remove this cloud's routes."""
        await self.listeners.aclose()

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
                code=FAULT_CODES.get(own.error_status, "injected"),
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
                    spot_price_per_gpu_hour=o.spot_price_per_gpu_hour,
                )
                for o in scenario.inventory
            )
        if scenario.boot_delay is not None:
            self.boot_delay = scenario.boot_delay
        if scenario.delete_delay is not None:
            self.delete_delay = scenario.delete_delay
        if scenario.load_seconds is not None:
            self.load_seconds = scenario.load_seconds
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
                    f"faults: {describe_errors(exc.errors())}"
                ) from None
        self.scenario_faults = faults
        self._vanished = {}
        self._after_loss.clear()
        if self._scenario is not None:
            self._scenario = self._scenario.model_copy(update={"faults": faults})
        now = self.clock()
        self._scenario_t0 = now
        for record in self._live.values():
            self._draw_crash(record, after=max(now, record.boot_at))
            self._schedule(record)

    def clear_faults(self) -> None:
        """No random faults any more (the scripted :attr:`faults` are left as they are)."""
        self.set_faults(Faults())

    def scenario(self) -> dict[str, Any]:
        """The scenario in force, as JSON (what ``PUT /admin/scenario`` takes)."""
        base = self._scenario or Scenario()
        return base.model_copy(update={"faults": self.scenario_faults}).model_dump(mode="json")

    def _draw_crash(self, record: Record, *, after: float) -> None:
        crash = self.scenario_faults.crash
        if record.phase not in (Phase.PENDING, Phase.RUNNING) or record.deleting is not None:
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

    # ---- private registries (pull credentials) -------------------------------------------------

    def set_private_registry(self, host: str, *, username: str, password: str) -> None:
        """Make ``host`` private: images from it need these credentials. Only a digest of the
        password is kept."""
        digest = hashlib.sha256(password.encode()).hexdigest()
        self._private[host.lower()] = (username, digest)

    def remove_private_registry(self, host: str) -> bool:
        return self._private.pop(host.lower(), None) is not None

    def private_registries(self) -> list[str]:
        return sorted(self._private)

    def _check_pull(self, body: CreateBody) -> None:
        """The pull a real cloud would do: an image from a private registry needs its
        credentials; wrong or missing ones fail the create, naming the registry (never the
        credential)."""
        host = image_registry(body.image)
        want = self._private.get(host)
        if want is None:
            return
        auth = body.registry_auth
        if auth is None or auth.registry.lower() != host:
            raise MockCloudError(status=422, code="image_pull_denied",
                                 message=f"pull access denied for {body.image}: registry {host} "
                                         "needs credentials and none for it were sent")
        digest = hashlib.sha256(auth.password.get_secret_value().encode()).hexdigest()
        if not (hmac.compare_digest(auth.username, want[0])
                and hmac.compare_digest(digest, want[1])):
            raise MockCloudError(status=422, code="image_pull_denied",
                                 message=f"pull access denied for {body.image}: registry {host} "
                                         f"rejected the credentials of user {auth.username!r}")

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
        return self._held

    def capacity(self) -> list[dict[str, Any]]:
        self._tick()
        used = self._used()
        out = []
        for o in self._inventory.values():
            for interruptible in (False, True):
                price = o.price(interruptible=interruptible)
                if price is None:
                    continue
                out.append({
                    "gpu_type": o.gpu_type,
                    "region": o.region,
                    "total": o.count,
                    "available": self._free(o, used),
                    "price_per_gpu_hour": price,
                    "interruptible": interruptible,
                })
        return out

    # -- instances --------------------------------------------------------------------------

    def create(self, body: CreateBody) -> tuple[dict[str, Any], bool]:
        """Create an instance, or return the live one with that name; True when created."""
        # Only what a create depends on is brought up to date: which deletes have released
        # their GPUs, and the instance of the same name (idempotency).
        now = self.clock()
        if self._after_loss:  # scenario: what the creates after a lost answer get
            status = self._after_loss.popleft()
            self._count("errors")
            raise MockCloudError(status=status, code=FAULT_CODES.get(status, "injected"),
                                 message="injected fault on create (after a lost answer)")
        self._advance([self._live[i] for i in self._releasing if i in self._live], now)
        existing_id = self._names.get(body.name)
        existing = self._live.get(existing_id) if existing_id is not None else None
        if existing is not None:
            self._advance([existing], now)
            if existing.id in self._live:
                return self._instance_json(existing), False
        if not body.image.strip():
            raise MockCloudError(status=400, code="invalid_spec", message="image is empty")
        self._check_pull(body)
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
        load_seconds = _parse_float(body.env, ENV_LOAD_SECONDS, what="env",
                                    lo=0.0, hi=math.inf)
        offer = self._choose_offer(body)
        if self.quota_gpus is not None:
            held = sum(self._held.values())
            if held + body.gpu_count > self.quota_gpus:
                raise MockCloudError(
                    status=402,
                    code="quota_exceeded",
                    message=f"GPU quota of {self.quota_gpus} exceeded ({held} in use)",
                )
        self._seq += 1
        digest = hashlib.sha256(f"{self._id_salt}:{self.seed}:{self._seq}".encode()).hexdigest()
        record = Record(
            id=f"mi-{digest[:12]}",
            seq=self._seq,
            name=body.name,
            image=body.image,
            gpu_type=offer.gpu_type,
            gpu_count=body.gpu_count,
            region=offer.region,
            price_per_gpu_hour=offer.price(interruptible=body.interruptible) or 0.0,
            interruptible=body.interruptible,
            env_count=len(body.env),
            ports=tuple(p.container_port for p in body.ports),
            published=publish_ports(body.ports),
            public_block=self.public_block,
            public_host=next((f.host for f in self.scenario_faults.published_hosts
                              if all(body.tags.get(k) == v for k, v in f.tags.items())), None),
            tags=dict(body.tags),
            created=now,
            boot_at=now + max(0.0, self.boot_delay),
            run_seconds=run_seconds,
            run_exit_code=int(exit_code or 0),
            load=load,
            load_seconds=max(0.0, self.load_seconds) if load_seconds is None else load_seconds,
            registry_auth=(body.registry_auth.registry, body.registry_auth.username)
            if body.registry_auth is not None else None,
        )
        self._draw_crash(record, after=record.boot_at)
        record.advance(now=now)
        self._add(record)
        self._schedule(record)
        self._all.append(record)
        self.listeners.sync_one(record)
        lost = self.scenario_faults.lost_create_responses
        if lost.rate and self.rng.random() < lost.rate:
            self._count("lost_creates")
            self._after_loss = collections.deque(
                a.status for a in lost.then for _ in range(a.count))
            raise LostResponse(mode=lost.mode)
        return self._instance_json(record), True

    def _choose_offer(self, body: CreateBody) -> InventoryOffer:
        what = ("interruptible " if body.interruptible else "") + (body.gpu_type or "GPU")
        candidates = [
            o
            for o in self._inventory.values()
            if body.gpu_type in (None, o.gpu_type) and body.region in (None, o.region)
            and (body.region is not None or not body.regions or o.region in body.regions)
            and o.price(interruptible=body.interruptible) is not None
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
            free = [o for o in free
                    if (o.price(interruptible=body.interruptible) or 0.0) * body.gpu_count
                    <= limit + 1e-9]
            if not free:
                raise MockCloudError(
                    status=409,
                    code="capacity_unavailable",
                    message=f"no {what} at or below {limit}/hour",
                )
        return min(free, key=lambda o: (o.price(interruptible=body.interruptible) or 0.0,
                                        o.region, o.gpu_type))

    def _instance_json(self, r: Record) -> dict[str, Any]:
        state = "terminating" if r.deleting is not None else r.phase.value
        message = r.message
        if message is None:
            if r.deleting is not None:
                message = "deleting"
            elif r.phase is Phase.PENDING:
                message = "booting"
            elif r.phase is Phase.EXITED:
                message = f"exited with code {r.exit_code}"
        announced = r.interruption_at if not r.interrupted and r.deleting is None else None
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
            "public_ip": None if self.edge is not None else r.reported_ip,
            "ports": [] if self.edge is not None else [
                {"container_port": port, "protocol": protocol, "public_port": public}
                for port, protocol, public in r.published
            ],
            "edges": [] if self.edge is None else [
                {"container_port": port, "protocol": protocol,
                 "host": self.edge.host(r.id, port), "port": EDGE_PORT,
                 "auth_header": self.edge.auth_header}
                for port, protocol, _public in r.published if protocol == "TCP"
            ],
            "created_at": self._iso(r.created),
            "started_at": self._iso(r.started),
            "finished_at": self._iso(r.finished),
            "exit_code": r.exit_code,
            "message": message,
            "restart_count": r.restart_count,
            "interruptible": r.interruptible,
            "interruption_at": self._iso(announced),
            "interrupted": r.interrupted,
        }

    def _live_record(self, instance_id: str) -> Record:
        record = self._live.get(instance_id)
        if record is not None:
            self._advance([record], self.clock())  # this one only: O(1) at any size
            record = self._live.get(instance_id)
        if record is None:
            raise not_found(instance_id)
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
            self._releasing.add(record.id)
            record.advance(now=now)
            self._schedule(record)
        self.listeners.sync_one(record)  # a delete asked for: the ports close at once
        if record.released is not None:
            self._remove(record)
            return None
        return self._instance_json(record)

    def restart(self, instance_id: str) -> dict[str, Any]:
        """Restart the container, running or exited (as ``docker restart`` does): its ports
        close, it boots again (``boot_delay``), then its model server loads again;
        ``restart_count`` goes up. 409 once a delete was asked."""
        record = self._live_record(instance_id)
        if record.deleting is not None:
            raise MockCloudError(status=409, code="invalid_state",
                                 message=f"instance {instance_id} is being deleted")
        now = self.clock()
        record.restart_count += 1
        record.finished = None
        record.exit_code = None
        record.message = None
        record.crashed = False
        record.phase = Phase.PENDING
        record.run_started = None
        record.boot_at = now + max(0.0, self.boot_delay)
        self._draw_crash(record, after=record.boot_at)
        record.advance(now=now)
        self._schedule(record)
        self.listeners.sync_one(record)
        return self._instance_json(record)

    def fail(self, instance_id: str, *, message: str, exit_code: int | None = None) -> None:
        """Make the container fail now (crash, preemption, image pull error, ...)."""
        record = self._stoppable(instance_id)
        record.phase = Phase.FAILED
        record.finished = self.clock()
        record.exit_code = exit_code
        record.message = message
        self._schedule(record)
        self.listeners.sync_one(record)

    def announce_interruption(self, instance_id: str, *, in_seconds: float) -> dict[str, Any]:
        """Announce that this interruptible instance is reclaimed ``in_seconds`` from now (its
        ``interruption_at``); then it stops (state ``failed``, ``interrupted`` true), as a spot
        reclaim does. 409 for an on-demand instance or one already stopped."""
        record = self._interruptible(instance_id)
        if not 0.0 <= in_seconds <= 86400.0:
            raise MockCloudError(status=400, code="invalid_spec",
                                 message="in_seconds must be in [0, 86400]")
        record.interruption_at = self.clock() + in_seconds
        record.advance(now=self.clock())
        self._schedule(record)
        self.listeners.sync_one(record)
        return self._instance_json(record)

    def interrupt(self, instance_id: str) -> dict[str, Any]:
        """Reclaim this interruptible instance now, without notice (an unplanned interruption)."""
        return self.announce_interruption(instance_id, in_seconds=0.0)

    def _interruptible(self, instance_id: str) -> Record:
        record = self._stoppable(instance_id)
        if not record.interruptible:
            raise MockCloudError(status=409, code="invalid_state",
                                 message=f"instance {instance_id} is not interruptible")
        return record

    def exit(self, instance_id: str, *, exit_code: int) -> None:
        """Make the container exit now with ``exit_code``."""
        record = self._stoppable(instance_id)
        now = self.clock()
        if record.started is None:
            record.started = now
        record.phase = Phase.EXITED
        record.finished = now
        record.exit_code = exit_code
        self._schedule(record)
        self.listeners.sync_one(record)

    def set_load(self, instance_id: str, *, gpu_utilization: float | None) -> None:
        if gpu_utilization is not None and not 0.0 <= gpu_utilization <= 1.0:
            raise MockCloudError(
                status=400, code="invalid_spec", message="gpu_utilization must be in [0, 1]"
            )
        self._live_record(instance_id).load = gpu_utilization

    def set_temperature(self, instance_id: str, *, celsius: float | None) -> None:
        """Pin every GPU of the instance at ``celsius`` (None: back to what its load gives)."""
        if celsius is not None and not 0.0 <= celsius <= 150.0:
            raise MockCloudError(status=400, code="invalid_spec",
                                 message="celsius must be in [0, 150]")
        self._live_record(instance_id).temperature = celsius

    def set_health(
        self, instance_id: str, *, live: bool | None = None, ready: bool | None = None
    ) -> dict[str, Any]:
        """Steer the model server: ``live`` False makes ``/live`` answer 500, ``ready`` False
        makes ``/ready``, ``/healthz`` and traffic answer 503, until set back."""
        record = self._live_record(instance_id)
        if live is not None:
            record.live_ok = live
        if ready is not None:
            record.ready_ok = ready
        return {"instance": record.id, "live": record.live_ok, "ready": record.ready_ok}

    def _stoppable(self, instance_id: str) -> Record:
        record = self._live_record(instance_id)
        if record.deleting is not None or record.phase in (Phase.EXITED, Phase.FAILED):
            raise MockCloudError(
                status=409, code="invalid_state", message=f"instance {instance_id} already stopped"
            )
        return record

    # -- logs and metrics -------------------------------------------------------------------

    def log_view(self, instance_id: str) -> tuple[LogView, bool]:
        """The instance's log so far, and whether it will print no more lines."""
        record = self._live_record(instance_id)
        done = record.deleting is not None or record.phase in (Phase.EXITED, Phase.FAILED)
        return LogView(record, now=self.clock()), done

    def format_line(self, line: LogLine, *, timestamps: bool) -> bytes:
        return format_line(line, timestamps=timestamps, wall=self.wall)

    def metrics(self, instance_id: str) -> dict[str, Any]:
        return self._metrics_json(self._live_record(instance_id), now=self.clock())

    def metrics_all(self, *, tags: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """GPU figures of every live instance carrying ``tags``, in one answer."""
        now = self._tick()
        wanted = dict(tags or {})
        at = self._iso(now)  # one instant for the whole answer
        return [self._metrics_json(r, now=now, at=at) for r in self._live.values()
                if all(r.tags.get(k) == v for k, v in wanted.items())]

    def _metrics_json(self, record: Record, *, now: float,
                      at: str | None = None) -> dict[str, Any]:
        return metrics_json(record, now=now, seed=self.seed,
                            at=self._iso(now) if at is None else at)

    # -- accounting -------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        self._tick()
        result = {f"{endpoint}_calls": self.calls.get(endpoint, 0) for endpoint in ENDPOINTS}
        injected = {**self.injected, "crashes": sum(1 for r in self._all if r.crashed)}
        for kind in INJECTED_KINDS:
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
                    "interruptible": r.interruptible,
                    "interrupted": r.interrupted,
                    "state": state,
                    "exit_code": r.exit_code,
                    "created_at": self._iso(r.created),
                    "started_at": self._iso(r.started),
                    "stopped_at": self._iso(r.released),
                    "cost": round(r.cost(now=now), 6),
                    # what pull credential the create carried (never the password)
                    "registry_auth": {"registry": r.registry_auth[0],
                                      "username": r.registry_auth[1]}
                    if r.registry_auth is not None else None,
                }
            )
        total = round(sum(r.cost(now=now) for r in self._all), 6)
        return {
            "create_calls": self.calls.get("create", 0),
            "total_cost": total,
            "instances": entries,
        }

    def traffic(self) -> dict[str, dict[str, Any]]:
        """Requests the listeners served, per instance ever served (by id): ``traffic`` and
        ``probes`` in all, and the same by container port."""
        result: dict[str, dict[str, Any]] = {}
        for r in self._all:
            if not r.served:
                continue
            result[r.id] = {
                "traffic": sum(t for t, _ in r.served.values()),
                "probes": sum(p for _, p in r.served.values()),
                "ports": {str(port): {"traffic": t, "probes": p}
                          for port, (t, p) in sorted(r.served.items())},
            }
        return result

    def listener_json(self) -> list[dict[str, Any]]:
        """The real listeners open now: ``{instance, public_host, public_port, container_port,
        host, port}`` each."""
        self._tick()
        return self.listeners.to_json()

    def config(self) -> dict[str, Any]:
        return {
            "boot_delay": self.boot_delay,
            "delete_delay": self.delete_delay,
            "quota_gpus": self.quota_gpus,
            "max_gpus_per_instance": self.max_gpus_per_instance,
            "load_seconds": self.load_seconds,
        }

    def reset(self) -> None:
        """Back to the state as constructed (instance ids keep counting up)."""
        self.set_inventory(self._initial_inventory)
        (self.boot_delay, self.delete_delay, self.quota_gpus, self.max_gpus_per_instance) = (
            self._initial_knobs
        )
        self.load_seconds = self._initial_load_seconds
        self._private.clear()
        self._live.clear()
        self._names.clear()
        self._releasing.clear()
        self._held.clear()
        self.listeners.sync(())
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


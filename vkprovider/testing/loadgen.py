"""A load generator that sends a steady request rate to a Service the way kube-proxy would.

Why it exists: "the site never drops" is a promise about requests (issue 13), so tests, the demo
and the bench measure it in requests. Like kube-proxy, the generator follows the Service's
EndpointSlices (all of them: the stock controller's and vkprovider's own), watched, not polled;
takes the port named like the Service port; and round-robins over endpoints whose
``conditions.ready`` is not false (nil means ready, per the API). Pod and instance addresses are
virtual in labs, so each request goes through a :class:`~vkprovider.probing.dialing.Dialer`
(an :class:`~vkprovider.probing.dialing.AddressMap` there, direct in production).

Open loop: requests leave on a fixed schedule whether or not earlier ones have answered (a slow
replica does not slow the offered load, as real users would not wait for each other). At most
``max_in_flight`` are outstanding; a scheduled request beyond that is *skipped* and counted as
such (the generator, not the site, ran out of room).

What counts as failed: a connection error (``connect``: refused, no route; ``reset``: the
connection broke or closed mid-request), a timeout (``timeout``: the whole request took over
``timeout`` seconds), a 5xx answer (``http_5xx``), no ready endpoint at all when the request was
due (``no_endpoint``: kube-proxy rejects such a connection; such requests count as sent), or any
other HTTP error (``error``).

Use::

    async with LoadGenerator(kube=kube, namespace=ns, service="web", rate=50,
                             address_map=cluster.address_map_dir) as lg:
        ...
        lg.mark("move-back")          # a new chapter: per-chapter sent/failed
        ...
    report = lg.report()              # frozen; report.as_dict() for JSON
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from vkprovider.kube import KubeClient
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.probing.dialing import DIRECT, AddressMap, Dialer
from vkprovider.probing.transport import DialingTransport

log = logging.getLogger(__name__)

__all__ = [
    "Chapter",
    "FailureEvent",
    "LoadGenerator",
    "LoadReport",
    "NoEndpointClock",
    "RoundRobin",
    "Tally",
    "ready_endpoints",
]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
FAILURE_KINDS = ("connect", "reset", "timeout", "http_5xx", "no_endpoint", "error")
MAX_FAILURE_EVENTS = 10_000

Target = tuple[str, int]


# ---- endpoint selection (pure) ---------------------------------------------------------------


def ready_endpoints(slices: Iterable[Mapping[str, Any]], *, port_name: str) -> tuple[Target, ...]:
    """The ``(address, port)`` pairs kube-proxy would balance over, sorted and deduplicated.

    Per slice: only IPv4/IPv6 slices (kube-proxy ignores FQDN ones); the port whose name equals
    the Service port's name (``""`` for an unnamed port; a slice without it contributes nothing);
    endpoints whose ``conditions.ready`` is not false, by their first address (as kube-proxy).
    The same address:port in two slices (stock and provider-managed) counts once.
    """
    found: set[Target] = set()
    for s in slices:
        if s.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue
        port = next((p.get("port") for p in s.get("ports") or []
                     if (p.get("name") or "") == port_name and p.get("port") is not None), None)
        if port is None:
            continue
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            addresses = ep.get("addresses") or []
            if addresses:
                found.add((str(addresses[0]), int(port)))
    return tuple(sorted(found))


class RoundRobin:
    """Cycles over a set of targets that may change between picks, without restarting."""

    def __init__(self, targets: Sequence[Target] = ()) -> None:
        self.targets: tuple[Target, ...] = tuple(targets)
        self._next = 0

    def update(self, targets: Sequence[Target]) -> None:
        """New targets; the cycle resumes after the last target picked (if still present)."""
        targets = tuple(targets)
        if targets == self.targets:
            return
        last = self.targets[(self._next - 1) % len(self.targets)] if self.targets else None
        self.targets = targets
        self._next = targets.index(last) + 1 if last in targets else 0

    def pick(self) -> Target | None:
        if not self.targets:
            return None
        target = self.targets[self._next % len(self.targets)]
        self._next = (self._next + 1) % len(self.targets)
        return target


class NoEndpointClock:
    """Windows of time with no ready endpoint, from transitions reported by :meth:`update`."""

    def __init__(self) -> None:
        self.windows: list[tuple[float, float]] = []  # closed [start, end)
        self.open_since: float | None = None

    def update(self, *, has_ready: bool, now: float) -> None:
        if has_ready and self.open_since is not None:
            self.windows.append((self.open_since, now))
            self.open_since = None
        elif not has_ready and self.open_since is None:
            self.open_since = now

    def all_windows(self, now: float) -> list[tuple[float, float]]:
        closed = list(self.windows)
        if self.open_since is not None:
            closed.append((self.open_since, now))
        return closed

    def longest(self, now: float, *, since: float = -math.inf, until: float = math.inf) -> float:
        return max((d for d in _clipped(self.all_windows(now), since, until)), default=0.0)

    def total(self, now: float, *, since: float = -math.inf, until: float = math.inf) -> float:
        return sum(_clipped(self.all_windows(now), since, until))


def _clipped(windows: Iterable[tuple[float, float]], since: float, until: float) -> list[float]:
    return [max(0.0, min(end, until) - max(start, since)) for start, end in windows
            if min(end, until) > max(start, since)]


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FailureEvent:
    """One failed request: ``at`` seconds after the generator started."""

    at: float
    kind: str
    endpoint: str | None
    chapter: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Chapter:
    """A labelled stretch of the run (see :meth:`LoadGenerator.mark`); times in seconds from
    the start. Requests belong to the chapter in which they were sent."""

    label: str
    start: float
    end: float
    sent: int
    ok: int
    failed: int
    failures_by_kind: Mapping[str, int]
    by_endpoint: Mapping[str, int]
    by_replica: Mapping[str, int]
    longest_no_endpoint: float
    total_no_endpoint: float

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "start": round(self.start, 3), "end": round(self.end, 3),
                "sent": self.sent, "ok": self.ok, "failed": self.failed,
                "failures_by_kind": dict(self.failures_by_kind),
                "by_endpoint": dict(self.by_endpoint), "by_replica": dict(self.by_replica),
                "longest_no_endpoint": round(self.longest_no_endpoint, 3),
                "total_no_endpoint": round(self.total_no_endpoint, 3)}


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    """What the site did with the offered load. ``by_endpoint`` counts requests sent to each
    ``address:port``; ``by_replica`` counts OK answers by the ``instance`` (mock cloud) or
    ``pod`` (fake kubelet) their JSON named. ``skipped`` requests were never sent (in-flight
    bound); they are in neither ``sent`` nor ``failed``."""

    service: str
    rate: float
    duration: float
    sent: int
    ok: int
    failed: int
    skipped: int
    in_flight: int
    failures_by_kind: Mapping[str, int]
    longest_no_endpoint: float
    total_no_endpoint: float
    by_endpoint: Mapping[str, int]
    by_replica: Mapping[str, int]
    latency_p50: float | None
    latency_p99: float | None
    chapters: tuple[Chapter, ...]
    failures: tuple[FailureEvent, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {"service": self.service, "rate": self.rate, "duration": round(self.duration, 3),
                "sent": self.sent, "ok": self.ok, "failed": self.failed,
                "skipped": self.skipped, "in_flight": self.in_flight,
                "failures_by_kind": dict(self.failures_by_kind),
                "longest_no_endpoint": round(self.longest_no_endpoint, 3),
                "total_no_endpoint": round(self.total_no_endpoint, 3),
                "by_endpoint": dict(self.by_endpoint), "by_replica": dict(self.by_replica),
                "latency_p50": r(self.latency_p50), "latency_p99": r(self.latency_p99),
                "chapters": [c.as_dict() for c in self.chapters],
                "failures": [{"at": round(f.at, 3), "kind": f.kind, "endpoint": f.endpoint,
                              "chapter": f.chapter, "detail": f.detail} for f in self.failures]}

    def chapter(self, label: str) -> Chapter:
        """The last chapter so labelled (KeyError if none)."""
        for c in reversed(self.chapters):
            if c.label == label:
                return c
        raise KeyError(label)


@dataclass
class _ChapterTally:
    label: str
    start: float
    sent: int = 0
    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    by_endpoint: Counter[str] = field(default_factory=Counter)
    by_replica: Counter[str] = field(default_factory=Counter)


class Tally:
    """The counting behind a report, with no I/O: feed it outcomes, ask for a :class:`LoadReport`.

    Times are whatever clock the caller uses (``time.monotonic()`` in the generator);
    ``started`` is time zero of the report.
    """

    def __init__(self, *, service: str, rate: float, started: float, chapter: str = "start"
                 ) -> None:
        self.service = service
        self.rate = rate
        self.started = started
        self.skipped = 0
        self.in_flight = 0
        self.clock = NoEndpointClock()
        self.chapters: list[_ChapterTally] = [_ChapterTally(label=chapter, start=started)]
        self.failures: list[FailureEvent] = []
        self.latencies: list[float] = []

    def mark(self, label: str, *, now: float) -> int:
        self.chapters.append(_ChapterTally(label=label, start=now))
        return len(self.chapters) - 1

    @property
    def current(self) -> int:
        return len(self.chapters) - 1

    def sent(self, *, chapter: int, endpoint: str | None) -> None:
        c = self.chapters[chapter]
        c.sent += 1
        if endpoint is not None:
            c.by_endpoint[endpoint] += 1

    def succeeded(self, *, chapter: int, replica: str | None, latency: float) -> None:
        c = self.chapters[chapter]
        c.ok += 1
        if replica:
            c.by_replica[replica] += 1
        self.latencies.append(latency)

    def failed(self, *, chapter: int, kind: str, endpoint: str | None, now: float,
               detail: str = "") -> None:
        c = self.chapters[chapter]
        c.failures[kind] += 1
        if len(self.failures) < MAX_FAILURE_EVENTS:
            self.failures.append(FailureEvent(at=now - self.started, kind=kind, endpoint=endpoint,
                                              chapter=c.label, detail=detail[:200]))

    def report(self, *, now: float) -> LoadReport:
        chapters: list[Chapter] = []
        for i, c in enumerate(self.chapters):
            end = self.chapters[i + 1].start if i + 1 < len(self.chapters) else now
            chapters.append(Chapter(
                label=c.label, start=c.start - self.started, end=end - self.started,
                sent=c.sent, ok=c.ok, failed=sum(c.failures.values()),
                failures_by_kind=dict(c.failures), by_endpoint=dict(c.by_endpoint),
                by_replica=dict(c.by_replica),
                longest_no_endpoint=self.clock.longest(now, since=c.start, until=end),
                total_no_endpoint=self.clock.total(now, since=c.start, until=end)))
        kinds: Counter[str] = Counter()
        by_endpoint: Counter[str] = Counter()
        by_replica: Counter[str] = Counter()
        for c in self.chapters:
            kinds.update(c.failures)
            by_endpoint.update(c.by_endpoint)
            by_replica.update(c.by_replica)
        lat = sorted(self.latencies)
        return LoadReport(
            service=self.service, rate=self.rate, duration=now - self.started,
            sent=sum(c.sent for c in self.chapters), ok=sum(c.ok for c in self.chapters),
            failed=sum(kinds.values()), skipped=self.skipped, in_flight=self.in_flight,
            failures_by_kind=dict(kinds),
            longest_no_endpoint=self.clock.longest(now), total_no_endpoint=self.clock.total(now),
            by_endpoint=dict(by_endpoint), by_replica=dict(by_replica),
            latency_p50=_quantile(lat, 0.50), latency_p99=_quantile(lat, 0.99),
            chapters=tuple(chapters), failures=tuple(self.failures))


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def replica_of(body: bytes) -> str | None:
    """The replica a JSON answer names: ``instance`` (mock cloud), else ``pod`` (fake kubelet)."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    for key in ("instance", "pod"):
        value = decoded.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _netloc(target: Target) -> str:
    host, port = target
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---- the generator ---------------------------------------------------------------------------


class LoadGenerator:
    """Sends ``rate`` requests per second to ``namespace/service`` until stopped.

    ``port`` is the Service port's name; None reads the Service and takes its only port.
    ``address_map`` (a directory) or ``dialer`` says where virtual addresses really are (neither:
    dial directly). ``max_in_flight`` defaults to what ``rate`` and ``timeout`` can need.
    """

    def __init__(self, *, kube: KubeClient, namespace: str, service: str, rate: float,
                 port: str | None = None, path: str = "/", timeout: float = 2.0,
                 address_map: Path | None = None, dialer: Dialer | None = None,
                 max_in_flight: int | None = None, chapter: str = "start",
                 sync_timeout: float = 30.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        if address_map is not None and dialer is not None:
            raise ValueError("give address_map or dialer, not both")
        self.kube = kube
        self.namespace = namespace
        self.service = service
        self.rate = rate
        self.port_name = port
        self.path = path if path.startswith("/") else f"/{path}"
        self.timeout = timeout
        self.dialer: Dialer = AddressMap(address_map) if address_map is not None else (
            dialer or DIRECT)
        self.max_in_flight = max_in_flight or max(16, math.ceil(rate * timeout * 1.5))
        self._first_chapter = chapter
        self._sync_timeout = sync_timeout
        self._clock = clock
        self._rr = RoundRobin()
        self._tally: Tally | None = None
        self._slices: Informer | None = None
        self._client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._requests: set[asyncio.Task[None]] = set()
        self._final: LoadReport | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> LoadGenerator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Resolve the port name, sync the Service's slices, then start sending."""
        if self._tally is not None:
            raise RuntimeError("LoadGenerator already started")
        if self.port_name is None:
            self.port_name = await self._only_port_name()
        self._client = httpx.AsyncClient(
            transport=DialingTransport(dialer=self.dialer, inner=httpx.AsyncHTTPTransport(
                limits=httpx.Limits(max_connections=self.max_in_flight,
                                    max_keepalive_connections=self.max_in_flight))),
            timeout=httpx.Timeout(self.timeout), headers={"User-Agent": "vkprovider-loadgen"})
        self._slices = Informer(
            client=self.kube,
            path=f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices",
            params={"labelSelector": f"{SERVICE_NAME_LABEL}={self.service}"},
            handler=self._on_slice, name=f"loadgen-{self.service}")
        watch = asyncio.get_running_loop().create_task(self._slices.run())
        self._tasks.append(watch)
        try:
            await asyncio.wait_for(self._slices.synced.wait(), timeout=self._sync_timeout)
        except BaseException:
            await self._cancel_tasks()
            await self._client.aclose()
            raise
        now = self._clock()
        self._tally = Tally(service=f"{self.namespace}/{self.service}", rate=self.rate,
                            started=now, chapter=self._first_chapter)
        self._tally.clock.update(has_ready=bool(self._rr.targets), now=now)
        self._tasks.append(asyncio.get_running_loop().create_task(self._schedule(now)))
        log.info("load generator started", extra=kv(service=self._tally.service,
                                                    rate=self.rate, port=self.port_name,
                                                    endpoints=len(self._rr.targets)))

    async def stop(self) -> LoadReport:
        """Stop sending, let outstanding requests finish (each bounded by ``timeout``), report."""
        if self._final is not None:
            return self._final
        if self._tally is None:
            raise RuntimeError("LoadGenerator not started")
        scheduler = self._tasks[-1]
        scheduler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await scheduler
        if self._requests:
            await asyncio.wait(set(self._requests), timeout=self.timeout + 1.0)
        self._final = self._tally.report(now=self._clock())
        for task in list(self._requests):
            task.cancel()
        await self._cancel_tasks()
        if self._client is not None:
            await self._client.aclose()
        log.info("load generator stopped", extra=kv(service=self._tally.service,
                                                    sent=self._final.sent,
                                                    failed=self._final.failed))
        return self._final

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    # ---- what tests read -------------------------------------------------------------------

    @property
    def endpoints(self) -> tuple[Target, ...]:
        """The ready endpoints requests are balanced over right now."""
        return self._rr.targets

    def mark(self, label: str) -> None:
        """Start a new chapter: from now on requests are counted under ``label``."""
        if self._tally is None:
            raise RuntimeError("LoadGenerator not started")
        self._tally.mark(label, now=self._clock())

    def report(self) -> LoadReport:
        """A snapshot so far (the final one once stopped)."""
        if self._final is not None:
            return self._final
        if self._tally is None:
            raise RuntimeError("LoadGenerator not started")
        return self._tally.report(now=self._clock())

    # ---- internals -------------------------------------------------------------------------

    async def _only_port_name(self) -> str:
        svc = await self.kube.get(f"/api/v1/namespaces/{self.namespace}/services/{self.service}")
        ports = (svc.get("spec") or {}).get("ports") or []
        if len(ports) != 1:
            raise ValueError(f"service {self.namespace}/{self.service} has {len(ports)} ports; "
                             "name the one to load with port=")
        return str(ports[0].get("name") or "")

    def _on_slice(self, event: str, obj: dict[str, Any]) -> None:
        assert self._slices is not None
        self._rr.update(ready_endpoints(self._slices.store.values(),
                                        port_name=self.port_name or ""))
        if self._tally is not None:
            self._tally.clock.update(has_ready=bool(self._rr.targets), now=self._clock())

    async def _schedule(self, t0: float) -> None:
        assert self._tally is not None
        interval = 1.0 / self.rate
        n = 0
        while True:
            n += 1
            delay = t0 + n * interval - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tally = self._tally
            if len(self._requests) >= self.max_in_flight:
                tally.skipped += 1
                continue
            target = self._rr.pick()
            chapter = tally.current
            endpoint = _netloc(target) if target else None
            tally.sent(chapter=chapter, endpoint=endpoint)
            if target is None:
                tally.failed(chapter=chapter, kind="no_endpoint", endpoint=None,
                             now=self._clock())
                continue
            task = asyncio.get_running_loop().create_task(self._one(target, chapter))
            self._requests.add(task)
            tally.in_flight = len(self._requests)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._requests.discard(task)
        if self._tally is not None:
            self._tally.in_flight = len(self._requests)

    async def _one(self, target: Target, chapter: int) -> None:
        assert self._client is not None and self._tally is not None
        endpoint = _netloc(target)
        began = self._clock()
        kind, detail = "", ""
        try:
            async with asyncio.timeout(self.timeout):
                resp = await self._client.get(f"http://{endpoint}{self.path}")
        except (TimeoutError, httpx.TimeoutException) as exc:
            kind, detail = "timeout", type(exc).__name__
        except httpx.ConnectError as exc:
            kind, detail = "connect", str(exc)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            kind, detail = "reset", f"{type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            kind, detail = "error", f"{type(exc).__name__}: {exc}"
        else:
            if resp.status_code >= 500:
                kind, detail = "http_5xx", str(resp.status_code)
            else:
                self._tally.succeeded(chapter=chapter, replica=replica_of(resp.content),
                                      latency=self._clock() - began)
                return
        self._tally.failed(chapter=chapter, kind=kind, endpoint=endpoint, now=self._clock(),
                           detail=detail)

"""Per-pod GPU figures, read from the clouds on a timer and kept for the kubelet API and /metrics.

Why it exists: operators (and autoscalers reading ``/metrics/resource``) want to see whether a
burst pod's GPUs are busy, but a scrape must never fan out into cloud calls. A collector reads the
figures of each running instance at most once per ``interval`` (default 15 s), in the background,
and everything else (``/stats/summary``, ``/metrics/resource``, the ``vkprovider_pod_gpu_*``
gauges) reads its cache.

Only providers that offer ``gpu_metrics(instance_id)`` or ``gpu_metrics_all()`` are asked. The
contract (the mock cloud's shape, and what a real adapter should return): a mapping with
``gpus``, a list of ``{index, uuid, gpu_type, gpu_utilization (percent 0-100), tensor_active
(0-1), memory_used_bytes, memory_total_bytes, temperature_c, power_w}``; missing figures are
omitted. ``gpu_metrics_all()`` returns those mappings by instance id for every instance of the
node in ONE call, and is preferred: with 5,000 pods, one call per instance every 15 s is 333
calls a second (bench/steady.py measured that as most of the provider's steady CPU); one call
per provider per interval is nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from providers.base import ProviderError
from vkprovider.api.view import NodeView, Placement, is_running
from vkprovider.gpureadings import PodGPUs, parse_readings
from vkprovider.logs import kv
from vkprovider.metrics import Metrics

log = logging.getLogger(__name__)


@runtime_checkable
class GPUMetricsSource(Protocol):
    """A provider that can report GPU figures of one instance."""

    async def gpu_metrics(self, instance_id: str) -> Mapping[str, Any]: ...


@runtime_checkable
class BulkGPUMetricsSource(Protocol):
    """A provider that can report GPU figures of all its instances in one call."""

    async def gpu_metrics_all(self) -> Mapping[str, Mapping[str, Any]]: ...


_KINDS: dict[type, tuple[bool, bool]] = {}


def _kind(provider: object) -> tuple[bool, bool]:
    """(reports GPU figures, in one call for all instances) for the provider's class,
    remembered: an isinstance check against a runtime Protocol walks its members (~10 µs),
    and the collector asks for every pod every second."""
    kind = type(provider)
    known = _KINDS.get(kind)
    if known is None:
        bulk = isinstance(provider, BulkGPUMetricsSource)
        known = _KINDS[kind] = (bulk or isinstance(provider, GPUMetricsSource), bulk)
    return known


def _reads_gpus(provider: object) -> bool:
    return _kind(provider)[0]


class GPUCollector:
    """Reads GPU figures of running instances; ``samples`` holds the latest, by pod UID."""

    def __init__(
        self,
        *,
        view: NodeView,
        metrics: Metrics,
        interval: float = 15.0,
        tick: float = 1.0,
        first_read_gap: float = 5.0,
        call_timeout: float = 10.0,
        concurrency: int = 8,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.view = view
        self.metrics = metrics
        self.interval = interval
        self.tick = min(tick, interval)
        self.first_read_gap = min(first_read_gap, interval)
        self._bulk_at: dict[int, float] = {}  # id(provider) -> clock() of its last bulk call
        self.call_timeout = call_timeout
        self.clock = clock
        self.wall = wall
        self.samples: dict[str, PodGPUs] = {}
        self.version = 0  # bumped whenever ``samples`` changes (readers skip unchanged passes)
        self._attempted: dict[str, float] = {}  # uid -> clock() of the last call (ok or not)
        metrics.pod_gpus.source = self.samples.values  # vkprovider_pod_gpu_*, when scraped
        self._limit = asyncio.Semaphore(concurrency)
        # A pass is skipped while the placements are what they were after the last one and no
        # pod is due yet: at 5,000 pods a scan every tick cost ~1% of a core for nothing.
        self._seen_version: object = None
        self._next_due = float("-inf")

    async def run(self) -> None:
        """Refresh until cancelled; a new running pod is read within ``tick`` seconds (within
        ``first_read_gap`` when its provider reads in bulk and was read just before)."""
        while True:
            try:
                await self.refresh()
            except Exception:  # the collector must outlive any bug in one pass
                log.exception("GPU metrics refresh failed")
            await asyncio.sleep(self.tick)

    async def refresh(self) -> None:
        now = self.clock()
        version = self.view.placements_version()
        if version is not None and version == self._seen_version and now < self._next_due:
            return
        running = {p.uid: p for p in self.view.placements()
                   if is_running(p) and _reads_gpus(p.provider)}
        for uid in [u for u in self.samples if u not in running]:
            self._forget(uid)
        for uid in [u for u in self._attempted if u not in running]:
            del self._attempted[uid]
        due = [p for uid, p in running.items()
               if now - self._attempted.get(uid, float("-inf")) >= self.interval]
        # One call per bulk-capable provider with anything due. It refreshes its pods read at
        # least half an interval ago, not all of them: pods that start one by one (a burst)
        # would otherwise have every pod stored again at each tick, while folding the nearly
        # due in keeps the calls per provider near one per interval.
        # A pod never read makes its bulk provider due only FIRST_READ_GAP after that
        # provider's last call: a burst starting pods every second then costs one call (and
        # one pass over the answer) every few seconds, not one per second.
        bulk_due = {id(p.provider) for p in due if _kind(p.provider)[1] and (
            p.uid in self._attempted
            or now - self._bulk_at.get(id(p.provider), float("-inf")) >= self.first_read_gap)}
        bulk: dict[int, list[Placement]] = {}
        if bulk_due:
            half = self.interval / 2
            for uid, q in running.items():
                if id(q.provider) in bulk_due and \
                        now - self._attempted.get(uid, float("-inf")) >= half:
                    bulk.setdefault(id(q.provider), []).append(q)
        calls = [self._read_all(group) for group in bulk.values()]
        calls += [self._read(p) for p in due if not _kind(p.provider)[1]]
        if calls:
            await asyncio.gather(*calls)
        self._seen_version = version
        self._next_due = self._due_next(running)

    def _due_next(self, running: Mapping[str, Placement]) -> float:
        """When the next pass has something to do if no placement changes: the first pod whose
        interval runs out, or a bulk provider's first-read gap for a pod never read."""
        out = float("inf")
        for uid, p in running.items():
            attempted = self._attempted.get(uid)
            if attempted is not None:
                out = min(out, attempted + self.interval)
            else:
                out = min(out, self._bulk_at.get(id(p.provider), float("-inf"))
                          + self.first_read_gap)
        return out

    async def _read_all(self, placements: list[Placement]) -> None:
        source = placements[0].provider
        assert isinstance(source, BulkGPUMetricsSource)
        for p in placements:
            self._attempted[p.uid] = self.clock()
        self._bulk_at[id(source)] = self.clock()
        name = placements[0].provider_name
        try:
            async with self._limit, asyncio.timeout(self.call_timeout):
                bodies = await source.gpu_metrics_all()
        except (ProviderError, TimeoutError) as exc:
            self._failed(name=name, placements=placements, exc=exc)
            return
        self.metrics.provider_requests.labels(name, "gpu_metrics", "ok").inc()
        for p in placements:
            body = bodies.get(p.instance.id)
            if body is not None:
                self._store(p, body)

    async def _read(self, placement: Placement) -> None:
        self._attempted[placement.uid] = self.clock()
        source = placement.provider
        assert isinstance(source, GPUMetricsSource)
        name = placement.provider_name
        try:
            async with self._limit, asyncio.timeout(self.call_timeout):
                body = await source.gpu_metrics(placement.instance.id)
        except (ProviderError, TimeoutError) as exc:
            self._failed(name=name, placements=[placement], exc=exc)
            return
        self.metrics.provider_requests.labels(name, "gpu_metrics", "ok").inc()
        self._store(placement, body)

    def _failed(self, *, name: str, placements: list[Placement], exc: Exception) -> None:
        result = "TimeoutError" if isinstance(exc, TimeoutError) else type(exc).__name__
        self.metrics.provider_requests.labels(name, "gpu_metrics", result).inc()
        log.debug("GPU metrics read failed", extra=kv(provider=name, pods=len(placements),
                                                      error=str(exc) or result))
        for p in placements:  # keep a stale figure a while, not forever
            stale = self.samples.get(p.uid)
            if stale is not None and self.wall() - stale.at > 3 * self.interval:
                self._forget(p.uid)

    def _store(self, placement: Placement, body: Mapping[str, Any]) -> None:
        if self.view.placement(placement.uid) is None:
            return  # the pod went away while we asked
        sample = PodGPUs(uid=placement.uid, namespace=placement.namespace, pod=placement.pod,
                         provider=placement.provider_name, instance_id=placement.instance.id,
                         at=self.wall(),
                         gpus=parse_readings(body,
                                             default_model=placement.instance.gpu_type or ""))
        self.samples[placement.uid] = sample
        self.version += 1

    def _forget(self, uid: str) -> None:
        if self.samples.pop(uid, None) is not None:
            self.version += 1

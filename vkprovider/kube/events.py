"""Kubernetes Events: what the service decided and why, where ``kubectl describe`` shows it.

Why it exists: users debug with ``kubectl describe pod``; every decision they would want to see
(rejected, created on which cloud, no capacity, deleted) is an Event with a reason. These rules
keep Events from costing what they explain:

* **Off the caller's path.** :meth:`EventRecorder.emit` only queues; one sender task writes. A
  reconcile never waits for an Event write, and a slow API server slows Events, not pods.
* **Correlated** (:mod:`vkprovider.kube.eventcorrelator`, the kubelet's rules): repeats bump one
  Event's count, many similar messages fold into one, and a per-object token bucket drops a
  flood. Bumps of an Event still waiting to be written are merged into that one write.
* **Warnings first.** In a burst the one sender falls behind (it writes one Event at a time, at
  the API server's latency), and a Warning that says why a pod was refused must not wait behind
  thousands of ``Started`` Events: queued Warnings are written before queued Normal Events.
* **Paced when asked** (the kubelet's ``eventRecordQPS``/``eventBurst``): with ``qps`` > 0 the
  sender writes at most ``qps`` Events a second after a burst of ``burst``, for an API server
  shared with many other writers; repeats of an Event still queued merge into its one write
  meanwhile. Off by default (``qps=0``): measured on a 3,000-pod burst (bench/burst.py
  ``--event-qps 50 0``), 50 a second changed nothing until all pods were Running (the sender
  wrote ~150 Events in that time either way) and made the rest land ~40 s later.

Posting an Event never fails the caller. The queue is bounded (``max_pending`` objects to
write); past that, new Events are dropped and counted in :attr:`EventRecorder.dropped`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.kube.eventcorrelator import DedupKey, EventCorrelator
from vkprovider.logs import kv
from vkprovider.semantics.timefmt import format_time

log = logging.getLogger(__name__)


def _now() -> str:
    return format_time(datetime.now(UTC))


@dataclass
class _Pending:
    """One Event object to write: created (``new``) or its count and message brought up to date."""

    namespace: str
    name: str
    body: dict[str, Any]  # the whole Event, for a create
    count: int
    message: str
    last: str  # lastTimestamp
    new: bool


class Pace:
    """A token bucket: ``burst`` writes at once, then ``qps`` a second (client-go's flowcontrol).

    :meth:`take` always grants the token and says how long to wait before using it, so a caller
    that sleeps that long keeps the rate without polling.
    """

    def __init__(self, *, qps: float, burst: int) -> None:
        self._qps = qps
        self._burst = float(burst)
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, *, now: float) -> float:
        """Take one token at ``now`` (monotonic seconds); the seconds to wait before using it."""
        if self._at is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._qps)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self._qps


class EventRecorder:
    def __init__(self, *, client: KubeClient, component: str, host: str = "",
                 cache_size: int = 4096, max_pending: int = 10_000,
                 correlator: EventCorrelator | None = None, qps: float = 0.0,
                 burst: int = 1) -> None:
        if qps < 0 or burst < 1:
            raise ValueError(f"event pacing needs qps >= 0 and burst >= 1 (got {qps}, {burst})")
        self._client = client
        self._component = component
        self._host = host
        self._correlator = correlator or EventCorrelator(cache_size=cache_size)
        self._max_pending = max_pending
        # Warnings first: when a burst leaves a backlog of Started Events, the one that says
        # why a pod failed must not wait behind them. FIFO within each.
        self._warnings: collections.OrderedDict[DedupKey, _Pending] = collections.OrderedDict()
        self._normals: collections.OrderedDict[DedupKey, _Pending] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.dropped_queue_full = 0
        self.written = 0  # API writes made (creates + patches)
        self._pace = Pace(qps=qps, burst=burst) if qps > 0 else None

    @property
    def dropped(self) -> int:
        """Events not written: refused by the spam filter or by a full queue."""
        return self._correlator.dropped + self.dropped_queue_full

    @property
    def queued(self) -> int:
        """Event writes waiting for the sender (a backlog after a burst of pods)."""
        return len(self._warnings) + len(self._normals)

    def counts(self) -> tuple[int, int, int]:
        """(queued, written, dropped), for metrics."""
        return self.queued, self.written, self.dropped

    async def emit(
        self,
        *,
        obj: dict[str, Any],
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """Queue an Event about ``obj`` (a Pod, Node, Deployment, ... as a dict); never waits."""
        self.record(obj=obj, reason=reason, message=message, type_=type_)

    def record(self, *, obj: dict[str, Any], reason: str, message: str,
               type_: str = "Normal") -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        decision = self._correlator.observe(uid=uid, obj_name=str(meta.get("name") or ""),
                                            type_=type_, reason=reason, message=message[:1024])
        if decision is None:
            return
        now = _now()
        queue = self._warnings if type_ == "Warning" else self._normals
        pending = queue.get(decision.key)
        if pending is not None:  # not written yet: one write carries every repeat
            pending.count, pending.message, pending.last = decision.count, decision.message, now
            return
        if self.queued >= self._max_pending:
            self.dropped_queue_full += 1
            if self.dropped_queue_full % 1000 == 1:
                log.warning("event queue full; dropping events",
                            extra=kv(pending=self.queued, dropped=self.dropped))
            return
        namespace = meta.get("namespace") or "default"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": decision.name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": uid,
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "type": type_,
            "firstTimestamp": now,
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
        }
        queue[decision.key] = _Pending(
            namespace=namespace, name=decision.name, body=body, count=decision.count,
            message=decision.message, last=now, new=decision.new)
        self._idle.clear()
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_all(),
                                                                  name="events")

    async def flush(self, *, timeout: float = 5.0) -> bool:
        """Wait until every queued Event is written (or ``timeout``); True if all were."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()
                return True
        return False

    async def aclose(self, *, timeout: float = 2.0) -> None:
        """Write what is queued (bounded by ``timeout``), then stop the sender."""
        await self.flush(timeout=timeout)
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender

    def abort(self) -> None:
        """Stop writing at once and drop what is queued (a replica that lost leadership)."""
        self._warnings.clear()
        self._normals.clear()
        if self._sender is not None:
            self._sender.cancel()

    async def _send_all(self) -> None:
        while True:
            if not (self._warnings or self._normals):
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._pace is not None:
                wait = self._pace.take(now=time.monotonic())
                if wait > 0:  # the token is ours; repeats meanwhile join the queued write
                    await asyncio.sleep(wait)
            if not (self._warnings or self._normals):
                continue
            queue = self._warnings or self._normals  # the token may have waited: look again
            key, item = queue.popitem(last=False)
            await self._write(key, item)

    async def _write(self, key: DedupKey, item: _Pending) -> None:
        try:
            if not item.new:
                try:
                    await self._client.patch(
                        f"/api/v1/namespaces/{item.namespace}/events/{item.name}",
                        {"count": item.count, "message": item.message,
                         "lastTimestamp": item.last}, want_body=False)
                    self.written += 1
                    return
                except NotFoundError:  # expired by its TTL: write it anew
                    self._correlator.forget(key)
            body = dict(item.body, message=item.message, count=item.count,
                        lastTimestamp=item.last)
            await self._client.create(f"/api/v1/namespaces/{item.namespace}/events", body,
                                      want_body=False)
            self.written += 1
        except APIError as exc:
            self._correlator.forget(key)  # the next repeat tries a new object
            log.warning("could not record event",
                        extra=kv(reason=item.body.get("reason"),
                                 object=item.body["involvedObject"].get("name"),
                                 error=str(exc)))
        except Exception:  # the sender must outlive any bug in one write
            log.exception("event write crashed")

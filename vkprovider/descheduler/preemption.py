"""The preemption fast path: a replica the scheduler preempted is replaced on the cloud at once.

Why it exists: when the scheduler preempts an inference replica for a higher-priority pod (a
training gang), its ReplicaSet makes a replacement that cannot fit inside: the GPUs it had are
the preemptor's now. Waiting a policy's ``overflowAfter`` for that replacement only lengthens the
dip in serving capacity; the wait exists to give the scheduler a chance inside, and preemption
already answered that question. So each preemption of a pod owned by a controller gives that
controller one *credit*: its next pending pod created after the preemption is admitted without
waiting (every other policy rule still applies: selection, budget, dry run).

How it learns of preemptions: the scheduler records an Event with reason ``Preempted`` on each
victim (and sets its ``DisruptionTarget`` condition, reason ``PreemptionByScheduler``). This
watches those Events only (a field selector on ``reason``: a handful per preemption, not a watch
of every pod in the cluster), then reads the victim once to learn its controller (the victim is
still terminating through its grace period). A credit expires after ``ttl`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

__all__ = ["Credit", "PreemptionTracker", "controller_uid"]

log = logging.getLogger(__name__)

Body = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Credit:
    """One preempted replica of a controller: ``victim`` (namespace/name), when (epoch s)."""

    victim: str
    at: float


def controller_uid(pod: Mapping[str, Any]) -> str | None:
    """The UID of the pod's controlling owner (its ReplicaSet), or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("uid"):
            return str(ref["uid"])
    return None


def _generated_from(namespace: str, name: str) -> str | None:
    """The key of pods a controller names ``<prefix>-<suffix>`` (ReplicaSets: 5 characters)."""
    prefix, sep, suffix = name.rpartition("-")
    return f"name:{namespace}/{prefix}-" if sep and prefix and len(suffix) == 5 else None


def _keys(pod: Mapping[str, Any]) -> list[str]:
    meta = pod.get("metadata") or {}
    keys = [k for k in (controller_uid(pod),) if k]
    generate = meta.get("generateName")
    if isinstance(generate, str) and generate:
        keys.append(f"name:{meta.get('namespace', '')}/{generate}")
    return keys


def _created(pod: Mapping[str, Any]) -> float | None:
    raw = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return parse_time(raw).timestamp() if isinstance(raw, str) else None
    except TimeFormatError:
        return None


class PreemptionTracker:
    """Credits per controller UID, from the scheduler's ``Preempted`` events."""

    def __init__(self, *, client: KubeClient, ttl: float = 600.0,
                 clock: Callable[[], float] = time.time,
                 on_credit: Callable[[], None] | None = None) -> None:
        self.client = client
        self.ttl = ttl
        self.clock = clock
        self.on_credit = on_credit
        self.credits: dict[str, list[Credit]] = {}  # controller uid -> credits, oldest first
        self._seen: set[str] = set()  # victim pod UIDs already credited
        self._tasks: set[asyncio.Task[None]] = set()
        self.informer = Informer(client=client, path="/api/v1/events",
                                 params={"fieldSelector": "reason=Preempted"},
                                 name="preemptions", handler=self._on_event)

    def _on_event(self, kind: str, event: Body) -> None:
        if kind == "DELETED":
            return
        obj = event.get("involvedObject") or {}
        uid = str(obj.get("uid") or "")
        if obj.get("kind") != "Pod" or not uid or uid in self._seen:
            return
        when = self._event_time(event)
        if when is None or self.clock() - when > self.ttl:
            return  # an old event from the relist: its replacement was decided long ago
        self._seen.add(uid)
        task = asyncio.get_running_loop().create_task(
            self._credit(namespace=str(obj.get("namespace", "")), name=str(obj.get("name", "")),
                         uid=uid, at=when))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _event_time(event: Body) -> float | None:
        for key in ("eventTime", "lastTimestamp", "firstTimestamp"):
            raw = event.get(key)
            if isinstance(raw, str) and raw:
                try:
                    return parse_time(raw).timestamp()
                except TimeFormatError:
                    continue
        meta = event.get("metadata") or {}
        raw = meta.get("creationTimestamp")
        try:
            return parse_time(raw).timestamp() if isinstance(raw, str) else None
        except TimeFormatError:
            return None

    async def _credit(self, *, namespace: str, name: str, uid: str, at: float) -> None:
        try:
            victim = await self.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFoundError:
            # Already gone (a short grace period): a ReplicaSet's replacement shares its
            # generated name's prefix, which is all that is left to go by.
            key = _generated_from(namespace, name)
            if key is not None:
                self._add(key, Credit(victim=f"{namespace}/{name}", at=at))
            return
        except APIError as exc:
            log.warning("preempted pod not readable", extra=kv(pod=f"{namespace}/{name}",
                                                                error=str(exc)))
            self._seen.discard(uid)
            return
        if (victim.get("metadata") or {}).get("uid") != uid:
            return
        owner = controller_uid(victim)
        if owner is None:
            return  # a bare pod has no replacement coming
        self._add(owner, Credit(victim=f"{namespace}/{name}", at=at))

    def _add(self, key: str, credit: Credit) -> None:
        self.credits.setdefault(key, []).append(credit)
        log.info("replica preempted by the scheduler: its replacement overflows at once",
                 extra=kv(pod=credit.victim, owner=key))
        if self.on_credit is not None:
            self.on_credit()

    def credit_for(self, pod: Mapping[str, Any]) -> Credit | None:
        """A credit this pending pod may use (it replaces a preempted replica), or None."""
        now = self.clock()
        created = _created(pod)
        for key in _keys(pod):
            for credit in self.credits.get(key, []):
                # a live credit, and the replacement comes after the preemption (a second's
                # slack for clock skew)
                if now - credit.at <= self.ttl and (created is None or created >= credit.at - 1.0):
                    return credit
        return None

    def use(self, pod: Mapping[str, Any], credit: Credit) -> None:
        """The pod was admitted on ``credit``: spend it."""
        for key in _keys(pod):
            credits = self.credits.get(key, [])
            if credit in credits:
                credits.remove(credit)
                if not credits:
                    self.credits.pop(key, None)
                return

    def prune(self) -> None:
        """Forget expired credits (called each admission pass)."""
        now = self.clock()
        for owner in list(self.credits):
            kept = [c for c in self.credits[owner] if now - c.at <= self.ttl]
            if kept:
                self.credits[owner] = kept
            else:
                del self.credits[owner]
        if len(self._seen) > 10_000:
            self._seen.clear()

"""The preemption fast path: a replica the scheduler preempted is replaced on the cloud at once.

Why it exists: when the scheduler preempts an inference replica for a higher-priority pod (a
training gang), its ReplicaSet makes a replacement that cannot fit inside: the GPUs it had are
the preemptor's now. Waiting a policy's ``overflowAfter`` for that replacement only lengthens the
dip in serving capacity; the wait exists to give the scheduler a chance inside, and preemption
already answered that question. So each preemption of a pod owned by a controller gives that
controller one *credit*: its next pending pod created after the preemption is admitted without
waiting (every other policy rule still applies: selection, budget, dry run).

Whom it believes (the fast path skips a policy's wait, so a forged preemption would be a way to
jump it): a credit needs two signals about the same victim, by its UID, and neither alone grants
anything:

* the victim pod's ``DisruptionTarget`` condition, status True, reason ``PreemptionByScheduler``,
  seen on the companion's pod watch (a pod *status* write: the scheduler makes it before it
  deletes the victim; a pod's author cannot, and an eviction or a taint says another reason);
* the scheduler's ``Preempted`` Event naming that victim, reported by the scheduler
  (``reportingComponent`` or ``source.component`` is one of ``schedulers``, by default
  ``default-scheduler``). Anyone allowed to create Events can write such an Event; it only
  confirms what the pod watch saw.

The victim is read from the pod watch as it happens, so a victim deleted before its Event
arrives (a short grace period) still counts; a companion that was not running when the
condition was written (it appears on no pod it lists) gives no credit, honestly: the replacement
waits ``overflowAfter``. Credits are keyed by the victim's UID and bound to its controller's UID
(never to a name). One credit admits one replacement, created after the preemption, within
``ttl`` seconds of it.

Spent credits survive a restart: before the replacement is admitted, the victim gets the
annotation ``vkprovider.io/preemption-credit-used`` (:meth:`PreemptionTracker.claim`); a victim
seen with it gives no credit again. A crash between the two writes loses the credit (the
replacement waits), never grants twice. A victim already gone when its credit is spent needs no
mark: nothing can see it again after a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

__all__ = ["DEFAULT_SCHEDULERS", "USED_ANNOTATION", "Credit", "PreemptionTracker",
           "controller_uid", "disruption", "event_from_scheduler"]

log = logging.getLogger(__name__)

Body = dict[str, Any]

#: The reporting component of the scheduler whose preemptions are believed.
DEFAULT_SCHEDULERS = ("default-scheduler",)
#: On a victim whose credit was spent (its value: the replacement pod, namespace/name).
USED_ANNOTATION = "vkprovider.io/preemption-credit-used"
#: At most this many victims, reports and credits are remembered (each expires after ``ttl``).
MAX_REMEMBERED = 10_000


@dataclass(frozen=True, kw_only=True)
class Credit:
    """One preempted replica: ``victim`` (namespace/name), its UID, its controller's, when."""

    victim: str
    victim_uid: str
    owner: str
    at: float


@dataclass(frozen=True, kw_only=True)
class _Victim:
    name: str  # namespace/name
    owner: str
    at: float  # the condition's lastTransitionTime (epoch s)


def controller_uid(pod: Mapping[str, Any]) -> str | None:
    """The UID of the pod's controlling owner (its ReplicaSet), or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("uid"):
            return str(ref["uid"])
    return None


def disruption(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """A True ``DisruptionTarget`` condition's (reason, lastTransitionTime), or None.

    Reads a full pod's conditions, or the ``disruptionTarget`` a slim cached pod keeps
    (descheduler/fit.py ``slim_pod``)."""
    status = pod.get("status") or {}
    if "disruptionTarget" in status:
        slim = status.get("disruptionTarget")
        return (str(slim.get("reason") or ""), str(slim.get("at") or "")) \
            if isinstance(slim, Mapping) else None
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "DisruptionTarget" \
                and cond.get("status") == "True":
            return str(cond.get("reason") or ""), str(cond.get("lastTransitionTime") or "")
    return None


def event_from_scheduler(event: Mapping[str, Any], schedulers: Collection[str]) -> bool:
    """The Event says one of ``schedulers`` reported it (what the real one writes)."""
    source = event.get("source") or {}
    reporters = {event.get("reportingComponent"),
                 source.get("component") if isinstance(source, Mapping) else None}
    return any(isinstance(r, str) and r in schedulers for r in reporters)


def _epoch(raw: object) -> float | None:
    try:
        return parse_time(raw).timestamp() if isinstance(raw, str) and raw else None
    except TimeFormatError:
        return None


def _created(pod: Mapping[str, Any]) -> float | None:
    return _epoch((pod.get("metadata") or {}).get("creationTimestamp"))


def _bounded(store: dict[str, Any]) -> None:
    """Drop the oldest entries (insertion order) past :data:`MAX_REMEMBERED`."""
    while len(store) > MAX_REMEMBERED:
        del store[next(iter(store))]


class PreemptionTracker:
    """Credits per victim UID, from the scheduler's condition on the victim and its Event."""

    def __init__(self, *, client: KubeClient, ttl: float = 600.0,
                 clock: Callable[[], float] = time.time,
                 on_credit: Callable[[], None] | None = None,
                 schedulers: Collection[str] = DEFAULT_SCHEDULERS) -> None:
        self.client = client
        self.ttl = ttl
        self.clock = clock
        self.on_credit = on_credit
        self.schedulers = frozenset(schedulers)
        self.credits: dict[str, Credit] = {}  # victim uid -> its credit, oldest first
        self._victims: dict[str, _Victim] = {}  # victim uid -> seen preempted on the pod watch
        self._reported: dict[str, float] = {}  # victim uid -> the scheduler's Event (epoch s)
        self._used: dict[str, float] = {}  # victim uids whose credit is spent -> when
        self.informer = Informer(client=client, path="/api/v1/events",
                                 params={"fieldSelector": "reason=Preempted"},
                                 name="preemptions", handler=self._on_event)

    # ---- the two signals -----------------------------------------------------------------------

    def observe_pod(self, kind: str, pod: Body) -> None:
        """A pod from the companion's pod watch (every pod: keep this cheap)."""
        found = disruption(pod)
        if found is None or found[0] != "PreemptionByScheduler":
            return
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        owner = controller_uid(pod)
        if not uid or owner is None:
            return  # a bare pod has no replacement coming
        if USED_ANNOTATION in (meta.get("annotations") or {}):
            self._spent(uid)  # spent before a restart (or by another leader)
            return
        if uid in self._used or uid in self._victims:
            return
        at = _epoch(found[1])
        if at is None or self.clock() - at > self.ttl:
            return  # long ago: its replacement was decided then
        self._victims[uid] = _Victim(name=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                                     owner=owner, at=at)
        _bounded(self._victims)
        self._match(uid)

    def _on_event(self, kind: str, event: Body) -> None:
        if kind == "DELETED" or event.get("reason") != "Preempted":
            return
        obj = event.get("involvedObject") or {}
        uid = str(obj.get("uid") or "")
        if obj.get("kind") != "Pod" or not uid or uid in self._reported:
            return
        if not event_from_scheduler(event, self.schedulers):
            log.info("Preempted event not from the scheduler: ignored",
                     extra=kv(pod=f"{obj.get('namespace', '')}/{obj.get('name', '')}",
                              reporter=str(event.get("reportingComponent") or "")[:63]))
            return
        when = self._event_time(event)
        if when is None or self.clock() - when > self.ttl:
            return  # an old event from the relist: its replacement was decided long ago
        self._reported[uid] = when
        _bounded(self._reported)
        self._match(uid)

    def _match(self, uid: str) -> None:
        victim = self._victims.get(uid)
        if victim is None or uid not in self._reported or uid in self._used \
                or uid in self.credits:
            return
        credit = Credit(victim=victim.name, victim_uid=uid, owner=victim.owner, at=victim.at)
        self.credits[uid] = credit
        _bounded(self.credits)
        log.info("replica preempted by the scheduler: its replacement overflows at once",
                 extra=kv(pod=victim.name, owner=victim.owner))
        if self.on_credit is not None:
            self.on_credit()

    @staticmethod
    def _event_time(event: Body) -> float | None:
        for key in ("eventTime", "lastTimestamp", "firstTimestamp"):
            when = _epoch(event.get(key))
            if when is not None:
                return when
        return _epoch((event.get("metadata") or {}).get("creationTimestamp"))

    # ---- spending ------------------------------------------------------------------------------

    def credit_for(self, pod: Mapping[str, Any]) -> Credit | None:
        """A credit this pending pod may use (it replaces a preempted replica), or None."""
        owner = controller_uid(pod)
        if owner is None:
            return None
        now = self.clock()
        created = _created(pod)
        for credit in self.credits.values():
            # its controller's, live, and the replacement comes after the preemption (a
            # second's slack: the condition's time is truncated to the second)
            if credit.owner == owner and now - credit.at <= self.ttl \
                    and created is not None and created >= credit.at - 1.0:
                return credit
        return None

    async def claim(self, credit: Credit, *, replacement: str) -> bool:
        """Spend ``credit`` before ``replacement`` (namespace/name) is admitted on it: mark the
        victim so no restart grants it again. False: not recorded (retry on a later pass)."""
        namespace, _, name = credit.victim.partition("/")
        try:
            await self.client.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", {
                "metadata": {"uid": credit.victim_uid,  # a precondition: this victim only
                             "annotations": {USED_ANNOTATION: replacement}}})
        except (NotFoundError, ConflictError):
            pass  # gone (a conflict: another pod by that name): no pod watch can see it again
        except APIError as exc:
            log.warning("could not mark a preemption credit spent",
                        extra=kv(pod=credit.victim, error=str(exc)))
            return False
        self._spent(credit.victim_uid)
        return True

    def _spent(self, uid: str) -> None:
        self.credits.pop(uid, None)
        self._victims.pop(uid, None)
        self._used[uid] = self.clock()
        _bounded(self._used)

    def prune(self) -> None:
        """Forget expired victims, reports and credits (called each admission pass)."""
        now = self.clock()
        for uid in [u for u, c in self.credits.items() if now - c.at > self.ttl]:
            del self.credits[uid]
        for uid in [u for u, v in self._victims.items() if now - v.at > self.ttl]:
            del self._victims[uid]
        for plain in (self._reported, self._used):
            for uid in [u for u, at in plain.items() if now - at > self.ttl]:
                del plain[uid]

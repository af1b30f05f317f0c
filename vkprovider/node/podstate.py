"""One record per pod on the node: what the engine knows and told about it, and its named state.

Why it exists: the pod engine used to keep some dozen dicts and sets keyed by pod UID (first
seen, unsure create, told blind, told no capacity, tries, told created, running seen, ...); each
one had to be cleaned up by hand when the pod went, and one forgotten ``pop`` was a leak or a
stale Event. Here a pod has ONE :class:`PodRecord` (slots; what matters only while it waits
for a placement sits in a :class:`Waiting`, dropped once it is placed), created when the watch
first shows the pod and dropped as a whole when the pod is gone and its instance deleted.

Where the pod's instance lives stays in :class:`~vkprovider.node.placements.Placements` (it
keeps per-account totals incrementally and is read by the kubelet API's view); the record is
everything else.

:func:`stage_of` names the state a pod is in from the pod, its placement and its record;
``PodController.reconcile`` dispatches on it (docs/architecture.md has the transitions), and
after every reconcile withdraws the endpoints of a pod whose state allows none
(:func:`serving_of`: what a Service may see of the pod's replica).

=========== =============================================== ==================================
stage       when                                            reconcile does
=========== =============================================== ==================================
UNPLACED    live pod, no instance, no create in doubt       admit, translate, place, create
UNSURE      live pod, no instance seen, a create in doubt   create again on the same provider
BOOTING     instance placed, not running yet                status from the instance
RUNNING     instance running                                probes, endpoints, status
EXITED      instance succeeded or failed                    pod Succeeded/Failed (or restart)
FINISHED    pod Succeeded or Failed                         stop spending: delete the instance
TERMINATING pod has a deletionTimestamp                     drain, delete instance, delete pod
GONE        pod no longer on the node                       delete the instance, drop record
=========== =============================================== ==================================
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from providers.base import Instance, InstanceState
from vkprovider.node.placements import Placed
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

__all__ = ["DONE_STATES", "TERMINAL", "Body", "PodRecord", "PodStates", "Retry", "Serving",
           "Stage", "Waiting", "describe", "is_ready", "parse_time_or_none", "pod_ref",
           "serving_of", "stage_of"]

_TERMINAL = ("Succeeded", "Failed")


class Stage(enum.Enum):
    """The named states of a pod on the virtual node (module docstring)."""

    UNPLACED = "Unplaced"
    UNSURE = "Unsure"
    BOOTING = "Booting"
    RUNNING = "Running"
    EXITED = "Exited"
    FINISHED = "Finished"
    TERMINATING = "Terminating"
    GONE = "Gone"


@dataclass(slots=True)
class Waiting:
    """What the engine keeps about a pod still to be placed; dropped once its instance is
    created, so a steady node's records carry none of it."""

    unsure: tuple[str, float] | None = None  # (provider, since): a create's outcome unknown
    told_blind: bool = False  # told (event) that it waits for a provider list
    told_no_capacity: str | None = None  # the NoCapacity summary last told
    told_budget: str | None = None  # the BudgetExceeded message last told
    unplaced_tries: int = 0  # placements that found no provider


@dataclass(slots=True)
class PodRecord:
    """Everything the engine keeps about one pod besides its placement."""

    first_seen: float  # clock() the watch first showed it
    key: str | None = None  # namespace/name while the watch shows it; None once deleted
    inherited: bool = False  # bound before our first sync: a predecessor may have created it
    running_seen: float | None = None  # wall time its instance was first seen running
    told_created: bool = False  # its ProviderCreated Event was recorded
    waiting: Waiting | None = None  # while it is still to be placed

    def wait(self) -> Waiting:
        """Its placement facts, made when first needed."""
        if self.waiting is None:
            self.waiting = Waiting()
        return self.waiting

    @property
    def unsure(self) -> tuple[str, float] | None:
        return None if self.waiting is None else self.waiting.unsure


def stage_of(*, pod: Mapping[str, Any] | None, placed: Placed | None,
             record: PodRecord | None) -> Stage:
    """The state a pod is in (module docstring); pure."""
    if pod is None:
        return Stage.GONE
    if pod["metadata"].get("deletionTimestamp"):
        return Stage.TERMINATING
    if (pod.get("status") or {}).get("phase") in _TERMINAL:
        return Stage.FINISHED
    if placed is None:
        return Stage.UNSURE if record is not None and record.unsure else Stage.UNPLACED
    state = placed.instance.state
    if state == InstanceState.RUNNING:
        return Stage.RUNNING
    if state in (InstanceState.SUCCEEDED, InstanceState.FAILED):
        return Stage.EXITED
    return Stage.BOOTING


class Serving(enum.Enum):
    """What a Service sees of a pod's replica (its entries in the EndpointSlices)."""

    NONE = "none"  # no entries: withdrawn
    HELD = "held"  # kept exactly as the slices hold them: its cloud not listed since a restart
    REPLICA = "replica"  # published by the status path: ready/serving from the probes while
    #                      it runs, not ready while it boots, restarts or has exited
    TERMINATING = "terminating"  # draining: serving, not ready, terminating


def serving_of(stage: Stage, *, held: bool, draining: bool) -> Serving:
    """What a Service may see of a pod in ``stage``; pure. Recomputed after every reconcile
    (``PodController.reconcile``): whatever path ran, a pod whose state allows no endpoints
    has none afterwards, so no call site can forget to withdraw them."""
    if held:
        return Serving.HELD  # until its cloud's list says what it is (node/podsweep.py)
    if stage in (Stage.BOOTING, Stage.RUNNING, Stage.EXITED):
        return Serving.REPLICA
    if stage is Stage.TERMINATING and draining:
        return Serving.TERMINATING
    return Serving.NONE


class PodStates:
    """Pod UID -> :class:`PodRecord`, with the few indexes a sweep needs kept as it changes."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._records: dict[str, PodRecord] = {}
        self._watched = 0  # records with a key (pods the watch shows)
        self._unsure: set[str] = set()  # uids whose record has ``unsure`` set (a few at most)
        #: uid -> namespace/name of every pod the watch shows (a live view)
        self.keys = _Keys(self)
        #: uid -> (provider, since) of every create in doubt (a live view)
        self.unsure = _Unsure(self)

    def __contains__(self, uid: object) -> bool:
        return uid in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, uid: str) -> PodRecord | None:
        return self._records.get(uid)

    def ensure(self, uid: str) -> PodRecord:
        record = self._records.get(uid)
        if record is None:
            record = self._records[uid] = PodRecord(first_seen=self._clock())
        return record

    def watched(self, uid: str, key: str) -> PodRecord:
        """The watch shows the pod (added or updated)."""
        record = self.ensure(uid)
        if record.key is None:
            self._watched += 1
        record.key = key
        return record

    def unwatched(self, uid: str) -> None:
        """The watch says the pod was deleted: its record stays until its instance is gone."""
        record = self._records.get(uid)
        if record is not None and record.key is not None:
            record.key = None
            self._watched -= 1

    def drop(self, uid: str) -> None:
        """The pod is gone and its instance deleted (or never made): forget it entirely."""
        record = self._records.pop(uid, None)
        if record is None:
            return
        if record.key is not None:
            self._watched -= 1
        self._unsure.discard(uid)

    def set_unsure(self, uid: str, value: tuple[str, float] | None) -> None:
        if value is None:
            record = self._records.get(uid)
            if record is not None and record.waiting is not None:
                record.waiting.unsure = None
            self._unsure.discard(uid)
            return
        self.ensure(uid).wait().unsure = value
        self._unsure.add(uid)

    def mark_inherited(self) -> None:
        """Every pod the watch shows now was bound before our first sync."""
        for record in self._records.values():
            if record.key is not None:
                record.inherited = True

    def inherited(self) -> set[str]:
        return {uid for uid, r in self._records.items() if r.inherited}

    def set_inherited(self, uids: set[str]) -> None:
        for uid, record in self._records.items():
            record.inherited = uid in uids
        for uid in uids:
            self.ensure(uid).inherited = True


class _Keys(MutableMapping[str, str]):
    """uid -> namespace/name of the pods the watch shows, over the records."""

    def __init__(self, states: PodStates) -> None:
        self._s = states

    def __getitem__(self, uid: str) -> str:
        record = self._s._records.get(uid)
        if record is None or record.key is None:
            raise KeyError(uid)
        return record.key

    def get(self, uid: str, default: Any = None) -> Any:  # hot path: no exception
        record = self._s._records.get(uid)
        return default if record is None or record.key is None else record.key

    def __contains__(self, uid: object) -> bool:
        record = self._s._records.get(uid) if isinstance(uid, str) else None
        return record is not None and record.key is not None

    def __setitem__(self, uid: str, key: str) -> None:
        self._s.watched(uid, key)

    def __delitem__(self, uid: str) -> None:
        if uid not in self:
            raise KeyError(uid)
        self._s.unwatched(uid)

    def __iter__(self) -> Iterator[str]:
        return (uid for uid, r in list(self._s._records.items()) if r.key is not None)

    def __len__(self) -> int:
        return self._s._watched


class _Unsure(MutableMapping[str, tuple[str, float]]):
    """uid -> (provider, since) of the creates in doubt, over the records."""

    def __init__(self, states: PodStates) -> None:
        self._s = states

    def __getitem__(self, uid: str) -> tuple[str, float]:
        record = self._s._records.get(uid)
        if record is None or record.unsure is None:
            raise KeyError(uid)
        return record.unsure

    def __contains__(self, uid: object) -> bool:
        return uid in self._s._unsure

    def __setitem__(self, uid: str, value: tuple[str, float]) -> None:
        self._s.set_unsure(uid, value)

    def __delitem__(self, uid: str) -> None:
        if uid not in self._s._unsure:
            raise KeyError(uid)
        self._s.set_unsure(uid, None)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._s._unsure))

    def __len__(self) -> int:
        return len(self._s._unsure)


# ---- shared by the engine's modules (pods, podcreate, podsync, podend, podsweep) ------------

Body = dict[str, Any]
TERMINAL = _TERMINAL
DONE_STATES = (InstanceState.SUCCEEDED, InstanceState.FAILED)


class Retry(Exception):
    """Reconcile again later (``after`` seconds, or backoff when None)."""

    def __init__(self, reason: str, *, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


def parse_time_or_none(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return parse_time(value)
    except TimeFormatError:
        return None


def is_ready(pod: Mapping[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def pod_ref(pod: Mapping[str, Any]) -> Body:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}


def describe(inst: Instance) -> str:
    parts = [f"{inst.gpu_count}x {inst.gpu_type or 'GPU'}"]
    if inst.region:
        parts.append(inst.region)
    parts.append(f"${inst.price_per_hour:.2f}/h")
    return ", ".join(parts)

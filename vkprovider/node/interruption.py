"""Interruptible (spot) instances: a reclaimed one ends its pod, an announced one is marked.

Why it exists: a cloud that sells interruptible capacity takes it back when it needs it. Two
cases reach the pod controller (node/pods.py), which calls in here:

* unplanned: the instance is gone under the pod (``Instance.interrupted``, state FAILED). That is
  handled like a crash that cannot be restarted in place (the machine is gone): the pod becomes
  Failed with reason ``InstanceInterrupted`` and a Warning Event naming the cloud, the instance is
  deleted (it stops billing, nothing leaks), and the pod's controller makes a new replica, placed
  as any other pod.
* planned: the cloud announced when it will reclaim it (``Instance.interruption_at``). The pod
  gets the condition ``vkprovider.io/InterruptionPlanned=True`` (reason ``InterruptionAnnounced``,
  the time in the message; written with the status the pod controller computes, so no extra
  write) and one ``InterruptionPlanned`` Warning Event. The companion replaces such a replica
  make-before-break (descheduler/hotswap.py), as it does for a hot GPU.

Messages carry the cloud's name, the instance id and times, never a credential.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from providers.base import Instance
from vkprovider.logs import kv
from vkprovider.placement.spot import CONDITION_PLANNED

if TYPE_CHECKING:
    from vkprovider.node.placements import Placed
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)

Body = dict[str, Any]

REASON_INTERRUPTED = "InstanceInterrupted"  # pod status reason and Event reason
REASON_PLANNED = "InterruptionPlanned"  # Event reason
REASON_ANNOUNCED = "InterruptionAnnounced"  # condition reason

__all__ = ["CONDITION_PLANNED", "REASON_INTERRUPTED", "REASON_PLANNED", "planned_condition",
           "reclaimed", "tell_planned"]


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def planned_condition(instance: Instance, *, previous: Mapping[str, Any] | None,
                      now: datetime) -> dict[str, Any] | None:
    """The ``InterruptionPlanned`` condition for a pod whose instance the cloud announced it will
    reclaim (None when nothing is announced). ``previous``: the pod's condition as stored, whose
    ``lastTransitionTime`` is kept while the status stays ``True``."""
    if instance.interruption_at is None:
        return None
    since = (previous or {}).get("lastTransitionTime") \
        if (previous or {}).get("status") == "True" else None
    return {"type": CONDITION_PLANNED, "status": "True", "lastProbeTime": None,
            "lastTransitionTime": since or _stamp(now), "reason": REASON_ANNOUNCED,
            "message": f"{instance.provider} will reclaim instance {instance.id} at "
                       f"{_stamp(instance.interruption_at)}"}


def _planned(status: Mapping[str, Any]) -> bool:
    return any(isinstance(c, Mapping) and c.get("type") == CONDITION_PLANNED
               and c.get("status") == "True" for c in status.get("conditions") or [])


async def tell_planned(c: PodController, pod: Body, *, old: Mapping[str, Any],
                       new: Mapping[str, Any], placed: Placed) -> None:
    """One Warning Event when a status write first marks the pod ``InterruptionPlanned``."""
    if not _planned(new) or _planned(old):
        return
    inst = placed.instance
    at = _stamp(inst.interruption_at) if inst.interruption_at is not None else "soon"
    log.warning("interruption announced", extra=kv(pod=_key(pod), provider=placed.provider,
                                                   instance=inst.id, at=at))
    await c.events.emit(obj=_ref(pod), reason=REASON_PLANNED, type_="Warning",
                        message=f"{placed.provider} announced it will reclaim interruptible "
                                f"instance {inst.id} at {at}; the replica is replaced before then "
                                "where the companion can (a Deployment)")


async def reclaimed(c: PodController, pod: Body, *, placed: Placed) -> None:
    """The cloud took the instance back: the pod fails (its controller replaces it) and the
    instance is deleted, as after a crash that cannot be restarted in place. Counted in
    ``vkprovider_pods_rejected_total{reason="InstanceInterrupted"}``."""
    # imported here: the status path (podsync) imports this module's conditions
    from vkprovider.node import podend, podsync

    inst = placed.instance
    detail = f": {inst.message}" if inst.message else ""
    await podsync.reject(c, pod, reason=REASON_INTERRUPTED,
                         message=f"{placed.provider} reclaimed interruptible instance "
                                 f"{inst.id}{detail}")
    await podend.stop_spend(c, placed)


def _key(pod: Body) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _ref(pod: Body) -> Body:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}

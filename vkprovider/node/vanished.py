"""A vanished instance is a container that died: what the pod controller does when one goes.

Why it exists: an instance can disappear from its cloud's list with nobody asking (the host
died, someone deleted it in the console). Sent straight back to create, such a pod kept its
endpoint ``ready`` on an address that was released, a Job's ``restartPolicy: Never`` pod ran a
second time without a trace, ``restartCount`` stood still, and a failed re-create of a pod older
than the create deadline failed it at once (the deadline counted from ``creationTimestamp``).

Here it is what a kubelet does when a container dies:

* found by a sweep: a live pod's instance that an earlier list showed is missing from a list of
  its provider that succeeded, and we asked for no delete. Its endpoints are withdrawn in that
  same sweep (never routed to a released address);
* the container is terminated: reason ``InstanceVanished``, the message names the cloud and the
  instance; a Warning Event of the same reason;
* ``restartPolicy`` decides: ``Never`` fails the pod (counted in
  ``vkprovider_pods_rejected_total{reason="InstanceVanished"}``); ``Always`` and ``OnFailure``
  (a vanished instance is a failure) get a new instance placed as any create (not pinned to the
  cloud that lost it), the container waiting with the vanishing in ``lastState`` and
  ``restartCount`` one up, kept above the new instance's own restarts;
* the create deadline of the new instance counts from the vanishing, not from the pod's birth.

What is remembered lives in this process only (:class:`VanishBook`); the pod's status keeps the
restart count across a restart of the provider (``restartCount`` never goes down).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from providers.base import InstanceState
from vkprovider.logs import kv
from vkprovider.node import podstatus, podsync
from vkprovider.node.placements import InstanceKey, Placed
from vkprovider.semantics.timefmt import format_time

if TYPE_CHECKING:
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)

__all__ = [
    "REASON",
    "Vanish",
    "VanishBook",
    "carry",
    "detect",
    "found",
    "message",
    "restart_status",
    "restarts_after",
    "tell",
    "wants_restart",
]

REASON = "InstanceVanished"  # container termination reason, pod status reason, Event reason

Body = dict[str, Any]

#: Instance states a vanishing is news for (a done or terminating one was expected to go).
_LIVE_STATES = (InstanceState.PENDING, InstanceState.RUNNING)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Vanish:
    """One instance gone under its pod: where it was, and when a list proved it gone."""

    provider: str
    instance_id: str
    at: datetime  # wall time of the sweep that found it gone
    restart_count: int  # the pod's restartCount once this death is counted
    started_at: str | None = None  # the container's startedAt, as the pod's status had it
    handled: bool = False  # told (status, Event); what is left is the new create

    def last_state(self) -> Body:
        """The container's ``lastState``: terminated, reason ``InstanceVanished``."""
        terminated: Body = {"exitCode": 137, "reason": REASON, "message": message(self),
                            "finishedAt": format_time(self.at)}
        if self.started_at:
            terminated["startedAt"] = self.started_at
        return {"terminated": terminated}


class VanishBook:
    """Pod UID -> its instance's vanishing, until the pod is gone or finished."""

    def __init__(self) -> None:
        self._by_uid: dict[str, Vanish] = {}

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def get(self, uid: str) -> Vanish | None:
        return self._by_uid.get(uid)

    def note(self, uid: str, vanish: Vanish) -> None:
        self._by_uid[uid] = vanish

    def handled(self, uid: str) -> None:
        found = self._by_uid.get(uid)
        if found is not None:
            self._by_uid[uid] = dataclasses.replace(found, handled=True)

    def pending(self, uid: str) -> Vanish | None:
        """The vanishing still to be told (status, Event, restartPolicy), if any."""
        found = self._by_uid.get(uid)
        return found if found is not None and not found.handled else None

    def since(self, uid: str) -> datetime | None:
        found = self._by_uid.get(uid)
        return None if found is None else found.at

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def rename_provider(self, old: str, new: str) -> None:
        self._by_uid = {uid: (dataclasses.replace(v, provider=new) if v.provider == old else v)
                        for uid, v in self._by_uid.items()}


def detect(*, before: Mapping[str, Placed], after: Mapping[str, Placed],
           listed: Mapping[str, bool], list_started: Mapping[str, float],
           deleting: Callable[[InstanceKey], float | None],
           pods: Callable[[str], bool]) -> list[tuple[str, Placed]]:
    """The instances a sweep proved gone: listed before (never only known from our create: a
    list may lag behind it), in a live state, their provider listed by a list that started
    after they were last seen, no delete of ours, absent from the sweep's view, and their pod
    still on the node (``pods``)."""
    out: list[tuple[str, Placed]] = []
    for uid, placed in before.items():
        if uid in after or not placed.listed or not pods(uid):
            continue
        if not listed.get(placed.provider, False):
            continue
        started = list_started.get(placed.provider)
        if started is None or started <= placed.seen_at:
            continue
        if placed.instance.state not in _LIVE_STATES or deleting(placed.key) is not None:
            continue
        out.append((uid, placed))
    return out


def wants_restart(pod: Mapping[str, Any]) -> bool:
    """The kubelet's rule for a container that died (a vanishing is a failure): ``Always`` and
    ``OnFailure`` restart it, ``Never`` does not."""
    policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
    return policy != "Never"


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    first = statuses[0] if statuses and isinstance(statuses[0], Mapping) else {}
    return first


def restarts_after(pod: Mapping[str, Any], placed: Placed) -> int:
    """The pod's ``restartCount`` once this death is counted: one more than it had."""
    current = _container_status(pod).get("restartCount")
    had = current if isinstance(current, int) and not isinstance(current, bool) else 0
    return max(had, placed.instance.restart_count) + 1


def started_at(pod: Mapping[str, Any]) -> str | None:
    state = _container_status(pod).get("state") or {}
    for kind in ("running", "terminated"):
        value = (state.get(kind) or {}).get("startedAt") if isinstance(state, Mapping) else None
        if isinstance(value, str) and value:
            return value
    return None


def message(vanish: Vanish) -> str:
    return (f"instance {vanish.instance_id} on {vanish.provider} vanished: its cloud no longer "
            "lists it and vkprovider did not delete it (host lost, or deleted outside "
            "Kubernetes)")


def restart_status(*, pod: Mapping[str, Any], vanish: Vanish, now: datetime) -> Body:
    """The pod while a new instance is made: phase kept (Running stays Running), the container
    waiting (``ContainerCreating``), not ready, the vanishing in ``lastState`` and
    ``restartCount`` counted."""
    status: Body = dict(pod.get("status") or {})
    status.pop("reason", None)
    status.pop("message", None)
    status.pop("podIP", None)
    status.pop("podIPs", None)
    stamp = format_time(now)
    conditions = []
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") in ("Ready", "ContainersReady") \
                and cond.get("status") == "True":
            cond = {**cond, "status": "False", "lastTransitionTime": stamp,
                    "reason": "ContainersNotReady",
                    "message": "containers with unready status: "
                               f"[{_name(pod)}]"}
        conditions.append(cond)
    status["conditions"] = conditions
    current = _container_status(pod)
    container: Body = {
        "name": _name(pod),
        "image": current.get("image") or _image(pod),
        "imageID": current.get("imageID") or "",
        "ready": False,
        "started": False,
        "restartCount": vanish.restart_count,
        "state": {"waiting": {"reason": "ContainerCreating",
                              "message": f"creating a new instance: {message(vanish)}"}},
        "lastState": vanish.last_state(),
    }
    if current.get("containerID"):
        container["containerID"] = current["containerID"]
    status["containerStatuses"] = [container]
    return status


def carry(status: Body, *, vanish: Vanish, instance_restarts: int) -> None:
    """Keep the death counted in a status computed from the new instance: ``restartCount``
    above the new instance's own, and ``lastState`` until a newer termination replaces it."""
    for container in status.get("containerStatuses") or []:
        if not isinstance(container, dict):
            continue
        count = container.get("restartCount")
        have = count if isinstance(count, int) else 0
        container["restartCount"] = max(have, vanish.restart_count + instance_restarts)
        if not container.get("lastState"):
            container["lastState"] = vanish.last_state()
        break


def _first(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    first = containers[0]
    return first if isinstance(first, Mapping) else {}


def _name(pod: Mapping[str, Any]) -> str:
    return str(_first(pod).get("name", ""))


def _image(pod: Mapping[str, Any]) -> str:
    return str(_first(pod).get("image", ""))


def found(c: PodController, vanished: list[tuple[str, Placed]]) -> None:
    """A sweep proved these instances gone: remember when, and withdraw their endpoints now
    (the reconcile that tells the pod may come later; traffic must stop at once)."""
    now = datetime.now(UTC)
    for uid, placed in vanished:
        key = c.pod_keys.get(uid)
        pod = c.informer.store.get(key) if key else None
        if pod is None:
            continue
        c.vanished.note(uid, Vanish(provider=placed.provider, instance_id=placed.instance.id,
                                    at=now, restart_count=restarts_after(pod, placed),
                                    started_at=started_at(pod)))
        c.replicas.forget(uid)
        if (record := c.pods.get(uid)) is not None:
            record.running_seen = None
        log.warning("instance vanished", extra=kv(pod=key, uid=uid, provider=placed.provider,
                                                  instance=placed.instance.id))


async def tell(c: PodController, pod: Body, uid: str) -> bool:
    """Tell a pod its instance vanished, once: True when the pod is done (``Never``: it
    failed), False when a new instance is to be created now."""
    vanish = c.vanished.pending(uid)
    if vanish is None:
        return False
    text = message(vanish)
    ref = {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}
    now = datetime.now(UTC)
    if not wants_restart(pod):
        status = podstatus.failed_status(pod=pod, reason=REASON, message=text, now=now)
        for container in status.get("containerStatuses") or []:
            container["state"] = {"terminated": vanish.last_state()["terminated"]}
            container["restartCount"] = max(0, vanish.restart_count - 1)  # not restarted
        c.metrics.pods_rejected.labels(REASON).inc()
        await podsync.write_status(c, pod, status)
        await c.events.emit(obj=ref, reason=REASON, type_="Warning",
                            message=f"{text}; restartPolicy Never: the pod fails")
        c.vanished.handled(uid)
        return True
    await podsync.write_status(c, pod, restart_status(pod=pod, vanish=vanish, now=now))
    await c.events.emit(obj=ref, reason=REASON, type_="Warning",
                        message=f"{text}; creating a new instance (restart "
                                f"{vanish.restart_count})")
    c.vanished.handled(uid)
    return False

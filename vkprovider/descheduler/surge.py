"""The arithmetic of a make-before-break surge, and of taking it back, with no I/O.

Why it exists: move-back, pre-warm and the hot-replica swap all surge a Deployment (N -> N +
surge) and later take the surge back. Writing the recorded N back as an absolute value silently
reverted whatever happened in between (an HPA that scaled up for load, a ``kubectl scale``), and
raising an HPA's ``minReplicas`` past its ``maxReplicas`` is refused by the API server (422),
which left moves half done. These small decisions are kept pure so unit tests pin them and every
loop takes the same one:

* :func:`scale_back`: the count to write when the surge is undone, relative to the count now;
* :func:`hpa_surge_floor`: the HPA floor a surge needs, or None when the HPA has no room;
* :func:`floor_to_restore`: whether an HPA's ``minReplicas`` is still the one we set;
* :func:`pod_gone`: whether the replaced pod is gone, judged from one read of it;
* :func:`outcome_reason`: why a move ended as it did, when the wait and the ReplicaSet disagree;
* :func:`surge_body` and :func:`scale_back_body`: the guarded Deployment writes of a surge and of
  taking it back, for any intent recorded as an annotation (move-back's, the hot swap's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol


class SurgeIntent(Protocol):
    """What a recorded surge intent has: N before the surge, and its own serialisation."""

    @property
    def replicas(self) -> int: ...

    def dumps(self) -> str: ...


def intent_there(dep: Mapping[str, Any], *, key: str, raw: str) -> bool:
    """Our intent (the annotation ``key`` with exactly the value ``raw``) is on ``dep``."""
    return bool((dep["metadata"].get("annotations") or {}).get(key) == raw)


def surge_body(dep: Mapping[str, Any], *, key: str, raw: str, n: int) -> dict[str, Any] | None:
    """The scale write of the surge N -> N+1, while our intent is on the Deployment and nobody
    changed its count since it was recorded (None: do not surge)."""
    if not intent_there(dep, key=key, raw=raw) or int(dep["spec"].get("replicas") or 0) != n:
        return None
    return {"metadata": {"resourceVersion": dep["metadata"]["resourceVersion"]},
            "spec": {"replicas": n + 1}}


def scale_back_body(dep: Mapping[str, Any], *, key: str, raw: str,
                    intent: SurgeIntent) -> dict[str, Any] | None:
    """One write that takes the surge back relative to the count now and records, in the same
    write, that it did (the intent's ``scaled_back``; None: our intent is not on the Deployment,
    there is nothing of ours to take back)."""
    if not intent_there(dep, key=key, raw=raw):
        return None
    current = int(dep["spec"].get("replicas") or 0)
    back = scale_back(current=current, recorded=intent.replicas, surge=1)
    marked: SurgeIntent = replace(intent, scaled_back=back)  # type: ignore[type-var]
    body: dict[str, Any] = {"metadata": {"resourceVersion": dep["metadata"]["resourceVersion"],
                                         "annotations": {key: marked.dumps()}}}
    if back != current:
        body["spec"] = {"replicas": back}
    return body


def scale_back(*, current: int, recorded: int, surge: int) -> int:
    """The replica count that removes our surge and nothing else.

    ``recorded`` is N before the surge, ``surge`` what was added, ``current`` the Deployment's
    ``spec.replicas`` now. At or above ``N + surge`` the surge is taken off what is there (an HPA
    or a person who scaled up meanwhile keeps their replicas); between N and ``N + surge`` the
    surge was written only in part (a restart between growing the intent and scaling): back to
    N; at or below N nothing of ours is left to remove (never surged, or scaled down by someone
    else since): unchanged.
    """
    if current >= recorded + surge:
        return current - surge
    if current > recorded:
        return recorded
    return current


def hpa_surge_floor(*, hpa_min: int, hpa_max: int | None, replicas: int,
                    surge: int) -> int | None:
    """The ``minReplicas`` that surges a Deployment an HPA scales from ``replicas`` to
    ``replicas + surge``, or None when that is above the HPA's ``maxReplicas`` (the API server
    refuses ``minReplicas > maxReplicas``; an HPA at its maximum, likely exactly while
    overflowing, has no room for a surge replica)."""
    floor = max(hpa_min, replicas + surge)
    if hpa_max is not None and floor > hpa_max:
        return None
    return floor


def floor_to_restore(*, current: int | None, surged_to: int, original: int) -> bool:
    """Whether to write ``original`` back as the HPA's ``minReplicas``: only while it is still
    the floor the surge set (or already the original: a no-op write that also catches a stale
    cache). A floor someone changed since is theirs."""
    return current in (surged_to, original)


def pod_gone(pod: Mapping[str, Any] | None, *, uid: str) -> bool:
    """Whether the pod with ``uid`` is gone, from one read of it by name (None: not found): a
    different uid is a new pod of the same name, a deletion timestamp means it is going."""
    if pod is None:
        return True
    meta = pod.get("metadata") or {}
    return meta.get("uid") != uid or bool(meta.get("deletionTimestamp"))


def outcome_reason(*, reason: str, ready: bool | None, gone: bool, recorded: int,
                   back: int) -> str:
    """Why a move ended as it did, for its Event and log line.

    ``reason`` is why the wait ended, ``ready`` whether the internal replica was ready then
    (None: not known, a recorded move finished after the fact), ``gone`` whether the replaced pod
    is gone, ``recorded`` N before the surge and ``back`` the count the surge was taken back to.
    The ReplicaSet, not the companion, picks the replica the scale-back removes, and it takes a
    not-ready one before any Ready one: when the Deployment was scaled up meanwhile, a new
    replica still starting goes instead of the marked cloud one. That move did not happen, but
    "rolled back: the internal replica is ready" would read as a contradiction, so the reason
    says what happened."""
    if gone and ready is False:
        return f"{reason}; the ReplicaSet removed the cloud replica all the same"
    if ready is True and not gone:
        scaled = f"; the Deployment was scaled from {recorded} to {back} meanwhile" \
            if back != recorded else ""
        return (f"{reason}, but the ReplicaSet took back a replica that was not ready yet "
                f"instead of the cloud one{scaled}; the cloud replica stays and is moved "
                f"again later")
    return reason

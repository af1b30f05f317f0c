"""Endpoints of replicas whose state is unknown stay in their EndpointSlices as they were.

Why it exists: after a restart or a hand-over, the EndpointSlice controller
(node/endpointslices.py) rebuilds every slice from what the pod controller has told it. A replica
on a cloud whose first list failed was never told (its instance is unknown, not gone), so its
endpoint was pruned: one cloud's outage at start-up pulled every healthy replica there out of
every Service until a list succeeded; a first sweep slower than ``pods_sync_timeout`` emptied
every slice. A replica whose state is unknown keeps its endpoint exactly as the API server holds
it, until the pod controller tells what it is (published again, or removed).

:func:`carry_held` merges those endpoints, taken from the slices as they exist, into the slices
the controller wants: into the wanted slice of the same name (same Service, family and ports),
or keeping an existing slice that would otherwise go, with only the held endpoints left.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["carry_held", "endpoint_uid", "held_uids"]

Body = dict[str, Any]


def endpoint_uid(endpoint: Mapping[str, Any]) -> str:
    ref = endpoint.get("targetRef") or {}
    return str(ref.get("uid") or "") if isinstance(ref, Mapping) else ""


def held_uids(slices: Mapping[str, Body], *, held: Callable[[str], bool]) -> set[str]:
    """The pod UIDs of ``slices``' endpoints that ``held`` says to keep."""
    return {uid for body in slices.values() for e in body.get("endpoints") or []
            if (uid := endpoint_uid(e)) and held(uid)}


def carry_held(desired: dict[str, Body], existing: Mapping[str, Body], *,
               held: Callable[[str], bool]) -> None:
    """Add to ``desired`` (slice name -> body, changed in place) every endpoint of
    ``existing`` whose pod ``held`` says is unknown, unless ``desired`` publishes that pod in
    that slice already."""
    for name, current in existing.items():
        keep = [copy.deepcopy(e) for e in current.get("endpoints") or []
                if endpoint_uid(e) and held(endpoint_uid(e))]
        if not keep:
            continue
        wanted = desired.get(name)
        if wanted is None:
            body = copy.deepcopy(dict(current))
            meta = dict(body.get("metadata") or {})
            for key in ("resourceVersion", "managedFields", "uid", "creationTimestamp",
                        "generation"):
                meta.pop(key, None)
            body["metadata"] = meta
            body["endpoints"] = keep
            desired[name] = body
            continue
        there = {endpoint_uid(e) for e in wanted.get("endpoints") or []}
        wanted["endpoints"] = list(wanted.get("endpoints") or []) + [
            e for e in keep if endpoint_uid(e) not in there]

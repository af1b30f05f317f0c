"""Two instances for one pod: which one stays.

Why it exists: a create whose answer was lost, retried where a list lagged behind it, can leave
two instances carrying one pod's UID. One must go, and it must not be the one serving: deleting
whichever the list happened to return second dropped the replica that was Ready (its endpoints,
its warm model) and kept a cold one booting.

The rule, first that decides: the instance the pod's ``vkprovider.io/instance-id`` annotation
names (the one its status, endpoints and users point at); else a running one over one that is
not; else the older (``created_at``; unknown counts as newest); else the one listed first.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from providers.base import InstanceState
from vkprovider.node.placements import Placed
from vkprovider.node.podstatus import ANNOTATION_PREFIX

__all__ = ["INSTANCE_ANNOTATION", "PROVIDER_ANNOTATION", "keep_first"]

INSTANCE_ANNOTATION = f"{ANNOTATION_PREFIX}instance-id"
PROVIDER_ANNOTATION = f"{ANNOTATION_PREFIX}provider"
_LATEST = datetime.max.replace(tzinfo=UTC)


def _rank(placed: Placed, *, named: tuple[str, str] | None, order: int
          ) -> tuple[int, int, datetime, int]:
    instance = placed.instance
    created = instance.created_at or _LATEST
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return (0 if named is not None and named == (placed.provider, instance.id) else 1,
            0 if instance.state == InstanceState.RUNNING else 1,
            created, order)


def keep_first(a: Placed, b: Placed, *, annotations: Mapping[str, str] | None,
               ) -> tuple[Placed, Placed]:
    """``(keep, drop)`` of two instances of one pod; ``a`` was listed before ``b``. The
    annotation names an instance by provider (as served) and id: ids are per cloud."""
    notes = annotations or {}
    instance_id, provider = notes.get(INSTANCE_ANNOTATION), notes.get(PROVIDER_ANNOTATION)
    named = (provider, instance_id) if instance_id and provider else None
    if _rank(b, named=named, order=1) < _rank(a, named=named, order=0):
        return b, a
    return a, b

"""The end of a pod on the node: terminate, finish, go, and the deletes that stop the money.

Why it exists: every way a pod ends (deleted with a grace period, finished, gone from the API,
an instance no pod owns) must end in a cloud delete that is retried until the cloud shows the
instance gone; a cloud that accepted a delete and did nothing is asked again after
``delete_retry_seconds``. Functions of the controller (node/pods.py).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from providers.base import (
    TAG_UID,
    InstanceState,
    NotFound,
    ProviderError,
)
from vkprovider.kube.errors import ConflictError, NotFoundError
from vkprovider.kube.podstatus_write import pod_path
from vkprovider.logs import kv
from vkprovider.node.placements import InstanceKey, Placed
from vkprovider.node.podstate import (
    Body,
    Retry,
    is_ready,
    parse_time_or_none,
    pod_ref,
)

if TYPE_CHECKING:
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)


async def delete_bounded(c: PodController, deletes: list[tuple[str, str, str]]) -> None:
    """Delete ``(provider, instance id, why)`` in parallel, at most 8 calls at once."""
    if not deletes:
        return
    gate = asyncio.Semaphore(8)

    async def one(provider: str, instance_id: str, why: str) -> None:
        async with gate:
            await delete_instance(c, provider, instance_id, why=why)

    await asyncio.gather(*(one(*d) for d in deletes))


async def collect_orphans(c: PodController, now: float) -> None:
    if not c.informer.synced.is_set():
        return
    live: set[InstanceKey] = set()
    doomed: list[tuple[str, str, str]] = []
    for uid, placed in c.placed.items():
        key = placed.key
        live.add(key)
        if uid in c.pod_keys:
            c.orphans.pop(key, None)
            continue
        if not c.listed.get(placed.provider):
            continue
        first = c.orphans.setdefault(key, now)
        if now - first >= c.settings.pods.orphan_grace_seconds and first < now:
            doomed.append((placed.provider, placed.instance.id, "orphan"))
            c.metrics.orphans_deleted.labels(placed.provider).inc()
    for key in [k for k in c.orphans if k not in live]:
        del c.orphans[key]
    await delete_bounded(c, doomed)  # in parallel: one slow cloud never holds up the others


def delete_in_progress(c: PodController, placed: Placed) -> bool:
    """Whether our delete of this instance may still be under way.

    A cloud that accepted a delete but did nothing would bill forever if we trusted it: an
    instance still listed, and not terminating, ``delete_retry_seconds`` after our call is
    deleted again.
    """
    at = c.placed.deleting_since(placed.key)
    if at is None:
        return False
    if placed.instance.state == InstanceState.TERMINATING:
        return True
    return c.clock() - at < c.settings.pods.delete_retry_seconds


async def delete_instance(c: PodController, provider: str, instance_id: str, *, why: str) -> bool:
    """Ask the cloud to delete; True once the cloud accepted (or it is already gone)."""
    adapter = c.providers.get(provider)
    if adapter is None:  # removed meanwhile; the next sweep shows where it is now
        return False
    try:
        await adapter.delete(instance_id)
    except NotFound:
        pass
    except ProviderError as exc:
        c._count(provider, "delete", exc)
        log.warning("instance delete failed", extra=kv(provider=provider,
                                                       instance=instance_id, why=why,
                                                       error=str(exc)))
        return False
    c._count(provider, "delete", None)
    c.placed.mark_deleting((provider, instance_id), at=c.clock())
    log.info("instance deleted", extra=kv(provider=provider, instance=instance_id, why=why))
    return True


async def pod_gone(c: PodController, uid: str, placed: Placed | None) -> None:
    if (
        placed is not None
        and not delete_in_progress(c, placed)
        and not await delete_instance(c, placed.provider, placed.instance.id,
                                      why="pod deleted")
    ):
        raise Retry("instance delete failed")
    c.queue.remove(uid)
    c.book.drop(uid)
    c.pods.drop(uid)  # every per-pod fact at once (node/podstate.py)
    c.vanished.forget(uid)
    c.addresses.forget(uid)
    c.replicas.forget(uid)
    if placed is None or delete_in_progress(c, placed):
        c.placed.pop(uid)


async def stop_spend(c: PodController, placed: Placed) -> None:
    c.replicas.forget(str(placed.instance.tags.get(TAG_UID, "")))
    if delete_in_progress(c, placed):
        return
    if placed.instance.state == InstanceState.TERMINATING:
        return
    if not await delete_instance(c, placed.provider, placed.instance.id,
                                 why="pod finished"):
        raise Retry("instance delete failed")


async def terminate(c: PodController, pod: Body, uid: str, placed: Placed | None) -> None:
    meta = pod["metadata"]
    if placed is not None and not delete_in_progress(c, placed):
        left = c.replicas.drain_left(uid=uid, pod=pod, instance=placed.instance,
                                     was_ready=is_ready(pod))
        if left > 0:  # endpoints are terminating; load balancers stop sending first
            raise Retry("draining", after=left)
        c.replicas.forget(uid)
        if await delete_instance(c, placed.provider, placed.instance.id,
                                 why="pod terminating"):
            if c.verbose_events:
                await c.events.emit(obj=pod_ref(pod), reason="Killing",
                                    message=f"Stopping instance {placed.instance.id} on "
                                            f"{placed.provider}")
        else:
            deadline = parse_time_or_none(meta.get("deletionTimestamp"))
            if deadline is None or datetime.now(UTC) < deadline:
                raise Retry("instance delete failed")
            # Past the grace period: let the pod go; the orphan collector keeps deleting.
    if uid in c.unsure:
        raise Retry("a create may be in flight", after=1.0)
    c.book.drop(uid)  # its instance is being deleted: its slot is free
    if meta.get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers"):
        return  # deleted with grace 0: the API server removes it itself (a DELETE: a 404)
    try:
        await c.client.delete(pod_path(pod), grace_period_seconds=0, uid=uid)
        c.metrics.kube_writes.labels("pod_delete").inc()
    except (NotFoundError, ConflictError):
        pass

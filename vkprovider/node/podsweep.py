"""The sweep of the pod engine: one list per provider, applied to every pod at once.

Why it exists: status comes from ONE list call per provider per sweep, never a call per pod.
The answers become the placements (node/placements.py), reveal duplicates and vanished
instances, settle creates in doubt, count adopted instances against budgets, and wake only the
pods whose instance changed (a steady 5,000-pod node costs almost nothing per sweep).
Functions of the controller (node/pods.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from providers.base import (
    TAG_NODE,
    TAG_UID,
    InstanceState,
    ProviderError,
    sweep_registry_auth,
)
from vkprovider.logs import kv
from vkprovider.node import (
    duplicates,
    podend,
    vanished,
)
from vkprovider.node.addressscreen import AddressScreen
from vkprovider.node.listing import ListResult
from vkprovider.node.placements import Placed
from vkprovider.node.podstate import (
    TERMINAL,
)

if TYPE_CHECKING:
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)


def claim_listed(c: PodController, uids: list[str]) -> None:
    """Count instances a list shows that the book does not (after a restart, or a provider
    listed late): before any create may race past them. O(uids): a sweep passes only the
    instances whose record is new."""
    for uid in uids:
        placed = c.placed.get(uid)
        key = c.pod_keys.get(uid)
        pod = c.informer.store.get(key) if key else None
        if (pod is not None and placed is not None and uid not in c.book
                and not pod["metadata"].get("deletionTimestamp")
                and (pod.get("status") or {}).get("phase") not in TERMINAL
                and placed.instance.state != InstanceState.TERMINATING
                and c.placed.deleting_since(placed.key) is None):
            c.book.put(uid, c.claim_of(pod, placed.instance))


def publish_running(c: PodController) -> None:
    for uid, placed in c.placed.items():
        key = c.pod_keys.get(uid)
        pod = c.informer.store.get(key) if key else None
        if pod is not None and placed.instance.state == InstanceState.RUNNING:
            c.replicas.running(uid=uid, pod=pod, provider=placed.provider,
                               instance=placed.instance)
    for uid in c.pod_keys:  # on a cloud not listed yet: endpoints kept as they are
        ran_on = pod_annotations(c, uid).get(duplicates.PROVIDER_ANNOTATION)
        if uid not in c.placed and ran_on is not None and ran_on in c.listed \
                and not c.listed[ran_on]:
            c.replicas.hold(uid)
    c.replicas.synced()


def release_held(c: PodController, started: Mapping[str, float]) -> None:
    """Held endpoints (see :meth:`_publish_running`) of pods whose cloud has now been
    listed without their instance: they go. Those listed with it are published by their
    reconcile."""
    for uid in c.replicas.held():
        if uid in c.placed:
            continue
        ran_on = pod_annotations(c, uid).get(duplicates.PROVIDER_ANNOTATION)
        if ran_on in started or ran_on not in c.listed or uid not in c.pod_keys:
            c.replicas.forget(uid)


async def sweep(c: PodController) -> None:
    """One sweep: every provider listed at once (node/listing.py, no lock held over the
    calls); the answers applied under ``providers_lock`` (one view of the providers);
    then the cloud calls the answers ask for (duplicates, orphans), in parallel."""
    with c.metrics.sweep_duration.time():
        async with c.providers_lock:
            serving = list(c.providers.items())
        results = await c.lister.round(serving)
        async with c.providers_lock:
            doomed = apply_lists(c, results, served=[n for n, _ in serving])
        await podend.delete_bounded(c, doomed)
        await podend.collect_orphans(c, c.clock())
        await clean_registry_auth(c)
        await c.spend.maybe_record()


def served_as(c: PodController, result: ListResult) -> str | None:
    """The name a listed provider is served under now (retired: its alias; replaced by a
    new adapter of the same account: its name); None once it is gone."""
    for key, value in c.providers.items():
        if value is result.provider:
            return key
    return result.name if result.name in c.providers else None


def apply_lists(c: PodController, results: list[ListResult], *, served: list[str]
                ) -> list[tuple[str, str, str]]:
    """Take the lists that finished into the view of every pod; no await (the caller holds
    ``providers_lock``). Returns the duplicate instances to delete."""
    now = c.clock()
    seen: dict[str, Placed] = {}
    fresh: list[str] = []  # pods whose instance record is new in this sweep
    doomed: list[tuple[str, str, str]] = []
    started: dict[str, float] = {}  # provider -> start of its list that answered now
    answered: set[str] = set()
    for result in results:
        name = served_as(c, result)
        if name is None:
            continue  # removed while it was listed
        answered.add(name)
        if result.instances is None:
            c.listed[name] = False
            c._count(name, "list", result.error)
            log.warning("provider list failed",
                        extra=kv(provider=name, error=str(result.error)))
            continue
        at = result.started
        started[name] = at
        c._count(name, "list", None)
        c.listed[name] = True
        c.listed_once.add(name)
        c.last_list[name] = at
        ours = [i for i in result.instances
                if i.tags.get(TAG_UID) and i.tags.get(TAG_NODE) == c.node]
        # the list's start: never count what was not billed
        c.spend.book.observe(provider=name, instances=ours, at=result.started_wall)
        cost = 0.0
        for listed in ours:
            uid = listed.tags[TAG_UID]
            prev = c.placed.get(uid)
            if prev is not None and AddressScreen.passed(instance=listed, screened=prev.instance):
                inst = listed  # listed as before, and it passed the screen then
            else:
                inst = c.addresses.screen(uid=uid, provider=name, instance=listed)
            cost += inst.price_per_hour
            other = seen.get(uid)
            if other is not None and other.instance.id != inst.id:
                keep, drop = duplicates.keep_first(
                    other, Placed(name, inst, at), annotations=pod_annotations(c, uid))
                log.error("two instances for one pod; deleting the one not serving",
                          extra=kv(uid=uid, keep=keep.instance.id, delete=drop.instance.id))
                doomed.append((drop.provider, drop.instance.id, "duplicate"))
                if keep is other:
                    continue
                inst, name_kept = keep.instance, keep.provider
                seen[uid] = Placed(provider=name_kept, instance=inst, seen_at=at)
                fresh.append(uid)
                continue
            if prev is not None and prev.instance is inst and prev.provider == name \
                    and prev.listed:
                # Listed exactly as before (the adapter hands back the same Instance):
                # the same record, seen again. Readers that cache by record (the kubelet
                # API's view) keep their work, and 5,000 pods cost no new records a sweep.
                prev.seen_at = at
                seen[uid] = prev
            else:
                seen[uid] = Placed(provider=name, instance=inst, seen_at=at)
                fresh.append(uid)
        c.metrics.instances.labels(name).set(len(ours))
        c.metrics.cost.labels(name).set(round(cost, 6))
    for name in served:
        if name not in answered and name in c.providers:
            c.listed[name] = False  # its list is still out: unknown this sweep
    # Keep what we created since its provider's list began (lists may lag behind creates),
    # and what providers we could not list reported last time.
    for uid, placed in c.placed.items():
        if uid in seen:
            continue
        began = started.get(placed.provider)
        if began is None or placed.seen_at > began:
            seen[uid] = placed
    before = c.placed.snapshot()
    gone = vanished.detect(before=before, after=seen, listed=c.listed,
                           list_started=started, deleting=c.placed.deleting_since,
                           pods=lambda uid: live_pod(c, uid))
    c.placed.replace(seen)
    c.addresses.keep_only(seen)
    claim_listed(c, fresh)  # counted against budgets before any worker creates more
    vanished.found(c, gone)  # endpoints withdrawn now; the pod is told by its reconcile
    release_held(c, started)
    hold = c.unsure_hold_seconds
    for uid, (where, since) in list(c.unsure.items()):
        if uid in seen or (where in started and started[where] >= since + hold):
            del c.unsure[uid]  # the list has spoken: it exists, or it never happened
    full = now - c.last_resync >= c.settings.pods.resync_seconds
    if full:
        c.last_resync = now
    for uid in list(c.pod_keys):
        if uid not in c.placed and before.get(uid) is None:
            # Still to be created: a pod backing off (no capacity, Retry-After) keeps its
            # delay; the sweep only wakes one that is not already scheduled.
            if changed_in_sweep(c, uid, None):
                c.queue.nudge(uid)
        elif full or changed_in_sweep(c, uid, before.get(uid)):
            c.queue.add(uid)
    c.metrics.queue_depth.set(len(c.queue))
    return doomed


def pod_annotations(c: PodController, uid: str) -> dict[str, str]:
    key = c.pod_keys.get(uid)
    pod = c.informer.store.get(key) if key else None
    return dict((pod or {}).get("metadata", {}).get("annotations") or {})


def live_pod(c: PodController, uid: str) -> bool:
    """Whether the pod is on the node, not being deleted and not finished."""
    key = c.pod_keys.get(uid)
    pod = c.informer.store.get(key) if key else None
    return (pod is not None and not pod["metadata"].get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in TERMINAL)


async def clean_registry_auth(c: PodController) -> None:
    """Cloud-side pull credentials no instance uses any more are deleted (RunPod); cheap
    when nothing was deleted since the last sweep (the adapter keeps track)."""
    for name, provider in list(c.providers.items()):
        if not c.listed.get(name):
            continue
        try:
            removed = await sweep_registry_auth(provider)
        except ProviderError as exc:
            log.warning("registry credential cleanup failed",
                        extra=kv(provider=name, error=str(exc)))
            continue
        if removed:
            log.info("registry credentials deleted", extra=kv(provider=name, count=removed))


def changed_in_sweep(c: PodController, uid: str, before: Placed | None) -> bool:
    """Whether a sweep must reconcile this pod: its instance changed, or it is in motion.

    A steady Running pod whose instance the cloud reports exactly as before has nothing to
    do; its pod changing reaches the queue through the watch. Skipping it is what keeps a
    sweep over 5,000 pods cheap (bench/steady.py); ``resync_seconds`` reconciles every pod
    anyway, as an informer's resync would.
    """
    placed = c.placed.get(uid)
    if placed is None:
        if before is not None:
            return True  # its instance is gone from the list
        key = c.pod_keys.get(uid)
        pod = c.informer.store.get(key) if key else None
        phase = ((pod or {}).get("status") or {}).get("phase")
        return phase not in TERMINAL  # still to be created (a finished one rests)
    inst = placed.instance
    return (
        before is None
        or (before.instance is not inst and before.instance != inst)
        or inst.state != InstanceState.RUNNING
        or c.placed.deleting_since(placed.key) is not None
        or uid in c.unsure
    )

"""What Kueue will place on internal GPU nodes next: move-back must not bring inference home there.

Why it exists: without it, move-back sees GPUs free the moment a training gang ends and brings
inference home, and seconds later Kueue admits the next gang onto the same GPUs: the scheduler
preempts the replicas again and they go back to the cloud (a cloud boot, a weight load and money
for nothing: ping-pong). Pending pods already count in the fit, but a queued gang has none: Kueue
keeps its Job suspended until it is admitted, and keeps it suspended while an admission check
(pre-warm, say) is pending.

:func:`upcoming_claims` turns Kueue's objects into :class:`~vkprovider.descheduler.fit.Claim`\\ s,
pure, from the watch caches:

* **quota reserved (or admitted)**: a Workload holding quota whose pods are not all placed yet:
  its pods still to place (``podSets[].count`` x the template's ``nvidia.com/gpu``, minus its
  pods bound to a node or finished), on the nodes of the flavors it was assigned;
* **next in a ClusterQueue**: pending Workloads (no quota yet) that fit their ClusterQueue's
  remaining ``nvidia.com/gpu`` quota now, in Kueue's order (priority, then creation), on the
  nodes of the first flavor with room. Remaining quota is the nominal quota minus what the
  queue's Workloads hold, where a Workload whose pods have all finished holds nothing any more
  (Kueue is about to release it: that is exactly the moment the next gang is admitted).
* **queued behind the holders**: a pending Workload that does not fit the remaining quota but
  fits the nominal quota is admitted as soon as the Workloads ahead of it (the holders, and the
  heads admitted before it) release theirs. Their release covers part of its demand (their GPUs
  free up for it); the rest lands on GPUs that are free *now*, and that part is a claim
  (``why``: "queued behind ns/a in ClusterQueue q"). Without it, move-back sees those GPUs free
  while the first gang runs, brings inference home, and the queued gang preempts it again.
  Whole pods are claimed, smallest ones left to the release first, so the claim may round up.

``StrictFIFO`` queues stop at the first Workload that does not fit the remaining quota (it is the
one queued behind the holders; nothing behind it is admitted before it); ``BestEffortFIFO`` ones
(the default) let every Workload that fits now go first, as Kueue does, then count those queued
behind, in order, each one's release covering the next. A Workload that does not fit the nominal
quota at all is never admitted and claims nothing. Borrowing from a cohort is not counted.

A flavor maps to the internal nodes whose labels match its ``spec.nodeLabels`` (every internal
node when it has none); a Workload whose flavors map to no internal node is not a claim. Without
Kueue (its resources missing) every list is empty and nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from vkprovider.descheduler.fit import GPU, Claim, requests_of
from vkprovider.semantics.quantity import QuantityError, parse_quantity

Body = dict[str, Any]


def _conditions(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(c.get("type")): str(c.get("status"))
            for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping)}


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _pods_of(workload: Mapping[str, Any]) -> list[int]:
    """GPUs of each pod of the Workload (``podSets[].count``, or the admitted count)."""
    assigned = {a.get("name"): a for a in
                ((workload.get("status") or {}).get("admission") or {}).get(
                    "podSetAssignments") or [] if isinstance(a, Mapping)}
    out: list[int] = []
    for podset in (workload.get("spec") or {}).get("podSets") or []:
        spec = ((podset.get("template") or {}).get("spec")) or {}
        gpus = requests_of(spec).get(GPU, 0)
        count = (assigned.get(podset.get("name") or "main") or {}).get("count") \
            or podset.get("count") or 0
        with contextlib.suppress(TypeError, ValueError):
            out.extend([gpus] * int(count))
    return sorted(out, reverse=True)


def _flavor_nodes(flavor: Mapping[str, Any] | None, nodes: Iterable[Body]) -> frozenset[str]:
    if flavor is None:
        return frozenset()
    labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
    return frozenset(n["metadata"]["name"] for n in nodes
                     if all(n["metadata"]["labels"].get(k) == v for k, v in labels.items()))


def _gpu_quota(cq: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``(flavor, nominal nvidia.com/gpu)`` of a ClusterQueue, in its flavor order."""
    out: list[tuple[str, int]] = []
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        if GPU not in (group.get("coveredResources") or []):
            continue
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                if res.get("name") == GPU:
                    try:
                        out.append((str(flavor.get("name")),
                                    int(parse_quantity(res.get("nominalQuota", 0)))))
                    except QuantityError:
                        continue
    return out


def _usage(workload: Mapping[str, Any]) -> dict[str, int]:
    """``nvidia.com/gpu`` a Workload holds, by flavor."""
    out: dict[str, int] = {}
    for assignment in ((workload.get("status") or {}).get("admission") or {}).get(
            "podSetAssignments") or []:
        flavor = (assignment.get("flavors") or {}).get(GPU)
        raw = (assignment.get("resourceUsage") or {}).get(GPU)
        if flavor is None or raw is None:
            continue
        try:
            out[flavor] = out.get(flavor, 0) + int(parse_quantity(raw))
        except QuantityError:
            continue
    return out


def upcoming_claims(
    *,
    workloads: Iterable[Mapping[str, Any]],
    cluster_queues: Mapping[str, Mapping[str, Any]],
    local_queues: Mapping[str, Mapping[str, Any]],
    flavors: Mapping[str, Mapping[str, Any]],
    nodes: Iterable[Body],
    pods: Iterable[Body],
    exclude_nodes: AbstractSet[str],
) -> list[Claim]:
    """The GPUs Kueue will place on internal nodes next, reserved Workloads first.

    ``cluster_queues`` and ``flavors`` are keyed by name, ``local_queues`` by
    ``namespace/name``; ``nodes`` and ``pods`` are fit's slim projections.
    """
    internal = [n for n in nodes if n["metadata"]["name"] not in exclude_nodes]
    placed: dict[str, list[int]] = {}  # owner uid -> GPUs of its pods bound or finished
    live: dict[str, int] = {}  # owner uid -> its pods not finished
    for pod in pods:
        owners = pod["metadata"].get("ownerReferences") or []
        if not owners or not owners[0].get("uid"):
            continue
        uid = str(owners[0]["uid"])
        done = pod["status"].get("phase") in ("Succeeded", "Failed")
        if done or pod["spec"].get("nodeName"):
            placed.setdefault(uid, []).append(int(pod["spec"]["requests"].get(GPU, 0)))
        if not done:
            live[uid] = live.get(uid, 0) + 1
    reserved: list[Claim] = []
    held: dict[str, dict[str, int]] = {}  # ClusterQueue -> flavor -> GPUs held
    holders: dict[str, dict[str, list[str]]] = {}  # ClusterQueue -> flavor -> who holds them
    pending: dict[str, list[Mapping[str, Any]]] = {}  # ClusterQueue -> Workloads waiting
    for wl in workloads:
        conds = _conditions(wl)
        if conds.get("Finished") == "True" or (wl.get("spec") or {}).get("active") is False:
            continue
        owners = frozenset(str(o.get("uid")) for o in wl["metadata"].get("ownerReferences")
                           or [] if o.get("uid"))
        admission = (wl.get("status") or {}).get("admission") or {}
        if conds.get("QuotaReserved") == "True" or conds.get("Admitted") == "True":
            todo = _pods_of(wl)
            gone = [g for uid in owners for g in placed.get(uid, [])]
            for gpus in gone:
                if gpus in todo:
                    todo.remove(gpus)
                elif todo:
                    todo.pop()
            started = any(uid in placed or uid in live for uid in owners)
            if started and not any(live.get(uid) for uid in owners) and not todo:
                continue  # every pod finished: Kueue is releasing its quota
            holder = str(admission.get("clusterQueue") or "")
            for flavor_name, gpus in _usage(wl).items():
                mine = held.setdefault(holder, {})
                mine[flavor_name] = mine.get(flavor_name, 0) + gpus
                holders.setdefault(holder, {}).setdefault(flavor_name, []).append(_key(wl))
            if not any(todo):
                continue
            names = {f for a in admission.get("podSetAssignments") or []
                     for f in (a.get("flavors") or {}).values()}
            on = frozenset().union(*(_flavor_nodes(flavors.get(f), internal) for f in names)) \
                if names else frozenset()
            if on:
                why = "admitted" if conds.get("Admitted") == "True" else "quota reserved"
                reserved.append(Claim(workload=_key(wl), pods=tuple(g for g in todo if g),
                                      nodes=on, owners=owners, why=f"{why}, pods not running"))
            continue
        queue = local_queues.get(f"{wl['metadata'].get('namespace')}/"
                                 f"{(wl.get('spec') or {}).get('queueName')}")
        cq_name = str(((queue or {}).get("spec") or {}).get("clusterQueue") or "")
        if cq_name in cluster_queues:
            pending.setdefault(cq_name, []).append(wl)
    heads: list[Claim] = []
    for cq_name, waiting in sorted(pending.items()):
        heads.extend(_queue_claims(
            cq_name=cq_name, queue=cluster_queues[cq_name], waiting=waiting,
            held=held.get(cq_name, {}), holders=holders.get(cq_name, {}), flavors=flavors,
            internal=internal))
    return [*reserved, *heads]


def _queue_claims(*, cq_name: str, queue: Mapping[str, Any], waiting: list[Mapping[str, Any]],
                  held: Mapping[str, int], holders: Mapping[str, list[str]],
                  flavors: Mapping[str, Mapping[str, Any]], internal: list[Body]) -> list[Claim]:
    """The claims of one ClusterQueue's pending Workloads: the ones that fit the remaining quota
    now, then the ones queued behind the holders (see the module docstring)."""
    strict = (queue.get("spec") or {}).get("queueingStrategy") == "StrictFIFO"
    quota = dict(_gpu_quota(queue))
    room = {f: q - held.get(f, 0) for f, q in quota.items()}
    # What frees up, per flavor, before a Workload queued behind gets its quota: the holders'
    # GPUs, then those of every Workload admitted ahead of it (each releases when it ends).
    release = {f: held.get(f, 0) for f in quota}
    ahead = {f: list(holders.get(f, [])) for f in quota}
    order = sorted(waiting, key=lambda w: (-_priority(w),
                                           w["metadata"].get("creationTimestamp") or "",
                                           _key(w)))
    out: list[Claim] = []
    blocked: list[tuple[Mapping[str, Any], list[int]]] = []
    for wl in order:
        todo = [g for g in _pods_of(wl) if g]
        need = sum(todo)
        if not need:
            continue
        flavor = next((f for f, left in room.items() if left >= need), None)
        if flavor is None:
            blocked.append((wl, todo))
            if strict:
                break  # it heads the queue: nothing behind it is admitted before it
            continue
        room[flavor] -= need
        release[flavor] += need
        ahead[flavor].append(_key(wl))
        on = _flavor_nodes(flavors.get(flavor), internal)
        if on:
            out.append(Claim(workload=_key(wl), pods=tuple(todo), nodes=on, owners=_owners(wl),
                             why=f"next in ClusterQueue {cq_name}"))
    for wl, todo in blocked:
        need = sum(todo)
        flavor = next((f for f in quota if quota[f] >= need
                       and max(0, room[f]) + release[f] >= need), None)
        if flavor is None:
            continue  # it does not fit the nominal quota: Kueue never admits it
        covered = min(release[flavor], need)
        short = need - covered
        names = ahead[flavor]
        room[flavor] -= short
        release[flavor] += short  # (it releases all it takes: the covered part and the rest)
        ahead[flavor] = [*names, _key(wl)]
        on = _flavor_nodes(flavors.get(flavor), internal)
        if short <= 0 or not on:
            continue
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(Claim(workload=_key(wl), pods=claimed_pods(todo, covered=covered), nodes=on,
                         owners=_owners(wl),
                         why=f"queued behind {shown or 'the holders'} in ClusterQueue {cq_name}"))
    return out


def claimed_pods(pods: list[int], *, covered: int) -> tuple[int, ...]:
    """The whole pods of a gang that GPUs released by others do not cover: the smallest pods go
    onto the ``covered`` GPUs first, the rest (biggest first) are the claim. Whole pods, so the
    claim may exceed the shortfall (a 4-GPU pod is never half on released GPUs)."""
    left = sorted(pods, reverse=True)
    while left and left[-1] <= covered:
        covered -= left.pop()
    return tuple(left)


def _owners(workload: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(o.get("uid")) for o in workload["metadata"].get("ownerReferences") or []
                     if o.get("uid"))


def _priority(workload: Mapping[str, Any]) -> int:
    value = (workload.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0

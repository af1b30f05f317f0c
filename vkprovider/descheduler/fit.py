"""Would a pod fit on an internal node right now? A small, honest subset of the scheduler.

Why it exists: move-back must only surge a replica inside when the scheduler will place it there,
or the surge pod waits Pending and the move times out. The check covers what decides GPU pods:
requests (cpu, memory, ``nvidia.com/gpu``) against allocatable minus what bound pods request,
nodeSelector, required node affinity, NoSchedule/NoExecute taints, cordoned and NotReady nodes.
Pending pods' GPU demand and a headroom are subtracted cluster-wide, so a move never takes the
GPU a waiting pod (a training gang, say) is about to get; so is what Kueue will place next
(:class:`Claim`, from :mod:`vkprovider.descheduler.kueue_demand`), on the nodes of its flavors,
so inference does not come home onto GPUs the next gang preempts it from (ping-pong).

GPU health: a node carrying one of the health taints (:class:`HealthTaint`, whatever its effect
and whatever the pod tolerates) or reporting fewer allocatable than capacity ``nvidia.com/gpu``
(the device plugin withdrew a failed GPU) is unhealthy: none of its GPUs count as free, for
move-back here and for pre-warm's displacement, which uses :func:`node_problem` too.

When a pod fits only because of what this check holds back (an unhealthy node, Kueue's next
demand, the policy's headroom), :attr:`Fit.held` says so, for the ``MoveBackHeld`` event.

The Kubernetes rules themselves (quantities, GPU counts, taints and tolerations, node selector
terms) come from :mod:`vkprovider.semantics`, the same code the provider uses; this module only
decides which of them the check applies, and in what order.

It works on slim projections of pods and nodes (a few hundred bytes each instead of kilobytes),
so the companion's cluster-wide view stays cheap on clusters with thousands of pods.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from vkprovider.placement.spot import CONDITION_PLANNED
from vkprovider.semantics.gpus import GPU_RESOURCE, container_gpus
from vkprovider.semantics.quantity import QuantityError, cpu_millis, memory_bytes, parse_quantity
from vkprovider.semantics.selectors import node_selector_matches
from vkprovider.semantics.taints import untolerated_taint

GPU = GPU_RESOURCE
Body = dict[str, Any]


def requests_of(spec: Mapping[str, Any]) -> dict[str, int]:
    """Summed container requests (limits where no request), as ints: cpu m, memory B, GPUs.

    A value that does not parse counts 0 (the API server refuses such pods; a tally over the
    whole cluster must not stop at one that bypassed it).
    """
    out = {"cpu": 0, "memory": 0, GPU: 0}
    for container in spec.get("containers") or []:
        res = container.get("resources") or {}
        reqs = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, convert in (("cpu", cpu_millis), ("memory", memory_bytes)):
            if name in reqs:
                try:
                    out[name] += convert(parse_quantity(reqs[name]))
                except QuantityError:
                    continue
        with contextlib.suppress(QuantityError):
            out[GPU] += container_gpus(container)
    return out


def slim_pod(obj: Body) -> Body:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    annotations = meta.get("annotations") or {}
    return {
        "metadata": {
            "name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "ownerReferences": [owner] if owner else [],
            "annotations": {k: v for k, v in annotations.items()
                            if k.startswith("vkprovider.io/")
                            or k == "controller.kubernetes.io/pod-deletion-cost"},
            "labels": meta.get("labels") or {},
        },
        "spec": {"nodeName": spec.get("nodeName"), "requests": requests_of(spec),
                 "priority": spec.get("priority")},
        "status": {"phase": (obj.get("status") or {}).get("phase"),
                   "ready": any(c.get("type") == "Ready" and c.get("status") == "True"
                                for c in (obj.get("status") or {}).get("conditions") or []),
                   # the provider's GPU health verdict (node/gpuhealth.py), None when unset
                   "gpuHealthy": next((c.get("status") for c in (obj.get("status") or {}).get(
                       "conditions") or [] if c.get("type") == "vkprovider.io/GPUHealthy"),
                       None),
                   # the cloud announced an interruption (node/interruption.py), None when unset
                   "interruptionPlanned": next((c.get("status") for c in (obj.get(
                       "status") or {}).get("conditions") or []
                       if c.get("type") == CONDITION_PLANNED), None),
                   # who is disrupting it (descheduler/preemption.py reads the scheduler's
                   # PreemptionByScheduler here), None when unset
                   "disruptionTarget": next(({"reason": c.get("reason"),
                                              "at": c.get("lastTransitionTime")}
                                             for c in (obj.get("status") or {}).get(
                       "conditions") or [] if c.get("type") == "DisruptionTarget"
                       and c.get("status") == "True"), None)},
    }


# ---- GPU health ----------------------------------------------------------------------------------

_TAINT_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_TAINT_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class HealthTaint:
    """A taint that marks a node's GPUs out of service: ``KEY[=VALUE][:EFFECT]`` (kubectl taint's
    syntax). Without a value or an effect, any value or effect matches."""

    key: str
    value: str | None = None
    effect: str | None = None

    def matches(self, taint: Mapping[str, Any]) -> bool:
        return (taint.get("key") == self.key
                and (self.value is None or (taint.get("value") or "") == self.value)
                and (self.effect is None or taint.get("effect") == self.effect))

    def __str__(self) -> str:
        value = f"={self.value}" if self.value is not None else ""
        effect = f":{self.effect}" if self.effect is not None else ""
        return f"{self.key}{value}{effect}"


def parse_health_taint(text: str) -> HealthTaint:
    """``KEY[=VALUE][:EFFECT]``; ValueError saying what is wrong."""
    if not isinstance(text, str) or not text:
        raise ValueError("must be KEY[=VALUE][:EFFECT], e.g. AggregatedNodeHealth or "
                         "node.kubernetes.io/out-of-service:NoExecute")
    rest, colon, effect_text = text.rpartition(":")
    if not colon:
        rest = effect_text
    effect = effect_text if colon else None
    key, equals, value_text = rest.partition("=")
    value = value_text if equals else None
    if not key or len(key) > 316 or not _TAINT_KEY.match(key):
        raise ValueError(f"{text!r}: {key!r} is not a taint key (a label key such as "
                         f"example.com/gpu-health)")
    if value is not None and (len(value) > 63 or not _TAINT_VALUE.match(value)):
        raise ValueError(f"{text!r}: {value!r} is not a taint value")
    if effect is not None and effect not in TAINT_EFFECTS:
        raise ValueError(f"{text!r}: effect {effect!r} is not one of "
                         f"{', '.join(TAINT_EFFECTS)}")
    return HealthTaint(key=key, value=value, effect=effect)


#: The companion's default ``gpu_health_taints``: NVIDIA NVSentinel's fault quarantine
#: (``AggregatedNodeHealth``, and ``GPUHealth`` of its earlier releases) and Kubernetes'
#: ``node.kubernetes.io/out-of-service`` (a node declared out of service).
DEFAULT_HEALTH_TAINTS = ("AggregatedNodeHealth", "GPUHealth", "node.kubernetes.io/out-of-service")


def unhealthy_reason(obj: Mapping[str, Any], health_taints: Sequence[HealthTaint]) -> str | None:
    """Why a Node's GPUs are out of service, or None: a health taint, or fewer allocatable
    ``nvidia.com/gpu`` than capacity."""
    for taint in (obj.get("spec") or {}).get("taints") or []:
        if any(h.matches(taint) for h in health_taints):
            return (f"health taint {taint.get('key')}={taint.get('value') or ''}:"
                    f"{taint.get('effect')}")
    status = obj.get("status") or {}
    try:
        capacity = int(parse_quantity((status.get("capacity") or {}).get(GPU, 0)))
        allocatable = int(parse_quantity((status.get("allocatable") or {}).get(GPU, 0)))
    except QuantityError:
        return None
    if (status.get("capacity") or {}).get(GPU) is not None and allocatable < capacity:
        return f"{allocatable} of {capacity} {GPU} allocatable (a GPU was withdrawn)"
    return None


def slim_node(obj: Body, health_taints: Sequence[HealthTaint] = ()) -> Body:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allocatable: dict[str, int] = {}
    for name, raw in (status.get("allocatable") or {}).items():
        try:
            q = parse_quantity(raw)
        except QuantityError:
            continue
        allocatable[name] = (cpu_millis(q) if name == "cpu" else
                             memory_bytes(q) if name == "memory" else int(q))
    return {
        "metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {}},
        "spec": {"taints": spec.get("taints") or [], "unschedulable": bool(
            spec.get("unschedulable"))},
        "status": {"allocatable": allocatable,
                   "ready": any(c.get("type") == "Ready" and c.get("status") == "True"
                                for c in status.get("conditions") or []),
                   "unhealthy": unhealthy_reason(obj, health_taints)},
    }


def _affinity_matches(spec: Mapping[str, Any], node: Body) -> bool:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return node_selector_matches(required, labels=node["metadata"]["labels"],
                                 fields={"metadata.name": node["metadata"]["name"]})


@dataclass(frozen=True, kw_only=True)
class Claim:
    """GPUs Kueue will place next on internal nodes: one Workload's pods not placed yet."""

    workload: str  # namespace/name
    pods: tuple[int, ...]  # GPUs of each pod still to place, biggest first
    nodes: frozenset[str] | None  # the internal nodes its flavors map to; None: any
    owners: frozenset[str] = frozenset()  # UIDs of the Workload's owners (its Job): their
    # Pending pods are this claim, not "pending pods" on their own
    why: str = ""  # "quota reserved", "next in ClusterQueue q", ...

    @property
    def gpus(self) -> int:
        return sum(self.pods)


@dataclass(frozen=True, kw_only=True)
class Fit:
    node: str | None
    reason: str  # why not, when node is None
    # When node is None only because of what is held back: why ("" otherwise), and which hold
    # (``unhealthy``, ``kueue``, ``headroom``), for the MoveBackHeld event and metric.
    held: str = ""
    held_by: str = ""
    claims: tuple[str, ...] = field(default=())  # the Workloads whose GPUs held it (kueue)


def _healthy(node: Body) -> bool:
    return not node["status"].get("unhealthy")


def node_problem(*, pod_spec: Mapping[str, Any], node: Body, used: Mapping[str, int],
                 need: Mapping[str, int], ignore_health: bool = False) -> str | None:
    name = node["metadata"]["name"]
    if node["spec"]["unschedulable"]:
        return f"{name} is cordoned"
    if not node["status"]["ready"]:
        return f"{name} is not Ready"
    if not ignore_health and not _healthy(node):
        return f"{name} is unhealthy: {node['status']['unhealthy']}"
    taint = untolerated_taint(node["spec"]["taints"],
                              tolerations=pod_spec.get("tolerations") or [])
    if taint is not None:
        return f"{name} has taint {taint.get('key')}={taint.get('value', '')}:" \
               f"{taint.get('effect')}"
    labels = node["metadata"]["labels"]
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"{name} does not match nodeSelector {key}={value}"
    if not _affinity_matches(pod_spec, node):
        return f"{name} does not match required node affinity"
    alloc = node["status"]["allocatable"]
    for resource, amount in need.items():
        if amount and alloc.get(resource, 0) - used.get(resource, 0) < amount:
            return (f"{name} has {alloc.get(resource, 0) - used.get(resource, 0)} {resource} free,"
                    f" needs {amount}")
    return None


def find_fit(
    *,
    pod_spec: Mapping[str, Any],
    nodes: Iterable[Body],
    pods: Iterable[Body],
    exclude_nodes: AbstractSet[str],
    headroom_gpus: int = 0,
    claims: Sequence[Claim] = (),
    policy_headroom_gpus: int = 0,
) -> Fit:
    """The first internal node the pod fits on, after pending demand, Kueue's next demand
    (``claims``), GPU health and headroom (the companion's plus the policy's).

    When it fits nowhere only because of what is held back (unhealthy nodes, ``claims``, the
    policy's headroom: the check as it was before those existed would have said yes),
    :attr:`Fit.held` says why and :attr:`Fit.held_by` which of them.
    """
    nodes = list(nodes)
    pods = list(pods)
    # The Pending pods of a gang Kueue admitted are its demand (a claim), not a reason the
    # check as it was would have refused: the comparisons below leave them out.
    kueue_pods = frozenset(uid for c in claims for uid in c.owners)
    fit, _taken = _fit(pod_spec=pod_spec, nodes=nodes, pods=pods, exclude_nodes=exclude_nodes,
                       headroom=headroom_gpus + policy_headroom_gpus, claims=claims, health=True)
    if fit.node is not None:
        return fit
    base, _ = _fit(pod_spec=pod_spec, nodes=nodes, pods=pods, exclude_nodes=exclude_nodes,
                   headroom=headroom_gpus, claims=(), health=False, skip_pending=kueue_pods)
    if base.node is None:
        return fit  # not held: it would not fit anyway
    healthy, _ = _fit(pod_spec=pod_spec, nodes=nodes, pods=pods, exclude_nodes=exclude_nodes,
                      headroom=headroom_gpus, claims=(), health=True, skip_pending=kueue_pods)
    if healthy.node is None:
        sick = [f"{n['metadata']['name']} ({n['status']['unhealthy']})" for n in nodes
                if n["metadata"]["name"] not in exclude_nodes and not _healthy(n)]
        return Fit(node=None, reason=fit.reason, held_by="unhealthy",
                   held=f"the free internal GPUs are on unhealthy nodes: {', '.join(sick[:3])}")
    queued, taken = _fit(pod_spec=pod_spec, nodes=nodes, pods=pods, exclude_nodes=exclude_nodes,
                         headroom=headroom_gpus, claims=claims, health=True)
    if queued.node is None and taken:
        parts = [f"Kueue will place {gpus} GPU(s) of workload {c.workload}"
                 f"{f' ({c.why})' if c.why else ''}" for c, gpus in taken]
        return Fit(node=None, reason=fit.reason, held_by="kueue",
                   held=f"{'; '.join(parts)} on these nodes",
                   claims=tuple(c.workload for c, _ in taken))
    return Fit(node=None, reason=fit.reason, held_by="headroom",
               held=f"{queued.reason or fit.reason}; the policy keeps {policy_headroom_gpus} "
                    f"GPU(s) of headroom (moveBack.headroomGPUs)")


def _fit(*, pod_spec: Mapping[str, Any], nodes: Sequence[Body], pods: Sequence[Body],
         exclude_nodes: AbstractSet[str], headroom: int, claims: Sequence[Claim],
         health: bool, skip_pending: AbstractSet[str] = frozenset()
         ) -> tuple[Fit, list[tuple[Claim, int]]]:
    """The fit, and the claims that took GPUs on nodes the pod would otherwise fit on."""
    need = requests_of(pod_spec)
    claimed = frozenset(uid for c in claims for uid in c.owners) | skip_pending
    used: dict[str, dict[str, int]] = {}
    pending_gpus = 0
    for pod in pods:
        if pod["status"]["phase"] in ("Succeeded", "Failed"):
            continue
        node = pod["spec"]["nodeName"]
        reqs = pod["spec"]["requests"]
        if not node:
            owners = pod["metadata"].get("ownerReferences") or []
            if not (owners and owners[0].get("uid") in claimed):
                pending_gpus += reqs.get(GPU, 0)
            continue
        acc = used.setdefault(node, {"cpu": 0, "memory": 0, GPU: 0})
        for k, v in reqs.items():
            acc[k] = acc.get(k, 0) + v
    candidates = sorted((n for n in nodes if n["metadata"]["name"] not in exclude_nodes),
                        key=lambda n: n["metadata"]["name"])
    # What Kueue places next, whole pods, best fit on the free GPUs of its flavors' nodes.
    free = {n["metadata"]["name"]: n["status"]["allocatable"].get(GPU, 0)
            - used.get(n["metadata"]["name"], {}).get(GPU, 0)
            for n in candidates if not n["spec"]["unschedulable"] and n["status"]["ready"]
            and (_healthy(n) or not health)}
    reserved: dict[str, int] = {}
    placed: list[tuple[Claim, str, int]] = []
    for claim in claims:
        for gpus in sorted(claim.pods, reverse=True):
            options = [n for n in free if claim.nodes is None or n in claim.nodes]
            room = {n: free[n] - reserved.get(n, 0) for n in options}
            fitting = [n for n in options if room[n] >= gpus]
            if fitting:
                best = min(fitting, key=lambda n: (room[n], n))
                take = gpus
            elif options:  # it preempts its way in there: what is free there is its
                best = max(options, key=lambda n: (room[n], n))
                take = max(0, room[best])
            else:
                continue
            if take:
                reserved[best] = reserved.get(best, 0) + take
                placed.append((claim, best, take))
    problems: list[str] = []
    free_gpus = 0
    chosen: str | None = None
    would: set[str] = set()
    for node in candidates:
        name = node["metadata"]["name"]
        mine = used.get(name, {})
        with_claims = {**mine, GPU: mine.get(GPU, 0) + reserved.get(name, 0)}
        problem = node_problem(pod_spec=pod_spec, node=node, used=with_claims, need=need,
                               ignore_health=not health)
        if problem is None:
            chosen = chosen or name
            free_gpus += node["status"]["allocatable"].get(GPU, 0) - with_claims[GPU]
        else:
            problems.append(problem)
            if reserved.get(name) and node_problem(pod_spec=pod_spec, node=node, used=mine,
                                                   need=need, ignore_health=not health) is None:
                would.add(name)
    taken: dict[Claim, int] = {}
    for claim, name, gpus in placed:
        if name in would or chosen is None:
            taken[claim] = taken.get(claim, 0) + gpus
    held = list(taken.items())
    if chosen is None:
        return Fit(node=None, reason="; ".join(problems[:3]) or "no internal node"), held
    spare = free_gpus - pending_gpus - headroom
    if need.get(GPU, 0) and spare < need[GPU]:
        return Fit(node=None, reason=f"{free_gpus} GPUs free on fitting nodes, but pending pods "
                                     f"want {pending_gpus} and headroom is {headroom}"), held
    return Fit(node=chosen, reason=""), held

"""Would a pod fit on an internal node right now? A small, honest subset of the scheduler.

Why it exists: move-back must only surge a replica inside when the scheduler will place it there,
or the surge pod waits Pending and the move times out. The check covers what decides GPU pods:
requests (cpu, memory, ``nvidia.com/gpu``) against allocatable minus what bound pods request,
nodeSelector, required node affinity, NoSchedule/NoExecute taints, cordoned and NotReady nodes.
Pending pods' GPU demand and a headroom are subtracted cluster-wide, so a move never takes the
GPU a waiting pod (a training gang, say) is about to get.

The Kubernetes rules themselves (quantities, GPU counts, taints and tolerations, node selector
terms) come from :mod:`vkprovider.semantics`, the same code the provider uses; this module only
decides which of them the check applies, and in what order.

It works on slim projections of pods and nodes (a few hundred bytes each instead of kilobytes),
so the companion's cluster-wide view stays cheap on clusters with thousands of pods.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

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
                                for c in (obj.get("status") or {}).get("conditions") or [])},
    }


def slim_node(obj: Body) -> Body:
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
                                for c in status.get("conditions") or [])},
    }


def _affinity_matches(spec: Mapping[str, Any], node: Body) -> bool:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return node_selector_matches(required, labels=node["metadata"]["labels"],
                                 fields={"metadata.name": node["metadata"]["name"]})


@dataclass(frozen=True, kw_only=True)
class Fit:
    node: str | None
    reason: str  # why not, when node is None


def node_problem(*, pod_spec: Mapping[str, Any], node: Body, used: Mapping[str, int],
                 need: Mapping[str, int]) -> str | None:
    name = node["metadata"]["name"]
    if node["spec"]["unschedulable"]:
        return f"{name} is cordoned"
    if not node["status"]["ready"]:
        return f"{name} is not Ready"
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
) -> Fit:
    """The first internal node the pod fits on, after pending demand and headroom."""
    need = requests_of(pod_spec)
    used: dict[str, dict[str, int]] = {}
    pending_gpus = 0
    for pod in pods:
        if pod["status"]["phase"] in ("Succeeded", "Failed"):
            continue
        node = pod["spec"]["nodeName"]
        reqs = pod["spec"]["requests"]
        if not node:
            pending_gpus += reqs.get(GPU, 0)
            continue
        acc = used.setdefault(node, {"cpu": 0, "memory": 0, GPU: 0})
        for k, v in reqs.items():
            acc[k] = acc.get(k, 0) + v
    problems: list[str] = []
    free_gpus = 0
    chosen: str | None = None
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        if name in exclude_nodes:
            continue
        problem = node_problem(pod_spec=pod_spec, node=node, used=used.get(name, {}), need=need)
        if problem is None:
            chosen = chosen or name
            free_gpus += node["status"]["allocatable"].get(GPU, 0) - used.get(name, {}).get(GPU, 0)
        else:
            problems.append(problem)
    if chosen is None:
        return Fit(node=None, reason="; ".join(problems[:3]) or "no internal node")
    spare = free_gpus - pending_gpus - headroom_gpus
    if need.get(GPU, 0) and spare < need[GPU]:
        return Fit(node=None, reason=f"{free_gpus} GPUs free on fitting nodes, but pending pods "
                                     f"want {pending_gpus} and headroom is {headroom_gpus}")
    return Fit(node=chosen, reason="")

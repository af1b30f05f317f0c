"""The virtual Node's object: labels, taints, capacity and status, as pure functions of settings.

Why it exists apart from :mod:`vkprovider.node.virtualnode`: the bodies the provider writes to its
Node (``node_labels``, ``our_taints``, ``merge_taints``, ``metadata_patch``, ``build_status``) are
rules, not I/O; they are tested without a cluster here, and the registration and heartbeat loops
in ``virtualnode`` only send them. Taints have no strategic-merge key, so ``merge_taints`` keeps
every taint another controller set; ``build_status`` keeps a condition's ``lastTransitionTime``
while its status does not change.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vkprovider.config import NodeSettings
from vkprovider.placement.offerprices import OFFER_PRICES_ANNOTATION
from vkprovider.semantics.gpus import GPU_RESOURCE
from vkprovider.semantics.timefmt import format_time

TAINT_KEY = "virtual-kubelet.io/provider"
TAINT_VALUE = "vkprovider"
TAINT_EFFECT = "NoSchedule"
#: Comma-separated, sorted GPU products the clouds offer right now (informational).
GPU_PRODUCTS_ANNOTATION = "vkprovider.io/gpu-products"

# (type, status, reason, message) of the conditions we own, in the kubelet's order.
_CONDITIONS: tuple[tuple[str, str, str, str], ...] = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "vkprovider has sufficient memory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "vkprovider has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "vkprovider has sufficient PIDs"),
    ("NetworkUnavailable", "False", "RouteCreated", "pods run on the clouds' networks"),
    ("Ready", "True", "KubeletReady", "vkprovider is posting ready status"),
)
_TIME_KEYS = frozenset({"lastHeartbeatTime", "lastTransitionTime"})


@dataclass(frozen=True)
class NodeCapacity:
    """What the clouds can run right now: GPU count (after budgets) and GPU products offered."""

    gpus: int
    gpu_products: tuple[str, ...] = ()
    #: the offers' $/GPU-h per account and GPU type, as the annotation's text
    #: (vkprovider/placement/offerprices.py); None: not published
    offer_prices: str | None = None


# ---- pure rules ---------------------------------------------------------------------------------


def node_labels(settings: NodeSettings) -> dict[str, str]:
    """The labels the virtual node must carry; ``settings.labels`` win over the defaults."""
    labels = {
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": settings.name,
    }
    labels.update(settings.labels)
    return labels


def our_taints(settings: NodeSettings) -> list[dict[str, str]]:
    """The taints we own: ``virtual-kubelet.io/provider=<taint_value>:NoSchedule`` if enabled."""
    if not settings.taint:
        return []
    return [{"key": TAINT_KEY, "value": settings.taint_value, "effect": TAINT_EFFECT}]


def _taint_id(taint: Mapping[str, Any]) -> tuple[str, str]:
    # The API server rejects two taints with the same key and effect: that pair is the identity.
    return (str(taint.get("key", "")), str(taint.get("effect", "")))


def merge_taints(
    existing: Iterable[Mapping[str, Any]],
    ours: Iterable[Mapping[str, Any]],
    *,
    remove: Iterable[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The union of ``existing`` and ``ours``, minus ``remove`` (matched by key and effect).

    Order and fields (``timeAdded``) of existing taints are kept; one of ours that exists with
    another value is updated in place; missing ones are appended.
    """
    wanted = {_taint_id(t): dict(t) for t in ours}
    dropped = {_taint_id(t) for t in remove} - set(wanted)
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for taint in existing:
        ident = _taint_id(taint)
        if ident in dropped or ident in seen:
            continue
        seen.add(ident)
        merged = dict(taint)
        if ident in wanted:
            merged.update(wanted[ident])
            if wanted[ident].get("value") is None:
                merged.pop("value", None)
        out.append(merged)
    out.extend(taint for ident, taint in wanted.items() if ident not in seen)
    return out


def metadata_patch(node: Mapping[str, Any], settings: NodeSettings) -> dict[str, Any] | None:
    """The merge patch that puts our labels and taint on ``node``, or None if it has them.

    It carries the node's ``resourceVersion`` as a precondition, because ``spec.taints`` is sent
    whole: a write based on a stale read must fail (409) rather than undo another's change.
    With ``settings.taint`` off, our taint is removed.
    """
    meta = node.get("metadata") or {}
    have_labels = meta.get("labels") or {}
    labels = {k: v for k, v in node_labels(settings).items() if have_labels.get(k) != v}
    existing = (node.get("spec") or {}).get("taints") or []
    ours = our_taints(settings)
    remove = [] if ours else [{"key": TAINT_KEY, "effect": TAINT_EFFECT}]
    taints = merge_taints(existing, ours, remove=remove)
    if not labels and taints == existing:
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": str(meta.get("resourceVersion", ""))}}
    if labels:
        patch["metadata"]["labels"] = labels
    if taints != existing:
        patch["spec"] = {"taints": taints}
    return patch


def build_status(
    *,
    settings: NodeSettings,
    capacity: NodeCapacity | None,
    version: str,
    now: datetime,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The Node ``status`` we publish. ``capacity`` None (never read yet) means 0 GPUs.

    ``previous_conditions`` are the Node's current conditions: a condition whose status is
    unchanged keeps its ``lastTransitionTime``.
    """
    stamp = format_time(now)
    before = {str(c.get("type")): c for c in previous_conditions}
    conditions = []
    for type_, status, reason, message in _CONDITIONS:
        prev = before.get(type_)
        transition = stamp
        if prev is not None and prev.get("status") == status and prev.get("lastTransitionTime"):
            transition = str(prev["lastTransitionTime"])
        conditions.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": transition,
            }
        )
    gpus = max(0, capacity.gpus) if capacity is not None else 0
    resources = {
        "cpu": settings.cpu,
        "memory": settings.memory,
        "pods": str(settings.pods),
        GPU_RESOURCE: str(gpus),
    }
    return {
        "capacity": dict(resources),
        "allocatable": dict(resources),
        "conditions": conditions,
        "addresses": [
            {"type": "InternalIP", "address": settings.internal_ip},
            {"type": "Hostname", "address": settings.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": settings.kubelet_port}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "",
            "containerRuntimeVersion": f"vkprovider://{version}",
            "kubeletVersion": version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def status_key(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` without condition timestamps: equal keys mean nothing changed in substance."""
    out = copy.deepcopy(dict(status))
    out["conditions"] = [
        {k: v for k, v in c.items() if k not in _TIME_KEYS} for c in out.get("conditions") or []
    ]
    return out


def products_annotation(capacity: NodeCapacity | None) -> str:
    if capacity is None:
        return ""
    return ",".join(sorted(set(capacity.gpu_products)))


def metadata_annotations(node: Mapping[str, Any], capacity: NodeCapacity | None
                         ) -> dict[str, str | None]:
    """The annotations the status patch must change on ``node`` (None: remove it): the GPU
    products offered, and the offers' prices (``vkprovider.io/offer-prices``, for the
    companion's estimate under a $/h cap; docs/kueue.md)."""
    have = (node.get("metadata") or {}).get("annotations") or {}
    want = {GPU_PRODUCTS_ANNOTATION: products_annotation(capacity),
            OFFER_PRICES_ANNOTATION: (capacity.offer_prices or "") if capacity else ""}
    return {k: v or None for k, v in want.items() if have.get(k, "") != v}

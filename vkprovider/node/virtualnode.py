"""The virtual node as the cluster sees it: registration, labels, taint, status and capacity.

Why it exists: the scheduler only places pods on a Node that exists, is Ready, has room in its
``allocatable`` and whose taints the pod tolerates; ``kubectl logs`` only works when the Node's
status says where its kubelet API listens. This module keeps that Node object true:

* **Registration.** ``GET`` the Node; on 404 create it. Otherwise patch our labels and taint in,
  never replacing what others set. Taints have no strategic-merge key, so any patch of
  ``spec.taints`` replaces the whole list: we compute the union of the taints the Node has and
  ours (``merge_taints``) and send it in a merge patch carrying ``metadata.resourceVersion`` as a
  precondition, retrying on 409. That way a taint another controller added (or removed) between
  our read and our write is never lost (or resurrected).
* **Status.** ``PATCH nodes/<name>/status`` as a *strategic* merge patch: ``conditions`` and
  ``addresses`` merge by ``type`` and the resource maps merge by key, so conditions or extended
  resources other components publish on the Node survive. A JSON merge patch would replace the
  ``conditions`` list and drop them. ``lastTransitionTime`` is kept from the Node's current
  condition while the condition's status does not change.
* **Capacity.** ``nvidia.com/gpu`` comes from the ``capacity`` callable, refreshed every
  ``capacity_refresh_seconds`` and on ``notify_changed()``, in its own task so a slow cloud never
  delays a heartbeat. When it fails, the last known figure stays; before the first success the
  Node reports ``0`` GPUs, never a made-up number.
* **Heartbeat.** The full status is patched whenever it changes and at least every
  ``status_interval_seconds``; the Lease (see ``lease.py``) is the fast heartbeat. When the
  ``healthy`` gate says False, neither is written (as virtual-kubelet does after a failed ping),
  so the node-lifecycle controller marks the node NotReady after its grace period. A short flap
  therefore costs nothing, a real outage shows.

A Node deleted while we run is registered again (with a new UID, which the Lease picks up),
unless ``vkprovider decommission`` took it out of service: it first writes the Lease
``vkprovider-decommissioned-<node>`` (:func:`decommission_marker_path`, in the provider's
namespace) with the time in ``spec.renewTime``. A marker written after this process started (a
minute's slack for clocks) means the node was taken out of service on purpose, while this
process ran: it does not register the node, neither again nor for the first time (a standby
that becomes the leader during an uninstall), the node and its Lease stop (``decommissioned``
is set) and the process stays idle until it is stopped. A process started later registers the
node as usual.

The rules for the bodies are pure functions (``build_status``, ``merge_taints``,
``metadata_patch``, ``node_labels``), tested without a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vkprovider.config import NodeSettings
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.logs import kv
from vkprovider.node.lease import MAX_BACKOFF_SECONDS, MIN_BACKOFF_SECONDS, LeaseKeeper
from vkprovider.semantics.gpus import GPU_RESOURCE
from vkprovider.semantics.timefmt import TimeFormatError, format_time, parse_time

__all__ = [
    "GPU_PRODUCTS_ANNOTATION",
    "GPU_RESOURCE",
    "TAINT_KEY",
    "TAINT_VALUE",
    "CapacityFn",
    "NodeAgent",
    "NodeCapacity",
    "VirtualNode",
    "build_status",
    "decommission_marker_path",
    "merge_taints",
    "metadata_patch",
    "node_labels",
    "our_taints",
    "run_node",
    "status_key",
]

log = logging.getLogger(__name__)

TAINT_KEY = "virtual-kubelet.io/provider"
#: How much older than this process a decommission marker may be and still count (clock skew).
_MARKER_SLACK = 60.0
#: When this process started (this module is imported at start-up).
_PROCESS_STARTED = time.time()


def decommission_marker_path(*, namespace: str, node: str) -> str:
    """The Lease ``vkprovider decommission`` writes before it deletes ``node``."""
    return (f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
            f"vkprovider-decommissioned-{node}")
TAINT_VALUE = "vkprovider"
TAINT_EFFECT = "NoSchedule"
#: Comma-separated, sorted GPU products the clouds offer right now (informational).
GPU_PRODUCTS_ANNOTATION = "vkprovider.io/gpu-products"

_NODES = "/api/v1/nodes"
_CONFLICT_RETRIES = 10

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


CapacityFn = Callable[[], Awaitable[NodeCapacity]]


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


def _products_annotation(capacity: NodeCapacity | None) -> str:
    if capacity is None:
        return ""
    return ",".join(sorted(set(capacity.gpu_products)))


def _backoff(failures: int) -> float:
    return float(min(MAX_BACKOFF_SECONDS, MIN_BACKOFF_SECONDS * 2 ** max(0, failures - 1)))


# ---- the controller -----------------------------------------------------------------------------


class VirtualNode:
    """Registers the Node and keeps its labels, taint and status current until cancelled.

    ``registered`` is set once the Node exists with our labels and taint; ``node_uid`` is its UID
    (it changes if the Node is deleted and registered again). ``capacity`` is the last successful
    capacity read (None before the first).
    """

    def __init__(
        self,
        *,
        client: KubeClient,
        settings: NodeSettings,
        capacity: CapacityFn,
        version: str,
        healthy: Callable[[], bool] | None = None,
        capacity_timeout_seconds: float = 60.0,
        first_capacity_wait_seconds: float = 5.0,
        decommission_marker: str | None = None,
    ) -> None:
        self._client = client
        self._marker = decommission_marker  # the Lease path (see decommission_marker_path)
        self._started = _PROCESS_STARTED
        self.decommissioned = asyncio.Event()
        self.settings = settings
        self._capacity_fn = capacity
        self.version = version
        self._healthy = healthy
        self._capacity_timeout = capacity_timeout_seconds
        self._first_capacity_wait = first_capacity_wait_seconds
        self.name = settings.name
        self.path = f"{_NODES}/{settings.name}"
        self.node_uid: str | None = None
        self.registered = asyncio.Event()
        self.capacity: NodeCapacity | None = None
        self.last_status_patch: float | None = None  # time.monotonic() of the last status write
        self._refresh = asyncio.Event()  # someone asked for a capacity refresh
        self._dirty = asyncio.Event()  # capacity changed: publish now
        self._first_read = asyncio.Event()

    def notify_changed(self) -> None:
        """Ask for a capacity refresh and, if anything changed, a status update, now."""
        self._refresh.set()

    async def run(self) -> None:
        """Read capacity once, register, then refresh capacity and publish status until cancelled.

        The first read comes before registration (bounded by ``first_capacity_wait_seconds``):
        a Node created with ``Ready`` and 0 GPUs, then corrected a moment later, is a Node the
        scheduler and every reader may see as full. Registering with the truth closes that
        window whenever the clouds answer in time.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._first_capacity_wait):
                await self.refresh_capacity()
        if await self._was_decommissioned():
            log.warning("node taken out of service by vkprovider decommission while this "
                        "process ran; not registering it (a restart registers it)",
                        extra=kv(node=self.name))
            self.decommissioned.set()
            return
        await self._register_until_done()
        async with asyncio.TaskGroup() as tg:
            capacity = tg.create_task(self._capacity_loop(), name=f"node-capacity-{self.name}")
            await tg.create_task(self._status_loop(), name=f"node-status-{self.name}")
            capacity.cancel()  # the status loop only ends when the node was decommissioned

    # ---- registration --------------------------------------------------------------------------

    async def register(self) -> dict[str, Any]:
        """Create the Node, or put our labels and taint on the existing one; return the Node."""
        try:
            node = await self._client.get(self.path)
        except NotFoundError:
            node = await self._create()
        else:
            node = await self._ensure_metadata(node)
        self._set_uid(node)
        self.registered.set()
        return node

    async def _register_until_done(self) -> None:
        failures = 0
        while True:
            try:
                await self.register()
                return
            except APIError as exc:
                failures += 1
                delay = _backoff(failures)
                log.warning(
                    "node registration failed; retrying",
                    extra=kv(node=self.name, error=str(exc), failures=failures, delay=delay),
                )
                await asyncio.sleep(delay)

    async def _create(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": node_labels(self.settings)},
            "spec": {"taints": our_taints(self.settings)},
            "status": build_status(
                settings=self.settings,
                capacity=self.capacity,
                version=self.version,
                now=datetime.now(UTC),
            ),
        }
        try:
            node = await self._client.create(_NODES, body)
        except ConflictError:  # created meanwhile by someone else: adopt it
            return await self._ensure_metadata(await self._client.get(self.path))
        log.info("node registered", extra=kv(node=self.name, uid=node["metadata"].get("uid")))
        return node

    async def _ensure_metadata(self, node: dict[str, Any]) -> dict[str, Any]:
        """Patch our labels/taint onto ``node`` with a resourceVersion precondition."""
        for _ in range(_CONFLICT_RETRIES):
            patch = metadata_patch(node, self.settings)
            if patch is None:
                return node
            try:
                node = await self._client.patch(self.path, patch, patch_type="merge")
            except ConflictError:
                node = await self._client.get(self.path)
                continue
            log.info(
                "node labels/taints updated",
                extra=kv(node=self.name, labels=sorted(patch["metadata"].get("labels") or {})),
            )
            return node
        raise ConflictError(f"PATCH {self.path}: still conflicting after {_CONFLICT_RETRIES} tries")

    async def _was_decommissioned(self) -> bool:
        """A decommission marker written since this process started (unreadable: no)."""
        if self._marker is None:
            return False
        try:
            lease = await self._client.get(self._marker)
        except APIError:
            return False
        raw = (lease.get("spec") or {}).get("renewTime")
        try:
            at = parse_time(raw).timestamp() if isinstance(raw, str) else None
        except TimeFormatError:
            return False
        return at is not None and at >= self._started - _MARKER_SLACK

    def _set_uid(self, node: Mapping[str, Any]) -> None:
        uid = str((node.get("metadata") or {}).get("uid") or "") or None
        if uid != self.node_uid:
            if self.node_uid is not None:
                log.info("node uid changed", extra=kv(node=self.name, old=self.node_uid, new=uid))
            self.node_uid = uid

    # ---- capacity ------------------------------------------------------------------------------

    async def refresh_capacity(self) -> bool:
        """Read capacity once; True if it changed. Failures keep the last known figure."""
        try:
            async with asyncio.timeout(self._capacity_timeout):
                fresh = await self._capacity_fn()
        except Exception as exc:  # any cloud failure: keep the last figure, try next tick
            log.warning(
                "capacity read failed; keeping the last known capacity",
                extra=kv(
                    node=self.name,
                    error=f"{type(exc).__name__}: {exc}",
                    gpus=None if self.capacity is None else self.capacity.gpus,
                ),
            )
            return False
        finally:
            self._first_read.set()
        if fresh == self.capacity:
            return False
        log.info(
            "capacity changed",
            extra=kv(
                node=self.name,
                gpus=fresh.gpus,
                was=None if self.capacity is None else self.capacity.gpus,
            ),
        )
        self.capacity = fresh
        return True

    async def _capacity_loop(self) -> None:
        while True:
            self._refresh.clear()
            if await self.refresh_capacity():
                self._dirty.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.capacity_refresh_seconds):
                    await self._refresh.wait()

    # ---- status --------------------------------------------------------------------------------

    def _is_healthy(self) -> bool:
        if self._healthy is None:
            return True
        try:
            return bool(self._healthy())
        except Exception as exc:
            log.warning("health check raised; treating as unhealthy", extra=kv(error=str(exc)))
            return False

    def _desired_key(self) -> tuple[dict[str, Any], str]:
        status = build_status(
            settings=self.settings,
            capacity=self.capacity,
            version=self.version,
            now=datetime.now(UTC),
        )
        return status_key(status), _products_annotation(self.capacity)

    async def push_status(self) -> tuple[dict[str, Any], str]:
        """Read the Node, fix labels/taint if needed, patch its status; return what was sent.

        Raises NotFoundError if the Node is gone.
        """
        node = await self._client.get(self.path)
        self._set_uid(node)
        node = await self._ensure_metadata(node)
        capacity = self.capacity
        status = build_status(
            settings=self.settings,
            capacity=capacity,
            version=self.version,
            now=datetime.now(UTC),
            previous_conditions=(node.get("status") or {}).get("conditions") or [],
        )
        products = _products_annotation(capacity)
        body: dict[str, Any] = {"status": status}
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        if annotations.get(GPU_PRODUCTS_ANNOTATION, "") != products:
            body["metadata"] = {"annotations": {GPU_PRODUCTS_ANNOTATION: products or None}}
        await self._client.patch(f"{self.path}/status", body, patch_type="strategic")
        self.last_status_patch = time.monotonic()
        return status_key(status), products

    async def _status_loop(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._first_capacity_wait):
                await self._first_read.wait()  # avoid publishing "0 GPUs" just before the truth
        interval = self.settings.status_interval_seconds
        last_sent: tuple[dict[str, Any], str] | None = None
        last_at: float | None = None
        failures = 0
        was_healthy = True
        while True:
            self._dirty.clear()
            now = time.monotonic()
            healthy = self._is_healthy()
            if healthy != was_healthy:
                if healthy:
                    log.info(
                        "provider healthy again; posting node status", extra=kv(node=self.name)
                    )
                else:
                    log.warning("provider unhealthy; not posting status", extra=kv(node=self.name))
                was_healthy = healthy
            if not healthy:
                delay = min(1.0, interval)
            elif last_at is None or now - last_at >= interval or self._desired_key() != last_sent:
                try:
                    last_sent = await self.push_status()
                except NotFoundError:
                    if await self._was_decommissioned():
                        log.warning("node deleted by vkprovider decommission; not registering "
                                    "it again (a restart registers it)", extra=kv(node=self.name))
                        self.decommissioned.set()
                        return
                    log.warning("node was deleted; registering it again", extra=kv(node=self.name))
                    await self._register_until_done()
                    last_sent = None
                    continue
                except APIError as exc:
                    failures += 1
                    delay = _backoff(failures)
                    log.warning(
                        "node status update failed; retrying",
                        extra=kv(node=self.name, error=str(exc), failures=failures, delay=delay),
                    )
                else:
                    failures = 0
                    last_at = time.monotonic()
                    delay = interval
            else:
                delay = max(0.0, interval - (now - last_at))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._dirty.wait()


# ---- both together ------------------------------------------------------------------------------


class NodeAgent:
    """The virtual node and its Lease, wired together. ``node`` and ``lease`` are exposed so the
    process can call ``node.notify_changed()`` and report ``lease.last_renewed`` as health."""

    def __init__(
        self,
        *,
        client: KubeClient,
        settings: NodeSettings,
        capacity: CapacityFn,
        version: str,
        healthy: Callable[[], bool] | None = None,
        decommission_marker: str | None = None,
    ) -> None:
        self.node = VirtualNode(
            client=client, settings=settings, capacity=capacity, version=version, healthy=healthy,
            decommission_marker=decommission_marker,
        )
        self.lease = LeaseKeeper(
            client=client,
            node_name=settings.name,
            node_uid=lambda: self.node.node_uid,
            duration_seconds=settings.lease_duration_seconds,
            renew_seconds=settings.lease_renew_seconds,
            healthy=healthy,
        )

    async def run(self) -> None:
        """Run both until cancelled; the Lease starts once the Node is registered."""
        async with asyncio.TaskGroup() as tg:
            lease = tg.create_task(self._lease(), name=f"node-lease-{self.node.name}")
            await tg.create_task(self.node.run(), name=f"virtual-node-{self.node.name}")
            lease.cancel()  # decommissioned: no heartbeat for a node that is gone

    async def _lease(self) -> None:
        await self.node.registered.wait()
        await self.lease.run()


async def run_node(
    *,
    client: KubeClient,
    settings: NodeSettings,
    capacity: CapacityFn,
    version: str,
    healthy: Callable[[], bool] | None = None,
) -> None:
    """Run the virtual node and its Lease until cancelled (see :class:`NodeAgent`)."""
    await NodeAgent(
        client=client, settings=settings, capacity=capacity, version=version, healthy=healthy
    ).run()

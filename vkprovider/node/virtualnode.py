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
  Node reports ``0`` GPUs, never a made-up number. The same read gives the GPU products offered
  and what the offers cost per GPU-hour, which ride the status patch as the Node annotations
  ``vkprovider.io/gpu-products`` and ``vkprovider.io/offer-prices`` (the companion's estimate
  under a $/h cap, :mod:`vkprovider.placement.offerprices`).
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

The rules for the bodies are pure functions in :mod:`vkprovider.node.nodebody` (``build_status``,
``merge_taints``, ``metadata_patch``, ``node_labels``), tested without a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from vkprovider.config import NodeSettings
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.logs import kv
from vkprovider.node.lease import MAX_BACKOFF_SECONDS, MIN_BACKOFF_SECONDS, LeaseKeeper
from vkprovider.node.nodebody import (
    NodeCapacity,
    build_status,
    metadata_annotations,
    metadata_patch,
    node_labels,
    our_taints,
    products_annotation,
    status_key,
)
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

__all__ = [
    "CapacityFn",
    "NodeAgent",
    "VirtualNode",
    "decommission_marker_path",
    "run_node",
]

log = logging.getLogger(__name__)

#: How much older than this process a decommission marker may be and still count (clock skew).
_MARKER_SLACK = 60.0
#: When this process started (this module is imported at start-up).
_PROCESS_STARTED = time.time()


def decommission_marker_path(*, namespace: str, node: str) -> str:
    """The Lease ``vkprovider decommission`` writes before it deletes ``node``."""
    return (f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
            f"vkprovider-decommissioned-{node}")

CapacityFn = Callable[[], Awaitable[NodeCapacity]]

_NODES = "/api/v1/nodes"
_CONFLICT_RETRIES = 10

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

    def _desired_key(self) -> tuple[dict[str, Any], str, str | None]:
        status = build_status(
            settings=self.settings,
            capacity=self.capacity,
            version=self.version,
            now=datetime.now(UTC),
        )
        return (status_key(status), products_annotation(self.capacity),
                self.capacity.offer_prices if self.capacity else None)

    async def push_status(self) -> tuple[dict[str, Any], str, str | None]:
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
        body: dict[str, Any] = {"status": status}
        annotations = metadata_annotations(node, capacity)
        if annotations:
            body["metadata"] = {"annotations": annotations}
        await self._client.patch(f"{self.path}/status", body, patch_type="strategic")
        self.last_status_patch = time.monotonic()
        return (status_key(status), products_annotation(capacity),
                capacity.offer_prices if capacity else None)

    async def _status_loop(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._first_capacity_wait):
                await self._first_read.wait()  # avoid publishing "0 GPUs" just before the truth
        interval = self.settings.status_interval_seconds
        last_sent: tuple[dict[str, Any], str, str | None] | None = None
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

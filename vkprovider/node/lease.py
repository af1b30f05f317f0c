"""The virtual node's heartbeat: its Lease in ``kube-node-lease``.

Why it exists: the node-lifecycle controller decides whether a node is alive from its Lease (a
cheap write every few seconds) rather than from full status updates. If the Lease is not renewed
within ``leaseDurationSeconds`` the node goes NotReady, gets the ``unreachable`` taints, and its
pods are eventually evicted. So the renewal loop must be stubborn (API errors never stop it: it
retries fast, 0.1 s doubling to 7 s, as virtual-kubelet does) and honest (when the ``healthy``
gate says the provider is broken, the Lease is *not* renewed, so the cluster sees the node go
NotReady instead of trusting a node that cannot run pods).

The Lease is owned by the Node (``ownerReferences`` with the Node's UID), so the garbage collector
removes it with the Node. The owner UID is read through a getter on every write, because the Node
may be deleted and registered again with a new UID while this loop runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.logs import kv
from vkprovider.semantics.timefmt import format_micro_time

__all__ = ["LEASE_NAMESPACE", "LeaseKeeper", "format_micro_time"]

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
_LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"

MIN_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 7.0


class LeaseKeeper:
    """Creates and renews ``kube-node-lease/<node_name>`` until cancelled.

    ``node_uid`` is the Node's UID or a getter for it (``None`` while unknown: the Lease is then
    written without an owner, and the owner is added by the next renewal that knows it).
    ``healthy``, when given, is asked before every write; ``False`` (or an exception) skips it.
    ``last_renewed`` is the ``time.monotonic()`` of the last successful write, for health checks.
    """

    def __init__(
        self,
        *,
        client: KubeClient,
        node_name: str,
        node_uid: str | Callable[[], str | None] | None = None,
        duration_seconds: int = 40,
        renew_seconds: float = 10.0,
        healthy: Callable[[], bool] | None = None,
    ) -> None:
        if renew_seconds <= 0:
            raise ValueError("renew_seconds must be positive")
        if duration_seconds <= 0:
            raise ValueError("duration_seconds must be positive")
        self._client = client
        self.node_name = node_name
        self._node_uid = node_uid
        self.duration_seconds = duration_seconds
        self.renew_seconds = renew_seconds
        self._healthy = healthy
        self.last_renewed: float | None = None
        self.path = f"{_LEASES}/{node_name}"

    # ---- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Renew forever; returns only by cancellation."""
        failures = 0
        was_healthy = True
        while True:
            healthy = self._is_healthy()
            if healthy != was_healthy:
                if healthy:
                    log.info("provider healthy again; renewing the lease", extra=self._kv())
                else:
                    log.warning("provider unhealthy; not renewing the lease", extra=self._kv())
                was_healthy = healthy
            if not healthy:
                await asyncio.sleep(self.renew_seconds)
                continue
            try:
                await self.renew_once()
            except APIError as exc:
                failures += 1
                delay = min(MAX_BACKOFF_SECONDS, MIN_BACKOFF_SECONDS * 2 ** (failures - 1))
                log.warning(
                    "lease renewal failed; retrying",
                    extra=self._kv(error=str(exc), failures=failures, delay=delay),
                )
                await asyncio.sleep(delay)
                continue
            if failures:
                log.info("lease renewed after failures", extra=self._kv(failures=failures))
            failures = 0
            await asyncio.sleep(self.renew_seconds)

    async def renew_once(self) -> dict[str, Any]:
        """Write ``renewTime`` = now, creating the Lease if it does not exist; return the Lease."""
        now = format_micro_time(datetime.now(UTC))
        spec = {
            "holderIdentity": self.node_name,
            "leaseDurationSeconds": self.duration_seconds,
            "renewTime": now,
        }
        owners = self._owner_references()
        patch: dict[str, Any] = {"spec": spec}
        if owners:
            patch["metadata"] = {"ownerReferences": owners}
        try:
            lease = await self._client.patch(self.path, patch, patch_type="merge")
        except NotFoundError:
            lease = await self._create(spec=spec, owners=owners)
        self.last_renewed = time.monotonic()
        return lease

    # ---- helpers -------------------------------------------------------------------------------

    async def _create(
        self, *, spec: dict[str, Any], owners: list[dict[str, Any]]
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.node_name, "namespace": LEASE_NAMESPACE}
        if owners:
            metadata["ownerReferences"] = owners
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }
        try:
            lease = await self._client.create(_LEASES, body)
        except ConflictError:
            # Created between our patch and create (another replica, or a restart race):
            # renew the one that exists.
            return await self._client.patch(self.path, {"spec": spec}, patch_type="merge")
        log.info("lease created", extra=self._kv())
        return lease

    def _owner_references(self) -> list[dict[str, Any]]:
        uid = self._node_uid() if callable(self._node_uid) else self._node_uid
        if not uid:
            return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid}]

    def _is_healthy(self) -> bool:
        if self._healthy is None:
            return True
        try:
            return bool(self._healthy())
        except Exception as exc:  # a broken health check means: do not vouch for the node
            log.warning(
                "health check raised; treating as unhealthy", extra=self._kv(error=str(exc))
            )
            return False

    def _kv(self, **fields: Any) -> dict[str, Any]:
        return kv(node=self.node_name, **fields)

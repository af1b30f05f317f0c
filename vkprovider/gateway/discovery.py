"""Which gateway pods exist: the gateway Deployment's Ready pods, watched by label.

Why it exists: the gateway runs as a Deployment, so its pods' IPs change with every rollout,
eviction and reschedule; a static list cannot follow. This watches the pods that match
``gateway.pods.selector`` in ``gateway.pods.namespace`` and tells the controller the Ready ones
(with an IP, not being deleted): each becomes an instance whose EndpointSlice address is its pod
IP and whose Runtime API is ``tls://<pod IP>:<runtime_port>`` (mutual TLS). A pod that turns
unready or goes away stops being a home for replicas at once (they are re-homed); a new one is
programmed by the next pass before anything is sent to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv

__all__ = ["GatewayPods", "ready_addresses"]

log = logging.getLogger(__name__)

Body = dict[str, Any]


def ready_addresses(pods: list[Body]) -> list[str]:
    """The pod IPs of the Ready pods that are not being deleted, sorted."""
    out: set[str] = set()
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        ip = status.get("podIP")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if isinstance(ip, str) and ip and ready:
            out.add(ip)
    return sorted(out)


def _slim(pod: Body) -> Body:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                             "deletionTimestamp") if k in meta},
            "status": {"podIP": status.get("podIP"),
                       "conditions": [{"type": c.get("type"), "status": c.get("status")}
                                      for c in status.get("conditions") or []]}}


class GatewayPods:
    """Watches the gateway's pods; calls ``on_change`` with the Ready pod IPs when they change."""

    def __init__(self, *, client: KubeClient, namespace: str, selector: str,
                 on_change: Callable[[list[str]], None]) -> None:
        self.on_change = on_change
        self.addresses: list[str] | None = None
        self.informer = Informer(client=client, name="gateway-pods",
                                 path=f"/api/v1/namespaces/{namespace}/pods",
                                 params={"labelSelector": selector}, transform=_slim,
                                 handler=lambda _event, _obj: self._changed())

    def _changed(self) -> None:
        addresses = ready_addresses(list(self.informer.store.values()))
        if addresses != self.addresses:
            log.info("gateway pods", extra=kv(ready=",".join(addresses) or "none"))
            self.addresses = addresses
            self.on_change(addresses)

    async def run(self) -> None:
        await self.informer.run()

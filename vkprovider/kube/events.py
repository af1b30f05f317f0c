"""Kubernetes Events: what the service decided and why, where ``kubectl describe`` shows it.

Why it exists: users debug with ``kubectl describe pod``; every decision they would want to see
(rejected, created on which cloud, no capacity, deleted) is an Event with a reason. Repeats of the
same (object, reason, message) are folded into one Event whose count grows, as the kubelet does,
so a retry loop cannot flood etcd. Posting an Event never fails the caller.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.logs import kv

log = logging.getLogger(__name__)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class _Seen:
    namespace: str
    name: str
    count: int


class EventRecorder:
    def __init__(self, *, client: KubeClient, component: str, host: str = "",
                 cache_size: int = 4096) -> None:
        self._client = client
        self._component = component
        self._host = host
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}
        self._cache_size = cache_size

    async def emit(
        self,
        *,
        obj: dict[str, Any],
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """Record an Event about ``obj`` (a Pod, Node, Deployment, ... as a dict)."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        uid = str(meta.get("uid", ""))
        message = message[:1024]
        key = (uid, reason, type_, message)
        try:
            seen = self._seen.get(key)
            if seen is not None:
                seen.count += 1
                try:
                    await self._client.patch(
                        f"/api/v1/namespaces/{seen.namespace}/events/{seen.name}",
                        {"count": seen.count, "lastTimestamp": _now()},
                    )
                    return
                except NotFoundError:
                    del self._seen[key]  # expired by its TTL: post a new one
            name = f"{meta.get('name', 'object')}.{secrets.token_hex(8)}"
            now = _now()
            await self._client.create(f"/api/v1/namespaces/{namespace}/events", {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {
                    "apiVersion": obj.get("apiVersion", "v1"),
                    "kind": obj.get("kind", "Pod"),
                    "name": meta.get("name"),
                    "namespace": meta.get("namespace"),
                    "uid": uid,
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "reason": reason,
                "message": message,
                "type": type_,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": self._component, "host": self._host},
                "reportingComponent": self._component,
                "reportingInstance": self._host,
            })
            if len(self._seen) >= self._cache_size:
                self._seen.pop(next(iter(self._seen)))
            self._seen[key] = _Seen(namespace=namespace, name=name, count=1)
        except APIError as exc:
            log.warning("could not record event",
                        extra=kv(reason=reason, object=meta.get("name"), error=str(exc)))

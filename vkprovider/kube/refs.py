"""Secrets and ConfigMaps a pod's env refers to, read on demand.

Why it exists: translation needs the values of ``secretKeyRef``/``envFrom`` at create time only.
Reading them by GET when a pod is created (rather than caching every Secret in the cluster, as
Virtual Kubelet does) keeps RBAC to ``get`` and keeps secrets out of our memory between creates.
Values are returned decoded and must never be logged.
"""

from __future__ import annotations

import base64
import binascii

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import NotFoundError


class KubeRefSource:
    """Implements ``vkprovider.node.translate.RefSource`` against the API server."""

    def __init__(self, *, client: KubeClient) -> None:
        self._client = client

    async def secret(self, *, namespace: str, name: str) -> dict[str, str] | None:
        try:
            body = await self._client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except NotFoundError:
            return None
        out: dict[str, str] = {}
        for key, value in (body.get("data") or {}).items():
            try:
                out[key] = base64.b64decode(value).decode("utf-8", errors="replace")
            except (binascii.Error, ValueError):
                continue
        for key, value in (body.get("stringData") or {}).items():
            out[key] = str(value)
        return out

    async def config_map(self, *, namespace: str, name: str) -> dict[str, str] | None:
        try:
            body = await self._client.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        except NotFoundError:
            return None
        return {k: str(v) for k, v in (body.get("data") or {}).items()}

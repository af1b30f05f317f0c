"""Fakes shared by the kubelet API unit tests (no tests here): a node view, a cloud, reviews."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from providers.base import Instance, InstanceState, LogOptions, ProviderError
from vkprovider.api.view import Placement
from vkprovider.kube.authn import (
    AccessDecision,
    ResourceAttributes,
    TokenReviewResult,
    UserInfo,
)
from vkprovider.kube.errors import APIError

STARTED = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


class NoMetricsCloud:
    """A provider with logs but no gpu_metrics."""

    def __init__(self, *, name: str = "mock", lines: int = 5) -> None:
        self.name = name
        self.lines = [f"line {i}\n".encode() for i in range(lines)]
        self.log_calls: list[tuple[str, LogOptions]] = []
        self.log_error: ProviderError | None = None
        self.closed = 0
        self.metrics_calls: list[str] = []
        self.metrics_error: ProviderError | None = None
        self.utilization = 75.0

    async def logs(self, instance_id: str, opts: LogOptions) -> AsyncIterator[bytes]:
        self.log_calls.append((instance_id, opts))
        try:
            if self.log_error is not None:
                raise self.log_error
            lines = self.lines
            if opts.tail_lines is not None:
                lines = lines[len(lines) - opts.tail_lines:] if opts.tail_lines else []
            for line in lines:
                yield (b"2026-01-01T12:00:00.000000000Z " + line) if opts.timestamps else line
            while opts.follow:
                await asyncio.sleep(0.02)
                yield b"heartbeat\n"
        finally:
            self.closed += 1

    async def create(self, spec: Any) -> Instance:
        raise NotImplementedError

    async def list(self) -> list[Instance]:
        return []

    async def delete(self, instance_id: str) -> None:
        return None

    async def capacity(self) -> list[Any]:
        return []

    async def aclose(self) -> None:
        return None


class FakeCloud(NoMetricsCloud):
    """A provider with logs and gpu_metrics (two H100s)."""

    async def gpu_metrics(self, instance_id: str) -> dict[str, Any]:
        self.metrics_calls.append(instance_id)
        if self.metrics_error is not None:
            raise self.metrics_error
        return {"instance_id": instance_id, "state": "running", "gpus": [
            {"index": i, "uuid": f"GPU-{instance_id}-{i}", "gpu_type": "H100",
             "gpu_utilization": self.utilization, "tensor_active": 0.6,
             "memory_used_bytes": 40 * 2**30, "memory_total_bytes": 80 * 2**30,
             "temperature_c": 61.5, "power_w": 450.0} for i in range(2)]}


def make_pod(name: str, *, ns: str = "team", uid: str | None = None, phase: str = "Running",
             containers: tuple[str, ...] = ("main",)) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}"},
            "spec": {"nodeName": "vk-test",
                     "containers": [{"name": c, "image": "vllm/vllm-openai:v0.6"}
                                    for c in containers]},
            "status": {"phase": phase, "startTime": "2026-01-01T11:59:00Z"}}


def make_instance(uid: str, *, state: InstanceState = InstanceState.RUNNING,
                  provider: str = "mock") -> Instance:
    return Instance(id=f"i-{uid}", name=f"vk-test-{uid}", provider=provider, state=state,
                    gpu_type="H100", gpu_count=2, started_at=STARTED)


class FakeView:
    def __init__(self) -> None:
        self.node_name = "vk-test"
        self.by_key: dict[str, dict[str, Any]] = {}
        self.placed: dict[str, Placement] = {}

    def add(self, pod: dict[str, Any], cloud: Any | None = None,
            state: InstanceState = InstanceState.RUNNING) -> None:
        meta = pod["metadata"]
        self.by_key[f"{meta['namespace']}/{meta['name']}"] = pod
        if cloud is not None:
            uid = meta["uid"]
            self.placed[uid] = Placement(uid=uid, namespace=meta["namespace"],
                                         pod=meta["name"], provider_name=cloud.name,
                                         provider=cloud, instance=make_instance(uid, state=state,
                                                                                provider=cloud.name))

    def remove(self, name: str, ns: str = "team") -> None:
        pod = self.by_key.pop(f"{ns}/{name}")
        self.placed.pop(pod["metadata"]["uid"], None)

    def pods(self) -> list[dict[str, Any]]:
        return list(self.by_key.values())

    def pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return self.by_key.get(f"{namespace}/{name}")

    def placement(self, uid: str) -> Placement | None:
        return self.placed.get(uid)

    def placements(self) -> list[Placement]:
        return list(self.placed.values())

    def placements_version(self) -> object:
        return None  # tests change ``placed`` directly: never skip


class FakeReviewer:
    """Answers reviews from tables; counts calls; can fail like an unreachable API server."""

    def __init__(self) -> None:
        self.tokens: dict[str, UserInfo] = {}
        self.allowed: set[tuple[str, str, str]] = set()  # (user or group, verb, subresource)
        self.token_calls = 0
        self.access_calls: list[tuple[UserInfo, ResourceAttributes]] = []
        self.fail = False

    async def review_token(self, *, token: str) -> TokenReviewResult:
        self.token_calls += 1
        if self.fail:
            raise APIError("POST tokenreviews: connection refused", status=0)
        user = self.tokens.get(token)
        if user is None:
            return TokenReviewResult(authenticated=False, error="invalid bearer token")
        return TokenReviewResult(authenticated=True, user=user)

    async def review_access(self, *, user: UserInfo,
                            attributes: ResourceAttributes) -> AccessDecision:
        self.access_calls.append((user, attributes))
        if self.fail:
            raise APIError("POST subjectaccessreviews: connection refused", status=0)
        for who in (user.name, *user.groups):
            if (who, attributes.verb, attributes.subresource) in self.allowed:
                return AccessDecision(allowed=True, reason="RBAC: allowed")
        return AccessDecision(allowed=False, reason="")

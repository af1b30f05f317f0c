"""Cloud accounts declared as GPUProvider objects: served, rebuilt, capped, and reported in status.

Real control plane; a mock cloud that requires an API key (``--api-key-env``), the key in a
Secret; ``vkprovider run`` with no ``providers:`` in its settings file, so every pod can only run
on what the GPUProvider objects declare.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import os
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.waiting import eventually

from .conftest import System

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide]  # GPUProviders, policies

GPUPROVIDERS = "/apis/vkprovider.io/v1alpha1/gpuproviders"
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vkprovider",
              "effect": "NoSchedule"}
KEY_ENV = "VKP_TEST_MOCK_API_KEY"
FAST = {"gpu_providers": {"secret_refresh_seconds": 1, "status_interval_seconds": 1,
                          "resync_seconds": 0.5}}


def trusting(namespace: str) -> dict[str, Any]:
    """FAST, and trust in the test's namespace (its Secrets) and in 127.0.0.1 (its clouds)."""
    return {"gpu_providers": {**FAST["gpu_providers"], "secret_namespaces": [namespace],
                              "allowed_endpoint_hosts": ["127.0.0.1"]}}


class KeyedMockCloud(MockCloudProcess):
    """A mock cloud that answers only requests carrying ``api_key`` (admin calls included)."""

    def __init__(self, *, work_dir: Path, name: str, api_key: str, inventory: str) -> None:
        super().__init__(work_dir=work_dir, name=name, boot_delay=0.3, inventory=inventory)
        self.api_key = api_key
        self.component.argv += ["--api-key-env", KEY_ENV]

    async def start(self) -> None:
        self.component.start(env={**os.environ, KEY_ENV: self.api_key})
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=self.url) as http:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/healthz")).status_code == 200:
                        return
                if not self.component.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"mock cloud did not start:\n{self.component.tail()}")
                await asyncio.sleep(0.1)

    async def admin(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        async with httpx.AsyncClient(base_url=self.url, timeout=30, headers=headers) as http:
            resp = await http.request(method, path, **kwargs)
            resp.raise_for_status()
            return resp.json() if resp.content else None


class Objects:
    """GPUProviders created by one test (cluster-scoped), deleted after it."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.names: list[str] = []

    async def gpu_provider(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        obj = await self.kube.create(GPUPROVIDERS, {
            "apiVersion": "vkprovider.io/v1alpha1", "kind": "GPUProvider",
            "metadata": {"name": name}, "spec": spec})
        self.names.append(name)
        return obj


@pytest_asyncio.fixture
async def objects(kube: KubeClient, crds: list[str]) -> AsyncIterator[Objects]:
    objs = Objects(kube)
    try:
        yield objs
    finally:
        for name in objs.names:
            with contextlib.suppress(Exception):
                await kube.delete(f"{GPUPROVIDERS}/{name}")


async def secret(kube: KubeClient, ns: str, name: str, value: str, *, update: bool = False
                 ) -> None:
    data = {"apiKey": base64.b64encode(value.encode()).decode()}
    if update:
        await kube.patch(f"/api/v1/namespaces/{ns}/secrets/{name}", {"data": data})
        return
    await kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data})


async def start(system: System, local_cluster: LocalCluster, *, api_key: str, namespace: str,
                inventory: str = "H100:us-east:8:2.50",
                pods: dict[str, Any] | None = None) -> KeyedMockCloud:
    cloud = KeyedMockCloud(work_dir=system.work_dir, name="keyed", api_key=api_key,
                           inventory=inventory)
    await cloud.start()
    system.clouds.append(cloud)
    system.provider = ProviderProcess(
        work_dir=system.work_dir, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=[], config_providers=False, client_ca_file=local_cluster.ca_path,
        extra=trusting(namespace), pods=pods)
    system.provider.start()
    return cloud


def pod_body(name: str, node: str, *, bind: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 1}
    if bind:
        spec["nodeName"] = node  # straight onto the node, past the scheduler's GPU check
    else:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": spec}


async def pods(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    return list((await kube.get(f"/api/v1/namespaces/{ns}/pods"))["items"])


def cond(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


async def gpup(kube: KubeClient, name: str) -> dict[str, Any]:
    return await kube.get(f"{GPUPROVIDERS}/{name}")


async def allocatable(kube: KubeClient, node: str) -> str | None:
    try:
        body = await kube.get(f"/api/v1/nodes/{node}")
    except Exception:
        return None
    value = (body.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu")
    return None if value is None else str(value)


async def test_gpuprovider_serves_pods_and_reports_health_blocks_and_spend(
    kube: KubeClient, namespace: str, system: System, objects: Objects,
    local_cluster: LocalCluster,
) -> None:
    name = f"gp-{uuid.uuid4().hex[:6]}"
    await secret(kube, namespace, "cloud-key", "right-key")
    cloud = await start(system, local_cluster, api_key="right-key", namespace=namespace)
    await objects.gpu_provider(name, {
        "type": "mock", "endpoint": cloud.url,
        "credentialsSecret": {"namespace": namespace, "name": "cloud-key"}})
    await eventually(lambda: allocatable(kube, system.node_name), until=lambda a: a == "8",
                     timeout=60, what="allocatable nvidia.com/gpu from the GPUProvider's offers")
    for i in range(2):
        await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                          pod_body(f"p{i}", system.node_name))
    ps = await eventually(lambda: pods(kube, namespace), timeout=60,
                          until=lambda ps: len(ps) == 2 and all(
                              p["status"].get("phase") == "Running" for p in ps),
                          what="2 pods Running on the GPUProvider's cloud")
    assert {p["metadata"]["annotations"]["vkprovider.io/provider"] for p in ps} == {name}

    obj = await eventually(
        lambda: gpup(kube, name), timeout=30, what="status with 2 instances at $5/h",
        until=lambda o: (o.get("status") or {}).get("runningInstances") == 2
        and abs(float(o["status"].get("currentPricePerHour", 0)) - 5.0) < 1e-6)
    status = obj["status"]
    assert status["health"] == "Healthy"
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert cond(obj, "Valid")["status"] == "True"
    ready = cond(obj, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Healthy"
    assert ready["lastTransitionTime"] and ready["observedGeneration"] == 1
    assert status.get("blockedOffers") == []

    # A capacity error on create: that offer is blocked, with an expiry, in the status.
    await cloud.admin("POST", "/admin/faults", json={"endpoint": "create", "status": 409,
                                                     "count": 1})
    await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                      pod_body("p-blocked", system.node_name))
    obj = await eventually(lambda: gpup(kube, name), timeout=30, what="a blocked offer",
                           until=lambda o: bool((o.get("status") or {}).get("blockedOffers")))
    [block] = obj["status"]["blockedOffers"]
    assert block["gpuType"] == "H100" and block["reason"] == "no capacity"
    until = datetime.fromisoformat(block["until"].replace("Z", "+00:00"))
    assert until > datetime.now(UTC)

    # The key is rotated to a wrong one: the adapter is rebuilt and the cloud says no.
    await secret(kube, namespace, "cloud-key", "wrong-key", update=True)
    obj = await eventually(lambda: gpup(kube, name), timeout=30, what="health AuthFailed",
                           until=lambda o: (o.get("status") or {}).get("health") == "AuthFailed")
    ready = cond(obj, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "AuthFailed"
    assert cond(obj, "Valid")["status"] == "True"
    log = system.provider.log_text() if system.provider else ""
    assert "wrong-key" not in log and "right-key" not in log, "keys must never be logged"


async def test_invalid_gpuproviders_get_valid_false_naming_the_field(
    kube: KubeClient, namespace: str, system: System, objects: Objects,
    local_cluster: LocalCluster,
) -> None:
    cloud = await start(system, local_cluster, api_key="k", namespace=namespace)
    missing, wrong_key = f"gp-missing-{uuid.uuid4().hex[:6]}", f"gp-nokey-{uuid.uuid4().hex[:6]}"
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other"},
        "data": {"token": base64.b64encode(b"k").decode()}})
    await objects.gpu_provider(missing, {
        "type": "mock", "endpoint": cloud.url,
        "credentialsSecret": {"namespace": namespace, "name": "does-not-exist"}})
    await objects.gpu_provider(wrong_key, {
        "type": "mock", "endpoint": cloud.url,
        "credentialsSecret": {"namespace": namespace, "name": "other", "key": "apiKey"}})
    for name in (missing, wrong_key):
        obj = await eventually(functools.partial(gpup, kube, name), timeout=60,
                               until=lambda o: cond(o, "Valid").get("status") == "False",
                               what=f"{name}: Valid=False")
        valid = cond(obj, "Valid")
        assert valid["reason"] == "SecretNotFound"
        assert valid["message"].startswith("spec.credentialsSecret: ")
        assert cond(obj, "Ready")["status"] == "False"
        assert cond(obj, "Ready")["reason"] == "Invalid"
    await asyncio.sleep(2)
    assert (await cloud.stats())["list_calls"] == 0, "an invalid provider is never called"


async def test_max_gpus_caps_creation_and_allocatable(
    kube: KubeClient, namespace: str, system: System, objects: Objects,
    local_cluster: LocalCluster,
) -> None:
    name = f"gp-cap-{uuid.uuid4().hex[:6]}"
    await secret(kube, namespace, "cloud-key", "k")
    cloud = await start(system, local_cluster, api_key="k", namespace=namespace)
    await objects.gpu_provider(name, {
        "type": "mock", "endpoint": cloud.url, "maxGPUs": 2,
        "credentialsSecret": {"namespace": namespace, "name": "cloud-key"}})
    await eventually(lambda: allocatable(kube, system.node_name), until=lambda a: a == "2",
                     timeout=60, what="allocatable capped to maxGPUs 2 (the cloud sells 8)")
    for i in range(3):
        await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                          pod_body(f"p{i}", system.node_name))

    def split(ps: list[dict[str, Any]]) -> tuple[int, int]:
        run = sum(1 for p in ps if p["status"].get("phase") == "Running")
        return run, len(ps) - run

    await eventually(lambda: pods(kube, namespace), timeout=60,
                     until=lambda ps: split(ps) == (2, 1), what="2 Running, 1 Pending")
    # Past the scheduler: a pod bound by hand is skipped for the provider budget.
    await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                      pod_body("bound", system.node_name, bind=True))

    async def bound_events() -> list[dict[str, Any]]:
        body = await kube.get(f"/api/v1/namespaces/{namespace}/events",
                              params={"fieldSelector": "involvedObject.name=bound"})
        return list(body["items"])

    events = await eventually(bound_events, timeout=30, what="a NoCapacity event",
                              until=lambda ev: any(e["reason"] == "NoCapacity" for e in ev))
    message = next(e["message"] for e in events if e["reason"] == "NoCapacity")
    assert "provider budget" in message and "maxGPUs 2" in message
    stats = await cloud.stats()
    assert stats["instances_created"] == 2
    assert await allocatable(kube, system.node_name) == "2"
    obj = await gpup(kube, name)
    assert obj["status"]["runningInstances"] == 2

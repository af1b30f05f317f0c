"""The virtual node against a real API server: registration, status, capacity, Lease, health."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.config import NodeSettings
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.node.nodebody import GPU_PRODUCTS_ANNOTATION, NodeCapacity
from vkprovider.node.virtualnode import NodeAgent, run_node
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster

GPU = "nvidia.com/gpu"
OUR_TAINT = {"key": "virtual-kubelet.io/provider", "value": "vkprovider", "effect": "NoSchedule"}
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


@pytest_asyncio.fixture
async def node_name(kube: KubeClient, local_cluster: LocalCluster) -> AsyncIterator[str]:
    """A unique node name; the Node and its Lease are deleted after the test."""
    name = f"vk-test-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        for path in (f"/api/v1/nodes/{name}", f"{LEASES}/{name}"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)


def settings_for(name: str, **overrides: Any) -> NodeSettings:
    values: dict[str, Any] = {
        "name": name,
        "internal_ip": "127.0.0.1",
        "kubelet_port": 10251,
        "labels": {"vkprovider.io/test": "virtual-node"},
        "lease_renew_seconds": 0.5,
        "status_interval_seconds": 60,
        "capacity_refresh_seconds": 3600,  # only notify_changed() refreshes within a test
    }
    values.update(overrides)
    return NodeSettings(**values)


class FakeCapacity:
    def __init__(self, gpus: int, products: tuple[str, ...] = ()) -> None:
        self.value = NodeCapacity(gpus=gpus, gpu_products=products)
        self.calls = 0

    async def __call__(self) -> NodeCapacity:
        self.calls += 1
        return self.value


@contextlib.asynccontextmanager
async def running(coro: Awaitable[None]) -> AsyncIterator[asyncio.Task[None]]:
    task: asyncio.Task[None] = asyncio.ensure_future(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _get(kube: KubeClient, path: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def probe() -> dict[str, Any]:
        try:
            return await kube.get(path)
        except NotFoundError:
            return {}

    return probe


def is_ready(node: dict[str, Any]) -> bool:
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def allocatable_gpus(node: dict[str, Any]) -> str | None:
    return ((node.get("status") or {}).get("allocatable") or {}).get(GPU)


def taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def strip_time(taint: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in taint.items() if k != "timeAdded"}


async def renew_time(kube: KubeClient, name: str) -> str:
    return str((await kube.get(f"{LEASES}/{name}"))["spec"]["renewTime"])


async def test_node_registers_ready_with_labels_taint_status_and_lease(
    kube: KubeClient, node_name: str
) -> None:
    capacity = FakeCapacity(12, ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-80GB"))
    task = run_node(
        client=kube, settings=settings_for(node_name), capacity=capacity, version="v0.1.0-test"
    )
    async with running(task) as runner:
        node = await eventually(
            _get(kube, f"/api/v1/nodes/{node_name}"),
            until=lambda n: is_ready(n) and allocatable_gpus(n) == "12",
            timeout=30,
            what="virtual node Ready with 12 GPUs",
        )
        assert not runner.done()

        labels = node["metadata"]["labels"]
        assert labels["type"] == "virtual-kubelet"
        assert labels["kubernetes.io/role"] == "agent"
        assert labels["kubernetes.io/os"] == "linux"
        assert labels["kubernetes.io/arch"] == "amd64"
        assert labels["kubernetes.io/hostname"] == node_name
        assert labels["vkprovider.io/test"] == "virtual-node"
        assert OUR_TAINT in [strip_time(t) for t in taints(node)]

        status = node["status"]
        assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
        assert {"type": "Hostname", "address": node_name} in status["addresses"]
        assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10251
        assert status["capacity"][GPU] == "12"
        assert status["allocatable"]["pods"] == "1k"  # 1000, as the API server canonicalizes it
        assert status["nodeInfo"]["kubeletVersion"] == "v0.1.0-test"
        assert status["nodeInfo"]["containerRuntimeVersion"] == "vkprovider://v0.1.0-test"
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["Ready"]["reason"] == "KubeletReady"
        for name in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"):
            assert conds[name]["status"] == "False", name
        assert (
            node["metadata"]["annotations"][GPU_PRODUCTS_ANNOTATION]
            == "NVIDIA-A100-80GB,NVIDIA-H100-80GB-HBM3"
        )

        lease = await eventually(
            _get(kube, f"{LEASES}/{node_name}"),
            timeout=15,
            what="the node's Lease",
        )
        assert lease["spec"]["holderIdentity"] == node_name
        assert lease["spec"]["leaseDurationSeconds"] == 40
        assert lease["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node["metadata"]["uid"]}
        ]
        first = lease["spec"]["renewTime"]
        await eventually(
            lambda: renew_time(kube, node_name),
            until=lambda t: t > first,
            timeout=10,
            interval=0.2,
            what="renewTime advancing",
        )

    # The Lease is owned by the Node: the garbage collector removes it with the Node.
    await kube.delete(f"/api/v1/nodes/{node_name}")
    await eventually(
        _get(kube, f"{LEASES}/{node_name}"),
        until=lambda lease: not lease,
        timeout=60,
        what="the Lease garbage-collected with its Node",
    )


async def test_the_node_is_never_ready_with_zero_gpus_while_the_clouds_answer(
    kube: KubeClient, node_name: str
) -> None:
    """Regression: the Node was created Ready with 0 GPUs, and corrected only after the first
    capacity read; a reader in that window (a test, the scheduler) saw a full node."""
    inner = FakeCapacity(12)

    async def slow() -> NodeCapacity:
        await asyncio.sleep(1.0)  # a cloud's capacity call takes its time
        return await inner()

    seen: list[str | None] = []
    task = run_node(client=kube, settings=settings_for(node_name), capacity=slow,
                    version="v0.1.0-test")
    async with running(task):
        async def first_ready() -> dict[str, Any]:
            node = await _get(kube, f"/api/v1/nodes/{node_name}")()
            if node:
                seen.append(allocatable_gpus(node))
            return node

        node = await eventually(first_ready, until=is_ready, timeout=30, interval=0.02,
                                what="the node Ready")
    assert allocatable_gpus(node) == "12", f"first Ready node had {allocatable_gpus(node)} GPUs"
    assert "0" not in seen, f"the Node showed 0 GPUs before its first capacity read: {seen}"


async def test_capacity_change_is_published_after_notify_changed(
    kube: KubeClient, node_name: str
) -> None:
    capacity = FakeCapacity(12)
    agent = NodeAgent(
        client=kube, settings=settings_for(node_name), capacity=capacity, version="v1"
    )
    async with running(agent.run()):
        await eventually(
            _get(kube, f"/api/v1/nodes/{node_name}"),
            until=lambda n: allocatable_gpus(n) == "12",
            timeout=30,
            what="12 GPUs allocatable",
        )
        assert agent.node.node_uid
        calls = capacity.calls
        capacity.value = NodeCapacity(gpus=5)
        agent.node.notify_changed()
        node = await eventually(
            _get(kube, f"/api/v1/nodes/{node_name}"),
            until=lambda n: allocatable_gpus(n) == "5",
            timeout=10,
            what="5 GPUs allocatable after notify_changed()",
        )
        assert node["status"]["capacity"][GPU] == "5"
        assert capacity.calls > calls
        assert GPU_PRODUCTS_ANNOTATION not in (node["metadata"].get("annotations") or {})
        assert agent.lease.last_renewed is not None


async def test_capacity_errors_report_zero_then_keep_the_last_figure(
    kube: KubeClient, node_name: str
) -> None:
    fail = True
    calls = 0

    async def capacity() -> NodeCapacity:
        nonlocal calls
        calls += 1
        if fail:
            raise RuntimeError("cloud API unreachable")
        return NodeCapacity(gpus=7)

    settings = settings_for(node_name, status_interval_seconds=1)
    agent = NodeAgent(client=kube, settings=settings, capacity=capacity, version="v1")
    path = f"/api/v1/nodes/{node_name}"
    async with running(agent.run()) as runner:
        node = await eventually(
            _get(kube, path), until=is_ready, timeout=30, what="node Ready, capacity failing"
        )
        assert allocatable_gpus(node) == "0"  # never a made-up number
        fail = False
        agent.node.notify_changed()
        await eventually(
            _get(kube, path),
            until=lambda n: allocatable_gpus(n) == "7",
            timeout=10,
            what="7 GPUs once the cloud answers",
        )
        fail = True
        seen = calls
        agent.node.notify_changed()
        await eventually(lambda: asyncio.sleep(0, calls), until=lambda c: c > seen, timeout=5)
        beat = heartbeat(await kube.get(path))
        node = await eventually(
            _get(kube, path),
            until=lambda n: heartbeat(n) > beat,
            timeout=10,
            what="a status heartbeat after the failed read",
        )
        assert allocatable_gpus(node) == "7"
        assert is_ready(node)
        assert not runner.done()


def heartbeat(node: dict[str, Any]) -> str:
    conds = (node.get("status") or {}).get("conditions") or []
    return next(str(c["lastHeartbeatTime"]) for c in conds if c["type"] == "Ready")


async def test_taints_and_labels_of_others_survive_reregistration(
    kube: KubeClient, node_name: str
) -> None:
    settings = settings_for(node_name)
    path = f"/api/v1/nodes/{node_name}"
    async with running(
        run_node(client=kube, settings=settings, capacity=FakeCapacity(2), version="v1")
    ):
        await eventually(_get(kube, path), until=is_ready, timeout=30, what="node Ready")

    # While the provider is down, someone else replaces the taints (dropping ours) and adds a label.
    theirs = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    await kube.patch(
        path,
        [{"op": "replace", "path": "/spec/taints", "value": [theirs]}],
        patch_type="json",
    )
    await kube.patch(path, {"metadata": {"labels": {"example.com/owner": "ops"}}})
    before = await kube.get(path)
    assert OUR_TAINT not in [strip_time(t) for t in taints(before)]

    async with running(
        run_node(client=kube, settings=settings, capacity=FakeCapacity(2), version="v1")
    ):
        node = await eventually(
            _get(kube, path),
            until=lambda n: OUR_TAINT in [strip_time(t) for t in taints(n)],
            timeout=30,
            what="our taint back after re-registration",
        )
        assert theirs in [strip_time(t) for t in taints(node)]
        assert node["metadata"]["labels"]["example.com/owner"] == "ops"
        assert node["metadata"]["labels"]["type"] == "virtual-kubelet"
        assert node["metadata"]["uid"] == before["metadata"]["uid"]  # patched, not re-created


async def test_deleted_node_is_registered_again_and_the_lease_follows(
    kube: KubeClient, node_name: str
) -> None:
    settings = settings_for(node_name, status_interval_seconds=1)
    path = f"/api/v1/nodes/{node_name}"
    async with running(
        run_node(client=kube, settings=settings, capacity=FakeCapacity(3), version="v1")
    ):
        first = await eventually(_get(kube, path), until=is_ready, timeout=30, what="node Ready")
        old_uid = first["metadata"]["uid"]
        await kube.delete(path)
        node = await eventually(
            _get(kube, path),
            until=lambda n: bool(n) and n["metadata"]["uid"] != old_uid and is_ready(n),
            timeout=30,
            what="the node registered again",
        )
        assert allocatable_gpus(node) == "3"
        new_uid = node["metadata"]["uid"]
        await eventually(
            _get(kube, f"{LEASES}/{node_name}"),
            until=lambda lease: (
                [o.get("uid") for o in (lease.get("metadata") or {}).get("ownerReferences") or []]
                == [new_uid]
            ),
            timeout=60,
            what="the Lease owned by the new Node",
        )


async def test_unhealthy_provider_stops_renewing_the_lease(
    kube: KubeClient, node_name: str
) -> None:
    healthy = True
    task = run_node(
        client=kube,
        settings=settings_for(node_name),
        capacity=FakeCapacity(1),
        version="v1",
        healthy=lambda: healthy,
    )
    async with running(task):
        lease = await eventually(
            _get(kube, f"{LEASES}/{node_name}"), timeout=30, what="the node's Lease"
        )
        start = lease["spec"]["renewTime"]
        await eventually(
            lambda: renew_time(kube, node_name),
            until=lambda t: t > start,
            timeout=10,
            interval=0.2,
            what="renewTime advancing while healthy",
        )

        healthy = False
        await asyncio.sleep(1.0)  # let a renewal already in flight land
        frozen = await renew_time(kube, node_name)
        await asyncio.sleep(2.5)  # five renew periods
        assert await renew_time(kube, node_name) == frozen, "lease renewed while unhealthy"

        healthy = True
        await eventually(
            lambda: renew_time(kube, node_name),
            until=lambda t: t > frozen,
            timeout=10,
            interval=0.2,
            what="renewTime advancing again once healthy",
        )

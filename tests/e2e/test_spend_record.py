"""The spend record lives in its own Lease; an older version's record on the Node is carried over.

Against the real API server: the record survives a new recorder (a restart), and a Node that
still holds a record written by an older version is resumed from, then cleaned.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from providers.base import Instance, InstanceState
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.metrics import Metrics
from vkprovider.node.spend import (
    BLOCKS_ANNOTATION,
    SPEND_ANNOTATION,
    Counted,
    SpendRecorder,
    decode,
    encode,
    spend_lease_path,
)
from vkprovider.placement.blocks import Blocks

pytestmark = pytest.mark.cluster


# The per-test namespace stands in for the provider's namespace (vkprovider-system).
def recorder(kube: KubeClient, *, node: str, namespace: str) -> SpendRecorder:
    return SpendRecorder(client=kube, node=node, namespace=namespace, metrics=Metrics(), every=0)


def running(started: datetime) -> Instance:
    return Instance(id="i-1", name="vk-1", provider="mock", state=InstanceState.RUNNING,
                    price_per_hour=3600.0, started_at=started)  # $1 a second


async def lease_record(kube: KubeClient, *, node: str, namespace: str) -> dict[str, Counted]:
    lease = await kube.get(spend_lease_path(namespace=namespace, node=node))
    return decode(lease["metadata"]["annotations"][SPEND_ANNOTATION])


async def test_the_record_is_written_to_a_lease_and_resumed_from_it(
    kube: KubeClient, namespace: str
) -> None:
    node = f"vk-spend-{uuid.uuid4().hex[:6]}"
    t0 = datetime.now(UTC) - timedelta(seconds=100)
    first = recorder(kube, node=node, namespace=namespace)
    await first.load()
    first.book.observe(provider="mock", instances=[running(t0)], at=t0 + timedelta(seconds=10))
    await first.maybe_record()
    assert (await lease_record(kube, node=node, namespace=namespace))["mock"].dollars == 10.0
    with pytest.raises(NotFoundError):
        await kube.get(f"/api/v1/nodes/{node}")  # nothing was written to (or made of) a Node

    second = recorder(kube, node=node, namespace=namespace)  # a restart
    await second.load()
    added = second.book.observe(provider="mock", instances=[running(t0)],
                                at=t0 + timedelta(seconds=12))
    assert added == 2.0, "resumed: only the 2 s since the record, never the first 10 again"
    await second.maybe_record()
    assert (await lease_record(kube, node=node, namespace=namespace))["mock"].dollars == 12.0


async def test_an_older_versions_record_on_the_node_is_resumed_then_removed(
    kube: KubeClient, namespace: str
) -> None:
    node = f"vk-spend-{uuid.uuid4().hex[:6]}"
    t0 = datetime.now(UTC) - timedelta(seconds=100)
    legacy = encode({"mock": Counted(dollars=7.0, until=t0 + timedelta(seconds=7), open=1)})
    await kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "annotations": {SPEND_ANNOTATION: legacy}}})
    try:
        rec = recorder(kube, node=node, namespace=namespace)
        await rec.load()
        added = rec.book.observe(provider="mock", instances=[running(t0)],
                                 at=t0 + timedelta(seconds=10))
        assert added == 3.0, "counted from the Node's record on, not from the start"
        await rec.maybe_record()
        assert (await lease_record(kube, node=node, namespace=namespace))["mock"].dollars == 10.0
        annotations = (await kube.get(f"/api/v1/nodes/{node}"))["metadata"].get("annotations")
        assert SPEND_ANNOTATION not in (annotations or {}), "the old copy is gone from the Node"
    finally:
        await kube.delete(f"/api/v1/nodes/{node}")


async def test_blocked_offers_survive_a_restart(kube: KubeClient, namespace: str) -> None:
    """A restarted provider must not ask a cloud it already knows is full (issue: pod engine)."""
    node = f"vk-spend-{uuid.uuid4().hex[:6]}"
    blocks = Blocks()
    first = SpendRecorder(client=kube, node=node, namespace=namespace, metrics=Metrics(),
                          every=0, blocks=blocks)
    await first.load()
    blocks.block(provider="cloud0", region="us-east", gpu_type="H100", seconds=120,
                 reason="no capacity")
    blocks.block(provider="cloud1", region=None, gpu_type=None, seconds=0.5,
                 reason="credentials rejected")
    await first.maybe_record()
    lease = await kube.get(spend_lease_path(namespace=namespace, node=node))
    assert BLOCKS_ANNOTATION in lease["metadata"]["annotations"]
    await asyncio.sleep(1.0)  # cloud1's block expires meanwhile

    restored = Blocks()
    second = SpendRecorder(client=kube, node=node, namespace=namespace, metrics=Metrics(),
                           every=0, blocks=restored)
    await second.load()
    block = restored.blocked(provider="cloud0", region="us-east", gpu_type="H100")
    assert block is not None and block.reason == "no capacity"
    assert 100 < block.until - time.monotonic() <= 120
    assert restored.blocked(provider="cloud1", region=None, gpu_type="H100") is None, "expired"

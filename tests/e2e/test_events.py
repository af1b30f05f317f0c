"""Events against the real API server: a repeat is one object, a flood is folded, none waited on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.eventcorrelator import AGGREGATED_PREFIX, EventCorrelator
from vkprovider.kube.events import EventRecorder

pytestmark = pytest.mark.cluster


async def a_pod(kube: KubeClient, namespace: str) -> dict[str, Any]:
    return await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "subject"},
        "spec": {"containers": [{"name": "c", "image": "x:1"}]}})


async def events_of(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{namespace}/events",
                          params={"fieldSelector": "involvedObject.name=subject"})
    # ours only, not the scheduler's FailedScheduling
    return [e for e in body["items"] if e.get("reportingComponent") == "test"]


async def test_a_retry_loop_costs_one_event_object_and_few_writes(
    kube: KubeClient, namespace: str
) -> None:
    pod = await a_pod(kube, namespace)
    recorder = EventRecorder(client=kube, component="test")
    for _ in range(200):  # a reconcile retrying as fast as it can
        await recorder.emit(obj=pod, reason="NoCapacity", type_="Warning",
                            message="No provider can run 1x H100 now")
    assert await recorder.flush(timeout=30)
    [event] = await events_of(kube, namespace)
    assert event["reason"] == "NoCapacity" and event["type"] == "Warning"
    # the spam filter lets 25 through; queued repeats are merged into the writes in flight
    assert 1 < event["count"] <= 25
    assert recorder.written <= 25 and recorder.dropped == 200 - 25
    await recorder.aclose()


async def test_many_different_messages_fold_into_one_combined_event(
    kube: KubeClient, namespace: str
) -> None:
    pod = await a_pod(kube, namespace)
    recorder = EventRecorder(client=kube, component="test",
                             correlator=EventCorrelator(aggregate_after=5))
    for i in range(20):
        await recorder.emit(obj=pod, reason="InstanceFailed", type_="Warning",
                            message=f"instance mi-{i} failed")
    assert await recorder.flush(timeout=30)
    events = await events_of(kube, namespace)
    combined = [e for e in events if e["message"].startswith(AGGREGATED_PREFIX)]
    assert len(events) == 6, [e["message"] for e in events]
    [one] = combined
    assert one["count"] == 15 and one["message"].endswith("instance mi-19 failed")
    await recorder.aclose()


async def test_paced_events_all_arrive_and_repeats_join_the_queued_write(
    kube: KubeClient, namespace: str
) -> None:
    pod = await a_pod(kube, namespace)
    recorder = EventRecorder(client=kube, component="test", qps=0.5, burst=1)
    await recorder.emit(obj=pod, reason="First", message="written at once (the burst)")
    assert await recorder.flush(timeout=30)
    await recorder.emit(obj=pod, reason="Second", message="waits 2 s for its token")
    await asyncio.sleep(0.3)  # the sender is waiting for the token now, the write not sent
    assert recorder.written == 1
    for _ in range(4):
        await recorder.emit(obj=pod, reason="Second", message="waits 2 s for its token")
    assert await recorder.flush(timeout=30)
    events = {e["reason"]: e for e in await events_of(kube, namespace)}
    assert set(events) == {"First", "Second"}
    assert events["Second"]["count"] == 5, "the repeats rode on the one paced write"
    assert recorder.written == 2
    await recorder.aclose()

"""A standby replica of ``vkprovider run`` answers ``/metrics``: no target down, nothing per node.

The standby's own ASGI app (vkprovider.service.standby_app), served by the service's uvicorn
wrapper on a loopback port and asked over HTTP. A ServiceMonitor scrapes every replica; a standby
that answered 404 there was a target down for as long as it stood by (kube-prometheus-stack's
TargetDown paged on a healthy install).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from vkprovider.api.server import bind, serve
from vkprovider.metrics import LEADER, Metrics, StandbyMetrics
from vkprovider.service import standby_app

NODE = "vk-standby"


@pytest_asyncio.fixture
async def standby() -> AsyncIterator[str]:
    sock = bind(host="127.0.0.1", port=0)
    port = sock.getsockname()[1]
    task = asyncio.create_task(serve(app=standby_app(metrics=StandbyMetrics(node=NODE)),
                                     sock=sock, name="standby-test"))
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as http:
            for _ in range(100):
                with contextlib.suppress(httpx.TransportError):
                    await http.get(f"{url}/healthz")
                    break
                await asyncio.sleep(0.05)
        yield url
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_standby_serves_metrics_health_and_nothing_else(standby: str) -> None:
    async with httpx.AsyncClient() as http:
        metrics = await http.get(f"{standby}/metrics")
        health = await http.get(f"{standby}/healthz")
        other = await http.get(f"{standby}/pods")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(metrics.text)}
    (sample,) = families[LEADER].samples
    assert sample.labels == {"virtual_node": NODE} and sample.value == 0
    assert {"process_cpu_seconds", "process_resident_memory_bytes",
            "process_start_time_seconds"} <= set(families)
    per_node = sorted(n for n in families if n.startswith("vkprovider_") and n != LEADER)
    assert not per_node, f"a standby exports per-node figures it does not have: {per_node}"
    assert health.status_code == 200 and "standby" in health.text
    assert other.status_code == 404


def test_the_acting_replica_exports_the_leader_gauge_and_process_figures() -> None:
    metrics = Metrics()
    metrics.leader.labels(NODE).set(1)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    (sample,) = families[LEADER].samples
    assert sample.labels == {"virtual_node": NODE} and sample.value == 1
    assert "process_cpu_seconds" in families and "vkprovider_workqueue_depth" in families

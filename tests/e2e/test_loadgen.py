"""The load generator against the real control plane: a Service, hand-made EndpointSlices with
virtual addresses (198.18.5.x), an address map to real loopback servers started here.

It must balance over both targets, follow a slice's ready condition through the watch (no
request to an unready endpoint, none failed), and report a Service with no endpoints as a
no-endpoint window, not crash; traffic resumes when an endpoint comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import Route, publish_routes
from vkprovider.testing.loadgen import LoadGenerator
from vkprovider.testing.modelserver import ModelServer
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster

SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
A, B = "198.18.5.1", "198.18.5.2"


@pytest_asyncio.fixture
async def servers(tmp_path: Path) -> AsyncIterator[tuple[Path, dict[str, ModelServer]]]:
    """Two loopback servers behind A:8080 and B:8080 in an address map of this test."""
    amap = tmp_path / "addressmap"
    found = {A: ModelServer(identity={"instance": "inst-a"}),
             B: ModelServer(identity={"instance": "inst-b"})}
    for server in found.values():
        await server.start()
    publish_routes(directory=amap, owner="test", routes=[
        Route(host=addr, port=8080, to_host="127.0.0.1", to_port=s.port)
        for addr, s in found.items()])
    try:
        yield amap, found
    finally:
        for server in found.values():
            await server.close()


def endpoint_slice(name: str, *, service: str, managed_by: str,
                   endpoints: list[tuple[str, bool | None]]) -> dict[str, Any]:
    eps = [{"addresses": [addr], **({"conditions": {"ready": ready}} if ready is not None else {})}
           for addr, ready in endpoints]
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name,
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": managed_by}},
            "addressType": "IPv4", "endpoints": eps,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}


async def test_loadgen_follows_slices_ready_and_reports_no_endpoint_window(
    kube: KubeClient, namespace: str, servers: tuple[Path, dict[str, ModelServer]],
) -> None:
    amap, backends = servers
    slices = SLICES.format(ns=namespace)
    await kube.create(f"/api/v1/namespaces/{namespace}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})  # no selector
    # one slice as the provider would manage it, one as some other controller would
    await kube.create(slices, endpoint_slice("web-vkp", service="web",
                                             managed_by="vkprovider.io",
                                             endpoints=[(A, True)]))
    await kube.create(slices, endpoint_slice("web-other", service="web",
                                             managed_by="e2e.example.com",
                                             endpoints=[(B, None)]))

    async with LoadGenerator(kube=kube, namespace=namespace, service="web", rate=40,
                             address_map=amap, timeout=1.0, chapter="both") as lg:
        assert lg.endpoints == ((A, 8080), (B, 8080))
        await asyncio.sleep(1.5)

        await kube.patch(f"{slices}/web-other",
                         {"endpoints": [{"addresses": [B], "conditions": {"ready": False}}]})
        await eventually(lambda: _now(lg.endpoints), until=lambda e: e == ((A, 8080),),
                         timeout=10, interval=0.05, what="B dropped from the balanced set")
        lg.mark("b-unready")
        await asyncio.sleep(1.5)

        lg.mark("none")  # before the deletions: every no-endpoint failure falls in this chapter
        for name in ("web-vkp", "web-other"):
            await kube.delete(f"{slices}/{name}")
        await eventually(lambda: _now(lg.endpoints), until=lambda e: e == (),
                         timeout=10, interval=0.05, what="no endpoints seen")
        await asyncio.sleep(1.0)

        await kube.create(slices, endpoint_slice("web-back", service="web",
                                                 managed_by="vkprovider.io",
                                                 endpoints=[(B, True)]))
        await eventually(lambda: _now(lg.endpoints), until=lambda e: e == ((B, 8080),),
                         timeout=10, interval=0.05, what="B back")
        lg.mark("back")
        await asyncio.sleep(1.0)

    report = lg.report()
    print(report.as_dict() | {"failures": len(report.failures)})
    both, unready, none, back = (report.chapter(x) for x in ("both", "b-unready", "none", "back"))
    # both targets served, by the replica names their answers carry, with no failure
    assert both.failed == 0 and both.sent >= 40
    assert both.by_replica.get("inst-a", 0) >= 10 and both.by_replica.get("inst-b", 0) >= 10
    assert both.by_endpoint.keys() == {f"{A}:8080", f"{B}:8080"}
    # an unready endpoint gets no new request, and nothing fails
    assert unready.failed == 0 and unready.sent >= 40
    assert unready.by_endpoint == {f"{A}:8080": unready.sent}
    # no endpoint: every due request fails as such, the window is measured, nothing crashed
    assert none.failures_by_kind.keys() == {"no_endpoint"} and none.failed >= 30
    assert none.longest_no_endpoint == pytest.approx(report.longest_no_endpoint)
    assert 0.9 <= report.longest_no_endpoint < 5
    assert report.total_no_endpoint == pytest.approx(report.longest_no_endpoint)
    assert back.failed == 0 and back.by_replica.keys() == {"inst-b"}
    assert report.failures_by_kind.keys() == {"no_endpoint"}
    assert report.skipped == 0
    assert backends[A].counters.traffic + backends[B].counters.traffic == report.ok
    with contextlib.suppress(Exception):
        await kube.delete(f"{slices}/web-back")


async def _now(value: Any) -> Any:
    return value

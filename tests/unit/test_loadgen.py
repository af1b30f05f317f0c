"""The load generator's pure parts: endpoint selection, round-robin, report math; and the model
server it is pointed at in labs (a real loopback listener, no cluster)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.loadgen import (
    LoadGenerator,
    NoEndpointClock,
    RoundRobin,
    Tally,
    ready_endpoints,
    replica_of,
)
from vkprovider.testing.modelserver import ModelServer


def eslice(*endpoints: tuple[str, bool | None], port: int = 8080, name: str = "http",
           address_type: str = "IPv4") -> dict[str, Any]:
    eps: list[dict[str, Any]] = []
    for address, ready in endpoints:
        ep: dict[str, Any] = {"addresses": [address]}
        if ready is not None:
            ep["conditions"] = {"ready": ready}
        eps.append(ep)
    return {"addressType": address_type, "endpoints": eps,
            "ports": [{"name": name, "port": port, "protocol": "TCP"}]}


def test_ready_endpoints_nil_ready_counts_as_ready_and_false_does_not() -> None:
    s = eslice(("198.18.5.1", True), ("198.18.5.2", None), ("198.18.5.3", False))
    assert ready_endpoints([s], port_name="http") == (("198.18.5.1", 8080), ("198.18.5.2", 8080))


def test_ready_endpoints_merges_stock_and_managed_slices_by_port_name() -> None:
    stock = eslice(("10.244.0.2", True), port=8000)
    managed = eslice(("198.18.5.1", True), ("198.18.5.1", True), port=31000)
    other_port = eslice(("198.18.5.9", True), name="metrics", port=9090)
    fqdn = eslice(("a.example.com", True), address_type="FQDN")
    got = ready_endpoints([stock, managed, other_port, fqdn], port_name="http")
    assert got == (("10.244.0.2", 8000), ("198.18.5.1", 31000))
    assert ready_endpoints([other_port], port_name="metrics") == (("198.18.5.9", 9090),)


def test_ready_endpoints_unnamed_port_and_empty_slices() -> None:
    unnamed = {"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.5"]}],
               "ports": [{"port": 80}]}
    assert ready_endpoints([unnamed], port_name="") == (("10.0.0.5", 80),)
    assert ready_endpoints([unnamed], port_name="http") == ()
    assert ready_endpoints([{"addressType": "IPv4", "endpoints": None, "ports": None}],
                           port_name="") == ()


def test_round_robin_cycles_and_resumes_after_a_change() -> None:
    a, b, c = ("a", 1), ("b", 1), ("c", 1)
    rr = RoundRobin([a, b, c])
    assert [rr.pick() for _ in range(4)] == [a, b, c, a]
    rr.update([a, c])  # b left; the cycle goes on after a
    assert [rr.pick() for _ in range(3)] == [c, a, c]
    rr.update([])
    assert rr.pick() is None
    rr.update([b])
    assert [rr.pick() for _ in range(2)] == [b, b]


def test_no_endpoint_clock_windows_longest_total_and_clipping() -> None:
    clock = NoEndpointClock()
    clock.update(has_ready=True, now=0)
    clock.update(has_ready=False, now=2)
    clock.update(has_ready=False, now=3)  # no transition
    clock.update(has_ready=True, now=5)
    clock.update(has_ready=False, now=10)
    assert clock.longest(11) == 3
    assert clock.total(11) == 4
    assert clock.longest(20) == 10  # the open window grows
    assert clock.total(20, since=4, until=12) == pytest.approx(3)  # 1 s + 2 s


def test_tally_report_math_per_chapter() -> None:
    t = Tally(service="ns/web", rate=10, started=100.0)
    t.clock.update(has_ready=True, now=100.0)
    for _ in range(3):
        t.sent(chapter=0, endpoint="198.18.5.1:8080")
        t.succeeded(chapter=0, replica="i-1", latency=0.01)
    t.sent(chapter=0, endpoint="198.18.5.2:8080")
    t.failed(chapter=0, kind="http_5xx", endpoint="198.18.5.2:8080", now=100.5)
    ch = t.mark("outage", now=101.0)
    t.clock.update(has_ready=False, now=101.0)
    t.sent(chapter=ch, endpoint=None)
    t.failed(chapter=ch, kind="no_endpoint", endpoint=None, now=101.2)
    t.clock.update(has_ready=True, now=102.5)
    t.skipped += 2
    r = t.report(now=103.0)
    assert (r.sent, r.ok, r.failed, r.skipped) == (5, 3, 2, 2)
    assert r.failures_by_kind == {"http_5xx": 1, "no_endpoint": 1}
    assert r.by_endpoint == {"198.18.5.1:8080": 3, "198.18.5.2:8080": 1}
    assert r.by_replica == {"i-1": 3}
    assert r.longest_no_endpoint == pytest.approx(1.5)
    assert r.duration == pytest.approx(3.0)
    first, outage = r.chapters
    assert (first.label, first.sent, first.failed, first.end) == ("start", 4, 1, 1.0)
    assert first.total_no_endpoint == 0
    assert (outage.label, outage.sent, outage.failed) == ("outage", 1, 1)
    assert outage.longest_no_endpoint == pytest.approx(1.5)
    assert [(f.kind, f.chapter) for f in r.failures] == [("http_5xx", "start"),
                                                          ("no_endpoint", "outage")]
    assert r.failures[1].at == pytest.approx(1.2)
    assert r.latency_p50 == pytest.approx(0.01)
    d = r.as_dict()
    assert d["chapters"][1]["failures_by_kind"] == {"no_endpoint": 1}
    assert r.chapter("outage") is outage


def test_replica_of_reads_instance_then_pod() -> None:
    assert replica_of(b'{"instance": "i-7", "pod": "p"}') == "i-7"
    assert replica_of(b'{"pod": "web-1"}') == "web-1"
    assert replica_of(b"not json") is None
    assert replica_of(b"[1]") is None


async def test_model_server_loads_then_serves_and_counts_probes_apart() -> None:
    server = ModelServer(identity={"pod": "web-0", "container_port": 8000}, load_seconds=0.3)
    port = await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/live")).status_code == 200
            loading = await http.get("/")
            assert loading.status_code == 503 and loading.json()["status"] == "loading"
            probe = await http.get("/ready", headers={"User-Agent": "kube-probe/1.37"})
            assert probe.status_code == 503
            await asyncio.sleep(0.35)
            ok = await http.get("/generate?x=1")
            assert ok.status_code == 200
            assert ok.json() == {"status": "ok", "path": "/generate", "pod": "web-0",
                                 "container_port": 8000}
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # a tcpSocket probe
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.05)
        assert server.counters.as_dict() == {"traffic": 3, "traffic_5xx": 1, "probes": 2,
                                             "probes_failed": 1}
        server.restart()
        assert not server.loaded
    finally:
        await server.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_failures_are_classified_by_kind() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def slam(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.transport.abort()

    slow = await asyncio.start_server(hang, "127.0.0.1", 0)
    rude = await asyncio.start_server(slam, "127.0.0.1", 0)
    loading = ModelServer(identity={"pod": "p"}, load_seconds=60)
    await loading.start()
    closed = await asyncio.start_server(hang, "127.0.0.1", 0)
    closed_port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    lg = LoadGenerator(kube=cast(KubeClient, object()), namespace="ns", service="s", rate=10,
                       timeout=0.3)
    lg._client = httpx.AsyncClient()
    lg._tally = Tally(service="ns/s", rate=10, started=0.0)
    try:
        for port in (slow.sockets[0].getsockname()[1], rude.sockets[0].getsockname()[1],
                     loading.port, closed_port):
            await lg._one(("127.0.0.1", int(port)), 0)
        assert dict(lg._tally.chapters[0].failures) == {"timeout": 1, "reset": 1,
                                                        "http_5xx": 1, "connect": 1}
    finally:
        await lg._client.aclose()
        for s in (slow, rude):
            s.close()
        await loading.close()

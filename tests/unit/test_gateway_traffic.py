"""A policy's ``traffic`` decides which replica ports the gateway fronts, and a change re-routes.

Why it exists: ``traffic: gateway`` promises that even a cloud's published IP:port is never a
client's endpoint: the gateway fronts it (plain HTTP to that IP:port: the IP:port clouds offer no
TLS there) and the EndpointSlice holds the gateway's address, also while no route exists yet.
``auto`` and ``direct`` keep IP:port replicas direct. Changing a policy's ``traffic`` must
re-route at once (the provider re-reconciles its Services), not at the next unrelated Service
change. The routing is pure; the plain route is checked against a real HAProxy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx

from vkprovider.gateway.controller import GatewayController, GatewayInstance
from vkprovider.gateway.haproxycfg import GatewayLayout
from vkprovider.gateway.plan import EdgeTarget, Planner, server_name
from vkprovider.gateway.reconcile import Programmed, reconcile
from vkprovider.gateway.runtime import RuntimeClient
from vkprovider.gateway.wiring import traffic_watch
from vkprovider.node.endpointslices import EndpointTarget, PodRecord, build_slices
from vkprovider.testing.haproxy import HAProxyProcess
from vkprovider.testing.pki import CertificateAuthority

SERVICE = {"metadata": {"name": "web", "namespace": "ns", "uid": "svc"},
           "spec": {"selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
PUBLISHED = ("198.18.0.9", 41000)  # what an IP:port cloud publishes for container port 8080


def _router(modes: dict[str, str], *, healthy: bool = True) -> GatewayController:
    async def dial(host: str, port: int) -> tuple[str, int]:
        return host, port

    layout = GatewayLayout(bind_host="0.0.0.0", first_port=20000, count=16,
                           socket=Path("/nonexistent/rt.sock"), ca_file=Path("/nonexistent/ca"),
                           map_dir=Path("/nonexistent/maps"))
    return GatewayController(
        layout=layout, dial=dial,
        traffic_of=lambda uid: modes.get(uid, "auto"),  # type: ignore[arg-type,return-value]
        instances=[GatewayInstance(address="10.0.9.1", healthy=healthy,
                                   client=RuntimeClient(address="/nonexistent/rt.sock"))])


def _ip_pod(uid: str = "p1") -> PodRecord:
    return PodRecord(namespace="ns", name=f"pod-{uid}", uid=uid, labels=(("app", "web"),),
                     container_ports=(("main", "http", 8080, "TCP"),),
                     endpoints=(EndpointTarget(container_port=8080, protocol="TCP",
                                               host=PUBLISHED[0], port=PUBLISHED[1], kind="ip",
                                               ready=True, serving=True, terminating=False,
                                               provider="runpod"),))


def _endpoints(slices: dict[str, Any]) -> list[tuple[str, int]]:
    return [(ep["addresses"][0], body["ports"][0]["port"])
            for body in slices.values() for ep in body["endpoints"]]


def test_traffic_gateway_fronts_an_ip_port_replica_with_a_plain_route() -> None:
    router = _router({"p1": "gateway"})
    slices, unroutable = build_slices(service=SERVICE, node="vk", pods=[_ip_pod()],
                                      gateway=router)
    assert unroutable == []
    assert _endpoints(slices) == [("10.0.9.1", 20000)]  # the gateway's, never the cloud's
    route = router._routes[("p1", 8080)]
    assert (route.edge.host, route.edge.port, route.edge.tls, route.edge.auth_header) == (
        *PUBLISHED, False, None)


def test_traffic_gateway_prefers_the_clouds_tls_edge_where_it_offers_one() -> None:
    """RunPod: a public IP:port and its HTTPS proxy for the same port. Under ``gateway`` the
    gateway dials the proxy over verified TLS; under ``auto`` the IP:port stays direct."""
    ip = _ip_pod().endpoints[0]
    proxy = dataclasses.replace(ip, host="p1-8080.proxy.runpod.net", port=443, kind="hostname")
    pod = dataclasses.replace(_ip_pod(), endpoints=(ip, proxy))
    router = _router({"p1": "gateway"})
    slices, _ = build_slices(service=SERVICE, node="vk", pods=[pod], gateway=router)
    assert _endpoints(slices) == [("10.0.9.1", 20000)]
    route = router._routes[("p1", 8080)]
    assert (route.edge.host, route.edge.port, route.edge.tls) == (
        "p1-8080.proxy.runpod.net", 443, True)
    slices, _ = build_slices(service=SERVICE, node="vk", pods=[pod],
                             gateway=_router({"p1": "auto"}))
    assert _endpoints(slices) == [PUBLISHED]


def test_auto_and_direct_keep_an_ip_port_replica_direct() -> None:
    for mode in ("auto", "direct"):
        router = _router({"p1": mode})
        slices, unroutable = build_slices(service=SERVICE, node="vk", pods=[_ip_pod()],
                                          gateway=router)
        assert unroutable == [] and _endpoints(slices) == [PUBLISHED], mode
        assert router._routes == {}, mode


def test_traffic_gateway_without_a_route_publishes_nothing_and_warns_nothing() -> None:
    """No healthy gateway pod: the replica has no endpoint (never the direct one), and no
    EndpointNotRoutable warning (that one is for ``traffic: direct`` on a hostname-only cloud:
    the gateway logs its own trouble)."""
    router = _router({"p1": "gateway"}, healthy=False)
    slices, unroutable = build_slices(service=SERVICE, node="vk", pods=[_ip_pod()],
                                      gateway=router)
    assert slices == {} and unroutable == []
    hostname = dataclasses.replace(_ip_pod("p2"), endpoints=(dataclasses.replace(
        _ip_pod().endpoints[0], host="p2-8080.edge.example.com", port=443, kind="hostname"),))
    slices, unroutable = build_slices(service=SERVICE, node="vk", pods=[hostname],
                                      gateway=_router({"p2": "auto"}, healthy=False))
    assert slices == {} and unroutable == []


def test_a_changed_traffic_reroutes_at_the_next_reconcile_and_frees_the_route() -> None:
    modes = {"p1": "gateway"}
    router = _router(modes)
    slices, _ = build_slices(service=SERVICE, node="vk", pods=[_ip_pod()], gateway=router)
    assert _endpoints(slices) == [("10.0.9.1", 20000)]
    modes["p1"] = "auto"
    slices, _ = build_slices(service=SERVICE, node="vk", pods=[_ip_pod()], gateway=router)
    assert _endpoints(slices) == [PUBLISHED]
    assert router._routes == {}  # HAProxy's server for it goes at the next pass
    modes["p1"] = "gateway"
    slices, _ = build_slices(service=SERVICE, node="vk", pods=[_ip_pod()], gateway=router)
    assert [a for a, _ in _endpoints(slices)] == ["10.0.9.1"]


def test_a_policy_traffic_change_and_only_that_triggers_a_refresh() -> None:
    modes = {"a": "auto", "b": "direct"}
    refreshed: list[int] = []
    changed = traffic_watch(modes=lambda: dict(modes), refresh=lambda: refreshed.append(1))
    changed()  # the first view of the policies is the baseline
    assert refreshed == []
    changed()  # a policy changed something else (limits, moveBack): nothing to re-route
    assert refreshed == []
    modes["a"] = "gateway"
    changed()
    assert refreshed == [1]
    modes["c"] = "auto"  # a new policy that changes no pod's path (auto is the fallback)
    changed()
    assert refreshed == [1]
    del modes["b"]  # a deleted policy: its pods fall back to auto
    changed()
    assert refreshed == [1, 1]
    modes["b"] = "gateway"  # re-created under the same name with another traffic
    changed()
    assert refreshed == [1, 1, 1]


def test_a_plain_route_has_its_own_server_name() -> None:
    tls = EdgeTarget(pod_uid="a", container_port=8080, host=PUBLISHED[0], port=PUBLISHED[1],
                     dial_host="127.0.0.1", dial_port=1)
    assert server_name(tls) != server_name(dataclasses.replace(tls, tls=False))


async def test_haproxy_sends_a_plain_route_to_the_published_ip_port_keeping_host(
        tmp_path: Path) -> None:
    """A real HAProxy: the plain route reaches an HTTP server (standing for the published
    IP:port) without TLS and with the client's own ``Host``."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        seen.append(head)
        host = next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
                    if line.lower().startswith("host:"))
        body = json.dumps({"host": host}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close"
                     b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="unused-edge-ca")
    gateway = HAProxyProcess(work_dir=tmp_path / "gw", ca_file=ca.cert_path, count=2)
    await gateway.start()
    try:
        planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
        edge = EdgeTarget(pod_uid="p1", container_port=8080, host="127.0.0.1", port=port,
                          dial_host="127.0.0.1", dial_port=port, tls=False)
        routes, _ = planner.plan([edge])
        route = routes[("p1", 8080)]
        result = await reconcile(client=gateway.client, layout=gateway.layout,
                                 desired=[Programmed(route=route)])
        assert result.added == 1
        assert await gateway.client.show_map(gateway.layout.hosts_map) == {}
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            answer = await http.get(gateway.url(route.port) + "/v1/models",
                                    headers={"Host": "inference.serving.svc"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"host": "inference.serving.svc"}
        assert seen[-1].startswith("GET /v1/models HTTP/1.1")
        again = await reconcile(client=gateway.client, layout=gateway.layout,
                                desired=[Programmed(route=route)])
        assert not again.changed
    finally:
        gateway.stop()
        server.close()

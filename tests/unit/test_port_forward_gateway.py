"""Port-forward's dial to a hostname-only replica port goes through the traffic gateway.

Why it exists: such a port is published only behind the cloud's HTTPS edge, which raw TCP cannot
cross; the dial asks the real gateway controller for the replica's route (allocating it when no
Service has), waits until a pass has programmed a real HAProxy, and connects to that gateway
pod's listener (the lab's address map stands for the cluster network). The edge (a TLS server
with a test CA's certificate) must see the request with its own name as ``Host`` and the key the
gateway added. A raw published address is preferred when there is one; without a gateway, or
with ``traffic: direct``, the forward is refused by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_gateway import (
    EDGE_NAME,
    KEY,
    Edge,
    gateway_lab,  # noqa: F401 - the shared fixture "lab"
)
from test_kubelet_api_fakes import FakeCloud

from providers.base import Instance, InstanceState, PublishedPort
from vkprovider.api.portforward import GatewayDial, PortDial, PortRefused, PublishedDial
from vkprovider.api.view import Placement
from vkprovider.gateway.controller import GatewayController, GatewayInstance
from vkprovider.probing.dialing import AddressMap, Route, publish_routes
from vkprovider.testing.haproxy import HAProxyProcess
from vkprovider.testing.pki import CertificateAuthority

GATEWAY_POD = "10.0.9.1"  # the gateway pod's IP, routed by the lab's address map
EDGE = PublishedPort(container_port=8000, host=EDGE_NAME, port=443, kind="hostname",
                     scheme="https", edge_auth="Salad-Api-Key")

Lab = tuple[HAProxyProcess, Edge, CertificateAuthority]


def placement(*published: PublishedPort, uid: str = "uid-1") -> Placement:
    return Placement(uid=uid, namespace="team", pod="llm-0", provider_name="salad",
                     provider=FakeCloud(),
                     instance=Instance(id="i-1", name="llm-0", provider="salad",
                                       state=InstanceState.RUNNING, published=published))


@contextlib.asynccontextmanager
async def running(lab: Lab, tmp_path: Path, *, traffic: str = "auto"
                  ) -> AsyncIterator[tuple[GatewayController, AddressMap]]:
    """The gateway controller's loop over the lab's HAProxy, and the lab's network to it."""
    gateway, edge_server, _ = lab

    async def dial(host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", edge_server.port

    layout = gateway.layout
    controller = GatewayController(
        layout=layout, dial=dial, interval=30.0,  # long: only a change may start a pass
        instances=[GatewayInstance(address=GATEWAY_POD, client=gateway.client)],
        traffic_of=lambda _uid: traffic,  # type: ignore[arg-type,return-value]
        edge_key=lambda provider: KEY if provider == "salad" else None)
    controller.mark_synced()
    publish_routes(directory=tmp_path / "net", owner="gateway", routes=[
        Route(host=GATEWAY_POD, port=p, to_host="127.0.0.1", to_port=p)
        for p in range(layout.first_port, layout.first_port + layout.count)])
    task = asyncio.create_task(controller.run())
    try:
        yield controller, AddressMap(tmp_path / "net")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def http_get(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], path: str
                   ) -> tuple[bytes, dict[str, object]]:
    reader, writer = conn
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost:8000\r\n"
                 "Salad-Api-Key: the-callers-own\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    body = await asyncio.wait_for(reader.readexactly(length), timeout=10)
    return head.split(b"\r\n")[0], json.loads(body)


async def test_a_hostname_only_port_is_dialled_at_its_gateway_route_once_programmed(
        lab: Lab, tmp_path: Path) -> None:
    async with running(lab, tmp_path) as (controller, network):
        dial = PortDial(published=PublishedDial(dialer=network),
                        gateway=GatewayDial(gateway=controller, dialer=network))
        # no Service asked for this replica: the forward's own request allocates its route,
        # and the dial waits for the pass that programs it (the loop would sleep 30 s else)
        conn = await asyncio.wait_for(dial(placement(EDGE), 8000), timeout=20)
        status, seen = await http_get(conn, "/v1/models")
        conn[1].close()
    assert status == b"HTTP/1.1 200 OK"
    headers = seen["headers"]
    assert isinstance(headers, dict)
    assert seen["path"] == "/v1/models"
    assert headers["host"] == EDGE_NAME  # the gateway set the edge's name
    assert headers["salad-api-key"] == KEY  # the gateway's key, not the caller's copy
    assert lab[1].sni[-1] == EDGE_NAME  # verified TLS with the edge's name


async def test_a_raw_published_address_is_preferred_over_the_gateway(
        lab: Lab, tmp_path: Path) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"raw")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    raw_port = server.sockets[0].getsockname()[1]
    publish_routes(directory=tmp_path / "net", owner="cloud", routes=[
        Route(host="198.18.0.9", port=40000, to_host="127.0.0.1", to_port=raw_port)])
    raw = PublishedPort(container_port=8000, host="198.18.0.9", port=40000, kind="ip")
    try:
        async with running(lab, tmp_path) as (controller, network):
            dial = PortDial(published=PublishedDial(dialer=network),
                            gateway=GatewayDial(gateway=controller, dialer=network))
            reader, writer = await dial(placement(EDGE, raw), 8000)
            assert await asyncio.wait_for(reader.read(), timeout=10) == b"raw"
            writer.close()
            await controller.reconcile_once()
            gateway = lab[0]
            assert await gateway.client.show_map(gateway.layout.routes_map) == {}, \
                "no gateway route asked for"
    finally:
        server.close()


async def test_without_a_gateway_a_hostname_only_port_is_refused_by_name() -> None:
    dial = PortDial(published=PublishedDial(), gateway=None)
    with pytest.raises(PortRefused) as refused:
        await dial(placement(EDGE), 8000)
    assert str(refused.value) == (
        f"provider salad publishes port 8000 of pod team/llm-0 only behind its TLS proxy "
        f"({EDGE_NAME}:443); forwarding to it needs the traffic gateway (gateway: in the "
        "provider's settings, docs/traffic.md), which is not set up")


async def test_traffic_direct_keeps_the_forward_off_the_gateway(lab: Lab, tmp_path: Path) -> None:
    async with running(lab, tmp_path, traffic="direct") as (controller, network):
        dial = PortDial(published=PublishedDial(dialer=network),
                        gateway=GatewayDial(gateway=controller, dialer=network))
        with pytest.raises(PortRefused, match="traffic gateway does not serve port 8000 of "
                                              "pod team/llm-0"):
            await dial(placement(EDGE), 8000)


async def test_an_edge_name_the_address_filter_refuses_is_never_routed(
        lab: Lab, tmp_path: Path) -> None:
    inside = PublishedPort(container_port=8000, host="llm.team.svc.cluster.local", port=443,
                           kind="hostname", scheme="https")
    async with running(lab, tmp_path) as (controller, network):
        dial = GatewayDial(gateway=controller, dialer=network)
        with pytest.raises(PortRefused, match=r"llm.team.svc.cluster.local:443 refused"):
            await dial(placement(inside), 8000)
        await controller.reconcile_once()
        gateway = lab[0]
        assert await gateway.client.show_map(gateway.layout.routes_map) == {}, \
            "the refused edge got no gateway route"

"""WebSocket and gRPC through the traffic gateway to a hostname-only cloud replica (issue 38).

Real control plane, real provider process, a real HAProxy process programmed by the provider
(standing for the gateway pod at 100.64.250.1, routed by the lab's address map as kube-proxy's
DNAT would), and the mock cloud in hostname-only mode with edge API-key auth on. That edge
speaks what a real edge speaks (providers/mock/edgeproto.py): HTTP/1.1 with WebSocket upgrades
and HTTP/2 by ALPN, so the gateway talks HTTP/2 to it (it offers ``h2,http/1.1``) and relays a
WebSocket over HTTP/1.1. Through the Service's gateway endpoint (the EndpointSlice's address and
port, the address kube-proxy would send to):

* a WebSocket echo with a real client library (websocket-client) passes;
* a gRPC unary call with real grpcio (clear-text HTTP/2 with prior knowledge, as from a pod in
  the cluster) comes back echoed;
* the same requests sent straight to the edge without its key are refused (HTTP 401; for gRPC
  read as UNAUTHENTICATED), and through the gateway, which adds the key, they are not.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import websocket

from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import AddressMap
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_gateway import (
    AUTH,
    DOMAIN,
    GATEWAY_POD_IP,
    KEY,
    gateway_fronted_replica,
)
from .test_pods import list_pods

ECHO = "/lab.Echo/Say"  # any gRPC method: the mock model server echoes every unary call


def _websocket_echo(url: str, **options: Any) -> tuple[Any, ...]:
    """Open a WebSocket, echo a text and a binary message and a ping, close it cleanly."""
    ws = websocket.create_connection(url, timeout=10, **options)
    try:
        ws.send("hello over the gateway")
        text = ws.recv()
        ws.send_binary(b"\x00\x01\x02\xfe\xff")
        data = ws.recv()
        ws.ping(b"are you there")
        opcode, frame = ws.recv_data_frame(control_frame=True)
        status = ws.status
        ws.send_close(websocket.STATUS_NORMAL, b"bye")  # a clean close: the echo answers it
        closing, close = ws.recv_data_frame(control_frame=True)
    finally:
        ws.shutdown()
    return text, data, opcode, frame.data, status, closing, close.data[:2]


def _websocket_refusal(url: str, **options: Any) -> int:
    try:
        websocket.create_connection(url, timeout=10, **options).close()
    except websocket.WebSocketBadStatusException as exc:
        return int(exc.status_code)
    return 101


async def test_websocket_and_grpc_pass_through_the_gateway_and_the_edge_wants_its_key(
        kube: KubeClient, namespace: str, system: System, tmp_path: Path) -> None:
    assert system.network is not None
    async with gateway_fronted_replica(
            kube, namespace, system, tmp_path,
            what="a ready gateway endpoint for the replica") as fronted:
        cloud, ca, gateway, provider, port, _ = fronted
        address = GATEWAY_POD_IP
        [pod] = await list_pods(kube, namespace)
        instance_id = pod["metadata"]["annotations"]["vkprovider.io/instance-id"]
        lab = AddressMap(system.network)
        to_host, to_port = lab.resolve(address, port)  # the Service's endpoint, as DNATed
        edge_host = f"{instance_id.lower()}-8000.{DOMAIN}"
        edge_ip, edge_port = lab.resolve(edge_host, 443)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            await eventually(lambda: http.get(f"http://{to_host}:{to_port}/v1/models"),
                             until=lambda r: r.status_code == 200, timeout=30,
                             what="the gateway serving the replica")
        before = (await cloud.admin("GET", "/admin/traffic", headers=AUTH))[instance_id]

        # (a) a WebSocket echo through the gateway (HAProxy relays it over HTTP/1.1 to the
        # edge, which speaks h2 to the gateway for everything else)
        text, data, opcode, pong, status, closing, code = await asyncio.to_thread(
            _websocket_echo, f"ws://{to_host}:{to_port}/ws")
        assert status == 101
        assert (closing, code) == (websocket.ABNF.OPCODE_CLOSE, b"\x03\xe8")  # 1000, normal
        assert (text, data) == ("hello over the gateway", b"\x00\x01\x02\xfe\xff")
        assert (opcode, pong) == (websocket.ABNF.OPCODE_PONG, b"are you there")

        # (b) a gRPC unary call through the gateway: clear-text HTTP/2 with prior knowledge to
        # the gateway's port, TLS and h2 from the gateway to the edge, trailers back
        message = b"\x0a\x05hello" * 300  # any bytes; larger than one small frame
        async with grpc.aio.insecure_channel(f"{to_host}:{to_port}") as channel:
            reply = await channel.unary_unary(ECHO)(message, timeout=15)
        assert reply == message

        # (c) straight to the edge (verified TLS, its name as SNI and authority) without the
        # key: refused there, on HTTP/1.1, on HTTP/2, for the WebSocket and for gRPC
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        for http2 in (False, True):
            async with httpx.AsyncClient(verify=context, trust_env=False, timeout=10,
                                         http1=not http2, http2=http2) as http:
                refused = await http.get(f"https://{edge_ip}:{edge_port}/v1/models",
                                         headers={"Host": edge_host},
                                         extensions={"sni_hostname": edge_host})
            assert (refused.http_version, refused.status_code) == (
                "HTTP/2" if http2 else "HTTP/1.1", 401), refused.text
        assert await asyncio.to_thread(
            _websocket_refusal, f"wss://{edge_ip}:{edge_port}/ws", host=edge_host,
            sslopt={"ca_certs": str(ca.cert_path), "server_hostname": edge_host}) == 401
        credentials = grpc.ssl_channel_credentials(ca.cert_path.read_bytes())
        async with grpc.aio.secure_channel(
                f"{edge_ip}:{edge_port}", credentials,
                options=(("grpc.ssl_target_name_override", edge_host),
                         ("grpc.default_authority", edge_host))) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await channel.unary_unary(ECHO)(message, timeout=15)
        assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # ... and the same requests through the gateway are not
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            through = await http.get(f"http://{to_host}:{to_port}/v1/models")
        assert through.status_code == 200, through.text
        assert through.json()["instance"] == instance_id
        async with grpc.aio.insecure_channel(f"{to_host}:{to_port}") as channel:
            assert await channel.unary_unary(ECHO)(b"again", timeout=15) == b"again"

        # the container counted exactly what reached it: the WebSocket, two gRPC calls and one
        # HTTP request through the gateway; none of the refused ones
        after = (await cloud.admin("GET", "/admin/traffic", headers=AUTH))[instance_id]
        assert after["traffic"] - before["traffic"] == 4
        assert KEY not in provider.log_text()
        assert KEY not in gateway.log_path.read_text(errors="replace")

"""The asyncio-stream transport (providers/transport/asyncnet.py) under httpx, the API-server
client's retry loop and its cached bearer token. No cluster: small asyncio servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest

from providers.base import TransientError
from providers.http import RetryPolicy
from providers.transport.asyncnet import AsyncioBackend, FastTransport, fast_transport
from vkprovider.api.tls import self_signed_certificate
from vkprovider.kube.auth import BearerAuth, Credentials, configuration_token
from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import ServerError

GUARD = 10.0


@dataclass
class Server:
    """An HTTP/1.1 server that answers each request with ``answer(n)`` (n: 1-based count)."""

    answer: Callable[[int], tuple[int, dict[str, str], bytes]]
    close_after: bool = False  # close the connection after each answer
    requests: list[bytes] = field(default_factory=list)  # head + body as read
    chunks: list[int] = field(default_factory=list)  # reads that made up each request
    connections: int = 0
    headers_seen: list[dict[str, str]] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            buf = b""
            while True:
                reads = 0
                while b"\r\n\r\n" not in buf:
                    data = await reader.read(65536)
                    if not data:
                        return
                    buf += data
                    reads += 1
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    data = await reader.read(65536)
                    if not data:
                        return
                    buf += data
                    reads += 1
                body, buf = buf[:length], buf[length:]
                self.requests.append(head + b"\r\n\r\n" + body)
                self.chunks.append(reads)
                self.headers_seen.append(headers)
                status, extra, content = self.answer(len(self.requests))
                out = [f"HTTP/1.1 {status} X", f"Content-Length: {len(content)}",
                       *(f"{k}: {v}" for k, v in extra.items())]
                writer.write(("\r\n".join(out) + "\r\n\r\n").encode() + content)
                await writer.drain()
                if self.close_after:
                    break
        writer.close()


def json_ok(_: int) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, b'{"ok": true}'


def test_transport_runs_its_pool_on_the_asyncio_backend() -> None:
    # httpx offers no backend argument: FastTransport replaces the pool httpx built. An httpx
    # that renamed the attribute would leave the stock pool silently; this says so.
    transport = FastTransport()
    pool = transport._pool
    assert isinstance(pool, httpcore.AsyncConnectionPool)
    assert isinstance(pool._network_backend, AsyncioBackend)


def test_a_proxy_in_the_environment_keeps_httpx_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(fast_transport(), FastTransport)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert fast_transport() is None


async def test_keep_alive_one_write_per_request(serve: Callable[..., Any]) -> None:
    server = Server(answer=json_ok)
    port = await serve(server)
    async with asyncio.timeout(GUARD), httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", transport=FastTransport()) as http:
        for i in range(3):
            got = await http.post("/x", json={"i": i, "pad": "y" * 2000})
            assert got.status_code == 200 and got.json() == {"ok": True}
    assert server.connections == 1  # reused, no new connection per request
    assert server.chunks == [1, 1, 1]  # headers and body arrived together
    assert all(b'"pad"' in r for r in server.requests)


async def test_a_connection_the_server_closed_is_not_reused(serve: Callable[..., Any]) -> None:
    server = Server(answer=json_ok, close_after=True)
    port = await serve(server)
    async with asyncio.timeout(GUARD), httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", transport=FastTransport()) as http:
        for _ in range(3):
            assert (await http.get("/x")).status_code == 200
            await asyncio.sleep(0.05)  # the server's close reaches us while idle
    assert server.connections == 3


async def test_read_timeout_and_refused_connect_are_httpx_errors(
        serve: Callable[..., Any]) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(GUARD)

    running = await asyncio.start_server(silent, host="127.0.0.1", port=0)
    port = int(running.sockets[0].getsockname()[1])
    try:
        async with asyncio.timeout(GUARD), httpx.AsyncClient(transport=FastTransport()) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get(f"http://127.0.0.1:{port}/", timeout=httpx.Timeout(5, read=0.2))
            running.close()
            await running.wait_closed()
            with pytest.raises(httpx.ConnectError):
                await http.get(f"http://127.0.0.1:{port}/")
    finally:
        running.close()


def _tls_contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert, key = self_signed_certificate(common_name="localhost", hosts=("127.0.0.1",))
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    client = ssl.create_default_context(cafile=str(tmp_path / "c.pem"))
    return server, client


async def test_tls_verified_and_refused(serve: Callable[..., Any], tmp_path: Path) -> None:
    server_ctx, client_ctx = _tls_contexts(tmp_path)
    server = Server(answer=json_ok)
    port = await serve(server, tls=server_ctx)
    async with asyncio.timeout(GUARD):
        async with httpx.AsyncClient(transport=FastTransport(verify=client_ctx)) as http:
            for _ in range(2):
                got = await http.patch(f"https://127.0.0.1:{port}/x", json={"a": 1})
                assert got.json() == {"ok": True}
        assert server.connections == 1 and server.chunks == [1, 1]
        async with httpx.AsyncClient(transport=FastTransport(verify=True)) as http:
            with pytest.raises(httpx.ConnectError):  # not signed by a CA the system trusts
                await http.get(f"https://127.0.0.1:{port}/x")


# ---- the API-server client -------------------------------------------------------------------


class _Config:
    """Stands for kubernetes.client.Configuration: counts how often the token is asked."""

    def __init__(self) -> None:
        self.asked = 0

    def get_api_key_with_prefix(self, key: str) -> str | None:
        if key != "BearerToken":
            return None
        self.asked += 1
        return "Bearer tok-1"


async def test_kube_client_retries_5xx_honouring_retry_after(serve: Callable[..., Any]) -> None:
    def answer(n: int) -> tuple[int, dict[str, str], bytes]:
        if n < 3:
            return 503, {"Retry-After": "0", "Content-Type": "application/json"}, b'{"message":"x"}'
        return 200, {"Content-Type": "application/json"}, b'{"kind":"Pod"}'

    server = Server(answer=answer)
    port = await serve(server)
    config = _Config()
    creds = Credentials(host=f"http://127.0.0.1:{port}", ssl_context=ssl.create_default_context(),
                        token=configuration_token(config))
    async with asyncio.timeout(GUARD), KubeClient(credentials=creds, retries=4) as kube:
        assert await kube.patch("/api/v1/namespaces/a/pods/b/status", {"status": {}}) == {
            "kind": "Pod"}
        assert len(server.requests) == 3
        server.requests.clear()
        server.answer = lambda n: (503, {}, b"")
        kube._retries = 2
        with pytest.raises(ServerError):  # 2 attempts, both failed: the last error is raised
            await kube.get("/x")
    assert len(server.requests) == 2
    assert all(h.get("authorization") == "Bearer tok-1" for h in server.headers_seen)
    assert config.asked == 1  # read once, cached for the following requests


def test_bearer_token_is_read_again_after_max_age() -> None:
    config = _Config()
    now = [100.0]
    creds = Credentials(host="https://x", ssl_context=ssl.create_default_context(),
                        token=configuration_token(config))
    auth = BearerAuth(creds, max_age=5.0, clock=lambda: now[0])
    assert auth.header() == "Bearer tok-1"
    now[0] += 4.9
    assert auth.header() == "Bearer tok-1" and config.asked == 1
    now[0] += 0.2
    assert auth.header() == "Bearer tok-1" and config.asked == 2


async def test_retry_policy_retries_transient_then_raises() -> None:
    calls = 0

    async def failing() -> None:
        nonlocal calls
        calls += 1
        raise TransientError("down", provider="p")

    policy = RetryPolicy(max_attempts=3, backoff_initial=0.001, backoff_max=0.002)
    with pytest.raises(TransientError):
        await policy.call(failing)
    assert calls == 3
    calls = 0
    with pytest.raises(TransientError):
        await policy.call(failing, retry_transient=False)
    assert calls == 1


@pytest.mark.parametrize("proxy", [False, True])
async def test_kube_client_request_line_and_headers(serve: Callable[..., Any], proxy: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The direct path (no proxy) must send what the client path (a proxy in the environment,
    # here pointed nowhere and bypassed by NO_PROXY) sends.
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    if proxy:
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = Server(answer=json_ok)
    port = await serve(server)
    creds = Credentials(host=f"http://127.0.0.1:{port}", ssl_context=ssl.create_default_context(),
                        token=configuration_token(_Config()))
    async with asyncio.timeout(GUARD), KubeClient(credentials=creds) as kube:
        assert (kube._transport is None) is proxy
        await kube.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName=n1",
                                               "watch": False, "limit": 500})
        await kube.get("/metrics", params={"y": "a b"})
        await kube.patch("/api/v1/namespaces/a/pods/b/status", {"status": {"phase": "Running"}},
                         patch_type="strategic")
    lines = [r.split(b"\r\n", 1)[0].decode() for r in server.requests]
    assert lines[0] in ("GET /api/v1/pods?fieldSelector=spec.nodeName%3Dn1&watch=false&limit=500 "
                        "HTTP/1.1",
                        "GET /api/v1/pods?fieldSelector=spec.nodeName=n1&watch=false&limit=500 "
                        "HTTP/1.1")
    assert lines[1] in ("GET /metrics?y=a+b HTTP/1.1", "GET /metrics?y=a%20b HTTP/1.1")
    assert lines[2] == "PATCH /api/v1/namespaces/a/pods/b/status HTTP/1.1"
    patch = server.headers_seen[2]
    assert patch["content-type"] == "application/strategic-merge-patch+json"
    assert patch["accept"] == "application/json" and patch["user-agent"] == "vkprovider"
    assert patch["authorization"] == "Bearer tok-1"
    assert patch["host"] == f"127.0.0.1:{port}"
    assert server.requests[2].endswith(b'{"status":{"phase":"Running"}}')


@pytest.mark.parametrize("proxy", [False, True])
async def test_adapter_request_line_and_headers(serve: Callable[..., Any], proxy: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # HTTPAdapter._request: the direct path and the client path (proxy) send the same request.
    from providers.mock.client import MockProvider

    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    if proxy:
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = Server(answer=json_ok)
    port = await serve(server)
    async with asyncio.timeout(GUARD), MockProvider(
            name="m", base_url=f"http://127.0.0.1:{port}/v0", owner="node") as adapter:
        assert (adapter._transport is None) is proxy
        got = await adapter._request("POST", "/instances", what="create", params={"a": "1 2"},
                                     json_body={"name": "x"})
        assert got.json() == {"ok": True} and got.request.method == "POST"
        # no query: the lean path builds no httpx request at all, and sends the same
        got = await adapter._request("POST", "/instances", what="create",
                                     json_body={"name": "é", "n": [1, 2.5]})
        assert got.json() == {"ok": True} and got.status_code == 200
        await adapter._request("DELETE", "instances/mi-1", what="delete")
    lines = [r.split(b"\r\n", 1)[0].decode() for r in server.requests]
    assert lines == ["POST /v0/instances?a=1+2 HTTP/1.1", "POST /v0/instances HTTP/1.1",
                     "DELETE /v0/instances/mi-1 HTTP/1.1"]
    for seen in server.headers_seen[:2]:
        assert seen["content-type"] == "application/json"
        assert seen["accept"] == "application/json" and seen["host"] == f"127.0.0.1:{port}"
    assert "content-type" not in server.headers_seen[2]
    assert server.requests[0].endswith(b'{"name":"x"}')
    assert server.requests[1].endswith('{"name":"é","n":[1,2.5]}'.encode())

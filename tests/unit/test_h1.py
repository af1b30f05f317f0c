"""The lean HTTP/1.1 client (providers/transport/h1.py) against small asyncio servers on loopback
that answer with scripted bytes: framing, keep-alive, stale connections, deadlines, TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from providers.transport.h1 import (
    H1ConnectError,
    H1ConnectionLost,
    H1Pool,
    H1ProtocolError,
    H1Timeout,
)
from vkprovider.api.tls import self_signed_certificate

GUARD = 10.0
Answer = Callable[[int, bytes], list[bytes] | None]


@dataclass
class Scripted:
    """Reads each request (head + Content-Length body) and writes ``answer(n, request)``'s
    pieces one by one (None: close without answering); closes after the answer when
    ``close_after``."""

    answer: Answer
    close_after: bool = False
    close_on: set[int] = field(default_factory=set)  # close after these answers
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = await reader.read(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += await reader.read(65536)
                self.requests.append(head + b"\r\n\r\n" + buf[:length])
                buf = buf[length:]
                pieces = self.answer(len(self.requests), self.requests[-1])
                if pieces is None:
                    break
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if self.close_after or len(self.requests) in self.close_on:
                    break
        writer.close()


def ok(body: bytes = b'{"ok":true}', *extra: str) -> list[bytes]:
    head = "\r\n".join(["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra])
    return [(head + "\r\n\r\n").encode() + body]


async def test_keep_alive_reuses_one_connection_and_sends_one_request_each(
        serve: Callable[..., Any]) -> None:
    server = Scripted(answer=lambda n, _: ok(f'{{"n":{n}}}'.encode()))
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}/base/")
    async with asyncio.timeout(GUARD):
        for n in (1, 2, 3):
            resp = await pool.request("POST", "/x?a=1", headers={"Content-Type": "t/j"},
                                      body=b"{}")
            assert resp.status_code == 200 and resp.json() == {"n": n}
        await pool.aclose()
    assert server.connections == 1
    first = server.requests[0].decode()
    assert first.startswith("POST /base/x?a=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert "Content-Type: t/j\r\n" in first and "Content-Length: 2\r\n" in first
    assert first.endswith("\r\n\r\n{}")


@pytest.mark.parametrize("split", [1, 3, 1000])
async def test_chunked_answer_in_any_pieces_with_trailers(serve: Callable[..., Any],
                                                          split: int) -> None:
    wire = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: a\r\n"
            b"X-Twice: 1\r\nx-twice: 2\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: t\r\n\r\n")
    pieces = [wire[i:i + split] for i in range(0, len(wire), split)]
    server = Scripted(answer=lambda n, _: pieces if n == 1 else ok(b"second"))
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}")
    async with asyncio.timeout(GUARD):
        resp = await pool.request("GET", "/")
        assert resp.content == b"hello world"
        assert resp.headers.get("content-TYPE") == "a" and resp.headers["X-Twice"] == "1, 2"
        assert (await pool.request("GET", "/")).content == b"second"  # framing left it clean
    assert server.connections == 1


async def test_body_until_close_interim_answers_and_empty_bodies(
        serve: Callable[..., Any]) -> None:
    def answer(n: int, request: bytes) -> list[bytes]:
        if n == 1:  # a 100 Continue first, then the answer, delimited by the close
            return [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\nall of it"]
        if request.startswith(b"HEAD"):
            return [b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"]
        return [b"HTTP/1.1 204 No Content\r\n\r\n"]

    server = Scripted(answer=answer, close_on={1})
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}")
    async with asyncio.timeout(GUARD):
        resp = await pool.request("GET", "/")
        assert resp.status_code == 200 and resp.content == b"all of it"
        head = await pool.request("HEAD", "/")  # a new connection: the first was closed
        assert head.content == b"" and head.headers["content-length"] == "99"
        assert (await pool.request("DELETE", "/")).status_code == 204
    assert server.connections == 2


async def test_connection_close_answer_is_not_reused(serve: Callable[..., Any]) -> None:
    server = Scripted(answer=lambda n, _: ok(b"x", "Connection: close"))
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}")
    async with asyncio.timeout(GUARD):
        for _ in range(3):
            assert (await pool.request("GET", "/")).content == b"x"
    assert server.connections == 3


async def test_stale_connection_retried_for_get_not_for_post(serve: Callable[..., Any]) -> None:
    # The server answers, keeps the connection, then drops the next request without a byte:
    # a reused connection that died under us. GET goes again on a fresh one; POST does not.
    server = Scripted(answer=lambda n, _: None if n in (2, 4) else ok())
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}")
    async with asyncio.timeout(GUARD):
        await pool.request("GET", "/")
        assert (await pool.request("GET", "/")).status_code == 200  # n=2 dropped, n=3 answered
        assert server.connections == 2
        with pytest.raises(H1ConnectionLost):
            await pool.request("POST", "/", body=b"{}")  # n=4 dropped: not sent again
    assert len(server.requests) == 4


async def test_server_closing_an_idle_connection_is_noticed_before_reuse(
        serve: Callable[..., Any]) -> None:
    server = Scripted(answer=lambda n, _: ok())
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}")
    async with asyncio.timeout(GUARD):
        await pool.request("POST", "/", body=b"")
        server.writers[0].close()
        await asyncio.sleep(0.1)
        assert (await pool.request("POST", "/", body=b"")).status_code == 200
    assert server.connections == 2


async def test_deadline_closes_the_connection_and_raises(serve: Callable[..., Any]) -> None:
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(5)

    running = await asyncio.start_server(never, host="127.0.0.1", port=0)
    port = running.sockets[0].getsockname()[1]
    pool = H1Pool(f"http://127.0.0.1:{port}")
    try:
        async with asyncio.timeout(GUARD):
            with pytest.raises(H1Timeout):
                await pool.request("GET", "/", timeout=0.2)
        assert pool._idle == []  # the timed-out connection is not kept
    finally:
        running.close()


async def test_cancelled_request_does_not_leave_its_connection_in_the_pool(
        serve: Callable[..., Any]) -> None:
    gate = asyncio.Event()

    def answer(n: int, _: bytes) -> list[bytes]:
        gate.set()
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"]  # never completes

    server = Scripted(answer=answer)
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}")
    async with asyncio.timeout(GUARD):
        task = asyncio.create_task(pool.request("GET", "/"))
        await gate.wait()
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert pool._idle == []


async def test_bad_answers_are_protocol_errors(serve: Callable[..., Any]) -> None:
    answers = {1: [b"SPDY/3 200 OK\r\n\r\n"],
               2: [b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n"],
               3: [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]}
    server = Scripted(answer=lambda n, _: answers[n])
    port = await serve(server)
    pool = H1Pool(f"http://127.0.0.1:{port}")
    async with asyncio.timeout(GUARD):
        for _ in answers:
            with pytest.raises(H1ProtocolError):
                await pool.request("GET", "/")


async def test_refused_connect_and_bad_url() -> None:
    with pytest.raises(ValueError, match="not an http"):
        H1Pool("ftp://x")
    probe = await asyncio.start_server(lambda r, w: None, host="127.0.0.1", port=0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(H1ConnectError):
        await H1Pool(f"http://127.0.0.1:{port}").request("GET", "/")


@dataclass
class SlowServer:
    """Answers each request 200 after 20 ms, counting the requests it holds at once."""

    in_flight: int = 0
    most: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                await asyncio.sleep(0.02)
                self.in_flight -= 1
                writer.write(ok()[0])
                await writer.drain()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self.serve, host="127.0.0.1", port=0)
        try:
            yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            server.close()


async def test_max_connections_bounds_requests_in_flight() -> None:
    slow = SlowServer()
    async with slow.running() as url:
        pool = H1Pool(url, max_connections=3, max_idle=2)
        async with asyncio.timeout(GUARD):
            answers = await asyncio.gather(*(pool.request("GET", "/") for _ in range(12)))
        assert all(a.status_code == 200 for a in answers)
        assert slow.most == 3 and len(pool._idle) == 2, "at most max_idle kept"


async def test_a_burst_keeps_its_connections_and_a_quiet_pool_shrinks_back() -> None:
    async with SlowServer().running() as url:
        pool = H1Pool(url, max_connections=30, keepalive_expiry=60.0)
        try:
            async with asyncio.timeout(GUARD):
                await asyncio.gather(*(pool.request("GET", "/") for _ in range(30)))
                assert len(pool._idle) == 30, "every connection of the burst kept"
                opened = [c.transport for c in pool._idle]
                await asyncio.gather(*(pool.request("GET", "/") for _ in range(30)))
                assert {id(c.transport) for c in pool._idle} == {id(t) for t in opened}, \
                    "no connection opened again"
                for conn in pool._idle[:-1]:  # all but the newest idle for over a minute
                    conn.idle_since -= 61.0
                newest = pool._idle[-1].transport
                await pool.request("GET", "/")  # reuses the newest; the old ones go
            assert len(pool._idle) == 1 and pool._idle[0].transport is newest
            assert sum(1 for t in opened if t is not None and t.is_closing()) == 29
        finally:
            await pool.aclose()


async def test_tls_verified_and_refused(serve: Callable[..., Any], tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_pem, key_pem = self_signed_certificate(common_name="127.0.0.1", hosts=("127.0.0.1",))
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    server = Scripted(answer=lambda n, _: ok(b"secret"))
    port = await serve(server, tls=server_ctx)
    trusting = ssl.create_default_context(cafile=str(cert))
    async with asyncio.timeout(GUARD):
        pool = H1Pool(f"https://127.0.0.1:{port}", ssl_context=trusting)
        assert (await pool.request("GET", "/")).content == b"secret"
        await pool.aclose()
        with pytest.raises(H1ConnectError):  # the default trust store does not know it
            await H1Pool(f"https://127.0.0.1:{port}").request("GET", "/")

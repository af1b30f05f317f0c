"""Streamed answers on the lean HTTP/1.1 client (providers/transport/h1stream.py) against small
asyncio servers on loopback that write scripted bytes: chunk framing split anywhere, the other body
framings, lines, errors, the inactivity deadline, flow control, TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from providers.transport.h1 import H1ConnectionLost, H1Pool, H1ProtocolError, H1Timeout
from providers.transport.h1stream import MAX_PIECE, open_stream
from vkprovider.api.tls import self_signed_certificate

GUARD = 10.0
Script = Callable[[asyncio.StreamWriter], Awaitable[None]]


class Server:
    """Reads one request head per connection, then runs ``script(writer)``; records what
    each connection saw (the request, and whether the client hung up)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.client_hung_up = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            self.requests.append(await reader.readuntil(b"\r\n\r\n"))
            hangup = asyncio.create_task(self._hangup(reader))
            try:
                await self.script(writer)
            finally:
                hangup.cancel()
        writer.close()  # the script's answer ends with the connection

    async def _hangup(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            if await reader.read(1) == b"":
                self.client_hung_up.set()


@contextlib.asynccontextmanager
async def serving(script: Script, *, tls: ssl.SSLContext | None = None
                  ) -> AsyncIterator[tuple[Server, int]]:
    server = Server(script)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=tls)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, port
    finally:
        listener.close()


def chunked(*pieces: bytes, trailer: bytes = b"") -> bytes:
    head = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n")
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return head + body + b"0\r\n" + trailer + b"\r\n"


def writes(*blobs: bytes, pause: float = 0.0, then: float = 0.0) -> Script:
    async def script(writer: asyncio.StreamWriter) -> None:
        for blob in blobs:
            writer.write(blob)
            await writer.drain()
            await asyncio.sleep(pause)
        await asyncio.sleep(then)
    return script


async def read_all(port: int, *, scheme: str = "http", context: ssl.SSLContext | None = None,
                   read_timeout: float | None = None) -> tuple[int, bytes]:
    pool = H1Pool(f"{scheme}://127.0.0.1:{port}", ssl_context=context)
    async with asyncio.timeout(GUARD), open_stream(pool, "GET", "/watch?x=1",
                                                   headers={"Accept": "application/json"},
                                                   read_timeout=read_timeout) as stream:
        return stream.status_code, await stream.aread()


EVENTS = [b'{"type":"ADDED","object":{"n":%d}}\n' % i for i in range(5)]


async def test_chunked_body_arrives_whole_however_the_bytes_are_split() -> None:
    wire = chunked(*EVENTS, b"".join(EVENTS[:2]), trailer=b"X-Trailer: yes\r\n")
    expected = b"".join(EVENTS) + b"".join(EVENTS[:2])
    for cut in range(1, len(wire), 7):
        async with serving(writes(wire[:cut], wire[cut:], pause=0.001)) as (_, port):
            assert await read_all(port) == (200, expected), cut
    # and one byte at a time, chunk extensions included
    ext = wire.replace(b"\r\n%x\r\n" % len(EVENTS[1]), b"\r\n%x;name=v\r\n" % len(EVENTS[1]), 1)
    async with serving(writes(*(ext[i:i + 1] for i in range(len(ext))))) as (_, port):
        assert await read_all(port) == (200, expected)


async def test_request_names_the_host_and_target_and_the_block_end_hangs_up() -> None:
    async with serving(writes(chunked(EVENTS[0])[:-5], then=GUARD)) as (server, port):
        pool = H1Pool(f"http://127.0.0.1:{port}/base")
        async with asyncio.timeout(GUARD), open_stream(pool, "GET", "/w?watch=true") as stream:
            async for data in stream.aiter_bytes():
                assert data == EVENTS[0]
                break
        await asyncio.wait_for(server.client_hung_up.wait(), GUARD)
    request = server.requests[0].decode()
    assert request.startswith("GET /base/w?watch=true HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in request


async def test_content_length_close_delimited_and_empty_bodies() -> None:
    body = b"line one\nline two\n"
    fixed = b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    async with serving(writes(fixed[:30], fixed[30:])) as (_, port):
        assert await read_all(port) == (403, body)

    async def until_close(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart one, ")
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"part two")
        await writer.drain()
        writer.close()
    async with serving(until_close) as (_, port):
        assert await read_all(port) == (200, b"part one, part two")

    async with serving(writes(b"HTTP/1.1 204 No Content\r\n\r\n", then=GUARD)) as (_, port):
        assert await read_all(port) == (204, b"")
    empty = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    async with serving(writes(empty, then=GUARD)) as (_, port):
        assert await read_all(port) == (200, b"")


async def test_lines_are_split_across_pieces_without_their_line_ends() -> None:
    wire = chunked(b"2026-12-06 first li", b"ne\r\nsecond\nthi", b"rd, unterminated")
    async with serving(writes(wire[:60], wire[60:], pause=0.01)) as (_, port):
        pool = H1Pool(f"http://127.0.0.1:{port}")
        async with asyncio.timeout(GUARD), open_stream(pool, "GET", "/log") as stream:
            lines = [line async for line in stream.aiter_lines()]
    assert lines == ["2026-12-06 first line", "second", "third, unterminated"]


@pytest.mark.parametrize("wire, error", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n", H1ProtocolError),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX", H1ProtocolError),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 5000, H1ProtocolError),
    (b"SMTP ready\r\n\r\n", H1ProtocolError),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nhalf a ch", H1ConnectionLost),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", H1ConnectionLost),
    (b"HTTP/1.1 200 O", H1ConnectionLost),
])
async def test_broken_answers_raise_the_modules_own_errors(wire: bytes,
                                                           error: type[Exception]) -> None:
    async with serving(writes(wire)) as (_, port):
        with pytest.raises(error):
            await read_all(port)


async def test_a_silent_stream_times_out_and_a_talking_one_does_not() -> None:
    async with serving(writes(chunked(EVENTS[0])[:-5], then=GUARD)) as (_, port):
        pool = H1Pool(f"http://127.0.0.1:{port}")
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(H1Timeout, match=r"no data for 0\.3s"):
            async with asyncio.timeout(GUARD), open_stream(pool, "GET", "/w",
                                                           read_timeout=0.3) as stream:
                async for data in stream.aiter_bytes():
                    got.append(data)
        assert got == [EVENTS[0]]
        assert loop.time() - start >= 0.3

    # 12 pieces 0.1 s apart: 1.2 s in all, never 0.3 s without a byte
    pieces = [b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS * 2] + [b"0\r\n\r\n"]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with serving(writes(head, *pieces, pause=0.1)) as (_, port):
        assert await read_all(port, read_timeout=0.3) == (200, b"".join(EVENTS * 2))


async def test_no_head_within_the_head_timeout_is_a_timeout() -> None:
    async with serving(writes(b"HTTP/1.1 200", then=GUARD)) as (_, port):
        pool = H1Pool(f"http://127.0.0.1:{port}")
        with pytest.raises(H1Timeout, match=r"no head within 0\.2s"):
            async with asyncio.timeout(GUARD), open_stream(pool, "GET", "/w", head_timeout=0.2):
                pass


async def test_a_slow_reader_holds_the_socket_not_memory() -> None:
    piece = b"x" * 16 * 1024 + b"\n"
    count = 256  # 4 MiB in all
    wire = chunked(*([piece] * count))
    async with serving(writes(wire)) as (_, port):
        pool = H1Pool(f"http://127.0.0.1:{port}")
        high_water = 64 * 1024
        largest = buffered_peak = 0
        total = b""
        async with asyncio.timeout(GUARD), open_stream(pool, "GET", "/w",
                                                       high_water=high_water,
                                                       read_timeout=0.5) as stream:
            async for data in stream.aiter_bytes():
                largest = max(largest, len(data))
                buffered_peak = max(buffered_peak, stream.buffered)
                total += data
                await asyncio.sleep(0.005)  # slower than loopback
    assert total == piece * count
    # what was held unread never grew far past the high-water mark (one socket read past it),
    # and the reader got it in pieces of at most MAX_PIECE
    assert buffered_peak <= high_water + 256 * 1024, buffered_peak
    assert largest == MAX_PIECE


async def test_tls(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(common_name="127.0.0.1", hosts=("127.0.0.1",))
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "c.pem"))
    async with serving(writes(chunked(*EVENTS)), tls=server_ctx) as (_, port):
        assert await read_all(port, scheme="https", context=client_ctx) == \
            (200, b"".join(EVENTS))

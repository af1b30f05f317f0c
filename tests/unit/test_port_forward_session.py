"""The port-forward session over real loopback sockets: a SPDY client (built from the framing
module) on one side, real TCP servers as the pod's ports on the other. No cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from vkprovider.api.portforward import spdy
from vkprovider.api.portforward.session import Limits, PortForwardSession, PortRefused


class Client:
    """The API server's side of the connection (what kubectl's spdystream sends)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.out, self.inn = spdy.HeaderCodec(), spdy.HeaderCodec()

    def send(self, frame: spdy.Frame) -> None:
        self.writer.write(spdy.encode(frame, codec=self.out))

    def open_pair(self, *, error_id: int, port: int, request: str) -> None:
        """What kubectl does per local connection: error stream (half-closed), data stream."""
        self.send(spdy.SynStream(stream_id=error_id, headers={
            "streamtype": "error", "port": str(port), "requestid": request}))
        self.send(spdy.Data(stream_id=error_id, flags=spdy.FLAG_FIN))
        self.send(spdy.SynStream(stream_id=error_id + 2, headers={
            "streamtype": "data", "port": str(port), "requestid": request}))

    async def frame(self) -> spdy.Frame:
        async with asyncio.timeout(10):
            head = spdy.parse_head(await self.reader.readexactly(spdy.HEAD_SIZE))
            return spdy.decode(head, await self.reader.readexactly(head.length),
                               codec=self.inn)

    async def until(self, done: Callable[[spdy.Frame], bool]) -> list[spdy.Frame]:
        seen = []
        while True:
            seen.append(await self.frame())
            if done(seen[-1]):
                return seen


def data_of(frames: list[spdy.Frame], stream_id: int) -> bytes:
    return b"".join(f.data for f in frames if isinstance(f, spdy.Data) and
                    f.stream_id == stream_id)


def fin(stream_id: int) -> Callable[[spdy.Frame], bool]:
    return lambda f: isinstance(f, spdy.Data) and f.stream_id == stream_id and f.fin


@dataclass
class Pod:
    """The pod's ports: real loopback servers; ``ports`` maps container port -> real port."""

    ports: dict[int, int] = field(default_factory=dict)
    dialled: list[int] = field(default_factory=list)

    def check(self, port: int) -> None:
        if port not in self.ports:
            raise PortRefused(f"port {port} is not declared (declared: "
                              f"{', '.join(map(str, self.ports))})")

    async def dial(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.dialled.append(port)
        return await asyncio.open_connection("127.0.0.1", self.ports[port])


@contextlib.asynccontextmanager
async def tcp(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]
              ) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def echo_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    got = await reader.read()  # until the forwarded client half-closes
    writer.write(got.upper())
    await writer.drain()
    writer.close()


def talker(payload: bytes) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]:
    async def talk(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        await writer.drain()
        writer.close()
    return talk


@contextlib.asynccontextmanager
async def session(pod: Pod, limits: Limits | None = None) -> AsyncIterator[Client]:
    sessions: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        run = PortForwardSession(reader=reader, writer=writer, target=pod, pod="team/a",
                                 limits=limits)
        sessions.append(asyncio.current_task())  # type: ignore[arg-type]
        await run.run()

    async with tcp(serve) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            yield Client(reader, writer)
        finally:
            writer.close()
            for task in sessions:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 10)


async def test_a_pair_forwards_both_ways_then_ends_data_and_error_streams() -> None:
    async with tcp(echo_until_eof) as real:
        pod = Pod(ports={8000: real})
        async with session(pod) as client:
            client.open_pair(error_id=1, port=8000, request="0")
            client.send(spdy.Data(stream_id=3, data=b"hello "))
            client.send(spdy.Data(stream_id=3, data=b"world", flags=spdy.FLAG_FIN))
            frames = await client.until(fin(1))
    replies = [f.stream_id for f in frames if isinstance(f, spdy.SynReply)]
    assert replies == [1, 3]
    assert data_of(frames, 3) == b"HELLO WORLD"
    assert any(fin(3)(f) for f in frames), "the remote's EOF ends the data stream"
    assert data_of(frames, 1) == b"", "no error"
    updates = [(f.stream_id, f.delta) for f in frames if isinstance(f, spdy.WindowUpdate)]
    assert sum(d for s, d in updates if s == 3) == 11  # every byte written is acknowledged
    assert sum(d for s, d in updates if s == 0) == 11  # and counted for the session
    assert pod.dialled == [8000]


async def test_an_undeclared_port_is_refused_by_name_without_a_dial() -> None:
    pod = Pod(ports={8000: 1})
    async with session(pod) as client:
        client.open_pair(error_id=1, port=9999, request="7")
        frames = await client.until(fin(1))
        more = await client.until(lambda f: isinstance(f, spdy.RstStream))
    message = data_of(frames, 1).decode()
    assert message == ("error forwarding port 9999 to pod team/a: port 9999 is not declared "
                       "(declared: 8000)")
    assert more[-1] == spdy.RstStream(stream_id=3, status=spdy.RstStatus.CANCEL)
    assert pod.dialled == []


async def test_the_peers_windows_are_honoured_once_it_keeps_them() -> None:
    async with tcp(talker(b"x" * 20)) as real, session(Pod(ports={8000: real})) as client:
        client.send(spdy.Settings(entries=((0, spdy.SETTINGS_INITIAL_WINDOW_SIZE, 8),)))
        client.open_pair(error_id=1, port=8000, request="0")
        first = await client.until(lambda f: isinstance(f, spdy.Data) and f.stream_id == 3)
        assert len(first[-1].data) == 8  # type: ignore[union-attr]
        client.send(spdy.WindowUpdate(stream_id=3, delta=4))
        second = await client.until(lambda f: isinstance(f, spdy.Data) and f.stream_id == 3)
        assert len(second[-1].data) == 4  # type: ignore[union-attr]
        client.send(spdy.WindowUpdate(stream_id=3, delta=1000))
        rest = await client.until(fin(3))
    assert data_of(rest, 3) == b"x" * 8


async def test_a_peer_without_flow_control_is_not_stalled_after_the_initial_window() -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB, four initial windows
    async with tcp(talker(payload)) as real, session(Pod(ports={8000: real})) as client:
        client.open_pair(error_id=1, port=8000, request="0")
        frames = await client.until(fin(3))
    assert data_of(frames, 3) == payload
    assert max(len(f.data) for f in frames if isinstance(f, spdy.Data)) <= Limits().chunk


async def test_streams_beyond_the_limit_are_refused_and_pings_answered() -> None:
    async with session(Pod(), Limits(max_streams=2)) as client:
        client.send(spdy.SynStream(stream_id=1, headers={
            "streamtype": "error", "port": "80", "requestid": "1"}))
        client.send(spdy.SynStream(stream_id=3, headers={"streamtype": "stdin", "port": "80"}))
        client.send(spdy.SynStream(stream_id=5, headers={"streamtype": "data", "port": "0"}))
        client.send(spdy.SynStream(stream_id=7, headers={
            "streamtype": "error", "port": "80", "requestid": "7"}))
        client.send(spdy.SynStream(stream_id=9, headers={
            "streamtype": "error", "port": "80", "requestid": "9"}))
        client.send(spdy.SynStream(stream_id=4, headers={"streamtype": "data", "port": "80"}))
        client.send(spdy.Ping(ping_id=41))
        frames = await client.until(lambda f: isinstance(f, spdy.Ping))
    assert [f.stream_id for f in frames if isinstance(f, spdy.SynReply)] == [1, 7]
    resets = {f.stream_id: f.status for f in frames if isinstance(f, spdy.RstStream)}
    assert resets == {3: spdy.RstStatus.CANCEL, 5: spdy.RstStatus.CANCEL,
                      9: spdy.RstStatus.REFUSED_STREAM, 4: spdy.RstStatus.PROTOCOL_ERROR}
    assert frames[-1] == spdy.Ping(ping_id=41)


async def test_a_reset_from_the_client_drops_the_remote_connection() -> None:
    closed = asyncio.Event()

    async def holder(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hi")
        await writer.drain()
        await reader.read()  # EOF when the provider drops the connection
        closed.set()
        writer.close()

    async with tcp(holder) as real, session(Pod(ports={8000: real})) as client:
        client.open_pair(error_id=1, port=8000, request="0")
        await client.until(lambda f: isinstance(f, spdy.Data) and f.stream_id == 3)
        client.send(spdy.RstStream(stream_id=3, status=spdy.RstStatus.CANCEL))
        await asyncio.wait_for(closed.wait(), 10)
        frames = await client.until(fin(1))  # kubectl then waits for the error stream's end
    assert data_of(frames, 1) == b""


async def test_a_remote_that_closes_first_ends_both_streams_without_the_clients_fin() -> None:
    """kubectl resets the data stream only after the remote's EOF, then reads the error stream
    to its end: the error stream must end although the client never half-closed."""
    async with tcp(talker(b"bye")) as real, session(Pod(ports={8000: real})) as client:
        client.open_pair(error_id=1, port=8000, request="0")
        frames = await client.until(fin(1))
    assert data_of(frames, 3) == b"bye"
    assert any(fin(3)(f) for f in frames)


async def test_a_malformed_frame_ends_the_connection_with_goaway() -> None:
    async with session(Pod()) as client:
        client.writer.write(bytes.fromhex("80030001" "00000010") + b"\x00\x00\x00\x01" +
                            b"\x00" * 6 + b"garbage!")  # SYN_STREAM with a non-zlib block
        frames = await client.until(lambda f: isinstance(f, spdy.GoAway))
        assert await client.reader.read() == b""
    assert frames[-1] == spdy.GoAway(last_good_stream_id=0, status=1)


async def test_a_frame_larger_than_the_limit_ends_the_connection_before_it_is_read() -> None:
    async with session(Pod(), Limits(max_frame=1024)) as client:
        client.writer.write(bytes.fromhex("00000001" "00000401"))  # DATA of 1025 bytes, unsent
        frames = await client.until(lambda f: isinstance(f, spdy.GoAway))
        assert await client.reader.read() == b""
    assert frames == [spdy.GoAway(last_good_stream_id=0, status=1)]


@pytest.mark.parametrize("missing", ["error", "data"])
async def test_a_half_pair_times_out_with_a_message(missing: str) -> None:
    async with session(Pod(ports={8000: 1}), Limits(pair_timeout=0.2)) as client:
        kind = "data" if missing == "error" else "error"
        client.send(spdy.SynStream(stream_id=1, headers={
            "streamtype": kind, "port": "8000", "requestid": "3"}))
        frames = await client.until(lambda f: (fin(1)(f) or isinstance(f, spdy.RstStream)))
    if kind == "error":
        assert data_of(frames, 1).decode() == "timed out waiting for streams of request 3"
    else:
        assert frames[-1] == spdy.RstStream(stream_id=1, status=spdy.RstStatus.CANCEL)

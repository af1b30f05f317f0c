"""HTTP/2 and WebSocket at the mock cloud's hostname-only edge, from real protocol libraries.

Why it exists: a real edge in front of a cloud replica (Cloudflare in front of RunPod's proxy,
SaladCloud's container gateway) offers HTTP/2 by ALPN beside HTTP/1.1, and passes WebSocket
upgrades through. The provider's traffic gateway offers ``h2,http/1.1`` to the edge, so with
this the lab's gateway traffic goes over HTTP/2 as it would to a real edge, gRPC can pass, and a
WebSocket is relayed over HTTP/1.1. The framing is python-hyper's sans-IO :mod:`h2` and
:mod:`wsproto`, not written here; what each request gets (and its counting as a probe or
traffic) is decided once in :mod:`providers.mock.exchange`, for every protocol alike.

* :class:`H2Session`: one HTTP/2 connection; each stream is a request; the outcomes are sent as
  HTTP/2 responses (JSON, SSE streams from loop timers, late answers, the edge's 401 and 524)
  and a gRPC unary echo (``content-type: application/grpc``: the length-prefixed message back,
  then trailers ``grpc-status: 0``). Flow control is honoured: data beyond the peer's window
  waits for its WINDOW_UPDATE.
* :class:`WebSocketEcho`: after an HTTP/1.1 upgrade to :data:`~providers.mock.exchange.WS_PATH`,
  echoes text and binary messages, answers pings, and closes cleanly when asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import wsproto
import wsproto.connection
import wsproto.events
import wsproto.utilities

from providers.mock.exchange import Gone, GrpcEcho, Later, Outcome, Reply, Stream, Upgrade

__all__ = ["H2Session", "WebSocketEcho"]

log = logging.getLogger(__name__)

_MAX_BODY = 1 << 20
#: ``decide(method, target, headers, body)``: the outcome of one whole request
Decide = Callable[[bytes, bytes, list[tuple[bytes, bytes]], bytes], Outcome]


@dataclass
class _Out:
    """What a stream still has to send once the peer's flow-control window allows."""

    data: bytearray = field(default_factory=bytearray)
    end: bool = False
    trailers: list[tuple[bytes, bytes]] | None = None


@dataclass
class _In:
    headers: list[tuple[bytes, bytes]]
    body: bytearray = field(default_factory=bytearray)
    too_big: bool = False


class H2Session:
    """The server side of one HTTP/2 connection (negotiated by ALPN) on a mock edge."""

    def __init__(self, *, transport: asyncio.Transport, decide: Decide,
                 gone: Callable[[], None]) -> None:
        self._transport = transport
        self._decide = decide
        self._gone = gone
        self._conn = h2.connection.H2Connection(config=h2.config.H2Configuration(
            client_side=False, header_encoding=None))
        self._in: dict[int, _In] = {}
        self._out: dict[int, _Out] = {}
        self._open: set[int] = set()  # streams that may still be answered
        self._conn.initiate_connection()
        self._write()

    def _write(self) -> None:
        data = self._conn.data_to_send()
        if data and not self._transport.is_closing():
            self._transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._write()  # the GOAWAY h2 queued
            self._transport.close()
            return
        for event in events:
            self._handle(event)
            if self._transport.is_closing():
                return
        self._write()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            sid = event.stream_id
            self._in[sid] = _In(headers=list(event.headers or []))
            self._open.add(sid)
        elif isinstance(event, h2.events.DataReceived):
            sid = event.stream_id
            request = self._in.get(sid)
            if event.flow_controlled_length:
                self._conn.acknowledge_received_data(event.flow_controlled_length, sid)
            if request is not None:
                request.body += event.data or b""
                request.too_big = request.too_big or len(request.body) > _MAX_BODY
                if request.too_big:
                    request.body.clear()
        elif isinstance(event, h2.events.StreamEnded):
            request = self._in.pop(event.stream_id, None)
            if request is not None:
                self._request(event.stream_id, request)
        elif isinstance(event, h2.events.StreamReset):
            self._in.pop(event.stream_id, None)
            self._out.pop(event.stream_id, None)
            self._open.discard(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated):
            for sid in [event.stream_id] if event.stream_id else list(self._out):
                self._flush(sid)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._write()
            self._transport.close()

    def _request(self, sid: int, request: _In) -> None:
        headers = request.headers
        pseudo = {k: v for k, v in headers if k.startswith(b":")}
        if request.too_big:
            self._reply(sid, Reply(400, b'{"error": "bad request"}'))
            return
        outcome = self._decide(pseudo.get(b":method", b""), pseudo.get(b":path", b"/"),
                               [(k, v) for k, v in headers if not k.startswith(b":")],
                               bytes(request.body))
        if isinstance(outcome, Gone):
            self._gone()  # cuts the connection
        elif isinstance(outcome, Reply):
            self._reply(sid, outcome)
        elif isinstance(outcome, Later):
            asyncio.get_running_loop().call_later(outcome.seconds, self._late, sid,
                                                  outcome.reply)
        elif isinstance(outcome, Stream):
            self._stream(sid, outcome)
        elif isinstance(outcome, GrpcEcho):
            self._grpc(sid, outcome)
        elif isinstance(outcome, Upgrade):  # pragma: no cover - decide() never says so on h2
            self._reply(sid, Reply(400, b'{"error": "no WebSocket over HTTP/2 here"}'))

    # -- sending ----------------------------------------------------------------------------

    def _send_headers(self, sid: int, headers: list[tuple[bytes, bytes]], *,
                      end: bool = False) -> bool:
        try:
            self._conn.send_headers(sid, headers, end_stream=end)
        except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError):
            self._open.discard(sid)
            return False
        if end:
            self._open.discard(sid)
        return True

    def _queue(self, sid: int, data: bytes = b"", *, end: bool = False,
               trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        out = self._out.setdefault(sid, _Out())
        out.data += data
        out.end = out.end or end
        out.trailers = trailers if trailers is not None else out.trailers
        self._flush(sid)

    def _flush(self, sid: int) -> None:
        out = self._out.get(sid)
        if out is None:
            return
        try:
            while out.data:
                size = min(self._conn.local_flow_control_window(sid),
                           self._conn.max_outbound_frame_size)
                if size <= 0:
                    break  # the peer's window is full: the rest waits for WINDOW_UPDATE
                chunk = bytes(out.data[:size])
                del out.data[:size]
                self._conn.send_data(sid, chunk)
            if out.end and not out.data:
                del self._out[sid]
                self._open.discard(sid)
                if out.trailers is not None:
                    self._conn.send_headers(sid, out.trailers, end_stream=True)
                else:
                    self._conn.end_stream(sid)
        except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError):
            self._out.pop(sid, None)
            self._open.discard(sid)
        self._write()

    def _reply(self, sid: int, reply: Reply) -> None:
        headers = [(b":status", str(reply.status).encode()),
                   (b"content-type", b"application/json"),
                   (b"content-length", str(len(reply.payload)).encode())]
        if reply.head or not reply.payload:
            self._send_headers(sid, headers, end=True)
            self._write()
            return
        if self._send_headers(sid, headers):
            self._queue(sid, reply.payload, end=True)

    def _late(self, sid: int, reply: Reply) -> None:
        if sid in self._open and not self._transport.is_closing():
            self._reply(sid, reply)  # else the client or the container went meanwhile

    def _stream(self, sid: int, stream: Stream) -> None:
        if not self._send_headers(sid, [(b":status", b"200"),
                                        (b"content-type", b"text/event-stream"),
                                        (b"cache-control", b"no-cache")]):
            return
        self._write()
        loop = asyncio.get_running_loop()

        def send(i: int) -> None:
            if sid not in self._open or self._transport.is_closing():
                return
            last = i + 1 >= stream.events
            self._queue(sid, f"data: {stream.instance} {i}\n\n".encode(), end=last)
            if not last:
                loop.call_later(stream.every, send, i + 1)

        send(0)

    def _grpc(self, sid: int, echo: GrpcEcho) -> None:
        if not self._send_headers(sid, [(b":status", b"200"),
                                        (b"content-type", b"application/grpc")]):
            return
        trailers = [(b"grpc-status", str(echo.grpc_status).encode())]
        if echo.grpc_message:
            trailers.append((b"grpc-message", echo.grpc_message.encode()))
        self._queue(sid, echo.body, end=True, trailers=trailers)


class WebSocketEcho:
    """A WebSocket (RFC 6455) accepted after an HTTP/1.1 upgrade: echoes every message."""

    def __init__(self, *, transport: asyncio.Transport, headers: list[tuple[bytes, bytes]],
                 target: bytes, pending: bytes) -> None:
        self._transport = transport
        self._ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        self._ws.initiate_upgrade_connection(headers, target)
        self._text: list[str] = []
        self._bytes = bytearray()
        self._events()  # the handshake's Request: accepted there
        if pending:
            self.data_received(pending)

    def data_received(self, data: bytes | None) -> None:
        try:
            self._ws.receive_data(data)
        except wsproto.utilities.LocalProtocolError:
            self._transport.close()  # data after the close: nothing more to say
            return
        self._events()

    def _send(self, event: wsproto.events.Event) -> None:
        try:
            out = self._ws.send(event)
        except wsproto.utilities.LocalProtocolError:
            self._transport.close()
            return
        if not self._transport.is_closing():
            self._transport.write(out)

    def _events(self) -> None:
        for event in self._ws.events():
            if isinstance(event, wsproto.events.Request):
                self._send(wsproto.events.AcceptConnection())
            elif isinstance(event, wsproto.events.TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    text, self._text = "".join(self._text), []
                    self._send(wsproto.events.TextMessage(data=text))
            elif isinstance(event, wsproto.events.BytesMessage):
                self._bytes += event.data
                if event.message_finished:
                    data, self._bytes = bytes(self._bytes), bytearray()
                    self._send(wsproto.events.BytesMessage(data=data))
            elif isinstance(event, wsproto.events.Ping):
                self._send(event.response())
            elif isinstance(event, wsproto.events.CloseConnection):
                if self._ws.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                    self._send(event.response())
                self._transport.close()
                return

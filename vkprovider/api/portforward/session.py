"""One upgraded ``/portForward`` connection: the kubelet's port-forward protocol over SPDY/3.1.

Why it exists: after the 101, the API server (carrying kubectl's streams) opens a pair of SPDY
streams per forwarded TCP connection, each with headers ``streamtype`` (``error`` or ``data``),
``port`` and ``requestid``; the kubelet pairs them by request id, dials the port and copies bytes
both ways on the data stream. Anything that goes wrong for that connection is written as text on
its error stream, which kubectl prints ("an error occurred forwarding ..."). This module is that
server side, over any asyncio stream pair, so a unit test can drive it without TLS or a cluster.

Behaviour, and why:

* every valid stream gets a SYN_REPLY at once (kubectl's ``CreateStream`` waits for it); a stream
  with a bad ``port`` or ``streamtype`` is reset, as the kubelet's stream handler does;
* a pair is forwarded when both streams arrived (``pair_timeout`` otherwise: the error stream, if
  any, says so); the :class:`Target` refuses an undeclared port by name before any dial;
* the remote's EOF ends the data stream (FIN) and then the error stream (FIN, empty: no error);
  kubectl's FIN on the data stream half-closes the remote connection (``write_eof``); kubectl's
  RST_STREAM on the data stream drops that pair's remote connection; the error stream always
  ends (kubectl waits for its end before it closes its local connection);
* at most ``max_streams`` streams are open at once; more are refused (REFUSED_STREAM); a frame
  larger than ``max_frame`` or malformed ends the connection (GOAWAY);
* flow control: every byte taken off the connection is acknowledged with a WINDOW_UPDATE once it
  is written to the remote, per stream and for the session (SPDY/3.1), and the connection is not
  read while a stream's unwritten bytes exceed ``buffer_limit`` (TCP backpressure towards the
  API server). The peer's windows are honoured as soon as it shows it keeps them (a SETTINGS
  INITIAL_WINDOW_SIZE or a WINDOW_UPDATE): kubectl's and the API server's SPDY library
  (moby/spdystream) ignores windows and never sends WINDOW_UPDATE, so a sender that waited for
  one would stall every forward after 64 KiB; towards such a peer only TCP backpressure bounds
  what is in flight (``writer.drain()``);
* PINGs are answered; a GOAWAY stops new streams; the connection's EOF cancels every pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from vkprovider.api.portforward import spdy
from vkprovider.errors import VKError
from vkprovider.logs import kv

__all__ = ["Limits", "PortForwardSession", "PortRefused", "Target"]

log = logging.getLogger(__name__)

STREAM_TYPE, PORT, REQUEST_ID = "streamtype", "port", "requestid"


class PortRefused(VKError):
    """The pod does not forward this port, or the dial failed; the message goes to kubectl."""


class Target(Protocol):
    """The pod a session forwards to."""

    def check(self, port: int) -> None:
        """Raise :class:`PortRefused` (naming the pod and port) when ``port`` is not served."""
        ...

    def dial(self, port: int) -> Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        """A connected byte stream to ``port``; :class:`PortRefused` when it cannot be had."""
        ...


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_streams: int = 128  # open SPDY streams per connection (two per forwarded connection)
    pair_timeout: float = 30.0  # seconds for a pair's second stream to arrive (the kubelet's)
    chunk: int = 32 * 1024  # largest DATA frame sent
    buffer_limit: int = 1024 * 1024  # unwritten inbound bytes per stream before reads pause
    max_frame: int = 1024 * 1024  # largest frame read (kubectl's are 32 KiB); GOAWAY beyond


class _Stream:
    def __init__(self, *, stream_id: int, kind: str, port: int, request_id: str,
                 window: int) -> None:
        self.stream_id = stream_id
        self.kind = kind
        self.port = port
        self.request_id = request_id
        self.send_window = window
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.buffered = 0
        self.room = asyncio.Event()
        self.room.set()
        self.sent_fin = False
        self.reset = False


class _Pair:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.error: _Stream | None = None
        self.data: _Stream | None = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None


class PortForwardSession:
    """Serves one upgraded connection until either side closes it (:meth:`run`)."""

    def __init__(self, *, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 target: Target, pod: str, limits: Limits | None = None) -> None:
        self._reader = reader
        self._writer = writer
        self._target = target
        self._pod = pod  # "namespace/name", for logs
        self._limits = limits or Limits()
        self._inflate = spdy.HeaderCodec()
        self._deflate = spdy.HeaderCodec()
        self._streams: dict[int, _Stream] = {}
        self._pairs: dict[str, _Pair] = {}
        self._last_stream = 0
        self._going_away = False
        self._flow_control = False  # the peer keeps SPDY windows (see the module docstring)
        self._initial_window = spdy.INITIAL_WINDOW
        self._session_window = spdy.INITIAL_WINDOW
        self._window_grown = asyncio.Event()
        self.forwarded = 0  # pairs forwarded (for tests and logs)

    # ---- the connection ----------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                try:
                    head_bytes = await self._reader.readexactly(spdy.HEAD_SIZE)
                    head = spdy.parse_head(head_bytes)
                    if head.length > self._limits.max_frame:
                        raise spdy.FrameError(f"a frame of {head.length} bytes is larger than "
                                              f"{self._limits.max_frame}")
                    payload = await self._reader.readexactly(head.length)
                    frame = spdy.decode(head, payload, codec=self._inflate)
                except asyncio.IncompleteReadError:
                    return  # the peer closed the connection
                except spdy.FrameError as exc:
                    log.info("port-forward: malformed SPDY frame; going away",
                             extra=kv(pod=self._pod, error=str(exc)))
                    self._send(spdy.GoAway(last_good_stream_id=self._last_stream, status=1))
                    return
                await self._on_frame(frame)
        except (ConnectionError, OSError) as exc:
            log.debug("port-forward connection lost", extra=kv(pod=self._pod, error=str(exc)))
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        tasks = [p.task for p in self._pairs.values() if p.task is not None]
        for pair in self._pairs.values():
            if pair.timer is not None:
                pair.timer.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._pairs.clear()
        self._streams.clear()
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def _send(self, frame: spdy.Frame) -> None:
        if self._writer.is_closing():
            return
        self._writer.write(spdy.encode(frame, codec=self._deflate))

    async def _on_frame(self, frame: spdy.Frame) -> None:
        if isinstance(frame, spdy.Data):
            await self._on_data(frame)
        elif isinstance(frame, spdy.SynStream):
            self._on_syn_stream(frame)
        elif isinstance(frame, spdy.RstStream):
            self._on_reset(frame.stream_id)
        elif isinstance(frame, spdy.Ping):
            self._send(frame)  # we never ping, so every PING is the peer's: echo it
        elif isinstance(frame, spdy.Settings):
            window = frame.value(spdy.SETTINGS_INITIAL_WINDOW_SIZE)
            if window is not None:
                self._flow_control = True
                delta = window - self._initial_window
                self._initial_window = window
                for stream in self._streams.values():
                    stream.send_window += delta
                self._window_grown.set()
        elif isinstance(frame, spdy.WindowUpdate):
            self._flow_control = True
            if frame.stream_id == 0:
                self._session_window += frame.delta
            elif (grown := self._streams.get(frame.stream_id)) is not None:
                grown.send_window += frame.delta
            self._window_grown.set()
        elif isinstance(frame, spdy.GoAway):
            self._going_away = True
        elif isinstance(frame, spdy.HeadersFrame) and frame.flags & spdy.FLAG_FIN and \
                (s := self._streams.get(frame.stream_id)):
            s.inbound.put_nowait(None)
        # SYN_REPLY (we open no streams) and unknown control frames are ignored

    def _on_syn_stream(self, frame: spdy.SynStream) -> None:
        sid = frame.stream_id
        if sid % 2 == 0 or sid <= self._last_stream:
            self._send(spdy.RstStream(stream_id=sid, status=spdy.RstStatus.PROTOCOL_ERROR))
            return
        self._last_stream = sid
        if self._going_away or len(self._streams) >= self._limits.max_streams:
            self._send(spdy.RstStream(stream_id=sid, status=spdy.RstStatus.REFUSED_STREAM))
            return
        headers = frame.headers
        kind = headers.get(STREAM_TYPE, "").split("\0")[0]
        port_text = headers.get(PORT, "").split("\0")[0]
        if kind not in ("error", "data") or not port_text.isdigit() or \
                not 0 < int(port_text) < 65536:
            log.info("port-forward: stream refused",
                     extra=kv(pod=self._pod, stream=sid, streamtype=kind[:20],
                              port=port_text[:20]))
            self._send(spdy.RstStream(stream_id=sid, status=spdy.RstStatus.CANCEL))
            return
        request_id = headers.get(REQUEST_ID, "").split("\0")[0][:64]
        if not request_id:  # the kubelet's fallback for clients that send none
            request_id = str(sid if kind == "error" else sid - 2)
        stream = _Stream(stream_id=sid, kind=kind, port=int(port_text), request_id=request_id,
                         window=self._initial_window)
        self._streams[sid] = stream
        self._send(spdy.SynReply(stream_id=sid))
        if frame.flags & spdy.FLAG_FIN:
            stream.inbound.put_nowait(None)
        pair = self._pairs.get(request_id)
        if pair is None:
            pair = self._pairs[request_id] = _Pair(request_id)
            pair.timer = asyncio.get_running_loop().call_later(
                self._limits.pair_timeout, self._pair_timed_out, request_id)
        if getattr(pair, kind) is not None:
            self._fail_stream(stream, f"error processing stream for request {request_id}: "
                                      f"{kind} stream already assigned")
            return
        setattr(pair, kind, stream)
        if pair.error is not None and pair.data is not None:
            if pair.timer is not None:
                pair.timer.cancel()
                pair.timer = None
            pair.task = asyncio.create_task(self._forward(pair),
                                            name=f"port-forward {self._pod} {request_id}")

    def _pair_timed_out(self, request_id: str) -> None:
        pair = self._pairs.get(request_id)
        if pair is None or pair.task is not None:
            return
        for stream in (pair.error, pair.data):
            if stream is not None:
                self._fail_stream(stream, f"timed out waiting for streams of request "
                                          f"{request_id}")
        self._pairs.pop(request_id, None)

    def _fail_stream(self, stream: _Stream, message: str) -> None:
        if stream.kind == "error":
            self._send(spdy.Data(stream_id=stream.stream_id, data=message.encode(),
                                 flags=spdy.FLAG_FIN))
            stream.sent_fin = True
        else:
            self._send(spdy.RstStream(stream_id=stream.stream_id,
                                      status=spdy.RstStatus.CANCEL))
            stream.reset = True
        stream.room.set()  # the frame loop may be waiting for this stream's buffer to drain
        self._streams.pop(stream.stream_id, None)

    def _on_reset(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        stream.reset = True
        stream.inbound.put_nowait(None)
        stream.room.set()
        self._window_grown.set()
        pair = self._pairs.get(stream.request_id)
        if pair is not None and pair.task is not None and stream.kind == "data":
            pair.task.cancel()  # the client dropped the connection: drop the remote one

    async def _on_data(self, frame: spdy.Data) -> None:
        stream = self._streams.get(frame.stream_id)
        if stream is None:
            if frame.data:  # acknowledge what the session window counted anyway
                self._send(spdy.WindowUpdate(stream_id=0, delta=len(frame.data)))
            return
        if frame.data:
            if stream.kind == "error":  # nothing is read from error streams: acknowledge
                self._acknowledge(stream, len(frame.data))
            else:
                stream.buffered += len(frame.data)
                stream.inbound.put_nowait(frame.data)
                if stream.buffered > self._limits.buffer_limit:
                    stream.room.clear()
                    await stream.room.wait()  # backpressure: stop reading the connection
        if frame.fin:
            stream.inbound.put_nowait(None)

    def _acknowledge(self, stream: _Stream, size: int) -> None:
        self._send(spdy.WindowUpdate(stream_id=0, delta=size))
        if not stream.reset:
            self._send(spdy.WindowUpdate(stream_id=stream.stream_id, delta=size))

    # ---- one forwarded connection ------------------------------------------------------------

    async def _forward(self, pair: _Pair) -> None:
        assert pair.error is not None and pair.data is not None
        error, data = pair.error, pair.data
        port = data.port
        remote: asyncio.StreamWriter | None = None
        try:
            try:
                self._target.check(port)
                remote_reader, remote = await self._target.dial(port)
            except PortRefused as exc:
                log.info("port-forward refused",
                         extra=kv(pod=self._pod, port=port, request=pair.request_id,
                                  reason=str(exc)))
                self._fail_stream(error, f"error forwarding port {port} to pod {self._pod}: "
                                         f"{exc}")
                self._fail_stream(data, "")
                return
            self.forwarded += 1
            log.info("port-forward connection opened",
                     extra=kv(pod=self._pod, port=port, request=pair.request_id))
            upload = asyncio.create_task(self._upload(data, remote))
            try:
                await self._download(data, remote_reader)
                self._end_errors(error)  # the remote is done: kubectl now waits for this end
                await upload  # until the client half-closes or resets the data stream
            finally:
                upload.cancel()
                with contextlib.suppress(BaseException):
                    await upload
        except (ConnectionError, OSError) as exc:
            if not error.sent_fin and not error.reset:
                self._fail_stream(error, f"error forwarding port {port} to pod {self._pod}: "
                                         f"{exc.__class__.__name__}: {exc}")
        finally:
            # kubectl reads the error stream to its end after every forwarded connection, also
            # after it reset the data stream: it must always end, even when cancelled
            self._end_errors(error)
            data.room.set()
            if remote is not None:
                remote.close()
                with contextlib.suppress(Exception):
                    await remote.wait_closed()
            self._streams.pop(error.stream_id, None)
            self._streams.pop(data.stream_id, None)
            self._pairs.pop(pair.request_id, None)
            log.debug("port-forward connection closed",
                      extra=kv(pod=self._pod, port=port, request=pair.request_id))

    def _end_errors(self, error: _Stream) -> None:
        """End the error stream without an error (once)."""
        if not error.sent_fin and not error.reset:
            self._send(spdy.Data(stream_id=error.stream_id, flags=spdy.FLAG_FIN))
            error.sent_fin = True

    async def _upload(self, data: _Stream, remote: asyncio.StreamWriter) -> None:
        """kubectl -> remote; the client's FIN half-closes the remote connection."""
        while True:
            chunk = await data.inbound.get()
            if chunk is None:
                if not data.reset and remote.can_write_eof():
                    with contextlib.suppress(OSError):
                        remote.write_eof()
                return
            remote.write(chunk)
            await remote.drain()
            data.buffered -= len(chunk)
            if data.buffered <= self._limits.buffer_limit:
                data.room.set()
            self._acknowledge(data, len(chunk))

    async def _download(self, data: _Stream, remote: asyncio.StreamReader) -> None:
        """remote -> kubectl, within the peer's windows when it keeps them; FIN at EOF."""
        while not data.reset:
            size = self._limits.chunk
            if self._flow_control:
                while min(data.send_window, self._session_window) <= 0 and not data.reset:
                    self._window_grown.clear()
                    await self._window_grown.wait()
                size = min(size, data.send_window, self._session_window)
            chunk = await remote.read(size)
            if data.reset:
                return
            if not chunk:
                self._send(spdy.Data(stream_id=data.stream_id, flags=spdy.FLAG_FIN))
                data.sent_fin = True
                return
            data.send_window -= len(chunk)
            self._session_window -= len(chunk)
            self._send(spdy.Data(stream_id=data.stream_id, data=chunk))
            await self._writer.drain()

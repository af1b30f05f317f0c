"""A streamed HTTP/1.1 answer on the lean client: watches and followed logs.

Why it exists: a pod watch delivers every change of every pod on the node, one chunk per event
(4-5 events per pod in a burst). Read through httpx, each chunk climbed httpcore's stream, h11's
chunked reader and state machine and anyio-style stream reads before the informer saw a byte:
a dozen Python frames per event, on the busiest path a burst has. Here the connection is an
:class:`asyncio.Protocol`: chunk framing is undone as bytes arrive, inside the event loop's
callback, and the reading task wakes once for everything that arrived since it last looked
(under load, many events per wake).

What it does:

* one dedicated connection per stream (:meth:`providers.transport.h1.H1Pool.connect`), never
  returned to a pool, closed when the stream's ``async with`` ends, however it ends;
* bodies framed by chunks, by ``Content-Length`` or by the connection's end;
* flow control: past ``high_water`` unread bytes the socket stops being read until the reader
  catches up, so a slow consumer holds memory bounded;
* an inactivity deadline (``read_timeout``): a stream silent that long fails with
  :class:`~providers.transport.h1.H1Timeout`, checked by one timer per deadline, not one per read;
* the head (status line and headers) bounded by ``head_timeout``.

Errors are :mod:`providers.transport.h1`'s own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import cast

from providers.transport.h1 import (
    H1ConnectionLost,
    H1Error,
    H1Pool,
    H1ProtocolError,
    H1Timeout,
    Head,
    Headers,
    parse_head,
)

__all__ = ["MAX_PIECE", "H1Stream", "open_stream"]

#: Most body bytes handed to the reader at once (about 15 pod watch events).
MAX_PIECE = 64 * 1024
#: Longest chunk-size line accepted (hex digits and extensions).
_MAX_SIZE_LINE = 4096


class _StreamProtocol(asyncio.Protocol):
    """One connection carrying one streamed answer."""

    def __init__(self, *, read_timeout: float | None, high_water: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.head: Head | None = None
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()   # raw bytes not yet framed
        self.body = bytearray()  # body bytes not yet read
        self._mode = ""
        self._remaining = 0       # bytes left in this chunk (or in a Content-Length body)
        self._chunk_crlf = False  # a chunk's data is in, its CRLF not yet
        self._ended = False       # the whole body is in
        self._error: H1Error | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._high_water = high_water
        self._read_timeout = read_timeout
        self._last_data = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; uvloop's TLS transport is not an asyncio.Transport subclass
        self.transport = cast(asyncio.Transport, transport)
        if self._read_timeout is not None:
            self._timer = self._loop.call_later(self._read_timeout, self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._last_data = self._loop.time()
        if self._ended or self._error is not None:
            return
        self._buf += data
        try:
            self._frame()
        except H1ProtocolError as exc:
            self._fail(exc)
            return
        if self.body or self._ended or (self.head is not None and self._mode == "none"):
            self._wake()
        if len(self.body) > self._high_water and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        if self.head is not None and self._mode == "close":
            self._ended = True
            self._wake()
        else:
            self._fail(H1ConnectionLost("the server closed the connection mid-answer"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.head is not None and self._mode == "close":
            self._ended = True
            self._wake()
            return
        if not self._ended:
            self._fail(H1ConnectionLost(f"connection lost: {exc}" if exc else
                                        "connection closed mid-answer"))

    # -- framing -----------------------------------------------------------------------------

    def _frame(self) -> None:
        if self.head is None:
            while True:
                head = parse_head(self._buf)
                if head is None:
                    return
                if head.status >= 200:
                    break
            self.head = head
            self._mode = head.mode
            self._remaining = head.length
            if self._mode == "length" and self._remaining == 0:
                self._mode = "none"
        if self._mode == "none":
            self._ended = True
        elif self._mode == "chunked":
            self._unchunk()
        elif self._mode == "length":
            take = self._buf[:self._remaining]
            self.body += take
            self._remaining -= len(take)
            del self._buf[:len(take)]
            if self._remaining == 0:
                self._ended = True
        else:  # "close": everything until the connection ends
            self.body += self._buf
            self._buf.clear()

    def _unchunk(self) -> None:
        buf = self._buf
        while buf:
            if self._remaining:
                if self._remaining >= len(buf):
                    self.body += buf
                    self._remaining -= len(buf)
                    buf.clear()
                    self._chunk_crlf = self._remaining == 0
                    return
                self.body += buf[:self._remaining]
                del buf[:self._remaining]
                self._remaining = 0
                self._chunk_crlf = True
            if self._chunk_crlf:
                if len(buf) < 2:
                    return
                if buf[0] != 13 or buf[1] != 10:
                    raise H1ProtocolError("chunk data not followed by CRLF")
                del buf[:2]
                self._chunk_crlf = False
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                if len(buf) > _MAX_SIZE_LINE:
                    raise H1ProtocolError("chunk size line too long")
                return
            size_text = bytes(buf[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise H1ProtocolError(f"bad chunk size {size_text[:20]!r}") from exc
            if size == 0:  # the last chunk; trailers (ignored) up to an empty line
                self._ended = buf[line_end + 2:line_end + 4] == b"\r\n" \
                    or buf.find(b"\r\n\r\n", line_end) >= 0
                return
            del buf[:line_end + 2]
            self._remaining = size

    # -- the reader's side -------------------------------------------------------------------

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: H1Error) -> None:
        if self._error is None:
            self._error = exc
        self._cancel_timer()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def _check_idle(self) -> None:
        assert self._read_timeout is not None
        idle = self._loop.time() - self._last_data
        if self._paused or idle < self._read_timeout:  # paused: the reader is the slow one
            self._timer = self._loop.call_later(self._read_timeout - idle if not self._paused
                                                else self._read_timeout, self._check_idle)
            return
        self._timer = None
        self._fail(H1Timeout(f"no data for {self._read_timeout:g}s"))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def wait_head(self) -> Head:
        while self.head is None:
            await self._wait()
        return self.head

    async def read(self) -> bytes | None:
        """The body bytes that arrived since the last call, at most :data:`MAX_PIECE` (waiting
        for some); None at the end. The cap keeps what a reader handles between two awaits
        small: a burst must not make one watch hold the event loop."""
        while True:
            if self.body:
                if len(self.body) <= MAX_PIECE:
                    data = bytes(self.body)
                    self.body.clear()
                else:
                    data = bytes(self.body[:MAX_PIECE])
                    del self.body[:MAX_PIECE]
                if self._paused and len(self.body) <= self._high_water // 2 \
                        and self.transport is not None:
                    self._paused = False
                    self._last_data = self._loop.time()
                    self.transport.resume_reading()
                return data
            if self._ended:
                return None
            await self._wait()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self._cancel_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class H1Stream:
    """A streamed answer: ``status_code``, ``headers``, then its body as it arrives."""

    def __init__(self, protocol: _StreamProtocol, head: Head) -> None:
        self._protocol = protocol
        self.status_code = head.status
        self.headers: Headers = head.headers

    @property
    def buffered(self) -> int:
        """Body bytes arrived and not yet read."""
        return len(self._protocol.body)

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body in pieces: each piece is all that arrived since the previous one."""
        while True:
            data = await self._protocol.read()
            if data is None:
                return
            yield data

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines (UTF-8), without their line ends."""
        pending = b""
        async for data in self.aiter_bytes():
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if pending:
            yield pending.decode("utf-8", errors="replace")

    async def aread(self) -> bytes:
        """The rest of the body, whole."""
        pieces = [data async for data in self.aiter_bytes()]
        return b"".join(pieces)


@contextlib.asynccontextmanager
async def open_stream(pool: H1Pool, method: str, target: str, *,
                      headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                      head_timeout: float = 30.0, read_timeout: float | None = None,
                      high_water: int = 4 * 1024 * 1024) -> AsyncIterator[H1Stream]:
    """Send ``method target`` on a new connection to ``pool``'s origin and yield the answer
    once its head is in (any status). The connection closes when the block ends."""
    protocol = await pool.connect(
        lambda: _StreamProtocol(read_timeout=read_timeout, high_water=high_water))
    try:
        assert protocol.transport is not None
        protocol.transport.write(pool.encode(method, target, headers=headers))
        try:
            async with asyncio.timeout(head_timeout):
                head = await protocol.wait_head()
        except TimeoutError as exc:
            raise H1Timeout(f"{method} answered no head within {head_timeout:g}s") from exc
        yield H1Stream(protocol, head)
    finally:
        protocol.close()

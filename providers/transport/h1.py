"""A lean HTTP/1.1 client for whole (not streamed) requests: the provider's hot request path.

Why it exists: CPU per request is what limits a provider in a burst (bench/burst.py), and a pod's
lifecycle is a handful of single requests (a cloud create and delete, a pod status patch, an
Event). With httpx, even on plain asyncio streams (providers/transport/asyncnet.py), most of a
request's Python time went to httpcore's pool bookkeeping, h11's state machine and building httpx's
request and response objects: work a keep-alive HTTP/1.1 exchange of a small JSON body does
not need. Here one connection is an :class:`asyncio.Protocol`: the request leaves in one write,
the response is parsed as it arrives (status line, headers, then ``Content-Length``, chunked or
until close), and the awaiting task wakes once, when it is whole.

What it does and does not do:

* a pool per origin (scheme, host, port) with at most ``max_connections`` connections, reused
  last-in first-out, all of them kept idle unless ``max_idle`` says fewer, each dropped once it
  has been idle ``keepalive_expiry`` seconds (the oldest are checked whenever one comes back), or
  when the server closed it (the event loop tells the protocol at once), or answered
  ``Connection: close``. A burst keeps the connections it opened warm: with 25 kept (client-go's
  figure, made for HTTP/2), 64 workers re-opened the rest on every request and TLS handshakes took
  4% of a 3,000-pod burst's CPU. A quiet pool shrinks back within ``keepalive_expiry`` (a TLS
  connection holds ~128 KiB of buffers);
* TLS through the event loop with the caller's :class:`ssl.SSLContext` (client certificates
  included), the handshake bounded by the connect timeout;
* one deadline per request (connect, write and read together); a request cancelled or timed out
  mid-exchange closes its connection (its answer could still arrive on it);
* a connection found closed by the server before any byte of the answer is retried once on a
  fresh connection when it was a reused one and the method is idempotent, as Go's ``net/http``
  does; anything else is raised, and the callers' own retry rules apply;
* no proxies (callers keep httpx when the environment names one), no redirects, no
  compression (it never asks for any), no HTTP/2. Streamed answers (watches, followed logs)
  are :mod:`providers.transport.h1stream`'s, on connections of their own from
  :meth:`H1Pool.connect`.

Errors are this module's own: :class:`H1ConnectError`, :class:`H1Timeout`,
:class:`H1ConnectionLost` and :class:`H1ProtocolError`, all :class:`H1Error`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import orjson

__all__ = ["H1ConnectError", "H1ConnectionLost", "H1Error", "H1Pool", "H1ProtocolError",
           "H1Response", "H1Timeout", "Head", "Headers", "parse_head"]

_P = TypeVar("_P", bound=asyncio.Protocol)
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
#: Longest status line + headers accepted.
_MAX_HEAD = 64 * 1024


class H1Error(Exception):
    """A request did not get a whole HTTP answer."""


class H1ConnectError(H1Error):
    """No connection (or no TLS session) could be made."""


class H1Timeout(H1Error):
    """The request's deadline passed."""


class H1ConnectionLost(H1Error):
    """The server closed the connection before the answer was whole."""


class H1ProtocolError(H1Error):
    """The server's answer is not HTTP/1.1 we understand."""


class Headers(dict[str, str]):
    """Response headers, names lower-cased; :meth:`get` takes any case. Repeated headers are
    joined with ``", "`` (RFC 9110 5.3)."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)


class H1Response:
    """A whole answer: ``status_code``, ``headers``, ``content``."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, *, status_code: int, headers: Headers, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.content)

    def __repr__(self) -> str:
        return f"H1Response(status_code={self.status_code}, {len(self.content)} bytes)"


class Head:
    """A parsed status line and headers, and how the body that follows is framed."""

    __slots__ = ("headers", "keep_alive", "length", "mode", "status")

    def __init__(self, *, status: int, headers: Headers, keep_alive: bool, mode: str,
                 length: int) -> None:
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        self.mode = mode  # "length", "chunked", "close", "none"
        self.length = length


def parse_head(buf: bytearray, *, head_request: bool = False) -> Head | None:
    """Take a response's status line and headers off the front of ``buf``; None while they are
    not all in. An interim (1xx) answer comes back as a :class:`Head` with its status; the
    caller reads on. Raises :class:`H1ProtocolError` on what is not HTTP/1.x."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > _MAX_HEAD:
            raise H1ProtocolError("response head too long")
        return None
    text = bytes(buf[:end]).decode("latin-1")
    del buf[:end + 4]
    lines = text.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise H1ProtocolError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    headers = Headers()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise H1ProtocolError(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{dict.__getitem__(headers, key)}, {value}" \
            if dict.__contains__(headers, key) else value
    connection = dict.get(headers, "connection", "").lower()
    keep_alive = parts[0] == "HTTP/1.1" and "close" not in connection
    encoding = dict.get(headers, "transfer-encoding", "").lower()
    length = dict.get(headers, "content-length")
    remaining = 0
    if 100 <= status < 200 or head_request or status in (204, 304):
        mode = "none"
    elif "chunked" in encoding:
        mode = "chunked"
    elif length is not None:
        try:
            remaining = int(length)
        except ValueError as exc:
            raise H1ProtocolError(f"bad Content-Length {length[:20]!r}") from exc
        if remaining < 0:
            raise H1ProtocolError("negative Content-Length")
        mode = "length"
    else:
        mode = "close"
        keep_alive = False
    return Head(status=status, headers=headers, keep_alive=keep_alive, mode=mode,
                length=remaining)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses one answer at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self._buf = bytearray()
        self._waiter: asyncio.Future[H1Response] | None = None
        self._head_request = False
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._headers: Headers | None = None
        self._keep_alive = True
        self._mode = ""  # "length", "chunked", "close", "none"
        self._remaining = 0
        self._chunks: list[bytes] = []
        self._got_bytes = False

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; uvloop's TLS transport is not an asyncio.Transport subclass
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes on an idle connection: nothing good; drop it
            self.close()
            return
        self._got_bytes = True
        self._buf += data
        try:
            self._parse()
        except H1ProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        if self._waiter is not None and self._mode == "close" and self._headers is not None:
            self._finish(bytes(self._buf))
            self._buf.clear()
        self.closed = True
        self._fail(H1ConnectionLost("the server closed the connection"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(H1ConnectionLost(f"connection lost: {exc}" if exc else "connection closed"))

    # -- one exchange ------------------------------------------------------------------------

    def send(self, payload: bytes, *, head: bool) -> asyncio.Future[H1Response]:
        assert self.transport is not None
        self._reset()
        self._head_request = head
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self._waiter

    @property
    def got_bytes(self) -> bool:
        return self._got_bytes

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and \
            not self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: H1Error) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if not self.closed:
            self.close()

    def _finish(self, body: bytes) -> None:
        waiter, self._waiter = self._waiter, None
        assert self._headers is not None
        if not self._keep_alive or self._buf:  # closing, or bytes beyond the answer
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(H1Response(status_code=self._status, headers=self._headers,
                                         content=body))

    def _parse(self) -> None:
        while self._waiter is not None:
            if self._headers is None:
                if not self._parse_head():
                    return
                continue
            if self._mode == "length":
                if len(self._buf) < self._remaining:
                    return
                body = bytes(self._buf[:self._remaining])
                del self._buf[:self._remaining]
                self._finish(body)
            elif self._mode == "none":
                self._finish(b"")
            elif self._mode == "chunked":
                if not self._parse_chunks():
                    return
            else:  # "close": the body ends with the connection (eof_received)
                return

    def _parse_head(self) -> bool:
        head = parse_head(self._buf, head_request=self._head_request)
        if head is None:
            return False
        if head.status < 200:  # an interim answer: the real one follows
            return True
        self._status = head.status
        self._headers = head.headers
        self._keep_alive = head.keep_alive
        self._mode = head.mode
        self._remaining = head.length
        return True

    def _parse_chunks(self) -> bool:
        """Consume whole chunks from the buffer; True when the last one (and trailers) is in."""
        buf = self._buf
        while True:
            if self._remaining > 0:  # inside a chunk: its data and CRLF
                if len(buf) < self._remaining + 2:
                    return False
                self._chunks.append(bytes(buf[:self._remaining]))
                del buf[:self._remaining + 2]
                self._remaining = 0
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return False
            size_text = bytes(buf[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise H1ProtocolError(f"bad chunk size {size_text[:20]!r}") from exc
            if size == 0:  # the last chunk; then trailer lines, then an empty line
                start = line_end + 2
                if buf[start:start + 2] == b"\r\n":
                    del buf[:start + 2]
                else:
                    end = buf.find(b"\r\n\r\n", start)
                    if end < 0:
                        return False
                    del buf[:end + 4]
                self._finish(b"".join(self._chunks))
                return True
            del buf[:line_end + 2]
            self._remaining = size


class H1Pool:
    """Keep-alive connections to one origin (see the module docstring)."""

    def __init__(self, url: str, *, ssl_context: ssl.SSLContext | None = None,
                 max_connections: int = 100, max_idle: int | None = None,
                 connect_timeout: float = 10.0, keepalive_expiry: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if default_port else f"{host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self._ssl = (ssl_context or ssl.create_default_context()) \
            if parts.scheme == "https" else None
        self._connect_timeout = connect_timeout
        self._keepalive_expiry = keepalive_expiry
        self._max_idle = max_connections if max_idle is None else max_idle
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def request(self, method: str, target: str, *,
                      headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                      body: bytes | None = None, timeout: float = 30.0) -> H1Response:
        """Send ``method target`` (a path with its query, below the pool's URL path) and
        return the whole answer, any status. Raises :class:`H1Error` subclasses."""
        payload = self.encode(method, target, headers=headers, body=body)
        head = method == "HEAD"
        try:
            async with asyncio.timeout(timeout):
                async with self._slots:
                    return await self._exchange(method, payload, head=head)
        except TimeoutError as exc:
            raise H1Timeout(f"{method} took over {timeout:g}s") from exc

    def encode(self, method: str, target: str, *,
               headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
               body: bytes | None = None) -> bytes:
        """The bytes of one request to this pool's origin: one socket write."""
        lines = [f"{method} {self.base_path}{target} HTTP/1.1\r\nHost: {self.authority}\r\n"]
        items = headers.items() if isinstance(headers, Mapping) else headers
        lines.extend(f"{k}: {v}\r\n" for k, v in items)
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        lines.append("\r\n")
        payload = "".join(lines).encode("latin-1")
        return payload + body if body else payload

    async def _exchange(self, method: str, payload: bytes, *, head: bool) -> H1Response:
        for attempt in (1, 2):
            conn = self._take() if attempt == 1 else None
            if conn is None:
                conn = await self._connect()
            done = False
            try:
                response = await conn.send(payload, head=head)
                done = True
            except H1ConnectionLost:
                done = True
                if attempt == 1 and conn.reused and not conn.got_bytes and method in _IDEMPOTENT:
                    continue  # a stale keep-alive connection: once more on a fresh one
                raise
            finally:
                if not done:  # cancelled or timed out mid-exchange: the answer may still come
                    conn.close()
            self._give_back(conn)
            return response
        raise AssertionError("unreachable")

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable() and now - conn.idle_since < self._keepalive_expiry:
                conn.reused = True
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Connection) -> None:
        now = time.monotonic()
        idle = self._idle
        while idle and now - idle[0].idle_since >= self._keepalive_expiry:
            idle.pop(0).close()  # the oldest, below what a busy pool reuses: never taken again
        if self._closed or not conn.usable() or len(idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = now
        idle.append(conn)

    async def _connect(self) -> _Connection:
        return await self.connect(_Connection)

    async def connect(self, factory: Callable[[], _P]) -> _P:
        """A new connection to this pool's origin (TLS included), outside the pool: for a
        stream (providers/transport/h1stream.py), which holds its connection until it ends."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    factory, self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None)
        except TimeoutError as exc:
            raise H1ConnectError(
                f"connecting to {self.authority} took over {self._connect_timeout:g}s") from exc
        except OSError as exc:  # ssl.SSLError included
            raise H1ConnectError(f"{self.authority}: {type(exc).__name__}: {exc}") from exc
        return conn

    async def aclose(self) -> None:
        """Close every idle connection; connections in use close when their request ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

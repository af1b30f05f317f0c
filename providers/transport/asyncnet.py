"""An httpx transport whose sockets are plain asyncio streams: less CPU per request.

Why it exists: httpx's default transport does its I/O through anyio, which on asyncio costs a
cancel scope per read and write, a freshly built attribute dict (and a ``getpeername`` call) for
every idle connection the pool checks on every request, and a separate socket write (a separate
TLS record) for a request's headers and its body. Measured against the API server (one process,
10 requests in flight), that layer was about a quarter of the CPU of a request, and CPU per
request is what limits a provider in a burst (bench/burst.py). This module plugs into httpcore's
documented ``network_backend`` hook; httpx, httpcore's pool and h11 stay as they are.

* :class:`AsyncioBackend` opens connections with :func:`asyncio.open_connection` and upgrades
  them with :meth:`asyncio.StreamWriter.start_tls`; errors and timeouts become httpcore's own
  exceptions (which httpx maps to ``httpx.ConnectError``, ``httpx.ReadTimeout``, ...) exactly as
  with the default backend.
* A stream holds what is written until the next read (or 64 KiB), so the headers and body of a
  request leave in one socket write; HTTP/1.1 always reads after it writes a request.
* :func:`fast_transport` builds the transport, or returns None when the environment names a
  proxy (``HTTPS_PROXY`` and friends): then the caller keeps httpx's default, which honours it.
"""

from __future__ import annotations

import asyncio
import os
import select
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

__all__ = ["DEFAULT_LIMITS", "AsyncioBackend", "AsyncioStream", "FastTransport",
           "fast_transport", "proxy_in_env"]

#: Written bytes held back at most (a larger body is sent as it comes).
_HOLD_BYTES = 64 * 1024
_PROXY_VARS = ("https_proxy", "http_proxy", "all_proxy")
#: httpx's own default pool limits.
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)


def proxy_in_env() -> bool:
    """Whether the environment names a proxy httpx would use (any case of the usual names)."""
    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARS)


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection: an asyncio reader/writer pair, TLS or not."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._write_timeout: float | None = None
        self._socket: Any = writer.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            await self._flush()
        try:
            if timeout is None:
                return await self._reader.read(max_bytes)
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(f"no data for {timeout}s") from exc
        except OSError as exc:
            raise httpcore.ReadError(f"{type(exc).__name__}: {exc}") from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._held_bytes += len(buffer)
        self._write_timeout = timeout
        if self._held_bytes >= _HOLD_BYTES:
            await self._flush()

    async def _flush(self) -> None:
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        timeout = self._write_timeout
        try:
            self._writer.write(data)
            if timeout is None:
                await self._writer.drain()
            else:
                async with asyncio.timeout(timeout):
                    await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(f"could not write for {timeout}s") from exc
        except (OSError, RuntimeError) as exc:  # RuntimeError: the transport is closed
            raise httpcore.WriteError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        self._held.clear()
        self._held_bytes = 0
        self._writer.close()  # not awaited: a TLS goodbye the peer never answers must not hang

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            self._writer.close()
            raise httpcore.ConnectTimeout(f"TLS handshake took over {timeout}s") from exc
        except (OSError, ssl.SSLError) as exc:  # ssl.SSLError is an OSError; named for clarity
            self._writer.close()
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return AsyncioStream(self._reader, self._writer)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # the pool asks this of every idle connection per request
            return self._readable()
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._socket
        return None

    def _readable(self) -> bool:
        """True when an idle connection is unusable: closed, at EOF, or with bytes waiting
        (only the server's goodbye can arrive on an idle HTTP/1.1 connection)."""
        if self._writer.is_closing() or self._reader.at_eof():
            return True
        fd = self._socket.fileno() if self._socket is not None else -1
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on asyncio streams (see the module docstring)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, local_addr=local)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"connecting took over {timeout}s") from exc
        except OSError as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"connecting took over {timeout}s") from exc
        except OSError as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FastTransport(httpx.AsyncHTTPTransport):
    """httpx's own HTTP/1.1 transport, its connection pool on :class:`AsyncioBackend`."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True,
                 limits: httpx.Limits = DEFAULT_LIMITS) -> None:
        # what httpx itself builds for verify=True/False (once: its own pool gets the same)
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(
            verify=verify)
        super().__init__(verify=context, limits=limits)
        # httpx builds the pool in __init__ and offers no backend argument; the pool it built
        # is replaced by the same pool on our backend (a unit test checks the attribute).
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=AsyncioBackend(),
        )


def fast_transport(*, verify: ssl.SSLContext | bool = True,
                   limits: httpx.Limits | None = None) -> FastTransport | None:
    """A :class:`FastTransport`, or None when a proxy is configured in the environment."""
    if proxy_in_env():
        return None
    return FastTransport(verify=verify, limits=limits or DEFAULT_LIMITS)

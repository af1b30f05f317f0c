"""A loopback TCP proxy that can black-hole its traffic: a network partition on demand.

Why it exists: a partitioned connection is not a refused or reset one. The TCP connection stays
open and nothing answers, so only the caller's own deadlines end its wait (leader election must
step down on time, not when some HTTP timeout fires). Killing a process or closing a socket
cannot show that; this proxy, put between one process and the API server (point its kubeconfig
at :attr:`BlackHoleProxy.url`), can:

* :meth:`BlackHoleProxy.black_hole`: open connections stay open but no byte moves in either
  direction; new connections are accepted and then ignored (no connection upstream);
* :meth:`BlackHoleProxy.restore`: bytes flow again, held ones included (as TCP delivers them once
  a partition heals), and the connections accepted meanwhile are connected upstream.

The proxy is byte-level (TLS passes through untouched) and runs in the caller's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from vkprovider.errors import VKError
from vkprovider.logs import kv

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024


class ProxyError(VKError):
    """The proxy was used before :meth:`BlackHoleProxy.start` or after it stopped."""


class BlackHoleProxy:
    """Forward ``host:port`` (loopback, a free port by default) to ``target_host:target_port``."""

    def __init__(self, *, target_host: str, target_port: int, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self.port = port
        self.accepted = 0  # connections accepted so far
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """``https://host:port``: what a kubeconfig's ``server`` becomes to go through here."""
        if self._server is None:
            raise ProxyError("the proxy is not started")
        return f"https://{self.host}:{self.port}"

    @property
    def black_holed(self) -> bool:
        return not self._flowing.is_set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, host=self.host, port=self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("proxy started", extra=kv(listen=f"{self.host}:{self.port}",
                                           target=f"{self.target_host}:{self.target_port}"))

    def black_hole(self) -> None:
        """Stop forwarding bytes, both ways, on every connection; ignore new connections."""
        self._flowing.clear()
        log.info("proxy black-holed", extra=kv(listen=f"{self.host}:{self.port}",
                                               connections=len(self._connections)))

    def restore(self) -> None:
        """Forward again (what was held back included)."""
        self._flowing.set()
        log.info("proxy restored", extra=kv(listen=f"{self.host}:{self.port}"))

    async def stop(self) -> None:
        """Stop listening and close every connection (the peers see them closed)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> BlackHoleProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- internals -----------------------------------------------------------------------------

    async def _accept(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio runs every handler as a task
            raise ProxyError("connection handler outside a task")
        self._connections.add(task)
        self._writers.add(client_writer)
        self.accepted += 1
        try:
            await self._forward(client_reader, client_writer)
        except asyncio.CancelledError:
            # stop() cancels us: end quietly (asyncio logs a cancelled handler as an error).
            pass
        finally:
            self._writers.discard(client_writer)
            client_writer.close()
            self._connections.discard(task)

    async def _forward(self, client_reader: asyncio.StreamReader,
                       client_writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()  # black-holed: accepted, then ignored
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.target_host, self.target_port)
        except OSError as exc:
            log.warning("proxy could not reach its target", extra=kv(error=str(exc)))
            return
        self._writers.add(upstream_writer)
        try:
            pumps = [asyncio.create_task(self._pump(client_reader, upstream_writer)),
                     asyncio.create_task(self._pump(upstream_reader, client_writer))]
            try:
                # Either side closing (or failing) ends the connection on both sides.
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._writers.discard(upstream_writer)
            upstream_writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                await self._flowing.wait()  # black-holed: leave the bytes unread
                data = await reader.read(_CHUNK)
                if not data:
                    return
                await self._flowing.wait()  # read just as the hole opened: hold them
                writer.write(data)
                await writer.drain()

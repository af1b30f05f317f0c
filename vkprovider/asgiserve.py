"""Serve an ASGI app with uvicorn inside the caller's event loop, on a socket bound up front.

Why it exists: both processes serve HTTP beside their controllers in one asyncio loop (the
provider's kubelet API and metrics, the companion's metrics and /healthz), so uvicorn must not
take over SIGTERM (the process owns shutdown), must stop when its task is cancelled, and a port
that cannot be bound must be an error naming it rather than ``sys.exit``. One copy for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Generator
from typing import Any

import uvicorn

from vkprovider.errors import ConfigError
from vkprovider.logs import kv

log = logging.getLogger(__name__)

ASGIApp = Any  # a Starlette/FastAPI app or any ASGI 3 callable


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the process handles SIGINT/SIGTERM and cancels us


def bind(*, host: str, port: int, what: str | None = None) -> socket.socket:
    """A listening TCP socket; a ConfigError naming ``what`` (or the address) when it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        named = f"{what}: cannot listen" if what else f"cannot listen on {host}:{port}"
        raise ConfigError(f"{named}: {exc.strerror}") from exc
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(*, app: ASGIApp, sock: socket.socket, name: str,
                ssl_context: ssl.SSLContext | None = None, http: Any = "auto",
                graceful_seconds: int = 2) -> None:
    """Serve until cancelled; then stop accepting and drop open streams (e.g. ``logs -f``)."""
    config = uvicorn.Config(
        app,
        http=http,
        ws="none",  # upgrades are answered in plain HTTP, never switched
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=graceful_seconds,
        ssl_context_factory=(lambda _cfg, _default: ssl_context) if ssl_context else None,
    )
    server = _Server(config)
    host, port = sock.getsockname()[:2]
    log.info("listening", extra=kv(server=name, address=f"{host}:{port}",
                                   tls=ssl_context is not None))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        server.force_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=5)
        raise
    finally:
        sock.close()

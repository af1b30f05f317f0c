"""Serve an ASGI app with uvicorn inside the service's event loop.

Why it exists: the kubelet API and the Prometheus endpoint run beside the controllers in one
asyncio TaskGroup, so uvicorn must not take over SIGTERM (the service owns shutdown), must stop
when its task is cancelled, and must report a port that cannot be bound as an error rather than
``sys.exit``. uvicorn also does not pass the TLS peer certificate to the application; the
protocol subclass here puts it in the scope as the ASGI TLS extension
(``scope["extensions"]["tls"]["client_cert_chain"]``), which :mod:`vkprovider.api.auth` reads.
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
from uvicorn.protocols.http.h11_impl import H11Protocol

from vkprovider.errors import ConfigError
from vkprovider.logs import kv

log = logging.getLogger(__name__)

ASGIApp = Any  # a Starlette/FastAPI app or any ASGI 3 callable


class _TLSPeerApp:
    """Per connection: adds the verified client certificate to every request's scope."""

    def __init__(self, app: ASGIApp, tls: dict[str, Any]) -> None:
        self.app = app
        self.tls = tls

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        extensions = scope.setdefault("extensions", {}) or {}
        scope["extensions"] = extensions
        extensions["tls"] = self.tls
        await self.app(scope, receive, send)


class PeerCertH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus the ASGI TLS extension with the client's certificate."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return
        der = ssl_object.getpeercert(binary_form=True)
        chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
        version = ssl_object.version()
        self.app = _TLSPeerApp(self.app, {
            "server_cert": None,
            "client_cert_chain": chain,
            "client_cert_name": None,
            "client_cert_error": None,
            "tls_version": version,
            "cipher_suite": None,
        })


    def _unsupported_upgrade_warning(self) -> None:
        # exec/attach/port-forward upgrades (SPDY, websocket) are expected and answered 501 by
        # the app; uvicorn's warning (and its hint to install a websocket library) is noise here
        log.debug("upgrade request served as plain HTTP")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the service handles SIGINT/SIGTERM and cancels us


def bind(*, host: str, port: int) -> socket.socket:
    """A listening TCP socket; a clear error when the address is taken or not ours."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(*, app: ASGIApp, sock: socket.socket, name: str,
                ssl_context: ssl.SSLContext | None = None) -> None:
    """Serve until cancelled; then stop accepting and drop open streams (e.g. ``logs -f``)."""
    config = uvicorn.Config(
        app,
        http=PeerCertH11Protocol,
        ws="none",  # exec/attach upgrades are answered in plain HTTP (501), never switched
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=2,
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

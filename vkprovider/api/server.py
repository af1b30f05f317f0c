"""Serve an ASGI app with uvicorn inside the service's event loop.

Why it exists: the kubelet API and the Prometheus endpoint run beside the controllers in one
asyncio TaskGroup, so uvicorn must not take over SIGTERM (the service owns shutdown), must stop
when its task is cancelled, and must report a port that cannot be bound as an error rather than
``sys.exit``. uvicorn also does not pass the TLS peer certificate to the application; the
protocol subclass here puts it in the scope as the ASGI TLS extension
(``scope["extensions"]["tls"]["client_cert_chain"]``), plus the subject as ``ssl`` decoded it
(``client_cert_subject``, not in the ASGI spec), which :mod:`vkprovider.api.auth` reads: no
certificate parser (``cryptography``) in the provider's process.

Port-forward is an HTTP/1.1 Upgrade to SPDY/3.1, which ASGI cannot express. Rather than a second
server or a raw socket handler in front of h11, the protocol subclass takes the one decision
uvicorn already makes per request (``_should_upgrade``): when an :class:`UpgradeRoute` wants the
request, the connection's transport is handed over to an asyncio stream pair and the route,
with the request's scope (headers, path, the TLS peer certificate); uvicorn and h11 keep every
other request, unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any, ClassVar, Protocol

from uvicorn.protocols.http.h11_impl import H11Protocol

from vkprovider import asgiserve

log = logging.getLogger(__name__)

ASGIApp = Any  # a Starlette/FastAPI app or any ASGI 3 callable


class UpgradeRoute(Protocol):
    """Who takes over upgraded connections (:class:`~.portforward.route.PortForwardRoute`)."""

    def wants(self, *, path: str, upgrade: bytes) -> bool: ...

    def start(self, *, scope: dict[str, Any], reader: asyncio.StreamReader,
              writer: asyncio.StreamWriter) -> None: ...

    async def aclose(self) -> None:
        """End every connection it took over (uvicorn no longer knows them)."""
        ...


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
    """uvicorn's h11 protocol, plus the ASGI TLS extension with the client's certificate, and
    upgraded connections handed to ``upgrades`` (see the module docstring)."""

    upgrades: ClassVar[UpgradeRoute | None] = None
    _tls: dict[str, Any] | None = None
    _raw_upgrade = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return
        der = ssl_object.getpeercert(binary_form=True)
        chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
        # decoded only for a certificate the handshake verified against the client CA
        subject = (ssl_object.getpeercert() or {}).get("subject", ()) if der else ()
        version = ssl_object.version()
        self._tls = {
            "server_cert": None,
            "client_cert_chain": chain,
            "client_cert_subject": subject,
            "client_cert_name": None,
            "client_cert_error": None,
            "tls_version": version,
            "cipher_suite": None,
        }
        self.app = _TLSPeerApp(self.app, self._tls)

    def _should_upgrade(self) -> bool:
        upgrade = self._get_upgrade()
        route = self.upgrades
        if route is not None and upgrade is not None and \
                route.wants(path=str(self.scope["path"]), upgrade=upgrade):
            self._raw_upgrade = True
            return True  # uvicorn then calls handle_websocket_upgrade: ours, below
        return bool(super()._should_upgrade())

    def handle_websocket_upgrade(self, event: Any) -> None:
        route = self.upgrades
        if not self._raw_upgrade or route is None:
            super().handle_websocket_upgrade(event)
            return
        # the connection leaves uvicorn: no keep-alive, no graceful-shutdown bookkeeping
        self.connections.discard(self)
        leftover, _ = self.conn.trailing_data  # bytes after the request head, if any
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2 ** 20, loop=loop)
        stream_protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        self.transport.set_protocol(stream_protocol)
        stream_protocol.connection_made(self.transport)
        writer = asyncio.StreamWriter(self.transport, stream_protocol, reader, loop)
        if leftover:
            stream_protocol.data_received(bytes(leftover))
        scope = dict(self.scope)
        scope["extensions"] = {"tls": self._tls} if self._tls is not None else {}
        route.start(scope=scope, reader=reader, writer=writer)


    def _unsupported_upgrade_warning(self) -> None:
        # exec/attach upgrades (SPDY, websocket) are expected and answered 501 by the app (and a
        # port-forward one without an UpgradeRoute); uvicorn's warning (and its hint to install
        # a websocket library) is noise here
        log.debug("upgrade request served as plain HTTP")


def bind(*, host: str, port: int) -> socket.socket:
    """A listening TCP socket; a clear error when the address is taken or not ours."""
    return asgiserve.bind(host=host, port=port)


async def serve(*, app: ASGIApp, sock: socket.socket, name: str,
                ssl_context: ssl.SSLContext | None = None,
                upgrades: UpgradeRoute | None = None) -> None:
    """Serve until cancelled, handing the TLS peer certificate to the app and upgraded
    connections to ``upgrades`` (see above)."""
    http: type[PeerCertH11Protocol] = PeerCertH11Protocol
    if upgrades is not None:
        http = type("UpgradingH11Protocol", (PeerCertH11Protocol,), {"upgrades": upgrades})
    try:
        await asgiserve.serve(app=app, sock=sock, name=name, ssl_context=ssl_context, http=http)
    finally:
        if upgrades is not None:
            await upgrades.aclose()

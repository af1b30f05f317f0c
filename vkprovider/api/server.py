"""Serve an ASGI app with uvicorn inside the service's event loop.

Why it exists: the kubelet API and the Prometheus endpoint run beside the controllers in one
asyncio TaskGroup, so uvicorn must not take over SIGTERM (the service owns shutdown), must stop
when its task is cancelled, and must report a port that cannot be bound as an error rather than
``sys.exit``. uvicorn also does not pass the TLS peer certificate to the application; the
protocol subclass here puts it in the scope as the ASGI TLS extension
(``scope["extensions"]["tls"]["client_cert_chain"]``), plus the subject as ``ssl`` decoded it
(``client_cert_subject``, not in the ASGI spec), which :mod:`vkprovider.api.auth` reads: no
certificate parser (``cryptography``) in the provider's process.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from vkprovider import asgiserve

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
        # decoded only for a certificate the handshake verified against the client CA
        subject = (ssl_object.getpeercert() or {}).get("subject", ()) if der else ()
        version = ssl_object.version()
        self.app = _TLSPeerApp(self.app, {
            "server_cert": None,
            "client_cert_chain": chain,
            "client_cert_subject": subject,
            "client_cert_name": None,
            "client_cert_error": None,
            "tls_version": version,
            "cipher_suite": None,
        })


    def _unsupported_upgrade_warning(self) -> None:
        # exec/attach/port-forward upgrades (SPDY, websocket) are expected and answered 501 by
        # the app; uvicorn's warning (and its hint to install a websocket library) is noise here
        log.debug("upgrade request served as plain HTTP")


def bind(*, host: str, port: int) -> socket.socket:
    """A listening TCP socket; a clear error when the address is taken or not ours."""
    return asgiserve.bind(host=host, port=port)


async def serve(*, app: ASGIApp, sock: socket.socket, name: str,
                ssl_context: ssl.SSLContext | None = None) -> None:
    """Serve until cancelled, handing the TLS peer certificate to the app (see above)."""
    await asgiserve.serve(app=app, sock=sock, name=name, ssl_context=ssl_context,
                          http=PeerCertH11Protocol)

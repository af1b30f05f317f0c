"""An httpx transport that dials through a :class:`~.dialing.Dialer`.

Why it exists: probes, the load generator and tests speak HTTP to replicas by the address the
cluster knows them by (an EndpointSlice address, a published host:port). In labs that address is
virtual; the transport rewrites only where the connection goes, keeping the URL's host in the
``Host`` header, as a DNAT rule would leave the packet's payload alone.
"""

from __future__ import annotations

import httpx

from vkprovider.probing.dialing import DIRECT, Dialer, NoRoute

__all__ = ["DialingTransport"]


class DialingTransport(httpx.AsyncBaseTransport):
    """Sends each request to ``dialer.resolve(url.host, url.port)``; the rest is httpx's."""

    def __init__(self, *, dialer: Dialer = DIRECT, inner: httpx.AsyncBaseTransport | None = None
                 ) -> None:
        self._dialer = dialer
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._dialer is not DIRECT:
            url = request.url
            port = url.port or (443 if url.scheme == "https" else 80)
            try:
                host, real = self._dialer.resolve(url.host, port)
            except NoRoute as e:
                raise httpx.ConnectError(str(e), request=request) from e
            if (host, real) != (url.host, port):
                request.headers.setdefault("Host", url.netloc.decode("ascii"))
                request.url = url.copy_with(host=host, port=real)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()

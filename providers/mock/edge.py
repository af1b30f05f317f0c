"""The mock cloud's hostname-only mode: every container port behind an HTTPS edge, by name only.

Why it exists: SaladCloud (an access domain per container group) and RunPod's Community Cloud
(``<pod>-<port>.proxy.runpod.net``) publish a replica only as an HTTPS hostname on 443, with the
cloud's certificate and (SaladCloud) an optional API-key header. The provider's traffic gateway
must be tested against exactly that: with this mode on, an instance reports no ``public_ip`` and
no port mapping, only ``edges`` (``<instance>-<port>.<domain>:443``); its listeners speak TLS
with a certificate the test gives (a wildcard for the domain, signed by a test CA) and, with
``auth_header`` set, answer 401 to any request without the cloud's API key in that header. The
address map routes ``<edge host>:443`` to the loopback listener, as for IP mode.

Like RunPod's HTTP proxy (behind Cloudflare, which cuts a request at ~100 s), the edge gives the
container ``timeout_seconds`` (default 100) to start its response; a request that gets none in
time is answered ``524`` by the edge. A streamed response whose headers came in time is not cut.

Like a real edge (Cloudflare, SaladCloud's gateway) it speaks HTTP/1.1 with WebSocket upgrades
and, offered by ALPN (``http2``, on by default), HTTP/2, where gRPC passes: the provider's
traffic gateway offers ``h2,http/1.1`` and so talks HTTP/2 to it (providers/mock/edgeproto.py).
Without the key, the edge answers HTTP 401 on every protocol, gRPC included, as an HTTP proxy
that knows no gRPC does (a gRPC client reads it as ``UNAUTHENTICATED``).
"""

from __future__ import annotations

import hmac
import math
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EDGE_PORT", "EDGE_TIMEOUT_SECONDS", "EdgeSettings"]

EDGE_PORT = 443
#: RunPod's proxy (Cloudflare) cuts a request that gets no response within ~100 s, with 524.
EDGE_TIMEOUT_SECONDS = 100.0
_DOMAIN = re.compile(r"^(?=.{1,200}$)([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,63}$")
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")


@dataclass(frozen=True, kw_only=True)
class EdgeSettings:
    """Hostname-only mode: the edge's domain, certificate, and optional API-key header."""

    domain: str
    cert_file: Path
    key_file: Path
    auth_header: str | None = None  # e.g. "Salad-Api-Key"; None: no edge auth
    api_key: str | None = field(default=None, repr=False)  # the key the edge wants
    #: seconds the container has to start its response before the edge answers 524
    timeout_seconds: float = EDGE_TIMEOUT_SECONDS
    #: offer HTTP/2 by ALPN beside HTTP/1.1 (a real edge does); False: HTTP/1.1 only
    http2: bool = True

    def __post_init__(self) -> None:
        if not _DOMAIN.match(self.domain):
            raise ValueError(f"edge domain must be a DNS name, got {self.domain!r}")
        if not (isinstance(self.timeout_seconds, int | float)
                and math.isfinite(self.timeout_seconds) and 0 < self.timeout_seconds <= 3600):
            raise ValueError(f"edge timeout must be 0 < seconds <= 3600, got "
                             f"{self.timeout_seconds!r}")
        if self.auth_header is not None:
            if not _HEADER.match(self.auth_header):
                raise ValueError(f"edge auth header must be a header name: {self.auth_header!r}")
            if not self.api_key:
                raise ValueError("edge auth needs the cloud's API key")

    def host(self, instance_id: str, container_port: int) -> str:
        """``<instance>-<port>.<domain>``: one name per container port, as RunPod's proxy."""
        return f"{instance_id.lower()}-{container_port}.{self.domain}"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.set_alpn_protocols(["h2", "http/1.1"] if self.http2 else ["http/1.1"])
        return ctx

    def allows(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """True when the request may pass the edge (no auth, or the right key)."""
        if self.auth_header is None or self.api_key is None:
            return True
        name = self.auth_header.lower().encode()
        given = next((v for k, v in headers if k == name), None)
        return given is not None and hmac.compare_digest(given, self.api_key.encode())

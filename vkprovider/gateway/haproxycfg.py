"""The static part of the gateway's HAProxy configuration, rendered from the provider's settings.

Why it exists: HAProxy cannot add a listener or load a CA file at runtime (2.6), so those are
declared once here: one ``listen`` section per gateway port (its dynamic servers come and go
through the Runtime API), the CA bundle that verifies the clouds' edges (pre-loaded by a disabled
server so that dynamic servers may name it), and three maps the Runtime API fills: the edge
hostname each listener sets as ``Host``, the edge API key per listener (one map per header name;
the client's own copy of that header is always removed first), and which replica port a listener
fronts (so a restarted provider re-adopts its allocations). Keys live in HAProxy's memory only:
the map files on disk stay empty.

The listeners are clear-text ``bind`` lines with no ``proto``: HAProxy serves HTTP/1.1 on them
and switches to HTTP/2 when a client opens with the HTTP/2 preface (h2c with prior knowledge, as
gRPC clients inside the cluster do), so one port carries both. The servers' side (ALPN) is
:meth:`vkprovider.gateway.runtime.RuntimeClient.add_server`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vkprovider.gateway.plan import backend_name

__all__ = ["GatewayLayout", "RuntimeTLS", "render", "write"]

_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")


@dataclass(frozen=True, kw_only=True)
class RuntimeTLS:
    """The Runtime API offered over the network with mutual TLS: HAProxy terminates TLS on
    ``bind`` (``host:port``), requires a client certificate signed by ``client_ca`` (the
    provider's), and forwards to its own admin socket. ``server_pem`` holds the gateway's
    certificate and key. The Runtime API has no authentication of its own: never expose it
    without this."""

    bind: str
    server_pem: Path
    client_ca: Path


@dataclass(frozen=True, kw_only=True)
class GatewayLayout:
    """Where the gateway's files are and which ports and headers it has."""

    bind_host: str
    first_port: int
    count: int
    socket: Path  # the Runtime API's Unix socket (admin level; mode 600)
    ca_file: Path  # PEM bundle of the CAs that sign the clouds' edge certificates
    map_dir: Path
    auth_headers: Sequence[str] = ("Salad-Api-Key",)
    runtime_tls: RuntimeTLS | None = None
    # host:port of /healthz (the pod's probes) and /metrics (HAProxy's Prometheus exporter)
    health_bind: str | None = None
    connect_timeout_seconds: float = 5.0
    # long streamed responses (SSE, chunked) must not be cut: the edge's timeout rules
    stream_timeout_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in self.auth_headers:
            if not _HEADER.match(name):
                raise ValueError(f"gateway auth header must be a plain header name, got {name!r}")

    @property
    def hosts_map(self) -> Path:
        return self.map_dir / "hosts.map"

    @property
    def routes_map(self) -> Path:
        return self.map_dir / "routes.map"

    def keys_map(self, header: str) -> Path:
        return self.map_dir / f"keys-{header.lower()}.map"


def render(layout: GatewayLayout) -> str:
    """``haproxy.cfg`` for ``layout`` (and the empty map files it names must exist: see
    :func:`write`)."""
    ms = int(layout.connect_timeout_seconds * 1000)
    stream = int(layout.stream_timeout_seconds * 1000)
    lines = [
        "# rendered by vkprovider (vkprovider/gateway/haproxycfg.py); servers come at runtime",
        "global",
        f"  stats socket {layout.socket} mode 600 level admin",
        "  log stderr format raw local0 notice",
        "",
        "defaults",
        "  mode http",
        "  option http-keep-alive",
        "  # keep each client connection's TLS connection to the edge: HAProxy 2.6 does not pool",
        "  # idle connections of servers added at runtime (with the default 'safe' every request",
        "  # paid a new TLS handshake to the edge); 'never' keeps the server connection private",
        "  # to the client's kept-alive connection, so it stays warm for as long as the client's",
        "  http-reuse never",
        f"  timeout connect {ms}ms",
        f"  timeout client {stream}ms",
        f"  timeout server {stream}ms",
        f"  timeout tunnel {stream}ms",
        "  timeout http-request 30s",
        "",
        "backend ca-store",
        "  # pre-loads the edge CA bundle: dynamic servers may only name a loaded ca-file",
        f"  server ca 127.0.0.1:9 ssl verify required ca-file {layout.ca_file} disabled",
        "  # loads the routes map (which replica port each listener fronts) for the Runtime API",
        f"  http-request set-var(txn.route) be_name,map({layout.routes_map})",
    ]
    if layout.runtime_tls is not None:
        t = layout.runtime_tls
        lines += [
            "",
            "listen runtime-api",
            "  # the Runtime API for the provider, mutual TLS only (it has no auth of its own)",
            "  mode tcp",
            f"  bind {t.bind} ssl crt {t.server_pem} ca-file {t.client_ca} verify required",
            f"  server admin unix@{layout.socket}",
        ]
    if layout.health_bind is not None:
        lines += [
            "",
            "frontend health",
            f"  bind {layout.health_bind}",
            "  http-request return status 200 content-type text/plain string ok"
            " if { path /healthz }",
            "  http-request use-service prometheus-exporter if { path /metrics }",
            "  http-request deny deny_status 404",
        ]
    hosts = layout.hosts_map
    for port in range(layout.first_port, layout.first_port + layout.count):
        lines += ["", f"listen {backend_name(port)}", f"  bind {layout.bind_host}:{port}"]
        for header in layout.auth_headers:
            keys = layout.keys_map(header)
            lines += [
                f"  http-request del-header {header}",
                f"  http-request set-header {header} %[be_name,map({keys})]"
                f" if {{ be_name,map({keys}) -m found }}",
            ]
        lines.append(f"  http-request set-header Host %[be_name,map({hosts})]"
                     f" if {{ be_name,map({hosts}) -m found }}")
    return "\n".join(lines) + "\n"


def write(layout: GatewayLayout, path: Path) -> None:
    """Write the configuration to ``path`` and create the (empty) map files it loads."""
    layout.map_dir.mkdir(parents=True, exist_ok=True)
    for m in (layout.hosts_map, layout.routes_map,
              *(layout.keys_map(h) for h in layout.auth_headers)):
        m.touch()
    path.write_text(render(layout))

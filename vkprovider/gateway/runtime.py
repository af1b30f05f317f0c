"""An asyncio client of HAProxy's Runtime API (the stats socket), for the commands the gateway uses.

Why it exists: the gateway is programmed while it runs (dynamic servers, map entries), never by
rewriting its configuration and reloading. The Runtime API speaks one line per command on a Unix
(or TCP) socket; in non-interactive mode each connection carries one command and HAProxy closes
it after the answer. This module owns quoting (a value that could split or chain a command is
refused before anything is sent), answers' parsing, and errors as our own classes. An edge API
key goes through :meth:`RuntimeClient.set_map` like any map value, and never into a log line or an
error message: failures name the map and the key, never the value.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vkprovider.errors import VKError

__all__ = [
    "SERVER_ALPN",
    "GatewayError",
    "RuntimeClient",
    "RuntimeCommandError",
    "RuntimeUnavailable",
    "ServerState",
]

_SAFE = re.compile(r"^[A-Za-z0-9._:/\[\]@+=~%-]{1,512}$")  # no space, ';', newline, quote, '#'
_READ_LIMIT = 16 << 20
#: What the gateway offers an edge in the TLS handshake, preferred first.
SERVER_ALPN = "h2,http/1.1"


class GatewayError(VKError):
    """Base of the gateway's errors."""


class RuntimeUnavailable(GatewayError):
    """The Runtime API socket cannot be reached (HAProxy down, restarting, or not there yet)."""


class RuntimeCommandError(GatewayError):
    """HAProxy answered a command with an error (the message is HAProxy's, never a secret)."""


@dataclass(frozen=True, kw_only=True)
class ServerState:
    """One server of a backend, as ``show servers state`` reports it."""

    backend: str
    name: str
    address: str  # "-" while an FQDN is unresolved
    port: int
    admin_state: int  # bit 0x01: maintenance (forced), 0x20: maintenance via the Runtime API
    fqdn: str

    @property
    def in_maintenance(self) -> bool:
        return bool(self.admin_state & 0x21)


def safe(value: str, *, what: str, secret: bool = False) -> str:
    """``value`` if it is one plain token of the Runtime API's grammar, else an error naming
    ``what`` (and, unless ``secret``, the value)."""
    if not _SAFE.match(value):
        shown = "(a secret value)" if secret else repr(value)
        raise GatewayError(f"{what}: {shown} is not a plain token (space, ';', quote, '#' or "
                           "newline, or too long); refused before HAProxy sees it")
    return value


class RuntimeClient:
    """Talks to one HAProxy's Runtime API at ``address``: a Unix socket path, ``tcp://host:port``
    (only where nothing else can reach it), or ``tls://host:port`` with ``tls`` (the client
    certificate and the CA of the gateway's certificate; ``server_name`` is checked)."""

    def __init__(self, *, address: str, timeout: float = 5.0, tls: ssl.SSLContext | None = None,
                 server_name: str | None = None,
                 resolve: Callable[[str, int], tuple[str, int]] | None = None) -> None:
        if address.startswith("tls://") and tls is None:
            raise GatewayError(f"{address}: a tls:// Runtime API needs a TLS context")
        self.address = address
        self.timeout = timeout
        self.tls = tls
        self.server_name = server_name
        self.resolve = resolve  # a lab's address map (pod IPs are virtual there)

    def __repr__(self) -> str:
        return f"RuntimeClient({self.address!r})"

    async def command(self, line: str) -> str:
        """Run one command; its answer (HAProxy's text). Callers quote with :func:`safe`."""
        if "\n" in line or ";" in line:
            raise GatewayError("a Runtime API command is one line without ';'")
        try:
            async with asyncio.timeout(self.timeout):
                if self.address.startswith(("tcp://", "tls://")):
                    host, _, port = self.address[len("tcp://"):].rpartition(":")
                    host = host.strip("[]")
                    tls = self.tls if self.address.startswith("tls://") else None
                    dial_host, dial_port = (self.resolve(host, int(port)) if self.resolve
                                            else (host, int(port)))
                    reader, writer = await asyncio.open_connection(
                        dial_host, dial_port, limit=_READ_LIMIT, ssl=tls,
                        server_hostname=(self.server_name or host) if tls else None)
                else:
                    reader, writer = await asyncio.open_unix_connection(
                        str(Path(self.address)), limit=_READ_LIMIT)
                try:
                    writer.write(line.encode() + b"\n")
                    await writer.drain()
                    data = await reader.read()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError) as exc:
            raise RuntimeUnavailable(
                f"HAProxy Runtime API at {self.address}: {type(exc).__name__}: {exc}") from exc
        return data.decode("utf-8", "replace")

    # ---- reading -------------------------------------------------------------------------

    async def info(self) -> dict[str, str]:
        """``show info`` as a dict (``Pid``, ``Uptime_sec``, ...)."""
        out: dict[str, str] = {}
        for row in (await self.command("show info")).splitlines():
            name, sep, value = row.partition(":")
            if sep:
                out[name.strip()] = value.strip()
        return out

    async def servers(self) -> list[ServerState]:
        """Every server of every backend (``show servers state``)."""
        text = await self.command("show servers state")
        rows = [r for r in text.splitlines() if r and not r.startswith("#")]
        out: list[ServerState] = []
        for row in rows[1:]:  # the first line is the format version
            f = row.split()
            if len(f) < 19:
                raise RuntimeCommandError(f"unexpected 'show servers state' row: {row[:200]!r}")
            out.append(ServerState(backend=f[1], name=f[3], address=f[4], port=int(f[18]),
                                   admin_state=int(f[6]), fqdn=f[17]))
        return out

    async def show_map(self, path: Path) -> dict[str, str]:
        """The live entries of the map file ``path`` (key -> value). Callers must not log the
        values of a key map."""
        text = await self.command(f"show map {safe(str(path), what='map')}")
        if text.strip().startswith("Unknown map"):
            raise RuntimeCommandError(f"HAProxy has no map {path}")
        out: dict[str, str] = {}
        for row in text.splitlines():
            parts = row.split(" ", 2)  # "<ref> <key> <value>"
            if len(parts) == 3:
                out[parts[1]] = parts[2]
        return out

    # ---- writing -------------------------------------------------------------------------

    async def add_server(self, *, backend: str, server: str, host: str, port: int,
                         sni: str, ca_file: Path) -> None:
        """A dynamic server that originates TLS to ``host:port``: certificate verified against
        ``ca_file`` (loaded by the static configuration) for the name ``sni``, sent as SNI.
        ALPN offers HTTP/2 first, then HTTP/1.1: an edge that speaks h2 gets HTTP/2 (gRPC needs
        it end to end), one that does not gets HTTP/1.1; a WebSocket is relayed over HTTP/1.1
        (``ws h1``), since an edge's HTTP/2 rarely supports RFC 8441's extended CONNECT.
        Added in maintenance, as HAProxy does; :meth:`set_ready` puts it in service."""
        line = (f"add server {safe(backend, what='backend')}/{safe(server, what='server')} "
                f"{safe(_hostport(host, port), what='address')} ssl verify required "
                f"ca-file {safe(str(ca_file), what='ca-file')} "
                f"sni str({safe(sni, what='sni')}) verifyhost {safe(sni, what='sni')} "
                f"alpn {SERVER_ALPN} ws h1 pool-low-conn 2")
        await self._expect(line, "New server registered", what=f"add server {backend}/{server}")

    async def add_plain_server(self, *, backend: str, server: str, host: str, port: int) -> None:
        """A dynamic server that speaks plain HTTP to ``host:port`` (a published IP:port routed
        through the gateway by ``traffic: gateway``; none of the IP:port clouds offers TLS
        there). Added in maintenance, as :meth:`add_server`."""
        line = (f"add server {safe(backend, what='backend')}/{safe(server, what='server')} "
                f"{safe(_hostport(host, port), what='address')} pool-low-conn 2")
        await self._expect(line, "New server registered", what=f"add server {backend}/{server}")

    async def set_ready(self, *, backend: str, server: str) -> None:
        await self._expect(f"set server {safe(backend, what='backend')}/"
                           f"{safe(server, what='server')} state ready", "",
                           what=f"set server {backend}/{server} state ready")

    async def delete_server(self, *, backend: str, server: str) -> None:
        """Drain nothing: put the server in maintenance, cut its sessions, delete it."""
        ref = f"{safe(backend, what='backend')}/{safe(server, what='server')}"
        await self._expect(f"set server {ref} state maint", "", what=f"maint {ref}")
        await self._expect(f"shutdown sessions server {ref}", "", what=f"shutdown {ref}")
        await self._expect(f"del server {ref}", "Server deleted", what=f"del server {ref}")

    async def set_map(self, path: Path, key: str, value: str, *, secret: bool = False) -> None:
        """Set ``key`` to ``value`` in the map ``path`` (added when absent)."""
        m = safe(str(path), what="map")
        k = safe(key, what=f"{path.name} key")
        v = safe(value, what=f"{path.name} value of {key}", secret=secret)
        answer = (await self.command(f"set map {m} {k} {v}")).strip()
        if answer == "":
            return
        if "not found" in answer.lower():
            await self._expect(f"add map {m} {k} {v}", "", what=f"add map {path.name} {key}")
            return
        raise RuntimeCommandError(f"set map {path.name} {key}: {answer[:200]}")

    async def del_map(self, path: Path, key: str) -> None:
        m = safe(str(path), what="map")
        answer = (await self.command(f"del map {m} {safe(key, what='map key')}")).strip()
        if answer and "not found" not in answer.lower():
            raise RuntimeCommandError(f"del map {path.name} {key}: {answer[:200]}")

    async def _expect(self, line: str, ok: str, *, what: str) -> None:
        answer = (await self.command(line)).strip()
        if (ok and answer.startswith(ok)) or (not ok and answer == ""):
            return
        raise RuntimeCommandError(f"{what}: {answer[:300] or 'no answer'}")


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

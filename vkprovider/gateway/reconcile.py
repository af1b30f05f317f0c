"""Make one HAProxy's live state what the provider planned: servers, Host names, keys, routes.

Why it exists: the provider's plan is the source of truth; HAProxy's memory is a copy that can be
lost at any time (a restarted gateway pod starts with empty listeners). Each pass reads what the
gateway has (``show servers state``, ``show map``) and sends only the difference, so a pass over
an up-to-date gateway is a few reads, and a restarted one is fully re-programmed by the next pass.
Only the gateway's own listeners (``gw<port>`` within the planned range) are touched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vkprovider.gateway.haproxycfg import GatewayLayout
from vkprovider.gateway.plan import GatewayRoute, RouteKey, backend_name
from vkprovider.gateway.runtime import RuntimeClient
from vkprovider.logs import kv

__all__ = ["Programmed", "ReconcileResult", "reconcile"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Programmed:
    """A route as the gateway must serve it, with the edge's API key (never printed)."""

    route: GatewayRoute
    api_key: str | None = field(default=None, repr=False)


@dataclass(kw_only=True)
class ReconcileResult:
    added: int = 0
    deleted: int = 0
    readied: int = 0
    map_writes: int = 0
    #: the routes whose listener had no server at all before this pass (new, or lost with the
    #: gateway's memory), not those whose stale server was replaced
    filled: list[RouteKey] = field(default_factory=list)
    #: without ``prune``: the routes left as they were that the gateway serves (a server in
    #: service and a routes map entry), by gateway port: a previous provider's, not told yet
    kept: dict[RouteKey, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.deleted or self.readied or self.map_writes)


def route_value(route: GatewayRoute) -> str:
    """The routes map's value for ``route``: ``<pod uid>/<container port>``."""
    return f"{route.edge.pod_uid}/{route.edge.container_port}"


async def reconcile(*, client: RuntimeClient, layout: GatewayLayout,
                    desired: Sequence[Programmed], prune: bool = True) -> ReconcileResult:
    """One pass: the gateway behind ``client`` serves exactly ``desired`` (with ``prune``
    False: at least ``desired``; nothing is removed, as while a restarted provider has not
    told every replica yet)."""
    result = ReconcileResult()
    ours = {backend_name(p) for p in range(layout.first_port, layout.first_port + layout.count)}
    want = {p.route.backend: p for p in desired}
    live = [s for s in await client.servers() if s.backend in ours]
    if not prune:
        serving = {s.backend for s in live if s.backend not in want and not s.in_maintenance}
        for backend, value in (await client.show_map(layout.routes_map)).items():
            uid, _, port = value.rpartition("/")
            if backend in serving and uid and port.isdigit():
                result.kept[(uid, int(port))] = int(backend[2:])
    have: dict[str, list[str]] = {}
    stale: list[tuple[str, str]] = []  # replaced servers: deleted once the new one serves
    for s in live:
        have.setdefault(s.backend, []).append(s.name)
        target = want.get(s.backend)
        if target is None and prune:
            await client.delete_server(backend=s.backend, server=s.name)
            result.deleted += 1
        elif target is not None and target.route.server != s.name:
            stale.append((s.backend, s.name))
        elif s.in_maintenance:
            await client.set_ready(backend=s.backend, server=s.name)
            result.readied += 1
    for backend, p in sorted(want.items()):
        if p.route.server in have.get(backend, ()):
            continue
        if backend not in have:
            result.filled.append(p.route.edge.key)
        edge = p.route.edge
        if edge.tls:
            await client.add_server(backend=backend, server=p.route.server, host=edge.dial_host,
                                    port=edge.dial_port, sni=edge.host, ca_file=layout.ca_file)
        else:  # an IP:port replica (traffic: gateway): plain HTTP, the client's Host kept
            await client.add_plain_server(backend=backend, server=p.route.server,
                                          host=edge.dial_host, port=edge.dial_port)
        await client.set_ready(backend=backend, server=p.route.server)
        result.added += 1
    for backend, name in stale:  # make before break: the listener is never without a server
        await client.delete_server(backend=backend, server=name)
        result.deleted += 1
    # maps after servers: a Host/key entry for a listener with no server does no harm
    result.map_writes += await _sync_map(
        client, layout.hosts_map,
        {b: p.route.edge.host for b, p in want.items() if p.route.edge.tls}, ours,
        prune=prune)
    result.map_writes += await _sync_map(
        client, layout.routes_map, {b: route_value(p.route) for b, p in want.items()}, ours,
        prune=prune)
    for header in layout.auth_headers:
        keys = {b: p.api_key for b, p in want.items()
                if p.api_key and p.route.edge.auth_header
                and p.route.edge.auth_header.lower() == header.lower()}
        result.map_writes += await _sync_map(client, layout.keys_map(header), keys, ours,
                                             secret=True, prune=prune)
    if result.changed:
        log.info("gateway programmed", extra=kv(gateway=client.address, routes=len(want),
                                                added=result.added, deleted=result.deleted,
                                                readied=result.readied,
                                                map_writes=result.map_writes))
    return result


async def _sync_map(client: RuntimeClient, path: Path, want: dict[str, str],
                    ours: Iterable[str], *, secret: bool = False, prune: bool = True) -> int:
    live = await client.show_map(path)
    ours_set = set(ours)
    writes = 0
    for key in sorted(set(live) - set(want)):
        if key in ours_set and prune:
            await client.del_map(path, key)
            writes += 1
    for key, value in sorted(want.items()):
        if live.get(key) != value:
            await client.set_map(path, key, value, secret=secret)
            writes += 1
    return writes

"""Pure planning: which gateway port fronts which hostname-only replica port.

Why it exists: the gateway's listeners are declared once (a fixed port range in the static
HAProxy configuration; HAProxy cannot add a listener at runtime), and each hostname-only replica
port needs one of them for as long as it exists. The allocation must be stable (a replica keeps
its port across reconciles, provider restarts that re-tell the same replicas in any order, and
other replicas coming and going), because the port is written into EndpointSlices: a changed port
is a changed endpoint. No I/O here; the controller feeds replicas in and reads routes out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vkprovider.errors import VKError

__all__ = ["EdgeTarget", "GatewayRoute", "Planner", "PortsExhausted", "RouteKey",
           "backend_name", "server_name"]

#: (pod UID, container port): one gateway port per replica port.
RouteKey = tuple[str, int]


class PortsExhausted(VKError):
    """Every gateway port of the range fronts a replica already; this one gets none."""

    def __init__(self, *, key: RouteKey, ports: int) -> None:
        super().__init__(f"all {ports} gateway ports are in use; pod {key[0]} port {key[1]} "
                         "gets no gateway route (raise gateway.port_count)")
        self.key = key


@dataclass(frozen=True, kw_only=True)
class EdgeTarget:
    """A replica port as its cloud publishes it: an HTTPS edge reached by hostname.

    ``dial_host:dial_port`` is where the gateway connects (the edge's address; in a lab the
    address map's loopback listener); ``host`` is the name its certificate must carry, sent as
    SNI and ``Host``. ``auth_header`` names the header the edge wants its API key in (None: the
    edge has no auth); the key itself is not part of the plan (see the controller). ``tls``
    False: a published IP:port sent through the gateway (``traffic: gateway``), dialled in plain
    HTTP as the cloud offers it, the client's ``Host`` kept.
    """

    pod_uid: str
    container_port: int
    host: str
    port: int
    dial_host: str
    dial_port: int
    auth_header: str | None = None
    tls: bool = True

    @property
    def key(self) -> RouteKey:
        return (self.pod_uid, self.container_port)


@dataclass(frozen=True, kw_only=True)
class GatewayRoute:
    """One allocated gateway port and the edge behind it."""

    port: int
    edge: EdgeTarget

    @property
    def backend(self) -> str:
        return backend_name(self.port)

    @property
    def server(self) -> str:
        return server_name(self.edge)


def backend_name(port: int) -> str:
    """The HAProxy proxy (a ``listen`` section) that serves gateway port ``port``."""
    return f"gw{port}"


def server_name(edge: EdgeTarget) -> str:
    """The HAProxy server name for ``edge``: a digest of everything programmed into the server,
    so a server whose settings are stale has another name (HAProxy's runtime API cannot read
    back a dynamic server's TLS settings; a name it can)."""
    parts = (edge.pod_uid, str(edge.container_port), edge.host, str(edge.port), edge.dial_host,
             str(edge.dial_port))
    material = "\0".join(parts if edge.tls else (*parts, "plain"))
    return "r" + hashlib.sha256(material.encode()).hexdigest()[:16]


class Planner:
    """Stable allocation of gateway ports ``[first_port, first_port + count)`` to replica ports.

    A key keeps its port while it is planned; a freed port is reused only after every never-used
    port (so an endpoint that just went away is not immediately another replica's address). A
    restarted provider passes the routes it finds live (``adopt``) so that allocations survive.
    """

    def __init__(self, *, first_port: int, count: int) -> None:
        if count < 1 or not 1 <= first_port <= 65535 - count + 1:
            raise ValueError(f"bad gateway port range: first {first_port}, count {count}")
        self.first_port = first_port
        self.count = count
        self._ports: dict[RouteKey, int] = {}
        self._next = 0  # the next never-used offset
        self._freed: list[int] = []  # freed ports, oldest first

    def adopt(self, ports: Mapping[RouteKey, int]) -> None:
        """Take allocations found elsewhere (a live gateway) before the first :meth:`plan`."""
        for key, port in sorted(ports.items(), key=lambda kv: kv[1]):
            if self._in_range(port) and port not in self._ports.values() \
                    and key not in self._ports:
                self._ports[key] = port
        used = {p - self.first_port for p in self._ports.values()}
        self._next = max(used, default=-1) + 1
        self._freed = [self.first_port + i for i in range(self._next) if i not in used]

    def plan(self, edges: Iterable[EdgeTarget], *, release: bool = True
             ) -> tuple[dict[RouteKey, GatewayRoute], list[PortsExhausted]]:
        """Routes for exactly ``edges`` (one per key; the last of a duplicate key wins), and
        the keys that got no port. With ``release`` False, keys not in ``edges`` keep their
        ports (adopted ones not told again yet after a restart)."""
        wanted = {e.key: e for e in edges}
        for key in [k for k in self._ports if k not in wanted and release]:
            self._freed.append(self._ports.pop(key))
        routes: dict[RouteKey, GatewayRoute] = {}
        exhausted: list[PortsExhausted] = []
        for key in sorted(wanted):  # a deterministic order for new allocations
            port = self._ports.get(key)
            if port is None:
                port = self._allocate()
                if port is None:
                    exhausted.append(PortsExhausted(key=key, ports=self.count))
                    continue
                self._ports[key] = port
            routes[key] = GatewayRoute(port=port, edge=wanted[key])
        return routes, exhausted

    def ports(self) -> range:
        return range(self.first_port, self.first_port + self.count)

    def _in_range(self, port: int) -> bool:
        return self.first_port <= port < self.first_port + self.count

    def _allocate(self) -> int | None:
        if self._next < self.count:
            self._next += 1
            return self.first_port + self._next - 1
        if self._freed:
            return self._freed.pop(0)
        return None

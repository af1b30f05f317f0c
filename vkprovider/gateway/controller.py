"""The provider's side of the gateway: routes for EndpointSlices, and HAProxy kept programmed.

Why it exists: the EndpointSlice controller asks, for each hostname-only replica port a Service
selects (and each IP:port one whose policy says ``traffic: gateway``), where the gateway serves
it (:meth:`GatewayController.route`); the answer is one gateway pod's address (the same pod for a
replica while it is healthy, re-homed when it is not) and the port the planner allocated. A
background loop (:meth:`GatewayController.run`) resolves each edge to the address HAProxy dials
(a lab's address map, or DNS screened by the address filter, so a cloud cannot point the gateway
inside the cluster) and reconciles every gateway pod to the plan:
the provider's state is the source of truth, and a restarted gateway is re-programmed on the next
pass (``gateway.reconcile_seconds``). Edge API keys come from ``edge_key`` (the provider's own
key for its cloud) and are handed to HAProxy only, never logged.

An allocated route is not yet a served one: until a pass has programmed it into the chosen
gateway pod, that pod's listener answers 503. So the EndpointSlice controller publishes a gateway
endpoint as ready only when :meth:`GatewayController.is_programmed` says the home's last
successful pass programmed exactly that route, and each pass ends by telling it
(``on_programmed``) which replicas' routes were programmed or lost, so it re-syncs just those
(docs/traffic.md, "When a gateway endpoint turns ready").
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from prometheus_client import Counter, Gauge

from vkprovider.gateway.haproxycfg import GatewayLayout
from vkprovider.gateway.plan import EdgeTarget, GatewayRoute, Planner, RouteKey
from vkprovider.gateway.reconcile import Programmed, reconcile
from vkprovider.gateway.runtime import GatewayError, RuntimeClient
from vkprovider.logs import kv

__all__ = ["EdgeRequest", "GatewayController", "GatewayInstance", "TrafficMode"]

log = logging.getLogger(__name__)

TrafficMode = Literal["direct", "gateway", "auto"]
#: Resolves an edge ``host:port`` to the ``(host, port)`` HAProxy dials; raises to skip it.
DialResolver = Callable[[str, int], Awaitable[tuple[str, int]]]


class GatewayMetrics(Protocol):
    """The gateway's metrics (vkprovider/metrics.py)."""

    @property
    def gateway_routes(self) -> Gauge: ...
    @property
    def gateway_pods_healthy(self) -> Gauge: ...
    @property
    def gateway_passes(self) -> Counter: ...
    @property
    def gateway_ports_exhausted(self) -> Gauge: ...


class EdgeRequest(Protocol):
    """What the EndpointSlice controller knows of a hostname-only published port."""

    @property
    def container_port(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def provider(self) -> str: ...
    @property
    def edge_auth(self) -> str | None: ...
    @property
    def kind(self) -> Literal["ip", "hostname"]: ...


@dataclass(kw_only=True)
class GatewayInstance:
    """One gateway pod: its address (for EndpointSlices) and its Runtime API."""

    address: str
    client: RuntimeClient
    healthy: bool = True
    last_error: str | None = field(default=None, repr=False)


class GatewayController:
    def __init__(self, *, layout: GatewayLayout, instances: Sequence[GatewayInstance],
                 dial: DialResolver,
                 traffic_of: Callable[[str], TrafficMode] = lambda _uid: "auto",
                 edge_key: Callable[[str], str | None] = lambda _provider: None,
                 interval: float = 1.0, metrics: GatewayMetrics | None = None) -> None:
        self.layout = layout
        self.instances = list(instances)
        self.dial = dial
        self.traffic_of = traffic_of
        self.edge_key = edge_key
        self.interval = interval
        self.metrics = metrics
        self.planner = Planner(first_port=layout.first_port, count=layout.count)
        self.on_change: Callable[[], None] = lambda: None  # re-homing: slices must be rewritten
        # after a pass: the pod UIDs whose routes a gateway pod now serves or no longer serves
        # as planned (their endpoints' readiness may have changed)
        self.on_programmed: Callable[[frozenset[str]], None] = lambda _uids: None
        # discovery (gateway/discovery.py) calls this with the Ready gateway pods' IPs
        self.discovered: Callable[[list[str]], None] = lambda _addresses: None
        self._edges: dict[RouteKey, EdgeTarget] = {}
        self._providers: dict[RouteKey, str] = {}
        self._routes: dict[RouteKey, GatewayRoute] = {}
        self._dirty = asyncio.Event()
        self._adopted = False
        self.passes = 0
        # per gateway pod address, the routes (as planned) its last successful pass programmed:
        # what a slice may publish as ready and a port-forward may dial now (a bare port: a
        # route a previous provider programmed, found live and left alone until it is told
        # again after a restart); and a pulse at the end of every pass
        self._programmed: dict[str, dict[RouteKey, GatewayRoute | int]] = {}
        self._pass_done = asyncio.Event()
        # Set after the first pass: what the gateway pods serve is known. The EndpointSlice
        # controller waits for it after a restart, so it does not write not-ready the endpoints
        # of routes a live gateway serves.
        self.first_pass = asyncio.Event()
        # Set once the EndpointSlice controller has asked for every route it needs after a
        # start: until then a pass adds and fixes but removes nothing, so a restarted provider
        # does not empty a gateway that serves replicas it has not been told of yet.
        self.synced = asyncio.Event()

    # ---- what the EndpointSlice controller calls (synchronous, cheap) ------------------------

    def wants(self, *, pod_uid: str, target: EdgeRequest) -> bool:
        """Whether this replica port's traffic goes through the gateway, by its policy's
        ``traffic``: a hostname-only one unless ``direct``; an IP:port one only under
        ``gateway`` (which then is never a direct endpoint, even while no route exists)."""
        mode = self.traffic_of(pod_uid)
        if target.kind == "ip":
            return mode == "gateway"
        return mode != "direct"

    def route(self, *, pod_uid: str, target: EdgeRequest) -> tuple[str, int] | None:
        """The gateway ``(address, port)`` serving this replica port, or None (not
        :meth:`wants`, no port left, or no healthy gateway pod). A replica port the gateway no
        longer wants (its policy's ``traffic`` changed) loses its route at once."""
        key = (pod_uid, target.container_port)
        if not self.wants(pod_uid=pod_uid, target=target):
            if key in self._edges:
                del self._edges[key]
                self._providers.pop(key, None)
                self._replan()
            return None
        tls = target.kind != "ip"
        edge = EdgeTarget(pod_uid=pod_uid, container_port=target.container_port,
                          host=target.host, port=target.port, dial_host=target.host,
                          dial_port=target.port,
                          auth_header=target.edge_auth if tls else None, tls=tls)
        if self._edges.get(key) != edge:
            self._edges[key] = edge
            self._providers[key] = target.provider
            self._replan()
        route = self._routes.get(key)
        instance = self._home(pod_uid)
        if route is None or instance is None:
            return None
        return instance.address, route.port

    def is_programmed(self, *, pod_uid: str, container_port: int,
                      at: tuple[str, int]) -> bool:
        """Whether gateway pod ``at[0]``'s last successful pass programmed this replica port's
        route exactly as planned now (its port ``at[1]``, the same edge, TLS and auth header):
        only then does a request to ``at`` reach the replica rather than HAProxy's 503."""
        key = (pod_uid, container_port)
        route = self._routes.get(key)
        if route is None or route.port != at[1]:
            return False
        have = self._programmed.get(at[0], {}).get(key)
        # a bare port: live since before this process, and not planned by a pass since
        return have == route or (isinstance(have, int) and have == route.port)

    async def serve(self, *, pod_uid: str, target: EdgeRequest,
                    timeout: float) -> tuple[str, int] | None:
        """As :meth:`route`, then wait until a pass has programmed that route into the chosen
        gateway pod: ``kubectl port-forward`` dials it at once, and asking may have allocated
        it just now. None when the gateway does not serve it; :class:`TimeoutError` when no
        pass programmed it within ``timeout`` seconds (its edge not dialable, the gateway pod
        unreachable)."""
        key = (pod_uid, target.container_port)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            routed = self.route(pod_uid=pod_uid, target=target)
            if routed is None:
                return None
            if self.is_programmed(pod_uid=pod_uid, container_port=key[1], at=routed):
                return routed
            self._dirty.set()
            async with asyncio.timeout_at(deadline):
                await self._pass_done.wait()

    def forget(self, pod_uid: str) -> None:
        """The pod is gone: its routes go at the next pass."""
        keys = [k for k in self._edges if k[0] == pod_uid]
        for key in keys:
            del self._edges[key]
            self._providers.pop(key, None)
        if keys:
            self._replan()

    def _replan(self) -> None:
        routes, exhausted = self.planner.plan(self._edges.values(),
                                              release=self.synced.is_set())
        for problem in exhausted:
            log.warning("gateway route not allocated", extra=kv(pod=problem.key[0],
                                                               port=problem.key[1],
                                                               error=str(problem)))
        self._routes = routes
        self._dirty.set()
        if self.metrics is not None:
            self.metrics.gateway_routes.set(len(routes))
            self.metrics.gateway_ports_exhausted.set(len(exhausted))

    def set_instances(self, instances: Sequence[GatewayInstance]) -> None:
        """The gateway pods now (discovery): an address kept keeps its instance (and health);
        a new one is programmed by the next pass; replicas of a gone one are re-homed."""
        by_address = {i.address: i for i in self.instances}
        new = []
        for i in instances:
            if i.address not in by_address:
                i.healthy = False  # a home for replicas once a pass has programmed it
                self._programmed.pop(i.address, None)  # a new pod at an old address: empty
            new.append(by_address.get(i.address, i))
        if [i.address for i in new] == [i.address for i in self.instances]:
            return
        kept = {i.address for i in new}
        for address in [a for a in self._programmed if a not in kept]:
            del self._programmed[address]
        self.instances = new
        self._dirty.set()
        self.on_change()

    def mark_synced(self) -> None:
        """Every route needed has been asked for: what was not may be removed from now on."""
        self.synced.set()
        self._replan()

    def _home(self, pod_uid: str) -> GatewayInstance | None:
        """One gateway pod per replica: a stable pick among the healthy ones (rendezvous
        hashing, so a gateway pod that goes unhealthy moves only its own replicas)."""
        healthy = [i for i in self.instances if i.healthy]
        if not healthy:
            return None
        return max(healthy, key=lambda i: hashlib.sha256(
            f"{pod_uid}\0{i.address}".encode()).digest())

    # ---- programming the gateways -------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile every gateway pod now, on each plan change and every ``interval``."""
        while True:
            self._dirty.clear()
            await self.reconcile_once()
            try:
                async with asyncio.timeout(self.interval):
                    await self._dirty.wait()
            except TimeoutError:
                pass

    async def reconcile_once(self) -> None:
        if not self._adopted:
            await self._adopt()
        planned = dict(self._routes)  # the plan this pass programs (it may change meanwhile)
        desired = await self._desired(planned)
        changed = False
        served = {p.route.edge.key: planned[p.route.edge.key] for p in desired}
        moved: set[str] = set()  # pod UIDs whose routes some gateway pod serves differently now
        for instance in self.instances:
            before = self._programmed.get(instance.address, {})
            try:
                result = await reconcile(client=instance.client, layout=self.layout,
                                         desired=desired, prune=self.synced.is_set())
                ok, error = True, None
                self._programmed[instance.address] = {**result.kept, **served}
                lost = [k for k in result.filled if before.get(k) == served.get(k)]
                if lost:  # it served them at its last pass: its memory is gone (restarted)
                    log.warning("gateway pod had lost routes it served; re-programmed",
                                extra=kv(gateway=instance.address, routes=len(lost)))
            except GatewayError as exc:
                ok, error = False, str(exc)
                self._programmed.pop(instance.address, None)
            after = self._programmed.get(instance.address, {})
            moved.update(k[0] for k in before.keys() | after.keys()
                         if before.get(k) != after.get(k))
            if ok != instance.healthy:
                changed = True
                log.log(logging.INFO if ok else logging.WARNING,
                        "gateway pod healthy" if ok else "gateway pod unreachable; re-homing",
                        extra=kv(gateway=instance.address, error=error))
            instance.healthy, instance.last_error = ok, error
            if self.metrics is not None:
                self.metrics.gateway_passes.labels("ok" if ok else "error").inc()
        self.passes += 1
        if self.metrics is not None:
            self.metrics.gateway_pods_healthy.set(sum(i.healthy for i in self.instances))
        if changed:
            self.on_change()
        if moved:
            self.on_programmed(frozenset(moved))
        self.first_pass.set()
        done, self._pass_done = self._pass_done, asyncio.Event()
        done.set()

    async def _adopt(self) -> None:
        """A restarted provider keeps the ports a live gateway serves (its routes map)."""
        for instance in self.instances:
            try:
                live = await instance.client.show_map(self.layout.routes_map)
            except GatewayError:
                continue
            found: dict[RouteKey, int] = {}
            for backend, value in live.items():
                uid, _, port = value.rpartition("/")
                if backend.startswith("gw") and backend[2:].isdigit() and port.isdigit():
                    found[(uid, int(port))] = int(backend[2:])
            self.planner.adopt(found)
            self._adopted = True
            if self._edges:
                self._replan()
            return

    async def _desired(self, routes: dict[RouteKey, GatewayRoute]) -> list[Programmed]:
        out: list[Programmed] = []
        for key, route in sorted(routes.items()):
            edge = route.edge
            try:
                dial_host, dial_port = await self.dial(edge.host, edge.port)
            except Exception as exc:  # unresolvable or refused: that route is not served
                log.warning("gateway edge not dialable", extra=kv(pod=key[0], port=key[1],
                                                                 host=edge.host, error=str(exc)))
                continue
            edge = dataclasses.replace(edge, dial_host=dial_host, dial_port=dial_port)
            key_value = self.edge_key(self._providers.get(key, "")) if edge.auth_header else None
            out.append(Programmed(route=GatewayRoute(port=route.port, edge=edge),
                                  api_key=key_value))
        return out

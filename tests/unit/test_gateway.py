"""The gateway's planner (pure) and its Runtime API reconcile against a real HAProxy process.

Why it exists: hostname-only cloud replicas (SaladCloud, RunPod's proxy) are served through a
stock HAProxy the provider programs at runtime. These tests pin down the stable port plan, and,
with a real ``haproxy`` on loopback and a real TLS edge whose certificate a test CA signed, that a
reconcile pass makes HAProxy originate verified TLS with the edge's SNI and ``Host``, adds the
edge key (and drops a client's own copy), removes what is no longer planned, re-programs a
restarted HAProxy, and refuses an edge whose certificate does not match.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from vkprovider.gateway.plan import EdgeTarget, Planner, server_name
from vkprovider.gateway.reconcile import Programmed, reconcile
from vkprovider.gateway.runtime import GatewayError, RuntimeClient, RuntimeUnavailable
from vkprovider.testing.haproxy import HAProxyProcess
from vkprovider.testing.pki import CertificateAuthority

EDGE_NAME = "abc-8000.edge.example.com"
KEY = "k3y-not-for-logs"
STREAM_EVENTS = 8  # 8 events 0.4 s apart: a response that takes ~3 s to finish


def edge(uid: str, port: int = 8000, *, host: str = EDGE_NAME, dial_port: int = 443,
         auth: str | None = None) -> EdgeTarget:
    return EdgeTarget(pod_uid=uid, container_port=port, host=host, port=443,
                      dial_host="127.0.0.1", dial_port=dial_port, auth_header=auth)


# ---- the planner -----------------------------------------------------------------------------


def test_plan_allocates_one_port_per_replica_port_and_keeps_it() -> None:
    planner = Planner(first_port=20000, count=4)
    routes, exhausted = planner.plan([edge("b"), edge("a"), edge("a", 9000)])
    assert not exhausted
    assert {k: r.port for k, r in routes.items()} == {
        ("a", 8000): 20000, ("a", 9000): 20001, ("b", 8000): 20002}
    # a new replica and a gone one: the others keep their ports, the gone one is not reused
    routes, _ = planner.plan([edge("b"), edge("a", 9000), edge("c")])
    assert {k: r.port for k, r in routes.items()} == {
        ("a", 9000): 20001, ("b", 8000): 20002, ("c", 8000): 20003}
    # range full: the freed port comes back, and then none is left
    routes, exhausted = planner.plan([edge("b"), edge("a", 9000), edge("c"), edge("d"),
                                      edge("e")])
    assert routes[("d", 8000)].port == 20000
    assert [e.key for e in exhausted] == [("e", 8000)]
    assert "gateway.port_count" in str(exhausted[0])


def test_plan_adopts_allocations_of_a_previous_provider() -> None:
    planner = Planner(first_port=20000, count=8)
    planner.adopt({("z", 8000): 20005, ("y", 8000): 20002, ("x", 8000): 99})  # 99: not ours
    routes, _ = planner.plan([edge("z"), edge("y"), edge("x")])
    assert {k: r.port for k, r in routes.items()} == {
        ("z", 8000): 20005, ("y", 8000): 20002, ("x", 8000): 20006}


def test_server_name_changes_with_what_is_programmed() -> None:
    a = edge("a")
    assert server_name(a) == server_name(edge("a"))
    assert server_name(a) != server_name(edge("a", host="other.example.com"))
    assert server_name(a) != server_name(edge("a", dial_port=444))


# ---- a real HAProxy ----------------------------------------------------------------------------


class Edge:
    """A TLS edge on loopback that answers with what it received (SNI, Host, headers)."""

    def __init__(self, *, cert: Path, key: Path, alpn: list[str] | None = None) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        if alpn:  # what the edge offers (a real edge offers h2 too)
            self.context.set_alpn_protocols(alpn)
        self.sni: list[str | None] = []
        self.context.sni_callback = lambda _s, name, _c: self.sni.append(name)  # type: ignore[assignment,func-returns-value]
        self.server: asyncio.Server | None = None
        self.port = 0
        self.connections = 0  # TLS connections accepted

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0,
                                                 ssl=self.context)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                path = lines[0].split()[1]
                if path.split("?")[0] == "/stream":  # SSE, chunked, one event every 0.4 s
                    query = dict(q.split("=") for q in path.partition("?")[2].split("&") if q)
                    await self._stream(writer, events=int(query.get("events", STREAM_EVENTS)),
                                       every=float(query.get("every", 0.4)))
                    continue
                if headers.get("upgrade", "").lower() == "websocket":
                    await self._upgrade(reader, writer)
                    return
                body = json.dumps({"path": path, "headers": headers}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, *, events: int, every: float) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for i in range(events):
            event = f"data: token {i}\n\n".encode()
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
            await asyncio.sleep(every)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _upgrade(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A WebSocket-style upgrade, then the raw bytes echoed (HAProxy tunnels them as
        they are: framing is the endpoints' business)."""
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                     b"connection: upgrade\r\n"
                     b"sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")  # RFC 6455
        await writer.drain()
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest_asyncio.fixture(name="lab")
async def gateway_lab(
        tmp_path: Path) -> AsyncIterator[tuple[HAProxyProcess, Edge, CertificateAuthority]]:
    """A TLS edge with a test CA's wildcard certificate, and a real HAProxy gateway."""
    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="edge-test-ca")
    pair = ca.issue(stem="edge", common_name="*.edge.example.com", server=True,
                    hosts=("*.edge.example.com",))
    edge_server = Edge(cert=pair.cert, key=pair.key)
    await edge_server.start()
    gateway = HAProxyProcess(work_dir=tmp_path / "gw", ca_file=ca.cert_path, count=4)
    await gateway.start()
    try:
        yield gateway, edge_server, ca
    finally:
        gateway.stop()
        edge_server.close()


async def get(url: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        return await http.get(url, **kwargs)


async def test_reconcile_programs_verified_tls_host_and_key(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    gateway, edge_server, _ = lab
    planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
    routes, _ = planner.plan([edge("pod-a", dial_port=edge_server.port, auth="Salad-Api-Key")])
    route = routes[("pod-a", 8000)]
    result = await reconcile(client=gateway.client, layout=gateway.layout,
                             desired=[Programmed(route=route, api_key=KEY)])
    assert result.added == 1
    answer = await get(gateway.url(route.port) + "/v1/models",
                       headers={"Salad-Api-Key": "client-supplied", "Host": "evil.example"})
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert seen["path"] == "/v1/models"
    assert seen["headers"]["host"] == EDGE_NAME
    assert seen["headers"]["salad-api-key"] == KEY  # the gateway's, not the client's
    assert edge_server.sni[-1] == EDGE_NAME
    assert KEY not in answer.text.replace(KEY, "", 1)  # once: the edge echoes what it got
    # a second pass over an up-to-date gateway changes nothing
    again = await reconcile(client=gateway.client, layout=gateway.layout,
                            desired=[Programmed(route=route, api_key=KEY)])
    assert not again.changed
    assert KEY not in gateway.log_path.read_text(errors="replace")


async def test_reconcile_removes_unplanned_and_reprograms_a_restarted_haproxy(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    gateway, edge_server, _ = lab
    planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
    routes, _ = planner.plan([edge("pod-a", dial_port=edge_server.port),
                              edge("pod-b", dial_port=edge_server.port)])
    desired = [Programmed(route=r) for r in routes.values()]
    await reconcile(client=gateway.client, layout=gateway.layout, desired=desired)
    a, b = routes[("pod-a", 8000)], routes[("pod-b", 8000)]
    assert (await get(gateway.url(b.port))).status_code == 200
    # pod-b goes: its listener stops serving (no server: HAProxy answers 503)
    result = await reconcile(client=gateway.client, layout=gateway.layout,
                             desired=[Programmed(route=a)])
    assert result.deleted == 1
    assert (await get(gateway.url(b.port))).status_code == 503
    assert not (await gateway.client.show_map(gateway.layout.hosts_map)).get(b.backend)
    # the gateway restarts with empty memory; one pass serves pod-a again
    await gateway.restart()
    assert (await get(gateway.url(a.port))).status_code == 503
    result = await reconcile(client=gateway.client, layout=gateway.layout,
                             desired=[Programmed(route=a)])
    assert result.added == 1
    answer = await get(gateway.url(a.port))
    assert answer.status_code == 200
    assert answer.json()["headers"]["host"] == EDGE_NAME
    routes_map = await gateway.client.show_map(gateway.layout.routes_map)
    assert routes_map == {a.backend: "pod-a/8000"}


class _Recording(RuntimeClient):
    """The real Runtime API client, remembering the commands it sent (their first words)."""

    def __init__(self, address: str) -> None:
        super().__init__(address=address)
        self.sent: list[str] = []

    async def command(self, line: str) -> str:
        self.sent.append(" ".join(line.split()[:3]))
        return await super().command(line)


async def test_a_replaced_server_is_deleted_only_once_its_successor_serves(
        tmp_path: Path, lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    """An edge that moved (its name resolves elsewhere now) gets a new server: the listener is
    never without one, so no request in between gets HAProxy's 503."""
    gateway, edge_server, ca = lab
    pair = ca.issue(stem="moved", common_name="*.edge.example.com", server=True,
                    hosts=("*.edge.example.com",))
    moved = Edge(cert=pair.cert, key=pair.key)
    await moved.start()
    try:
        client = _Recording(str(gateway.layout.socket))
        planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
        old, _ = planner.plan([edge("pod-a", dial_port=edge_server.port)])
        await reconcile(client=client, layout=gateway.layout,
                        desired=[Programmed(route=r) for r in old.values()])
        new, _ = planner.plan([edge("pod-a", dial_port=moved.port)])
        (route,) = new.values()
        client.sent.clear()
        result = await reconcile(client=client, layout=gateway.layout,
                                 desired=[Programmed(route=route)])
        assert (result.added, result.deleted) == (1, 1)
        backend = route.backend
        assert client.sent.index(f"add server {backend}/{route.server}") < client.sent.index(
            f"set server {backend}/{old[('pod-a', 8000)].server}"), client.sent
        assert (await get(gateway.url(route.port))).status_code == 200
        assert moved.connections >= 1
        assert [s.name for s in await gateway.client.servers()
                if s.backend == backend] == [route.server]
    finally:
        moved.close()


async def test_edge_with_a_certificate_for_another_name_is_refused(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    gateway, edge_server, _ = lab
    planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
    routes, _ = planner.plan([edge("pod-a", host="abc.elsewhere.example.org",
                                   dial_port=edge_server.port)])
    route = routes[("pod-a", 8000)]
    await reconcile(client=gateway.client, layout=gateway.layout,
                    desired=[Programmed(route=route)])
    assert (await get(gateway.url(route.port))).status_code == 503  # TLS verify failed


async def test_runtime_client_errors_are_ours_and_never_carry_the_key(tmp_path: Path,
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    gateway, _, _ = lab
    with pytest.raises(RuntimeUnavailable):
        await RuntimeClient(address=str(tmp_path / "nothing.sock")).info()
    with pytest.raises(GatewayError) as err:
        await gateway.client.set_map(gateway.layout.keys_map("Salad-Api-Key"), "gw1",
                                     "secret value; show info", secret=True)
    assert "secret" not in str(err.value).replace("(a secret value)", "")


# ---- EndpointSlices through the gateway (pure: the router answers without I/O) ----------------


def _router(mode: str = "auto", *, instances: int = 1) -> Any:
    from vkprovider.gateway.controller import GatewayController, GatewayInstance
    from vkprovider.gateway.haproxycfg import GatewayLayout

    async def dial(host: str, port: int) -> tuple[str, int]:
        return host, port

    layout = GatewayLayout(bind_host="0.0.0.0", first_port=20000, count=16,
                           socket=Path("/nonexistent/rt.sock"), ca_file=Path("/nonexistent/ca"),
                           map_dir=Path("/nonexistent/maps"))
    return GatewayController(
        layout=layout, dial=dial, traffic_of=lambda _uid: mode,  # type: ignore[arg-type,return-value]
        instances=[GatewayInstance(address=f"10.0.9.{i + 1}",
                                   client=RuntimeClient(address="/nonexistent/rt.sock"))
                   for i in range(instances)])


def _hostname_pod(uid: str = "p1") -> Any:
    from vkprovider.node.endpointslices import EndpointTarget, PodRecord
    return PodRecord(namespace="ns", name=f"pod-{uid}", uid=uid, labels=(("app", "web"),),
                     container_ports=(("main", "http", 8080, "TCP"),),
                     endpoints=(EndpointTarget(container_port=8080, protocol="TCP",
                                               host=f"{uid}-8080.edge.example.com", port=443,
                                               kind="hostname", ready=True, serving=True,
                                               terminating=False, provider="salad",
                                               edge_auth="Salad-Api-Key"),))


SERVICE = {"metadata": {"name": "web", "namespace": "ns", "uid": "svc"},
           "spec": {"selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


@pytest.mark.parametrize("mode", ["auto", "gateway"])
def test_a_hostname_only_replica_is_the_gateway_pods_address_and_port(mode: str) -> None:
    """The route is allocated at once, but no pass has programmed it yet (this router's
    gateway is never reached): the endpoint is there, neither ready nor serving, even for a
    Service that publishes not-ready addresses (the gateway's listener would answer 503)."""
    from vkprovider.node.endpointslices import build_slices
    router = _router(mode)
    for publish_not_ready in (False, True):
        service = {**SERVICE, "spec": {**SERVICE["spec"],
                                       "publishNotReadyAddresses": publish_not_ready}}
        slices, unroutable = build_slices(service=service, node="vk", pods=[_hostname_pod()],
                                          gateway=router)
        assert unroutable == []
        (body,) = slices.values()
        assert body["addressType"] == "IPv4"
        assert body["ports"] == [{"name": "http", "protocol": "TCP", "port": 20000}]
        (endpoint,) = body["endpoints"]
        assert endpoint["addresses"] == ["10.0.9.1"]
        assert endpoint["conditions"] == {"ready": False, "serving": False,
                                          "terminating": False}
    assert endpoint["targetRef"]["uid"] == "p1"
    route = router._routes[("p1", 8080)]
    assert (route.edge.host, route.edge.port, route.edge.auth_header) == (
        "p1-8080.edge.example.com", 443, "Salad-Api-Key")


def _drain_queue(ctl: Any) -> Any:
    """Reconcile every Service the EndpointSlice controller has queued (its workers' job)."""

    async def run() -> None:
        while len(ctl.queue):
            key = await ctl.queue.get()
            try:
                await ctl.reconcile(key)
            finally:
                ctl.queue.done(key)

    return run()


async def test_a_gateway_endpoint_turns_ready_only_once_a_pass_programmed_its_route(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority],
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 38's gateway must lose no request to a route it has not programmed: the slice
    holds the replica's gateway endpoint not ready (HAProxy answers 503 there) until a pass has
    programmed exactly that route into that gateway pod; the pass then tells the EndpointSlice
    controller, which re-syncs that replica's Service with no other event (no polling). A
    restarted gateway keeps its endpoints while the next pass re-programs it (no slice churn)."""
    from test_endpointslices import FakeAPI

    from vkprovider.gateway.controller import GatewayController, GatewayInstance
    from vkprovider.node.endpointslices import EndpointSliceController

    gateway, edge_server, _ = lab

    async def dial(host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", edge_server.port

    router = GatewayController(layout=gateway.layout, dial=dial, instances=[
        GatewayInstance(address="10.0.9.1", client=gateway.client)])
    router.mark_synced()
    await router.reconcile_once()  # a healthy gateway pod, nothing to serve yet
    api = FakeAPI()
    slices = EndpointSliceController(client=api, node="vk",  # type: ignore[arg-type]
                                     gateway=router, batch_seconds=0)
    slices.running = True
    told: list[frozenset[str]] = []
    router.on_programmed = lambda uids: (told.append(uids), slices.resync(uids))[-1]
    slices.services.store["ns/web"] = SERVICE
    slices._on_service("ADDED", SERVICE)
    pod = _hostname_pod("p1")
    slices.set_pod(namespace=pod.namespace, name=pod.name, uid=pod.uid, labels=pod.label_map,
                   container_ports=pod.container_ports, endpoints=pod.endpoints)
    await _drain_queue(slices)

    def endpoint() -> tuple[str, int, dict[str, Any]]:
        [stored] = api.objects.values()
        [ep] = stored["endpoints"]
        return ep["addresses"][0], stored["ports"][0]["port"], ep["conditions"]

    address, port, conditions = endpoint()
    assert address == "10.0.9.1"
    assert (conditions["ready"], conditions["serving"]) == (False, False)
    assert (await get(gateway.url(port))).status_code == 503, "not programmed: why not ready"

    await router.reconcile_once()  # programs the route, then tells the slices
    assert told == [frozenset({"p1"})]
    assert len(slices.queue) == 1, "the pass queued the replica's Service"
    await _drain_queue(slices)
    assert endpoint() == (address, port, {"ready": True, "serving": True,
                                          "terminating": False})
    assert (await get(gateway.url(port))).status_code == 200

    # a restarted gateway (empty memory): its endpoints stay published, and the next pass
    # (at most gateway.reconcile_seconds later) re-programs it; no slice write either way
    writes = len(api.log)
    await gateway.restart()
    assert (await get(gateway.url(port))).status_code == 503
    with caplog.at_level("WARNING", logger="vkprovider.gateway.controller"):
        await router.reconcile_once()
    assert "gateway pod had lost routes it served; re-programmed" in caplog.messages
    assert (await get(gateway.url(port))).status_code == 200
    assert told == [frozenset({"p1"})] and len(slices.queue) == 0 and len(api.log) == writes


def test_a_rehomed_replica_is_ready_at_once_at_a_home_that_already_serves_its_route() -> None:
    """Every pass programs every route into every gateway pod, so when a replica's gateway pod
    goes unready its new home already serves the route: the endpoint moves there ready. A
    route changed since the last pass (another edge) is not served as planned anywhere yet."""
    router = _router(instances=2)
    pods = [_hostname_pod(f"p{i}") for i in range(8)]
    routes = {p.uid: router.route(pod_uid=p.uid, target=p.endpoints[0]) for p in pods}
    # what a successful pass over both gateway pods records (this router reaches none)
    router._programmed = {i.address: dict(router._routes) for i in router.instances}
    moved = next(p for p in pods if routes[p.uid][0] == "10.0.9.1")
    router.set_instances([router.instances[1]])  # 10.0.9.1 is no longer Ready
    home = router.route(pod_uid=moved.uid, target=moved.endpoints[0])
    assert home == ("10.0.9.2", routes[moved.uid][1])
    assert router.is_programmed(pod_uid=moved.uid, container_port=8080, at=home)
    assert "10.0.9.1" not in router._programmed  # a pod back at that address starts empty
    other = dataclasses.replace(moved.endpoints[0], host="moved.edge.example.com")
    assert router.route(pod_uid=moved.uid, target=other) == home
    assert not router.is_programmed(pod_uid=moved.uid, container_port=8080, at=home)


def test_traffic_direct_keeps_the_not_routable_warning() -> None:
    from vkprovider.node.endpointslices import build_slices
    slices, unroutable = build_slices(service=SERVICE, node="vk", pods=[_hostname_pod()],
                                      gateway=_router("direct"))
    assert slices == {}
    assert [(u.why, u.host) for u in unroutable] == [("hostname", "p1-8080.edge.example.com")]


def test_replicas_are_rehomed_when_their_gateway_pod_is_unhealthy() -> None:
    router = _router(instances=2)
    pods = [_hostname_pod(f"p{i}") for i in range(8)]
    homes = {p.uid: router.route(pod_uid=p.uid, target=p.endpoints[0])[0] for p in pods}
    assert set(homes.values()) == {"10.0.9.1", "10.0.9.2"}  # spread over both
    router.instances[0].healthy = False
    for p in pods:
        assert router.route(pod_uid=p.uid, target=p.endpoints[0])[0] == "10.0.9.2"
    router.instances[1].healthy = False
    assert router.route(pod_uid="p0", target=pods[0].endpoints[0]) is None
    router.instances[1].healthy = True
    router.instances[0].healthy = True
    assert {p.uid: router.route(pod_uid=p.uid, target=p.endpoints[0])[0] for p in pods} == homes


class _Told:
    """An EndpointTarget-like edge request, as the EndpointSlice controller passes one."""

    def __init__(self, host: str, port: int) -> None:
        self.container_port, self.host, self.port = 8000, host, port
        self.provider, self.edge_auth, self.kind = "cloud", None, "hostname"


async def test_a_restarted_provider_keeps_the_live_gateway_and_its_ports(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    from vkprovider.gateway.controller import GatewayController, GatewayInstance

    gateway, edge_server, _ = lab

    async def dial(host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", edge_server.port  # the lab's address map, in one line

    def controller() -> GatewayController:
        return GatewayController(layout=gateway.layout, dial=dial, instances=[
            GatewayInstance(address="10.0.9.1", client=gateway.client)])

    first = controller()
    first.mark_synced()
    ports = {uid: first.route(pod_uid=uid, target=_Told(EDGE_NAME, 443)) for uid in ("a", "b")}
    await first.reconcile_once()
    assert (await get(gateway.url(ports["b"][1]))).status_code == 200

    second = controller()  # a new provider process: nothing told yet, not synced
    await second.reconcile_once()
    assert (await get(gateway.url(ports["b"][1]))).status_code == 200, "nothing removed"
    # told in another order, each replica gets the port the live gateway serves it on
    assert second.route(pod_uid="b", target=_Told(EDGE_NAME, 443)) == ports["b"]
    assert second.route(pod_uid="a", target=_Told(EDGE_NAME, 443)) == ports["a"]
    second.mark_synced()
    second.forget("a")
    await second.reconcile_once()
    assert (await get(gateway.url(ports["a"][1]))).status_code == 503  # pruned once synced
    assert (await get(gateway.url(ports["b"][1]))).status_code == 200


async def test_a_restarted_provider_counts_the_routes_a_live_gateway_serves_as_programmed(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    """A new provider process must not turn the live gateway's endpoints not ready while it
    learns the routes again: its first pass (before any replica is told) records the routes the
    gateway serves (a server in service, a routes map entry), so a replica told afterwards at
    its adopted port is programmed at once; the next pass that plans it confirms it. A route
    the gateway does not serve is not."""
    from vkprovider.gateway.controller import GatewayController, GatewayInstance

    gateway, edge_server, _ = lab

    async def dial(host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", edge_server.port

    def controller() -> GatewayController:
        return GatewayController(layout=gateway.layout, dial=dial, instances=[
            GatewayInstance(address="10.0.9.1", client=gateway.client)])

    first = controller()
    first.mark_synced()
    ports = {uid: first.route(pod_uid=uid, target=_Told(EDGE_NAME, 443)) for uid in ("a", "b")}
    await first.reconcile_once()

    second = controller()  # the provider restarted: nothing told yet, not synced
    assert not second.first_pass.is_set()
    await second.reconcile_once()
    assert second.first_pass.is_set()
    for uid in ("b", "a"):
        routed = second.route(pod_uid=uid, target=_Told(EDGE_NAME, 443))
        assert routed == ports[uid]
        assert second.is_programmed(pod_uid=uid, container_port=8000, at=routed)
    new = second.route(pod_uid="c", target=_Told(EDGE_NAME, 443))
    assert new is not None and not second.is_programmed(pod_uid="c", container_port=8000,
                                                        at=new)
    second.mark_synced()
    await second.reconcile_once()
    for uid in ("a", "b", "c"):
        routed = second.route(pod_uid=uid, target=_Told(EDGE_NAME, 443))
        assert routed is not None
        assert second.is_programmed(pod_uid=uid, container_port=8000, at=routed)
        assert (await get(gateway.url(routed[1]))).status_code == 200


async def test_an_unreachable_gateway_pod_is_unhealthy_counted_and_its_replicas_rehomed(
        tmp_path: Path, lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    from vkprovider.gateway.controller import GatewayController, GatewayInstance
    from vkprovider.metrics import Metrics

    gateway, edge_server, _ = lab
    metrics = Metrics()

    async def dial(host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", edge_server.port

    ctl = GatewayController(layout=gateway.layout, dial=dial, metrics=metrics, instances=[
        GatewayInstance(address="10.0.9.1", client=gateway.client),
        GatewayInstance(address="10.0.9.2",
                        client=RuntimeClient(address=str(tmp_path / "gone.sock")))])
    changes: list[int] = []
    ctl.on_change = lambda: changes.append(1)
    ctl.mark_synced()
    homes = {uid: ctl.route(pod_uid=uid, target=_Told(EDGE_NAME, 443))
             for uid in ("a", "b", "e", "f")}  # the lab gateway has 4 ports
    assert {h[0] for h in homes.values() if h} == {"10.0.9.1", "10.0.9.2"}
    await ctl.reconcile_once()
    assert changes == [1]  # the slices are told to re-home
    for uid in homes:
        address, port = ctl.route(pod_uid=uid, target=_Told(EDGE_NAME, 443))
        assert address == "10.0.9.1"
        assert (await get(gateway.url(port))).status_code == 200  # all programmed there
    value = metrics.registry.get_sample_value
    assert value("vkprovider_gateway_pods_healthy") == 1
    assert value("vkprovider_gateway_routes") == 4
    assert value("vkprovider_gateway_passes_total", {"result": "error"}) == 1
    assert value("vkprovider_gateway_passes_total", {"result": "ok"}) == 1


async def test_the_runtime_api_over_the_network_wants_the_providers_client_certificate(
        tmp_path: Path) -> None:
    import socket
    import ssl as ssl_

    from vkprovider.gateway.haproxycfg import RuntimeTLS

    (tmp_path / "pki").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "pki", name="gateway-runtime-ca")
    server = ca.issue(stem="gateway", common_name="gateway", server=True, hosts=("gateway",))
    client = ca.issue(stem="provider", common_name="vkprovider", client=True)
    pem = tmp_path / "pki" / "gateway.pem"
    pem.write_bytes(server.cert.read_bytes() + server.key.read_bytes())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = HAProxyProcess(work_dir=tmp_path / "gw", ca_file=ca.cert_path, runtime_tls=RuntimeTLS(
        bind=f"127.0.0.1:{port}", server_pem=pem, client_ca=ca.cert_path))
    await gateway.start()
    try:
        trusted = ssl_.create_default_context(cafile=str(ca.cert_path))
        with_cert = ssl_.create_default_context(cafile=str(ca.cert_path))
        with_cert.load_cert_chain(client.cert, client.key)
        ok = RuntimeClient(address=f"tls://127.0.0.1:{port}", tls=with_cert,
                           server_name="gateway")
        assert (await ok.info())["Name"] == "HAProxy"
        assert {s.backend for s in await ok.servers()} == {"ca-store", "runtime-api"}
        with pytest.raises(RuntimeUnavailable):  # no client certificate: refused
            await RuntimeClient(address=f"tls://127.0.0.1:{port}", tls=trusted,
                                server_name="gateway").info()
        with pytest.raises(GatewayError):
            RuntimeClient(address=f"tls://127.0.0.1:{port}")
    finally:
        gateway.stop()


def test_gateway_settings_name_the_field_at_fault() -> None:
    from vkprovider.config import load_settings
    from vkprovider.errors import ConfigError

    ok = load_settings(None, gateway={"instances": [{"address": "10.0.0.9",
                                                     "runtime": "/run/haproxy.sock"}]})
    assert ok.gateway.enabled and ok.gateway.first_port == 20000
    assert not load_settings(None).gateway.enabled
    with pytest.raises(ConfigError, match=r"gateway.*runtime_tls"):
        load_settings(None, gateway={"instances": [{"address": "10.0.0.9",
                                                    "runtime": "tls://10.0.0.9:9999"}]})
    with pytest.raises(ConfigError, match=r"gateway\.port_count"):
        load_settings(None, gateway={"port_count": 0})


def test_gateway_config_prints_a_configuration_haproxy_accepts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    import yaml

    from vkprovider.cli import main

    (tmp_path / "pki").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "pki", name="gw-config-ca")
    server = ca.issue(stem="gateway", common_name="gateway", server=True, hosts=("gateway",))
    pem = tmp_path / "pki" / "gateway.pem"
    pem.write_bytes(server.cert.read_bytes() + server.key.read_bytes())
    maps = tmp_path / "maps"
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"gateway": {
        "first_port": 30000, "port_count": 3, "ca_file": str(ca.cert_path),
        "map_dir": str(maps), "auth_headers": ["Salad-Api-Key", "X-Edge-Key"]}}))
    assert main(["gateway-config", "--config", str(settings), "--bind", "127.0.0.1",
                 "--socket", str(tmp_path / "rt.sock"), "--runtime-bind", "127.0.0.1:29999",
                 "--runtime-pem", str(pem), "--runtime-client-ca", str(ca.cert_path)]) == 0
    text = capsys.readouterr().out
    assert [line.split()[1] for line in text.splitlines() if line.startswith("listen gw")] == [
        "gw30000", "gw30001", "gw30002"]
    assert "http-request del-header X-Edge-Key" in text
    assert "verify required" in text.split("listen runtime-api")[1]
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    maps.mkdir()
    for name in ("hosts.map", "routes.map", "keys-salad-api-key.map", "keys-x-edge-key.map"):
        (maps / name).touch()
    check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr


async def test_streamed_responses_and_upgraded_connections_pass_through(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    gateway, edge_server, _ = lab
    planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
    routes, _ = planner.plan([edge("pod-a", dial_port=edge_server.port)])
    route = routes[("pod-a", 8000)]
    await reconcile(client=gateway.client, layout=gateway.layout,
                    desired=[Programmed(route=route)])
    # SSE over chunked encoding: every event arrives, each as it is sent (not buffered whole)
    arrivals: list[float] = []
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http, \
            http.stream("GET", gateway.url(route.port) + "/stream") as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        events = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
                arrivals.append(asyncio.get_running_loop().time())
    assert events == [f"data: token {i}" for i in range(STREAM_EVENTS)]
    assert arrivals[-1] > arrivals[0], "streamed as sent, not delivered in one piece"
    # an upgraded connection (WebSocket) is tunnelled both ways
    reader, writer = await asyncio.open_connection("127.0.0.1", route.port)
    writer.write(b"GET /ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
                 b"connection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"sec-websocket-version: 13\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    for payload in (b"\x81\x05hello", b"\x81\x05again"):
        writer.write(payload)
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(len(payload)), 10) == payload
    writer.close()


def test_only_ready_gateway_pods_with_an_ip_and_not_deleting_are_homes() -> None:
    from vkprovider.gateway.discovery import ready_addresses

    def pod(ip: str | None, ready: str = "True", deleting: bool = False) -> dict[str, Any]:
        return {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {},
                "status": {**({"podIP": ip} if ip else {}),
                           "conditions": [{"type": "Ready", "status": ready}]}}

    assert ready_addresses([pod("10.0.0.2"), pod("10.0.0.1"), pod(None),
                            pod("10.0.0.3", ready="False"),
                            pod("10.0.0.4", deleting=True)]) == ["10.0.0.1", "10.0.0.2"]


def test_discovered_gateway_pods_are_homes_only_once_programmed() -> None:
    from vkprovider.gateway.controller import GatewayInstance

    router = _router(instances=1)
    told = _hostname_pod().endpoints[0]
    changes: list[int] = []
    router.on_change = lambda: changes.append(1)
    assert router.route(pod_uid="p1", target=told)[0] == "10.0.9.1"
    router.set_instances([GatewayInstance(address="10.0.9.7",
                                          client=RuntimeClient(address="/nonexistent"))])
    assert changes == [1]
    assert router.route(pod_uid="p1", target=told) is None  # not programmed yet
    router.instances[0].healthy = True  # what a successful pass does
    assert router.route(pod_uid="p1", target=told)[0] == "10.0.9.7"


async def test_the_gateway_serves_healthz_and_prometheus_metrics_for_its_pod(
        tmp_path: Path) -> None:
    import socket

    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="health-ca")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = HAProxyProcess(work_dir=tmp_path / "gw", ca_file=ca.cert_path,
                             health_bind=f"127.0.0.1:{port}")
    await gateway.start()
    try:
        assert (await get(f"http://127.0.0.1:{port}/healthz")).text == "ok"
        metrics = await get(f"http://127.0.0.1:{port}/metrics")
        assert metrics.status_code == 200
        assert "haproxy_process_start_time_seconds" in metrics.text
        assert f'proxy="gw{gateway.layout.first_port}"' in metrics.text  # per listener
        assert (await get(f"http://127.0.0.1:{port}/other")).status_code == 404
    finally:
        gateway.stop()


def test_a_hostname_the_address_filter_refuses_is_never_given_a_gateway_route() -> None:
    import dataclasses

    from vkprovider.node.endpointslices import build_slices

    router = _router()
    pod = _hostname_pod()
    inside = dataclasses.replace(pod, endpoints=(dataclasses.replace(
        pod.endpoints[0], host="api.default.svc.cluster.local"),))
    slices, unroutable = build_slices(service=SERVICE, node="vk", pods=[inside], gateway=router)
    assert slices == {} and [u.host for u in unroutable] == ["api.default.svc.cluster.local"]
    assert router._routes == {}  # no port allocated, nothing for HAProxy to dial


# ---- HTTP/2 and gRPC through the gateway ---------------------------------------------------


async def test_a_grpc_unary_call_passes_through_to_an_http2_edge(
        tmp_path: Path, lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    """A gRPC client speaks HTTP/2 in clear text to the gateway's listener (prior knowledge,
    as from a pod inside the cluster); HAProxy originates TLS to the edge, negotiates h2 by
    ALPN, and the call's trailers (grpc-status) come back. gRPC has no HTTP/1.1 form: an
    HTTP/1.1-only hop anywhere fails the call."""
    import grpc

    gateway, _, ca = lab
    pair = ca.issue(stem="grpc-edge", common_name="*.edge.example.com", server=True,
                    hosts=("*.edge.example.com",))
    seen: list[tuple[bytes, dict[str, str]]] = []

    async def say(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen.append((request, {k: str(v) for k, v in context.invocation_metadata() or ()}))
        return b"echo:" + request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "lab.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)})])
    credentials = grpc.ssl_server_credentials([(pair.key.read_bytes(), pair.cert.read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
        routes, _ = planner.plan([edge("pod-g", dial_port=port, auth="Salad-Api-Key")])
        route = routes[("pod-g", 8000)]
        await reconcile(client=gateway.client, layout=gateway.layout,
                        desired=[Programmed(route=route, api_key=KEY)])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{route.port}") as channel:
            call = channel.unary_unary("/lab.Echo/Say")
            answer = await asyncio.wait_for(call(b"hello", metadata=(("x-trace", "t1"),)), 10)
        assert answer == b"echo:hello"
        request, metadata = seen[-1]
        assert request == b"hello"
        assert metadata["x-trace"] == "t1"
        assert metadata["salad-api-key"] == KEY  # the edge key is added on HTTP/2 too
    finally:
        await server.stop(None)


# ---- drain: a terminating replica keeps its gateway route until the drain ends ------------------

# a 6 s streamed response: the drain's mechanics with a real HAProxy; the acceptance's 30 s
# stream runs through a real move-back in tests/e2e/test_gateway.py (one 30 s wait in the suite)
LONG_EVENTS, LONG_EVERY = 12, 0.5


class _SliceSink:
    """The EndpointSlice controller's two calls the replica tracker makes, with what it does
    for a hostname-only port (vkprovider/node/endpointslices.py: ``endpoints_for`` asks the
    gateway for a route; ``remove_pod`` makes the gateway forget the pod). The slices'
    API writes are the e2e tests' business; the endpoint's conditions are kept here."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.endpoints: dict[str, list[Any]] = {}
        self.records: dict[str, Any] = {}
        router.on_programmed = self.resync  # as the provider wires it (vkprovider/service.py)

    def set_pod(self, *, namespace: str, name: str, uid: str, labels: Any,
                container_ports: Any, endpoints: Any) -> None:
        from vkprovider.node.endpointslices import PodRecord
        self.records[uid] = PodRecord(namespace=namespace, name=name, uid=uid,
                                      labels=tuple(sorted(labels.items())),
                                      container_ports=tuple(container_ports),
                                      endpoints=tuple(endpoints))
        self.resync([uid])

    def resync(self, uids: Any) -> None:
        from vkprovider.node.endpointslices import endpoints_for
        service = {**SERVICE, "spec": {**SERVICE["spec"],
                                       "ports": [{"name": "http", "port": 80,
                                                  "targetPort": 8000}]}}
        for uid in uids:
            if uid in self.records:
                self.endpoints[uid], unroutable = endpoints_for(
                    service, self.records[uid], gateway=self.router)
                assert unroutable == []

    def remove_pod(self, *, uid: str) -> None:
        self.endpoints.pop(uid, None)
        self.records.pop(uid, None)
        self.router.forget(uid)


async def test_a_stream_finishes_through_the_gateway_while_its_replica_drains(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    """The provider's drain path (node/replicas.py) with a real HAProxy: when the pod is
    deleted its gateway endpoint turns terminating (kube-proxy stops choosing it while others
    are ready) but the gateway keeps the route in service, so a stream begun before the drain
    runs to its end and a request that still arrives (a kept-alive client, or kube-proxy's
    fallback to serving terminating endpoints when none is ready) is answered. Only when the
    drain is over is the route removed."""
    import time

    from providers.base import Instance, InstanceState, PublishedPort
    from vkprovider.gateway.controller import GatewayController, GatewayInstance
    from vkprovider.node.replicas import Replicas

    gateway, edge_server, _ = lab

    async def dial(host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", edge_server.port

    router = GatewayController(layout=gateway.layout, dial=dial, instances=[
        GatewayInstance(address="10.0.9.1", client=gateway.client)])
    router.mark_synced()
    sink = _SliceSink(router)
    skew = [0.0]  # the drain's clock: real time, moved on at the end instead of waiting
    replicas = Replicas(prober=None, sink=sink, clock=lambda: time.monotonic() + skew[0],
                        drain_seconds=LONG_EVENTS * LONG_EVERY + 30)
    pod: dict[str, Any] = {
        "metadata": {"name": "web-1", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "srv", "ports": [{"name": "http",
                                                           "containerPort": 8000}]}]}}
    instance = Instance(id="i-1", name="web-1", provider="salad", state=InstanceState.RUNNING,
                        published=(PublishedPort(container_port=8000, host=EDGE_NAME, port=443,
                                                 kind="hostname", scheme="https"),))
    replicas.running(uid="u1", pod=pod, provider="salad", instance=instance)
    await router.reconcile_once()
    (endpoint,) = sink.endpoints["u1"]
    assert endpoint.address == "10.0.9.1" and endpoint.ready and not endpoint.terminating
    port = endpoint.ports[0].port
    url = gateway.url(port)

    events: list[str] = []
    first = asyncio.Event()

    async def stream() -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=60) as http, \
                http.stream("GET", f"{url}/stream?events={LONG_EVENTS}&every={LONG_EVERY}"
                            ) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    first.set()

    streaming = asyncio.create_task(stream())
    await asyncio.wait_for(first.wait(), 10)
    # the pod is deleted (a move-back): its endpoint turns terminating, the drain starts
    deleting = {**pod, "metadata": {**pod["metadata"], "deletionGracePeriodSeconds": 120}}
    assert replicas.drain_left(uid="u1", pod=deleting, instance=instance, was_ready=True) > 0
    (endpoint,) = sink.endpoints["u1"]
    assert (endpoint.ready, endpoint.serving, endpoint.terminating) == (False, True, True)
    assert endpoint.ports[0].port == port  # the same gateway port: the same endpoint
    while not streaming.done():  # the controller's passes go on during the drain
        await router.reconcile_once()
        assert replicas.drain_left(uid="u1", pod=deleting, instance=instance,
                                   was_ready=True) > 0
        answer = await get(url + "/v1/models")
        assert answer.status_code == 200, "a request during the drain is still served"
        await asyncio.wait({streaming}, timeout=2)
    await streaming  # raises if the stream was cut
    assert events == [f"data: token {i}" for i in range(LONG_EVENTS)]
    assert replicas.is_draining("u1")
    # the drain is over: the pod controller forgets the replica; the next pass removes it
    skew[0] = LONG_EVENTS * LONG_EVERY + 60
    assert replicas.drain_left(uid="u1", pod=deleting, instance=instance, was_ready=True) == 0
    replicas.forget("u1")
    await router.reconcile_once()
    assert (await get(url + "/v1/models")).status_code == 503
    assert not [s for s in await gateway.client.servers() if s.backend.startswith("gw")]


async def test_a_websocket_to_an_edge_that_also_speaks_http2_is_relayed_over_http1(
        tmp_path: Path, lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    """Real edges offer h2 by ALPN; few support WebSocket over HTTP/2 (RFC 8441). The gateway
    offers only http/1.1 for a WebSocket's connection (``ws h1``), so the upgrade reaches an
    HTTP/1.1 edge listener (this one would not parse an HTTP/2 preface) and is tunnelled."""
    gateway, _, ca = lab
    pair = ca.issue(stem="h2-edge", common_name="*.edge.example.com", server=True,
                    hosts=("*.edge.example.com",))
    h2_edge = Edge(cert=pair.cert, key=pair.key, alpn=["h2", "http/1.1"])
    await h2_edge.start()
    try:
        planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
        routes, _ = planner.plan([edge("pod-w", dial_port=h2_edge.port)])
        route = routes[("pod-w", 8000)]
        await reconcile(client=gateway.client, layout=gateway.layout,
                        desired=[Programmed(route=route)])
        reader, writer = await asyncio.open_connection("127.0.0.1", route.port)
        writer.write(b"GET /ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
                     b"connection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"sec-websocket-version: 13\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101"), head
        writer.write(b"\x81\x05hello")
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(7), 10) == b"\x81\x05hello"
        writer.close()
    finally:
        h2_edge.close()


async def test_a_kept_alive_client_keeps_one_warm_tls_connection_to_the_edge(
        lab: tuple[HAProxyProcess, Edge, CertificateAuthority]) -> None:
    """Requests on one client connection share one TLS connection to the edge (no handshake
    per request: HAProxy 2.6 does not pool idle connections of runtime-added servers, so the
    gateway keeps each server connection with its client's)."""
    gateway, edge_server, _ = lab
    planner = Planner(first_port=gateway.layout.first_port, count=gateway.layout.count)
    routes, _ = planner.plan([edge("pod-k", dial_port=edge_server.port)])
    route = routes[("pod-k", 8000)]
    await reconcile(client=gateway.client, layout=gateway.layout,
                    desired=[Programmed(route=route)])
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        for _ in range(5):
            assert (await http.get(gateway.url(route.port) + "/v1/models")).status_code == 200
    assert edge_server.connections == 1

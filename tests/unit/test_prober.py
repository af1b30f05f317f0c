"""The prober against real loopback servers, reached through an address map (never directly)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from providers.addresses import refusal
from vkprovider.probing.dialing import AddressMap, Route, publish_routes
from vkprovider.probing.prober import Prober
from vkprovider.probing.spec import ContainerProbes, Probe, ProbeSpecError, parse_probes

VIRTUAL = "198.18.0.7"


class Server:
    """A tiny HTTP/1.0 server whose answer per path the test sets; counts requests."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        self.delay = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.hosts: list[str] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n")[0].decode()
            path = line.split(" ")[1]
            for h in head.split(b"\r\n")[1:]:
                if h.lower().startswith(b"host:"):
                    self.hosts.append(h[5:].strip().decode())
            self.hits[path] = self.hits.get(path, 0) + 1
            if self.delay:
                await asyncio.sleep(self.delay)
            status = self.status.get(path, 200)
            writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                         .encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.in_flight -= 1
            writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    s.server = await asyncio.start_server(s.handle, "127.0.0.1", 0)
    yield s
    s.server.close()


@pytest.fixture
def routes(tmp_path: Path, server: Server) -> AddressMap:
    publish_routes(directory=tmp_path, owner="test",
                   routes=[Route(host=VIRTUAL, port=30000, to_host="127.0.0.1",
                                 to_port=server.port)])
    return AddressMap(tmp_path)


def _http(path: str, **kw: float) -> Probe:
    timing = {"period": 0.05, "timeout": 1.0, "failure_threshold": 2, **kw}
    return Probe(action="http", port=8000, path=path, **timing)  # type: ignore[arg-type]


def target(port: int) -> tuple[str, int] | None:
    return (VIRTUAL, 30000) if port == 8000 else None


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_readiness_follows_the_server(server: Server, routes: AddressMap) -> None:
    changes: list[str] = []
    prober = Prober(dialer=routes, on_change=changes.append)
    server.status["/ready"] = 503
    prober.track("p", containers=[ContainerProbes(name="c", readiness=_http("/ready"))],
                 target=target, running_since=time.monotonic())
    state = prober.state("p")
    assert state is not None and not state[0].ready and state[0].started
    await until(lambda: server.hits.get("/ready", 0) >= 3)
    assert not prober.state("p")[0].ready  # type: ignore[index]
    assert "503" in (prober.state("p")[0].message or "")  # type: ignore[index]
    server.status["/ready"] = 200
    await until(lambda: prober.state("p")[0].ready)  # type: ignore[index]
    assert changes, "the change was reported"
    server.status["/ready"] = 500
    await until(lambda: not prober.state("p")[0].ready)  # type: ignore[index]
    assert server.hosts[0] == f"{VIRTUAL}:30000", "Host names the published address"
    await prober.aclose()


async def test_startup_gates_readiness_and_liveness(server: Server, routes: AddressMap) -> None:
    prober = Prober(dialer=routes)
    server.status["/startup"] = 503
    prober.track("p", containers=[ContainerProbes(
        name="c", startup=_http("/startup", failure_threshold=1000), readiness=_http("/ready"),
        liveness=_http("/live"))], target=target, running_since=time.monotonic())
    await until(lambda: server.hits.get("/startup", 0) >= 5)
    assert "/ready" not in server.hits and "/live" not in server.hits
    assert not prober.state("p")[0].started  # type: ignore[index]
    server.status["/startup"] = 200
    await until(lambda: prober.state("p")[0].ready)  # type: ignore[index]
    assert prober.state("p")[0].started  # type: ignore[index]
    hits = server.hits["/startup"]
    await until(lambda: server.hits.get("/live", 0) >= 3)
    assert server.hits["/startup"] == hits, "startup stops once it succeeded"
    await prober.aclose()


async def test_liveness_failure_past_threshold_and_restart(server: Server,
                                                          routes: AddressMap) -> None:
    changes: list[str] = []
    prober = Prober(dialer=routes, on_change=changes.append)
    probes = [ContainerProbes(name="c", liveness=_http("/live", failure_threshold=3))]
    prober.track("p", containers=probes, target=target, running_since=time.monotonic())
    await until(lambda: server.hits.get("/live", 0) >= 3)
    assert not prober.state("p")[0].liveness_failed  # type: ignore[index]
    server.status["/live"] = 500
    await until(lambda: prober.state("p")[0].liveness_failed)  # type: ignore[index]
    failed_at = server.hits["/live"]
    await asyncio.sleep(0.2)
    assert server.hits["/live"] == failed_at, "a failed liveness probe stops until restart"
    server.status["/live"] = 200
    prober.track("p", containers=probes, target=target, running_since=time.monotonic())
    assert not prober.state("p")[0].liveness_failed  # type: ignore[index]
    await until(lambda: server.hits["/live"] > failed_at)
    await prober.aclose()


async def test_unrouted_address_fails_without_dialling(tmp_path: Path) -> None:
    prober = Prober(dialer=AddressMap(tmp_path))
    prober.track("p", containers=[ContainerProbes(name="c", readiness=_http("/ready"))],
                 target=lambda _p: ("198.18.9.9", 30000), running_since=time.monotonic())
    await until(lambda: prober.probe_failures >= 2)
    state = prober.state("p")
    assert state is not None and not state[0].ready
    assert "no route to host" in (state[0].message or "")
    await prober.aclose()


async def test_unpublished_port_fails(server: Server, routes: AddressMap) -> None:
    prober = Prober(dialer=routes)
    prober.track("p", containers=[ContainerProbes(name="c", readiness=_http("/ready"))],
                 target=lambda _p: None, running_since=time.monotonic())
    await until(lambda: (prober.state("p")[0].message or "").startswith("port 8000"))  # type: ignore[index]
    assert "/ready" not in server.hits
    await prober.aclose()


async def test_tcp_probe(server: Server, routes: AddressMap) -> None:
    prober = Prober(dialer=routes)
    probe = Probe(action="tcp", port=8000, period=0.05, success_threshold=1)
    prober.track("p", containers=[ContainerProbes(name="c", readiness=probe)], target=target,
                 running_since=time.monotonic())
    await until(lambda: prober.state("p")[0].ready)  # type: ignore[index]
    await prober.aclose()


async def test_concurrency_is_bounded(server: Server, routes: AddressMap) -> None:
    server.delay = 0.1
    prober = Prober(dialer=routes, max_concurrent=3, jitter=0.0)
    for i in range(20):
        prober.track(f"p{i}", containers=[ContainerProbes(name="c", readiness=_http("/r"))],
                     target=target, running_since=time.monotonic())
    await until(lambda: server.hits.get("/r", 0) >= 20)
    assert 1 <= server.max_in_flight <= 3
    assert len(prober) == 20
    for i in range(20):
        prober.forget(f"p{i}")
    assert len(prober) == 0
    await prober.aclose()


def _pod(**container: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "c", "ports": [{"name": "http", "containerPort": 8000}]}
    return {"spec": {"containers": [{**base, **container}]}}


def test_parse_defaults_and_named_ports() -> None:
    (c,) = parse_probes(_pod(readinessProbe={"httpGet": {"port": "http", "path": "healthz"}},
                             livenessProbe={"tcpSocket": {"port": 8000}, "periodSeconds": 3,
                                            "successThreshold": 5}))
    assert c.readiness == Probe(action="http", port=8000, path="/healthz")
    assert c.liveness is not None and c.liveness.period == 3 and c.liveness.success_threshold == 1
    assert c.startup is None


@pytest.mark.parametrize(("container", "field"), [
    ({"readinessProbe": {"exec": {"command": ["true"]}}},
     "spec.containers[0].readinessProbe.exec"),
    ({"livenessProbe": {"httpGet": {"port": "metrics"}}},
     "spec.containers[0].livenessProbe.httpGet.port"),
    ({"startupProbe": {"tcpSocket": {"port": 70000}}},
     "spec.containers[0].startupProbe.tcpSocket.port"),
    ({"readinessProbe": {"httpGet": {"port": 8000, "scheme": "FTP"}}},
     "spec.containers[0].readinessProbe.httpGet.scheme"),
])
def test_parse_refuses_by_field(container: dict[str, object], field: str) -> None:
    with pytest.raises(ProbeSpecError) as err:
        parse_probes(_pod(**container))
    assert err.value.field == field


def test_parse_ignores_exec_when_told() -> None:
    (c,) = parse_probes(_pod(readinessProbe={"exec": {"command": ["true"]}}), ignore_exec=True)
    assert not c.any


class Recording:
    """A dialer that records every address it is asked for, then resolves through ``inner``."""

    def __init__(self, inner: AddressMap) -> None:
        self.inner = inner
        self.asked: list[tuple[str, int]] = []

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        self.asked.append((host, port))
        return self.inner.resolve(host, port)


@pytest.mark.parametrize("hostile", ["10.0.0.5", "169.254.169.254"])
async def test_a_refused_target_is_never_dialled(tmp_path: Path, server: Server,
                                                 hostile: str) -> None:
    # The lab routes the hostile address to a loopback canary: a dial would show as a hit
    # (nothing ever goes to the address itself).
    publish_routes(directory=tmp_path, owner="test",
                   routes=[Route(host=hostile, port=30000, to_host="127.0.0.1",
                                 to_port=server.port)])
    dialer = Recording(AddressMap(tmp_path))
    refused: list[None] = []
    prober = Prober(dialer=dialer, refuse=lambda host: refusal(host))
    prober.on_refused = lambda: refused.append(None)
    prober.track("p", containers=[ContainerProbes(name="c", readiness=_http("/ready"),
                                                  liveness=_http("/live"))],
                 target=lambda port: (hostile, 30000), running_since=time.monotonic())
    await until(lambda: prober.probes_refused >= 6)
    state = prober.state("p")
    assert state is not None and not state[0].ready
    assert f"{hostile}:30000 refused" in (state[0].message or "")
    assert dialer.asked == [] and server.hits == {}, "nothing was dialled"
    assert prober.probes_run == 0 and len(refused) == prober.probes_refused
    await prober.aclose()

    # the same prober without the filter would have dialled it (the canary proves the route)
    open_prober = Prober(dialer=dialer)
    open_prober.track("p", containers=[ContainerProbes(name="c", readiness=_http("/ready"))],
                      target=lambda port: (hostile, 30000), running_since=time.monotonic())
    await until(lambda: server.hits.get("/ready", 0) >= 1)
    await open_prober.aclose()

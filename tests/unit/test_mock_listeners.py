"""The mock cloud's real listeners: one tiny model server per running container port.

Why it exists: cloud pods become Ready by probes the provider runs over the network against the
address the cloud publishes; these tests pin down that the mock serves those addresses for real
(on loopback, reached through the address map, never by dialling 198.18.x.y), opens them after
boot, answers 503 while the model loads, closes them the moment a container stops, and cleans
up after itself even with hundreds of instances. Sockets are real, on 127.0.0.1 only.
Deterministic checks run the cloud on a :class:`ManualClock` (the listeners read the state's
clock); the ticker is checked in real time with short delays and deadlines, never thresholds.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.base import (
    TAG_NAMESPACE,
    TAG_NODE,
    TAG_POD,
    InstanceSpec,
    NotFound,
    Port,
    ProviderError,
)
from providers.mock import InventoryOffer, ManualClock, MockCloudState, create_app
from providers.mock.bodies import CreateBody
from providers.mock.listeners import PROBE_PATHS, ListenerSet, write_routes
from providers.mock.server import PUBLIC_PORT_BASE, TAG_RUN_SECONDS
from vkprovider.cli import build_parser
from vkprovider.probing.dialing import AddressMap, NoRoute
from vkprovider.testing.harness import MockCloudProcess
from vkprovider.testing.mockcloud import MockCloud, start_mock_cloud

POLL = 0.02
DEADLINE = 10.0


async def eventually(check: Callable[[], Awaitable[bool]] | Callable[[], bool],
                     what: str) -> None:
    """Poll ``check`` until it holds; fail after a generous deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > end:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(POLL)


def spec(name: str, *, ports: tuple[int, ...] = (8000,), env: dict[str, str] | None = None,
         tags: dict[str, str] | None = None) -> InstanceSpec:
    return InstanceSpec(name=name, image="vllm/vllm-openai", gpu_count=1, gpu_type="L4",
                        ports=tuple(Port(container_port=p) for p in ports),
                        env=env or {}, tags=tags or {})


@pytest.fixture
async def manual(tmp_path: Path) -> AsyncIterator[tuple[MockCloud, ManualClock, Path]]:
    """A served cloud on a manual clock, publishing routes in ``tmp_path/map``."""
    clock = ManualClock()
    map_dir = tmp_path / "map"
    async with start_mock_cloud(clock=clock, sleep=clock.sleep, boot_delay=5.0,
                                load_seconds=0.3, name="c1",
                                address_map_dir=map_dir) as cloud:
        yield cloud, clock, map_dir


def listener_of(cloud: MockCloud, instance_id: str, container_port: int = 8000
                ) -> dict[str, Any] | None:
    for entry in cloud.listeners():
        if entry["instance"] == instance_id and entry["container_port"] == container_port:
            return entry
    return None


async def get(port: int, path: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        return await http.get(path, headers=headers)


# -- the model server ----------------------------------------------------------------------------


async def test_a_listener_opens_after_boot_and_answers_503_while_loading_then_200(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    cloud, clock, _ = manual
    provider = cloud.provider()
    inst = await provider.create(spec("vk-a", tags={TAG_NAMESPACE: "ml", TAG_POD: "llm-0"}))
    cloud.state.tick()
    assert listener_of(cloud, inst.id) is None  # still booting: nothing listens

    clock.advance(5.0)
    cloud.state.tick()
    entry = listener_of(cloud, inst.id)
    assert entry is not None and entry["host"] == "127.0.0.1"
    port = entry["port"]
    for path in ("/ready", "/healthz", "/startup", "/v1/models"):
        resp = await get(port, path)
        assert resp.status_code == 503, path
        assert resp.json()["loading"] is True and resp.json()["instance"] == inst.id
    assert (await get(port, "/live")).status_code == 200

    clock.advance(0.3)
    for path in ("/ready", "/healthz", "/startup", "/live"):
        assert (await get(port, path)).status_code == 200, path
    body = (await get(port, "/v1/completions")).json()
    assert body == {"instance": inst.id, "name": "vk-a", "namespace": "ml", "pod": "llm-0",
                    "container_port": 8000}


async def test_health_knobs_fail_live_and_ready_until_set_back(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    cloud, clock, _ = manual
    cloud.state.boot_delay = 0.0
    inst = await cloud.provider().create(spec("vk-h"))
    clock.advance(1.0)
    entry = listener_of(cloud, inst.id)
    assert entry is not None
    port = entry["port"]
    async with httpx.AsyncClient(base_url=cloud.url) as admin:
        resp = await admin.post(f"/admin/instances/{inst.id}/health", json={"live": False})
        assert resp.json() == {"instance": inst.id, "live": False, "ready": True}
        assert (await get(port, "/live")).status_code == 500
        assert (await get(port, "/ready")).status_code == 200

        await admin.post(f"/admin/instances/{inst.id}/health", json={"ready": False})
        assert (await get(port, "/ready")).status_code == 503
        assert (await get(port, "/healthz")).status_code == 503
        assert (await get(port, "/generate")).status_code == 503

        await admin.post(f"/admin/instances/{inst.id}/health", json={"live": True, "ready": True})
        for path in ("/live", "/ready", "/generate"):
            assert (await get(port, path)).status_code == 200, path
        assert (await admin.post("/admin/instances/mi-nope/health", json={})).status_code == 404


async def test_requests_are_counted_per_instance_and_port_probes_apart(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    cloud, clock, _ = manual
    cloud.state.boot_delay = 0.0
    inst = await cloud.provider().create(spec("vk-c", ports=(8000, 9090)))
    clock.advance(1.0)
    cloud.state.tick()
    main, metrics = listener_of(cloud, inst.id, 8000), listener_of(cloud, inst.id, 9090)
    assert main is not None and metrics is not None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{main['port']}") as http:
        for _ in range(3):  # one keep-alive connection
            assert (await http.post("/v1/completions", json={"prompt": "hi"})).status_code == 200
        for path in sorted(PROBE_PATHS):
            await http.get(path)
        await http.get("/metrics", headers={"User-Agent": "kube-probe/1.30"})
    await get(metrics["port"], "/metrics")

    async with httpx.AsyncClient(base_url=cloud.url) as admin:
        traffic = (await admin.get("/admin/traffic")).json()
    assert traffic == {inst.id: {"traffic": 4, "probes": 5, "ports": {
        "8000": {"traffic": 3, "probes": 5}, "9090": {"traffic": 1, "probes": 0}}}}


async def test_a_tcp_probe_counts_as_a_probe(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    cloud, _, _ = manual
    cloud.state.boot_delay = 0.0
    inst = await cloud.provider().create(spec("vk-tcp"))
    entry = listener_of(cloud, inst.id)
    assert entry is not None
    _, writer = await asyncio.open_connection("127.0.0.1", entry["port"])
    writer.close()
    await writer.wait_closed()
    await eventually(lambda: cloud.traffic().get(inst.id, {}).get("probes") == 1,
                     "the connection counted as a probe")


# -- addresses and the address map ---------------------------------------------------------------


async def test_routes_reach_the_listener_through_the_address_map_only(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    cloud, clock, map_dir = manual
    cloud.state.boot_delay = 0.0
    inst = await cloud.provider().create(spec("vk-r", ports=(8000, 8001)))
    (published,) = [p for p in inst.published if p.container_port == 8000]
    assert published.host.startswith("198.1") and published.port >= PUBLIC_PORT_BASE
    assert published.port != published.container_port
    entry = listener_of(cloud, inst.id)
    assert entry is not None
    assert (entry["public_host"], entry["public_port"]) == (published.host, published.port)
    assert entry["port"] != entry["public_port"]

    amap = AddressMap(map_dir, recheck_seconds=0)
    await eventually(lambda: amap.routes().get((published.host, published.port))
                     == ("127.0.0.1", entry["port"]), "the route is published")
    host, port = amap.resolve(published.host, published.port)
    assert host == "127.0.0.1"
    clock.advance(1.0)
    assert (await get(port, "/ready")).status_code == 200
    assert (map_dir / "mock-c1.json").exists()


@pytest.mark.parametrize("stop", ["delete", "fail", "exit"])
async def test_a_stopped_container_closes_its_listeners_and_drops_its_routes(
        manual: tuple[MockCloud, ManualClock, Path], stop: str) -> None:
    cloud, _, map_dir = manual
    cloud.state.boot_delay = 0.0
    cloud.state.delete_delay = 30.0  # terminating for a while: the ports close on the request
    provider = cloud.provider()
    inst = await provider.create(spec(f"vk-{stop}"))
    other = await provider.create(spec(f"vk-{stop}-other"))
    entry = listener_of(cloud, inst.id)
    assert entry is not None
    amap = AddressMap(map_dir, recheck_seconds=0)
    key = (entry["public_host"], entry["public_port"])
    await eventually(lambda: key in amap.routes(), "route published")

    # a keep-alive connection open when the container stops is dropped with it
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{entry['port']}", timeout=5)
    try:
        assert (await http.get("/live")).status_code == 200
        async with httpx.AsyncClient(base_url=cloud.url) as admin:
            if stop == "delete":
                await provider.delete(inst.id)
            elif stop == "fail":
                await admin.post(f"/admin/instances/{inst.id}/fail", json={"message": "OOM"})
            else:
                await admin.post(f"/admin/instances/{inst.id}/exit", json={"exit_code": 0})
        assert listener_of(cloud, inst.id) is None
        with pytest.raises(httpx.TransportError):
            await http.get("/live")
    finally:
        await http.aclose()
    with pytest.raises(httpx.ConnectError):
        await get(entry["port"], "/live")
    await eventually(lambda: key not in amap.routes(), "route dropped")
    with pytest.raises(NoRoute):
        amap.resolve(*key)
    assert listener_of(cloud, other.id) is not None  # the neighbour keeps serving


async def test_the_ticker_opens_and_closes_listeners_without_any_api_call(
        tmp_path: Path) -> None:
    """Real time: boot 0.1 s, load 0.3 s, the container exits 1 s after it started."""
    async with start_mock_cloud(boot_delay=0.1, address_map_dir=tmp_path) as cloud:
        inst = await cloud.provider().create(
            spec("vk-t", env={"MOCK_LOAD_SECONDS": "0.3"}, tags={TAG_RUN_SECONDS: "1"}))
        await eventually(lambda: bool(cloud.state.listeners.listeners()), "listener opened")
        (listener,) = cloud.state.listeners.listeners()
        seen = []
        while True:
            resp = await get(listener.port, "/ready")
            seen.append(resp.status_code)
            if resp.status_code == 200:
                break
            assert resp.json()["loading"] is True
            await asyncio.sleep(POLL)
        assert set(seen) <= {503, 200}
        await eventually(lambda: not cloud.state.listeners.listeners(), "listener closed")
        assert (await cloud.provider().get(inst.id)).exit_code == 0
        assert json.loads((tmp_path / "mock-mock.json").read_text()) == {"routes": []}
    assert not (tmp_path / "mock-mock.json").exists()  # shut down: the routes are gone


async def test_without_an_address_map_the_listeners_still_run(tmp_path: Path) -> None:
    async with start_mock_cloud() as cloud:
        inst = await cloud.provider().create(spec("vk-n"))
        entry = listener_of(cloud, inst.id)
        assert entry is not None
        assert (await get(entry["port"], "/anything")).status_code == 200
        async with httpx.AsyncClient(base_url=cloud.url) as admin:
            assert (await admin.get("/admin/listeners")).json() == [entry]
    assert os.listdir(tmp_path) == []


async def test_an_in_process_app_without_started_listeners_opens_no_socket() -> None:
    clock = ManualClock()
    state = MockCloudState(clock=clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state=state)),
                                 base_url="http://mock.test") as http:
        resp = await http.post("/instances", json={"name": "x", "image": "i", "gpu_count": 1,
                                                   "ports": [{"container_port": 80}]})
        assert resp.json()["state"] == "running"
        assert (await http.get("/admin/listeners")).json() == []
        assert (await http.get("/admin/traffic")).json() == {}


def test_the_mocks_route_file_reads_as_the_dialing_hooks_address_map(tmp_path: Path) -> None:
    write_routes(directory=tmp_path, owner="mock-c1",
                 routes=[("198.18.0.5", 30000, "127.0.0.1", 41234),
                         ("198.18.0.6", 30001, "127.0.0.1", 41235)])
    amap = AddressMap(tmp_path, recheck_seconds=0)
    assert amap.resolve("198.18.0.5", 30000) == ("127.0.0.1", 41234)
    assert amap.resolve("198.18.0.6", 30001) == ("127.0.0.1", 41235)
    write_routes(directory=tmp_path, owner="mock-c1", routes=[])
    with pytest.raises(NoRoute):
        amap.resolve("198.18.0.5", 30000)
    assert [p.name for p in tmp_path.iterdir()] == ["mock-c1.json"]  # no temporary left
    with pytest.raises(ValueError, match="plain file name"):
        write_routes(directory=tmp_path, owner="../x", routes=[])
    with pytest.raises(ValueError, match="plain file name"):
        ListenerSet(clock=lambda: 0.0, owner=".hidden")


# -- restart -------------------------------------------------------------------------------------


async def test_restart_closes_the_ports_boots_again_and_counts(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    cloud, clock, map_dir = manual
    provider = cloud.provider()
    inst = await provider.create(spec("vk-rs"))
    clock.advance(5.3)
    cloud.state.tick()
    first = listener_of(cloud, inst.id)
    assert first is not None and (await get(first["port"], "/ready")).status_code == 200

    await provider.restart(inst.id)
    after = await provider.get(inst.id)
    assert after.restart_count == 1 and after.state.value == "pending"
    assert listener_of(cloud, inst.id) is None
    with pytest.raises(httpx.ConnectError):
        await get(first["port"], "/ready")

    clock.advance(5.0)
    cloud.state.tick()
    second = listener_of(cloud, inst.id)
    assert second is not None
    assert second["public_port"] == first["public_port"]  # same published address
    assert (await get(second["port"], "/ready")).status_code == 503  # loading again
    clock.advance(0.3)
    assert (await get(second["port"], "/ready")).status_code == 200
    amap = AddressMap(map_dir, recheck_seconds=0)
    await eventually(lambda: amap.routes().get((second["public_host"], second["public_port"]))
                     == ("127.0.0.1", second["port"]), "the new route is published")
    running = await provider.get(inst.id)
    assert running.restart_count == 1 and running.state.value == "running"
    assert cloud.stats()["restart_calls"] == 1


async def test_restart_of_a_gone_or_deleting_instance_is_refused_an_exited_one_restarts(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    cloud, _, _ = manual
    cloud.state.boot_delay = 0.0
    cloud.state.delete_delay = 60.0
    provider = cloud.provider()
    with pytest.raises(NotFound):
        await provider.restart("mi-missing")
    inst = await provider.create(spec("vk-stopped"))
    async with httpx.AsyncClient(base_url=cloud.url) as admin:
        await admin.post(f"/admin/instances/{inst.id}/exit", json={"exit_code": 3})
        resp = await admin.post(f"/instances/{inst.id}/restart")  # an exited container
        assert resp.status_code == 200, resp.text
        assert resp.json()["restart_count"] == 1 and resp.json()["exit_code"] is None
        await provider.delete(inst.id)
        resp = await admin.post(f"/instances/{inst.id}/restart")
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "invalid_state"
    with pytest.raises(ProviderError):
        await provider.restart(inst.id)
    cloud.state.faults.add(endpoint="restart", status=503)
    gone = await provider.create(spec("vk-faulted"))
    with pytest.raises(ProviderError):
        await provider.restart(gone.id)  # the fault, not retried: a restart is not idempotent
    assert (await provider.get(gone.id)).restart_count == 0


# -- knobs ---------------------------------------------------------------------------------------


async def test_load_seconds_is_a_config_knob_a_scenario_field_and_a_container_env() -> None:
    state = MockCloudState(clock=ManualClock())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state=state)),
                                 base_url="http://mock.test") as http:
        assert (await http.get("/admin/config")).json()["load_seconds"] == 0.0
        resp = await http.patch("/admin/config", json={"load_seconds": 2.5})
        assert resp.json()["load_seconds"] == 2.5
        body = {"image": "i", "gpu_count": 1}
        await http.post("/instances", json={"name": "a", **body})
        await http.post("/instances", json={"name": "b", **body,
                                            "env": {"MOCK_LOAD_SECONDS": "0.5", "TOKEN": "s3"}})
        bad = await http.post("/instances", json={"name": "c", **body,
                                                  "env": {"MOCK_LOAD_SECONDS": "soon"}})
        assert bad.status_code == 400 and "MOCK_LOAD_SECONDS" in bad.json()["error"]["message"]
        assert "soon" not in bad.text
        put = await http.put("/admin/scenario", json={"load_seconds": 4})
        assert put.status_code == 200 and put.json()["load_seconds"] == 4
        assert (await http.get("/admin/config")).json()["load_seconds"] == 4
    loads = {r.name: r.load_seconds for r in state._all}
    assert loads == {"a": 2.5, "b": 0.5}
    assert "s3" not in repr(state._all)  # env values are never stored
    state.reset()
    assert state.load_seconds == 0.0


# -- many instances --------------------------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_hundreds_of_instances_open_and_close_without_leaking(tmp_path: Path) -> None:
    n = 200
    before_fds = _open_fds()
    before_tasks = len(asyncio.all_tasks())
    offer = InventoryOffer(gpu_type="L4", region="us-east", count=n, price_per_gpu_hour=0.4)
    async with start_mock_cloud(address_map_dir=tmp_path, name="many",
                                inventory=[offer]) as cloud:
        provider = cloud.provider()
        body = {"image": "i", "gpu_count": 1, "ports": [{"container_port": 8000}],
                "tags": {TAG_NODE: provider.owner}}
        # created in process (an HTTP create costs a round trip each), read back over HTTP
        for i in range(n):
            cloud.state.create(CreateBody.model_validate({"name": f"vk-m{i}", **body}))
        instances = await provider.list()
        assert len(instances) == n
        await eventually(lambda: len(cloud.listeners()) == n, "every listener open")
        amap = AddressMap(tmp_path, recheck_seconds=0)
        await eventually(lambda: len(amap.routes()) == n, "every route published")
        for inst in instances[::20]:
            _, port = amap.resolve(inst.published[0].host, inst.published[0].port)
            assert (await get(port, "/x")).json()["instance"] == inst.id
        for inst in instances[: n // 2]:
            await provider.delete(inst.id)
        assert len(cloud.listeners()) == n - n // 2
        await eventually(lambda: len(amap.routes()) == n - n // 2, "half the routes dropped")
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before_tasks
    assert _open_fds() <= before_fds
    assert os.listdir(tmp_path) == []


# -- the command -----------------------------------------------------------------------------------


def test_the_command_takes_an_address_map_dir_and_a_name() -> None:
    args = build_parser().parse_args(["mock-cloud", "--address-map-dir", "/tmp/m", "--name", "c"])
    assert (args.address_map_dir, args.name) == ("/tmp/m", "c")
    assert build_parser().parse_args(["mock-cloud"]).address_map_dir is None


async def test_the_mock_cloud_process_publishes_routes_and_removes_them_when_stopped(
        tmp_path: Path) -> None:
    map_dir = tmp_path / "map"
    cloud = MockCloudProcess(work_dir=tmp_path, name="c9", boot_delay=0.0,
                             address_map_dir=map_dir)
    try:
        await cloud.start()
        inst = await cloud.admin("POST", "/instances", json={
            "name": "vk-p", "image": "i", "gpu_count": 1, "ports": [{"container_port": 8000}]})
        key = (inst["public_ip"], inst["ports"][0]["public_port"])
        amap = AddressMap(map_dir, recheck_seconds=0)
        await eventually(lambda: key in amap.routes(), "the route is published")
        _, port = amap.resolve(*key)
        assert (await get(port, "/v1/models")).json()["instance"] == inst["id"]
        assert (await cloud.admin("GET", "/admin/traffic"))[inst["id"]]["traffic"] == 1
    finally:
        cloud.stop()
    assert not (map_dir / "mock-c9.json").exists(), cloud.log_text()



async def test_a_stream_sends_its_events_over_time_then_keeps_the_connection_alive(
        manual: tuple[MockCloud, ManualClock, Path]) -> None:
    """``/stream`` is a long response as inference servers send tokens (SSE, chunked), paced
    by the event loop's timers (real time, not the cloud's clock); a deleted container cuts
    it, as a dead process would."""
    import time

    cloud, clock, _ = manual
    cloud.state.boot_delay = 0.0
    provider = cloud.provider()
    inst = await provider.create(spec("vk-stream"))
    clock.advance(0.3)  # loaded
    entry = listener_of(cloud, inst.id)
    assert entry is not None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{entry['port']}",
                                 timeout=10) as http:
        started = time.monotonic()
        arrivals: list[float] = []
        async with http.stream("GET", "/stream?events=4&every=0.1") as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["transfer-encoding"] == "chunked"
            lines = []
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)
                    arrivals.append(time.monotonic() - started)
        assert lines == [f"data: {inst.id} {i}" for i in range(4)]
        assert arrivals[-1] > arrivals[0], "sent over time, not in one piece"
        assert (await http.get("/v1/models")).status_code == 200  # the same connection
        assert (await http.get("/stream?events=x")).status_code == 400

        cut: list[str] = []
        with pytest.raises(httpx.TransportError):
            async with http.stream("GET", "/stream?events=50&every=0.1") as response:
                async for line in response.aiter_lines():
                    if line and not cut:
                        cut.append(line)
                        await provider.delete(inst.id)
                    elif line:
                        cut.append(line)
        assert 1 <= len(cut) < 50

"""Unit tests of the mock GPU cloud, driven through MockProvider over httpx.ASGITransport.

Why it exists: the mock cloud is what every service test and every user's policy test stands on,
so its semantics (idempotency, capacity, lifecycle, billing, errors) are pinned here. Time is a
ManualClock, so nothing sleeps.
"""

from __future__ import annotations

import ipaddress
import time
import types
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from providers.base import (
    TAG_NODE,
    TAG_UID,
    AuthError,
    CapacityError,
    InstanceSpec,
    InstanceState,
    InvalidSpec,
    LogOptions,
    NotFound,
    Port,
    Provider,
    PublishedPort,
    QuotaError,
    RateLimited,
    TransientError,
)
from providers.mock import InventoryOffer, ManualClock, MockCloudState, MockProvider, create_app
from providers.mock.client import _published
from providers.mock.server import (
    PUBLIC_PORT_BASE,
    TAG_GPU_UTILIZATION,
    TAG_RUN_SECONDS,
    PortBody,
    _publish,
    _Record,
)
from tests.fakes.common import FailingTransport, assert_never_shown

START = datetime(2025, 1, 1, tzinfo=UTC)
BASE_URL = "http://mock.test"
NODE = "vk-gpu-burst"


class Cloud:
    """One mock cloud plus the providers and admin client a test talks to it with."""

    def __init__(self, *, api_key: str | None = None, **knobs: Any) -> None:
        self.clock = ManualClock()
        self.state = MockCloudState(
            clock=self.clock, sleep=self.clock.sleep, start_time=START, api_key=api_key, **knobs
        )
        self.app = create_app(state=self.state)
        self.api_key = api_key
        self._closers: list[Any] = []
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.admin = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL, headers=headers
        )

    def provider(
        self,
        *,
        owner: str = NODE,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **kwargs: Any,
    ) -> MockProvider:
        kwargs.setdefault("backoff_initial", 0.001)
        kwargs.setdefault("backoff_max", 0.01)
        provider = MockProvider(
            name="mock",
            base_url=BASE_URL,
            owner=owner,
            api_key=api_key if api_key is not None else self.api_key,
            transport=transport or httpx.ASGITransport(app=self.app),
            **kwargs,
        )
        self._closers.append(provider)
        return provider

    async def aclose(self) -> None:
        for provider in self._closers:
            await provider.aclose()
        await self.admin.aclose()


@pytest.fixture
async def cloud() -> AsyncIterator[Cloud]:
    c = Cloud()
    yield c
    await c.aclose()


def spec(name: str = f"{NODE}-uid1", **overrides: Any) -> InstanceSpec:
    fields: dict[str, Any] = {
        "name": name,
        "image": "ghcr.io/acme/train:1.0",
        "gpu_type": "H100",
        "gpu_count": 1,
        "env": {"HF_TOKEN": "hf-very-secret-value"},
        "tags": {TAG_UID: name.rsplit("-", 1)[-1]},
    }
    fields.update(overrides)
    return InstanceSpec(**fields)


async def read_logs(provider: MockProvider, instance_id: str, **opts: Any) -> bytes:
    return b"".join([chunk async for chunk in provider.logs(instance_id, LogOptions(**opts))])


# -- create -----------------------------------------------------------------------------------


async def test_provider_satisfies_the_protocol(cloud: Cloud) -> None:
    assert isinstance(cloud.provider(), Provider)


async def test_create_is_idempotent_by_name(cloud: Cloud) -> None:
    provider = cloud.provider()
    first = await provider.create(spec())
    second = await provider.create(spec())

    assert second.id == first.id
    assert first.state is InstanceState.RUNNING  # boot_delay 0
    assert [i.id for i in await provider.list()] == [first.id]
    assert cloud.state.stats()["create_calls"] == 2
    assert cloud.state.stats()["instances_created"] == 1
    assert len(cloud.state.ledger()["instances"]) == 1


async def test_create_reports_what_the_cloud_chose(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec(gpu_count=2, ports=(Port(container_port=8080),)))

    assert inst.provider == "mock"
    assert inst.gpu_type == "H100"
    assert inst.gpu_count == 2
    assert inst.region == "eu-west"  # the cheaper H100 region in the default inventory
    assert inst.price_per_hour == pytest.approx(2 * 2.19)
    assert inst.ip is not None and inst.ip.startswith("100.64.")
    assert inst.endpoints == (f"https://{inst.id}.mock.invalid", f"{inst.ip}:8080")
    assert inst.created_at == START
    assert inst.tags[TAG_NODE] == NODE  # the adapter always tags its owner
    assert inst.tags[TAG_UID] == "uid1"


# -- published ports --------------------------------------------------------------------------

BENCHMARKING = ipaddress.ip_network("198.18.0.0/15")
PODS = ipaddress.ip_network("100.64.0.0/10")


async def test_each_declared_port_is_published_on_a_public_ip_and_another_port(
    cloud: Cloud,
) -> None:
    provider = cloud.provider()
    ports = (Port(container_port=8080), Port(container_port=30000, name="metrics"),
             Port(container_port=53, protocol="UDP"))
    inst = await provider.create(spec(ports=ports))

    assert [(p.container_port, p.protocol) for p in inst.published] == [
        (8080, "TCP"), (30000, "TCP"), (53, "UDP")]
    (host,) = {p.host for p in inst.published}
    assert ipaddress.ip_address(host) in BENCHMARKING
    assert inst.ip is not None and ipaddress.ip_address(inst.ip) in PODS and host != inst.ip
    assert all(p.kind == "ip" and p.scheme is None for p in inst.published)
    assert all(p.port != p.container_port for p in inst.published)
    # counting up from 30000, skipping the instance's own container port 30000
    assert [p.port for p in inst.published] == [30001, 30002, 30003]
    assert (await provider.get(inst.id)).published == inst.published
    (listed,) = await provider.list()
    assert listed.published == inst.published
    assert inst.endpoints == (f"https://{inst.id}.mock.invalid", f"{inst.ip}:8080",
                              f"{inst.ip}:30000", f"{inst.ip}:53")  # unchanged

    raw = (await cloud.admin.get(f"/instances/{inst.id}")).json()
    assert raw["public_ip"] == host
    assert raw["ports"] == [
        {"container_port": 8080, "protocol": "TCP", "public_port": 30001},
        {"container_port": 30000, "protocol": "TCP", "public_port": 30002},
        {"container_port": 53, "protocol": "UDP", "public_port": 30003},
    ]


async def test_public_ports_are_deterministic_per_instance_and_ips_unique(cloud: Cloud) -> None:
    provider = cloud.provider()
    ports = (Port(container_port=8000), Port(container_port=8001))
    first = await provider.create(spec("n-a", ports=ports))
    second = await provider.create(spec("n-b", ports=ports))
    again = await provider.create(spec("n-a", ports=ports))  # idempotent: the same instance

    assert [p.port for p in first.published] == [PUBLIC_PORT_BASE, PUBLIC_PORT_BASE + 1]
    assert [p.port for p in second.published] == [p.port for p in first.published]
    assert first.published[0].host != second.published[0].host
    assert again.published == first.published


async def test_an_instance_without_ports_publishes_nothing(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec())
    assert inst.published == ()
    raw = (await cloud.admin.get(f"/instances/{inst.id}")).json()
    assert raw["ports"] == [] and ipaddress.ip_address(raw["public_ip"]) in BENCHMARKING


def test_public_ips_stay_in_the_benchmarking_range_and_differ_for_a_long_while() -> None:
    """Each of the 16 blocks (one per cloud on a lab network) gives 32 x 254 addresses, and no
    two blocks share one."""
    def public_ip(seq: int, block: int) -> str:
        record = types.SimpleNamespace(seq=seq, public_block=block)
        return str(_Record.public_ip.fget(record))  # type: ignore[attr-defined]

    seen = {public_ip(seq, block) for block in range(16) for seq in range(1, 254 * 32 + 1)}
    assert len(seen) == 254 * 32 * 16
    with pytest.raises(ValueError):
        MockCloudState(public_block=16)
    assert all(ipaddress.ip_address(ip) in BENCHMARKING for ip in seen)
    assert not any(ip.endswith((".0", ".255")) for ip in seen)


def test_publish_skips_the_container_ports_and_dedupes() -> None:
    declared = [PortBody(container_port=30000), PortBody(container_port=30001),
                PortBody(container_port=30000), PortBody(container_port=30000, protocol="UDP"),
                PortBody(container_port=30003)]
    assert _publish(declared) == (
        (30000, "TCP", 30002), (30001, "TCP", 30004), (30000, "UDP", 30005),
        (30003, "TCP", 30006))
    assert _publish([]) == ()


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"ports": [{"container_port": 80, "protocol": "TCP", "public_port": 30000}]},
        {"public_ip": None, "ports": [{"container_port": 80, "public_port": 30000}]},
        {"public_ip": "198.18.0.2"},
        {"public_ip": "198.18.0.2", "ports": None},
        {"public_ip": "198.18.0.2", "ports": {"80": 30000}},
        {"public_ip": "198.18.0.2", "ports": ["80:30000", {"container_port": 80},
                                              {"public_port": 30000},
                                              {"container_port": "80", "public_port": 30000},
                                              {"container_port": 80, "public_port": 0},
                                              {"container_port": 80, "public_port": 30000,
                                               "protocol": 6}]},
    ],
)
def test_missing_or_malformed_address_fields_publish_nothing(data: dict[str, Any]) -> None:
    assert _published(data) == ()


async def test_the_client_reads_an_instance_without_address_fields(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec(ports=(Port(container_port=8080),)))
    raw = (await cloud.admin.get(f"/instances/{inst.id}")).json()
    del raw["public_ip"], raw["ports"]  # an older mock cloud
    old = provider._instance(raw, what="test")
    assert old.published == () and old.endpoints == inst.endpoints
    assert _published({"public_ip": "198.18.0.2", "ports": [
        {"container_port": 80, "public_port": 30000}]}) == (
        PublishedPort(container_port=80, host="198.18.0.2", port=30000, kind="ip"),)


async def test_create_without_region_picks_the_cheapest_with_capacity(cloud: Cloud) -> None:
    cloud.state.set_inventory(
        [
            InventoryOffer(gpu_type="H100", region="dear", count=4, price_per_gpu_hour=3.0),
            InventoryOffer(gpu_type="H100", region="cheap", count=4, price_per_gpu_hour=2.0),
        ]
    )
    provider = cloud.provider()
    first = await provider.create(spec("n-a", gpu_count=4))
    second = await provider.create(spec("n-b", gpu_count=2))

    assert (first.region, second.region) == ("cheap", "dear")


async def test_capacity_exhaustion_raises_capacity_error(cloud: Cloud) -> None:
    cloud.state.set_inventory(
        [
            InventoryOffer(gpu_type="H100", region="us-east", count=8, price_per_gpu_hour=2.0),
        ]
    )
    provider = cloud.provider()
    full = await provider.create(spec("n-a", gpu_count=8))

    with pytest.raises(CapacityError) as caught:
        await provider.create(spec("n-b", gpu_count=1))
    assert "not enough free H100" in str(caught.value)
    assert caught.value.provider == "mock"
    assert cloud.state.stats()["create_calls"] == 2  # never retried
    offers = await provider.capacity()
    assert [(o.gpu_type, o.region, o.available) for o in offers] == [("H100", "us-east", 0)]

    await provider.delete(full.id)
    offers = await provider.capacity()
    assert offers[0].available == 8
    assert offers[0].provider == "mock"
    assert offers[0].price_per_gpu_hour == 2.0


async def test_region_without_an_offer_is_a_capacity_error(cloud: Cloud) -> None:
    with pytest.raises(CapacityError):
        await cloud.provider().create(spec(region="mars-1"))


async def test_max_price_filters_offers(cloud: Cloud) -> None:
    provider = cloud.provider()
    with pytest.raises(CapacityError):
        await provider.create(spec(gpu_count=2, max_price_per_hour=4.0))  # cheapest is 4.38
    inst = await provider.create(spec(gpu_count=2, max_price_per_hour=4.5))
    assert inst.region == "eu-west"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"gpu_type": "TPU9000"}, "unknown gpu_type 'TPU9000'"),
        ({"gpu_count": 0}, "gpu_count"),
        ({"gpu_count": 9}, "exceeds the maximum of 8"),
        ({"image": ""}, "image"),
        ({"image": "   "}, "image is empty"),
        ({"tags": {TAG_RUN_SECONDS: "soon"}}, TAG_RUN_SECONDS),
    ],
)
async def test_invalid_specs_raise_invalid_spec(
    cloud: Cloud, overrides: dict[str, Any], expected: str
) -> None:
    provider = cloud.provider()
    with pytest.raises(InvalidSpec) as caught:
        await provider.create(spec(**overrides))

    message = str(caught.value)
    assert expected in message
    assert "hf-very-secret-value" not in message
    assert cloud.state.stats()["create_calls"] == 1  # never retried
    assert cloud.state.stats()["instances_created"] == 0


async def test_quota_exceeded_raises_quota_error() -> None:
    c = Cloud(quota_gpus=2)
    try:
        provider = c.provider()
        await provider.create(spec("n-a", gpu_count=2))
        with pytest.raises(QuotaError) as caught:
            await provider.create(spec("n-b", gpu_count=1))
        assert "quota" in str(caught.value)
        assert c.state.stats()["create_calls"] == 2
    finally:
        await c.aclose()


# -- auth -------------------------------------------------------------------------------------


async def test_auth_errors_never_leak_the_key() -> None:
    c = Cloud(api_key="sk-server-side-secret")
    try:
        anonymous = c.provider(api_key="")
        with pytest.raises(AuthError) as no_key:
            await anonymous.capacity()
        wrong = c.provider(api_key="sk-wrong-guess-123")
        with pytest.raises(AuthError) as wrong_key:
            await wrong.create(spec())

        for err in (no_key.value, wrong_key.value):
            assert "401" in str(err)
        assert_never_shown("sk-server-side-secret", no_key.value, wrong_key.value, c.state)
        assert_never_shown("sk-wrong-guess", no_key.value, wrong_key.value, wrong)
        stats = c.state.stats()
        assert (stats["create_calls"], stats["unauthorized_calls"]) == (1, 2)  # not retried
        assert stats["instances_created"] == 0

        good = c.provider()
        inst = await good.create(spec())
        assert inst.state is InstanceState.RUNNING
    finally:
        await c.aclose()


async def test_admin_endpoints_need_the_key_too() -> None:
    c = Cloud(api_key="sk-admin")
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=c.app), base_url=BASE_URL
        ) as anonymous:
            response = await anonymous.get("/admin/ledger")
        assert response.status_code == 401
        assert "sk-admin" not in response.text
        assert (await c.admin.get("/admin/ledger")).status_code == 200
    finally:
        await c.aclose()


async def test_auth_is_checked_before_the_body() -> None:
    c = Cloud(api_key="sk-first")
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=c.app), base_url=BASE_URL
        ) as anonymous:
            response = await anonymous.post("/instances", content=b"{not json")
            logs = await anonymous.get("/instances/x/logs", params={"tail_lines": "-5"})
        assert (response.status_code, logs.status_code) == (401, 401)
        assert response.json()["error"]["code"] == "unauthorized"
    finally:
        await c.aclose()


async def test_validation_errors_never_echo_the_input(cloud: Cloud) -> None:
    response = await cloud.admin.post(
        "/instances",
        json={
            "name": "n",
            "image": "img",
            "gpu_count": "many",
            "env": {"PASSWORD": "pw-do-not-echo", "PORT": 1234567},
        },
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_spec"
    assert "gpu_count" in error["message"]
    assert "env.PORT" in error["message"]
    assert "pw-do-not-echo" not in response.text
    assert "1234567" not in response.text
    assert "many" not in response.text


# -- lifecycle --------------------------------------------------------------------------------


async def test_boot_delay_keeps_the_instance_pending_until_due() -> None:
    c = Cloud(boot_delay=30.0)
    try:
        provider = c.provider()
        inst = await provider.create(spec())
        assert inst.state is InstanceState.PENDING
        assert inst.started_at is None
        assert inst.message == "booting"

        c.clock.advance(29.9)
        assert (await provider.get(inst.id)).state is InstanceState.PENDING

        c.clock.advance(0.2)
        running = await provider.get(inst.id)
        assert running.state is InstanceState.RUNNING
        assert running.started_at == START + timedelta(seconds=30)  # when due, not when seen
    finally:
        await c.aclose()


async def test_admin_fail_marks_the_instance_failed_with_its_message(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec())
    cloud.clock.advance(5)

    response = await cloud.admin.post(
        f"/admin/instances/{inst.id}/fail", json={"message": "preempted by the cloud"}
    )
    assert response.status_code == 200

    [failed] = await provider.list()
    assert failed.state is InstanceState.FAILED
    assert failed.message == "preempted by the cloud"
    assert failed.finished_at == START + timedelta(seconds=5)

    again = await cloud.admin.post(f"/admin/instances/{inst.id}/fail", json={"message": "x"})
    assert again.status_code == 409


@pytest.mark.parametrize(
    ("code", "state"), [(0, InstanceState.SUCCEEDED), (3, InstanceState.FAILED)]
)
async def test_admin_exit_sets_the_exit_code(cloud: Cloud, code: int, state: InstanceState) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec())
    response = await cloud.admin.post(f"/admin/instances/{inst.id}/exit", json={"exit_code": code})
    assert response.status_code == 200

    done = await provider.get(inst.id)
    assert done.state is state
    assert done.exit_code == code


async def test_run_seconds_tag_exits_on_schedule(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec(tags={TAG_RUN_SECONDS: "60"}))
    cloud.clock.advance(59)
    assert (await provider.get(inst.id)).state is InstanceState.RUNNING
    cloud.clock.advance(100)
    done = await provider.get(inst.id)
    assert done.state is InstanceState.SUCCEEDED
    assert done.finished_at == START + timedelta(seconds=60)


async def test_delete_is_idempotent_and_frees_after_delete_delay() -> None:
    c = Cloud(delete_delay=5.0)
    try:
        provider = c.provider()
        inst = await provider.create(spec())

        await provider.delete(inst.id)
        [terminating] = await provider.list()
        assert terminating.state is InstanceState.TERMINATING
        await provider.delete(inst.id)  # a second delete while terminating is fine

        c.clock.advance(5)
        assert await provider.list() == []
        await provider.delete(inst.id)  # gone: 404 swallowed
        await provider.delete("mi-never-existed")
        with pytest.raises(NotFound):
            await provider.get(inst.id)
        assert c.state.stats()["delete_calls"] == 4
        [entry] = c.state.ledger()["instances"]
        assert entry["state"] == "deleted"
        assert entry["stopped_at"] == (START + timedelta(seconds=5)).isoformat()
    finally:
        await c.aclose()


async def test_list_returns_only_the_owners_instances(cloud: Cloud) -> None:
    mine = cloud.provider(owner=NODE)
    theirs = cloud.provider(owner="vk-other")
    a = await mine.create(spec("n-a"))
    b = await mine.create(spec("n-b"))
    c = await theirs.create(spec("n-c", tags={TAG_NODE: NODE}))  # the owner tag wins

    assert sorted(i.id for i in await mine.list()) == sorted([a.id, b.id])
    assert [i.id for i in await theirs.list()] == [c.id]
    assert cloud.state.stats()["list_calls"] == 2  # one call per sweep

    response = await cloud.admin.get("/instances", params={"tag": f"{TAG_NODE}=vk-other"})
    assert [i["name"] for i in response.json()["instances"]] == ["n-c"]


# -- logs -------------------------------------------------------------------------------------


async def test_logs_tail_since_timestamps_and_limit(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec())
    cloud.clock.advance(10.5)

    everything = (await read_logs(provider, inst.id)).decode().splitlines()
    assert everything[0] == "[mock] pulling image ghcr.io/acme/train:1.0"
    assert everything[1].startswith(f"[mock] started {NODE}-uid1: image=ghcr.io/acme/train:1.0")
    assert everything[2:] == [f"[mock] heartbeat {n}" for n in range(1, 11)]

    tail = await read_logs(provider, inst.id, tail_lines=3)
    assert tail == b"[mock] heartbeat 8\n[mock] heartbeat 9\n[mock] heartbeat 10\n"

    since = await read_logs(provider, inst.id, since_seconds=2)
    assert since == b"[mock] heartbeat 9\n[mock] heartbeat 10\n"

    limited = await read_logs(provider, inst.id, limit_bytes=10)
    assert limited == b"[mock] pul"

    stamped = (await read_logs(provider, inst.id, tail_lines=1, timestamps=True)).decode()
    assert stamped == "2025-01-01T00:00:10.000000000Z [mock] heartbeat 10\n"

    assert b"hf-very-secret-value" not in await read_logs(provider, inst.id, timestamps=True)


async def test_logs_end_with_the_exit_line(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec())
    cloud.clock.advance(2)
    cloud.state.fail(inst.id, message="OOM")
    cloud.clock.advance(100)  # no heartbeats after the failure

    lines = (await read_logs(provider, inst.id, tail_lines=2)).decode().splitlines()
    assert lines == ["[mock] heartbeat 2", "[mock] failed: OOM"]


async def test_logs_follow_streams_until_the_container_exits(cloud: Cloud) -> None:
    cloud.state.follow_poll_interval = 1.0
    provider = cloud.provider()
    inst = await provider.create(spec(tags={TAG_RUN_SECONDS: "5"}))
    cloud.clock.advance(2)

    followed = await read_logs(provider, inst.id, follow=True, tail_lines=1)
    assert followed.decode().splitlines() == [
        "[mock] heartbeat 2",
        "[mock] heartbeat 3",
        "[mock] heartbeat 4",
        "[mock] heartbeat 5",
        "[mock] exited with code 0",
    ]
    assert cloud.clock() == pytest.approx(1000 + 5)  # the follow loop slept on the fake clock


async def test_logs_follow_is_bounded(cloud: Cloud) -> None:
    cloud.state.follow_poll_interval = 1.0
    cloud.state.follow_max_seconds = 3.0
    provider = cloud.provider()
    inst = await provider.create(spec())

    followed = await read_logs(provider, inst.id, follow=True, tail_lines=0)
    assert followed == b"[mock] heartbeat 1\n[mock] heartbeat 2\n[mock] heartbeat 3\n"


async def test_logs_follow_stops_when_the_instance_is_deleted(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec())

    async def sleep_then_delete_at_3s(seconds: float) -> None:
        await cloud.clock.sleep(seconds)
        if cloud.clock() >= 1003:
            cloud.state.delete(inst.id)

    cloud.state.sleep = sleep_then_delete_at_3s
    cloud.state.follow_poll_interval = 1.0
    followed = await read_logs(provider, inst.id, follow=True, tail_lines=0)
    assert followed == b"[mock] heartbeat 1\n[mock] heartbeat 2\n"  # gone before beat 3 shows
    assert cloud.clock() == pytest.approx(1003)


async def test_logs_of_an_unknown_instance_raise_not_found(cloud: Cloud) -> None:
    with pytest.raises(NotFound):
        await read_logs(cloud.provider(), "mi-nope")


# -- metrics ----------------------------------------------------------------------------------


async def test_gpu_metrics_per_gpu_and_deterministic(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec(gpu_count=2))
    first = await provider.gpu_metrics(inst.id)
    second = await provider.gpu_metrics(inst.id)

    assert first == second
    assert first["state"] == "running"
    assert [g["index"] for g in first["gpus"]] == [0, 1]
    for gpu in first["gpus"]:
        assert 50.0 <= gpu["gpu_utilization"] <= 100.0
        assert 0.0 < gpu["tensor_active"] <= 1.0
        assert gpu["memory_total_bytes"] == 80 * 1024**3
        assert 0 < gpu["memory_used_bytes"] <= gpu["memory_total_bytes"]
        assert gpu["temperature_c"] > 32.0
        assert gpu["power_w"] > 70.0


async def test_gpu_load_can_be_pinned_idle(cloud: Cloud) -> None:
    provider = cloud.provider()
    by_tag = await provider.create(spec("n-a", tags={TAG_GPU_UTILIZATION: "0.02"}))
    by_admin = await provider.create(spec("n-b"))
    response = await cloud.admin.post(
        f"/admin/instances/{by_admin.id}/load", json={"gpu_utilization": 0.0}
    )
    assert response.status_code == 200

    for inst in (by_tag, by_admin):
        metrics = await provider.gpu_metrics(inst.id)
        assert metrics["gpus"][0]["gpu_utilization"] <= 5.0


async def test_gpu_metrics_idle_while_pending() -> None:
    c = Cloud(boot_delay=60)
    try:
        provider = c.provider()
        inst = await provider.create(spec())
        metrics = await provider.gpu_metrics(inst.id)
        assert metrics["state"] == "pending"
        assert metrics["gpus"][0]["gpu_utilization"] == 0.0
        assert metrics["gpus"][0]["memory_used_bytes"] == 0
    finally:
        await c.aclose()


# -- ledger, stats, admin ---------------------------------------------------------------------


async def test_ledger_bills_running_time_until_the_gpus_are_released() -> None:
    c = Cloud(boot_delay=60)
    c.state.set_inventory(
        [
            InventoryOffer(gpu_type="H100", region="r1", count=8, price_per_gpu_hour=2.0),
        ]
    )
    try:
        provider = c.provider()
        billed = await provider.create(spec("n-a", gpu_count=2))
        never_started = await provider.create(spec("n-b", gpu_count=1))
        await provider.delete(never_started.id)

        c.clock.advance(60 + 1800)  # boots at 60 s, then runs half an hour
        ledger = (await c.admin.get("/admin/ledger")).json()
        assert ledger["create_calls"] == 2
        entries = {e["name"]: e for e in ledger["instances"]}
        assert entries["n-a"]["cost"] == pytest.approx(2.0)  # 2 GPUs * 2.0 * 0.5 h
        assert entries["n-a"]["uid"] == "a"
        assert entries["n-a"]["stopped_at"] is None
        assert entries["n-b"]["cost"] == 0.0
        assert entries["n-b"]["started_at"] is None

        await provider.delete(billed.id)
        c.clock.advance(3600)
        ledger = c.state.ledger()
        assert ledger["instances"][0]["cost"] == pytest.approx(2.0)  # stopped at the delete
        assert ledger["total_cost"] == pytest.approx(2.0)
    finally:
        await c.aclose()


async def test_admin_stats_inventory_and_reset(cloud: Cloud) -> None:
    provider = cloud.provider()
    await provider.create(spec())
    await provider.list()
    stats = (await cloud.admin.get("/admin/stats")).json()
    assert (stats["create_calls"], stats["list_calls"], stats["live_instances"]) == (1, 1, 1)

    response = await cloud.admin.put(
        "/admin/inventory",
        json={
            "offers": [
                {"gpu_type": "B200", "region": "r9", "count": 2, "price_per_gpu_hour": 5.5},
            ]
        },
    )
    assert response.status_code == 200
    offers = await provider.capacity()
    assert [(o.gpu_type, o.region, o.available) for o in offers] == [("B200", "r9", 2)]
    with pytest.raises(InvalidSpec):
        await provider.create(spec("n-z"))  # H100 is no longer sold

    assert (await cloud.admin.post("/admin/reset")).status_code == 204
    stats = cloud.state.stats()
    assert (stats["create_calls"], stats["instances_created"], stats["live_instances"]) == (0, 0, 0)
    assert {o.gpu_type for o in await provider.capacity()} == {"H100", "A100", "L40S", "L4"}


async def test_admin_config_changes_knobs(cloud: Cloud) -> None:
    response = await cloud.admin.patch("/admin/config", json={"boot_delay": 12.5})
    assert response.json()["boot_delay"] == 12.5
    inst = await cloud.provider().create(spec())
    assert inst.state is InstanceState.PENDING


# -- faults and retries -----------------------------------------------------------------------


async def test_rate_limit_with_long_retry_after_is_raised_at_once(cloud: Cloud) -> None:
    cloud.state.faults.add(endpoint="create", status=429, retry_after=30)
    with pytest.raises(RateLimited) as caught:
        await cloud.provider().create(spec())
    assert caught.value.retry_after == 30.0
    assert cloud.state.stats()["create_calls"] == 1
    assert cloud.state.stats()["instances_created"] == 0


async def test_rate_limit_with_short_retry_after_is_retried(cloud: Cloud) -> None:
    response = await cloud.admin.post(
        "/admin/faults", json={"endpoint": "list", "status": 429, "retry_after": 0.01}
    )
    assert response.status_code == 201
    assert await cloud.provider().list() == []
    assert cloud.state.stats()["list_calls"] == 2
    assert cloud.state.stats()["faults_injected"] == 1


async def test_rate_limit_waits_the_retry_after(cloud: Cloud) -> None:
    cloud.state.faults.add(endpoint="capacity", status=429, retry_after=0.15)
    started = time.monotonic()
    offers = await cloud.provider().capacity()
    assert time.monotonic() - started >= 0.14  # backoff alone would be ~0.001 s
    assert len(offers) == 6
    assert cloud.state.stats()["capacity_calls"] == 2


async def test_transient_5xx_is_retried_then_succeeds(cloud: Cloud) -> None:
    cloud.state.faults.add(endpoint="create", status=503, count=2)
    inst = await cloud.provider().create(spec())

    assert inst.state is InstanceState.RUNNING
    assert cloud.state.stats()["create_calls"] == 3
    assert cloud.state.stats()["instances_created"] == 1


async def test_persistent_5xx_gives_up_with_transient_error(cloud: Cloud) -> None:
    cloud.state.faults.add(endpoint="*", status=500, count=10)
    with pytest.raises(TransientError) as caught:
        await cloud.provider(max_attempts=3).capacity()
    assert "HTTP 500" in str(caught.value)
    assert cloud.state.stats()["capacity_calls"] == 3


async def test_connection_errors_are_retried(cloud: Cloud) -> None:
    flaky = FailingTransport(
        httpx.ConnectError, failures=2, inner=httpx.ASGITransport(app=cloud.app)
    )
    inst = await cloud.provider(transport=flaky).create(spec())
    assert inst.name == f"{NODE}-uid1"
    assert flaky.calls == 3
    assert cloud.state.stats()["create_calls"] == 1


async def test_timeouts_become_transient_errors(cloud: Cloud) -> None:
    flaky = FailingTransport(
        httpx.ReadTimeout, failures=100, inner=httpx.ASGITransport(app=cloud.app)
    )
    with pytest.raises(TransientError) as caught:
        await cloud.provider(transport=flaky, max_attempts=2).list()
    assert "timed out" in str(caught.value)
    assert flaky.calls == 2


async def test_create_retry_after_a_lost_response_does_not_duplicate(cloud: Cloud) -> None:
    """The cloud got the create but the answer was lost: the retry must find the same one."""

    class LoseFirstAnswer(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.ASGITransport(app=cloud.app)
            self.calls = 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            self.calls += 1
            response = await self.inner.handle_async_request(request)
            if self.calls == 1:
                raise httpx.ReadTimeout("answer lost", request=request)
            return response

    inst = await cloud.provider(transport=LoseFirstAnswer()).create(spec())
    assert cloud.state.stats()["create_calls"] == 2
    assert cloud.state.stats()["instances_created"] == 1
    assert [e["id"] for e in cloud.state.ledger()["instances"]] == [inst.id]


def test_retry_after_header_forms() -> None:
    from providers.mock.client import _parse_retry_after

    assert _parse_retry_after("7") == 7.0
    assert _parse_retry_after("0.25") == 0.25
    assert _parse_retry_after(None) is None
    assert _parse_retry_after("soon") is None
    assert _parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    future = (datetime.now(UTC) + timedelta(seconds=120)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    parsed = _parse_retry_after(future)
    assert parsed is not None and 100 < parsed <= 120


async def test_fault_knob_rejects_unknown_endpoints(cloud: Cloud) -> None:
    response = await cloud.admin.post("/admin/faults", json={"endpoint": "nope", "status": 500})
    assert response.status_code == 400
    assert (await cloud.admin.get("/admin/faults")).json() == {"faults": []}
    with pytest.raises(ValueError, match="unknown endpoint"):
        cloud.state.faults.add(endpoint="nope", status=500)


async def test_list_asks_the_cloud_to_filter_and_checks_again(cloud: Cloud) -> None:
    seen: list[httpx.URL] = []

    def lax_cloud(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        base = {"state": "running", "gpu_count": 1}
        return httpx.Response(
            200,
            json={
                "instances": [
                    {**base, "id": "i-1", "name": "mine", "tags": {TAG_NODE: NODE}},
                    {**base, "id": "i-2", "name": "theirs", "tags": {TAG_NODE: "vk-other"}},
                    {**base, "id": "i-3", "name": "untagged", "tags": {}},
                ]
            },
        )

    provider = cloud.provider(transport=httpx.MockTransport(lax_cloud))
    assert [i.id for i in await provider.list()] == ["i-1"]
    assert [url.params.get("tag") for url in seen] == [f"{TAG_NODE}={NODE}"]


async def test_gpu_metrics_of_all_our_instances_in_one_call(cloud: Cloud) -> None:
    provider = cloud.provider()
    mine = [await provider.create(spec(f"n-{i}")) for i in range(3)]
    other = cloud.provider(owner="another-node")
    theirs = await other.create(spec("n-x"))
    before = (await cloud.admin.get("/admin/stats")).json()["metrics_calls"]
    every = await provider.gpu_metrics_all()
    assert (await cloud.admin.get("/admin/stats")).json()["metrics_calls"] == before + 1
    assert set(every) == {i.id for i in mine}, "only this owner's instances"
    assert theirs.id not in every
    for inst in mine:
        assert every[inst.id] == await provider.gpu_metrics(inst.id)


async def test_regions_keep_offers_and_creates_inside_them(cloud: Cloud) -> None:
    everywhere = cloud.provider()
    assert {o.region for o in await everywhere.capacity()} >= {"us-east", "eu-west"}
    assert (await everywhere.create(spec("n-any"))).region == "eu-west", "H100 is cheaper there"
    us = cloud.provider(regions=["us-east"])
    assert {o.region for o in await us.capacity()} == {"us-east"}
    inst = await us.create(spec("n-us"))
    assert inst.region == "us-east", "not the cheaper region outside the allowed ones"
    with pytest.raises(ValueError, match="regions"):
        cloud.provider(regions="us-east")


@pytest.mark.parametrize(("method", "path"), [("POST", "/instances"),
                                              ("PUT", "/admin/scenario")])
async def test_a_body_that_is_not_json_is_a_422_naming_the_body(cloud: Cloud, method: str,
                                                                 path: str) -> None:
    response = await cloud.admin.request(method, path, content=b"{not json",
                                         headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "body: not valid JSON"


async def test_gpu_temperature_can_be_pinned_hot_and_released(cloud: Cloud) -> None:
    provider = cloud.provider()
    inst = await provider.create(spec("n-hot"))
    response = await cloud.admin.post(f"/admin/instances/{inst.id}/temperature",
                                      json={"celsius": 85})
    assert response.status_code == 200
    metrics = await provider.gpu_metrics(inst.id)
    assert {g["temperature_c"] for g in metrics["gpus"]} == {85.0}
    bad = await cloud.admin.post(f"/admin/instances/{inst.id}/temperature",
                                 json={"celsius": 400})
    assert bad.status_code == 422
    await cloud.admin.post(f"/admin/instances/{inst.id}/temperature", json={"celsius": None})
    metrics = await provider.gpu_metrics(inst.id)
    assert all(g["temperature_c"] < 85.0 for g in metrics["gpus"])


async def test_a_tick_advances_only_the_instances_that_are_due(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = cloud.provider()
    short = await provider.create(spec(name=f"{NODE}-short", tags={TAG_RUN_SECONDS: "5"}))
    for i in range(20):
        await provider.create(spec(name=f"{NODE}-long{i}"))
    cloud.clock.advance(cloud.state.boot_delay + 0.01)
    cloud.state.tick(full=False)
    assert {i["state"] for i in cloud.state.list_instances()} == {"running"}
    advanced: list[str] = []
    real = _Record.advance

    def counting(self: _Record, *, now: float) -> None:
        advanced.append(self.id)
        real(self, now=now)

    monkeypatch.setattr(_Record, "advance", counting)
    cloud.state.tick(full=False)
    assert advanced == [], "nothing is due: no instance is touched"
    cloud.clock.advance(5)
    cloud.state.tick(full=False)
    assert advanced == [short.id]
    assert cloud.state.get(short.id)["state"] == "exited"
    # what is done to an instance moves its due time: a delete, a restart
    long0, long1 = [i["id"] for i in cloud.state.list_instances() if i["state"] == "running"][:2]
    cloud.state.delete_delay = 3.0
    cloud.state.delete(long0)
    advanced.clear()
    cloud.clock.advance(2.9)
    cloud.state.tick(full=False)
    assert advanced == [] and long0 in {i["id"] for i in cloud.state.list_instances()}
    cloud.clock.advance(0.2)
    cloud.state.tick(full=False)
    assert advanced == [long0]
    assert long0 not in {i["id"] for i in cloud.state.list_instances()}, "released"
    cloud.state.boot_delay = 2.0
    assert cloud.state.restart(long1)["state"] == "pending"
    advanced.clear()
    cloud.clock.advance(cloud.state.boot_delay)
    cloud.state.tick(full=False)
    assert advanced == [long1] and cloud.state.get(long1)["state"] == "running"

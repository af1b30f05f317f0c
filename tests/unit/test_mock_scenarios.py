"""Unit tests of mock-cloud scenarios: parsing, each fault's effect, and the ``mock_cloud`` fixture.

Why it exists: a chaos run is only evidence if the chaos is what the scenario says. Each fault
is checked here through :class:`MockProvider` (what a client sees) on a :class:`ManualClock`
with a seed, so the tests are fast and give the same answer every time.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.base import (
    TAG_UID,
    CapacityError,
    InstanceSpec,
    InstanceState,
    Port,
    RateLimited,
    TransientError,
)
from providers.mock import ManualClock, MockCloudState, MockProvider, create_app
from providers.mock.scenario import (
    Faults,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)
from vkprovider.testing.mockcloud import BUILTIN_SCENARIOS, MockCloud, resolve_scenario

BASE_URL = "http://mock.test"
NODE = "vk-node"


class Cloud:
    """A mock cloud on a manual clock, and providers that talk to it in process."""

    def __init__(self, scenario: Scenario | dict[str, Any] | None = None, **knobs: Any) -> None:
        self.clock = ManualClock()
        if isinstance(scenario, dict):
            scenario = parse_scenario(scenario)
        self.state = MockCloudState(clock=self.clock, sleep=self.clock.sleep, scenario=scenario,
                                    **knobs)
        self.app = create_app(state=self.state)
        self.admin = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                       base_url=BASE_URL)
        self._providers: list[MockProvider] = []

    def provider(self, **kwargs: Any) -> MockProvider:
        kwargs.setdefault("backoff_initial", 0.0001)
        kwargs.setdefault("backoff_max", 0.001)
        provider = MockProvider(name="mock", base_url=BASE_URL, owner=NODE,
                                transport=httpx.ASGITransport(app=self.app), **kwargs)
        self._providers.append(provider)
        return provider

    async def aclose(self) -> None:
        for provider in self._providers:
            await provider.aclose()
        await self.admin.aclose()


@pytest.fixture
async def clouds() -> AsyncIterator[list[Cloud]]:
    made: list[Cloud] = []
    yield made
    for cloud in made:
        await cloud.aclose()


def make(clouds: list[Cloud], scenario: dict[str, Any] | None = None, **knobs: Any) -> Cloud:
    cloud = Cloud(scenario, **knobs)
    clouds.append(cloud)
    return cloud


def spec(uid: str = "u1", **overrides: Any) -> InstanceSpec:
    fields: dict[str, Any] = {"name": f"{NODE}-{uid}", "image": "img", "gpu_type": "H100",
                              "gpu_count": 1, "tags": {TAG_UID: uid}}
    fields.update(overrides)
    return InstanceSpec(**fields)


# -- parsing ----------------------------------------------------------------------------------


def test_every_shipped_scenario_parses() -> None:
    files = sorted(BUILTIN_SCENARIOS.glob("*.yaml"))
    assert {f.stem for f in files} >= {"flaky", "capacity-crunch", "duplicate-trap", "mixed"}
    for file in files:
        scenario = load_scenario(file)
        assert scenario.name == file.stem
        assert scenario.seed is not None, f"{file.name}: a shipped scenario must be repeatable"


def test_a_full_scenario_parses(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("""
seed: 9
boot_delay: 2
delete_delay: 1
inventory: [{gpu_type: H100, region: r1, count: 4, price_per_gpu_hour: 2.5}]
faults:
  endpoints: {create: {error_rate: 0.5, error_status: 502}, "*": {hang_rate: 1, hang_seconds: 3}}
  rate_limits: [{endpoints: [list], start: 1, duration: 2, every: 10, retry_after: 4}]
  capacity_outages: [{gpu_type: H100, region: r1, duration: 60, count: 1}]
  crash: {rate_per_second: 0.01, message: preempted}
  deletes: {slow_rate: 0.5, slow_seconds: 9, fail_rate: 0.1}
  lost_create_responses: {rate: 0.2, mode: disconnect}
  list_lag_seconds: 5
""")
    s = load_scenario(path)
    assert s.seed == 9 and s.inventory is not None and s.inventory[0].count == 4
    assert s.faults.for_endpoint("create") == s.faults.endpoints["create"]
    assert s.faults.for_endpoint("list") == s.faults.endpoints["*"]
    assert s.faults.lost_create_responses.mode == "disconnect"
    assert s.faults.rate_limits[0].active(elapsed=1.5)
    assert not s.faults.rate_limits[0].active(elapsed=3.5)
    assert s.faults.rate_limits[0].active(elapsed=11.5)


BAD: list[tuple[str, str]] = [
    ("faults: {endpoints: {create: {error_rate: 1.5}}}", "faults.endpoints.create.error_rate"),
    ("faults: {endpoints: {create: {error_status: 404}}}", "faults.endpoints.create.error_status"),
    ("faults: {endpoints: {upload: {error_rate: 0.1}}}", "faults.endpoints.upload"),
    ("faults: {endpoints: {get: {hang_seconds: 100000}}}", "faults.endpoints.get.hang_seconds"),
    ("faults: {rate_limits: [{duration: 5, every: 5}]}", "faults.rate_limits.0"),
    ("faults: {rate_limits: [{start: 1}]}", "faults.rate_limits.0.duration"),
    ("faults: {capacity_outages: [{region: r1}]}", "faults.capacity_outages.0.gpu_type"),
    ("faults: {crash: {rate_per_second: -1}}", "faults.crash.rate_per_second"),
    ("faults: {lost_create_responses: {mode: drop}}", "faults.lost_create_responses.mode"),
    ("faults: {list_lag: 3}", "faults.list_lag"),
    ("inventory: [{gpu_type: H100, region: r, count: -1, price_per_gpu_hour: 1}]",
     "inventory.0.count"),
    ("boot_delay: .nan", "boot_delay"),
    ("sead: 1", "sead"),
]


@pytest.mark.parametrize(("text", "field"), BAD, ids=[b[1] for b in BAD])
def test_bad_scenarios_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert f"{field}:" in message or f"{field} " in message or message.endswith(field), message


def test_bad_yaml_duplicate_offers_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("faults: {endpoints: [\n")
    with pytest.raises(ScenarioError, match="not valid YAML at line"):
        load_scenario(path)
    path.write_text("inventory: [{gpu_type: A, region: r, count: 1, price_per_gpu_hour: 1},"
                    " {gpu_type: A, region: r, count: 2, price_per_gpu_hour: 1}]")
    with pytest.raises(ScenarioError, match="twice"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")
    with pytest.raises(ScenarioError, match=r"valid dictionary|Input should be"):
        parse_scenario(["a", "list"])


def test_errors_never_echo_the_value(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("faults: {crash: {message: 12, exit_code: sk-secret-value}}")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert "sk-secret-value" not in str(caught.value)
    assert "faults.crash.exit_code" in str(caught.value)


# -- each fault through MockProvider -----------------------------------------------------------


async def test_5xx_rate_is_seeded_repeatable_and_retried(clouds: list[Cloud]) -> None:
    outcomes = []
    for _ in range(2):
        cloud = make(clouds, {"seed": 5, "faults": {"endpoints": {
            "capacity": {"error_rate": 0.5, "error_status": 502}}}})
        provider = cloud.provider(max_attempts=1)
        run = []
        for _ in range(20):
            try:
                await provider.capacity()
                run.append("ok")
            except TransientError as exc:
                assert "502" in str(exc)
                run.append("5xx")
        outcomes.append(run)
        assert cloud.state.stats()["injected_errors"] == run.count("5xx")
    assert outcomes[0] == outcomes[1], "one seed, one run"
    assert 3 <= outcomes[0].count("5xx") <= 17
    retried = make(clouds, {"seed": 5, "faults": {"endpoints": {
        "create": {"error_rate": 0.5}}}}).provider(max_attempts=10)
    for i in range(5):
        await retried.create(spec(f"u{i}"))  # retries ride the faults out


async def test_hang_delays_the_answer_on_the_clock(clouds: list[Cloud]) -> None:
    cloud = make(clouds, {"faults": {"endpoints": {"list": {"hang_rate": 1.0,
                                                           "hang_seconds": 7}}}})
    before = cloud.clock()
    assert await cloud.provider().list() == []
    assert cloud.clock() - before == pytest.approx(7.0)
    assert cloud.state.stats()["injected_hangs"] == 1
    await cloud.provider().capacity()  # other endpoints answer at once
    assert cloud.clock() - before == pytest.approx(7.0)


async def test_rate_limit_bursts_answer_429_with_retry_after_in_their_window(
    clouds: list[Cloud],
) -> None:
    cloud = make(clouds, {"faults": {"rate_limits": [
        {"endpoints": ["create"], "start": 10, "duration": 5, "every": 30, "retry_after": 60}]}})
    provider = cloud.provider()
    await provider.create(spec("before"))
    cloud.clock.advance(11)
    with pytest.raises(RateLimited) as caught:
        await provider.create(spec("during"))
    assert caught.value.retry_after == 60
    await provider.list()  # only the named endpoints are limited
    resp = await cloud.admin.post("/instances", json={"name": "x", "image": "i", "gpu_count": 1})
    assert resp.status_code == 429 and resp.headers["Retry-After"] == "60"
    cloud.clock.advance(5)
    await provider.create(spec("after"))
    cloud.clock.advance(25)  # the next burst: 41 s in, 1 s into the second window
    with pytest.raises(RateLimited):
        await provider.create(spec("again"))
    assert cloud.state.stats()["injected_rate_limited"] == 3


async def test_short_429_burst_is_ridden_out_by_the_client() -> None:
    # the client waits Retry-After in real time, so this cloud runs on the real clock
    state = MockCloudState(scenario=parse_scenario(
        {"faults": {"rate_limits": [{"duration": 0.3, "retry_after": 0.2}]}}))
    async with MockProvider(name="mock", base_url=BASE_URL, owner=NODE, max_attempts=5,
                            transport=httpx.ASGITransport(app=create_app(state=state))) as p:
        inst = await p.create(spec())
    assert inst.name == f"{NODE}-u1"
    assert 1 <= state.stats()["injected_rate_limited"] <= 2


async def test_capacity_outage_caps_one_type_and_region_for_its_window(
    clouds: list[Cloud],
) -> None:
    cloud = make(clouds, {"inventory": [
        {"gpu_type": "H100", "region": "r1", "count": 8, "price_per_gpu_hour": 2.0},
        {"gpu_type": "H100", "region": "r2", "count": 8, "price_per_gpu_hour": 3.0},
        {"gpu_type": "A100", "region": "r1", "count": 8, "price_per_gpu_hour": 1.0}],
        "faults": {"capacity_outages": [
            {"gpu_type": "H100", "region": "r1", "duration": 60, "count": 1}]}})
    provider = cloud.provider()
    offers = {(o.gpu_type, o.region): o.available for o in await provider.capacity()}
    assert offers == {("H100", "r1"): 1, ("H100", "r2"): 8, ("A100", "r1"): 8}
    with pytest.raises(CapacityError):
        await provider.create(spec("big", region="r1", gpu_count=2))
    assert (await provider.create(spec("small", region="r1"))).region == "r1"
    assert (await provider.create(spec("spill"))).region == "r2"  # cheapest with room
    assert cloud.state.stats()["injected_capacity_refusals"] == 1
    cloud.clock.advance(60)
    assert (await provider.create(spec("later", region="r1", gpu_count=2))).region == "r1"


async def test_crash_rate_fails_running_instances_with_the_message(clouds: list[Cloud]) -> None:
    cloud = make(clouds, {"seed": 1, "boot_delay": 10, "faults": {
        "crash": {"rate_per_second": 0.01, "message": "spot preempted"}}})
    provider = cloud.provider()
    ids = [(await provider.create(spec(f"u{i}"))).id for i in range(20)]
    cloud.clock.advance(9)
    assert all(i.state is InstanceState.PENDING for i in await provider.list())  # booting
    cloud.clock.advance(1 + 100)
    states = {i.id: i for i in await provider.list()}
    failed = [i for i in states.values() if i.state is InstanceState.FAILED]
    # P(crash within 100 s) = 1 - e^-1 = 63%; with this seed, some but not all
    assert 0 < len(failed) < 20
    assert all(i.message == "spot preempted" for i in failed)
    assert cloud.state.stats()["injected_crashes"] == len(failed)
    ledger = {e["id"]: e for e in cloud.state.ledger()["instances"]}
    assert {ledger[i]["state"] for i in ids} == {"running", "failed"}
    # a crashed instance is billed until it is deleted, like any other stopped one
    cloud.clock.advance(3600)
    assert all(e["cost"] > 0 for e in ledger.values() if e["state"] == "failed")
    # a new profile without crashes: the survivors live on
    cloud.state.set_faults(Faults())
    cloud.clock.advance(10_000)
    assert sum(i.state is InstanceState.RUNNING for i in await provider.list()) == 20 - len(
        failed)


async def test_slow_and_failing_deletes(clouds: list[Cloud]) -> None:
    cloud = make(clouds, {"delete_delay": 1, "faults": {"deletes": {
        "slow_rate": 1.0, "slow_seconds": 20}}})
    provider = cloud.provider()
    inst = await provider.create(spec())
    await provider.delete(inst.id)
    cloud.clock.advance(20)
    assert (await provider.get(inst.id)).state is InstanceState.TERMINATING
    cloud.clock.advance(1.5)
    assert await provider.list() == []
    assert cloud.state.stats()["injected_slow_deletes"] == 1

    cloud.state.set_faults({"deletes": {"fail_rate": 1.0}})
    doomed = await provider.create(spec("u2"))
    await provider.delete(doomed.id)
    assert (await provider.get(doomed.id)).state is InstanceState.TERMINATING
    cloud.clock.advance(2)
    back = await provider.get(doomed.id)
    assert back.state is InstanceState.RUNNING, "the delete came to nothing"
    cloud.state.clear_faults()
    await provider.delete(doomed.id)
    cloud.clock.advance(2)
    assert await provider.list() == []
    assert cloud.state.stats()["injected_failed_deletes"] == 1
    assert all(e["state"] == "deleted" for e in cloud.state.ledger()["instances"])


async def test_lost_create_response_is_the_duplicate_trap(clouds: list[Cloud]) -> None:
    cloud = make(clouds, {"faults": {"lost_create_responses": {"rate": 1.0}}})
    # a client that does not retry sees a failure, but the cloud made (and bills) the instance
    with pytest.raises(TransientError, match="504"):
        await cloud.provider(max_attempts=1).create(spec("u1"))
    assert cloud.state.stats()["instances_created"] == 1
    # a client retrying by name finds it: no duplicate
    found = await cloud.provider(max_attempts=3).create(spec("u1"))
    assert cloud.state.stats()["instances_created"] == 1
    assert found.id == cloud.state.ledger()["instances"][0]["id"]
    # a client retrying blindly (a new name per attempt) makes one instance per attempt
    for attempt in range(3):
        with pytest.raises(TransientError):
            await cloud.provider(max_attempts=1).create(spec("u2", name=f"{NODE}-u2-{attempt}"))
    uids = [e["uid"] for e in cloud.state.ledger()["instances"]]
    assert uids.count("u2") == 3
    assert cloud.state.stats()["injected_lost_creates"] == 4


async def test_lists_lag_behind_creates(clouds: list[Cloud]) -> None:
    cloud = make(clouds, {"faults": {"list_lag_seconds": 5}})
    provider = cloud.provider()
    inst = await provider.create(spec())
    assert await provider.list() == []
    assert (await provider.get(inst.id)).id == inst.id  # get by id is consistent
    assert (await provider.create(spec())).id == inst.id  # so is create by name
    cloud.clock.advance(5)
    assert [i.id for i in await provider.list()] == [inst.id]


async def test_admin_scenario_api_replaces_the_profile_while_running(clouds: list[Cloud]) -> None:
    cloud = make(clouds)
    resp = await cloud.admin.put("/admin/scenario", json={
        "seed": 3, "boot_delay": 4, "faults": {"list_lag_seconds": 2}})
    assert resp.status_code == 200
    assert resp.json()["faults"]["list_lag_seconds"] == 2
    assert (await cloud.admin.get("/admin/config")).json()["boot_delay"] == 4
    got = (await cloud.admin.get("/admin/scenario")).json()
    assert got["seed"] == 3 and got["faults"]["list_lag_seconds"] == 2
    bad = await cloud.admin.put("/admin/scenario", json={"faults": {"crash": {
        "rate_per_second": 9}}})
    assert bad.status_code == 422
    assert "faults.crash.rate_per_second" in bad.json()["error"]["message"]
    assert (await cloud.admin.delete("/admin/scenario")).status_code == 204
    assert (await cloud.admin.get("/admin/scenario")).json()["faults"]["list_lag_seconds"] == 0


async def test_reset_restores_the_constructors_scenario(clouds: list[Cloud]) -> None:
    cloud = make(clouds, {"seed": 8, "faults": {"list_lag_seconds": 9}})
    cloud.state.clear_faults()
    await cloud.provider().create(spec())
    assert (await cloud.admin.post("/admin/reset")).status_code == 204
    assert cloud.state.scenario_faults.list_lag_seconds == 9
    assert cloud.state.stats()["instances_created"] == 0


async def test_no_scenario_changes_nothing(clouds: list[Cloud]) -> None:
    cloud = make(clouds)
    provider = cloud.provider(max_attempts=1)
    for i in range(30):
        await provider.create(spec(f"u{i}", gpu_type="L4"))
    await provider.list()
    stats = cloud.state.stats()
    assert stats["faults_injected"] == 0
    assert all(v == 0 for k, v in stats.items() if k.startswith("injected_"))
    assert math.isclose(cloud.state.ledger()["total_cost"], 0.0)


# -- the fixture ------------------------------------------------------------------------------


async def test_fixture_serves_a_cloud_over_http(mock_cloud: MockCloud) -> None:
    assert mock_cloud.url.startswith("http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=mock_cloud.url) as http:
        assert (await http.get("/healthz")).json() == {"ok": True}
    provider = mock_cloud.provider(owner="team-a")
    inst = await provider.create(spec(gpu_type="L4"))
    assert mock_cloud.ledger()["instances"][0]["id"] == inst.id
    mock_cloud.set_faults(list_lag_seconds=60)
    assert await provider.list() == []
    mock_cloud.set_faults()
    assert [i.id for i in await provider.list()] == [inst.id]


@pytest.mark.mock_cloud_scenario("duplicate-trap", boot_delay=0.0)
async def test_fixture_takes_a_scenario_from_the_marker(mock_cloud: MockCloud) -> None:
    assert mock_cloud.state.scenario_faults.lost_create_responses.rate == pytest.approx(0.3)
    assert mock_cloud.state.scenario_faults.list_lag_seconds == 5
    assert mock_cloud.state.boot_delay == 1.0  # the scenario's value wins over the kwarg


@pytest.mark.mock_cloud_scenario({"faults": {"lost_create_responses": {
    "rate": 1.0, "mode": "disconnect"}}})
async def test_disconnect_mode_drops_the_connection_mid_answer(mock_cloud: MockCloud) -> None:
    provider = mock_cloud.provider(max_attempts=1, timeout=5)
    with pytest.raises(TransientError):
        await provider.create(spec(gpu_type="L4"))
    assert mock_cloud.stats()["instances_created"] == 1
    retried = mock_cloud.provider(max_attempts=2, timeout=5, backoff_initial=0.01)
    mock_cloud.set_faults()
    assert (await retried.create(spec(gpu_type="L4"))).id == mock_cloud.ledger()[
        "instances"][0]["id"]


@pytest.mark.parametrize("mock_cloud", ["flaky", "mixed"], indirect=True)
async def test_fixture_takes_a_scenario_as_a_parameter(mock_cloud: MockCloud) -> None:
    assert mock_cloud.state.scenario_faults.endpoints
    assert mock_cloud.state.seed in (7, 42)


def test_resolve_scenario_accepts_names_paths_dicts_and_scenarios(tmp_path: Path) -> None:
    assert resolve_scenario("mixed").name == "mixed"
    (tmp_path / "mine.yaml").write_text("name: mine\n")
    assert resolve_scenario("mine.yaml", base_dir=tmp_path).name == "mine"
    assert resolve_scenario(tmp_path / "mine.yaml").name == "mine"
    assert resolve_scenario({"name": "d"}).name == "d"
    assert resolve_scenario(Scenario(name="s")).name == "s"
    with pytest.raises(ScenarioError):
        resolve_scenario("no-such-builtin")


# -- a lying cloud: published_hosts -------------------------------------------------------------


async def test_published_hosts_make_matching_instances_report_the_chosen_address(
    clouds: list[Cloud],
) -> None:
    cloud = make(clouds, {"faults": {"published_hosts": [
        {"tags": {TAG_UID: "evil"}, "host": "10.0.0.5"},
        {"tags": {TAG_UID: "meta", "team": "x"}, "host": "169.254.169.254"},
    ]}})
    provider = cloud.provider()
    ports = (Port(container_port=8000),)
    await provider.create(spec("evil", ports=ports))
    await provider.create(spec("meta", ports=ports))  # lacks the team tag: not matched
    await provider.create(spec("meta2", ports=ports, tags={TAG_UID: "meta", "team": "x"}))
    await provider.create(spec("good", ports=ports))
    by_name = {i.name: i for i in await provider.list()}
    hosts = {name.removeprefix(f"{NODE}-"): [p.host for p in i.published]
             for name, i in by_name.items()}
    assert hosts["evil"] == ["10.0.0.5"]
    assert hosts["meta2"] == ["169.254.169.254"]
    for honest in ("meta", "good"):
        [host] = hosts[honest]
        assert host.startswith("198.18."), honest
    assert all(p.port >= 30000 for i in by_name.values() for p in i.published)
    # it is part of the scenario in force (GET /admin/scenario shows it)
    shown = cloud.state.scenario()["faults"]["published_hosts"]
    assert shown[0] == {"tags": {TAG_UID: "evil"}, "host": "10.0.0.5"}

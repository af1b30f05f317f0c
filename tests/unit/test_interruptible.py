"""Interruptible (spot) offers, issue 15 item 3: the policy field, placement's plan, the mock
cloud's spot offers and interruptions, the pod condition and the companion's trigger."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from providers.base import TAG_UID, Instance, InstanceSpec, InstanceState, Offer
from providers.mock import InventoryOffer
from providers.mock.scenario import ScenarioError, parse_scenario
from tests.unit.test_mock_cloud import START, Cloud
from vkprovider.descheduler.fit import slim_pod
from vkprovider.descheduler.hotswap import HOT_GPU, INTERRUPTION, SwapIntent, replaceable
from vkprovider.node import podstatus
from vkprovider.node.providercaps import expected_price, fold_capacity
from vkprovider.placement.budget import POLICY_ANNOTATION
from vkprovider.placement.policy import PolicyError, parse_overflow_policy
from vkprovider.placement.spot import CONDITION_PLANNED, not_sold, plan

NODE = "vk-gpu-burst"

# ---- the policy field ---------------------------------------------------------------------


def _policy(**spec: Any) -> dict[str, Any]:
    return {"kind": "OverflowPolicy", "metadata": {"name": "p"},
            "spec": {"providers": ["a"], **spec}}


def test_interruptible_defaults_to_never_and_takes_the_three_modes() -> None:
    assert parse_overflow_policy(_policy()).spec.interruptible == "Never"
    for mode in ("Never", "Allow", "Prefer"):
        assert parse_overflow_policy(_policy(interruptible=mode)).spec.interruptible == mode


@pytest.mark.parametrize("bad", ["Always", "allow", "", True, 1])
def test_a_bad_interruptible_value_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(PolicyError) as err:
        parse_overflow_policy(_policy(interruptible=bad))
    assert err.value.field == "spec.interruptible"


# ---- placement's plan -----------------------------------------------------------------------


def offer(provider: str, price: float, *, spot: bool = False, available: int = 4,
          gpu: str = "H100", region: str = "r1") -> Offer:
    return Offer(provider=provider, gpu_type=gpu, region=region, available=available,
                 price_per_gpu_hour=price, interruptible=spot)


def run(offers: list[Offer], *, mode: Any, cheapest: bool, names: tuple[str, ...] = ("a", "b"),
        blocked: frozenset[str] = frozenset()) -> list[tuple[str, bool]]:
    return [(c.provider, c.interruptible) for c in plan(
        list(names), offers=offers, gpu_type="H100", gpus=1, mode=mode, cheapest=cheapest,
        blocked=lambda o: o.provider in blocked)]


OFFERS = [offer("a", 3.0), offer("a", 1.0, spot=True), offer("b", 2.0), offer("b", 0.8, spot=True)]


def test_never_asks_on_demand_only_exactly_as_before() -> None:
    assert run(OFFERS, mode="Never", cheapest=False) == [("a", False), ("b", False)]
    assert run(OFFERS, mode="Never", cheapest=True) == [("b", False), ("a", False)]


def test_allow_ordered_keeps_the_provider_order_and_takes_each_ones_cheaper_kind_first() -> None:
    assert run(OFFERS, mode="Allow", cheapest=False) == [
        ("a", True), ("a", False), ("b", True), ("b", False)]


def test_allow_cheapest_lets_every_provider_and_kind_compete_on_price() -> None:
    assert run(OFFERS, mode="Allow", cheapest=True) == [
        ("b", True), ("a", True), ("b", False), ("a", False)]
    # a spot offer dearer than on demand is not preferred
    dear = [offer("a", 1.0), offer("a", 1.5, spot=True)]
    assert run(dear, mode="Allow", cheapest=True, names=("a",)) == [("a", False), ("a", True)]


def test_prefer_tries_every_interruptible_candidate_first() -> None:
    assert run(OFFERS, mode="Prefer", cheapest=False) == [
        ("a", True), ("b", True), ("a", False), ("b", False)]
    assert run(OFFERS, mode="Prefer", cheapest=True) == [
        ("b", True), ("a", True), ("b", False), ("a", False)]


def test_a_provider_without_spot_offers_is_only_asked_on_demand() -> None:
    offers = [offer("a", 3.0), offer("b", 2.0)]
    assert run(offers, mode="Prefer", cheapest=False) == [("a", False), ("b", False)]
    # unknown offers (capacity read failed): on demand, as before
    assert run([], mode="Allow", cheapest=True) == [("a", False), ("b", False)]


def test_a_spot_only_provider_is_asked_for_spot_only_and_never_under_never() -> None:
    offers = [offer("a", 1.0, spot=True), offer("b", 2.0)]
    assert run(offers, mode="Allow", cheapest=True) == [("a", True), ("b", False)]
    assert run(offers, mode="Never", cheapest=False) == [("a", False), ("b", False)]
    assert not_sold(offers, provider="a", gpu_type="H100", interruptible=False) == (
        "a: sells H100 only as interruptible (spec.interruptible does not allow it)")
    assert not_sold(offers, provider="b", gpu_type="H100", interruptible=True) == (
        "b: sells H100 only on demand")
    assert not_sold(offers, provider="b", gpu_type="A100", interruptible=False) == (
        "b: does not sell A100")
    assert not_sold(offers, provider="a", gpu_type="H100", interruptible=True) is None


def test_blocked_or_too_small_spot_offers_are_unpriced_and_go_last() -> None:
    offers = [offer("a", 3.0), offer("b", 2.0), offer("b", 0.5, spot=True, available=0)]
    assert run(offers, mode="Allow", cheapest=True) == [("b", False), ("a", False), ("b", True)]
    assert run(OFFERS, mode="Allow", cheapest=True, blocked=frozenset({"b"})) == [
        ("a", True), ("a", False), ("b", False), ("b", True)]


def test_one_gpu_sold_both_ways_counts_once_and_prices_follow_the_kind() -> None:
    offers = [offer("a", 3.0, available=4), offer("a", 1.0, spot=True, available=4),
              offer("a", 2.0, region="r2", available=2)]
    assert fold_capacity(offers, caps={}, held={}) == 6
    assert expected_price(offers, provider="a", gpu_type="H100", region=None, gpus=2) == 4.0
    assert expected_price(offers, provider="a", gpu_type="H100", region=None, gpus=2,
                          interruptible=True) == 2.0


# ---- the mock cloud -------------------------------------------------------------------------


SPOT_INVENTORY = (
    InventoryOffer(gpu_type="H100", region="us-east", count=2, price_per_gpu_hour=2.5,
                   spot_price_per_gpu_hour=0.9),
    InventoryOffer(gpu_type="A100", region="us-east", count=2, price_per_gpu_hour=1.2),
)


@pytest.fixture
async def spot_cloud() -> AsyncIterator[Cloud]:
    c = Cloud(inventory=SPOT_INVENTORY)
    yield c
    await c.aclose()


def spec(name: str = f"{NODE}-uid1", **overrides: Any) -> InstanceSpec:
    fields: dict[str, Any] = {"name": name, "image": "ghcr.io/acme/serve:1", "gpu_type": "H100",
                              "gpu_count": 1, "tags": {TAG_UID: name.rsplit("-", 1)[-1]}}
    fields.update(overrides)
    return InstanceSpec(**fields)


async def test_the_mock_sells_spot_beside_on_demand_from_one_pool(spot_cloud: Cloud) -> None:
    provider = spot_cloud.provider()
    offers = {(o.gpu_type, o.interruptible): o for o in await provider.capacity()}
    assert set(offers) == {("H100", False), ("H100", True), ("A100", False)}
    assert offers[("H100", True)].price_per_gpu_hour == 0.9
    assert offers[("H100", False)].price_per_gpu_hour == 2.5
    await provider.create(spec(interruptible=True))
    offers = {(o.gpu_type, o.interruptible): o for o in await provider.capacity()}
    assert offers[("H100", True)].available == offers[("H100", False)].available == 1


async def test_a_spot_create_rents_at_the_spot_price_and_says_so(spot_cloud: Cloud) -> None:
    provider = spot_cloud.provider()
    spot = await provider.create(spec(interruptible=True))
    demand = await provider.create(spec(f"{NODE}-uid2"))
    assert (spot.interruptible, spot.price_per_hour) == (True, 0.9)
    assert (demand.interruptible, demand.price_per_hour) == (False, 2.5)
    listed = {i.id: i for i in await provider.list()}
    assert listed[spot.id].interruptible and not listed[demand.id].interruptible
    assert listed[spot.id].interruption_at is None and not listed[spot.id].interrupted
    ledger = (await spot_cloud.admin.get("/admin/ledger")).json()["instances"]
    assert {e["id"]: e["interruptible"] for e in ledger} == {spot.id: True, demand.id: False}


async def test_a_spot_create_where_no_spot_is_sold_is_a_capacity_error(spot_cloud: Cloud) -> None:
    from providers.base import CapacityError
    with pytest.raises(CapacityError, match="interruptible A100"):
        await spot_cloud.provider().create(spec(gpu_type="A100", interruptible=True))


async def test_an_announced_interruption_is_reported_then_reclaims_the_instance(
        spot_cloud: Cloud) -> None:
    provider = spot_cloud.provider()
    inst = await provider.create(spec(interruptible=True))
    spot_cloud.clock.advance(10)
    r = await spot_cloud.admin.post(f"/admin/instances/{inst.id}/interruption",
                                    json={"in_seconds": 120})
    assert r.status_code == 200, r.text
    [noticed] = await provider.list()
    assert noticed.state is InstanceState.RUNNING
    assert noticed.interruption_at == START + timedelta(seconds=130)
    spot_cloud.clock.advance(119)
    assert (await provider.get(inst.id)).state is InstanceState.RUNNING
    spot_cloud.clock.advance(2)
    [gone] = await provider.list()
    assert gone.state is InstanceState.FAILED and gone.interrupted
    assert gone.finished_at == START + timedelta(seconds=130)
    assert gone.message is not None and "reclaimed" in gone.message
    assert gone.interruption_at is None  # the notice is over: it happened


async def test_an_unplanned_interruption_reclaims_now_and_on_demand_cannot_be_interrupted(
        spot_cloud: Cloud) -> None:
    provider = spot_cloud.provider()
    spot = await provider.create(spec(interruptible=True))
    demand = await provider.create(spec(f"{NODE}-uid2"))
    assert (await spot_cloud.admin.post(f"/admin/instances/{spot.id}/interrupt")).status_code \
        == 200
    got = await provider.get(spot.id)
    assert got.state is InstanceState.FAILED and got.interrupted
    again = await spot_cloud.admin.post(f"/admin/instances/{spot.id}/interrupt")
    assert again.status_code == 409  # already stopped
    r = await spot_cloud.admin.post(f"/admin/instances/{demand.id}/interruption",
                                    json={"in_seconds": 5})
    assert r.status_code == 409 and "not interruptible" in r.text
    bad = await spot_cloud.admin.post(f"/admin/instances/{demand.id}/interruption",
                                      json={"in_seconds": -1})
    assert bad.status_code in (400, 422)


async def test_the_admin_inventory_and_scenarios_take_a_spot_price(spot_cloud: Cloud) -> None:
    r = await spot_cloud.admin.put("/admin/inventory", json={"offers": [
        {"gpu_type": "L4", "region": "eu", "count": 3, "price_per_gpu_hour": 0.4,
         "spot_price_per_gpu_hour": 0.2}]})
    assert r.status_code == 200, r.text
    assert r.json()["offers"][0]["spot_price_per_gpu_hour"] == 0.2
    kinds = {o.interruptible for o in await spot_cloud.provider().capacity()}
    assert kinds == {False, True}
    scenario = parse_scenario({"inventory": [{"gpu_type": "L4", "region": "eu", "count": 1,
                                              "price_per_gpu_hour": 0.4,
                                              "spot_price_per_gpu_hour": 0.1}]})
    assert scenario.inventory is not None
    assert scenario.inventory[0].spot_price_per_gpu_hour == 0.1
    with pytest.raises(ScenarioError, match="spot_price_per_gpu_hour"):
        parse_scenario({"inventory": [{"gpu_type": "L4", "region": "eu", "count": 1,
                                       "price_per_gpu_hour": 0.4,
                                       "spot_price_per_gpu_hour": -1}]})
    with pytest.raises(ValueError, match="negative"):
        InventoryOffer(gpu_type="L4", region="eu", count=1, price_per_gpu_hour=1.0,
                       spot_price_per_gpu_hour=-0.1)


# ---- the pod condition and the companion's trigger -------------------------------------------


NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _pod(conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": conditions or []}}


def _instance(**kw: Any) -> Instance:
    fields: dict[str, Any] = {"id": "i-1", "name": "n", "provider": "cloud0",
                              "state": InstanceState.RUNNING, "interruptible": True,
                              "started_at": NOW - timedelta(minutes=5)}
    fields.update(kw)
    return Instance(**fields)


def _planned(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status["conditions"] if c["type"] == CONDITION_PLANNED), None)


def test_an_announced_interruption_sets_the_condition_once_with_the_time() -> None:
    at = NOW + timedelta(minutes=2)
    plain = podstatus.compute_status(pod=_pod(), instance=_instance(), node_name=NODE, now=NOW)
    assert _planned(plain) is None
    status = podstatus.compute_status(pod=_pod(), instance=_instance(interruption_at=at),
                                      node_name=NODE, now=NOW)
    cond = _planned(status)
    assert cond is not None and cond["status"] == "True"
    assert cond["reason"] == "InterruptionAnnounced"
    assert cond["message"] == "cloud0 will reclaim instance i-1 at 2026-01-01T12:02:00Z"
    # written once: the next pass with the stored condition changes nothing
    stored = _pod(status["conditions"])
    stored["status"].update({k: v for k, v in status.items() if k != "conditions"})
    later = podstatus.compute_status(pod=stored, instance=_instance(interruption_at=at),
                                     node_name=NODE, now=NOW + timedelta(seconds=30))
    assert not podstatus.status_changed(stored["status"], later)
    assert _planned(later) == cond  # same transition time


def test_the_companion_sees_the_condition_and_prefers_it_over_a_hot_gpu() -> None:
    planned = {"type": CONDITION_PLANNED, "status": "True"}
    hot = {"type": "vkprovider.io/GPUHealthy", "status": "False"}

    def slim(name: str, conds: list[dict[str, Any]], created: str) -> dict[str, Any]:
        pod = _pod(conds)
        pod["metadata"].update(name=name, uid=name, creationTimestamp=created)
        return slim_pod(pod)

    pods = [slim("both", [planned, hot], "2026-01-01T00:00:02Z"),
            slim("hot", [hot], "2026-01-01T00:00:01Z"),
            slim("fine", [], "2026-01-01T00:00:00Z"),
            slim("cleared", [{**planned, "status": "False"}], "2026-01-01T00:00:00Z")]
    assert pods[0]["status"]["interruptionPlanned"] == "True"
    assert pods[2]["status"]["interruptionPlanned"] is None
    got = [(p["metadata"]["name"], t) for p, t in replaceable(pods, virtual=[NODE])]
    assert got == [("hot", HOT_GPU), ("both", INTERRUPTION)]
    assert replaceable(pods, virtual=["elsewhere"]) == []
    assert INTERRUPTION.replacing == "ReplacingInterruptedReplica"


def test_an_intent_recorded_before_triggers_existed_is_a_hot_gpu_swap() -> None:
    old = SwapIntent(pod="p", pod_uid="u", replicas=2, started=1.0, policy="x")
    assert old.trigger == HOT_GPU.name


def test_interruptible_is_a_plain_spec_field_defaulting_off() -> None:
    s = spec()
    assert s.interruptible is False
    assert _instance().interruption_at is None and not _instance().interrupted
    with pytest.raises(TypeError):
        InstanceSpec("n", "i", 1)  # type: ignore[misc]  # keyword-only, as before


class _Store:
    def __init__(self, items: dict[str, Any]) -> None:
        self.store = items


class _Admission:
    def __init__(self, policies: list[Any]) -> None:
        self._policies = policies

    def parsed_policies(self) -> list[Any]:
        return self._policies


class _MoveBack:
    """What HotSwap.pass_once reads of move-back: its watches' stores and helpers."""

    def __init__(self, pods: list[dict[str, Any]], policies: list[Any]) -> None:
        self.pods = _Store({p["metadata"]["name"]: p for p in pods})
        dep = {"metadata": {"name": "d", "namespace": "ns", "generation": 1, "annotations": {}},
               "spec": {"replicas": 2}, "status": {"observedGeneration": 1, "replicas": 2}}
        self.deployments = _Store({"ns/d": dep})
        self.virtual = [NODE]
        self.in_flight: dict[str, Any] = {}
        self.admission = _Admission(policies)
        self._dep = dep

    def _deployment_of(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self._dep

    def _hpa_for(self, dep: dict[str, Any]) -> None:
        return None


def _marked(kind: str, policy: str) -> dict[str, Any]:
    cond = ({"type": CONDITION_PLANNED, "status": "True"} if kind == "planned"
            else {"type": "vkprovider.io/GPUHealthy", "status": "False"})
    pod = _pod([cond])
    pod["metadata"]["annotations"] = {POLICY_ANNOTATION: policy}
    return slim_pod(pod)


@pytest.mark.parametrize(("kind", "spec", "started"), [
    ("planned", {}, INTERRUPTION),  # no gpuHealth needed for an announced interruption
    ("planned", {"dryRun": True}, None),
    ("hot", {}, None),  # a hot GPU only where the policy watches GPU health
    ("hot", {"gpuHealth": {"maxTemperatureCelsius": 80}}, HOT_GPU),
])
async def test_the_companion_starts_a_swap_for_each_trigger_its_policy_allows(
        kind: str, spec: dict[str, Any], started: Any) -> None:
    import asyncio

    from vkprovider.descheduler.hotswap import HotSwap
    policy = parse_overflow_policy({"metadata": {"name": "p"},
                                    "spec": {"providers": ["a"], **spec}})
    pod = _marked(kind, "p")
    swap = HotSwap(moveback=_MoveBack([pod], [policy]))  # type: ignore[arg-type]
    seen: list[Any] = []

    async def replace(*, dep: Any, pod: Any, policy: Any, trigger: Any) -> Any:
        seen.append(trigger)

    swap._replace = replace  # type: ignore[method-assign]
    await swap.pass_once()
    await asyncio.sleep(0)
    assert seen == ([] if started is None else [started])

"""Unit tests for GPUProvider-sourced providers: options mapping, caps, health, status, drains."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from providers.base import (
    AuthError,
    CapacityError,
    Instance,
    InstanceState,
    Offer,
    Provider,
    RateLimited,
    TransientError,
)
from providers.mock.client import MockProvider
from vkprovider.config import LeaderElectionSettings, Settings
from vkprovider.errors import ConfigError
from vkprovider.kube import KubeClient
from vkprovider.metrics import Metrics
from vkprovider.node.pods import Placed, PodController
from vkprovider.node.providercaps import (
    Held,
    ProviderCaps,
    capped_free,
    caps_refusal,
    expected_price,
    fold_capacity,
)
from vkprovider.node.providerset import _problem_from_config_error, fingerprint
from vkprovider.node.providerstatus import (
    HealthTracker,
    blocked_offers,
    build_status,
    status_changed,
)
from vkprovider.placement import policy as pol
from vkprovider.placement.blocks import Block
from vkprovider.registry import adapter_options, build_from_spec

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def spec(**fields: Any) -> pol.GPUProviderSpec:
    return pol.parse_gpu_provider({"metadata": {"name": "p"}, "spec": fields}).spec


# ---- options mapping --------------------------------------------------------------------------


def test_runpod_gets_gpu_types_and_regions_as_its_own_options() -> None:
    s = spec(type="runpod", credentialsSecret={"namespace": "ns", "name": "s"},
             gpuTypes={"H100": "NVIDIA H100 80GB HBM3"}, regions=["US-TX-3"],
             options={"cloud_type": "SECURE"})
    assert adapter_options(s) == {"cloud_type": "SECURE",
                                  "gpu_types": {"H100": "NVIDIA H100 80GB HBM3"},
                                  "data_center_ids": ["US-TX-3"]}


def test_explicit_options_win_over_the_typed_fields() -> None:
    s = spec(type="runpod", credentialsSecret={"namespace": "ns", "name": "s"},
             gpuTypes={"H100": "a"}, options={"gpu_types": {"H100": "b"}})
    assert adapter_options(s)["gpu_types"] == {"H100": "b"}


def test_regions_reach_every_adapter_that_can_honour_them() -> None:
    assert adapter_options(spec(type="mock", endpoint="http://x", gpuTypes={"H100": "h"},
                                regions=["us"])) == {"regions": ["us"]}
    salad = spec(type="salad", credentialsSecret={"namespace": "ns", "name": "s"},
                 regions=["us"])
    assert adapter_options(salad) == {"country_codes": ["us"]}
    vast = spec(type="vastai", credentialsSecret={"namespace": "ns", "name": "s"},
                gpuTypes={"H100": "H100_SXM"}, regions=["US"])
    assert adapter_options(vast) == {"gpu_types": {"H100": "H100_SXM"}, "regions": ["US"]}


def test_a_bad_option_is_reported_on_the_spec_field() -> None:
    s = spec(type="runpod", credentialsSecret={"namespace": "ns", "name": "s"},
             options={"no_such_option": 1})
    with pytest.raises(ConfigError) as info:
        build_from_spec(name="p", spec=s, api_key="k", owner="node", timeout=5)
    problem = _problem_from_config_error(info.value)
    assert problem.field == "spec.options"
    assert "no_such_option" in problem.message


@pytest.mark.parametrize(("type_", "options", "text"), [
    ("mock", {"bogus": 1}, "bogus"),
    ("mock", {"max_attempts": "many"}, "not valid"),
    ("salad", {"bogus": 1}, "bogus"),
    ("vastai", {"offer_limit": [1]}, "must be an integer"),
    ("vastai", {"verified": "maybe"}, "must be true or false"),
])
def test_every_adapters_bad_options_land_on_spec_options(type_: str, options: dict[str, Any],
                                                         text: str) -> None:
    extra = {"endpoint": "http://x"} if type_ in ("salad", "mock") else {}
    s = spec(type=type_, credentialsSecret={"namespace": "ns", "name": "s"}, options=options,
             **extra)
    with pytest.raises(ConfigError) as info:
        build_from_spec(name="p", spec=s, api_key="k", owner="node", timeout=5)
    problem = _problem_from_config_error(info.value)
    # the field names the option when the adapter can tell which one (providers/options.py)
    assert problem.field in ("spec.options", f"spec.options.{next(iter(options))}"), problem
    assert text in problem.message


def test_a_mock_gpuprovider_takes_its_retry_options() -> None:
    s = spec(type="mock", endpoint="http://x", options={"max_attempts": 2, "backoff_max": 0.5})
    adapter = build_from_spec(name="p", spec=s, api_key="k", owner="node", timeout=5)
    assert adapter.name == "p"
    assert isinstance(adapter, MockProvider)
    assert adapter._retry.max_attempts == 2


def test_fingerprint_changes_with_secret_version_and_spec_but_holds_no_key() -> None:
    s = spec(type="mock", endpoint="http://x")
    one = fingerprint(spec=s, url="http://x", secret_rv="1", timeout=5)
    assert one == fingerprint(spec=s, url="http://x", secret_rv="1", timeout=5)
    assert one != fingerprint(spec=s, url="http://x", secret_rv="2", timeout=5)
    assert one != fingerprint(spec=spec(type="mock", endpoint="http://y"), url="http://y",
                              secret_rv="1", timeout=5)


# ---- caps ---------------------------------------------------------------------------------------


def test_caps_refuse_what_would_exceed_max_gpus_or_price() -> None:
    caps = ProviderCaps(max_gpus=4, max_price_per_hour=10.0)
    assert caps_refusal(caps=caps, held=Held(gpus=3, price_per_hour=7.5), gpus=1,
                        price_per_hour=2.5) is None
    assert "maxGPUs 4" in str(caps_refusal(caps=caps, held=Held(gpus=4), gpus=1,
                                           price_per_hour=0))
    assert "maxPricePerHour" in str(caps_refusal(caps=caps, held=Held(gpus=1, price_per_hour=9),
                                                 gpus=1, price_per_hour=2.5))
    # at the cap, even an instance of unknown price is refused
    assert caps_refusal(caps=ProviderCaps(max_price_per_hour=5.0),
                        held=Held(price_per_hour=5.0), gpus=1, price_per_hour=0.0)
    assert caps_refusal(caps=ProviderCaps(max_gpus=0), held=Held(), gpus=1, price_per_hour=1)
    assert caps_refusal(caps=ProviderCaps(), held=Held(gpus=99), gpus=8, price_per_hour=99) is None


def test_capped_free_and_folding_into_the_node_capacity() -> None:
    assert capped_free(caps=ProviderCaps(max_gpus=2), free=8, held=Held(), cheapest_per_gpu=1) == 2
    assert capped_free(caps=ProviderCaps(max_gpus=2), free=8, held=Held(gpus=2),
                       cheapest_per_gpu=1) == 0
    assert capped_free(caps=ProviderCaps(max_price_per_hour=5.0), free=8,
                       held=Held(price_per_hour=0.03), cheapest_per_gpu=2.49) == 1
    assert capped_free(caps=ProviderCaps(max_price_per_hour=4.98), free=8, held=Held(),
                       cheapest_per_gpu=2.49) == 2
    offers = [Offer(provider="a", gpu_type="H100", region="us", available=8,
                    price_per_gpu_hour=2.0),
              Offer(provider="a", gpu_type="A100", region="us", available=4,
                    price_per_gpu_hour=1.0),
              Offer(provider="b", gpu_type="H100", region="eu", available=5,
                    price_per_gpu_hour=3.0),
              Offer(provider="c", gpu_type="H100", region="eu", available=7,
                    price_per_gpu_hour=3.0)]
    caps = {"a": ProviderCaps(max_gpus=3), "b": ProviderCaps(max_price_per_hour=6.0)}
    held = {"a": Held(gpus=1), "b": Held(price_per_hour=3.0)}
    assert fold_capacity(offers, caps=caps, held=held) == 2 + 1 + 7
    assert fold_capacity(offers, caps=caps, held=held, exclude={"c"}) == 3
    assert fold_capacity(offers, caps={}, held={}) == 24


def test_expected_price_is_the_cheapest_matching_offer() -> None:
    offers = [Offer(provider="a", gpu_type="H100", region="us", available=0,
                    price_per_gpu_hour=2.0),
              Offer(provider="a", gpu_type="H100", region="eu", available=3,
                    price_per_gpu_hour=1.5),
              Offer(provider="b", gpu_type="H100", region="us", available=3,
                    price_per_gpu_hour=0.5)]
    assert expected_price(offers, provider="a", gpu_type="H100", region=None, gpus=2) == 3.0
    assert expected_price(offers, provider="a", gpu_type="H100", region="us", gpus=1) == 2.0
    assert expected_price(offers, provider="a", gpu_type="A100", region=None, gpus=1) == 0.0


# ---- health and status -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_health_from_call_outcomes() -> None:
    clock = Clock()
    tracker = HealthTracker(clock=clock, window=60, unreachable_after=3)
    assert tracker.health() is None
    tracker.record(error=CapacityError("no H100"))
    assert tracker.health() is None, "capacity errors say nothing about health"
    tracker.record(error=None)
    assert tracker.health() == "Healthy"
    tracker.record(error=RateLimited("slow down", retry_after=1))
    assert tracker.health() == "Degraded"
    clock.now += 61
    assert tracker.health() == "Healthy"
    for _ in range(3):
        tracker.record(error=TransientError("timeout"))
    assert tracker.health() == "Unreachable"
    tracker.record(error=AuthError("401"))
    assert tracker.health() == "AuthFailed"
    tracker.record(error=TransientError("timeout"))
    assert tracker.health() == "AuthFailed", "a rejected key stays the story until a success"
    tracker.record(error=None)
    clock.now += 61
    assert tracker.health() == "Healthy"


def test_blocked_offers_of_one_provider_in_wall_time() -> None:
    blocks = [Block(provider="a", region=None, gpu_type="H100", until=1180.0,
                    reason="no capacity"),
              Block(provider="a", region=None, gpu_type=None, until=1300.0,
                    reason="credentials rejected"),
              Block(provider="b", region="us", gpu_type="H100", until=1100.0, reason="x")]
    offset = T0.timestamp() - 1000.0
    assert blocked_offers(blocks, provider="a", wall_offset=offset) == [
        {"region": "", "gpuType": "H100", "reason": "no capacity",
         "until": "2026-03-01T12:03:00Z"},
        {"region": "", "gpuType": "", "reason": "credentials rejected",
         "until": "2026-03-01T12:05:00Z"},
    ]


def test_status_conditions_keep_transition_times_until_they_flip() -> None:
    first = build_status(generation=3, problems=[], health="Healthy", running_instances=2,
                         price_per_hour=4.98, blocked=[], old={}, now=T0)
    assert first["health"] == "Healthy" and first["runningInstances"] == 2
    conds = {c["type"]: c for c in first["conditions"]}
    assert conds["Valid"]["status"] == "True" and conds["Valid"]["observedGeneration"] == 3
    assert conds["Ready"] == {"type": "Ready", "status": "True", "reason": "Healthy",
                              "message": "the cloud answers (Healthy)", "observedGeneration": 3,
                              "lastTransitionTime": "2026-03-01T12:00:00Z"}
    later = T0 + timedelta(minutes=5)
    same = build_status(generation=3, problems=[], health="Degraded", running_instances=2,
                        price_per_hour=4.98, blocked=[], old=first, now=later)
    ready = {c["type"]: c for c in same["conditions"]}["Ready"]
    assert ready["lastTransitionTime"] == "2026-03-01T12:00:00Z", "still True: time kept"
    assert status_changed(first, same)
    assert not status_changed(same, build_status(
        generation=3, problems=[], health="Degraded", running_instances=2,
        price_per_hour=4.98, blocked=[], old=same, now=later + timedelta(minutes=1)))
    auth = build_status(generation=3, problems=[], health="AuthFailed", running_instances=0,
                        price_per_hour=0, blocked=[], old=same, now=later)
    ready = {c["type"]: c for c in auth["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "AuthFailed")
    assert ready["lastTransitionTime"] == "2026-03-01T12:05:00Z"


def test_invalid_status_names_the_field_and_has_no_health_before_any_call() -> None:
    problem = pol.Problem(field="spec.credentialsSecret", message="Secret ns/s does not exist",
                          reason="SecretNotFound")
    status = build_status(generation=1, problems=[problem], health=None, running_instances=0,
                          price_per_hour=0, blocked=[], old={}, now=T0)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Valid"]["status"] == "False"
    assert conds["Valid"]["reason"] == "SecretNotFound"
    assert conds["Valid"]["message"].startswith("spec.credentialsSecret: ")
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "Invalid")
    assert "health" not in status


# ---- the pod controller's runtime provider changes ---------------------------------------------


class FakeProvider:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


def controller(*names: str) -> PodController:
    return PodController(client=cast(KubeClient, object()), settings=Settings(),
                         providers={n: cast(Provider, FakeProvider(n)) for n in names},
                         events=cast(Any, object()), refs=cast(Any, object()),
                         metrics=Metrics())


def instance(uid: str, provider: str, *, gpus: int = 1, price: float = 2.0) -> Instance:
    return Instance(id=f"i-{uid}", name=f"vk-{uid}", provider=provider,
                    state=InstanceState.RUNNING, tags={"vkprovider.io/uid": uid},
                    gpu_type="H100", gpu_count=gpus, price_per_hour=price)


async def test_a_retired_provider_keeps_its_instances_under_an_alias_until_drained() -> None:
    ctl = controller("a")
    ctl.listed["a"] = True
    ctl.placed["u1"] = Placed(provider="a", instance=instance("u1", "a"), seen_at=0)
    ctl.unsure["u2"] = ("a", 0.0)
    await ctl.retire_provider("a", alias="a~1")
    assert "a" not in ctl.providers and "a~1" in ctl.draining
    assert ctl.placed["u1"].provider == "a~1" and ctl.unsure["u2"][0] == "a~1"
    await ctl.add_provider("a", cast(Provider, FakeProvider("a")))
    assert ctl.listed["a"] is False, "a new provider is unknown until listed"
    assert await ctl.remove_drained() == []  # still holds u1 (and u2 may exist)
    del ctl.placed["u1"]
    del ctl.unsure["u2"]
    [(name, provider)] = await ctl.remove_drained()
    assert name == "a~1" and "a~1" not in ctl.providers and "a~1" not in ctl.listed
    assert cast(FakeProvider, provider).name == "a"


async def test_a_drained_provider_that_was_never_listed_is_kept() -> None:
    ctl = controller("a")
    ctl.set_draining("a", True)
    assert await ctl.remove_drained() == []  # its last list failed: it may hold instances
    ctl.listed["a"] = True
    assert [n for n, _ in await ctl.remove_drained()] == ["a"]


def test_held_counts_placed_and_in_flight_but_not_deleting() -> None:
    ctl = controller("a", "b")
    ctl.placed["u1"] = Placed(provider="a", instance=instance("u1", "a", gpus=2, price=5),
                              seen_at=0)
    ctl.placed["u2"] = Placed(provider="a", instance=instance("u2", "a"), seen_at=0)
    ctl.placed.mark_deleting(("a", "i-u2"), at=0.0)
    ctl.reserved["b"] = Held(gpus=1, price_per_hour=2.0)
    held = ctl.held_by_provider()
    assert held["a"] == Held(gpus=2, price_per_hour=5.0)
    assert held["b"] == Held(gpus=1, price_per_hour=2.0)


def test_hold_back_marks_an_unbuilt_provider_unknown() -> None:
    ctl = controller("a")
    ctl.hold_back("x", True)
    assert ctl.listed["x"] is False  # inherited pods wait for it; nothing is created on it
    ctl.hold_back("x", False)
    assert "x" not in ctl.listed
    ctl.hold_back("a", True)
    ctl.hold_back("a", False)
    assert "a" in ctl.listed, "a served provider's state is the sweep's business"


def test_only_inherited_pods_wait_for_a_provider_never_listed_by_this_process() -> None:
    ctl = controller("a", "b")
    ctl.inherited = {"old"}  # bound before our first sync: a predecessor may have created it
    ctl.listed.update(a=True, b=False)
    ctl.listed_once = {"a"}
    assert ctl.blind_to("old") == ["b"], "b may hide the old pod's instance"
    assert ctl.blind_to("new") == [], "a pod bound after we took over has no hidden instance"
    ctl.hold_back("x", True)  # a GPUProvider declared, not built yet
    assert ctl.blind_to("old") == ["b", "x"]
    ctl.listed["b"] = True
    ctl.listed_once.add("b")
    ctl.listed["b"] = False  # listed once since start, failing now: its instances were seen
    assert ctl.blind_to("old") == ["x"]


async def test_listed_once_follows_a_retired_provider_and_is_forgotten_with_it() -> None:
    ctl = controller("a")
    ctl.listed["a"] = True
    ctl.listed_once = {"a"}
    await ctl.retire_provider("a", alias="a~1")
    assert ctl.listed_once == {"a~1"}
    assert [n for n, _ in await ctl.remove_drained()] == ["a~1"]
    assert ctl.listed_once == set()


def test_a_sweep_reconciles_only_pods_whose_instance_changed_or_that_are_in_motion() -> None:
    ctl = controller("a")
    steady = instance("u1", "a")
    ctl.placed["u1"] = Placed(provider="a", instance=steady, seen_at=0)
    same = Placed(provider="a", instance=steady, seen_at=-5)
    assert not ctl.changed_in_sweep("u1", same), "a steady Running pod rests"
    assert ctl.changed_in_sweep("u1", None), "newly listed"
    moved = Placed(provider="a", instance=instance("u1", "a", price=3.0), seen_at=-5)
    assert ctl.changed_in_sweep("u1", moved), "the cloud reports something new"
    ctl.placed.mark_deleting(("a", steady.id), at=0.0)
    assert ctl.changed_in_sweep("u1", same), "a delete to watch (and maybe re-send)"
    ctl.placed.forget_delete(("a", steady.id))
    ctl.unsure["u1"] = ("a", 0.0)
    assert ctl.changed_in_sweep("u1", same)
    del ctl.unsure["u1"]
    booting = replace(steady, state=InstanceState.PENDING)
    ctl.placed["u1"] = Placed(provider="a", instance=booting, seen_at=0)
    assert ctl.changed_in_sweep("u1", Placed(provider="a", instance=booting, seen_at=-5))
    del ctl.placed["u1"]
    assert ctl.changed_in_sweep("u1", same), "its instance vanished"
    ctl.pod_keys["u2"] = "ns/p2"
    ctl.informer.store["ns/p2"] = {"metadata": {"uid": "u2"}, "status": {"phase": "Pending"}}
    assert ctl.changed_in_sweep("u2", None), "still to be created"
    ctl.informer.store["ns/p2"]["status"]["phase"] = "Succeeded"
    assert not ctl.changed_in_sweep("u2", None), "finished and nothing left to stop"


# ---- settings ------------------------------------------------------------------------------------


def test_leader_election_defaults_and_ordering(monkeypatch: pytest.MonkeyPatch) -> None:
    election = Settings().leader_election
    assert election.enabled is False
    assert election.lease(node_name="vk-gpu") == "vkprovider-vk-gpu"
    monkeypatch.setenv("POD_NAME", "vkprovider-abc")
    assert election.holder() == "vkprovider-abc"
    assert LeaderElectionSettings(identity="me").holder() == "me"
    with pytest.raises(ValueError, match="retry_period_seconds < renew_deadline_seconds"):
        LeaderElectionSettings(lease_duration_seconds=5, renew_deadline_seconds=10)

"""vkprovider.placement.policy: parsing, defaults, selectors, reasons, semantic checks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import pydantic
import pytest
import yaml

from vkprovider.errors import VKError
from vkprovider.placement.policy import (
    CONDITION_VALID,
    DURATION_PATTERN,
    HEALTH_VALUES,
    MAX_DECISIONS,
    PROVIDER_TYPES,
    REASON_SECRET_NOT_FOUND,
    REASON_UNKNOWN_PROVIDER,
    REASON_UNMAPPED_GPU_TYPE,
    GPUProvider,
    LabelSelector,
    LabelSelectorRequirement,
    Limits,
    OverflowPolicy,
    PolicyError,
    Problem,
    closest_refusal,
    effective_traffic,
    label_selector_matches,
    parse_duration,
    parse_gpu_provider,
    parse_overflow_policy,
    policy_selects,
    semantic_problems,
    valid_condition,
)

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "manifests" / "crds"
EXAMPLES = REPO / "manifests" / "examples"


def crd_schema(name: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / name).read_text())
    (version,) = crd["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"])


def gpup(name: str = "runpod", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "runpod",
                            "credentialsSecret": {"namespace": "vk", "name": f"{name}-key"}}
    body.update(spec)
    return {"apiVersion": "vkprovider.io/v1alpha1", "kind": "GPUProvider",
            "metadata": {"name": name, "generation": 3}, "spec": body}


def ofp(name: str = "team-a", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"providers": ["runpod"]}
    body.update(spec)
    return {"apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
            "metadata": {"name": name, "generation": 7}, "spec": body}


def pod(*, namespace: str | None = "team-a", labels: dict[str, str] | None = None,
        priority: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "infer-0", "labels": labels or {}}
    if namespace is not None:
        meta["namespace"] = namespace
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x"}]}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": meta, "spec": spec}


def field_of(exc: pytest.ExceptionInfo[PolicyError]) -> str:
    return exc.value.field


# ---- durations -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [
    ("0s", 0.0), ("90s", 90.0), ("500ms", 0.5), ("2m", 120.0), ("1h30m", 5400.0),
    ("1m30s", 90.0), ("1h0m5s250ms", 3605.25), ("10ms", 0.01), ("36h", 129600.0),
])
def test_parse_duration_accepts_the_crd_grammar(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "1.5h", "-1s", "1d", "5 m", "m5", "1H", "1hh", "s",
                                  " 1s", "1s ", "1us"])
def test_parse_duration_rejects_anything_else_naming_the_field(text: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_duration(text, field="spec.overflowAfter")
    assert info.value.field == "spec.overflowAfter"
    assert str(info.value).startswith("spec.overflowAfter: ")
    assert repr(text) in info.value.message


def test_parse_duration_rejects_non_strings() -> None:
    with pytest.raises(PolicyError):
        parse_duration(30)  # type: ignore[arg-type]


def test_traffic_is_auto_by_default_and_a_bad_value_names_the_field() -> None:
    assert parse_overflow_policy(ofp()).spec.traffic == "auto"
    assert parse_overflow_policy(ofp(traffic="direct")).spec.traffic == "direct"
    with pytest.raises(PolicyError, match="traffic"):
        parse_overflow_policy(ofp(traffic="tunnel"))
    schema = crd_schema("overflowpolicies.yaml")["properties"]["spec"]["properties"]["traffic"]
    assert schema["enum"] == ["direct", "gateway", "auto"]


def test_a_gpuprovider_traffic_is_auto_by_default_and_a_bad_value_names_the_field() -> None:
    assert parse_gpu_provider(gpup()).spec.traffic == "auto"
    obj = gpup()
    obj["spec"]["traffic"] = "gateway"
    assert parse_gpu_provider(obj).spec.traffic == "gateway"
    obj["spec"]["traffic"] = "tunnel"
    with pytest.raises(PolicyError) as info:
        parse_gpu_provider(obj)
    assert field_of(info) == "spec.traffic"
    schema = crd_schema("gpuproviders.yaml")["properties"]["spec"]["properties"]["traffic"]
    assert schema["enum"] == ["direct", "gateway", "auto"]
    assert schema["default"] == "auto"


@pytest.mark.parametrize(("policy", "provider", "path"), [
    (None, None, "auto"), ("auto", "auto", "auto"),
    ("auto", "gateway", "gateway"), (None, "direct", "direct"),  # the account decides
    ("direct", "gateway", "direct"), ("gateway", "direct", "gateway"),  # the workload's wins
    ("gateway", None, "gateway"),
])
def test_the_policys_traffic_wins_unless_auto_then_the_gpuproviders(
        policy: str | None, provider: str | None, path: str) -> None:
    assert effective_traffic(policy=policy, provider=provider) == path


def test_duration_pattern_is_the_crds_pattern() -> None:
    spec = crd_schema("overflowpolicies.yaml")["properties"]["spec"]["properties"]
    fields = [spec["overflowAfter"]] + [spec["moveBack"]["properties"][k]
                                        for k in ("stableFor", "cooldown", "timeout")]
    assert [f["pattern"] for f in fields] == [DURATION_PATTERN] * 4


# ---- GPUProvider parsing ---------------------------------------------------------------------


def test_gpu_provider_parses_with_snake_case_attributes_and_defaults() -> None:
    p = parse_gpu_provider(gpup(gpuTypes={"H100": "NVIDIA H100 80GB HBM3"}, regions=["US-TX-3"],
                                maxGPUs=8, maxPricePerHour=20, options={"cloudType": "SECURE"}))
    assert isinstance(p, GPUProvider)
    assert (p.name, p.generation) == ("runpod", 3)
    assert p.spec.type == "runpod"
    assert p.spec.endpoint is None
    assert p.spec.credentials_secret is not None
    assert p.spec.credentials_secret.key == "apiKey"
    assert p.spec.gpu_types == {"H100": "NVIDIA H100 80GB HBM3"}
    assert p.spec.regions == ("US-TX-3",)
    assert p.spec.max_gpus == 8
    assert p.spec.max_price_per_hour == 20.0
    assert p.spec.options == {"cloudType": "SECURE"}
    assert p.spec.model_dump(exclude_none=True)["maxGPUs"] == 8  # serialises to the YAML names


def test_gpu_provider_is_frozen() -> None:
    p = parse_gpu_provider(gpup())
    with pytest.raises(pydantic.ValidationError):
        p.spec.max_gpus = 3


def test_cloud_gpu_id_uses_the_map_or_passes_names_through() -> None:
    mapped = parse_gpu_provider(gpup(gpuTypes={"H100": "NVIDIA H100 80GB HBM3"})).spec
    assert mapped.cloud_gpu_id("H100") == "NVIDIA H100 80GB HBM3"
    assert mapped.cloud_gpu_id("A100") is None
    assert parse_gpu_provider(gpup()).spec.cloud_gpu_id("A100") == "A100"


@pytest.mark.parametrize(("spec", "field"), [
    ({"type": "aws"}, "spec.type"),
    ({"maxGPUs": -1}, "spec.maxGPUs"),
    ({"maxGPUs": "4"}, "spec.maxGPUs"),  # no coercion: the API server would refuse it too
    ({"maxGPUs": True}, "spec.maxGPUs"),
    ({"maxPricePerHour": -0.01}, "spec.maxPricePerHour"),
    ({"credentialsSecret": None}, "spec.credentialsSecret"),
    ({"type": "salad", "credentialsSecret": None}, "spec.credentialsSecret"),
    ({"type": "mock", "credentialsSecret": None}, "spec.endpoint"),
    ({"endpoint": "cloud.example"}, "spec.endpoint"),
    ({"credentialsSecret": {"namespace": "vk"}}, "spec.credentialsSecret.name"),
    ({"credentialsSecret": {"namespace": "VK", "name": "k"}}, "spec.credentialsSecret.namespace"),
    ({"gpuTypes": {"H 100": "x"}}, "spec.gpuTypes.H 100"),
    ({"gpuTypes": {"H100": ""}}, "spec.gpuTypes.H100"),
    ({"regions": ["us", "eu", "us"]}, "spec.regions[2]"),
    ({"regions": "us"}, "spec.regions"),
    ({"options": ["a"]}, "spec.options"),
])
def test_gpu_provider_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    obj = gpup()
    for key, value in spec.items():
        if value is None:
            obj["spec"].pop(key, None)
        else:
            obj["spec"][key] = value
    with pytest.raises(PolicyError) as info:
        parse_gpu_provider(obj)
    assert field_of(info) == field
    assert isinstance(info.value, VKError)
    assert str(info.value).startswith(f"{field}: ")


def test_mock_needs_no_credentials_and_takes_http_endpoints() -> None:
    p = parse_gpu_provider(gpup(type="mock", endpoint="http://127.0.0.1:8080/v1",
                                credentialsSecret=None))
    assert p.spec.type == "mock"
    obj = gpup(type="mock", endpoint="https://mock.example")
    del obj["spec"]["credentialsSecret"]
    assert parse_gpu_provider(obj).spec.credentials_secret is None


@pytest.mark.parametrize(("obj", "field"), [
    ({"kind": "GPUProvider", "metadata": {"name": "x"}}, "spec"),
    ({"kind": "GPUProvider", "metadata": {"name": "x"}, "spec": []}, "spec"),
    ({"kind": "GPUProvider", "spec": {"type": "mock", "endpoint": "http://m"}}, "metadata.name"),
    ({"kind": "GPUProvider", "metadata": {"name": "Bad_Name"},
      "spec": {"type": "mock", "endpoint": "http://m"}}, "metadata.name"),
    ({"kind": "OverflowPolicy", "metadata": {"name": "x"},
      "spec": {"type": "mock", "endpoint": "http://m"}}, "kind"),
])
def test_object_shape_errors_name_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_gpu_provider(obj)
    assert field_of(info) == field


def test_several_problems_are_all_kept() -> None:
    with pytest.raises(PolicyError) as info:
        parse_gpu_provider(gpup(maxGPUs=-1, maxPricePerHour=-1))
    assert [p.field for p in info.value.problems] == ["spec.maxGPUs", "spec.maxPricePerHour"]


def test_unknown_fields_are_ignored_as_the_api_server_prunes_them() -> None:
    p = parse_gpu_provider(gpup(futureField={"a": 1}))
    assert "futureField" not in p.spec.model_dump()


# ---- OverflowPolicy parsing ------------------------------------------------------------------


def test_minimal_policy_gets_the_documented_defaults() -> None:
    p = parse_overflow_policy(ofp())
    assert isinstance(p, OverflowPolicy)
    assert (p.name, p.generation) == ("team-a", 7)
    s = p.spec
    assert s.providers == ("runpod",)
    assert s.gpu_types == ()
    assert s.selector.namespaces == ()
    assert s.selector.pod_selector is None
    assert s.selector.min_priority is None
    assert s.limits == Limits()
    assert s.overflow_after == "0s"
    assert s.overflow_after_seconds == 0.0
    assert s.move_back.enabled is True
    assert (s.move_back.stable_for, s.move_back.cooldown, s.move_back.timeout) == \
        ("2m", "5m", "10m")
    assert (s.move_back.stable_for_seconds, s.move_back.cooldown_seconds,
            s.move_back.timeout_seconds) == (120.0, 300.0, 600.0)
    assert s.move_back.max_concurrent == 1
    assert s.dry_run is False


def _defaults(schema: dict[str, Any], path: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        if "default" in prop and not isinstance(prop["default"], dict):
            out[here] = prop["default"]
        out.update(_defaults(prop, here))
    return out


def _at(body: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        body = body[part]
    return body


def test_the_model_defaults_are_the_crd_defaults() -> None:
    policy_defaults = _defaults(crd_schema("overflowpolicies.yaml")["properties"]["spec"])
    assert set(policy_defaults) == {"overflowAfter", "dryRun", "execProbes", "placement",
                                    "interruptible", "traffic",
                                    "moveBack.enabled", "moveBack.stableFor",
                                    "moveBack.maxConcurrent", "moveBack.cooldown",
                                    "moveBack.timeout", "moveBack.headroomGPUs",
                                    "moveBack.holdWhileQueued",
                                    "prewarm.enabled", "prewarm.timeout", "prewarm.onTimeout",
                                    "gpuHealth.sustainedFor"}
    # gpuHealth is off when absent; its one required field given, the rest default.
    dumped = parse_overflow_policy(ofp(gpuHealth={"maxTemperatureCelsius": 80})).spec.model_dump()
    for path, default in policy_defaults.items():
        assert _at(dumped, path) == default, path

    provider_defaults = _defaults(crd_schema("gpuproviders.yaml")["properties"]["spec"])
    assert provider_defaults == {"credentialsSecret.key": "apiKey", "traffic": "auto"}
    dumped = parse_gpu_provider(gpup()).spec.model_dump()
    assert _at(dumped, "credentialsSecret.key") == "apiKey"
    assert _at(dumped, "traffic") == "auto"


def test_the_crd_enums_are_the_models_enums() -> None:
    gspec = crd_schema("gpuproviders.yaml")["properties"]
    assert tuple(gspec["spec"]["properties"]["type"]["enum"]) == PROVIDER_TYPES
    assert tuple(gspec["status"]["properties"]["health"]["enum"]) == HEALTH_VALUES
    pspec = crd_schema("overflowpolicies.yaml")["properties"]
    sel = pspec["spec"]["properties"]["selector"]["properties"]
    for which in ("podSelector", "namespaceSelector"):
        ops = sel[which]["properties"]["matchExpressions"]["items"]["properties"]["operator"]
        assert tuple(ops["enum"]) == get_args(
            LabelSelectorRequirement.model_fields["operator"].annotation)
    assert pspec["status"]["properties"]["lastDecisions"]["maxItems"] == MAX_DECISIONS


@pytest.mark.parametrize(("spec", "field"), [
    ({"providers": []}, "spec.providers"),
    ({"providers": None}, "spec.providers"),
    ({"providers": ["runpod", "runpod"]}, "spec.providers[1]"),
    ({"providers": ["Run_Pod"]}, "spec.providers[0]"),
    ({"gpuTypes": ["H100", "H100"]}, "spec.gpuTypes[1]"),
    ({"limits": {"maxExternalFraction": 0}}, "spec.limits.maxExternalFraction"),
    ({"limits": {"maxExternalFraction": 1.01}}, "spec.limits.maxExternalFraction"),
    ({"limits": {"maxGPUs": -2}}, "spec.limits.maxGPUs"),
    ({"limits": {"maxPods": 1.5}}, "spec.limits.maxPods"),
    ({"limits": {"maxPricePerHour": -1}}, "spec.limits.maxPricePerHour"),
    ({"overflowAfter": "30"}, "spec.overflowAfter"),
    ({"overflowAfter": 30}, "spec.overflowAfter"),
    ({"moveBack": {"stableFor": "2 minutes"}}, "spec.moveBack.stableFor"),
    ({"moveBack": {"cooldown": "1d"}}, "spec.moveBack.cooldown"),
    ({"moveBack": {"timeout": "0s"}}, "spec.moveBack.timeout"),
    ({"moveBack": {"timeout": "0h0m"}}, "spec.moveBack.timeout"),
    ({"moveBack": {"maxConcurrent": 0}}, "spec.moveBack.maxConcurrent"),
    ({"moveBack": {"enabled": "yes"}}, "spec.moveBack.enabled"),
    ({"moveBack": {"headroomGPUs": -1}}, "spec.moveBack.headroomGPUs"),
    ({"moveBack": {"headroomGPUs": 2000}}, "spec.moveBack.headroomGPUs"),
    ({"moveBack": {"holdWhileQueued": "no"}}, "spec.moveBack.holdWhileQueued"),
    ({"dryRun": 1}, "spec.dryRun"),
    ({"selector": {"namespaces": ["Team_A"]}}, "spec.selector.namespaces[0]"),
    ({"selector": {"minPriority": "high"}}, "spec.selector.minPriority"),
    ({"selector": {"minPriority": 2**31}}, "spec.selector.minPriority"),
    ({"selector": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Gt",
                                                         "values": ["1"]}]}}},
     "spec.selector.podSelector.matchExpressions[0].operator"),
    ({"selector": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
     "spec.selector.podSelector.matchExpressions[0].values"),
    ({"selector": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "NotIn",
                                                         "values": []}]}}},
     "spec.selector.podSelector.matchExpressions[0].values"),
    ({"selector": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists",
                                                         "values": ["x"]}]}}},
     "spec.selector.podSelector.matchExpressions[0].values"),
    ({"selector": {"podSelector": {"matchExpressions": [{"operator": "Exists"}]}}},
     "spec.selector.podSelector.matchExpressions[0].key"),
    ({"selector": {"podSelector": {"matchLabels": {"app": "no spaces"}}}},
     "spec.selector.podSelector.matchLabels.app"),
    ({"selector": {"namespaceSelector": {"matchLabels": {"-bad": "x"}}}},
     "spec.selector.namespaceSelector.matchLabels.-bad"),
])
def test_policy_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    obj = ofp()
    for key, value in spec.items():
        if value is None:
            obj["spec"].pop(key)
        else:
            obj["spec"][key] = value
    with pytest.raises(PolicyError) as info:
        parse_overflow_policy(obj)
    assert field_of(info) == field, info.value.problems


def test_limits_model_bounds_and_aliases() -> None:
    lim = Limits.model_validate({"maxPods": 3, "maxGPUs": 8, "maxPricePerHour": 12.5,
                                 "maxExternalFraction": 1})
    assert (lim.max_pods, lim.max_gpus, lim.max_price_per_hour, lim.max_external_fraction) == \
        (3, 8, 12.5, 1.0)
    assert Limits(max_gpus=2).max_gpus == 2  # python names work too
    for bad in (0, -0.1, 1.0001):
        with pytest.raises(pydantic.ValidationError):
            Limits(max_external_fraction=bad)


# ---- examples --------------------------------------------------------------------------------


def _examples() -> list[dict[str, Any]]:
    return [o for path in sorted(EXAMPLES.glob("*.yaml"))
            for o in yaml.safe_load_all(path.read_text()) if o]


def test_examples_cover_every_provider_type_and_parse_without_problems() -> None:
    objs = _examples()
    providers = [parse_gpu_provider(o) for o in objs if o["kind"] == "GPUProvider"]
    policies = [parse_overflow_policy(o) for o in objs if o["kind"] == "OverflowPolicy"]
    assert sorted(p.spec.type for p in providers) == sorted(PROVIDER_TYPES)
    assert len(policies) >= 2
    assert any(p.spec.dry_run for p in policies)
    problems = semantic_problems(policies=policies, providers=providers,
                                 secrets_present=lambda ns, name, key: True)
    assert all(v == [] for v in problems.values()), problems
    assert len(problems) == len(objs)


# ---- label selectors -------------------------------------------------------------------------

LABELS = {"app": "infer", "tier": "gold", "team": "a"}


@pytest.mark.parametrize(("selector", "expected"), [
    ({}, True),
    ({"matchLabels": {}}, True),
    ({"matchLabels": {"app": "infer"}}, True),
    ({"matchLabels": {"app": "infer", "tier": "gold"}}, True),
    ({"matchLabels": {"app": "train"}}, False),
    ({"matchLabels": {"missing": "x"}}, False),
    ({"matchLabels": {"app": ""}}, False),  # an empty value is a value, not "absent"
    # In: key present with one of the values
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["silver"]}]}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, False),
    # NotIn: key absent, or value none of the values
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["silver"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
    # Exists / DoesNotExist
    ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, True),
    ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
    ({"matchExpressions": [{"key": "team", "operator": "DoesNotExist", "values": []}]}, False),
    # everything is ANDed
    ({"matchLabels": {"app": "infer"},
      "matchExpressions": [{"key": "team", "operator": "Exists"},
                           {"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, False),
    ({"matchLabels": {"app": "infer"},
      "matchExpressions": [{"key": "team", "operator": "Exists"},
                           {"key": "zone", "operator": "DoesNotExist"}]}, True),
])
def test_label_selector_semantics(selector: dict[str, Any], expected: bool) -> None:
    assert label_selector_matches(selector, LABELS) is expected
    assert LabelSelector.model_validate(selector).matches(LABELS) is expected


def test_label_selector_on_no_labels() -> None:
    assert label_selector_matches({}, {}) is True
    assert label_selector_matches(
        {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {}) is True
    assert label_selector_matches(
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {}) is False


@pytest.mark.parametrize(("selector", "field"), [
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
     "matchExpressions[0].operator"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
     "matchExpressions[0].values"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"},
                           {"key": "b", "operator": "DoesNotExist", "values": ["x"]}]},
     "matchExpressions[1].values"),
])
def test_malformed_selector_raises_like_kubernetes(selector: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as info:
        label_selector_matches(selector, LABELS)
    assert field_of(info) == field


# ---- policy_selects --------------------------------------------------------------------------


def test_policy_with_no_selector_selects_every_pod() -> None:
    p = parse_overflow_policy(ofp())
    assert policy_selects(p, pod=pod(namespace="anything", priority=-5)) == (True, "")


def test_namespace_reason() -> None:
    p = parse_overflow_policy(ofp(selector={"namespaces": ["team-a", "team-c"]}))
    assert policy_selects(p, pod=pod(namespace="team-a")) == (True, "")
    assert policy_selects(p, pod=pod(namespace="team-b")) == (
        False, "namespace team-b is not in [team-a, team-c]")
    assert policy_selects(p, pod=pod(namespace=None))[1] == \
        "namespace default is not in [team-a, team-c]"


def test_namespace_selector_uses_the_namespace_labels() -> None:
    p = parse_overflow_policy(ofp(selector={
        "namespaceSelector": {"matchLabels": {"env": "dev"}}}))
    assert policy_selects(p, pod=pod(), namespace_labels={"env": "dev"}) == (True, "")
    ok, reason = policy_selects(p, pod=pod(), namespace_labels={"env": "prod"})
    assert not ok
    assert reason == "the labels of namespace team-a do not match spec.selector.namespaceSelector"
    ok, reason = policy_selects(p, pod=pod())
    assert not ok
    assert "unknown" in reason


def test_pod_selector_reason() -> None:
    p = parse_overflow_policy(ofp(selector={"podSelector": {
        "matchLabels": {"app": "infer"},
        "matchExpressions": [{"key": "workload-class", "operator": "NotIn",
                              "values": ["training"]}]}}))
    assert policy_selects(p, pod=pod(labels={"app": "infer"})) == (True, "")
    assert policy_selects(p, pod=pod(labels={"app": "infer", "workload-class": "training"})) == (
        False, "labels do not match spec.selector.podSelector")
    assert policy_selects(p, pod=pod(labels={}))[0] is False


def test_priority_reason_and_default_priority() -> None:
    p = parse_overflow_policy(ofp(selector={"minPriority": 1000}))
    assert policy_selects(p, pod=pod(priority=1000)) == (True, "")
    assert policy_selects(p, pod=pod(priority=100)) == (
        False, "priority 100 is below minPriority 1000")
    assert policy_selects(p, pod=pod()) == (False, "priority 0 is below minPriority 1000")
    negative = parse_overflow_policy(ofp(selector={"minPriority": -10}))
    assert policy_selects(negative, pod=pod()) == (True, "")


def test_reasons_come_in_checking_order() -> None:
    p = parse_overflow_policy(ofp(selector={"namespaces": ["team-a"], "minPriority": 10,
                                            "podSelector": {"matchLabels": {"app": "infer"}}}))
    assert policy_selects(p, pod=pod(namespace="x", priority=0))[1].startswith("namespace x")
    assert policy_selects(p, pod=pod(priority=0))[1].startswith("labels do not match")
    assert policy_selects(p, pod=pod(labels={"app": "infer"}, priority=0))[1].startswith(
        "priority 0")


# ---- closest_refusal -------------------------------------------------------------------------


def test_closest_refusal_prefers_the_latest_failed_criterion() -> None:
    by_ns = parse_overflow_policy(ofp("a-namespace", selector={"namespaces": ["other"]}))
    by_labels = parse_overflow_policy(ofp("b-labels", selector={
        "podSelector": {"matchLabels": {"app": "train"}}}))
    by_priority = parse_overflow_policy(ofp("c-priority", selector={"minPriority": 1000}))
    by_budget = parse_overflow_policy(ofp("d-budget"))
    the_pod = pod(labels={"app": "infer"}, priority=10)
    refusals = {"d-budget": "maxGPUs 8 reached"}

    everything = [by_ns, by_labels, by_priority, by_budget]
    assert closest_refusal(everything, the_pod, budget_refusals=refusals) == (
        "d-budget", "maxGPUs 8 reached")
    assert closest_refusal(list(reversed(everything)), the_pod, budget_refusals=refusals) == (
        "d-budget", "maxGPUs 8 reached")
    assert closest_refusal([by_ns, by_labels, by_priority], the_pod) == (
        "c-priority", "priority 10 is below minPriority 1000")
    assert closest_refusal([by_priority, by_labels, by_ns], the_pod)[0] == "c-priority"  # type: ignore[index]
    assert closest_refusal([by_ns, by_labels], the_pod) == (
        "b-labels", "labels do not match spec.selector.podSelector")
    assert closest_refusal([by_ns], the_pod) == (
        "a-namespace", "namespace team-a is not in [other]")


def test_closest_refusal_ties_go_to_the_first_policy() -> None:
    one = parse_overflow_policy(ofp("one", selector={"namespaces": ["x"]}))
    two = parse_overflow_policy(ofp("two", selector={"namespaces": ["y"]}))
    assert closest_refusal([one, two], pod()) == ("one", "namespace team-a is not in [x]")
    assert closest_refusal([two, one], pod()) == ("two", "namespace team-a is not in [y]")


def test_closest_refusal_is_none_when_a_policy_admits_or_none_exist() -> None:
    refusing = parse_overflow_policy(ofp("refusing", selector={"minPriority": 1000}))
    admitting = parse_overflow_policy(ofp("admitting"))
    assert closest_refusal([refusing, admitting], pod()) is None
    assert closest_refusal([admitting], pod(), budget_refusals={"other": "x"}) is None
    assert closest_refusal([], pod()) is None


# ---- semantic problems -----------------------------------------------------------------------


def _providers() -> list[GPUProvider]:
    return [
        parse_gpu_provider(gpup("runpod", gpuTypes={"H100": "NVIDIA H100 80GB HBM3"})),
        parse_gpu_provider(gpup("vastai", type="vastai", gpuTypes={"A100": "A100_SXM4"})),
    ]


def test_unknown_provider_is_named_by_index() -> None:
    p = parse_overflow_policy(ofp(providers=["runpod", "lambda", "vastai", "nebius"]))
    problems = semantic_problems(policies=[p], providers=_providers(),
                                 secrets_present=lambda *_: True)
    assert problems[("OverflowPolicy", "team-a")] == [
        Problem(field="spec.providers[1]", message="GPUProvider lambda does not exist",
                reason=REASON_UNKNOWN_PROVIDER),
        Problem(field="spec.providers[3]", message="GPUProvider nebius does not exist",
                reason=REASON_UNKNOWN_PROVIDER),
    ]
    assert problems[("GPUProvider", "runpod")] == []
    assert problems[("GPUProvider", "vastai")] == []


def test_gpu_type_must_be_mapped_by_one_of_the_policys_providers() -> None:
    both = parse_overflow_policy(ofp(providers=["runpod", "vastai"],
                                     gpuTypes=["H100", "A100", "L40S"]))
    only_runpod = parse_overflow_policy(ofp("only-runpod", providers=["runpod"],
                                            gpuTypes=["A100"]))
    problems = semantic_problems(policies=[both, only_runpod], providers=_providers(),
                                 secrets_present=lambda *_: True)
    assert [(p.field, p.reason) for p in problems[("OverflowPolicy", "team-a")]] == [
        ("spec.gpuTypes[2]", REASON_UNMAPPED_GPU_TYPE)]
    assert "L40S" in problems[("OverflowPolicy", "team-a")][0].message
    assert [p.field for p in problems[("OverflowPolicy", "only-runpod")]] == ["spec.gpuTypes[0]"]


def test_provider_without_a_map_counts_as_mapping_every_gpu_type() -> None:
    mock = parse_gpu_provider({"kind": "GPUProvider", "metadata": {"name": "mock"},
                               "spec": {"type": "mock", "endpoint": "http://m"}})
    p = parse_overflow_policy(ofp(providers=["mock"], gpuTypes=["B200"]))
    problems = semantic_problems(policies=[p], providers=[mock], secrets_present=set())
    assert problems == {("GPUProvider", "mock"): [], ("OverflowPolicy", "team-a"): []}


def test_gpu_types_are_not_checked_against_unknown_providers_only() -> None:
    p = parse_overflow_policy(ofp(providers=["nebius"], gpuTypes=["H100"]))
    problems = semantic_problems(policies=[p], providers=_providers(),
                                 secrets_present=lambda *_: True)
    assert [x.field for x in problems[("OverflowPolicy", "team-a")]] == ["spec.providers[0]"]


def test_missing_secret_with_a_callable_checks_the_key() -> None:
    seen: list[tuple[str, str, str]] = []

    def present(ns: str, name: str, key: str) -> bool:
        seen.append((ns, name, key))
        return name == "runpod-key"

    problems = semantic_problems(policies=[], providers=_providers(), secrets_present=present)
    assert problems[("GPUProvider", "runpod")] == []
    (problem,) = problems[("GPUProvider", "vastai")]
    assert (problem.field, problem.reason) == ("spec.credentialsSecret", REASON_SECRET_NOT_FOUND)
    assert "vk/vastai-key" in problem.message
    assert sorted(seen) == [("vk", "runpod-key", "apiKey"), ("vk", "vastai-key", "apiKey")]


def test_missing_secret_with_a_set_of_names() -> None:
    problems = semantic_problems(policies=[], providers=_providers(),
                                 secrets_present={("vk", "vastai-key")})
    assert [p.field for p in problems[("GPUProvider", "runpod")]] == ["spec.credentialsSecret"]
    assert problems[("GPUProvider", "vastai")] == []


def test_a_policy_and_a_provider_may_share_a_name() -> None:
    p = parse_overflow_policy(ofp("runpod", providers=["nowhere"]))
    problems = semantic_problems(policies=[p], providers=_providers(),
                                 secrets_present=lambda *_: True)
    assert problems[("GPUProvider", "runpod")] == []
    assert [x.field for x in problems[("OverflowPolicy", "runpod")]] == ["spec.providers[0]"]


def test_valid_condition() -> None:
    assert valid_condition([], observed_generation=4) == {
        "type": CONDITION_VALID, "status": "True", "reason": "Valid", "message": "",
        "observedGeneration": 4}
    cond = valid_condition([
        Problem(field="spec.providers[1]", message="GPUProvider x does not exist",
                reason=REASON_UNKNOWN_PROVIDER),
        Problem(field="spec.gpuTypes[0]", message="unmapped", reason=REASON_UNMAPPED_GPU_TYPE),
    ], observed_generation=5)
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == \
        ("False", REASON_UNKNOWN_PROVIDER, 5)
    assert cond["message"] == ("spec.providers[1]: GPUProvider x does not exist; "
                               "spec.gpuTypes[0]: unmapped")


def test_policy_error_shape() -> None:
    err = PolicyError(field="spec.x", message="bad")
    assert isinstance(err, VKError)
    assert str(err) == "spec.x: bad"
    assert err.problems == (Problem(field="spec.x", message="bad"),)


def test_parsing_does_not_mutate_the_input() -> None:
    obj = ofp(selector={"podSelector": {"matchLabels": {"a": "b"}}})
    before = copy.deepcopy(obj)
    parse_overflow_policy(obj)
    assert obj == before


def test_gpu_health_is_off_by_default_and_checked_with_the_field_named() -> None:
    assert parse_overflow_policy(ofp()).spec.gpu_health is None
    health = parse_overflow_policy(
        ofp(gpuHealth={"maxTemperatureCelsius": 78, "sustainedFor": "5m"})).spec.gpu_health
    assert health is not None
    assert (health.max_temperature_celsius, health.sustained_for_seconds) == (78, 300.0)
    for bad, field in (({"maxTemperatureCelsius": 121}, "spec.gpuHealth.maxTemperatureCelsius"),
                       ({"maxTemperatureCelsius": 49}, "spec.gpuHealth.maxTemperatureCelsius"),
                       ({"maxTemperatureCelsius": 80.5}, "spec.gpuHealth.maxTemperatureCelsius"),
                       ({}, "spec.gpuHealth.maxTemperatureCelsius"),
                       ({"maxTemperatureCelsius": 80, "sustainedFor": "2 m"},
                        "spec.gpuHealth.sustainedFor")):
        with pytest.raises(PolicyError) as caught:
            parse_overflow_policy(ofp(gpuHealth=bad))
        assert caught.value.field == field

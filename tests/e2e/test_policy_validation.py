"""The real API server enforces the GPUProvider and OverflowPolicy schemas (manifests/crds).

The CRDs are installed once per run by the session fixture ``crds`` (tests/e2e/conftest.py,
``vkprovider.testing.harness.install_crds``); every object made here has a unique name and is
deleted after its test.

Every malformed object is rejected with the field at fault named, so a platform admin sees
``spec.limits.maxExternalFraction: ...`` from ``kubectl apply`` instead of a policy that silently
does something else. The same objects are rejected by ``vkprovider.placement.policy`` naming the
same field, so objects that never went through the API server are held to the same rules.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import yaml

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import BadRequestError, InvalidError, NotFoundError
from vkprovider.placement.policy import (
    API_VERSION,
    POLICIES_PATH,
    PROVIDERS_PATH,
    PolicyError,
    parse_gpu_provider,
    parse_overflow_policy,
)
from vkprovider.testing.cluster import REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide]  # GPUProviders, policies

EXAMPLES = {path.name: [o for o in yaml.safe_load_all(path.read_text()) if o]
            for path in sorted((REPO_ROOT / "manifests" / "examples").glob("*.yaml"))}


def provider(spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GPUProvider",
            "metadata": {"name": f"test-gpup-{uuid.uuid4().hex[:8]}"}, "spec": spec}


def policy(spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "OverflowPolicy",
            "metadata": {"name": f"test-ofp-{uuid.uuid4().hex[:8]}"}, "spec": spec}


MOCK = {"type": "mock", "endpoint": "http://127.0.0.1:9000"}
RUNPOD = {"type": "runpod", "credentialsSecret": {"namespace": "vkprovider-system",
                                                  "name": "runpod-credentials"}}
POLICY = {"providers": ["runpod"]}


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(base)
    spec.update(changes)
    return spec


def selector(expr: dict[str, Any]) -> dict[str, Any]:
    return with_(POLICY, selector={"podSelector": {"matchExpressions": [expr]}})


# (id, object, field the API server names, field the Python parser names or None to skip)
MALFORMED: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("unknown-type", provider(with_(MOCK, type="aws")), "spec.type", "spec.type"),
    ("negative-maxGPUs", provider(with_(MOCK, maxGPUs=-1)), "spec.maxGPUs", "spec.maxGPUs"),
    ("provider-traffic-unknown", provider(with_(MOCK, traffic="tunnel")), "spec.traffic",
     "spec.traffic"),
    ("maxGPUs-string", provider(with_(MOCK, maxGPUs="four")), "spec.maxGPUs", "spec.maxGPUs"),
    ("negative-price", provider(with_(MOCK, maxPricePerHour=-0.5)), "spec.maxPricePerHour",
     "spec.maxPricePerHour"),
    ("runpod-without-credentials", provider({"type": "runpod"}), "spec.credentialsSecret",
     "spec.credentialsSecret"),
    ("mock-without-endpoint", provider({"type": "mock"}), "spec.endpoint", "spec.endpoint"),
    ("endpoint-not-http", provider(with_(MOCK, endpoint="ftp://cloud.example")),
     "spec.endpoint", "spec.endpoint"),
    ("secret-without-name",
     provider(with_(RUNPOD, credentialsSecret={"namespace": "vkprovider-system"})),
     "spec.credentialsSecret.name", "spec.credentialsSecret.name"),
    ("gpu-name-with-space", provider(with_(MOCK, gpuTypes={"H 100": "h100"})), "spec.gpuTypes",
     "spec.gpuTypes"),
    ("gpu-id-empty", provider(with_(MOCK, gpuTypes={"H100": ""})), "spec.gpuTypes",
     "spec.gpuTypes"),
    ("region-twice", provider(with_(MOCK, regions=["us-east", "us-east"])), "spec.regions[1]",
     "spec.regions[1]"),
    ("provider-without-spec", {**provider({}), "spec": None}, "spec", "spec"),
    ("empty-providers", policy({"providers": []}), "spec.providers", "spec.providers"),
    ("missing-providers", policy({"dryRun": True}), "spec.providers", "spec.providers"),
    ("provider-twice", policy({"providers": ["runpod", "vastai", "runpod"]}), "spec.providers",
     "spec.providers"),
    ("provider-bad-name", policy({"providers": ["Run_Pod"]}), "spec.providers[0]",
     "spec.providers[0]"),
    ("fraction-zero", policy(with_(POLICY, limits={"maxExternalFraction": 0})),
     "spec.limits.maxExternalFraction", "spec.limits.maxExternalFraction"),
    ("fraction-above-one", policy(with_(POLICY, limits={"maxExternalFraction": 1.5})),
     "spec.limits.maxExternalFraction", "spec.limits.maxExternalFraction"),
    ("negative-maxPods", policy(with_(POLICY, limits={"maxPods": -1})), "spec.limits.maxPods",
     "spec.limits.maxPods"),
    ("policy-negative-price", policy(with_(POLICY, limits={"maxPricePerHour": -1})),
     "spec.limits.maxPricePerHour", "spec.limits.maxPricePerHour"),
    ("duration-words", policy(with_(POLICY, overflowAfter="5 minutes")), "spec.overflowAfter",
     "spec.overflowAfter"),
    ("duration-without-unit", policy(with_(POLICY, moveBack={"stableFor": "120"})),
     "spec.moveBack.stableFor", "spec.moveBack.stableFor"),
    ("duration-negative", policy(with_(POLICY, moveBack={"cooldown": "-5m"})),
     "spec.moveBack.cooldown", "spec.moveBack.cooldown"),
    ("timeout-zero", policy(with_(POLICY, moveBack={"timeout": "0s"})), "spec.moveBack.timeout",
     "spec.moveBack.timeout"),
    ("maxConcurrent-zero", policy(with_(POLICY, moveBack={"maxConcurrent": 0})),
     "spec.moveBack.maxConcurrent", "spec.moveBack.maxConcurrent"),
    ("moveBack-enabled-string", policy(with_(POLICY, moveBack={"enabled": "yes"})),
     "spec.moveBack.enabled", "spec.moveBack.enabled"),
    ("dryRun-string", policy(with_(POLICY, dryRun="true")), "spec.dryRun", "spec.dryRun"),
    ("selector-operator-gt", policy(selector({"key": "tier", "operator": "Gt", "values": ["1"]})),
     "spec.selector.podSelector.matchExpressions[0].operator",
     "spec.selector.podSelector.matchExpressions[0].operator"),
    ("selector-in-without-values", policy(selector({"key": "tier", "operator": "In"})),
     "spec.selector.podSelector.matchExpressions[0].values",
     "spec.selector.podSelector.matchExpressions[0].values"),
    ("selector-exists-with-values",
     policy(selector({"key": "tier", "operator": "Exists", "values": ["a"]})),
     "spec.selector.podSelector.matchExpressions[0].values",
     "spec.selector.podSelector.matchExpressions[0].values"),
    ("selector-bad-label-value",
     policy(with_(POLICY, selector={"podSelector": {"matchLabels": {"app": "not valid!"}}})),
     "spec.selector.podSelector.matchLabels", "spec.selector.podSelector.matchLabels"),
    ("namespace-not-dns", policy(with_(POLICY, selector={"namespaces": ["Team_A"]})),
     "spec.selector.namespaces[0]", "spec.selector.namespaces[0]"),
    ("minPriority-string", policy(with_(POLICY, selector={"minPriority": "high"})),
     "spec.selector.minPriority", "spec.selector.minPriority"),
    ("gpuTypes-not-a-list", policy(with_(POLICY, gpuTypes="H100")), "spec.gpuTypes",
     "spec.gpuTypes"),
]


@pytest_asyncio.fixture
async def created(kube: KubeClient) -> AsyncIterator[list[str]]:
    """Paths of objects a test created; deleted afterwards."""
    paths: list[str] = []
    try:
        yield paths
    finally:
        for path in paths:
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)


def collection(obj: dict[str, Any]) -> str:
    return PROVIDERS_PATH if obj["kind"] == "GPUProvider" else POLICIES_PATH


async def create(kube: KubeClient, created: list[str], obj: dict[str, Any],
                 **params: str) -> dict[str, Any]:
    path = collection(obj)
    body = await kube.request("POST", path, body=obj, params=params or None)
    created.append(f"{path}/{body['metadata']['name']}")
    return body


def cause_fields(exc: InvalidError) -> list[str]:
    return [str(c.get("field", "")) for c in exc.body.get("details", {}).get("causes") or []]


@pytest.mark.parametrize(("obj", "api_field", "py_field"),
                         [pytest.param(o, a, p, id=i) for i, o, a, p in MALFORMED])
async def test_malformed_object_is_rejected_naming_the_field(
    kube: KubeClient, crds: list[str], created: list[str],
    obj: dict[str, Any], api_field: str, py_field: str | None,
) -> None:
    with pytest.raises(InvalidError) as info:
        await create(kube, created, obj)
    message = str(info.value)
    assert api_field in message, message
    assert any(f.startswith(api_field) for f in cause_fields(info.value)), info.value.body

    if py_field is not None:  # the Python reading of the CRD agrees
        parse = parse_gpu_provider if obj["kind"] == "GPUProvider" else parse_overflow_policy
        with pytest.raises(PolicyError) as py_info:
            parse(obj)
        fields = [p.field for p in py_info.value.problems]
        assert any(f.startswith(py_field) for f in fields), fields


async def test_unknown_field_is_rejected_with_strict_field_validation(
    kube: KubeClient, crds: list[str], created: list[str]
) -> None:
    # kubectl apply validates strictly by default; a typo must not silently become "no cap".
    obj = policy(with_(POLICY, limits={"maxGPU": 4}))
    with pytest.raises(BadRequestError) as info:
        await create(kube, created, obj, fieldValidation="Strict")
    assert "spec.limits.maxGPU" in str(info.value)


async def test_minimal_objects_are_accepted_with_defaults_applied(
    kube: KubeClient, crds: list[str], created: list[str]
) -> None:
    runpod = await create(kube, created, provider(copy.deepcopy(RUNPOD)))
    assert runpod["spec"]["credentialsSecret"]["key"] == "apiKey"
    mock = await create(kube, created, provider(copy.deepcopy(MOCK)))
    assert mock["spec"] == {**MOCK, "traffic": "auto"}

    ofp = await create(kube, created, policy(copy.deepcopy(POLICY)))
    assert ofp["spec"]["overflowAfter"] == "0s"
    assert ofp["spec"]["dryRun"] is False
    assert ofp["spec"]["moveBack"] == {"enabled": True, "stableFor": "2m", "maxConcurrent": 1,
                                       "cooldown": "5m", "timeout": "10m",
                                       "holdWhileQueued": True, "headroomGPUs": 0}
    assert ofp["spec"]["placement"] == "Ordered"
    assert ofp["spec"]["traffic"] == "auto"
    read = await kube.get(f"{POLICIES_PATH}/{ofp['metadata']['name']}")
    assert read["spec"] == ofp["spec"]

    # The Python defaults are the server's defaults: parsing the raw and the stored object agree.
    assert parse_overflow_policy(policy(copy.deepcopy(POLICY))).spec == \
        parse_overflow_policy(read).spec
    assert parse_gpu_provider(provider(copy.deepcopy(RUNPOD))).spec == \
        parse_gpu_provider(runpod).spec

    # A partly given moveBack keeps its other defaults.
    partial = await create(kube, created,
                           policy(with_(POLICY, moveBack={"enabled": False, "cooldown": "1h"})))
    assert partial["spec"]["moveBack"] == {"enabled": False, "stableFor": "2m",
                                           "maxConcurrent": 1, "cooldown": "1h",
                                           "timeout": "10m", "holdWhileQueued": True,
                                           "headroomGPUs": 0}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
async def test_every_example_is_accepted_and_parses(
    kube: KubeClient, crds: list[str], created: list[str], example: str
) -> None:
    objs = copy.deepcopy(EXAMPLES[example])
    assert objs
    for obj in objs:
        obj["metadata"]["name"] = f"{obj['metadata']['name']}-{uuid.uuid4().hex[:6]}"
        stored = await create(kube, created, obj, fieldValidation="Strict")
        parse = parse_gpu_provider if obj["kind"] == "GPUProvider" else parse_overflow_policy
        assert parse(stored).spec == parse(obj).spec


async def test_crds_have_printer_columns_status_subresource_and_short_names(
    kube: KubeClient, crds: list[str]
) -> None:
    assert sorted(crds) == ["gpuproviders.vkprovider.io", "overflowpolicies.vkprovider.io"]
    stored = [await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
              for name in crds]
    by_kind = {c["spec"]["names"]["kind"]: c for c in stored}
    expected = {
        "GPUProvider": (["Type", "Health", "Instances", "$/h", "Age"], "gpup"),
        "OverflowPolicy": (["Providers", "Pods", "GPUs", "$/h", "Age"], "ofp"),
    }
    for kind, (columns, short) in expected.items():
        crd = by_kind[kind]
        assert crd["spec"]["scope"] == "Cluster"
        assert crd["spec"]["names"]["shortNames"] == [short]
        (version,) = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == \
            ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}
        shown = [c["name"] for c in version["additionalPrinterColumns"]
                 if not c.get("priority")]
        assert shown == columns


async def test_status_is_validated_and_written_only_through_the_subresource(
    kube: KubeClient, crds: list[str], created: list[str]
) -> None:
    obj = await create(kube, created, provider(copy.deepcopy(MOCK)))
    path = f"{PROVIDERS_PATH}/{obj['metadata']['name']}"
    status = {"health": "Healthy", "runningInstances": 2, "currentPricePerHour": 4.98,
              "observedGeneration": 1,
              "blockedOffers": [{"region": "us-east", "gpuType": "H100", "reason": "no capacity",
                                 "until": "2030-01-01T00:00:00Z"}],
              "conditions": [{"type": "Ready", "status": "True", "reason": "Healthy",
                              "message": "", "lastTransitionTime": "2030-01-01T00:00:00Z"}]}
    # Through the main resource the status is ignored (status subresource semantics).
    await kube.patch(path, {"status": status})
    assert not (await kube.get(path)).get("status")
    written = await kube.patch(f"{path}/status", {"status": status})
    assert written["status"]["runningInstances"] == 2

    with pytest.raises(InvalidError) as info:
        await kube.patch(f"{path}/status", {"status": {"health": "Broken"}})
    assert "status.health" in str(info.value)
    with pytest.raises(InvalidError) as info:
        await kube.patch(f"{path}/status", {"status": {"blockedOffers": [{"reason": "x"}]}})
    assert "status.blockedOffers[0].until" in str(info.value)

    ofp = await create(kube, created, policy(copy.deepcopy(POLICY)))
    ofp_path = f"{POLICIES_PATH}/{ofp['metadata']['name']}"
    decision = {"time": "2030-01-01T00:00:00Z", "pod": "team-a/infer-1", "decision": "Admitted",
                "reason": "runpod has budget"}
    written = await kube.patch(f"{ofp_path}/status",
                               {"status": {"lastDecisions": [decision] * 20, "externalPods": 1}})
    assert len(written["status"]["lastDecisions"]) == 20
    with pytest.raises(InvalidError) as info:  # bounded: 20 at most
        await kube.patch(f"{ofp_path}/status", {"status": {"lastDecisions": [decision] * 21}})
    assert "status.lastDecisions" in str(info.value)

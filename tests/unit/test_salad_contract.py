"""Contract tests of the SaladCloud adapter against a fake that validates itself with Salad's spec.

Why it exists: without a SaladCloud account in CI, the only proof that :mod:`providers.salad`
speaks SaladCloud's API is that every request it sends, and every answer it is tested with, is
allowed by Salad's published OpenAPI document. The fake (:mod:`tests.fakes.salad_fake`) answers
599 and records a violation for anything the spec does not allow (including body fields it does
not declare); the ``fake`` fixture fails every test that left one. On top of that these tests pin
the adapter's semantics: name derivation, identity carried in the environment, idempotent create,
owner filtering, status and error mapping, logs, capacity, and that the API key never leaks.
Nothing sleeps: retries run with zero backoff and the log poll interval is zero.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from providers.base import (
    TAG_NODE,
    TAG_POD,
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
    ProviderError,
    PublishedPort,
    QuotaError,
    RateLimited,
    RegistryAuth,
    TransientError,
    edge_api_key,
)
from providers.salad import META_ENV, SaladProvider, _published, map_status, salad_name
from tests.fakes.common import TRANSPORT_FAILURES, FailingTransport, Providers, assert_never_shown
from tests.fakes.salad_fake import API_KEY, BASE_PATH, FakeSalad, dumps_meta
from tests.fakes.vastai_fake import VIOLATION_STATUS

BASE_URL = "https://api.salad.com/api/public"
OWNER = "vk-gpu-burst"
UID = "0f8fa8a2-1111-2222-3333-444455556666"
NAME = f"{OWNER}-{UID}"
RTX4090 = "ed563892-aacd-40f5-80b7-90c9be6c759b"
RTX3090 = "a5db5c50-cbcb-4596-ae80-6a0c8090d80f"
A100 = "0b7fd5aa-38e1-4c2b-8d3c-6fd0aa2b0f11"
FAST = {"backoff_initial": 0.0, "backoff_max": 0.0, "retry_after_cap": 1.0,
        "log_poll_interval": 0.0}
BASE_OPTIONS = {"organization": "acme", "project": "gpu",
                "gpu_types": {"RTX4090": "RTX 4090 (24 GB)", "A100": [A100]}, **FAST}
CONTAINERS = "/organizations/acme/projects/gpu/containers"

MakeProvider = Callable[..., SaladProvider]


@pytest.fixture
def fake() -> Iterator[FakeSalad]:
    state = FakeSalad(organization="acme", project="gpu", api_key=API_KEY)
    yield state
    assert state.violations == [], "the adapter or the fake broke SaladCloud's spec"


@pytest.fixture
async def make_provider(fake: FakeSalad) -> AsyncIterator[MakeProvider]:
    providers: Providers[SaladProvider] = Providers()

    def make(*, owner: str = OWNER, options: dict[str, Any] | None = None,
             transport: httpx.AsyncBaseTransport | None = None,
             api_key: str | None = API_KEY) -> SaladProvider:
        return providers.keep(SaladProvider(
            name="salad", base_url=BASE_URL, owner=owner, api_key=api_key,
            options={**BASE_OPTIONS, **(options or {})},
            transport=transport or httpx.ASGITransport(app=fake.app),
        ))

    yield make
    await providers.aclose()


@pytest.fixture
def provider(make_provider: MakeProvider) -> SaladProvider:
    return make_provider()


def spec(name: str = NAME, **changes: Any) -> InstanceSpec:
    fields: dict[str, Any] = {
        "name": name,
        "image": "ghcr.io/acme/serve:1.0",
        "gpu_count": 1,
        "gpu_type": "RTX4090",
        "tags": {TAG_NODE: OWNER, TAG_POD: "serve-0", TAG_UID: UID},
    }
    fields.update(changes)
    return InstanceSpec(**fields)


def created(fake: FakeSalad) -> list[dict[str, Any]]:
    return [r.body for r in fake.calls("POST", CONTAINERS)]


def meta(name: str, owner: str = OWNER, **tags: str) -> str:
    return dumps_meta({"name": name, "gpu": "RTX4090", "price": 0.3,
                       "tags": {TAG_NODE: owner, **tags}})


# -- the fake itself ---------------------------------------------------------------------------


async def test_the_fake_flags_a_request_the_spec_forbids(fake: FakeSalad) -> None:
    prototype = {"name": "ok-name", "autostart_policy": True, "replicas": 1,
                 "restart_policy": "never",
                 "container": {"image": "x", "resources": {"cpu": 1, "memory": 1024}}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fake.app),
                                 base_url=BASE_URL) as client:
        auth = {"Salad-Api-Key": API_KEY}
        bad = [
            await client.post(CONTAINERS, json={**prototype, "name": "Bad_Name"}, headers=auth),
            await client.post(CONTAINERS, json={**prototype, "labels": {"a": "b"}},
                              headers=auth),  # a field the spec does not declare
            await client.post(CONTAINERS, json={
                **prototype, "container": {**prototype["container"], "env": {"A": "1"}}},
                headers=auth),  # undeclared at depth
            await client.post(CONTAINERS, json={**prototype, "replicas": 501}, headers=auth),
            await client.get(CONTAINERS),  # no key
            await client.get(CONTAINERS, params={"page": 2}, headers=auth),
            await client.get(CONTAINERS + "/x1/instances", headers=auth),  # not implemented
            await client.get("https://api.salad.com/organizations/acme/projects/gpu/containers",
                             headers=auth),  # outside the server path
        ]
    assert [r.status_code for r in bad] == [VIOLATION_STATUS] * len(bad)
    assert len(fake.violations) == len(bad)
    fake.violations.clear()


async def test_the_fake_flags_a_response_the_spec_forbids(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    group = fake.add_group(name="broken", env={META_ENV: meta("broken")})
    group["current_state"]["status"] = "exploded"
    with pytest.raises(ProviderError):
        await provider.list()
    assert any("response 200" in v for v in fake.violations)
    fake.violations.clear()


async def test_norway_is_a_country_despite_yaml(fake: FakeSalad,
                                                make_provider: MakeProvider) -> None:
    await make_provider().create(spec(region="no"))
    assert created(fake)[0]["country_codes"] == ["no"]


async def test_provider_satisfies_the_protocol(provider: SaladProvider) -> None:
    assert isinstance(provider, Provider)


# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec_name",
    [
        NAME,
        "a" * 63,
        "a" * 64,
        "Node_A.example.com-" + UID,
        "gpu-burst.prod.us-east-1.compute.internal-" + UID,
        "1-leading-digit",
        "trailing-dash-",
        "x",
        "!!!",
    ],
)
def test_group_names_are_valid_deterministic_and_distinct(spec_name: str) -> None:
    name = salad_name(spec_name)
    assert re.fullmatch(r"[a-z][a-z0-9-]{0,61}[a-z0-9]", name)
    assert salad_name(spec_name) == name
    if re.fullmatch(r"[a-z][a-z0-9-]{0,61}[a-z0-9]", spec_name):
        assert name == spec_name  # a valid name is kept as is
    else:
        assert name != salad_name(spec_name + "x")


def test_names_that_clean_up_alike_still_get_different_groups() -> None:
    assert salad_name("node_a-1") != salad_name("node.a-1")
    long_a, long_b = "n" * 80 + "-uid-1", "n" * 80 + "-uid-2"
    assert salad_name(long_a) != salad_name(long_b)


# -- create ------------------------------------------------------------------------------------


async def test_create_maps_the_spec_onto_a_container_group(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    instance = await provider.create(spec(
        command=("python", "serve.py"), args=("--port", "8000"),
        env={"MODEL": "llama", "TOKEN": "s3cr3t"}, ports=(Port(container_port=8000),),
        cpu_millis=2500, memory_bytes=8 * 2**30, region="us",
    ))
    (body,) = created(fake)
    assert body["name"] == NAME
    assert body["display_name"] == NAME[:63]
    assert body["replicas"] == 1 and body["autostart_policy"] is True
    assert body["restart_policy"] == "never"
    assert body["country_codes"] == ["us"]
    # auth on by default: the access domain is public; probes and the gateway send the key
    assert body["networking"] == {"protocol": "http", "port": 8000, "auth": True}
    container = body["container"]
    assert container["image"] == "ghcr.io/acme/serve:1.0"
    assert container["command"] == ["python", "serve.py", "--port", "8000"]
    assert container["priority"] == "high"
    assert container["resources"] == {"cpu": 3, "memory": 8192, "gpu_classes": [RTX4090]}
    env = container["environment_variables"]
    assert {k: v for k, v in env.items() if k != META_ENV} == {"MODEL": "llama",
                                                               "TOKEN": "s3cr3t"}
    assert json.loads(env[META_ENV]) == {
        "name": NAME, "gpu": "RTX4090", "price": 0.3,
        "tags": {TAG_NODE: OWNER, TAG_POD: "serve-0", TAG_UID: UID}}
    (availability,) = [r.body for r in fake.calls("POST", "/sce-gpu-availability")]
    assert availability == {"gpu_classes": [RTX4090], "cpu": 3, "memory": 8192,
                            "country_codes": ["us"]}
    assert instance.id == NAME and instance.name == NAME
    assert instance.state is InstanceState.PENDING
    assert (instance.gpu_type, instance.gpu_count, instance.region) == ("RTX4090", 1, "us")
    assert instance.price_per_hour == 0.3
    assert instance.tags[TAG_UID] == UID
    assert instance.endpoints and instance.endpoints[0].startswith("https://")


async def test_the_networking_access_domain_is_published_on_443_over_https(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    instance = await provider.create(spec(ports=(Port(container_port=8000),)))
    dns = fake.groups[instance.id]["networking"]["dns"]
    expected = (PublishedPort(container_port=8000, host=dns, port=443, kind="hostname",
                              scheme="https", edge_auth="Salad-Api-Key"),)
    assert instance.published == expected
    fake.set_state(instance.id, "running", running_count=1)
    (listed,) = await provider.list()
    assert listed.state is InstanceState.RUNNING and listed.published == expected
    assert listed.endpoints == (f"https://{dns}",)


async def test_the_edge_auth_is_turned_on_and_the_key_offered_to_probes_and_gateway(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    """By default the group's container gateway requires the account's key (issue 38): the
    request says ``networking.auth: true`` (valid against the spec: the fake checks), the group
    keeps it, and the published entry names the header the probes and the gateway must fill
    with the key the adapter offers (``edge_api_key``)."""
    instance = await provider.create(spec(ports=(Port(container_port=8000),)))
    (body,) = created(fake)
    assert body["networking"]["auth"] is True
    assert fake.groups[instance.id]["networking"]["auth"] is True
    [published] = instance.published
    assert published.edge_auth == "Salad-Api-Key"
    assert edge_api_key(provider) == API_KEY


async def test_the_edge_auth_can_be_turned_off(fake: FakeSalad,
                                               make_provider: MakeProvider) -> None:
    provider = make_provider(options={"networking_auth": False})
    instance = await provider.create(spec(ports=(Port(container_port=8000),)))
    (body,) = created(fake)
    assert body["networking"] == {"protocol": "http", "port": 8000, "auth": False}
    [published] = instance.published
    assert published.edge_auth is None  # an open access domain: nobody adds the key


async def test_a_group_without_networking_publishes_nothing(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    instance = await provider.create(spec())  # no ports: no networking block
    assert "networking" not in fake.groups[instance.id]
    assert instance.published == () and instance.endpoints == ()
    fake.add_group(name="other", env={META_ENV: meta("vk-gpu-burst-other")})
    assert [i.published for i in await provider.list()] == [(), ()]


@pytest.mark.parametrize(
    "networking",
    [
        None,
        "nope",
        {},
        {"port": 8000},  # no dns (the spec requires one)
        {"dns": "abc.salad.cloud"},  # no port (ditto)
        {"dns": "", "port": 8000},
        {"dns": 7, "port": 8000},
        {"dns": "abc.salad.cloud", "port": "8000"},
        {"dns": "abc.salad.cloud", "port": True},
        {"dns": "abc.salad.cloud", "port": 0},
        {"dns": "https://[broken", "port": 8000},
    ],
)
def test_malformed_networking_publishes_nothing(networking: Any) -> None:
    assert _published(networking) == ()


def test_a_dns_given_as_a_url_is_reduced_to_its_host() -> None:
    # The spec says "format: url" but its pattern allows a bare name only; accept both.
    assert _published({"dns": "https://Abc.salad.cloud/", "port": 80}) == (
        PublishedPort(container_port=80, host="abc.salad.cloud", port=443, kind="hostname",
                      scheme="https"),)


async def test_create_with_a_long_name_uses_the_derived_name_and_keeps_the_real_one(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    long_name = "gpu-burst.prod.us-east-1.compute.internal-" + UID
    instance = await provider.create(spec(name=long_name))
    assert instance.id == salad_name(long_name) != long_name
    assert instance.name == long_name
    assert [i.name for i in await provider.list()] == [long_name]


async def test_options_shape_the_group(fake: FakeSalad, make_provider: MakeProvider) -> None:
    provider = make_provider(options={
        "priority": "batch", "restart_policy": "on_failure", "storage_gb": 50,
        "default_cpu": 4, "default_memory_mb": 16384, "country_codes": ["de", "fr"],
        "networking_auth": True,
        "registry_authentication": {"basic": {"username": "u", "password": "p"}},
        "registry_hosts": ["ghcr.io"],
    })
    instance = await provider.create(spec(ports=(Port(container_port=80),)))
    (body,) = created(fake)
    assert body["restart_policy"] == "on_failure"
    assert body["country_codes"] == ["de", "fr"]
    assert body["networking"]["auth"] is True
    container = body["container"]
    assert container["priority"] == "batch"
    assert container["resources"] == {"cpu": 4, "memory": 16384, "gpu_classes": [RTX4090],
                                      "storage_amount": 50 * 2**30}
    assert container["registry_authentication"] == {"basic": {"username": "u", "password": "p"}}
    assert instance.price_per_hour == 0.12  # batch price of the RTX 4090 class


@pytest.mark.parametrize(
    ("shm_bytes", "expected"),
    [
        (8 * 2**30, 8192),
        (2**30 + 1, 1025),  # MB, rounded up
        (32 * 2**30, 16384),  # at most the container's memory, as the kubelet bounds it
        (0, 16384),  # no size asked: the container's memory
        (2**20, 64),  # at least the spec's minimum
    ],
)
async def test_dev_shm_is_the_containers_shm_size(
    fake: FakeSalad, provider: SaladProvider, shm_bytes: int, expected: int
) -> None:
    await provider.create(spec(shm_bytes=shm_bytes, memory_bytes=16 * 2**30))
    (body,) = created(fake)
    assert body["container"]["resources"]["shm_size"] == expected
    # the group Salad keeps carries it too, and answers with it (checked against the spec)
    assert fake.groups[NAME]["container"]["resources"]["shm_size"] == expected
    assert [i.name for i in await provider.list()] == [NAME]


async def test_without_dev_shm_salad_keeps_its_default(fake: FakeSalad,
                                                      provider: SaladProvider) -> None:
    await provider.create(spec())
    assert "shm_size" not in created(fake)[0]["container"]["resources"]


async def test_a_cpu_only_spec_needs_no_gpu_class(fake: FakeSalad,
                                                  provider: SaladProvider) -> None:
    instance = await provider.create(spec(gpu_count=0, gpu_type=None))
    assert created(fake)[0]["container"]["resources"]["gpu_classes"] == []
    assert fake.calls("GET", "/gpu-classes") == []
    assert instance.gpu_count == 0


async def test_any_gpu_means_the_mapped_classes_within_the_price(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    await provider.create(spec(gpu_type=None, max_price_per_hour=0.5))
    assert created(fake)[0]["container"]["resources"]["gpu_classes"] == [RTX4090]


async def test_an_unmapped_type_matches_the_class_named_like_it(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    await provider.create(spec(gpu_type="RTX 3090"))
    assert created(fake)[0]["container"]["resources"]["gpu_classes"] == [RTX3090]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"gpu_count": 2}, "a Salad node has one"),
        ({"args": ("--port", "80")}, "args without command"),
        ({"ports": (Port(container_port=80), Port(container_port=81))}, "exposes one"),
        ({"ports": (Port(container_port=53, protocol="UDP"),)}, "UDP"),
        ({"env": {"EMPTY": ""}}, "EMPTY"),
        ({"env": {"MULTI": "a\nb"}}, "line break"),
        ({"env": {"BIG": "x" * 1001}}, "longer than 1000"),
        ({"env": {META_ENV: "x"}}, "reserved"),
        ({"command": ("sh", "-c", "")}, "non-empty"),
        ({"region": "europe-west"}, "two-letter country code"),
        ({"cpu_millis": 2_000_000}, "over Salad's limits"),
        ({"name": "n" * 990}, "exceed 1000 characters"),
    ],
)
async def test_specs_salad_cannot_run_are_refused_before_any_request(
    fake: FakeSalad, provider: SaladProvider, changes: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidSpec, match=match):
        await provider.create(spec(**changes))
    assert fake.requests == []


async def test_no_free_node_is_a_capacity_error_and_nothing_is_created(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    fake.availability[RTX4090]["high"] = 0
    with pytest.raises(CapacityError, match="no SaladCloud node free"):
        await provider.create(spec())
    assert created(fake) == []


async def test_the_availability_check_can_be_turned_off(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    fake.availability[RTX4090]["high"] = 0
    await make_provider(options={"check_availability": False}).create(spec())
    assert len(created(fake)) == 1
    assert fake.calls("POST", "/sce-gpu-availability") == []


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"gpu_type": "H200"}, "no GPU class for H200"),
        ({"gpu_type": "A100", "max_price_per_hour": 1.0}, "costs <= \\$1.0/h"),
    ],
)
async def test_gpus_salad_does_not_sell_are_capacity_errors(
    fake: FakeSalad, provider: SaladProvider, changes: dict[str, Any], match: str
) -> None:
    with pytest.raises(CapacityError, match=match):
        await provider.create(spec(**changes))
    assert created(fake) == []


# -- idempotency, adoption, start --------------------------------------------------------------


async def test_create_twice_makes_one_group(fake: FakeSalad, provider: SaladProvider) -> None:
    first = await provider.create(spec())
    second = await provider.create(spec())
    assert first.id == second.id
    assert list(fake.groups) == [NAME]
    assert len(created(fake)) == 1


async def test_create_adopts_a_group_a_previous_process_made(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    await make_provider().create(spec())  # then the process "crashed"
    fake.set_state(NAME, "running", running_count=1)
    again = await make_provider().create(spec())
    assert again.state is InstanceState.RUNNING
    assert len(fake.groups) == 1 and len(created(fake)) == 1


async def test_a_create_that_races_another_adopts_on_conflict(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    fake.add_group(name=NAME, env={META_ENV: meta(NAME, **{TAG_UID: UID})})
    fake.fail("get_container_group", 404)  # the lookup misses it; the create then conflicts
    instance = await provider.create(spec())
    assert [r.status for r in fake.calls("POST", CONTAINERS)] == [409]
    assert instance.id == NAME and instance.tags[TAG_UID] == UID
    assert len(fake.groups) == 1


async def test_a_name_taken_by_something_else_is_never_adopted(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    fake.add_group(name=NAME)  # made by a human: no identity variable
    with pytest.raises(ProviderError, match="refusing to adopt"):
        await make_provider().create(spec())
    fake.groups.clear()
    fake.add_group(name=NAME, env={META_ENV: meta(NAME, owner="other-node")})
    with pytest.raises(ProviderError, match="belongs to node 'other-node'"):
        await make_provider().create(spec())
    assert created(fake) == []


async def test_a_group_that_did_not_start_is_started(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    fake.created_status = "stopped"
    instance = await provider.create(spec())
    assert len(fake.calls("POST", f"{CONTAINERS}/{NAME}/start")) == 1
    assert instance.state is InstanceState.PENDING
    assert fake.groups[NAME]["current_state"]["status"] == "pending"


async def test_list_returns_only_this_owners_groups(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    fake.add_group(name="ours-1", env={META_ENV: meta("ours-1")})
    fake.add_group(name="ours-2", env={META_ENV: meta("ours-2")}, status="pending")
    fake.add_group(name="theirs", env={META_ENV: meta("theirs", owner="other-node")})
    fake.add_group(name="by-hand", env={"A": "1"})
    fake.add_group(name="garbled", env={META_ENV: "{not json"})
    instances = await provider.list()
    assert sorted(i.id for i in instances) == ["ours-1", "ours-2"]
    assert {i.tags[TAG_NODE] for i in instances} == {OWNER}
    assert len(fake.calls("GET", CONTAINERS)) == 1


@pytest.mark.parametrize(
    ("status", "running", "state"),
    [
        ("pending", 0, InstanceState.PENDING),
        ("deploying", 0, InstanceState.PENDING),
        ("running", 0, InstanceState.PENDING),
        ("running", 1, InstanceState.RUNNING),
        ("succeeded", 0, InstanceState.SUCCEEDED),
        ("failed", 0, InstanceState.FAILED),
        ("stopped", 0, InstanceState.FAILED),
    ],
)
async def test_status_mapping(fake: FakeSalad, provider: SaladProvider, status: str,
                              running: int, state: InstanceState) -> None:
    fake.add_group(name="g1", env={META_ENV: meta("g1")})
    fake.set_state("g1", status, running_count=running, allocating_count=1 - running,
                   description="container exited with code 3" if status == "failed" else None)
    (instance,) = await provider.list()
    assert instance.state is state
    assert map_status(status, running) is state
    if state is InstanceState.SUCCEEDED:
        assert instance.exit_code == 0 and instance.finished_at is not None
    if status == "failed":
        assert instance.message == "container exited with code 3"
    if status == "stopped":
        assert instance.message == "stopped outside vkprovider"
    if state is InstanceState.PENDING and status == "running":
        assert instance.message == "running: allocating 1"
    if state is InstanceState.RUNNING:
        assert instance.started_at is not None


# -- delete ------------------------------------------------------------------------------------


async def test_delete_is_idempotent(fake: FakeSalad, provider: SaladProvider) -> None:
    fake.add_group(name="g1", env={META_ENV: meta("g1")})
    await provider.delete("g1")
    await provider.delete("g1")
    await provider.delete("Not A Name")  # never ours: no request
    assert fake.groups == {}
    assert [r.status for r in fake.calls("DELETE", "/g1")] == [202, 404]


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "status", "detail", "expected"),
    [
        ("create_container_group", 400, "container.image is invalid", InvalidSpec),
        ("create_container_group", 400, "The container group quota has been exceeded",
         QuotaError),
        ("create_container_group", 403, "Forbidden", AuthError),
        ("create_container_group", 403, "replica quota exceeded", QuotaError),
        ("create_container_group", 402, "payment required", QuotaError),
        ("create_container_group", 429, "Too many requests", RateLimited),
        ("create_container_group", 500, "boom", TransientError),
        ("get_container_group", 401, "The API key is not valid.", AuthError),
        ("list_gpu_classes", 503, "unavailable", TransientError),
        ("get_gpu_availability", 400, "no available capacity", CapacityError),
    ],
)
async def test_documented_errors_map_to_typed_errors(
    fake: FakeSalad, make_provider: MakeProvider, operation: str, status: int, detail: str,
    expected: type[ProviderError],
) -> None:
    provider = make_provider(options={"max_attempts": 1})
    fake.fail(operation, status, detail=detail,
              headers={"Retry-After": "30"} if status == 429 else None)
    with pytest.raises(expected) as caught:
        await provider.create(spec())
    assert f"HTTP {status}" in str(caught.value)
    assert detail in str(caught.value)
    assert caught.value.provider == "salad"


async def test_a_wrong_key_or_project_is_refused(fake: FakeSalad,
                                                 make_provider: MakeProvider) -> None:
    with pytest.raises(AuthError):
        await make_provider(api_key="wrong-key-123456").list()
    with pytest.raises(NotFound):
        await make_provider(options={"project": "nope"}).list()


async def test_rate_limits_carry_retry_after_and_short_ones_are_retried(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    fake.fail("list_container_groups", 429, headers={"Retry-After": "0"})
    assert await provider.list() == []
    assert [r.status for r in fake.calls("GET", CONTAINERS)] == [429, 200]
    fake.fail("list_container_groups", 429, headers={"Retry-After": "120"})
    with pytest.raises(RateLimited) as caught:
        await provider.list()
    assert caught.value.retry_after == 120.0
    fake.fail("list_container_groups", 429, times=2)  # Salad documents no Retry-After
    assert await provider.list() == []


async def test_server_errors_are_retried_then_transient(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    fake.fail("list_container_groups", 502, times=2)
    assert await provider.list() == []
    fake.fail("list_container_groups", 503, times=4)
    with pytest.raises(TransientError, match="HTTP 503"):
        await provider.list()


@pytest.mark.parametrize(("exc", "words"), TRANSPORT_FAILURES)
async def test_transport_failures_are_transient(
    make_provider: MakeProvider, exc: type[httpx.TransportError], words: str
) -> None:
    broken = FailingTransport(exc)
    with pytest.raises(TransientError, match=words):
        await make_provider(transport=broken).list()
    assert broken.calls == 4


async def test_the_api_key_never_appears_in_errors_or_repr(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    secret = "salad-SECRET-do-not-leak-42"
    fake.api_key = secret
    provider = make_provider(api_key=secret, options={"max_attempts": 1})
    errors: list[ProviderError] = []
    for status, detail in [(400, f"key {secret} is odd"), (403, "no"), (429, "slow"),
                           (500, "boom")]:
        fake.fail("create_container_group", status, detail=detail)
        with pytest.raises(ProviderError) as caught:
            await provider.create(spec())
        errors.append(caught.value)
    with pytest.raises(ProviderError) as caught:
        await make_provider(api_key="wrong").list()
    errors.append(caught.value)
    with pytest.raises(ProviderError) as caught:
        await make_provider(api_key=secret, transport=FailingTransport(httpx.ConnectError),
                            options={"max_attempts": 1}).list()
    errors.append(caught.value)
    assert_never_shown(secret, provider, *errors)
    assert "***" in str(errors[0])


# -- logs --------------------------------------------------------------------------------------


async def _drain(provider: SaladProvider, group: str, opts: LogOptions) -> bytes:
    return b"".join([chunk async for chunk in provider.logs(group, opts)])


async def test_logs_query_the_groups_container_entries(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    await provider.create(spec())
    for i in range(3):
        fake.add_log(NAME, f"line {i}")
    fake.add_log(NAME, json_log={"level": "info", "msg": "json"})
    fake.add_log("someone-else", "not ours")
    fake.add_log(NAME, "other project", project="other")
    assert await _drain(provider, NAME, LogOptions()) == (
        b'line 0\nline 1\nline 2\n{"level":"info","msg":"json"}\n')
    (query,) = [r.body for r in fake.calls("POST", "/log-entries")]
    assert query["query"] == (
        'resource.type = "container" AND resource.labels.project_name = "gpu" AND '
        f'resource.labels.container_group_name = "{NAME}"')
    assert query["sort_order"] == "asc" and query["page_size"] == 100


async def test_logs_tail_timestamps_limit_and_since(fake: FakeSalad,
                                                    provider: SaladProvider) -> None:
    await provider.create(spec())
    entries = [fake.add_log(NAME, f"line {i}") for i in range(5)]
    assert await _drain(provider, NAME, LogOptions(tail_lines=2)) == b"line 3\nline 4\n"
    stamped = await _drain(provider, NAME, LogOptions(tail_lines=1, timestamps=True))
    assert stamped == f"{entries[4]['time']} line 4\n".encode()
    assert await _drain(provider, NAME, LogOptions(limit_bytes=10)) == b"line 0\nlin"
    assert await _drain(provider, NAME, LogOptions(since_seconds=3600)) == b"".join(
        f"line {i}\n".encode() for i in range(5))


async def test_logs_page_through_more_than_one_page(fake: FakeSalad,
                                                    provider: SaladProvider) -> None:
    await provider.create(spec())
    for i in range(230):
        fake.add_log(NAME, f"l{i}")
    lines = (await _drain(provider, NAME, LogOptions())).decode().splitlines()
    assert lines == [f"l{i}" for i in range(230)]
    tail = (await _drain(provider, NAME, LogOptions(tail_lines=150))).decode().splitlines()
    assert tail == [f"l{i}" for i in range(80, 230)]


async def test_follow_streams_new_entries_until_the_group_ends(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    await provider.create(spec())
    fake.add_log(NAME, "first")
    stream = provider.logs(NAME, LogOptions(follow=True))
    assert await stream.__anext__() == b"first\n"
    fake.add_log(NAME, "second")
    assert await stream.__anext__() == b"second\n"
    fake.add_log(NAME, "last words")
    fake.set_state(NAME, "succeeded")
    assert [chunk async for chunk in stream] == [b"last words\n"]


async def test_logs_of_a_missing_group_are_not_found(provider: SaladProvider) -> None:
    with pytest.raises(NotFound):
        await _drain(provider, "gone-group", LogOptions())
    with pytest.raises(NotFound):
        await _drain(provider, "Not A Name", LogOptions())


# -- capacity ----------------------------------------------------------------------------------


async def test_capacity_reports_mapped_types_with_availability_and_price(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    fake.availability[RTX4090]["medium"] = 7
    fake.availability[A100]["medium"] = 0
    provider = make_provider(options={"priority": "medium", "region": "salad"})
    offers = await provider.capacity()
    assert [(o.gpu_type, o.region, o.available, o.price_per_gpu_hour) for o in offers] == [
        ("A100", "salad", 0, 0.96), ("RTX4090", "salad", 7, 0.24)]
    assert len(fake.calls("GET", "/gpu-classes")) == 1
    await provider.capacity()
    assert len(fake.calls("GET", "/gpu-classes")) == 1  # cached


async def test_capacity_without_a_map_reports_every_class(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    provider = make_provider(options={"gpu_types": {}, "country_codes": ["us"]})
    offers = await provider.capacity()
    assert {o.gpu_type for o in offers} == {"RTX 4090 (24 GB)", "RTX 3090 (24 GB)",
                                            "A100 (80 GB)"}
    bodies = [r.body for r in fake.calls("POST", "/sce-gpu-availability")]
    assert all(b["country_codes"] == ["us"] for b in bodies)


async def test_a_spec_in_the_reported_region_runs_anywhere_allowed(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    provider = make_provider(options={"region": "salad", "country_codes": ["us", "ca"]})
    await provider.create(spec(region="salad"))
    assert created(fake)[0]["country_codes"] == ["us", "ca"]


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"organization": ""}, "organization"),
        ({"project": "Bad_Project"}, "project"),
        ({"bogus": 1}, "unknown SaladCloud option"),
        ({"priority": "urgent"}, "priority"),
        ({"restart_policy": "sometimes"}, "restart_policy"),
        ({"default_memory_mb": 512}, "default_memory_mb"),
        ({"country_codes": ["usa"]}, "country_codes"),
        ({"gpu_types": {"X": []}}, "gpu_types"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SaladProvider(name="salad", base_url=BASE_URL, owner=OWNER, api_key=API_KEY,
                      options={**BASE_OPTIONS, **options})


def test_the_fake_serves_under_the_spec_server_path() -> None:
    assert BASE_URL.endswith(BASE_PATH)


# -- private images: container.registry_authentication ----------------------------------------

PASSWORD = "hunter2-Registry-Pa55"
AUTH = RegistryAuth(registry="ghcr.io", username="acme-bot", password=PASSWORD, secret="regcred")


async def test_a_pull_credential_becomes_basic_registry_authentication(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    await provider.create(spec(registry_auth=AUTH))
    (body,) = created(fake)
    assert body["container"]["registry_authentication"] == {
        "basic": {"username": "acme-bot", "password": PASSWORD}}
    group = await provider.list()
    assert PASSWORD not in json.dumps([r.body for r in fake.requests
                                       if r.method != "POST" or not r.path.endswith("/containers")])
    assert group


async def test_the_registry_authentication_option_goes_only_with_its_registry_hosts(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    static = {"basic": {"username": "org", "password": PASSWORD}}
    provider = make_provider(options={"registry_authentication": static,
                                      "registry_hosts": ["registry.example.com"]})
    await provider.create(spec("vk-gpu-burst-uid-1", image="attacker.example/x:1"))
    await provider.create(spec("vk-gpu-burst-uid-2", image="registry.example.com/team/model:1"))
    await provider.create(spec("vk-gpu-burst-uid-3", image="Registry.Example.com:5000/team/m"))
    attacker, ours, other_port = created(fake)
    assert "registry_authentication" not in attacker["container"]
    assert ours["container"]["registry_authentication"] == static
    assert "registry_authentication" not in other_port["container"]
    sent = [r for r in fake.requests if PASSWORD in json.dumps(r.body)]
    assert len(sent) == 1 and "registry.example.com" in json.dumps(sent[0].body)


@pytest.mark.parametrize("options", [
    {"registry_authentication": {"basic": {"username": "org", "password": PASSWORD}}},
    {"registry_hosts": ["registry.example.com"]},
])
def test_registry_authentication_without_its_registry_hosts_is_refused(
    make_provider: MakeProvider, options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match=r"options\.registry_hosts") as info:
        make_provider(options=options)
    assert PASSWORD not in str(info.value)


async def test_a_pod_credential_never_goes_with_an_image_of_another_registry(
    fake: FakeSalad, provider: SaladProvider
) -> None:
    await provider.create(spec(image="attacker.example/x:1", registry_auth=AUTH))
    (body,) = created(fake)
    assert "registry_authentication" not in body["container"]
    assert PASSWORD not in json.dumps([r.body for r in fake.requests])


async def test_a_pod_credential_wins_over_the_registry_authentication_option(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    static = {"gcp_gcr": {"service_key": '{"type": "service_account"}'}}
    provider = make_provider(options={"registry_authentication": static,
                                      "registry_hosts": ["ghcr.io/acme/"]})
    await provider.create(spec("vk-gpu-burst-uid-1"))
    await provider.create(spec("vk-gpu-burst-uid-2", registry_auth=AUTH))
    first, second = created(fake)
    assert first["container"]["registry_authentication"] == static
    assert second["container"]["registry_authentication"] == {
        "basic": {"username": "acme-bot", "password": PASSWORD}}


@pytest.mark.parametrize(("username", "password"), [
    ("acme-bot", '{\n  "type": "service_account"\n}'),
    ("acme-bot", "line\rbreak"),
    ("", PASSWORD),
    ("acme-bot", ""),
    ("acme-bot", "x" * 10001),
])
async def test_a_credential_outside_the_specs_limits_is_refused_before_any_call(
    fake: FakeSalad, provider: SaladProvider, username: str, password: str
) -> None:
    auth = RegistryAuth(registry="gcr.io", username=username, password=password,
                        secret="regcred")
    with pytest.raises(InvalidSpec, match="imagePullSecrets") as info:
        await provider.create(spec(image="gcr.io/acme/serve:1", registry_auth=auth))
    assert "'regcred'" in str(info.value) and "gcr.io" in str(info.value)
    if password:
        assert_never_shown(password, info.value)
    assert fake.requests == []


async def test_the_password_is_never_shown_in_errors_reprs_or_logs(
    fake: FakeSalad, provider: SaladProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    the_spec = spec(registry_auth=AUTH)
    fake.fail("create_container_group", 400, title=f"Bad {PASSWORD}",
              detail=f"registry rejected acme-bot/{PASSWORD}")
    with pytest.raises(InvalidSpec) as create_error:
        await provider.create(the_spec)
    assert "***" in str(create_error.value)
    inst = await provider.create(the_spec)
    fake.set_state(salad_name(NAME), "failed", description=f"pull failed with {PASSWORD}")
    (listed,) = await provider.list()
    assert listed.message is not None and "***" in listed.message
    assert_never_shown(PASSWORD, create_error.value, the_spec, AUTH, provider, inst, listed,
                       listed.message)
    for record in caplog.records:
        assert PASSWORD not in record.getMessage() and PASSWORD not in str(record.args)


async def test_salad_offers_stay_ordinary_and_an_interruptible_spec_runs_at_its_priority(
    fake: FakeSalad, make_provider: MakeProvider
) -> None:
    # every Salad node is interruptible and Salad re-places replicas itself; its spec has no
    # notice field (providers/salad.py): offers are ordinary, the spec is accepted as is
    fake.availability[RTX4090]["batch"] = 3
    provider = make_provider(options={"priority": "batch"})
    assert not any(o.interruptible for o in await provider.capacity())
    created = await provider.create(spec(interruptible=True))
    [body] = [c.body for c in fake.calls("POST", "/containers")]
    assert body["container"]["priority"] == "batch"
    assert "interruptible" not in json.dumps(body)
    assert (created.interruption_at, created.interrupted) == (None, False)


def test_an_access_domain_with_auth_on_says_the_edge_wants_the_salad_api_key() -> None:
    # networking.auth: SaladCloud's gateway refuses callers without the account's key; the
    # provider's probes and traffic gateway add it (docs/traffic.md)
    with_auth = {"dns": "abc.salad.cloud", "port": 80, "auth": True}
    assert _published(with_auth)[0].edge_auth == "Salad-Api-Key"
    assert _published({**with_auth, "auth": False})[0].edge_auth is None
    assert _published({**with_auth, "auth": "true"})[0].edge_auth is None  # not a boolean

"""Contract tests of the Vast.ai adapter against a fake that validates itself with Vast.ai's spec.

Why it exists: without a Vast.ai account in CI, the only proof that :mod:`providers.vastai`
speaks Vast.ai's API is that every request it sends, and every answer it is tested with, is
allowed by Vast.ai's published OpenAPI document. The fake (:mod:`tests.fakes.vastai_fake`)
answers 599 and records a violation for anything the spec does not allow; the ``fake`` fixture
fails every test that left one. On top of that these tests pin the adapter's semantics: the
search-then-rent create, label-based idempotency and owner filtering, status and error mapping,
logs, capacity, and that the API key never leaks. Nothing sleeps: retries run with zero backoff.
"""

from __future__ import annotations

import json
import logging
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
    Unsupported,
)
from providers.vastai import VastAIProvider, decode_label, encode_label, map_status
from tests.fakes.common import TRANSPORT_FAILURES, FailingTransport, Providers, assert_never_shown
from tests.fakes.vastai_fake import API_KEY, VIOLATION_STATUS, FakeVastAI, specs_dir
from vkprovider.api.gpu import BulkGPUMetricsSource
from vkprovider.gpureadings import parse_readings

BASE_URL = "https://console.vast.ai"
OWNER = "vk-gpu-burst"
FAST = {"backoff_initial": 0.0, "backoff_max": 0.0, "retry_after_cap": 1.0,
        "log_poll_interval": 0.0}
GPU_TYPES = {"H100": ["H100_SXM", "H100_PCIE"], "RTX4090": "RTX_4090"}

MakeProvider = Callable[..., VastAIProvider]


@pytest.fixture
def fake() -> Iterator[FakeVastAI]:
    state = FakeVastAI(api_key=API_KEY)
    yield state
    assert state.violations == [], "the adapter or the fake broke Vast.ai's spec"


@pytest.fixture
async def make_provider(fake: FakeVastAI) -> AsyncIterator[MakeProvider]:
    providers: Providers[VastAIProvider] = Providers()

    def make(*, owner: str = OWNER, options: dict[str, Any] | None = None,
             transport: httpx.AsyncBaseTransport | None = None,
             api_key: str | None = API_KEY) -> VastAIProvider:
        return providers.keep(VastAIProvider(
            name="vast", base_url=BASE_URL, owner=owner, api_key=api_key,
            options={"gpu_types": GPU_TYPES, **FAST, **(options or {})},
            transport=transport or httpx.ASGITransport(app=fake.app),
        ))

    yield make
    await providers.aclose()


@pytest.fixture
def provider(make_provider: MakeProvider) -> VastAIProvider:
    return make_provider()


def spec(name: str = "vk-gpu-burst-uid-1", **changes: Any) -> InstanceSpec:
    fields: dict[str, Any] = {
        "name": name,
        "image": "ghcr.io/acme/train:1.0",
        "gpu_count": 1,
        "gpu_type": "H100",
        "tags": {TAG_NODE: OWNER, TAG_POD: "train-0", TAG_UID: "uid-1"},
    }
    fields.update(changes)
    return InstanceSpec(**fields)


def rents(fake: FakeVastAI) -> list[dict[str, Any]]:
    return [r.body for r in fake.calls("PUT", "/api/v0/asks/")]


def searches(fake: FakeVastAI) -> list[dict[str, Any]]:
    return [r.body for r in fake.calls("POST", "/api/v0/bundles")]


# -- the fake itself ---------------------------------------------------------------------------


async def test_the_fake_flags_a_request_the_spec_forbids(fake: FakeVastAI) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fake.app),
                                 base_url=BASE_URL) as client:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        bad = [
            await client.put("/api/v0/asks/1", json={"label": "no image"}, headers=auth),
            await client.post("/api/v0/bundles", json={"order": [["dph_total", "asc"]]},
                              headers=auth),  # the spec wants exactly two sort directives
            await client.post("/api/v0/bundles", json={"limti": 3}, headers=auth),
            await client.get("/api/v1/instances", params={"limit": 26}, headers=auth),
            await client.get("/api/v1/instances", params={"page": 2}, headers=auth),
            await client.delete("/api/v0/instances/abc", headers=auth),
            await client.get("/api/v1/instances"),  # no credentials
            await client.get("/api/v0/instances/1", headers=auth),  # not implemented
        ]
    assert [r.status_code for r in bad] == [VIOLATION_STATUS] * len(bad)
    assert len(fake.violations) == len(bad)
    fake.violations.clear()


async def test_the_fake_flags_a_response_the_spec_forbids(fake: FakeVastAI,
                                                          provider: VastAIProvider) -> None:
    fake.add_instance(label=encode_label(name="x", tags={TAG_NODE: OWNER}), num_gpus="two")
    with pytest.raises(ProviderError):
        await provider.list()
    assert any("response 200" in v for v in fake.violations)
    fake.violations.clear()


def test_the_spec_folder_comes_from_vkp_specs_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VKP_SPECS_DIR", "/somewhere/specs")
    assert str(specs_dir()) == "/somewhere/specs"
    monkeypatch.delenv("VKP_SPECS_DIR")
    assert (specs_dir() / "vastai" / "openapi.yaml").is_file()


async def test_provider_satisfies_the_protocol(provider: VastAIProvider) -> None:
    assert isinstance(provider, Provider)


# -- create ------------------------------------------------------------------------------------


async def test_create_searches_then_rents_the_cheapest_matching_offer(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", dph_total=2.5)
    cheap = fake.add_offer(gpu_name="H100 PCIE", dph_total=2.0, geolocation="Quebec, CA")
    fake.add_offer(gpu_name="RTX 4090", dph_total=0.4)  # wrong GPU
    fake.add_offer(gpu_name="H100 SXM", num_gpus=2, dph_total=1.0)  # wrong count

    instance = await provider.create(spec(
        args=("serve", "--port", "8000"), env={"MODEL": "llama", "TOKEN": "s3cr3t=="},
        ports=(Port(container_port=8000), Port(container_port=9000, protocol="UDP")),
        cpu_millis=4000, memory_bytes=16 * 2**30, max_price_per_hour=3.0,
    ))

    (search,) = searches(fake)
    assert search["num_gpus"] == {"eq": 1}
    assert search["gpu_name"] == {"in": ["H100_SXM", "H100_PCIE"]}
    assert search["direct_port_count"] == {"gte": 2}
    assert search["cpu_cores_effective"] == {"gte": 4.0}
    assert search["cpu_ram"] == {"gte": 16384}
    assert search["dph_total"] == {"lte": 3.0}
    assert search["rentable"] == {"eq": True} and search["verified"] == {"eq": True}
    (rent,) = rents(fake)
    assert fake.calls("PUT", "/api/v0/asks/")[0].path == f"/api/v0/asks/{cheap['id']}"
    assert rent["image"] == "ghcr.io/acme/train:1.0"
    assert rent["runtype"] == "args"
    assert rent["args"] == ["serve", "--port", "8000"]
    assert rent["env"] == "-e MODEL=llama -e TOKEN=s3cr3t== -p 8000:8000 -p 9000:9000/udp"
    assert rent["disk"] == 20.0 and rent["cancel_unavail"] is True
    assert decode_label(rent["label"]) == (
        "vk-gpu-burst-uid-1", {TAG_NODE: OWNER, TAG_POD: "train-0", TAG_UID: "uid-1"})
    assert instance.id == str(next(iter(fake.instances)))
    assert instance.state is InstanceState.PENDING
    assert instance.name == "vk-gpu-burst-uid-1"
    assert (instance.gpu_type, instance.gpu_count, instance.region) == ("H100", 1, "CA")
    assert instance.price_per_hour == 2.0
    assert instance.tags[TAG_UID] == "uid-1"


async def test_env_can_be_sent_as_the_dict_the_cli_sends(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    provider = make_provider(options={"env_format": "dict"})
    await provider.create(spec(env={"GREETING": "hello world"},
                               ports=(Port(container_port=8000),)))
    assert rents(fake)[0]["env"] == {"GREETING": "hello world", "-p 8000:8000": "1"}


async def test_command_runs_as_onstart_only_when_configured(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    provider = make_provider(options={"command_mode": "onstart"})
    await provider.create(spec(command=("python", "-c"), args=("print('hi there')",)))
    rent = rents(fake)[0]
    assert rent["runtype"] == "ssh"
    assert rent["onstart"] == "python -c 'print('\"'\"'hi there'\"'\"')'"
    assert "args" not in rent


@pytest.mark.parametrize(
    ("user", "group", "expected"),
    [(1000, None, "1000"), (1000, 3000, "1000:3000"), (0, 0, "0:0"), (None, 3000, None),
     (None, None, None)],
)
async def test_the_user_is_the_rents_docker_user(
    fake: FakeVastAI, provider: VastAIProvider, user: int | None, group: int | None,
    expected: str | None,
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    await provider.create(spec(run_as_user=user, run_as_group=group))
    (rent,) = rents(fake)
    assert rent.get("user") == expected  # the spec's user: a string for docker create --user


@pytest.mark.parametrize(
    ("env_format", "expected"),
    [("string", "-e MODEL=llama -p 8000:8000 -h llm-0"),
     ("dict", {"MODEL": "llama", "-p 8000:8000": "1", "-h": "llm-0"})],
)
async def test_the_hostname_is_the_docker_option_h_in_env(
    fake: FakeVastAI, make_provider: MakeProvider, env_format: str, expected: Any,
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    provider = make_provider(options={"env_format": env_format})
    await provider.create(spec(hostname="llm-0", env={"MODEL": "llama"},
                               ports=(Port(container_port=8000),)))
    assert rents(fake)[0]["env"] == expected


async def test_bid_offers_rent_at_the_spec_price_or_the_minimum_bid(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", dph_total=1.0, min_bid=0.35)
    fake.add_offer(gpu_name="H100 SXM", dph_total=1.0, min_bid=0.35)
    provider = make_provider(options={"offer_type": "bid"})
    await provider.create(spec(name="a"))
    await provider.create(spec(name="b", max_price_per_hour=0.5))
    assert [s["type"] for s in searches(fake)] == ["bid", "bid"]
    assert [r["price"] for r in rents(fake)] == [0.35, 0.5]


@pytest.mark.parametrize(
    ("changes", "options", "match"),
    [
        ({"gpu_count": 0}, {}, "rents GPU machines"),
        ({"command": ("python",)}, {}, "ENTRYPOINT"),
        ({"env": {"BAD-NAME": "x"}}, {}, "not valid"),
        ({"env": {"A": "two words"}}, {}, "env_format"),
        ({"env": {"A": 'quo"te'}}, {}, "env_format"),
        ({"ports": (Port(container_port=80, protocol="SCTP"),)}, {}, "SCTP"),
        ({"name": "n" * 1100}, {}, "labels hold at most 1024"),
        ({"shm_bytes": 8 * 2**30}, {}, "/dev/shm"),
        ({"hostname": "Not A Host"}, {}, "not a DNS name"),
        ({"shm_bytes": 0}, {"env_format": "dict"}, "/dev/shm"),
    ],
)
async def test_specs_vast_cannot_run_are_refused_before_any_request(
    fake: FakeVastAI, make_provider: MakeProvider, changes: dict[str, Any],
    options: dict[str, Any], match: str,
) -> None:
    with pytest.raises(InvalidSpec, match=match):
        await make_provider(options=options).create(spec(**changes))
    assert fake.requests == []


async def test_no_matching_offer_is_a_capacity_error_and_nothing_is_rented(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.add_offer(gpu_name="RTX 4090")
    with pytest.raises(CapacityError, match=r"no Vast\.ai offer for 1 x H100 in US"):
        await provider.create(spec(region="US"))
    assert rents(fake) == []


async def test_a_taken_offer_falls_through_to_the_next(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    first = fake.add_offer(gpu_name="H100 SXM", dph_total=1.0)
    second = fake.add_offer(gpu_name="H100 SXM", dph_total=1.1)
    third = fake.add_offer(gpu_name="H100 SXM", dph_total=1.2)
    fake.fail("createInstance", 404, error="invalid_args",
              msg=f"error 404/3603: no_such_ask Instance type by id {first['id']}")
    fake.unstartable.add(second["id"])
    instance = await provider.create(spec())
    assert [r.path.rsplit("/", 1)[1] for r in fake.calls("PUT", "/api/v0/asks/")] == [
        str(first["id"]), str(second["id"]), str(third["id"])]
    assert [r.status for r in fake.calls("PUT", "/api/v0/asks/")] == [404, 410, 200]
    assert instance.price_per_hour == 1.2


async def test_when_every_offer_tried_is_taken_it_is_a_capacity_error(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    for _ in range(3):
        fake.unstartable.add(fake.add_offer(gpu_name="H100 SXM")["id"])
    provider = make_provider(options={"max_offer_attempts": 2})
    with pytest.raises(CapacityError, match=r"every Vast\.ai offer tried .* was taken"):
        await provider.create(spec())
    assert len(rents(fake)) == 2
    assert fake.instances == {}


# -- idempotency and ownership -----------------------------------------------------------------


async def test_create_twice_rents_once(fake: FakeVastAI, provider: VastAIProvider) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    fake.add_offer(gpu_name="H100 SXM")
    first = await provider.create(spec())
    second = await provider.create(spec())
    assert first.id == second.id
    assert len(fake.instances) == 1
    assert len(rents(fake)) == 1
    lookup = fake.calls("GET", "/api/v1/instances")[-1]
    assert json.loads(lookup.query["select_filters"]) == {
        "label": {"eq": encode_label(name="vk-gpu-burst-uid-1",
                                     tags={TAG_NODE: OWNER, TAG_POD: "train-0",
                                           TAG_UID: "uid-1"})}}


async def test_create_adopts_an_instance_a_previous_process_rented(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    before = await make_provider().create(spec())  # then the process "crashed"
    fake.set_status(int(before.id), "running")
    after = await make_provider().create(spec())
    assert after.id == before.id
    assert after.state is InstanceState.RUNNING
    assert len(fake.instances) == 1


class LoseRentAnswer(httpx.AsyncBaseTransport):
    """Delivers the first rent to the fake, then reports a timeout instead of its answer."""

    def __init__(self, app: Any) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.lost = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "PUT" and "/asks/" in request.url.path and not self.lost:
            self.lost = True
            raise httpx.ReadTimeout("lost", request=request)
        return response


async def test_a_rent_whose_answer_was_lost_is_not_repeated_and_is_adopted_next_time(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    fake.add_offer(gpu_name="H100 SXM")
    provider = make_provider(transport=LoseRentAnswer(fake.app))
    with pytest.raises(TransientError, match="timed out"):
        await provider.create(spec())
    assert len(rents(fake)) == 1  # a rent is never retried blindly
    again = await provider.create(spec())
    assert len(fake.instances) == 1
    assert again.id == str(next(iter(fake.instances)))


async def test_list_returns_only_this_owners_instances_across_pages(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    ours = [fake.add_instance(label=encode_label(name=f"{OWNER}-u{i}",
                                                 tags={TAG_NODE: OWNER, TAG_UID: f"u{i}"}))
            for i in range(30)]
    fake.add_instance(label=encode_label(name="other-u1", tags={TAG_NODE: "other-node"}))
    fake.add_instance(label="My ML Training Job")
    fake.add_instance(label=None)
    instances = await provider.list()
    assert sorted(int(i.id) for i in instances) == sorted(o["id"] for o in ours)
    assert {i.tags[TAG_NODE] for i in instances} == {OWNER}
    assert len(fake.calls("GET", "/api/v1/instances")) == 2  # 25 per page
    assert "after_token" in fake.calls("GET", "/api/v1/instances")[1].query


async def test_listed_instances_carry_address_ports_price_and_mapped_gpu(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    item = fake.add_instance(
        label=encode_label(name="n", tags={TAG_NODE: OWNER}), gpu_name="H100 SXM", num_gpus=1,
        public_ipaddr="198.51.100.4", dph_total=2.25, geolocation="Oregon, US",
        ports={"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41234"}],
               "22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41000"}]},
        status_msg="success, running ghcr.io/acme/train",
    )
    (instance,) = await provider.list()
    assert instance.id == str(item["id"])
    assert instance.ip == "198.51.100.4"
    assert instance.endpoints == ("198.51.100.4:41000", "198.51.100.4:41234")
    assert instance.published == (
        PublishedPort(container_port=22, host="198.51.100.4", port=41000, kind="ip"),
        PublishedPort(container_port=8000, host="198.51.100.4", port=41234, kind="ip"),
    )
    assert (instance.gpu_type, instance.region, instance.price_per_hour) == ("H100", "US", 2.25)
    assert instance.message == "success, running ghcr.io/acme/train"
    assert instance.created_at is not None
    assert instance.started_at == instance.created_at, "spend is counted from the contract start"


async def test_a_rented_instance_publishes_its_ports_once_running(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", public_ipaddr="198.51.100.23")
    instance = await provider.create(spec(ports=(
        Port(container_port=8000), Port(container_port=9000, protocol="UDP"))))
    assert instance.published == ()  # loading: "ports" is only present on running instances
    fake.set_status(int(instance.id), "running")
    (listed,) = await provider.list()
    assert listed.published == (
        PublishedPort(container_port=8000, protocol="TCP", host="198.51.100.23", port=41000,
                      kind="ip"),
        PublishedPort(container_port=9000, protocol="UDP", host="198.51.100.23", port=41001,
                      kind="ip"),
    )
    assert all(p.scheme is None for p in listed.published)  # no TLS proxy on Vast.ai
    fake.set_status(int(instance.id), "exited", intended_status="stopped")
    (stopped,) = await provider.list()
    assert stopped.published == ()


@pytest.mark.parametrize(
    "fields",
    [
        {"ports": None},  # not running
        {"ports": {}},
        {"public_ipaddr": ""},
        {"public_ipaddr": "not an address"},
        {"ports": {"8000/tcp": []}},
        {"ports": {"8000/tcp": [{"HostIp": "0.0.0.0"}]}},  # no HostPort
        {"ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "zero"}]}},
        {"ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "70000"}]}},
        {"ports": {"http/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41000"}]}},
    ],
)
async def test_missing_or_malformed_address_fields_publish_nothing(
    fake: FakeVastAI, provider: VastAIProvider, fields: dict[str, Any]
) -> None:
    fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}),
                      public_ipaddr="198.51.100.4",
                      ports={"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41234"}]})
    ((contract, item),) = fake.instances.items()
    item.update(fields)
    (instance,) = await provider.list()
    assert instance.id == str(contract)
    assert instance.published == ()


async def test_an_instance_without_public_ipaddr_publishes_nothing(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    item = fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}),
                             ports={"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41234"}]})
    del item["public_ipaddr"]
    (instance,) = await provider.list()
    assert instance.published == () and instance.ip is None


async def test_one_entry_per_port_and_protocol_from_the_first_usable_binding(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.add_instance(
        label=encode_label(name="n", tags={TAG_NODE: OWNER}), public_ipaddr=" 198.51.100.4\n",
        ports={"8000/tcp": [{"HostIp": "0.0.0.0"}, {"HostIp": "0.0.0.0", "HostPort": "41234"},
                            {"HostIp": "::", "HostPort": "41234"}],
               "8000/udp": [{"HostIp": "0.0.0.0", "HostPort": "41235"}],
               "7000": [{"HostIp": "0.0.0.0", "HostPort": "41236"}]},
    )
    (instance,) = await provider.list()
    assert [(p.container_port, p.protocol, p.host, p.port) for p in instance.published] == [
        (7000, "TCP", "198.51.100.4", 41236),
        (8000, "TCP", "198.51.100.4", 41234),
        (8000, "UDP", "198.51.100.4", 41235),
    ]


@pytest.mark.parametrize(
    ("actual", "intended", "state"),
    [
        (None, "running", InstanceState.PENDING),
        ("loading", "running", InstanceState.PENDING),
        ("created", "running", InstanceState.PENDING),
        ("running", "running", InstanceState.RUNNING),
        ("rebooting", "running", InstanceState.RUNNING),
        ("exited", "running", InstanceState.FAILED),
        ("stopped", "running", InstanceState.FAILED),
        ("stopped", "stopped", InstanceState.FAILED),
        ("frozen", "frozen", InstanceState.FAILED),
        ("unknown", "running", InstanceState.FAILED),
        ("offline", "running", InstanceState.FAILED),
        ("something-new", "running", InstanceState.PENDING),
    ],
)
async def test_status_mapping(fake: FakeVastAI, provider: VastAIProvider, actual: str | None,
                              intended: str, state: InstanceState) -> None:
    item = fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}))
    fake.set_status(item["id"], actual, intended_status=intended)
    (instance,) = await provider.list()
    assert instance.state is state
    assert map_status(actual, intended)[0] is state
    if state is InstanceState.FAILED:
        assert instance.message
        assert instance.exit_code is None  # Vast.ai reports none


async def test_preemption_says_so(fake: FakeVastAI, provider: VastAIProvider) -> None:
    item = fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}))
    fake.set_status(item["id"], "stopped", intended_status="running")
    (instance,) = await provider.list()
    assert instance.message is not None and "preempted" in instance.message


# -- GPU figures (gpu_metrics_all) -------------------------------------------------------------


def mine(name: str) -> str:
    return encode_label(name=name, tags={TAG_NODE: OWNER})


async def test_gpu_metrics_all_reads_the_list_figures_in_one_call(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    assert isinstance(provider, BulkGPUMetricsSource)
    one = fake.add_instance(label=mine("one"), gpu_name="RTX 4090", num_gpus=1)
    fake.set_gpu_figures(one["id"], gpu_util=0.42, gpu_temp=61.5, gpu_totalram=24576)
    four = fake.add_instance(label=mine("four"), gpu_name="H100 SXM", num_gpus=4)
    fake.set_gpu_figures(four["id"], gpu_util=0.9, gpu_temp=None, gpu_ram=81559,
                         gpu_totalram=4 * 81559)
    silent = fake.add_instance(label=mine("silent"), num_gpus=2)  # running, figures null
    idle = fake.add_instance(label=mine("idle"))  # one GPU: its size is known, nothing else
    loading = fake.add_instance(label=mine("loading"), actual_status="loading")
    fake.set_gpu_figures(loading["id"], gpu_util=0.5)  # not running: not the pod's figures
    theirs = fake.add_instance(label=encode_label(name="x", tags={TAG_NODE: "other-node"}))
    fake.set_gpu_figures(theirs["id"], gpu_util=0.99, gpu_temp=80)
    fake.add_instance(label="My ML Training Job", gpu_util=0.3)
    fake.requests.clear()

    bodies = await provider.gpu_metrics_all()

    assert len(fake.requests) == 1 and fake.requests[0].path == "/api/v1/instances"
    assert fake.requests[0].query == {"limit": "25"}  # the same request as list()
    assert set(bodies) == {i.id for i in await provider.list()}
    assert set(bodies) == {str(i["id"]) for i in (one, four, silent, idle, loading)}
    assert bodies[str(one["id"])] == {
        "instance_id": str(one["id"]), "state": "running",
        "gpus": [{"index": 0, "gpu_type": "RTX4090", "gpu_utilization": pytest.approx(42.0),
                  "temperature_c": 61.5, "memory_total_bytes": 24576 * 2**20}],
    }
    # Four GPUs, one per-instance figure: ONE entry that says it stands for all of them; the
    # temperature is null (omitted) and the memory size is left out (one GPU's or all four's?).
    assert bodies[str(four["id"])]["gpus"] == [
        {"index": 0, "uuid": "all-4-gpus", "gpu_type": "H100",
         "gpu_utilization": pytest.approx(90.0)}]
    assert bodies[str(silent["id"])]["gpus"] == []
    assert bodies[str(idle["id"])]["gpus"] == [
        {"index": 0, "gpu_type": "RTX4090", "memory_total_bytes": 24 * 2**30}]
    assert bodies[str(loading["id"])] == {"instance_id": str(loading["id"]), "state": "pending",
                                          "gpus": []}
    (reading,) = parse_readings(bodies[str(one["id"])], default_model="")
    assert reading.utilization == pytest.approx(0.42)
    assert (reading.temperature_celsius, reading.memory_total_bytes) == (61.5, 24 * 2**30)
    assert reading.memory_used_bytes is None and reading.power_watts is None


async def test_gpu_metrics_all_pages_like_list(fake: FakeVastAI, provider: VastAIProvider) -> None:
    for i in range(30):
        fake.add_instance(label=mine(f"u{i}"))
    fake.requests.clear()
    assert len(await provider.gpu_metrics_all()) == 30
    assert len(fake.calls("GET", "/api/v1/instances")) == 2  # 25 per page, as list() reads


@pytest.mark.parametrize(
    ("status", "expected", "headers"),
    [
        (401, AuthError, None),
        (400, InvalidSpec, None),
        (429, RateLimited, {"Retry-After": "120"}),
        (500, TransientError, None),
    ],
)
async def test_gpu_metrics_all_maps_errors_like_list(
    fake: FakeVastAI, make_provider: MakeProvider, status: int, expected: type[ProviderError],
    headers: dict[str, str] | None,
) -> None:
    provider = make_provider(options={"max_attempts": 1})
    for call in (provider.list, provider.gpu_metrics_all):
        fake.fail("showInstances", status, msg="nope", headers=headers,
                  error="invalid_request" if status == 400 else "")
        with pytest.raises(ProviderError) as caught:
            await call()
        assert type(caught.value) is expected
        assert f"HTTP {status}" in str(caught.value) and caught.value.provider == "vast"
    assert [r.status for r in fake.calls("GET", "/api/v1/instances")] == [status, status]


# -- delete ------------------------------------------------------------------------------------


async def test_delete_is_idempotent(fake: FakeVastAI, provider: VastAIProvider) -> None:
    item = fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}))
    await provider.delete(str(item["id"]))
    await provider.delete(str(item["id"]))  # 404: already gone
    await provider.delete("not-a-contract-id")  # never ours: no request at all
    assert fake.instances == {}
    assert [r.status for r in fake.calls("DELETE", "/api/v0/instances/")] == [200, 404]


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "status", "error", "msg", "expected"),
    [
        ("createInstance", 400, "invalid_args", "Invalid args: image", InvalidSpec),
        ("createInstance", 400, "invalid_price", "price too low", InvalidSpec),
        ("createInstance", 401, "auth_error", "Invalid user key", AuthError),
        # the spec has no quota code: a 400 whose message speaks of credit is taken as quota
        ("createInstance", 400, "invalid_args", "error 400: insufficient credit", QuotaError),
        ("createInstance", 429, "", "API requests too frequent endpoint threshold=4.5",
         RateLimited),
        ("searchOffers", 400, "invalid_request", "Invalid json body", InvalidSpec),
        ("searchOffers", 404, "auth_error", "Invalid user key", AuthError),
        ("searchOffers", 503, "server_error", "try later", TransientError),
        ("showInstances", 401, "auth_error", "Invalid user key", AuthError),
        ("showInstances", 400, "invalid_request", "dph_total is not a valid search key",
         InvalidSpec),
        ("showInstances", 500, "server_error", "boom", TransientError),
    ],
)
async def test_documented_errors_map_to_typed_errors(
    fake: FakeVastAI, make_provider: MakeProvider, operation: str, status: int, error: str,
    msg: str, expected: type[ProviderError],
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    provider = make_provider(options={"max_attempts": 1})
    fake.fail(operation, status, error=error, msg=msg,
              headers={"Retry-After": "30"} if status == 429 else None)
    with pytest.raises(expected) as caught:
        await provider.create(spec())
    assert f"HTTP {status}" in str(caught.value)
    assert msg[:20] in str(caught.value)
    assert caught.value.provider == "vast"


async def test_a_wrong_key_is_an_auth_error_everywhere(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM")
    item = fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}))
    provider = make_provider(api_key="wrong-key-123456")
    with pytest.raises(AuthError):
        await provider.list()
    with pytest.raises(AuthError):
        await provider.capacity()  # search answers 404 for a bad key, as the spec says
    with pytest.raises(AuthError):
        await provider.delete(str(item["id"]))
    with pytest.raises(AuthError):
        await provider.logs(str(item["id"]), LogOptions()).__anext__()


async def test_rate_limits_carry_retry_after_and_short_ones_are_retried(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.fail("showInstances", 429, headers={"Retry-After": "0"})
    assert await provider.list() == []
    assert [r.status for r in fake.calls("GET", "/api/v1/instances")] == [429, 200]
    fake.fail("showInstances", 429, headers={"Retry-After": "120"})
    with pytest.raises(RateLimited) as caught:
        await provider.list()
    assert caught.value.retry_after == 120.0


async def test_a_rate_limit_without_retry_after_backs_off_and_retries(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.fail("destroyInstance", 429, times=2)
    await provider.delete("1234")
    assert [r.status for r in fake.calls("DELETE", "/api/v0/instances/")] == [429, 429, 404]


async def test_server_errors_are_retried_then_transient(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.fail("showInstances", 502, times=2)
    assert await provider.list() == []
    fake.fail("showInstances", 503, times=4)
    with pytest.raises(TransientError, match="HTTP 503"):
        await provider.list()
    assert fake.unvalidated  # 5xx is not in Vast.ai's spec: allowed only because injected


@pytest.mark.parametrize(("exc", "words"), TRANSPORT_FAILURES)
async def test_transport_failures_are_transient(
    make_provider: MakeProvider, exc: type[httpx.TransportError], words: str
) -> None:
    broken = FailingTransport(exc)
    with pytest.raises(TransientError, match=words):
        await make_provider(transport=broken).list()
    assert broken.calls == 4


async def test_the_api_key_never_appears_in_errors_or_repr(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    secret = "vast-SECRET-do-not-leak-42"
    fake.api_key = secret
    provider = make_provider(api_key=secret, options={"max_attempts": 1})
    fake.add_offer(gpu_name="H100 SXM")
    errors: list[ProviderError] = []
    for status, msg in [(401, f"bad key {secret}"), (400, "Invalid args"), (429, "slow"),
                        (500, "boom")]:
        fake.fail("searchOffers", status, msg=msg)
        with pytest.raises(ProviderError) as caught:
            await provider.create(spec())
        errors.append(caught.value)
    with pytest.raises(ProviderError) as caught:
        await make_provider(api_key=secret, transport=FailingTransport(httpx.ConnectError),
                            options={"max_attempts": 1}).list()
    errors.append(caught.value)
    with pytest.raises(ProviderError) as caught:
        await make_provider(api_key=secret).create(spec(env={"A": "has space"}))
    errors.append(caught.value)
    assert_never_shown(secret, provider, *errors)


# -- logs --------------------------------------------------------------------------------------


async def _drain(provider: VastAIProvider, instance_id: str, opts: LogOptions) -> bytes:
    return b"".join([chunk async for chunk in provider.logs(instance_id, opts)])


async def test_logs_fetch_the_uploaded_file_without_credentials(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    item = fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}))
    fake.logs[item["id"]] = "one\ntwo\nthree\n"
    fake.blob_polls_before_ready = 2  # the upload takes a moment
    assert await _drain(provider, str(item["id"]), LogOptions()) == b"one\ntwo\nthree\n"
    assert await _drain(provider, str(item["id"]), LogOptions(tail_lines=2)) == b"two\nthree\n"
    assert await _drain(provider, str(item["id"]), LogOptions(limit_bytes=5)) == b"one\nt"
    bodies = [r.body for r in fake.calls("PUT", "/api/v0/instances/request_logs/")]
    assert bodies == [{}, {"tail": "2"}, {}]
    # the fake records a violation if the log store ever sees the Authorization header


async def test_logs_of_a_missing_instance_are_not_found(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    with pytest.raises(NotFound):
        await _drain(provider, "4242", LogOptions())
    with pytest.raises(NotFound):
        await _drain(provider, "x", LogOptions())


async def test_log_options_vast_cannot_honour_are_unsupported(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    for opts in (LogOptions(follow=True), LogOptions(since_seconds=60),
                 LogOptions(timestamps=True)):
        with pytest.raises(Unsupported, match="snapshot"):
            await _drain(provider, "1", opts)
    assert fake.requests == []


async def test_a_log_file_that_never_appears_is_transient(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    item = fake.add_instance(label=encode_label(name="n", tags={TAG_NODE: OWNER}))
    fake.blob_polls_before_ready = 100
    provider = make_provider(options={"log_poll_attempts": 3})
    with pytest.raises(TransientError, match="not uploaded after 3 polls"):
        await _drain(provider, str(item["id"]), LogOptions())


# -- capacity ----------------------------------------------------------------------------------


async def test_capacity_counts_each_machine_once_at_the_cheapest_gpu_price(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    machine = 9001
    fake.add_offer(gpu_name="H100 SXM", num_gpus=1, dph_total=2.0, machine_id=machine)
    fake.add_offer(gpu_name="H100 SXM", num_gpus=4, dph_total=7.2, machine_id=machine)
    fake.add_offer(gpu_name="H100 PCIE", num_gpus=2, dph_total=3.0, geolocation="Texas, US")
    fake.add_offer(gpu_name="RTX 4090", num_gpus=1, dph_total=0.4, geolocation="Ontario, CA")
    fake.add_offer(gpu_name="A100 SXM4", num_gpus=8, dph_total=8.0)  # not in the GPU map
    offers = await provider.capacity()
    by_key = {(o.gpu_type, o.region): o for o in offers}
    assert set(by_key) == {("H100", "US"), ("RTX4090", "CA")}
    assert by_key[("H100", "US")].available == 4 + 2
    assert by_key[("H100", "US")].price_per_gpu_hour == 1.5
    assert by_key[("RTX4090", "CA")].available == 1
    (search,) = searches(fake)
    assert search["gpu_name"] == {"in": ["H100_PCIE", "H100_SXM", "RTX_4090"]}


async def test_capacity_without_a_gpu_map_reports_vast_names(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="A100 SXM4", num_gpus=2, dph_total=3.0)
    provider = VastAIProvider(name="vast", base_url=BASE_URL, owner=OWNER, api_key=API_KEY,
                              options=FAST, transport=httpx.ASGITransport(app=fake.app))
    try:
        (offer,) = await provider.capacity()
    finally:
        await provider.aclose()
    assert (offer.gpu_type, offer.available, offer.price_per_gpu_hour) == ("A100_SXM4", 2, 1.5)


async def test_offers_without_a_location_are_region_unknown_which_adds_no_filter(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", geolocation="")
    (offer,) = await provider.capacity()
    assert offer.region == "unknown"
    await provider.create(spec(region=offer.region))
    assert "geolocation" not in searches(fake)[-1]
    assert len(fake.instances) == 1


async def test_offer_filters_add_to_the_search_but_the_spec_wins(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", datacenter=True, cuda_max_good=12.4)
    fake.add_offer(gpu_name="H100 SXM", datacenter=False, cuda_max_good=12.4, dph_total=0.1)
    provider = make_provider(options={"offer_filters": {
        "datacenter": {"eq": True}, "cuda_max_good": {"gte": 12.1}, "num_gpus": {"eq": 8}}})
    instance = await provider.create(spec())
    (search,) = searches(fake)
    assert search["datacenter"] == {"eq": True} and search["num_gpus"] == {"eq": 1}
    assert instance.price_per_hour == 0.5  # the cheaper offer is not in a datacenter


async def test_regions_keep_capacity_and_rentals_inside_those_countries(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", dph_total=1.0, geolocation="Texas, US")  # cheapest
    fake.add_offer(gpu_name="H100 SXM", dph_total=2.0, geolocation="Hesse, DE")
    fake.add_offer(gpu_name="H100 SXM", dph_total=1.5, geolocation="")  # location unknown
    provider = make_provider(options={"regions": ["de", "FR"]})
    offers = await provider.capacity()
    assert {o.region for o in offers} == {"DE"}
    instance = await provider.create(spec())
    assert instance.price_per_hour == 2.0, "rented in Germany, not the cheaper US machine"
    assert all(s["geolocation"] == {"in": ["DE", "FR"]} for s in searches(fake))


async def test_regions_must_be_a_list_of_codes(fake: FakeVastAI) -> None:
    with pytest.raises(ValueError, match=r"options\.regions"):
        VastAIProvider(name="vast", base_url=BASE_URL, owner=OWNER, api_key=API_KEY,
                       options={"regions": "DE"})


async def test_no_offers_is_empty_capacity(fake: FakeVastAI, provider: VastAIProvider) -> None:
    assert await provider.capacity() == []


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"bogus": 1}, "unknown Vast.ai option"),
        ({"offer_type": "spot"}, "offer_type"),
        ({"env_format": "yaml"}, "env_format"),
        ({"command_mode": "maybe"}, "command_mode"),
        ({"gpu_types": {"H100": []}}, "gpu_types"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VastAIProvider(name="vast", base_url=BASE_URL, owner=OWNER, api_key=API_KEY,
                       options=options)


# -- private images: image_login --------------------------------------------------------------

PASSWORD = "hunter2-Registry-Pa55"
AUTH = RegistryAuth(registry="ghcr.io", username="acme-bot", password=PASSWORD, secret="regcred")


def stock(fake: FakeVastAI) -> None:
    for _ in range(3):
        fake.add_offer(gpu_name="H100 SXM")
    fake.add_offer(gpu_name="RTX 4090")


async def test_a_pull_credential_becomes_the_rents_image_login(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    stock(fake)
    await provider.create(spec(registry_auth=AUTH))
    (body,) = rents(fake)
    assert body["image_login"] == f"-u acme-bot -p {PASSWORD} ghcr.io"
    hub = RegistryAuth(registry="docker.io", username="u", password="p-1")
    await provider.create(spec("vk-gpu-burst-uid-2", image="acme/private:1", gpu_type="RTX4090",
                               registry_auth=hub))
    assert rents(fake)[1]["image_login"] == "-u u -p p-1 docker.io"
    assert all("image_login" not in b for b in searches(fake))


async def test_the_image_login_option_goes_only_with_images_of_its_registry(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    stock(fake)
    login = f"-u org -p {PASSWORD} registry.example.com"
    provider = make_provider(options={"image_login": login})
    await provider.create(spec("vk-gpu-burst-uid-1", image="attacker.example/x:1"))
    await provider.create(spec("vk-gpu-burst-uid-2", gpu_type="RTX4090",
                               image="registry.example.com/team/model:1"))
    attacker, ours = rents(fake)
    assert "image_login" not in attacker, "another registry's image gets no login"
    assert ours["image_login"] == login


async def test_an_image_login_for_docker_io_is_for_docker_hub_images(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    stock(fake)
    provider = make_provider(options={"image_login": "-u node -p wide docker.io"})
    await provider.create(spec("vk-gpu-burst-uid-1", image="acme/private:1"))
    await provider.create(spec("vk-gpu-burst-uid-2", gpu_type="RTX4090"))  # ghcr.io
    hub, ghcr = rents(fake)
    assert hub["image_login"] == "-u node -p wide docker.io"
    assert "image_login" not in ghcr


@pytest.mark.parametrize(("options", "why"), [
    ({"image_login": f"-u org -p {PASSWORD} a.example b.example"}, "must be '-u"),
    ({"image_login": f"-u org --password-stdin {PASSWORD}"}, "must be '-u"),
    ({"image_login": f"-u org -p {PASSWORD}"}, "the registry it is for"),
    ({"image_login": f"-u org -p {PASSWORD} /nohost"}, "image_login"),
    ({"image_login": f"-u org -p {PASSWORD} ghcr.io", "registry_hosts": ["ghcr.io"]},
     "not a Vast.ai option"),
])
def test_an_image_login_whose_registry_is_unclear_is_refused(
    make_provider: MakeProvider, options: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValueError, match=why) as info:
        make_provider(options=options)
    assert PASSWORD not in str(info.value)


async def test_a_pod_credential_never_goes_with_an_image_of_another_registry(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    stock(fake)
    await provider.create(spec(image="attacker.example/x:1", registry_auth=AUTH))
    (body,) = rents(fake)
    assert "image_login" not in body


async def test_a_pod_credential_wins_over_the_image_login_option(
    fake: FakeVastAI, make_provider: MakeProvider
) -> None:
    stock(fake)
    provider = make_provider(options={"image_login": "-u node -p wide ghcr.io"})
    await provider.create(spec("vk-gpu-burst-uid-1"))
    await provider.create(spec("vk-gpu-burst-uid-2", gpu_type="RTX4090", registry_auth=AUTH))
    first, second = rents(fake)
    assert first["image_login"] == "-u node -p wide ghcr.io"
    assert second["image_login"] == f"-u acme-bot -p {PASSWORD} ghcr.io"


@pytest.mark.parametrize(("username", "password", "why"), [
    ("acme-bot", "two words", "whitespace"),
    ("acme-bot", 'quo"te', "quotes"),
    ("acme bot", PASSWORD, "whitespace"),
    ("acme-bot", "back\\slash", "backslashes"),
    ("", PASSWORD, "empty username"),
    ("acme-bot", "", "empty password"),
])
async def test_a_credential_image_login_cannot_carry_is_refused_before_any_call(
    fake: FakeVastAI, provider: VastAIProvider, username: str, password: str, why: str
) -> None:
    auth = RegistryAuth(registry="ghcr.io", username=username, password=password,
                        secret="regcred")
    with pytest.raises(InvalidSpec, match="imagePullSecrets") as info:
        await provider.create(spec(registry_auth=auth))
    assert why in str(info.value) and "'regcred'" in str(info.value)
    assert "ghcr.io" in str(info.value)
    if password:
        assert_never_shown(password, info.value)
    assert fake.requests == []


async def test_the_password_is_never_shown_in_errors_reprs_or_logs(
    fake: FakeVastAI, provider: VastAIProvider, caplog: pytest.LogCaptureFixture
) -> None:
    stock(fake)
    caplog.set_level(logging.DEBUG)
    the_spec = spec(registry_auth=AUTH)
    fake.fail("createInstance", 400, error="invalid_args",
              msg=f"docker login -u acme-bot -p {PASSWORD} ghcr.io failed")
    with pytest.raises(InvalidSpec) as rent_error:
        await provider.create(the_spec)
    assert "***" in str(rent_error.value)
    inst = await provider.create(spec("vk-gpu-burst-uid-2", registry_auth=AUTH))
    fake.set_status(int(inst.id), "exited",
                    status_msg=f"pull failed: unauthorized for acme-bot:{PASSWORD}")
    (listed,) = [i for i in await provider.list() if i.id == inst.id]
    assert listed.message is not None and "***" in listed.message
    assert_never_shown(PASSWORD, rent_error.value, the_spec, AUTH, provider, inst, listed,
                       listed.message)
    for record in caplog.records:
        assert PASSWORD not in record.getMessage() and PASSWORD not in str(record.args)


async def test_the_fake_flags_an_image_login_not_in_the_documented_form(
    fake: FakeVastAI,
) -> None:
    stock(fake)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fake.app),
                                 base_url=BASE_URL) as client:
        offer = fake.offers[0]["id"]
        answer = await client.put(f"/api/v0/asks/{offer}",
                                  headers={"Authorization": f"Bearer {API_KEY}"},
                                  json={"image": "x", "image_login": "user:pass@ghcr.io"})
    assert answer.status_code == VIOLATION_STATUS
    assert fake.violations and "image_login" in fake.violations[0]
    assert "user:pass" not in fake.violations[0]
    fake.violations.clear()


# -- interruptible (bid) instances (issue 15) ---------------------------------------------------


async def test_an_interruptible_spec_is_searched_and_rented_as_a_bid(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", dph_total=2.0, min_bid=0.6)
    fake.add_offer(gpu_name="H100 SXM", dph_total=2.0, min_bid=0.6)
    on_demand = await provider.create(spec(name="a"))
    spot = await provider.create(spec(name="b", interruptible=True))
    assert [s["type"] for s in searches(fake)] == ["ondemand", "bid"]
    first, second = rents(fake)
    assert "price" not in first and second["price"] == 0.6
    assert (on_demand.interruptible, spot.interruptible) == (False, True)
    assert spot.price_per_hour == 0.6
    listed = {i.name: i for i in await provider.list()}
    assert listed["b"].interruptible and not listed["a"].interruptible  # from is_bid
    assert listed["b"].interruption_at is None  # Vast.ai announces nothing


async def test_capacity_sells_bid_offers_beside_on_demand_only_when_asked(
    fake: FakeVastAI, provider: VastAIProvider, make_provider: MakeProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", num_gpus=2, dph_total=4.0, min_bid=1.0)
    assert [o.interruptible for o in await provider.capacity()] == [False]
    both = make_provider(options={"interruptible_offers": True})
    offers = {o.interruptible: o for o in await both.capacity()}
    assert offers[False].price_per_gpu_hour == 2.0
    assert offers[True].price_per_gpu_hour == 0.5  # min_bid per GPU
    assert offers[True].available == offers[False].available == 2
    assert [s["type"] for s in searches(fake)][-2:] == ["ondemand", "bid"]
    bids_only = make_provider(options={"offer_type": "bid"})
    assert [o.interruptible for o in await bids_only.capacity()] == [True]
    assert searches(fake)[-1]["type"] == "bid"


async def test_an_outbid_instance_is_interrupted_and_a_stopped_on_demand_one_is_not(
    fake: FakeVastAI, provider: VastAIProvider
) -> None:
    fake.add_offer(gpu_name="H100 SXM", dph_total=2.0, min_bid=0.6)
    fake.add_offer(gpu_name="H100 SXM", dph_total=2.0, min_bid=0.6)
    spot = await provider.create(spec(name="b", interruptible=True))
    demand = await provider.create(spec(name="a"))
    fake.set_status(int(spot.id), "stopped", intended_status="running")
    fake.set_status(int(demand.id), "stopped", intended_status="running")
    listed = {i.name: i for i in await provider.list()}
    assert listed["b"].state is InstanceState.FAILED and listed["b"].interrupted
    assert listed["a"].state is InstanceState.FAILED and not listed["a"].interrupted
    fake.set_status(int(spot.id), "stopped", intended_status="stopped")
    assert not {i.name: i for i in await provider.list()}["b"].interrupted  # stopped by us

"""Contract tests of the RunPod adapter against a fake that validates itself with RunPod's spec.

Why it exists: without a RunPod account in CI, the only proof that :mod:`providers.runpod` speaks
RunPod REST v2 is that every request it sends, and every answer it is tested with, is allowed by
RunPod's published OpenAPI document. The fake (:mod:`tests.fakes.runpod_fake`) records any
violation and answers 599; the ``fake`` fixture fails every test that left one. On top of that
these tests pin the adapter's semantics: field mapping, idempotent create, owner filtering,
status and error mapping, logs, capacity, and that the API key never leaks. Nothing sleeps:
retries run with zero backoff and the one idle timeout is 50 ms.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from providers.base import (
    TAG_NODE,
    TAG_POD,
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
    sweep_registry_auth,
)
from providers.runpod import (
    COMMAND_UNSUPPORTED,
    REGISTRY_PREFIX,
    STATUS_MAP,
    TAGS_ENV,
    RunPodProvider,
)
from tests.fakes.common import TRANSPORT_FAILURES, FailingTransport, Providers, assert_never_shown
from tests.fakes.runpod_fake import (
    NO_CAPACITY_DETAIL,
    FakeRunPod,
    create_app,
    runpod_spec_path,
)
from vkprovider.api.gpu import BulkGPUMetricsSource
from vkprovider.gpureadings import parse_readings

API_KEY = "rp-test-key-s3cr3t-0123456789"
BASE_URL = "https://api.runpod.io"
OWNER = "vk-gpu-burst"
H100 = "NVIDIA H100 80GB HBM3"
RTX4090 = "NVIDIA GeForce RTX 4090"
FAST = {"backoff_initial": 0.0, "backoff_max": 0.0, "retry_after_cap": 1.0}
GPU_TYPES = {"H100": H100, "RTX4090": RTX4090}

MakeProvider = Callable[..., RunPodProvider]


@pytest.fixture
def fake() -> Iterator[FakeRunPod]:
    state = FakeRunPod(api_key=API_KEY)
    yield state
    assert state.violations == [], "the adapter or the fake broke RunPod's spec"


@pytest.fixture
async def make_provider(fake: FakeRunPod) -> AsyncIterator[MakeProvider]:
    app = create_app(fake)
    providers: Providers[RunPodProvider] = Providers()

    def make(
        *,
        owner: str = OWNER,
        options: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = API_KEY,
    ) -> RunPodProvider:
        return providers.keep(RunPodProvider(
            name="runpod",
            base_url=BASE_URL,
            owner=owner,
            api_key=api_key,
            options={"gpu_types": GPU_TYPES, **FAST, **(options or {})},
            transport=transport or httpx.ASGITransport(app=app),
        ))

    yield make
    await providers.aclose()


@pytest.fixture
def provider(make_provider: MakeProvider) -> RunPodProvider:
    return make_provider()


def spec(name: str = "vk-gpu-burst-uid-1", **changes: Any) -> InstanceSpec:
    fields: dict[str, Any] = {
        "name": name,
        "image": "ghcr.io/acme/train:1.0",
        "gpu_count": 1,
        "gpu_type": "H100",
        "tags": {TAG_NODE: OWNER, TAG_POD: "train-0"},
    }
    fields.update(changes)
    return InstanceSpec(**fields)


def posted(fake: FakeRunPod) -> list[dict[str, Any]]:
    return [r.body for r in fake.calls("createPod")]


# -- every operation, validated --------------------------------------------------------------


async def test_every_operation_the_adapter_uses_is_valid_against_the_spec(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    assert isinstance(provider, Provider)
    inst = await provider.create(spec(args=("--epochs", "3")))
    await provider.list()
    await provider.get(inst.id)
    fake.add_log(inst.id, "hello")
    assert [c async for c in provider.logs(inst.id, LogOptions(tail_lines=10))] == [b"hello\n"]
    await provider.capacity()
    await provider.gpu_metrics_all()
    await provider.delete(inst.id)

    used = {r.operation for r in fake.requests}
    assert used == {"listPods", "createPod", "getPod", "getPodLogs", "listGpuTypes", "deletePod"}
    assert all(r.status < 300 for r in fake.requests)
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in fake.requests)
    assert fake.violations == []


async def test_the_fake_flags_a_request_the_spec_forbids(fake: FakeRunPod) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(fake)), base_url=BASE_URL,
        headers={"Authorization": f"Bearer {API_KEY}"},
    ) as client:
        bad_body = await client.post("/v2/pods", json={"name": "x", "image": "i", "bogus": 1})
        bad_query = await client.get("/v2/pods/abc/logs", params={"tail": 9000})
        undeclared = await client.get("/v2/pods", params={"name": "x"})
        unknown = await client.get("/v2/nothing")
    assert [r.status_code for r in (bad_body, bad_query, undeclared, unknown)] == [599] * 4
    assert [v.kind for v in fake.violations] == ["request"] * 4
    assert "bogus" in fake.violations[0].error
    assert fake.pods == {}
    fake.violations.clear()


async def test_the_fake_flags_a_response_the_spec_forbids(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    provider = make_provider(options={"max_attempts": 1})  # 599 is a 5xx: not retried here
    inst = await provider.create(spec())
    del fake.pods[inst.id]["status"]  # the fake would now answer an invalid Pod
    with pytest.raises(ProviderError, match="HTTP 599"):
        await provider.get(inst.id)
    assert [v.kind for v in fake.violations] == ["response"]
    assert "status" in fake.violations[0].error
    fake.violations.clear()


# -- create: mapping and idempotency ---------------------------------------------------------


async def test_create_maps_the_spec_onto_create_pod(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    fake.add_registry(name="made-by-hand", registry_id="reg-1")
    provider = make_provider(options={"disk_gb": 40, "registry_id": "reg-1",
                                      "registry_hosts": ["ghcr.io/acme"],
                                      "allowed_cuda_versions": ["12.8", "12.6"]})
    inst = await provider.create(spec(
        args=("python", "train.py", "--name", "my run"),
        env={"HF_TOKEN": "hf-secret", "MODE": "fast"},
        ports=(Port(container_port=8000, name="http"), Port(container_port=22),
               Port(container_port=9090, name="http-metrics"), Port(container_port=8000,
                                                                      name="http")),
        region="US-TX-3",
        gpu_count=2,
    ))
    (body,) = posted(fake)
    assert body == {
        "name": "vk-gpu-burst-uid-1",
        "image": "ghcr.io/acme/train:1.0",
        "args": "python train.py --name 'my run'",
        "env": {"HF_TOKEN": "hf-secret", "MODE": "fast", TAGS_ENV: body["env"][TAGS_ENV]},
        "ports": ["8000/http", "22/tcp", "9090/http"],
        "cloud": "SECURE",
        "gpu": {"id": H100, "count": 2, "allowedCudaVersions": ["12.8", "12.6"]},
        "dataCenterIds": ["US-TX-3"],
        "disk": 40,
        "registry": "reg-1",
    }
    assert json.loads(body["env"][TAGS_ENV]) == {TAG_NODE: OWNER, TAG_POD: "train-0"}
    assert inst.name == "vk-gpu-burst-uid-1"
    assert inst.state is InstanceState.PENDING
    assert inst.gpu_type == "H100" and inst.gpu_count == 2
    assert inst.region == "US-TX-3"
    assert inst.price_per_hour == pytest.approx(2 * 2.99)
    assert inst.tags == {TAG_NODE: OWNER, TAG_POD: "train-0"}
    assert "hf-secret" not in repr(inst)


async def test_create_defaults_come_from_options(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    provider = make_provider(options={
        "default_gpu_type": "RTX4090", "cloud": "COMMUNITY", "data_center_ids": ["US-KS-2"],
        "volume_gb": 20, "min_cuda_version": "12.1",
    })
    inst = await provider.create(spec(gpu_type=None))
    (body,) = posted(fake)
    assert body["gpu"] == {"id": RTX4090, "count": 1, "minCudaVersion": "12.1"}
    assert body["cloud"] == "COMMUNITY"
    assert body["dataCenterIds"] == ["US-KS-2"]
    assert body["mounts"] == {"persistent": {"size": 20, "path": "/workspace"}}
    assert inst.gpu_type == "RTX4090" and inst.price_per_hour == pytest.approx(0.34)


async def test_a_cpu_pod_needs_option_cpu_flavor(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    with pytest.raises(InvalidSpec, match="cpu_flavor"):
        await make_provider().create(spec(gpu_count=0, gpu_type=None))
    provider = make_provider(options={"cpu_flavor": "cpu3c"})
    await provider.create(spec(gpu_count=0, gpu_type=None, cpu_millis=3000))
    (body,) = posted(fake)
    assert body["cpu"] == {"id": "cpu3c", "vcpuCount": 4} and "gpu" not in body


async def test_an_entrypoint_override_is_refused_before_any_request(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    with pytest.raises(InvalidSpec) as info:
        await provider.create(spec(command=("/bin/sh", "-c"), args=("echo hi",)))
    assert str(info.value) == COMMAND_UNSUPPORTED == (
        "RunPod v2 cannot override the container entrypoint (command); use args or an image "
        "whose entrypoint does what you need"
    )
    assert info.value.provider == "runpod"
    assert fake.requests == []


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"ports": (Port(container_port=53, protocol="UDP"),)}, "HTTP and TCP"),
        ({"gpu_type": None}, "default_gpu_type"),
        ({"image": ""}, "no image"),
        ({"shm_bytes": 8 * 2**30}, "cannot size /dev/shm"),
        ({"shm_bytes": 0}, "cannot size /dev/shm"),
        ({"interruptible": True}, "no interruptible"),
    ],
)
async def test_specs_runpod_cannot_run_are_refused_before_any_request(
    fake: FakeRunPod, provider: RunPodProvider, changes: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidSpec, match=match):
        await provider.create(spec(**changes))
    assert fake.requests == []


async def test_create_adopts_a_live_pod_of_the_same_name(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    first = await make_provider().create(spec())
    again = await make_provider().create(spec())  # e.g. after a restart of the service
    assert again.id == first.id
    assert len(fake.pods) == 1
    assert len(fake.calls("createPod")) == 1
    assert [r.operation for r in fake.requests] == ["listPods", "createPod", "listPods"]


async def test_create_does_not_adopt_another_owners_pod_or_a_terminated_one(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    other = fake.add_pod(name="vk-gpu-burst-uid-1",
                         env={TAGS_ENV: json.dumps({TAG_NODE: "another-node"})})
    dead = await provider.create(spec())
    fake.set_status(dead.id, "TERMINATED")
    inst = await provider.create(spec())
    assert inst.id not in (other["id"], dead.id)
    assert len(fake.calls("createPod")) == 2


class LoseFirstCreateResponse(httpx.AsyncBaseTransport):
    """Forwards everything, but the first create's answer is lost (the pod was made)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.lost = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and not self.lost:
            self.lost = True
            await response.aread()
            raise httpx.ReadTimeout("response lost", request=request)
        return response


async def test_a_create_whose_answer_was_lost_is_adopted_on_retry_not_made_twice(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    transport = LoseFirstCreateResponse(httpx.ASGITransport(app=create_app(fake)))
    inst = await make_provider(transport=transport).create(spec())
    assert len(fake.pods) == 1 and inst.id in fake.pods
    assert [r.operation for r in fake.requests] == ["listPods", "createPod", "listPods"]


# -- list, get, delete -----------------------------------------------------------------------


async def test_list_returns_only_this_owners_live_pods(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    ours = await make_provider().create(spec("vk-gpu-burst-a"))
    gone = await make_provider().create(spec("vk-gpu-burst-b"))
    fake.set_status(gone.id, "TERMINATED")
    await make_provider(owner="vk-other").create(spec("vk-other-a"))
    fake.add_pod(name="by-hand")  # no tags at all
    fake.add_pod(name="broken-tags", env={TAGS_ENV: "{not json"})
    fake.add_pod(name="prefix-twin", env={TAGS_ENV: json.dumps({TAG_NODE: OWNER + "-2"})})

    listed = await make_provider().list()
    assert [i.id for i in listed] == [ours.id]
    assert len(fake.calls("listPods")) == 3 + 1  # one list per create, one for list()
    other = await make_provider(owner="vk-other").list()
    assert [i.name for i in other] == ["vk-other-a"]


async def test_get_and_an_idempotent_delete(fake: FakeRunPod, provider: RunPodProvider) -> None:
    inst = await provider.create(spec())
    assert (await provider.get(inst.id)).id == inst.id
    await provider.delete(inst.id)
    await provider.delete(inst.id)  # 404: already gone, not an error
    assert fake.pods == {}
    with pytest.raises(NotFound):
        await provider.get(inst.id)
    assert [r.status for r in fake.calls("deletePod")] == [204, 404]


async def test_pod_ids_are_quoted_and_a_v2_suffix_on_the_url_is_fine(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    provider = make_provider()
    with pytest.raises(NotFound):
        await provider.get("../catalog/gpus")
    await provider.delete("")  # names no pod: nothing to delete
    assert [r.path for r in fake.requests] == ["/v2/pods/..%2Fcatalog%2Fgpus"]
    fake.requests.clear()
    slash_v2 = RunPodProvider(name="runpod", base_url=f"{BASE_URL}/v2/", owner=OWNER,
                              api_key=API_KEY, transport=httpx.ASGITransport(app=create_app(fake)))
    async with slash_v2:
        assert await slash_v2.list() == []
    assert [r.path for r in fake.requests] == ["/v2/pods"]


@pytest.mark.parametrize(
    ("status", "state", "message"),
    [
        ("PROVISIONING", InstanceState.PENDING, "allocating"),
        ("STARTING", InstanceState.PENDING, "starting"),
        ("RUNNING", InstanceState.RUNNING, None),
        ("EXITED", InstanceState.FAILED, "no exit code"),
        ("ERROR", InstanceState.FAILED, "unrecoverable"),
        ("TERMINATED", InstanceState.FAILED, "terminated"),
    ],
)
async def test_status_mapping(
    fake: FakeRunPod, provider: RunPodProvider, status: str, state: InstanceState,
    message: str | None,
) -> None:
    assert STATUS_MAP[status] is state
    inst = await provider.create(spec(ports=(Port(container_port=8888, name="http"),
                                             Port(container_port=22))))
    fake.set_status(inst.id, status)
    got = await provider.get(inst.id)
    assert got.state is state
    assert got.exit_code is None
    if message is None:
        assert got.message is None
    else:
        assert got.message is not None and message in got.message
    if status == "RUNNING":
        assert got.endpoints == (f"https://{inst.id}-8888.proxy.runpod.net", "203.0.113.7:40022")
        assert got.ip == "203.0.113.7" and got.started_at is not None
    else:
        assert got.endpoints == () and got.ip is None
    listed = {i.id: i.state for i in await provider.list()}
    assert listed == ({} if status == "TERMINATED" else {inst.id: state})


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "status", "detail", "error"),
    [
        ("createPod", 400, NO_CAPACITY_DETAIL, CapacityError),
        ("createPod", 400, "Insufficient balance to deploy this pod", QuotaError),
        ("createPod", 402, "insufficient balance", QuotaError),
        ("createPod", 401, "missing bearer token", AuthError),
        ("createPod", 403, "access denied", AuthError),
        ("createPod", 404, "template not found", InvalidSpec),
        ("createPod", 422, "Request validation failed.", InvalidSpec),
        ("listPods", 401, "invalid bearer token", AuthError),
        ("listPods", 403, "access denied", AuthError),
        ("getPod", 404, "pod not found", NotFound),
        ("deletePod", 409, "pod belongs to a cluster", ProviderError),
        ("getPodLogs", 404, "pod not found", NotFound),
        ("listGpuTypes", 400, "product is required", InvalidSpec),
    ],
)
async def test_documented_errors_map_to_typed_errors(
    fake: FakeRunPod, provider: RunPodProvider, operation: str, status: int, detail: str,
    error: type[ProviderError],
) -> None:
    inst = await provider.create(spec("existing"))
    fake.fail_next(operation, status=status, detail=detail)
    calls: dict[str, Callable[[], Any]] = {
        "createPod": lambda: provider.create(spec()),
        "listPods": provider.list,
        "getPod": lambda: provider.get(inst.id),
        "deletePod": lambda: provider.delete(inst.id),
        "getPodLogs": lambda: _drain(provider, inst.id),
        "listGpuTypes": provider.capacity,
    }
    with pytest.raises(ProviderError) as info:
        await calls[operation]()
    assert type(info.value) is error
    assert f"HTTP {status}" in str(info.value) and detail in str(info.value)
    assert info.value.provider == "runpod"
    assert fake.calls(operation)[-1].status == status


async def _drain(provider: RunPodProvider, pod_id: str) -> list[bytes]:
    return [chunk async for chunk in provider.logs(pod_id, LogOptions())]


async def test_running_out_of_stock_is_a_capacity_error(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    await provider.create(spec("a", gpu_type="RTX4090", gpu_count=4))
    with pytest.raises(CapacityError, match="no longer any instances available"):
        await provider.create(spec("b", gpu_type="RTX4090", gpu_count=1))
    assert len(fake.pods) == 1


async def test_rate_limits_carry_retry_after_and_short_ones_are_retried(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    fake.rate_limit("listPods", retry_after=12)
    with pytest.raises(RateLimited) as info:
        await provider.list()
    assert info.value.retry_after == 12.0
    assert len(fake.calls("listPods")) == 1  # longer than retry_after_cap: raised at once

    fake.rate_limit("listPods", retry_after=0)
    assert await provider.list() == []
    assert [r.status for r in fake.calls("listPods")][-2:] == [429, 200]


async def test_a_rate_limit_without_retry_after_uses_the_ratelimit_header(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    fake.fail_next("listPods", status=429, detail="rate limit exceeded",
                   headers={"RateLimit": '"minute";r=0;t=3, "hour";r=2800;t=1812'})
    with pytest.raises(RateLimited) as info:
        await provider.list()
    assert info.value.retry_after == 3.0
    assert len(fake.calls("listPods")) == 1


async def test_validation_errors_are_listed_in_the_message(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    fake.fail_next("createPod", status=422, detail="Request validation failed.",
                   errors=["$.gpu.count: must be >= 1", "$.name: too long"])
    with pytest.raises(InvalidSpec) as info:
        await provider.create(spec())
    assert str(info.value) == (
        "runpod: create pod 'vk-gpu-burst-uid-1' failed: HTTP 422 Unprocessable Entity: Request "
        "validation failed. ($.gpu.count: must be >= 1; $.name: too long)"
    )


def test_the_spec_folder_comes_from_vkp_specs_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VKP_SPECS_DIR", "/somewhere/specs")
    assert str(runpod_spec_path()) == "/somewhere/specs/runpod/openapi-v2.json"
    monkeypatch.delenv("VKP_SPECS_DIR")
    assert runpod_spec_path().parts[-4:] == ("tests", "specs", "runpod", "openapi-v2.json")
    assert runpod_spec_path().is_file()


async def test_server_errors_are_retried_then_transient(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    fake.server_error("listPods", times=1)
    assert await provider.list() == []
    assert [r.status for r in fake.calls("listPods")] == [503, 200]

    fake.server_error("listGpuTypes", status=500, times=10)
    with pytest.raises(TransientError, match="HTTP 500"):
        await provider.capacity()
    assert len(fake.calls("listGpuTypes")) == 4  # max_attempts


@pytest.mark.parametrize(("exc", "kind"), TRANSPORT_FAILURES)
async def test_transport_failures_are_transient(
    make_provider: MakeProvider, exc: type[httpx.TransportError], kind: str
) -> None:
    transport = FailingTransport(exc, message="boom talking to {url}")
    with pytest.raises(TransientError, match=kind):
        await make_provider(transport=transport).list()
    assert transport.calls == 4


async def test_the_api_key_never_appears_in_errors_or_repr(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    provider = make_provider()
    fake.fail_next("listPods", status=401, detail=f"invalid api key {API_KEY}",
                   title=f"Unauthorized {API_KEY}")
    with pytest.raises(AuthError) as auth:
        await provider.list()
    fake.rate_limit("listPods", retry_after=30)
    with pytest.raises(RateLimited) as limited:
        await provider.list()
    with pytest.raises(TransientError) as transient:
        await make_provider(transport=FailingTransport(httpx.ConnectError,
                                                       message="boom talking to {url}")).list()
    with pytest.raises(InvalidSpec) as invalid:
        await provider.create(spec(command=("x",)))
    wrong = make_provider(api_key="some-other-key")
    with pytest.raises(AuthError) as rejected:
        await wrong.list()
    errors = [info.value for info in (auth, limited, transient, invalid, rejected)]
    assert "***" in str(auth.value)
    for secret in (API_KEY, "some-other-key"):
        assert_never_shown(secret, provider, wrong, *errors)


# -- logs ------------------------------------------------------------------------------------


async def test_logs_map_the_options_onto_the_sse_endpoint(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec())
    for n in range(5):
        fake.add_log(inst.id, f"line {n}", ts=f"2020-06-01T12:00:0{n}Z")
    fake.add_log(inst.id, "host booted", source="system", ts="2020-06-01T12:00:00Z")

    tail = [c async for c in provider.logs(inst.id, LogOptions(tail_lines=2, timestamps=True))]
    assert tail == [b"2020-06-01T12:00:03Z line 3\n", b"2020-06-01T12:00:04Z line 4\n"]
    everything = [c async for c in provider.logs(inst.id, LogOptions(tail_lines=99999))]
    assert everything == [f"line {n}\n".encode() for n in range(5)]
    limited = b"".join([c async for c in provider.logs(inst.id, LogOptions(limit_bytes=9))])
    assert limited == b"line 0\nli"
    now = datetime.now(UTC)
    for n in (2, 1):
        stamp = (now - timedelta(seconds=n)).replace(microsecond=0).isoformat()
        fake.add_log(inst.id, f"recent {n}", ts=stamp.replace("+00:00", "Z"))
    since = [c async for c in provider.logs(inst.id, LogOptions(since_seconds=3600,
                                                                  tail_lines=1))]
    assert since == [b"recent 1\n"]  # RunPod ignores tail with since: the adapter keeps it

    queries = [dict(r.query) for r in fake.calls("getPodLogs")]
    assert queries[0] == {"source": "container", "tail": "2"}
    assert queries[1] == {"source": "container", "tail": "5000"}
    assert queries[2] == {"source": "container", "tail": "5000"}
    assert set(queries[3]) == {"source", "since"}


async def test_logs_can_read_every_source(fake: FakeRunPod, make_provider: MakeProvider) -> None:
    provider = make_provider(options={"log_source": "all"})
    inst = await provider.create(spec())
    fake.add_log(inst.id, "host booted", source="system")
    fake.add_log(inst.id, "hello", source="container")
    assert [c async for c in provider.logs(inst.id, LogOptions())] == [b"host booted\n",
                                                                       b"hello\n"]
    assert "source" not in dict(fake.calls("getPodLogs")[0].query)


class StalledStream(httpx.AsyncByteStream):
    """An SSE stream that sends ``chunks`` and then never ends (like RunPod's, while live)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        await asyncio.Event().wait()


class SSETransport(httpx.AsyncBaseTransport):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=StalledStream(self.chunks))


async def test_logs_without_follow_end_when_the_live_stream_goes_idle(
    make_provider: MakeProvider,
) -> None:
    chunks = [
        b": keep-alive\n\n",
        b'id: 2026-06-01T12:00:00Z/1\ndata: {"ts":"2026-06-01T12:00:00Z",',
        b'"source":"container","line":"one"}\n\n',
        b'data: {"ts":"2026-06-01T12:00:01Z","source":"container",\r\ndata: "line":"two"}\r\n\r\n',
    ]
    provider = make_provider(options={"logs_idle_seconds": 0.05},
                             transport=SSETransport(chunks))
    got = [c async for c in provider.logs("pod-1", LogOptions())]
    assert got == [b"one\n", b"two\n"]


# -- capacity --------------------------------------------------------------------------------


async def test_capacity_reads_the_catalog_with_availability(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    offers = {(o.gpu_type, o.region): (o.available, o.price_per_gpu_hour)
              for o in await provider.capacity()}
    # H100: 8 free in US-TX-3 (HIGH -> 8), 2 in EU-RO-1 (LOW -> 1); RTX4090: 4 (MEDIUM -> 4).
    # The A100 is not in gpu_types, so it is not offered.
    assert offers == {
        ("H100", "US-TX-3"): (8, 2.99),
        ("H100", "EU-RO-1"): (1, 2.99),
        ("RTX4090", "US-KS-2"): (4, 0.69),
    }
    (call,) = fake.calls("listGpuTypes")
    assert dict(call.query) == {"include": "AVAILABILITY", "product": "POD", "cloud": "SECURE"}


async def test_capacity_without_a_gpu_map_offers_every_type_by_runpod_id(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    provider = make_provider(options={"gpu_types": {}, "cloud": "COMMUNITY",
                                      "data_center_ids": ["US-TX-3", "US-KS-2"],
                                      "availability_gpus": {"HIGH": 16}})
    offers = {(o.gpu_type, o.region): (o.available, o.price_per_gpu_hour)
              for o in await provider.capacity()}
    assert offers == {
        (H100, "US-TX-3"): (2, 2.69),  # HIGH counts 16, capped at the 2 of a community machine
        (RTX4090, "US-KS-2"): (4, 0.34),
        ("NVIDIA A100 80GB PCIe", "*"): (0, 1.19),  # sold, but stocked nowhere now
    }


async def test_an_instance_reports_its_gpu_by_the_offer_name(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(gpu_type="RTX4090"))
    offer_types = {o.gpu_type for o in await provider.capacity()}
    assert inst.gpu_type in offer_types
    assert fake.calls("createPod")[0].body["gpu"]["id"] == RTX4090


# -- published ports -------------------------------------------------------------------------


def proxied(pod_id: str, port: int) -> PublishedPort:
    return PublishedPort(container_port=port, host=f"{pod_id}-{port}.proxy.runpod.net", port=443,
                         kind="hostname", scheme="https")


def direct(port: int, ip: str, public: int) -> PublishedPort:
    return PublishedPort(container_port=port, host=ip, port=public, kind="ip")


WEB_PORTS = (Port(container_port=8888, name="http"), Port(container_port=22),
             Port(container_port=9090, name="http-metrics"))


async def test_a_running_pod_publishes_each_declared_port_direct_mapping_first(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(ports=WEB_PORTS))
    assert inst.published == ()  # PROVISIONING: nothing is reachable yet
    fake.set_status(inst.id, "RUNNING")
    fake.set_runtime_ports(inst.id, [  # PodRuntimePort, as in the spec's examples
        {"private": 8888, "public": None, "type": "http", "ip": None},
        {"private": 22, "public": 34446, "type": "tcp", "ip": "195.26.233.3"},
        {"private": 9090, "public": 43210, "type": "http", "ip": "45.23.12.1"},
    ])
    expected = (
        proxied(inst.id, 8888),  # http, unmapped: RunPod's proxy only
        direct(22, "195.26.233.3", 34446),  # tcp: the public port on the host's IP
        direct(9090, "45.23.12.1", 43210),  # http with a public mapping: direct first,
        proxied(inst.id, 9090),  # then the proxy
    )
    got = await provider.get(inst.id)
    assert got.published == expected
    (listed,) = await provider.list()
    assert listed.published == expected
    assert got.endpoints == (f"https://{inst.id}-8888.proxy.runpod.net",
                             f"https://{inst.id}-9090.proxy.runpod.net", "195.26.233.3:34446")
    assert {p.container_port for p in got.published} == {8888, 22, 9090}  # every declared port


async def test_the_fakes_default_mapping_publishes_tcp_ports_on_the_host_ip(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(ports=WEB_PORTS[:2]))
    fake.set_status(inst.id, "RUNNING")
    got = await provider.get(inst.id)
    assert got.published == (proxied(inst.id, 8888), direct(22, "203.0.113.7", 40022))
    assert all(p.protocol == "TCP" for p in got.published)


async def test_internal_addresses_in_runtime_ports_are_not_published(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(ports=WEB_PORTS))
    fake.set_status(inst.id, "RUNNING")
    fake.set_runtime_ports(inst.id, [
        {"private": 8888, "public": 60123, "type": "http", "ip": "100.65.12.7"},  # CGNAT
        {"private": 22, "public": 34446, "type": "tcp", "ip": "10.2.0.9"},  # RFC 1918
        {"private": 9090, "public": 60124, "type": "http", "ip": "not-an-ip"},
    ])
    got = await provider.get(inst.id)
    assert got.published == (proxied(inst.id, 8888), proxied(inst.id, 9090))


@pytest.mark.parametrize("status", ["PROVISIONING", "STARTING", "EXITED", "ERROR"])
async def test_a_pod_that_is_not_running_publishes_nothing(
    fake: FakeRunPod, provider: RunPodProvider, status: str
) -> None:
    inst = await provider.create(spec(ports=WEB_PORTS))
    fake.set_status(inst.id, status)
    assert (await provider.get(inst.id)).published == ()


async def test_missing_runtime_fields_give_fewer_entries_never_an_error(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(ports=WEB_PORTS))
    fake.set_status(inst.id, "RUNNING")
    fake.set_runtime_ports(inst.id, None)  # RunPod has mapped nothing yet
    assert (await provider.get(inst.id)).published == (
        proxied(inst.id, 8888), proxied(inst.id, 9090))
    fake.set_runtime_ports(inst.id, [{"private": 22}, {"public": 34446, "ip": "195.26.233.3"},
                                     {"private": 22, "public": None, "ip": "195.26.233.3"}])
    assert (await provider.get(inst.id)).published == (
        proxied(inst.id, 8888), proxied(inst.id, 9090))
    fake.pods[inst.id]["runtime"] = None  # the spec allows null
    fake.pods[inst.id]["ports"] = ["8888/http", "junk/tcp", "22"]
    assert (await provider.get(inst.id)).published == (proxied(inst.id, 8888),)
    fake.pods[inst.id]["ports"] = []
    assert (await provider.get(inst.id)).published == ()


async def test_a_pod_without_ports_publishes_nothing(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec())
    fake.set_status(inst.id, "RUNNING")
    got = await provider.get(inst.id)
    assert got.state is InstanceState.RUNNING and got.published == ()


# -- GPU figures (gpu_metrics_all) -----------------------------------------------------------


async def test_gpu_metrics_all_reads_runtime_gpus_from_one_list_call(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    provider = make_provider()
    assert isinstance(provider, BulkGPUMetricsSource)
    two = await provider.create(spec("vk-gpu-burst-two", gpu_count=2))
    fake.set_status(two.id, "RUNNING")
    fake.set_gpu_utilization(two.id, [{"util": 94, "memoryUtil": 78}, {"memoryUtil": 5}])
    unsampled = await provider.create(spec("vk-gpu-burst-unsampled", gpu_type="RTX4090"))
    fake.set_status(unsampled.id, "RUNNING")
    fake.set_gpu_utilization(unsampled.id, None)  # RUNNING, runtime without gpus
    starting = await provider.create(spec("vk-gpu-burst-starting"))
    fake.set_status(starting.id, "STARTING")  # runtime is null
    gone = await provider.create(spec("vk-gpu-burst-gone"))
    fake.set_status(gone.id, "TERMINATED")
    theirs = await make_provider(owner="vk-other").create(spec("vk-other-a"))
    fake.set_status(theirs.id, "RUNNING")
    fake.set_gpu_utilization(theirs.id, [{"util": 50, "memoryUtil": 50}])
    fake.add_pod(name="by-hand")
    fake.requests.clear()

    bodies = await provider.gpu_metrics_all()

    assert [r.operation for r in fake.requests] == ["listPods"]  # ONE call, nothing else
    assert fake.requests[0].query == []  # the same request as list(): no extra parameter
    assert set(bodies) == {i.id for i in await provider.list()}
    assert set(bodies) == {two.id, unsampled.id, starting.id}  # not gone, not theirs
    assert bodies[two.id] == {
        "instance_id": two.id,
        "state": "running",
        "gpus": [
            {"index": 0, "gpu_type": "H100", "gpu_utilization": 94.0},  # percent, as sent
            {"index": 1, "gpu_type": "H100"},  # util missing: omitted, memoryUtil never used
        ],
    }
    assert bodies[unsampled.id] == {"instance_id": unsampled.id, "state": "running", "gpus": []}
    assert bodies[starting.id] == {"instance_id": starting.id, "state": "pending", "gpus": []}
    readings = parse_readings(bodies[two.id], default_model="")
    assert [(g.index, g.model, g.utilization) for g in readings] == [
        (0, "H100", 0.94), (1, "H100", None)]
    assert all(g.memory_used_bytes is None and g.memory_total_bytes is None for g in readings)


async def test_a_freshly_running_pod_reports_one_idle_figure_per_gpu(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(gpu_count=2))
    fake.set_status(inst.id, "RUNNING")
    body = (await provider.gpu_metrics_all())[inst.id]
    assert [(g["index"], g["gpu_utilization"]) for g in body["gpus"]] == [(0, 0.0), (1, 0.0)]


@pytest.mark.parametrize(
    ("status", "error", "retry_after"),
    [
        (401, AuthError, None),
        (403, AuthError, None),
        (429, RateLimited, 12),
        (500, TransientError, None),
    ],
)
async def test_gpu_metrics_all_maps_errors_like_list(
    fake: FakeRunPod, make_provider: MakeProvider, status: int, error: type[ProviderError],
    retry_after: int | None,
) -> None:
    provider = make_provider(options={"max_attempts": 1})
    for call in (provider.list, provider.gpu_metrics_all):
        fake.fail_next("listPods", status=status, detail="nope", retry_after=retry_after)
        with pytest.raises(ProviderError) as info:
            await call()
        assert type(info.value) is error
        assert f"HTTP {status}" in str(info.value) and info.value.provider == "runpod"
    assert [r.status for r in fake.calls("listPods")] == [status, status]


async def test_gpu_metrics_all_retries_like_list(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec())
    fake.set_status(inst.id, "RUNNING")
    fake.requests.clear()
    fake.server_error("listPods", times=1)
    assert set(await provider.gpu_metrics_all()) == {inst.id}
    assert [r.status for r in fake.calls("listPods")] == [503, 200]


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"gpu_type": {}}, "unknown option"),
        ({"cloud": "SPOT"}, "options.cloud"),
        ({"gpu_types": {"A": "x", "B": "x"}}, "one-to-one"),
        ({"allowed_cuda_versions": ["12.8"], "min_cuda_version": "12.1"}, "min_cuda_version"),
        ({"min_cuda_version": "twelve"}, "major.minor"),
        ({"volume_gb": 5}, "volume_gb"),
        ({"availability_gpus": {"PLENTY": 3}}, "availability_gpus"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"log_source": "stderr"}, "log_source"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RunPodProvider(name="runpod", base_url=BASE_URL, owner=OWNER, api_key=API_KEY,
                       options=options)


# -- private images: container registry credentials ----------------------------------------

PASSWORD = "hunter2-Registry-Pa55"
AUTH = RegistryAuth(registry="ghcr.io", username="acme-bot", password=PASSWORD, secret="regcred")


def registry_calls(fake: FakeRunPod) -> list[str]:
    return [r.operation or "" for r in fake.requests if "Registr" in (r.operation or "")]


async def test_a_pull_credential_becomes_a_registry_credential_attached_on_create(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(registry_auth=AUTH))
    (made,) = fake.calls("createRegistry")
    name = provider.registry_name(AUTH)
    assert made.body == {"name": name, "username": "acme-bot", "password": PASSWORD}
    assert name.startswith(REGISTRY_PREFIX) and PASSWORD not in name and "acme" not in name
    (registry_id,) = fake.registries
    (body,) = posted(fake)
    assert body["registry"] == registry_id
    assert fake.pods[inst.id]["registry"] == registry_id
    # write-only: no answer carries the username or password
    assert all(PASSWORD not in json.dumps(r.body) for r in fake.requests
               if r.operation != "createRegistry")
    assert registry_calls(fake) == ["listRegistries", "createRegistry"]


async def test_the_same_credential_is_reused_across_creates_and_restarts(
    fake: FakeRunPod, provider: RunPodProvider, make_provider: MakeProvider
) -> None:
    await provider.create(spec("vk-gpu-burst-uid-1", registry_auth=AUTH))
    await provider.create(spec("vk-gpu-burst-uid-2", registry_auth=AUTH))
    restarted = make_provider()
    await restarted.create(spec("vk-gpu-burst-uid-3", registry_auth=AUTH))
    assert len(fake.calls("createRegistry")) == 1
    assert len({b["registry"] for b in posted(fake)}) == 1
    # a changed password (or user, or registry) is a different credential
    rotated = RegistryAuth(registry="ghcr.io", username="acme-bot", password=PASSWORD + "2")
    await provider.create(spec("vk-gpu-burst-uid-4", registry_auth=rotated))
    assert len(fake.registries) == 2
    assert provider.registry_name(rotated) != provider.registry_name(AUTH)


async def test_a_pod_credential_wins_over_the_registry_id_option(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    fake.add_registry(name="node-wide", registry_id="reg-static")
    provider = make_provider(options={"registry_id": "reg-static",
                                      "registry_hosts": ["ghcr.io"]})
    await provider.create(spec("vk-gpu-burst-uid-1"))
    await provider.create(spec("vk-gpu-burst-uid-2", registry_auth=AUTH))
    first, second = posted(fake)
    assert first["registry"] == "reg-static"
    assert second["registry"] != "reg-static" and second["registry"] in fake.registries


async def test_the_registry_id_option_goes_only_with_images_of_its_registry_hosts(
    fake: FakeRunPod, make_provider: MakeProvider
) -> None:
    fake.add_registry(name="node-wide", registry_id="reg-org")
    provider = make_provider(options={"registry_id": "reg-org",
                                      "registry_hosts": ["registry.example.com"]})
    await provider.create(spec("vk-gpu-burst-uid-1", image="attacker.example/x:1"))
    await provider.create(spec("vk-gpu-burst-uid-2", image="registry.example.com/team/model:1"))
    await provider.create(spec("vk-gpu-burst-uid-3", image="busybox"))
    await provider.create(spec("vk-gpu-burst-uid-4",
                               image="registry.example.com.attacker.example/team/model:1"))
    attacker, ours, hub, lookalike = posted(fake)
    assert "registry" not in attacker, "an image of another registry is pulled anonymously"
    assert ours["registry"] == "reg-org"
    assert "registry" not in hub and "registry" not in lookalike
    assert sorted(str(p.get("registry")) for p in fake.pods.values()) == [
        "None", "None", "None", "reg-org"]


@pytest.mark.parametrize("options", [
    {"registry_id": "reg-org"},
    {"registry_hosts": ["registry.example.com"]},
    {"registry_id": "reg-org", "registry_hosts": []},
    {"registry_id": "reg-org", "registry_hosts": ["https://"]},
])
def test_registry_id_without_its_registry_hosts_is_refused(
    make_provider: MakeProvider, options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match=r"options\.registry_hosts"):
        make_provider(options=options)


async def test_a_pod_credential_never_goes_with_an_image_of_another_registry(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    await provider.create(spec(image="attacker.example/x:1", registry_auth=AUTH))
    (body,) = posted(fake)
    assert "registry" not in body
    assert fake.calls("createRegistry") == [] and fake.registries == {}


async def test_an_adopted_pod_needs_no_credential(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    await provider.create(spec())
    await provider.create(spec(registry_auth=AUTH))
    assert registry_calls(fake) == [] and fake.registries == {}


@pytest.mark.parametrize("auth", [
    RegistryAuth(registry="ghcr.io", username="", password=PASSWORD, secret="regcred"),
    RegistryAuth(registry="ghcr.io", username="acme-bot", password="", secret="regcred"),
])
async def test_a_credential_runpod_cannot_hold_is_refused_before_any_call(
    fake: FakeRunPod, provider: RunPodProvider, auth: RegistryAuth
) -> None:
    with pytest.raises(InvalidSpec, match="imagePullSecrets") as info:
        await provider.create(spec(registry_auth=auth))
    assert "'regcred'" in str(info.value) and "ghcr.io" in str(info.value)
    assert fake.requests == []


async def test_a_refused_credential_is_invalid_spec_naming_image_pull_secrets(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    fake.fail_next("createRegistry", status=422, detail=f"bad password {PASSWORD}")
    with pytest.raises(InvalidSpec, match="imagePullSecrets") as info:
        await provider.create(spec(registry_auth=AUTH))
    assert "***" in str(info.value)
    assert_never_shown(PASSWORD, info.value)
    assert fake.calls("createPod") == []


async def test_the_password_is_never_shown_in_errors_reprs_or_logs(
    fake: FakeRunPod, provider: RunPodProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    the_spec = spec(registry_auth=AUTH)
    fake.fail_next("createPod", status=422, detail=f"cannot pull with {PASSWORD}",
                   errors=[f"password {PASSWORD} rejected"])
    with pytest.raises(InvalidSpec) as pod_error:
        await provider.create(the_spec)
    fake.fail_next("listRegistries", status=500, detail=f"echo {PASSWORD}", times=4)
    with pytest.raises(TransientError) as list_error:
        await provider.create(spec("vk-gpu-burst-uid-2", registry_auth=AUTH))
    inst = await provider.create(spec("vk-gpu-burst-uid-3", registry_auth=AUTH))
    assert_never_shown(PASSWORD, pod_error.value, list_error.value, the_spec, AUTH, provider,
                       inst, await provider.get(inst.id))
    assert "***" in str(pod_error.value)
    for record in caplog.records:
        assert PASSWORD not in record.getMessage() and PASSWORD not in str(record.args)


async def test_the_sweep_deletes_only_this_owners_unused_credentials(
    fake: FakeRunPod, provider: RunPodProvider, make_provider: MakeProvider
) -> None:
    other_auth = RegistryAuth(registry="quay.io", username="q", password="other-pass")
    kept = await provider.create(spec("vk-gpu-burst-uid-1", registry_auth=AUTH))
    gone = await provider.create(spec("vk-gpu-burst-uid-2", image="quay.io/q/app:1",
                                      registry_auth=other_auth))
    other_owner = make_provider(owner="vk-other-node")
    await other_owner.create(spec("vk-other-node-uid-9", image="quay.io/q/app:1",
                                  registry_auth=other_auth))
    await other_owner.delete((await other_owner.list())[0].id)
    fake.add_registry(name="made-by-hand")
    assert len(fake.registries) == 4

    await provider.delete(gone.id)
    assert await sweep_registry_auth(provider) == 1
    names = {r["name"] for r in fake.registries.values()}
    assert provider.registry_name(AUTH) in names  # its pod still uses it
    assert provider.registry_name(other_auth) not in names
    assert other_owner.registry_name(other_auth) in names  # another node's: its sweep's job
    assert "made-by-hand" in names

    # nothing deleted since: no call at all
    before = len(fake.requests)
    assert await provider.sweep_registry_auth() == 0
    assert len(fake.requests) == before

    await provider.delete(kept.id)
    assert await provider.sweep_registry_auth() == 1
    assert provider.registry_name(AUTH) not in {r["name"] for r in fake.registries.values()}
    assert await other_owner.sweep_registry_auth() == 1


async def test_the_first_sweep_cleans_up_after_an_earlier_run(
    fake: FakeRunPod, provider: RunPodProvider, make_provider: MakeProvider
) -> None:
    inst = await provider.create(spec(registry_auth=AUTH))
    fake.delete(inst.id)  # the pod went away while no provider ran
    assert await make_provider().sweep_registry_auth() == 1
    assert fake.registries == {}


async def test_a_credential_runpod_still_holds_is_kept_for_the_next_sweep(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    inst = await provider.create(spec(registry_auth=AUTH))
    await provider.delete(inst.id)
    fake.fail_next("deleteRegistry", status=400,
                   detail="Registry credential is in use by a pod and cannot be deleted")
    assert await provider.sweep_registry_auth() == 0
    assert len(fake.registries) == 1
    assert await provider.sweep_registry_auth() == 1  # still due: tried again
    assert fake.registries == {}


async def test_the_sweep_never_deletes_a_credential_a_create_is_about_to_use(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    # white-box: hold the credential the way create does between finding it and its POST
    registry_id = await provider._registry_for(spec(), AUTH)
    assert await provider.sweep_registry_auth() == 0
    assert registry_id in fake.registries


async def test_providers_without_credentials_to_clean_sweep_nothing() -> None:
    class Plain:
        pass

    assert await sweep_registry_auth(Plain()) == 0


async def test_runpod_offers_are_never_interruptible_and_pods_never_announce_one(
    fake: FakeRunPod, provider: RunPodProvider
) -> None:
    # the v2 spec has no spot pods and no interruption notice (providers/runpod.py)
    assert not any(o.interruptible for o in await provider.capacity())
    created = await provider.create(spec())
    [listed] = [i for i in await provider.list() if i.id == created.id]
    assert (listed.interruptible, listed.interruption_at, listed.interrupted) == (
        False, None, False)

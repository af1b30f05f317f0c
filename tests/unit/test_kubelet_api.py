"""Unit tests of the kubelet API: routes, log options, stats formats, GPU collector, auth rules.

The app runs in-process (httpx ASGITransport); the TLS layer and streaming over a real socket are
in test_kubelet_api_tls.py.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_kubelet_api_fakes import FakeCloud, FakeReviewer, FakeView, NoMetricsCloud, make_pod

from providers.base import InstanceState, NotFound, TransientError, Unsupported
from vkprovider.api.auth import (
    KubeletAuth,
    Subject,
    TTLCache,
    bearer_token,
    subresource_for,
    user_from_subject,
    verb_for,
)
from vkprovider.api.gpu import GPUCollector
from vkprovider.api.kubelet import create_kubelet_app, create_metrics_app
from vkprovider.api.stats import count_pods
from vkprovider.api.view import Placement
from vkprovider.config import KubeletAPISettings
from vkprovider.gpureadings import parse_readings
from vkprovider.kube.authn import UserInfo
from vkprovider.metrics import Metrics


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def with_tls_peer(app: Any, subject: Subject | None) -> Any:
    """What server.PeerCertH11Protocol does for a TLS connection with a verified client
    certificate (tests/unit/test_kubelet_api_tls.py does it over real TLS)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if subject is not None:
            scope.setdefault("extensions", {})["tls"] = {"client_cert_chain": ["(pem)"],
                                                         "client_cert_subject": subject}
        await app(scope, receive, send)

    return wrapped


@pytest.fixture
def view() -> FakeView:
    return FakeView()


@pytest.fixture
def cloud() -> FakeCloud:
    return FakeCloud()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
async def client(view: FakeView, metrics: Metrics) -> AsyncIterator[httpx.AsyncClient]:
    gpus = GPUCollector(view=view, metrics=metrics, interval=15.0)
    app = create_kubelet_app(view=view, auth=None, metrics=metrics, gpus=gpus,
                             started_at=1_767_268_800.0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="https://vk") as http:
        http.gpus = gpus  # type: ignore[attr-defined]
        yield http


# ---- pods ----------------------------------------------------------------------------------


async def test_pods_is_a_pod_list_of_the_node(client: httpx.AsyncClient, view: FakeView,
                                              cloud: FakeCloud) -> None:
    view.add(make_pod("a"), cloud)
    view.add(make_pod("b", phase="Pending"))
    resp = await client.get("/pods")
    assert resp.status_code == 200
    body = resp.json()
    assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
    assert sorted(p["metadata"]["name"] for p in body["items"]) == ["a", "b"]


async def test_runningpods_lists_only_pods_whose_instance_runs(
    client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    view.add(make_pod("b", phase="Pending"), cloud, state=InstanceState.PENDING)
    view.add(make_pod("c", phase="Pending"))
    for path in ("/runningpods/", "/runningpods"):
        body = (await client.get(path)).json()
        assert [p["metadata"]["name"] for p in body["items"]] == ["a"]
        assert body["items"][0]["spec"]["containers"][0]["name"] == "main"


async def test_healthz(client: httpx.AsyncClient) -> None:
    resp = await client.get("/healthz")
    assert resp.status_code == 200 and resp.text == "ok"


# ---- container logs ------------------------------------------------------------------------


async def test_container_logs_come_from_the_placed_instance(
    client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    resp = await client.get("/containerLogs/team/a/main")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert resp.text == "".join(f"line {i}\n" for i in range(5))
    instance_id, opts = cloud.log_calls[0]
    assert instance_id == "i-uid-a"
    assert not opts.follow and opts.tail_lines is None
    assert cloud.closed == 1


async def test_log_options_reach_the_provider(
    client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    resp = await client.get("/containerLogs/team/a/main",
                            params={"tailLines": "2", "timestamps": "true", "sinceSeconds": "30",
                                    "limitBytes": "1000"})
    assert resp.status_code == 200
    assert resp.text.splitlines() == ["2026-01-01T12:00:00.000000000Z line 3",
                                      "2026-01-01T12:00:00.000000000Z line 4"]
    _, opts = cloud.log_calls[0]
    assert (opts.tail_lines, opts.timestamps, opts.since_seconds, opts.limit_bytes) == (
        2, True, 30, 1000)


async def test_limit_bytes_is_enforced_even_if_the_cloud_ignores_it(
    client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    resp = await client.get("/containerLogs/team/a/main", params={"limitBytes": "9"})
    assert resp.content == b"line 0\nli"


async def test_since_time_becomes_since_seconds(
    client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    when = datetime.now(UTC).replace(microsecond=0).timestamp() - 120
    stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await client.get("/containerLogs/team/a/main", params={"sinceTime": stamp})
    _, opts = cloud.log_calls[0]
    assert opts.since_seconds is not None and 119 <= opts.since_seconds <= 125


@pytest.mark.parametrize(("params", "fragment"), [
    ({"tailLines": "-1"}, "tailLines: must be at least 0"),
    ({"tailLines": "ten"}, "tailLines: 'ten' is not an integer"),
    ({"follow": "maybe"}, "follow: 'maybe' is not a boolean"),
    ({"sinceSeconds": "0"}, "sinceSeconds: must be at least 1"),
    ({"sinceSeconds": "5", "sinceTime": "2026-01-01T00:00:00Z"}, "at most one of sinceTime"),
    ({"sinceTime": "yesterday"}, "not an RFC 3339 time"),
])
async def test_bad_log_parameters_are_400(client: httpx.AsyncClient, view: FakeView,
                                          cloud: FakeCloud, params: dict[str, str],
                                          fragment: str) -> None:
    view.add(make_pod("a"), cloud)
    resp = await client.get("/containerLogs/team/a/main", params=params)
    assert resp.status_code == 400
    assert fragment in resp.text
    assert cloud.log_calls == []


async def test_previous_logs_are_a_clear_400(client: httpx.AsyncClient, view: FakeView,
                                             cloud: FakeCloud) -> None:
    view.add(make_pod("a"), cloud)
    resp = await client.get("/containerLogs/team/a/main", params={"previous": "true"})
    assert resp.status_code == 400
    assert resp.text == ('previous terminated container "main" in pod "a" not found: mock keeps '
                         'no logs of previous containers')
    assert cloud.log_calls == []


async def test_unknown_pod_and_container_are_404(client: httpx.AsyncClient, view: FakeView,
                                                 cloud: FakeCloud) -> None:
    view.add(make_pod("a"), cloud)
    resp = await client.get("/containerLogs/team/nope/main")
    assert resp.status_code == 404
    assert resp.text == 'pod "team/nope" does not exist'
    resp = await client.get("/containerLogs/team/a/sidecar")
    assert resp.status_code == 404
    assert 'container "sidecar" not found' in resp.text


async def test_pod_without_instance_yet_is_400_waiting(client: httpx.AsyncClient,
                                                       view: FakeView) -> None:
    view.add(make_pod("a", phase="Pending"))
    resp = await client.get("/containerLogs/team/a/main")
    assert resp.status_code == 400
    assert "is waiting to start" in resp.text


@pytest.mark.parametrize(("error", "status", "fragment"), [
    (NotFound("gone"), 404, "is gone from provider mock"),
    (Unsupported("no logs API"), 501, "logs is not supported by provider mock"),
    (TransientError("mock: HTTP 503"), 502, "logs from provider mock failed"),
])
async def test_provider_errors_map_to_statuses(client: httpx.AsyncClient, view: FakeView,
                                               cloud: FakeCloud, error: Exception, status: int,
                                               fragment: str) -> None:
    view.add(make_pod("a"), cloud)
    cloud.log_error = error  # type: ignore[assignment]
    resp = await client.get("/containerLogs/team/a/main")
    assert resp.status_code == status
    assert fragment in resp.text


async def test_empty_log_is_an_empty_200(client: httpx.AsyncClient, view: FakeView) -> None:
    view.add(make_pod("a"), FakeCloud(lines=0))
    resp = await client.get("/containerLogs/team/a/main")
    assert resp.status_code == 200 and resp.text == ""


# ---- exec / attach / portForward -----------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "kind"), [
    ("POST", "/exec/team/a/main?command=ls&stdout=true", "exec"),
    ("GET", "/exec/team/a/main?command=ls", "exec"),
    ("POST", "/attach/team/a/main", "attach"),
])
async def test_streams_are_501_naming_the_provider(client: httpx.AsyncClient, view: FakeView,
                                                   cloud: FakeCloud, method: str, path: str,
                                                   kind: str) -> None:
    view.add(make_pod("a"), cloud)
    resp = await client.request(method, path, headers={"Connection": "Upgrade",
                                                       "Upgrade": "SPDY/3.1"})
    assert resp.status_code == 501
    assert resp.text.startswith(f"{kind} is not supported by provider mock")


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_port_forward_without_an_upgraded_connection_is_400(
        client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud, method: str) -> None:
    """The ASGI path sees /portForward only when the server did not take the connection over
    (tests/unit/test_port_forward_route.py covers the upgrade)."""
    view.add(make_pod("a"), cloud)
    resp = await client.request(method, "/portForward/team/a")
    assert resp.status_code == 400
    assert resp.text.startswith("portForward: the request must upgrade the connection to "
                                "SPDY/3.1")


async def test_exec_on_unknown_pod_is_404(client: httpx.AsyncClient) -> None:
    resp = await client.post("/exec/team/nope/main")
    assert resp.status_code == 404


# ---- stats and resource metrics ------------------------------------------------------------


async def test_stats_summary_has_node_pods_and_gpu_accelerators(
    client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    view.add(make_pod("b", phase="Pending"))
    view.add(make_pod("done", phase="Succeeded"))
    await client.gpus.refresh()  # type: ignore[attr-defined]
    body = (await client.get("/stats/summary")).json()
    assert body["node"]["nodeName"] == "vk-test"
    assert body["node"]["startTime"] == "2026-01-01T12:00:00Z"
    refs = {p["podRef"]["name"]: p for p in body["pods"]}
    assert set(refs) == {"a", "b"}
    a = refs["a"]
    assert a["podRef"] == {"name": "a", "namespace": "team", "uid": "uid-a"}
    (container,) = a["containers"]
    assert container["name"] == "main"
    assert container["startTime"] == "2026-01-01T12:00:00Z"
    accs = container["accelerators"]
    assert len(accs) == 2
    assert accs[0] == {
        "make": "nvidia", "model": "H100", "id": "GPU-i-uid-a-0",
        "memoryTotal": 80 * 2**30, "memoryUsed": 40 * 2**30, "dutyCycle": 75,
        "utilization": 0.75, "tensorActive": 0.6, "temperatureCelsius": 61.5,
        "powerWatts": 450.0, "time": accs[0]["time"]}
    assert "accelerators" not in refs["b"]["containers"][0]


async def test_metrics_resource_parses_and_carries_gpu_gauges(
    client: httpx.AsyncClient, view: FakeView, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    await client.gpus.refresh()  # type: ignore[attr-defined]
    resp = await client.get("/metrics/resource")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    assert families["resource_scrape_error"].samples[0].value == 0
    (start,) = families["container_start_time_seconds"].samples
    assert start.labels == {"container": "main", "namespace": "team", "pod": "a"}
    assert start.value == datetime(2026, 1, 1, 12, tzinfo=UTC).timestamp()
    util = families["vkprovider_pod_gpu_utilization_ratio"].samples
    assert {(s.labels["gpu"], s.value) for s in util} == {("0", 0.75), ("1", 0.75)}
    assert util[0].labels == {"namespace": "team", "pod": "a", "provider": "mock", "gpu": "0"}
    assert util[0].timestamp is not None
    for name in ("vkprovider_pod_gpu_tensor_active_ratio", "vkprovider_pod_gpu_memory_used_bytes",
                 "vkprovider_pod_gpu_memory_total_bytes",
                 "vkprovider_pod_gpu_temperature_celsius", "vkprovider_pod_gpu_power_watts"):
        assert len(families[name].samples) == 2, name


def test_count_pods_by_phase_and_provider(view: FakeView, cloud: FakeCloud) -> None:
    view.add(make_pod("a"), cloud)
    view.add(make_pod("b"), cloud)
    view.add(make_pod("c", phase="Pending"))
    view.add(make_pod("d", phase="Succeeded"), cloud, state=InstanceState.SUCCEEDED)
    assert count_pods(view) == {("Running", "mock"): 2, ("Pending", ""): 1,
                                ("Succeeded", "mock"): 1}


# ---- GPU collector -------------------------------------------------------------------------


async def test_collector_reads_each_running_instance_at_most_once_per_interval(
    view: FakeView, metrics: Metrics
) -> None:
    clock = Clock()
    gpu_cloud, plain = FakeCloud(name="mock"), NoMetricsCloud(name="plain")
    view.add(make_pod("a"), gpu_cloud)
    view.add(make_pod("b", phase="Pending"), gpu_cloud, state=InstanceState.PENDING)
    view.add(make_pod("c"), plain)
    collector = GPUCollector(view=view, metrics=metrics, interval=15.0, clock=clock)
    await collector.refresh()
    await collector.refresh()
    assert gpu_cloud.metrics_calls == ["i-uid-a"]
    assert set(collector.samples) == {"uid-a"}
    clock.now += 14.9
    await collector.refresh()
    assert len(gpu_cloud.metrics_calls) == 1
    clock.now += 0.2
    await collector.refresh()
    assert len(gpu_cloud.metrics_calls) == 2
    value = metrics.registry.get_sample_value(
        "vkprovider_pod_gpu_power_watts",
        {"namespace": "team", "pod": "a", "provider": "mock", "gpu": "1"})
    assert value == 450.0


class VersionedView(FakeView):
    """A view that says when its placements changed, as the controller's does."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 0
        self.scans = 0

    def placements(self) -> list[Placement]:
        self.scans += 1
        return super().placements()

    def placements_version(self) -> object:
        return self.version


async def test_collector_skips_passes_while_nothing_changed_and_nothing_is_due(
    metrics: Metrics
) -> None:
    view, clock, cloud = VersionedView(), Clock(), FakeCloud(name="mock")
    view.add(make_pod("a"), cloud)
    collector = GPUCollector(view=view, metrics=metrics, interval=15.0, clock=clock)
    await collector.refresh()
    assert cloud.metrics_calls == ["i-uid-a"] and view.scans == 1
    clock.now += 14.9
    await collector.refresh()
    assert view.scans == 1, "nothing changed and nothing due: no scan"
    view.add(make_pod("b"), cloud)
    view.version += 1
    await collector.refresh()
    assert view.scans == 2 and cloud.metrics_calls == ["i-uid-a", "i-uid-b"]
    clock.now += 0.2  # a's interval ran out: read again without any change
    await collector.refresh()
    assert cloud.metrics_calls == ["i-uid-a", "i-uid-b", "i-uid-a"]
    view.remove("a")
    view.version += 1
    await collector.refresh()
    assert set(collector.samples) == {"uid-b"}, "a pod gone is forgotten at the next change"


async def test_collector_forgets_pods_that_went_and_their_gauges(
    view: FakeView, metrics: Metrics, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    collector = GPUCollector(view=view, metrics=metrics, interval=15.0)
    await collector.refresh()
    labels = {"namespace": "team", "pod": "a", "provider": "mock", "gpu": "0"}
    assert metrics.registry.get_sample_value("vkprovider_pod_gpu_utilization_ratio",
                                             labels) == 0.75
    view.remove("a")
    await collector.refresh()
    assert collector.samples == {}
    assert metrics.registry.get_sample_value("vkprovider_pod_gpu_utilization_ratio",
                                             labels) is None


async def test_collector_counts_failures_and_keeps_going(view: FakeView, metrics: Metrics,
                                                         cloud: FakeCloud) -> None:
    clock = Clock()
    cloud.metrics_error = TransientError("mock: HTTP 503")
    view.add(make_pod("a"), cloud)
    collector = GPUCollector(view=view, metrics=metrics, interval=15.0, clock=clock)
    await collector.refresh()
    assert collector.samples == {}
    assert metrics.registry.get_sample_value(
        "vkprovider_provider_requests_total",
        {"provider": "mock", "operation": "gpu_metrics", "result": "TransientError"}) == 1
    await collector.refresh()  # not again within the interval, even after a failure
    assert len(cloud.metrics_calls) == 1
    cloud.metrics_error = None
    clock.now += 15
    await collector.refresh()
    assert "uid-a" in collector.samples


class BulkCloud(FakeCloud):
    """gpu_metrics_all as well: the collector must use it, once per interval."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bulk_calls = 0
        self.ids: list[str] = []

    async def gpu_metrics_all(self) -> dict[str, dict[str, Any]]:
        self.bulk_calls += 1
        if self.metrics_error is not None:
            raise self.metrics_error
        out = {i: await self.gpu_metrics(i) for i in self.ids}
        self.metrics_calls.clear()  # only the bulk call went to the cloud
        return out


async def test_collector_reads_a_bulk_provider_in_one_call_per_interval(
    view: FakeView, metrics: Metrics
) -> None:
    clock = Clock()
    cloud = BulkCloud(name="mock")
    cloud.ids = ["i-uid-a", "i-uid-b", "i-uid-c"]
    for name in ("a", "b", "c"):
        view.add(make_pod(name), cloud)
    collector = GPUCollector(view=view, metrics=metrics, interval=15.0, clock=clock)
    await collector.refresh()
    assert cloud.bulk_calls == 1 and cloud.metrics_calls == []
    assert set(collector.samples) == {"uid-a", "uid-b", "uid-c"}
    clock.now += 5
    await collector.refresh()
    assert cloud.bulk_calls == 1, "nothing due within the interval"
    start = clock.now - 5
    view.add(make_pod("d"), cloud)  # a new running pod: read at once, alone
    cloud.ids.append("i-uid-d")
    await collector.refresh()
    assert cloud.bulk_calls == 2 and "uid-d" in collector.samples
    assert collector._attempted["uid-a"] == start, "read 5 s ago: not stored again"
    assert collector._attempted["uid-d"] == start + 5
    clock.now += 10
    await collector.refresh()  # a, b, c due; d (read 10 s ago, past half the interval) too
    assert cloud.bulk_calls == 3
    assert set(collector._attempted.values()) == {start + 15}, "one cohort again"
    clock.now += 14
    await collector.refresh()
    assert cloud.bulk_calls == 3, "nothing due within the interval"
    cloud.metrics_error = TransientError("mock: HTTP 503")
    clock.now += 1
    await collector.refresh()
    assert cloud.bulk_calls == 4 and metrics.registry.get_sample_value(
        "vkprovider_provider_requests_total",
        {"provider": "mock", "operation": "gpu_metrics", "result": "TransientError"}) == 1
    assert set(collector.samples) == {"uid-a", "uid-b", "uid-c", "uid-d"}, "stale kept a while"


async def test_a_new_pod_waits_for_the_first_read_gap_of_a_bulk_provider(
    view: FakeView, metrics: Metrics
) -> None:
    clock = Clock()
    cloud = BulkCloud(name="mock")
    cloud.ids = ["i-uid-a"]
    view.add(make_pod("a"), cloud)
    collector = GPUCollector(view=view, metrics=metrics, interval=15.0, first_read_gap=5.0,
                             clock=clock)
    await collector.refresh()
    assert cloud.bulk_calls == 1
    for step in range(1, 5):  # pods start one a second, as in a burst
        clock.now += 1
        view.add(make_pod(f"n{step}"), cloud)
        cloud.ids.append(f"i-uid-n{step}")
        await collector.refresh()
    assert cloud.bulk_calls == 1, "no call per new pod within the gap"
    clock.now += 1
    await collector.refresh()
    assert cloud.bulk_calls == 2
    assert {f"uid-n{i}" for i in range(1, 5)} <= set(collector.samples)
    assert collector._attempted["uid-a"] < clock.now, "a (read 5 s ago) not read again"


def test_parse_readings_skips_malformed_entries() -> None:
    readings = parse_readings({"gpus": [
        {"index": 0, "gpu_utilization": 150, "tensor_active": -1},
        "junk",
        {"gpu_utilization": "high", "memory_used_bytes": True},
    ]}, default_model="A100")
    assert len(readings) == 2
    assert readings[0].utilization == 1.0 and readings[0].tensor_active == 0.0
    assert readings[0].model == "A100"
    assert readings[1].index == 2 and readings[1].utilization is None
    assert readings[1].memory_used_bytes is None
    assert parse_readings({"gpus": None}, default_model="") == ()


# ---- authentication and authorization ------------------------------------------------------


def auth_app(view: FakeView, metrics: Metrics, reviewer: FakeReviewer, clock: Clock,
             subject: Subject | None = None) -> Any:
    auth = KubeletAuth(reviewer=reviewer, node_name="vk-test", settings=KubeletAPISettings(),
                       metrics=metrics, clock=clock)
    app = create_kubelet_app(view=view, auth=auth, metrics=metrics,
                             gpus=GPUCollector(view=view, metrics=metrics))
    return with_tls_peer(app, subject)


def http_client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://vk")


async def test_anonymous_is_401_and_healthz_stays_open(view: FakeView, metrics: Metrics) -> None:
    reviewer = FakeReviewer()
    async with http_client(auth_app(view, metrics, reviewer, Clock())) as http:
        for path in ("/pods", "/containerLogs/team/a/main", "/stats/summary",
                     "/metrics/resource", "/no/such/path"):
            resp = await http.get(path)
            assert resp.status_code == 401, path
            assert resp.text == "Unauthorized"
        assert (await http.get("/healthz")).status_code == 200
        resp = await http.get("/pods", headers={"Authorization": "Basic dXNlcjpwdw=="})
        assert resp.status_code == 401
    assert reviewer.token_calls == 0
    assert metrics.registry.get_sample_value(
        "vkprovider_kubelet_api_auth_total", {"method": "none", "outcome": "unauthenticated"}
    ) == 6
    assert metrics.registry.get_sample_value(
        "vkprovider_kubelet_api_requests_total", {"endpoint": "pods", "code": "401"}) == 2


async def test_token_is_reviewed_then_authorized_on_the_node_subresource(
    view: FakeView, metrics: Metrics, cloud: FakeCloud
) -> None:
    view.add(make_pod("a"), cloud)
    reviewer = FakeReviewer()
    reviewer.tokens["good"] = UserInfo(name="system:serviceaccount:ops:reader", uid="u1",
                                       groups=("system:serviceaccounts",))
    reviewer.allowed.add(("system:serviceaccount:ops:reader", "get", "stats"))
    async with http_client(auth_app(view, metrics, reviewer, Clock())) as http:
        ok = await http.get("/stats/summary", headers={"Authorization": "Bearer good"})
        assert ok.status_code == 200
        denied = await http.get("/containerLogs/team/a/main",
                                headers={"Authorization": "Bearer good"})
        assert denied.status_code == 403
        assert denied.text == ("Forbidden (user=system:serviceaccount:ops:reader, verb=get, "
                               "resource=nodes, subresource=proxy)")
        bad = await http.get("/stats/summary", headers={"Authorization": "Bearer wrong"})
        assert bad.status_code == 401
    (user, attrs), (_, attrs2) = reviewer.access_calls
    assert user.uid == "u1"
    assert (attrs.verb, attrs.resource, attrs.subresource, attrs.name) == (
        "get", "nodes", "stats", "vk-test")
    assert attrs2.subresource == "proxy"
    assert cloud.log_calls == []


async def test_client_certificate_user_is_cn_with_o_groups(view: FakeView, metrics: Metrics,
                                                           cloud: FakeCloud) -> None:
    subject = ((("countryName", "DE"),), (("organizationName", "system:masters"),),
               (("commonName", "kube-apiserver-kubelet-client"),),
               (("organizationName", "ops"), ("organizationalUnitName", "x")))
    view.add(make_pod("a"), cloud)
    reviewer = FakeReviewer()
    reviewer.allowed.add(("system:masters", "get", "proxy"))
    app = auth_app(view, metrics, reviewer, Clock(), subject=subject)
    async with http_client(app) as http:
        resp = await http.get("/containerLogs/team/a/main")
    assert resp.status_code == 200
    assert reviewer.token_calls == 0
    (user, attrs), = reviewer.access_calls
    assert user == UserInfo(name="kube-apiserver-kubelet-client",
                            groups=("system:masters", "ops"))
    assert attrs.subresource == "proxy"


async def test_decisions_are_cached_allow_5_min_deny_30_s(view: FakeView, metrics: Metrics
                                                          ) -> None:
    clock = Clock()
    reviewer = FakeReviewer()
    reviewer.tokens["t"] = UserInfo(name="alice")
    async with http_client(auth_app(view, metrics, reviewer, clock)) as http:
        headers = {"Authorization": "Bearer t"}
        assert (await http.get("/pods", headers=headers)).status_code == 403
        assert (await http.get("/pods", headers=headers)).status_code == 403
        assert len(reviewer.access_calls) == 1 and reviewer.token_calls == 1
        reviewer.allowed.add(("alice", "get", "proxy"))
        clock.now += 29
        assert (await http.get("/pods", headers=headers)).status_code == 403
        clock.now += 2
        assert (await http.get("/pods", headers=headers)).status_code == 200
        assert len(reviewer.access_calls) == 2
        assert reviewer.token_calls == 1  # token cache: 2 min
        reviewer.allowed.clear()
        clock.now += 299
        assert (await http.get("/pods", headers=headers)).status_code == 200
        clock.now += 2
        assert (await http.get("/pods", headers=headers)).status_code == 403
        assert reviewer.token_calls == 2  # reviewed again at 330 s, then cached


async def test_review_errors_fail_closed_and_are_not_cached(view: FakeView, metrics: Metrics,
                                                            caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    reviewer = FakeReviewer()
    reviewer.tokens["s3cr3t-token-value"] = UserInfo(name="alice")
    reviewer.allowed.add(("alice", "get", "proxy"))
    reviewer.fail = True
    caplog.set_level(logging.DEBUG)
    async with http_client(auth_app(view, metrics, reviewer, Clock())) as http:
        headers = {"Authorization": "Bearer s3cr3t-token-value"}
        assert (await http.get("/pods", headers=headers)).status_code == 401
        reviewer.fail = False
        assert (await http.get("/pods", headers=headers)).status_code == 200
        reviewer.fail = True
        resp = await http.get("/stats/summary", headers=headers)
        assert resp.status_code == 500
        assert resp.text.startswith("Authorization error (user=alice")
    assert "s3cr3t-token-value" not in caplog.text
    assert any("token review failed" in r.getMessage() for r in caplog.records)


def test_subresources_and_verbs_follow_the_kubelet() -> None:
    assert subresource_for("/stats/summary") == "stats"
    assert subresource_for("/stats") == "stats"
    assert subresource_for("/metrics/resource") == "metrics"
    assert subresource_for("/logs/syslog") == "log"
    assert subresource_for("/containerLogs/a/b/c") == "proxy"
    assert subresource_for("/statsx") == "proxy"
    assert subresource_for("/pods") == "proxy"
    assert [verb_for(m) for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")] == [
        "get", "get", "create", "update", "patch", "delete"]
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Bearer ") is None
    assert bearer_token("Basic abc") is None


def test_ttl_cache_expires_and_evicts_the_oldest() -> None:
    clock = Clock()
    cache: TTLCache[str, int] = TTLCache(max_entries=2, clock=clock)
    cache.put("a", 1, ttl=10)
    cache.put("b", 2, ttl=1)
    cache.put("zero", 0, ttl=0)  # not cached
    assert cache.get("zero") is None
    clock.now += 1
    assert cache.get("b") is None and cache.get("a") == 1
    cache.put("b", 2, ttl=10)
    cache.put("c", 3, ttl=10)
    assert cache.get("a") is None and len(cache) == 2


# ---- /metrics port -------------------------------------------------------------------------


async def test_metrics_app_serves_the_registry(metrics: Metrics) -> None:
    metrics.queue_depth.set(3)
    async with http_client(create_metrics_app(metrics=metrics)) as http:
        resp = await http.get("/metrics")
        assert (await http.get("/healthz")).text == "ok"
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    assert families["vkprovider_workqueue_depth"].samples[0].value == 3


# ---- the review calls (vkprovider.kube.authn) ----------------------------------------------


class FakeKube:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.sent: list[tuple[str, str, Any, bool]] = []

    async def request(self, method: str, path: str, *, body: Any = None,
                      retry: bool = True) -> dict[str, Any]:
        self.sent.append((method, path, body, retry))
        return self.answer


async def test_token_review_request_and_answer() -> None:
    from vkprovider.kube.authn import KubeReviewer

    kube = FakeKube({"status": {"authenticated": True, "user": {
        "username": "system:serviceaccount:ops:bot", "uid": "u-1",
        "groups": ["system:serviceaccounts"], "extra": {"authentication.kubernetes.io/pod-name":
                                                        ["bot-0"]}}}})
    result = await KubeReviewer(client=kube).review_token(token="abc")  # type: ignore[arg-type]
    assert result.authenticated and result.user is not None
    assert result.user.groups == ("system:serviceaccounts",)
    assert result.user.extra == {"authentication.kubernetes.io/pod-name": ("bot-0",)}
    method, path, body, retry = kube.sent[0]
    assert (method, path, retry) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews", False)
    assert body["kind"] == "TokenReview" and body["spec"] == {"token": "abc"}
    rejected = await KubeReviewer(client=FakeKube({"status": {  # type: ignore[arg-type]
        "authenticated": False, "error": "token expired"}})).review_token(token="x")
    assert not rejected.authenticated and rejected.error == "token expired"


async def test_subject_access_review_request_and_answer() -> None:
    from vkprovider.kube.authn import KubeReviewer, ResourceAttributes

    kube = FakeKube({"status": {"allowed": True, "reason": "RBAC: allowed"}})
    user = UserInfo(name="alice", uid="u-2", groups=("devs",), extra={"scopes": ("a",)})
    attrs = ResourceAttributes(verb="get", resource="nodes", subresource="proxy", name="vk")
    decision = await KubeReviewer(client=kube).review_access(  # type: ignore[arg-type]
        user=user, attributes=attrs)
    assert decision.allowed and decision.reason == "RBAC: allowed"
    _, path, body, _ = kube.sent[0]
    assert path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    assert body["spec"] == {
        "user": "alice", "uid": "u-2", "groups": ["devs"], "extra": {"scopes": ["a"]},
        "resourceAttributes": {"verb": "get", "group": "", "resource": "nodes",
                               "subresource": "proxy", "name": "vk", "namespace": ""}}
    denied = await KubeReviewer(client=FakeKube({"status": {  # type: ignore[arg-type]
        "allowed": False, "denied": True}})).review_access(user=user, attributes=attrs)
    assert not denied.allowed


def test_a_subject_without_a_common_name_is_no_user() -> None:
    assert user_from_subject(((("organizationName", "system:masters"),),)) is None
    assert user_from_subject(()) is None
    assert user_from_subject(((("commonName", "a"),), (("commonName", "b"),))) == UserInfo(
        name="a", groups=())

"""GPU health on the provider: the sustained-threshold tracker and one watch pass against fakes."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from providers.base import Instance, InstanceState
from vkprovider.gpureadings import GPUReading, PodGPUs
from vkprovider.metrics import Metrics
from vkprovider.node.gpuhealth import CONDITION, GPUHealthWatch, HeatTracker, condition_status
from vkprovider.node.placements import Placed
from vkprovider.placement import policy as pol
from vkprovider.placement.blocks import Blocks
from vkprovider.placement.budget import POLICY_ANNOTATION


def test_hot_only_after_the_whole_window_and_cool_at_once() -> None:
    t = HeatTracker()
    kw: dict[str, Any] = {"limit": 80.0, "sustained": 10.0}
    assert t.observe("a", celsius=85.0, at=100.0, **kw) is None
    assert t.observe("a", celsius=None, at=105.0, **kw) is None  # no figure: no evidence
    assert t.observe("a", celsius=86.0, at=109.0, **kw) is None and not t.hot("a")
    turned = t.observe("a", celsius=87.0, at=110.0, **kw)
    assert turned is not None and turned.hot and turned.since == 100.0
    assert t.observe("a", celsius=90.0, at=111.0, **kw) is None and t.hot("a")  # told once
    cooled = t.observe("a", celsius=80.0, at=112.0, **kw)  # at the limit is not above it
    assert cooled is not None and not cooled.hot and not t.hot("a")


def test_one_cool_reading_restarts_the_window() -> None:
    t = HeatTracker()
    kw: dict[str, Any] = {"limit": 80.0, "sustained": 10.0}
    t.observe("a", celsius=85.0, at=0.0, **kw)
    t.observe("a", celsius=70.0, at=5.0, **kw)
    assert t.observe("a", celsius=85.0, at=6.0, **kw) is None
    assert t.observe("a", celsius=85.0, at=15.0, **kw) is None
    assert t.observe("a", celsius=85.0, at=16.0, **kw) is not None
    t.keep_only([])
    assert not t.hot("a") and t.since("a") is None


def test_a_seeded_pod_stays_hot_until_a_reading_at_or_below_the_limit() -> None:
    """A restarted process takes the stored GPUHealthy=False as its start: hot readings, however
    short the window it saw, change nothing; one reading at the limit unmarks the pod."""
    t = HeatTracker()
    kw: dict[str, Any] = {"limit": 80.0, "sustained": 10.0}
    t.seed_hot("a", since=50.0)
    assert t.hot("a") and t.since("a") == 50.0
    for at in (100.0, 101.0, 150.0):
        assert t.observe("a", celsius=90.0, at=at, **kw) is None and t.hot("a")
    assert t.observe("a", celsius=None, at=151.0, **kw) is None and t.hot("a")
    cooled = t.observe("a", celsius=80.0, at=152.0, **kw)
    assert cooled is not None and not cooled.hot and not t.hot("a")
    t.observe("b", celsius=90.0, at=0.0, **kw)  # already tracked: a seed does not move it
    t.seed_hot("b", since=-100.0)
    assert not t.hot("b") and t.since("b") == 0.0


class FakeClient:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    async def patch(self, path: str, body: Any, *, patch_type: str) -> Any:
        self.patches.append((path, body))
        return {}


class FakeEvents:
    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []

    async def emit(self, **kw: Any) -> None:
        self.emitted.append(kw)


def _sample(celsius: float, at: float) -> PodGPUs:
    gpus = tuple(GPUReading(index=i, uuid=f"g{i}", model="H100", utilization=0.5,
                            tensor_active=0.4, memory_used_bytes=1, memory_total_bytes=2,
                            temperature_celsius=t, power_watts=100.0)
                 for i, t in enumerate((60.0, celsius)))
    return PodGPUs(uid="u1", namespace="ns", pod="p1", provider="mock", instance_id="i-1",
                   at=at, gpus=gpus)


async def test_a_pass_marks_the_pod_blocks_the_offer_and_unmarks_when_cool() -> None:
    policy = pol.parse_overflow_policy({"metadata": {"name": "inf"}, "spec": {
        "providers": ["mock"], "gpuHealth": {"maxTemperatureCelsius": 78, "sustainedFor": "2s"}}})
    pod: dict[str, Any] = {"metadata": {"name": "p1", "namespace": "ns", "uid": "u1",
                                        "resourceVersion": "1",
                                        "annotations": {POLICY_ANNOTATION: "inf"}},
                           "status": {"conditions": []}}
    inst = Instance(id="i-1", name="p1", provider="mock", state=InstanceState.RUNNING,
                    gpu_type="H100", gpu_count=2, region="us-east")
    client, events, blocks = FakeClient(), FakeEvents(), Blocks()
    controller = SimpleNamespace(
        pod_keys={"u1": "ns/p1"}, informer=SimpleNamespace(store={"ns/p1": pod}),
        parsed_policies=lambda: {"inf": policy}, placed={"u1": Placed(
            provider="mock", instance=inst, seen_at=0.0)},
        blocks=blocks, events=events, client=client, metrics=Metrics())
    samples: dict[str, PodGPUs] = {}
    watch = GPUHealthWatch(controller=controller,  # type: ignore[arg-type]
                           samples=lambda: samples,
                           wall=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    for at in (1000.0, 1001.0):
        samples["u1"] = _sample(85.0, at)
        await watch.pass_once()
    assert client.patches == [] and events.emitted == []
    samples["u1"] = _sample(86.0, 1002.0)
    await watch.pass_once()
    [(path, body)] = client.patches
    assert path == "/api/v1/namespaces/ns/pods/p1/status"
    [cond] = body["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (CONDITION, "False", "GPUTooHot")
    assert "86 °C" in cond["message"] and "78 °C" in cond["message"]
    [event] = events.emitted
    assert (event["reason"], event["type_"]) == ("GPUTooHot", "Warning")
    assert blocks.blocked(provider="mock", region="us-east", gpu_type="H100") is not None
    assert blocks.blocked(provider="mock", region="eu-west", gpu_type="H100") is None

    await watch.pass_once()  # the watch has not shown the write yet: not written twice
    assert len(client.patches) == 1
    observed = []
    real_observe = watch.tracker.observe
    watch.tracker.observe = lambda uid, **kw: observed.append(uid) or real_observe(  # type: ignore[method-assign]
        uid, **kw)
    await watch.pass_once()  # same reading, pod and policy: the pod is not looked at again
    assert observed == []
    pod["status"]["conditions"] = [cond]
    pod["metadata"]["resourceVersion"] = "2"
    samples["u1"] = _sample(70.0, 1003.0)
    await watch.pass_once()
    assert observed == ["u1"]
    assert condition_status({"status": client.patches[-1][1]["status"]}) == "True"
    assert len(events.emitted) == 1


async def test_a_restarted_provider_unmarks_a_cool_pod_and_leaves_others_alone() -> None:
    policy = pol.parse_overflow_policy({"metadata": {"name": "inf"}, "spec": {
        "providers": ["mock"], "gpuHealth": {"maxTemperatureCelsius": 78}}})
    marked = {"type": CONDITION, "status": "False", "reason": "GPUTooHot"}
    pods = {f"ns/p{i}": {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}",
                                      "annotations": {POLICY_ANNOTATION: "inf"}},
                         "status": {"conditions": [marked] if i == 1 else []}}
            for i in (1, 2)}
    client = FakeClient()
    controller = SimpleNamespace(
        pod_keys={"u1": "ns/p1", "u2": "ns/p2"}, informer=SimpleNamespace(store=pods),
        parsed_policies=lambda: {"inf": policy}, placed={}, blocks=Blocks(),
        events=FakeEvents(), client=client, metrics=Metrics())
    cool = {uid: PodGPUs(uid=uid, namespace="ns", pod="p", provider="mock", instance_id=uid,
                         at=1.0, gpus=_sample(50.0, 1.0).gpus) for uid in ("u1", "u2")}
    watch = GPUHealthWatch(controller=controller, samples=lambda: cool)  # type: ignore[arg-type]
    await watch.pass_once()
    assert [p for p, _ in client.patches] == ["/api/v1/namespaces/ns/pods/p1/status"]


async def test_a_pass_with_nothing_new_is_skipped_whole_and_any_change_runs_one() -> None:
    policy = pol.parse_overflow_policy({"metadata": {"name": "inf"}, "spec": {
        "providers": ["mock"], "gpuHealth": {"maxTemperatureCelsius": 78}}})
    pod: dict[str, Any] = {"metadata": {"name": "p1", "namespace": "ns", "uid": "u1",
                                        "resourceVersion": "1",
                                        "annotations": {POLICY_ANNOTATION: "inf"}},
                           "status": {"conditions": []}}
    informer = SimpleNamespace(store={"ns/p1": pod}, changes=0)
    policies = SimpleNamespace(changes=0)
    controller = SimpleNamespace(
        pod_keys={"u1": "ns/p1"}, informer=informer, policies=policies,
        parsed_policies=lambda: {"inf": policy}, placed={}, blocks=Blocks(),
        events=FakeEvents(), client=FakeClient(), metrics=Metrics())
    samples = {"u1": _sample(50.0, 1.0)}
    version = [0]
    walked: list[int] = []

    def read() -> dict[str, PodGPUs]:
        walked.append(version[0])
        return samples

    watch = GPUHealthWatch(controller=controller,  # type: ignore[arg-type]
                           samples=read, samples_version=lambda: version[0])
    await watch.pass_once()
    await watch.pass_once()
    assert len(walked) == 1, "nothing changed: the second pass did not look at the pods"
    version[0] += 1
    await watch.pass_once()
    informer.changes += 1
    await watch.pass_once()
    policies.changes += 1
    await watch.pass_once()
    await watch.pass_once()
    assert len(walked) == 4, "a new sample, a pod change, a policy change: one walk each"


async def test_a_restarted_provider_keeps_a_hot_pod_marked_until_it_reads_cool() -> None:
    policy = pol.parse_overflow_policy({"metadata": {"name": "inf"}, "spec": {
        "providers": ["mock"], "gpuHealth": {"maxTemperatureCelsius": 78, "sustainedFor": "60s"}}})
    marked = {"type": CONDITION, "status": "False", "reason": "GPUTooHot",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}
    pod: dict[str, Any] = {"metadata": {"name": "p1", "namespace": "ns", "uid": "u1",
                                        "resourceVersion": "7",
                                        "annotations": {POLICY_ANNOTATION: "inf"}},
                           "status": {"conditions": [marked]}}
    client, events = FakeClient(), FakeEvents()
    controller = SimpleNamespace(
        pod_keys={"u1": "ns/p1"}, informer=SimpleNamespace(store={"ns/p1": pod}),
        parsed_policies=lambda: {"inf": policy}, placed={}, blocks=Blocks(),
        events=events, client=client, metrics=Metrics())
    samples: dict[str, PodGPUs] = {}
    watch = GPUHealthWatch(controller=controller,  # type: ignore[arg-type]
                           samples=lambda: samples)
    for at in (2000.0, 2001.0, 2002.0):  # still hot, far less than the window after the start
        samples["u1"] = _sample(90.0, at)
        await watch.pass_once()
    assert client.patches == [] and events.emitted == []
    assert watch.tracker.hot("u1")
    assert watch.tracker.since("u1") == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    samples["u1"] = _sample(78.0, 2003.0)  # at the limit: cool
    await watch.pass_once()
    [(_, body)] = client.patches
    assert condition_status(body) == "True"
    samples["u1"] = _sample(90.0, 2004.0)  # hot again before the watch shows the write:
    await watch.pass_once()                # a new window, not the stored False again
    assert len(client.patches) == 1 and not watch.tracker.hot("u1")

"""Zero dip on the way out: the vkprovider.io/prewarm AdmissionCheck against real Kueue (issue 14).

Real control plane, real Kueue v0.17.0, one simulated 4-GPU node, a mock cloud whose instances
are real HTTP servers, the provider and the companion as processes. An inference Deployment (4
replicas x 1 GPU, low priority, readiness probe, 2 s weight load, a Service) fills the node; a
Kueue batch Job gang (2 pods x 2 GPUs, high priority: it displaces every replica) arrives in a
ClusterQueue covering those GPUs. With the check, the companion surges inference onto the cloud
before Kueue admits the gang; without it, the scheduler preempts first and the replacements boot
afterwards (the dip, measured and printed). A watcher samples the Deployment every 200 ms (ready
replicas, spec.replicas). With a second node whose GPUs are free, the first plan is too small
(the surge's own replicas land on those GPUs): it is planned again and grows before Ready.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.harness import CompanionProcess
from vkprovider.testing.kueue import GROUP
from vkprovider.testing.loadgen import LoadGenerator
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import Sampler, eventually

from .conftest import Cluster, System
from .test_overflow import POLICIES, PRIORITY, gpu_deployment, pods, policy
from .test_traffic import server, service, slices

pytestmark = pytest.mark.cluster
API = f"/apis/{GROUP}/v1beta2"
QUEUE_LABEL = f"{GROUP}/queue-name"
INTENT = "vkprovider.io/prewarm"
REPLICAS = 4
GANG_PODS = 2
GANG_GPUS = 2  # each: the gang takes every internal GPU, so it displaces every replica
DISPLACED = GANG_PODS * GANG_GPUS
RATE = 25


class DeploymentWatch(Sampler):
    """Samples the Deployment every 200 ms: fewest ready, most spec.replicas, time below N."""

    def __init__(self, kube: KubeClient, path: str, desired: int) -> None:
        super().__init__()
        self.kube, self.path, self.desired = kube, path, desired
        self.min_ready: int | None = None
        self.max_replicas = 0
        self.below_seconds = 0.0
        self.samples = 0
        self._last: float | None = None

    async def sample(self) -> None:
        dep = await self.kube.get(self.path)
        now = time.monotonic()
        ready = int(dep.get("status", {}).get("readyReplicas") or 0)
        if ready < self.desired and self._last is not None:
            self.below_seconds += now - self._last
        self._last = now
        self.min_ready = ready if self.min_ready is None else min(self.min_ready, ready)
        self.max_replicas = max(self.max_replicas, int(dep["spec"].get("replicas") or 0))
        self.samples += 1


@dataclass
class Story:
    kube: KubeClient
    namespace: str
    system: System
    companion: CompanionProcess
    tag: str
    high: str
    check: str | None
    watch: DeploymentWatch
    lg: LoadGenerator | None = None
    created: list[str] = field(default_factory=list)

    async def stop(self) -> None:
        """Stop the Deployment watch and the load (both idempotent)."""
        await self.watch.stop()
        if self.lg is not None:
            await self.lg.stop()

    @property
    def dep_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}/deployments/inference"

    async def gang(self, *, run_seconds: float = 30) -> None:
        await self.kube.create(f"/apis/batch/v1/namespaces/{self.namespace}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "gang", "labels": {QUEUE_LABEL: "gpus"}},
            "spec": {"parallelism": GANG_PODS, "completions": GANG_PODS, "backoffLimit": 0,
                     "suspend": True,
                     "template": {"metadata": {"labels": {"app": "training"}, "annotations": {
                         "vkprovider.io/fake-run-seconds": str(run_seconds)}},
                                  "spec": {"restartPolicy": "Never", "priorityClassName": self.high,
                                           "terminationGracePeriodSeconds": 0,
                                           "containers": [{"name": "t", "image": "trainer:1",
                                                           "resources": {"limits": {
                                                               "nvidia.com/gpu": str(GANG_GPUS)
                                                           }}}]}}}})

    async def workload(self) -> dict[str, Any] | None:
        body = await self.kube.get(f"{API}/namespaces/{self.namespace}/workloads")
        for wl in body.get("items") or []:
            if any(o["kind"] == "Job" and o["name"] == "gang"
                   for o in wl["metadata"].get("ownerReferences") or []):
                return dict(wl)
        return None

    async def gang_running(self) -> list[dict[str, Any]]:
        return await eventually(lambda: pods(self.kube, self.namespace, "training"),
                                until=lambda ps: len(ps) == GANG_PODS and all(
                                    p["status"].get("phase") == "Running" for p in ps),
                                timeout=120, interval=0.5, what="the gang's pods Running")

    async def settled(self) -> dict[str, Any]:
        """The surge undone: spec.replicas back at N, no intent, N replicas Ready."""
        dep: dict[str, Any] = await eventually(
            lambda: self.kube.get(self.dep_path), timeout=120, interval=0.3,
            until=lambda d: d["spec"]["replicas"] == REPLICAS
            and INTENT not in (d["metadata"].get("annotations") or {})
            and int(d.get("status", {}).get("readyReplicas") or 0) == REPLICAS
            and int(d.get("status", {}).get("replicas") or 0) == REPLICAS,
            what=f"the Deployment settled at {REPLICAS} Ready replicas, no intent")
        return dep

    async def events(self, kind: str) -> list[dict[str, Any]]:
        body = await self.kube.get(f"/api/v1/namespaces/{self.namespace}/events",
                                   params={"fieldSelector": f"involvedObject.kind={kind}"})
        return list(body["items"])

    async def live_instances(self) -> int:
        ledgers = [await c.ledger() for c in self.system.clouds]
        return sum(1 for led in ledgers for e in led if e["state"] != "deleted")

    async def on_virtual_node(self) -> list[dict[str, Any]]:
        return [p for p in await pods(self.kube, self.namespace, "inference")
                if p["spec"].get("nodeName") == self.system.node_name]


async def start_story(*, kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory,
                      system: System, companion_kubeconfig: Path, objects: Cluster,
                      kueue_paths: list[str], local_cluster: Any, with_check: bool,
                      prewarm: dict[str, Any] | None = None, inventory: str | None = None,
                      load: bool = True, check_parameters: dict[str, str] | None = None,
                      companion_env: dict[str, str] | None = None,
                      move_back: dict[str, Any] | None = None) -> Story:
    """Inference filling one 4-GPU node under load, Kueue's queues (with the check), the
    companion (``companion_env`` adds to its environment: the crash-point hook). The policy's
    ``moveBack`` is off unless ``move_back`` gives it (the move-back crash points' story)."""
    await gpu_nodes.create(count=1, gpus=REPLICAS)
    await system.start(clouds=1, node_labels={"vkprovider.io/pool": namespace},
                       inventories=[inventory] if inventory else None)
    companion = CompanionProcess(work_dir=system.work_dir, kubeconfig=companion_kubeconfig,
                                 node_name=system.node_name, interval=0.5, move_back_interval=1.0)
    companion.component.start(env={**os.environ, **companion_env} if companion_env else None)
    system.companion = companion
    tag = uuid.uuid4().hex[:6]
    low, high = f"inf-{tag}", f"train-{tag}"
    for name, value in ((low, 100), (high, 1000)):
        await objects.create(PRIORITY, {"apiVersion": "scheduling.k8s.io/v1",
                                        "kind": "PriorityClass", "metadata": {"name": name},
                                        "value": value})
    # Kueue: a flavor on this test's GPU node, a ClusterQueue covering its GPUs, a LocalQueue
    name = f"pw-{tag}"
    await kube.create(f"{API}/resourceflavors", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name},
        "spec": {"nodeLabels": {"vkprovider.io/pool": namespace}}})
    kueue_paths.append(f"{API}/resourceflavors/{name}")
    check = None
    cq_spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": name, "resources": [{"name": "nvidia.com/gpu",
                                          "nominalQuota": str(REPLICAS)}]}]}]}
    if with_check:
        check = f"prewarm-{tag}"
        ac: dict[str, Any] = {"apiVersion": f"{GROUP}/v1beta2", "kind": "AdmissionCheck",
                              "metadata": {"name": check},
                              "spec": {"controllerName": "vkprovider.io/prewarm"}}
        if check_parameters:
            ac["spec"]["parameters"] = check_parameters
        await kube.create(f"{API}/admissionchecks", ac)
        kueue_paths.append(f"{API}/admissionchecks/{check}")
        cq_spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    await kube.create(f"{API}/clusterqueues", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": cq_spec})
    kueue_paths.append(f"{API}/clusterqueues/{name}")
    await kube.create(f"{API}/namespaces/{namespace}/localqueues", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus"},
        "spec": {"clusterQueue": name}})
    if check is not None and not check_parameters:
        await eventually(lambda: kube.get(f"{API}/admissionchecks/{check}"), timeout=60,
                         until=lambda a: condition(a, "Active").get("status") == "True",
                         what="the companion keeping the AdmissionCheck Active")

    deployment = gpu_deployment("inference", replicas=REPLICAS, pool=namespace,
                                priority_class=low)
    template = deployment["spec"]["template"]["spec"]
    template["containers"][0].update(server(load_seconds=2))
    template["terminationGracePeriodSeconds"] = 2  # the victims drain while endpoints update
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
    await eventually(lambda: pods(kube, namespace, "inference"), timeout=90, interval=0.3,
                     until=lambda ps: len(ps) == REPLICAS and all(
                         p["status"].get("phase") == "Running"
                         and p["spec"].get("nodeName") not in (None, system.node_name)
                         for p in ps), what=f"{REPLICAS} replicas Running inside")
    # The policy only now: under its overflowAfter 0s a replica the scheduler could not place at
    # once (its cache not holding the new node yet, on a loaded machine) overflowed, and the
    # story began with inference already on the cloud and nothing to pre-warm.
    body = policy(f"pw-{tag}", namespace=namespace, app="inference", providers=["cloud0"])
    # the way back is test_moveback's story, and the move-back crash points'
    body["spec"]["moveBack"] = move_back or {"enabled": False}
    body["spec"]["prewarm"] = {"timeout": "60s", **(prewarm or {})}
    await objects.create(POLICIES, body)
    await service(kube, namespace, "inference", "inference")
    await eventually(lambda: slices(kube, namespace, "inference"), timeout=90,
                     until=lambda items: sum(1 for s in items for ep in s.get("endpoints") or []
                                             if (ep.get("conditions") or {}).get("ready"))
                     == REPLICAS, what=f"{REPLICAS} ready endpoints inside")
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    await eventually(lambda: kube.get(dep_path), timeout=60,
                     until=lambda d: int(d.get("status", {}).get("readyReplicas") or 0)
                     == REPLICAS, what=f"the Deployment reporting {REPLICAS} ready")
    watch = DeploymentWatch(kube, dep_path, REPLICAS)
    story = Story(kube=kube, namespace=namespace, system=system, companion=companion, tag=tag,
                  high=high, check=check, watch=watch)
    if load:
        story.lg = LoadGenerator(kube=kube, namespace=namespace, service="inference", rate=RATE,
                                 address_map=Path(local_cluster.address_map_dir),
                                 chapter="inside")
        await story.lg.start()
        await eventually(lambda: _sent(story.lg), until=lambda n: n >= RATE, timeout=30,
                         what="a second of load inside")
        story.lg.mark("way out")
    watch.start()
    return story


async def _sent(lg: LoadGenerator | None) -> int:
    return lg.report().sent if lg is not None else 0


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def check_state(wl: dict[str, Any] | None, check: str) -> dict[str, Any]:
    for entry in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if entry["name"] == check:
            return dict(entry)
    return {}


def retries(wl: dict[str, Any] | None, check: str) -> int:
    """How many times Kueue retried the Workload on ``check``, from what lasts: the check's
    ``retryCount`` and the ``AdmissionCheck`` evictions in ``schedulingStats`` (the ``Retry``
    state and the ``Evicted`` condition are gone once Kueue requeued it); at least 1 while
    either transient sign is still there."""
    entry = check_state(wl, check)
    counted = int(entry.get("retryCount") or 0)
    for ev in (((wl or {}).get("status") or {}).get("schedulingStats") or {}).get(
            "evictions") or []:
        if ev.get("reason") == "AdmissionCheck":
            counted = max(counted, int(ev.get("count") or 0))
    if entry.get("state") == "Retry" or condition(wl, "Evicted").get("reason") == "AdmissionCheck":
        counted = max(counted, 1)
    return counted


def retry_seen(wl: dict[str, Any] | None, check: str) -> bool:
    return retries(wl, check) > 0


async def finish_load(story: Story) -> Any:
    assert story.lg is not None
    story.lg.mark("on the cloud")
    sent = story.lg.report().sent
    await eventually(lambda: _sent(story.lg), until=lambda n: n >= sent + 2 * RATE, timeout=30,
                     what="two seconds of load after the way out")
    return await story.lg.stop()


def print_report(title: str, report: Any, watch: DeploymentWatch) -> None:
    print(f"\n{title} at {RATE} req/s:")
    for c in report.chapters:
        print(f"  {c.label:<14} sent {c.sent:>6}  failed {c.failed:>5}  "
              f"longest no-endpoint {c.longest_no_endpoint:6.2f}s  by kind "
              f"{dict(c.failures_by_kind)}")
    print(f"  ready replicas: fewest {watch.min_ready} of {REPLICAS}, "
          f"{watch.below_seconds:.1f}s below {REPLICAS}; spec.replicas at most "
          f"{watch.max_replicas}")


async def test_the_way_out_with_prewarm_fails_no_request_and_never_dips(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
    local_cluster: Any,
) -> None:
    story = await start_story(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
                              companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
                              kueue_paths=kueue_objects, local_cluster=local_cluster,
                              with_check=True)
    assert story.check is not None
    started = time.monotonic()
    try:
        await story.gang()
        # Kueue reserves quota and holds the gang: the check is Pending while the surge boots
        pending = await eventually(story.workload, timeout=60, interval=0.3,
                                   until=lambda w: condition(w, "QuotaReserved").get("status")
                                   == "True" and "surging" in check_state(
                                       w, story.check or "").get("message", ""),
                                   what="the check Pending with the surge under way")
        assert condition(pending, "Admitted").get("status") != "True"
        wl = await eventually(story.workload, timeout=120, interval=0.3,
                              until=lambda w: condition(w, "Admitted").get("status") == "True",
                              what="Kueue admitting the gang once the check is Ready")
        admitted_after = time.monotonic() - started
        entry = check_state(wl, story.check)
        assert entry["state"] == "Ready" and "pre-warmed" in entry["message"], entry
        await story.gang_running()
        dep = await story.settled()
        report = await finish_load(story)
    finally:
        await story.stop()
    print_report("the way out WITH pre-warm", report, story.watch)
    print(f"  gang admitted {admitted_after:.1f}s after it was created (the pre-warm's delay)")
    assert report.failed == 0, [c.as_dict() for c in report.chapters]
    assert story.watch.min_ready is not None and story.watch.min_ready >= REPLICAS
    assert story.watch.max_replicas == REPLICAS + DISPLACED, "one surge, by the displaced count"
    assert dep["spec"]["replicas"] == REPLICAS
    assert plan_label_gone(dep)
    outside = await story.on_virtual_node()
    assert len(outside) == DISPLACED, "the displaced replicas serve from the cloud"
    assert await story.live_instances() == len(outside), "no instance leaked"
    reasons = {e["reason"] for e in await story.events("Workload")}
    assert {"PrewarmStarted", "Prewarmed", "PrewarmFinished"} <= reasons, reasons
    reasons = {e["reason"] for e in await story.events("Deployment")}
    assert {"PrewarmStarted", "Prewarmed", "PrewarmRestored"} <= reasons, reasons


async def test_the_plan_grows_when_surge_replicas_take_the_free_gpus_and_never_dips(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
    local_cluster: Any,
) -> None:
    """A second node with GANG_GPUS free: the first plan counts one gang pod there and surges
    only 2, the scheduler puts those 2 surge replicas on the free GPUs, so the gang now displaces
    all 4: the plan grows to 4 before the check turns Ready (planned once, the gang would
    preempt 4 with 2 pre-warmed and the site would drop to 2 ready replicas)."""
    story = await start_story(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
                              companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
                              kueue_paths=kueue_objects, local_cluster=local_cluster,
                              with_check=True)
    assert story.check is not None
    [spare] = await gpu_nodes.create(count=1, gpus=GANG_GPUS)
    try:
        await story.gang()
        wl = await eventually(story.workload, timeout=120, interval=0.3,
                              until=lambda w: condition(w, "Admitted").get("status") == "True",
                              what="Kueue admitting the gang once the check is Ready")
        entry = check_state(wl, story.check)
        assert entry["state"] == "Ready" and "pre-warmed" in entry["message"], entry
        await story.gang_running()
        dep = await story.settled()
        report = await finish_load(story)
    finally:
        await story.stop()
    print_report("the way out, plan grown", report, story.watch)
    grown = [e for e in await story.events("Workload") if e["reason"] == "PrewarmGrown"]
    print("  PrewarmGrown:", *sorted({e["message"] for e in grown}), sep="\n    ")
    assert grown, "the plan grew and said so"
    assert any(e["reason"] == "PrewarmGrown" and f"-> {REPLICAS + DISPLACED}" in e["message"]
               for e in await story.events("Deployment"))
    assert story.watch.max_replicas == REPLICAS + DISPLACED, "grown to what the gang displaces"
    assert story.watch.min_ready is not None and story.watch.min_ready >= REPLICAS, \
        "the gang preempted nothing that was not pre-warmed"
    assert report.failed == 0, [c.as_dict() for c in report.chapters]
    assert dep["spec"]["replicas"] == REPLICAS and plan_label_gone(dep)
    inside = [p for p in await pods(kube, namespace, "inference")
              if p["spec"].get("nodeName") not in (story.system.node_name, None)]
    print(f"  after: {len(inside)} inside ({spare} had {GANG_GPUS} free), "
          f"{len(await story.on_virtual_node())} on the cloud")
    assert await story.live_instances() == len(await story.on_virtual_node()), "no leak"


def plan_label_gone(dep: dict[str, Any]) -> bool:
    return INTENT not in (dep["metadata"].get("labels") or {}) and INTENT not in (
        dep["metadata"].get("annotations") or {})


async def test_the_way_out_without_the_check_reports_its_dip(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
    local_cluster: Any,
) -> None:
    story = await start_story(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
                              companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
                              kueue_paths=kueue_objects, local_cluster=local_cluster,
                              with_check=False)
    try:
        await story.gang()
        await story.gang_running()
        await story.settled()
        report = await finish_load(story)
    finally:
        await story.stop()
    print_report("the way out WITHOUT pre-warm (plain Kueue)", report, story.watch)
    assert story.watch.max_replicas == REPLICAS, "nothing surged without the check"
    assert await story.live_instances() == len(await story.on_virtual_node())


async def test_no_cloud_capacity_times_out_and_the_gang_is_admitted_anyway(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
    local_cluster: Any,
) -> None:
    story = await start_story(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
                              companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
                              kueue_paths=kueue_objects, local_cluster=local_cluster,
                              with_check=True, prewarm={"timeout": "8s"},
                              inventory="H100:us-east:0:2.49", load=False)
    assert story.check is not None
    started = time.monotonic()
    try:
        await story.gang()
        wl = await eventually(story.workload, timeout=90, interval=0.3,
                              until=lambda w: condition(w, "Admitted").get("status") == "True",
                              what="the gang admitted after the pre-warm timed out")
        waited = time.monotonic() - started
        entry = check_state(wl, story.check)
        assert entry["state"] == "Ready" and "timed out" in entry["message"], entry
        await story.gang_running()
        dep = await eventually(lambda: kube.get(story.dep_path), timeout=60, interval=0.3,
                               until=lambda d: d["spec"]["replicas"] == REPLICAS
                               and plan_label_gone(d), what="nothing left surged")
    finally:
        await story.watch.stop()
    print(f"\npre-warm timeout (no cloud capacity): gang admitted after {waited:.1f}s "
          f"(timeout 8s); {entry['message']}")
    assert waited >= 8
    assert story.watch.max_replicas <= REPLICAS + DISPLACED
    assert dep["spec"]["replicas"] == REPLICAS
    timed_out = [e for e in await story.events("Workload") if e["reason"] == "PrewarmTimedOut"]
    assert timed_out and timed_out[0]["type"] == "Warning", timed_out
    message = timed_out[0]["message"]
    assert f"{DISPLACED} surge replica(s) not Ready" in message, message


async def test_kill_minus_nine_during_prewarm_and_after_ready_converges_without_double_surge(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
    local_cluster: Any,
) -> None:
    story = await start_story(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
                              companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
                              kueue_paths=kueue_objects, local_cluster=local_cluster,
                              with_check=True, load=False)

    def phase(dep: dict[str, Any]) -> str | None:
        raw = (dep["metadata"].get("annotations") or {}).get(INTENT)
        return str(json.loads(raw)["phase"]) if raw else None

    try:
        await story.gang()
        await eventually(lambda: kube.get(story.dep_path), timeout=60, interval=0.05,
                         until=lambda d: phase(d) == "Surging", what="a pre-warm recorded")
        story.companion.kill()  # during the pre-warm
        mid = await kube.get(story.dep_path)
        assert phase(mid) == "Surging"
        await asyncio.sleep(2)
        story.companion.start()
        await eventually(lambda: kube.get(story.dep_path), timeout=120, interval=0.05,
                         until=lambda d: phase(d) == "Ready", what="the surge Ready")
        story.companion.kill()  # after Ready, before the scale-back
        after = await kube.get(story.dep_path)
        await asyncio.sleep(3)  # Kueue admits, the scheduler preempts; nobody scales back
        story.companion.start()
        await story.gang_running()
        dep = await story.settled()
    finally:
        await story.watch.stop()
    print(f"\nkill -9 twice: intent after the second kill {phase(after)!r}; "
          f"spec.replicas at most {story.watch.max_replicas}; fewest ready "
          f"{story.watch.min_ready}")
    assert story.watch.max_replicas == REPLICAS + DISPLACED, "never a second surge"
    assert dep["spec"]["replicas"] == REPLICAS and plan_label_gone(dep)
    assert story.watch.min_ready is not None and story.watch.min_ready >= REPLICAS
    outside = await story.on_virtual_node()
    assert len(outside) == DISPLACED
    assert await story.live_instances() == len(outside), "no instance leaked"


async def test_an_admission_check_with_senseless_parameters_is_refused_by_name(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    kueue_objects: list[str], crds: list[str],
) -> None:
    await system.start(clouds=1)
    system.start_companion(kubeconfig=companion_kubeconfig)
    name = f"bad-{uuid.uuid4().hex[:6]}"
    await kube.create(f"{API}/admissionchecks", {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": name},
        "spec": {"controllerName": "vkprovider.io/prewarm",
                 "parameters": {"apiGroup": "vkprovider.io", "kind": "OverflowPolicy",
                                "name": "no-such-policy"}}})
    kueue_objects.append(f"{API}/admissionchecks/{name}")
    ac = await eventually(lambda: kube.get(f"{API}/admissionchecks/{name}"), timeout=60,
                          until=lambda a: condition(a, "Active").get("status") == "False",
                          what="the AdmissionCheck refused")
    active = condition(ac, "Active")
    assert active["reason"] == "InvalidParameters"
    assert active["message"] == ("spec.parameters.name: OverflowPolicy no-such-policy does not "
                                 "exist"), active
    events = await eventually(
        lambda: kube.get("/api/v1/namespaces/default/events",
                         params={"fieldSelector": f"involvedObject.name={name}"}),
        until=lambda b: any(e["reason"] == "PrewarmCheckRefused" for e in b["items"]),
        timeout=30, what="a PrewarmCheckRefused event")
    assert any("spec.parameters.name" in e["message"] for e in events["items"])


async def test_an_outcome_recorded_before_a_crash_is_still_written_to_the_check(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
    local_cluster: Any,
) -> None:
    """Issue 36: the restore records the outcome (Retry) on the intents first and writes the
    check after; a crash between the two left the check Pending: the gang waited a second full
    timeout and Kueue never saw Retry. Here the Deployment carries what that crash leaves (the
    intent Restoring, outcome Retry, the surge already taken back) while Kueue holds the gang's
    quota with the check Pending; the companion started on it writes Retry."""
    story = await start_story(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
                              companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
                              kueue_paths=kueue_objects, local_cluster=local_cluster,
                              with_check=True, load=False)
    assert story.check is not None
    check = story.check
    story.companion.kill()  # "crashed": nobody serves the check while the story is set up
    try:
        await story.gang()
        wl = await eventually(story.workload, timeout=60, interval=0.3,
                              until=lambda w: condition(w, "QuotaReserved").get("status")
                              == "True" and check_state(w, check).get("state") == "Pending",
                              what="the gang holding quota, the check Pending")
        assert wl is not None
        dep = await kube.get(story.dep_path)
        intent = {"workload": f"{namespace}/{wl['metadata']['name']}",
                  "workload_uid": wl["metadata"]["uid"], "check": check,
                  "replicas": REPLICAS, "surge": DISPLACED, "phase": "Restoring",
                  "started": time.time() - 120, "policy": f"pw-{story.tag}",
                  "victims": [], "outcome": "Retry",
                  "message": "timed out after 60s with 4 surge replica(s) not Ready"}
        await kube.patch(story.dep_path, {"metadata": {
            "resourceVersion": dep["metadata"]["resourceVersion"],
            "labels": {INTENT: "true"}, "annotations": {INTENT: json.dumps(intent)}}})
        story.companion.start()
        told = await eventually(
            story.workload, timeout=60, interval=0.2,
            until=lambda w: retry_seen(w, check),
            what="the recorded Retry written to the check (or Kueue evicting on it)")
        await eventually(lambda: kube.get(story.dep_path), timeout=60, interval=0.3,
                         until=plan_label_gone, what="the intent cleared")
    finally:
        await story.watch.stop()
    assert retry_seen(told, check), (check_state(told, check), condition(told, "Evicted"))
    timed_out = [e for e in await story.events("Workload") if e["reason"] == "PrewarmTimedOut"]
    assert timed_out and "retrying later" in timed_out[0]["message"], timed_out

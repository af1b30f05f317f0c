"""Move-back, make-before-break (issue 7), continuing the overflow story on a real cluster.

A watcher samples the Deployment's ready replicas every 200 ms for the whole move: it must never
fall below the desired count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient, NotFoundError
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_overflow import POLICIES, PRIORITY, gpu_deployment, pods, policy

pytestmark = pytest.mark.cluster
INTENT = "vkprovider.io/move-back"
RUN_SECONDS = "vkprovider.io/fake-run-seconds"  # a training pod's run (testing/fakekubelet.py)


class Sampler:
    """A background loop that samples something every 200 ms until stopped.

    ``fresh()`` waits for one sample taken from now on: called right after ``start()`` it
    proves a baseline before the fault, and called before ``stop()`` a sample after the end,
    so the watched window is covered at both ends however fast the swap went (a count such as
    "more than 10 samples" is timing, and failed a suite run on a fast swap)."""

    def __init__(self) -> None:
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def take(self) -> None:
        raise NotImplementedError

    async def _loop(self) -> None:
        while True:
            await self.take()
            self.samples += 1
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def fresh(self) -> None:
        mark = self.samples
        deadline = time.monotonic() + 15
        while self.samples <= mark:
            assert self._task is not None and not self._task.done(), \
                f"{type(self).__name__} stopped sampling: {self._task}"
            assert time.monotonic() < deadline, f"{type(self).__name__} took no sample in 15 s"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class ReadyWatcher(Sampler):
    """Samples status.readyReplicas; remembers the minimum while armed."""

    def __init__(self, kube: KubeClient, path: str) -> None:
        super().__init__()
        self.kube, self.path = kube, path
        self.minimum: int | None = None

    async def take(self) -> None:
        dep = await self.kube.get(self.path)
        ready = int(dep.get("status", {}).get("readyReplicas") or 0)
        self.minimum = ready if self.minimum is None else min(self.minimum, ready)


@pytest_asyncio.fixture
async def objects(cluster_objects: Cluster) -> Cluster:
    return cluster_objects


def moveback_policy(name: str, namespace: str, *,
                    providers: Sequence[str] = ("cloud0", "cloud1"),
                    **move_back: Any) -> dict[str, Any]:
    body = policy(name, namespace=namespace, app="inference", providers=list(providers))
    body["spec"]["moveBack"] = {"enabled": True, "stableFor": "2s", "maxConcurrent": 2,
                                "cooldown": "5s", "timeout": "60s", **move_back}
    return body


async def overflow_then_free(
    *, kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster, replicas: int = 4,
    hpa: bool = False, hpa_max: int | None = None, container: dict[str, Any] | None = None,
    before_preemption: Callable[[], Awaitable[None]] | None = None,
    overflow_after: str = "0s", companion_args: Sequence[str] = (),
    start: Callable[[], Awaitable[None]] | None = None, providers: Sequence[str] = (),
    template: dict[str, Any] | None = None,
    before_freeing: Callable[[], Awaitable[None]] | None = None,
    move_back: dict[str, Any] | None = None,
) -> tuple[list[str], ReadyWatcher]:
    """Inference inside; training preempts it onto the clouds; returns once all serve there and
    the watcher is armed, and only then ends the training (its pods Succeeded, the GPUs free):
    no move can start before the watcher samples, however slow the machine (a fixed training
    time was either idle waiting or, on a loaded machine, a move the watcher partly missed).

    ``container`` adds to the inference container (ports, probes, env) and ``template`` to its
    pod spec; ``before_preemption`` runs once inference is Running inside, before the training
    Job is created; ``before_freeing`` once it serves from the clouds (the watcher armed), before
    the training ends; ``move_back`` adds to the policy's ``moveBack``. ``start`` starts the
    provider and its clouds (``providers``, the policy's) instead of two plain mock clouds; its
    virtual node must carry the pool label."""
    internal = await gpu_nodes.create(count=1, gpus=replicas)
    if start is not None:
        await start()
    else:
        await system.start(clouds=2, node_labels={"vkprovider.io/pool": namespace})
    assert system.provider is not None
    from vkprovider.testing.harness import CompanionProcess

    system.companion = CompanionProcess(work_dir=system.work_dir, kubeconfig=companion_kubeconfig,
                                        node_name=system.node_name, interval=0.5,
                                        move_back_interval=1.0, extra_args=companion_args)
    system.companion.start()
    tag = uuid.uuid4().hex[:6]
    low, high = f"inf-{tag}", f"train-{tag}"
    for name, value in ((low, 100), (high, 1000)):
        await objects.create(PRIORITY, {"apiVersion": "scheduling.k8s.io/v1",
                                        "kind": "PriorityClass", "metadata": {"name": name},
                                        "value": value})
    body = moveback_policy(f"mb-{tag}", namespace, **({"providers": providers} if providers
                                                       else {}), **(move_back or {}))
    body["spec"]["overflowAfter"] = overflow_after
    await objects.create(POLICIES, body)
    deployment = gpu_deployment("inference", replicas=replicas, pool=namespace,
                                priority_class=low)
    deployment["spec"]["template"]["spec"]["containers"][0].update(container or {})
    deployment["spec"]["template"]["spec"].update(template or {})
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
    if hpa:
        await kube.create(f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers", {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "inference"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "inference"},
                     "minReplicas": replicas, "maxReplicas": hpa_max or replicas * 3,
                     "metrics": [{"type": "Resource", "resource": {
                         "name": "cpu", "target": {"type": "Utilization",
                                                   "averageUtilization": 80}}}]}})
    await eventually(lambda: pods(kube, namespace, "inference"),
                     until=lambda ps: len(ps) == replicas and all(
                         p["status"].get("phase") == "Running" for p in ps),
                     timeout=90, what="inference Running inside")
    if before_preemption is not None:
        await before_preemption()
    await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "training"},
        "spec": {"parallelism": replicas, "completions": replicas, "backoffLimit": 0,
                 "template": {"metadata": {"labels": {"app": "training"}, "annotations": {
                     RUN_SECONDS: "600"}},
                              "spec": {"restartPolicy": "Never", "priorityClassName": high,
                                       "nodeSelector": {"vkprovider.io/pool": namespace},
                                       "containers": [{"name": "t", "image": "trainer:1",
                                                       "resources": {"limits": {
                                                           "nvidia.com/gpu": "1"}}}]}}}})
    await eventually(lambda: pods(kube, namespace, "inference"),
                     until=lambda ps: len(ps) == replicas and all(
                         p["spec"].get("nodeName") == system.node_name
                         and p["status"].get("phase") == "Running" for p in ps),
                     timeout=120, what="inference serving from the clouds")
    # The baseline for "never below N" is the Deployment reporting N ready: its status can lag
    # the pods by seconds when the controller-manager is busy, and a stale 0 is not a dip.
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    await eventually(lambda: kube.get(dep_path), timeout=60,
                     until=lambda d: int(d.get("status", {}).get("readyReplicas") or 0)
                     == replicas, what=f"the Deployment reporting {replicas} ready")
    watcher = ReadyWatcher(kube, dep_path)
    watcher.start()
    await watcher.fresh()
    if before_freeing is not None:
        await before_freeing()
    assert INTENT not in ((await kube.get(dep_path))["metadata"].get("annotations") or {}), \
        "a move started before the training ended"
    training = await eventually(lambda: pods(kube, namespace, "training"), timeout=60,
                                until=lambda ps: len(ps) == replicas,
                                what=f"the Job's {replicas} training pods")
    for p in training:  # the training ends: the fake kubelet
        await kube.patch(f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}",
                         {"metadata": {"annotations": {RUN_SECONDS: "0"}}})  # reads it again
    return internal, watcher


async def live_instances(system: System) -> int:
    ledgers = [await c.ledger() for c in system.clouds]
    return sum(1 for led in ledgers for e in led if e["state"] != "deleted")


async def test_training_ends_and_every_replica_comes_home_without_a_dip(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    internal, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects)
    try:
        home = await eventually(
            lambda: pods(kube, namespace, "inference"),
            until=lambda ps: len(ps) == 4 and all(
                p["spec"].get("nodeName") in internal and p["status"].get("phase") == "Running"
                for p in ps),
            timeout=180, interval=0.5, what="every replica back inside")
        await watcher.fresh()
    finally:
        await watcher.stop()
    assert watcher.minimum is not None and watcher.minimum >= 4, \
        f"ready replicas dipped to {watcher.minimum}"
    assert all(not (p["metadata"].get("annotations") or {}).get(
        "controller.kubernetes.io/pod-deletion-cost") for p in home)
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=60,
                     what="every cloud instance deleted")
    dep = await eventually(
        lambda: kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"),
        until=lambda d: INTENT not in (d["metadata"].get("annotations") or {}), timeout=60,
        what="the last move's intent cleared")
    assert dep["spec"]["replicas"] == 4
    pol = await eventually(lambda: kube.get(f"{POLICIES}/{objects.paths[-1].rsplit('/', 1)[1]}"),
                           until=lambda p: (p.get("status") or {}).get("externalPods") == 0,
                           timeout=30, what="policy status back to 0 external pods")
    assert pol["status"]["pricePerHour"] == 0
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events", params={
        "fieldSelector": "involvedObject.kind=Deployment"}))["items"]
    assert sum(1 for e in events if e["reason"] == "MovedBack") >= 1
    # each move is in the policy's status.lastDecisions, next to the admissions
    pol = await eventually(lambda: kube.get(f"{POLICIES}/{policy_name(objects)}"), timeout=30,
                           until=lambda p: moved_back(p) >= 1,
                           what="MovedBack in status.lastDecisions")
    made = pol["status"]["lastDecisions"]
    assert len(made) <= 20
    assert {"Admitted", "MovedBack"} <= {d["decision"] for d in made}
    moved = next(d for d in made if d["decision"] == "MovedBack")
    assert moved["pod"].startswith(f"{namespace}/inference-")
    assert moved["reason"].startswith(f"{namespace}/inference: ")


def policy_name(objects: Cluster) -> str:
    return next(p for p in reversed(objects.paths) if p.startswith(POLICIES)).rsplit("/", 1)[1]


def moved_back(policy_obj: dict[str, Any]) -> int:
    return sum(1 for d in (policy_obj.get("status") or {}).get("lastDecisions") or []
               if d["decision"] in ("MovedBack", "MoveBackFailed"))


async def test_with_an_hpa_min_replicas_is_raised_for_the_surge_and_restored(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    internal, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects, replicas=2, hpa=True)
    hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/inference"
    raised: list[int] = []

    async def sample_hpa() -> list[dict[str, Any]]:
        raised.append(int((await kube.get(hpa_path))["spec"]["minReplicas"]))
        return await pods(kube, namespace, "inference")

    try:
        await eventually(sample_hpa, until=lambda ps: len(ps) == 2 and all(
            p["spec"].get("nodeName") in internal and p["status"].get("phase") == "Running"
            for p in ps), timeout=180, interval=0.3, what="both replicas back inside")
    finally:
        await watcher.stop()
    assert max(raised) == 3, f"the surge goes through the HPA's minReplicas (saw {set(raised)})"
    await eventually(lambda: kube.get(hpa_path), until=lambda h: h["spec"]["minReplicas"] == 2,
                     timeout=30, what="minReplicas restored")
    assert watcher.minimum is not None and watcher.minimum >= 2


async def test_capacity_vanishing_mid_move_rolls_back_without_a_dip(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    internal, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects, replicas=2)
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    # New pods on the internal node start only after 60 s: the surge pod stays not ready.
    await kube.patch(f"/api/v1/nodes/{internal[0]}", {"metadata": {"annotations": {
        "vkprovider.io/fake-start-delay": "60"}}})
    try:
        await eventually(lambda: kube.get(dep_path),
                         until=lambda d: INTENT in (d["metadata"].get("annotations") or {}),
                         timeout=120, interval=0.1, what="a move in flight")
        await kube.patch(f"/api/v1/nodes/{internal[0]}", {"spec": {"taints": [
            {"key": "maintenance", "value": "now", "effect": "NoExecute"}]}})
        await eventually(lambda: kube.get(dep_path),
                         until=lambda d: INTENT not in (d["metadata"].get("annotations") or {}),
                         timeout=120, interval=0.2, what="the move finished")
    finally:
        await watcher.stop()
    assert watcher.minimum is not None and watcher.minimum >= 2
    dep = await kube.get(dep_path)
    assert dep["spec"]["replicas"] == 2
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events", params={
        "fieldSelector": "involvedObject.kind=Deployment"}))["items"]
    reasons = {e["reason"] for e in events}
    assert {"MoveBackStarted", "MoveBackFailed"} <= reasons
    failed = next(e for e in events if e["reason"] == "MoveBackFailed")
    assert "capacity vanished" in failed["message"]
    ps = await eventually(lambda: pods(kube, namespace, "inference"),
                          until=lambda ps: len(ps) == 2, timeout=30, what="back to 2 pods")
    assert all(p["status"].get("phase") == "Running" for p in ps)
    assert all(p["spec"]["nodeName"] == system.node_name for p in ps), "the cloud pods stay"
    assert not any((p["metadata"].get("annotations") or {}).get(
        "controller.kubernetes.io/pod-deletion-cost") for p in ps), "unmarked after rollback"


async def test_kill_9_of_the_companion_mid_move_then_restart_loses_no_replica(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    internal, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects, replicas=2)
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    assert system.companion is not None
    try:
        await eventually(lambda: kube.get(dep_path),
                         until=lambda d: INTENT in (d["metadata"].get("annotations") or {}),
                         timeout=120, interval=0.05, what="a move in flight")
        system.companion.kill()
        await asyncio.sleep(2)
        system.companion.start()
        await eventually(lambda: pods(kube, namespace, "inference"),
                         until=lambda ps: len(ps) == 2 and all(
                             p["spec"].get("nodeName") in internal
                             and p["status"].get("phase") == "Running" for p in ps),
                         timeout=180, interval=0.5, what="both replicas back inside")
    finally:
        await watcher.stop()
    assert watcher.minimum is not None and watcher.minimum >= 2
    dep = await eventually(lambda: kube.get(dep_path),
                           until=lambda d: INTENT not in (d["metadata"].get("annotations") or {}),
                           timeout=60, what="no intent left behind")
    assert dep["spec"]["replicas"] == 2
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=60,
                     what="every cloud instance deleted")
    # the admissions made by the killed process are still in the policy's status, next to the
    # moves the restarted one finished (it read the list back instead of starting empty)
    pol = await eventually(lambda: kube.get(f"{POLICIES}/{policy_name(objects)}"), timeout=30,
                           until=lambda p: moved_back(p) >= 1,
                           what="the finished moves in status.lastDecisions")
    assert "Admitted" in {d["decision"] for d in pol["status"]["lastDecisions"]}, \
        "decisions recorded before the kill were lost"


async def deployment_events(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{namespace}/events",
                          params={"fieldSelector": "involvedObject.kind=Deployment"})
    return list(body["items"])


async def test_an_hpa_at_max_replicas_is_skipped_saying_why_not_moved_over_and_over(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    """Issue 36: an HPA at maxReplicas (likely exactly while overflowing) refuses minReplicas
    N+1 with 422. The move used to die after writing its intent and the deletion cost, and the
    next pass started another over it, forever. It is skipped with a Warning instead."""
    _internal, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects, replicas=2, hpa=True,
        hpa_max=2)
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/inference"
    try:
        events = await eventually(
            lambda: deployment_events(kube, namespace), timeout=120, interval=0.5,
            until=lambda ev: any(e["reason"] == "MoveBackSkipped" for e in ev),
            what="a MoveBackSkipped Warning on the Deployment")
    finally:
        await watcher.stop()
    skipped = next(e for e in events if e["reason"] == "MoveBackSkipped")
    assert skipped["type"] == "Warning"
    assert "maxReplicas 2" in skipped["message"] and "inference" in skipped["message"], skipped
    assert not [e for e in events if e["reason"] == "MoveBackStarted"], "no move was started"
    dep = await kube.get(dep_path)
    assert INTENT not in (dep["metadata"].get("annotations") or {})
    assert dep["spec"]["replicas"] == 2
    assert (await kube.get(hpa_path))["spec"]["minReplicas"] == 2
    ps = await pods(kube, namespace, "inference")
    assert not any((p["metadata"].get("annotations") or {}).get(
        "controller.kubernetes.io/pod-deletion-cost") for p in ps), "no pod marked for nothing"
    assert watcher.minimum is not None and watcher.minimum >= 2


async def test_a_recorded_move_with_no_live_task_is_finished_keeping_a_scale_made_meanwhile(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    """Issue 36: an intent whose task died (an API error after the surge) used to stay for good
    while the companion ran: a restart was the only thing that finished it, and scaling back to
    the recorded N reverted whatever happened meanwhile. Here a move's intent is left as such a
    task leaves it (surged 2 -> 3), and someone scaled to 5 meanwhile: the running companion
    finishes it at its next pass, taking back only its own replica (5 -> 4)."""
    await gpu_nodes.create(count=1, gpus=4)
    await system.start(clouds=1, node_labels={"vkprovider.io/pool": namespace})
    system.start_companion(kubeconfig=companion_kubeconfig)
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=2, pool=namespace))
    ps = await eventually(lambda: pods(kube, namespace, "inference"), timeout=90,
                          until=lambda ps: len(ps) == 2 and all(
                              p["status"].get("phase") == "Running" for p in ps),
                          what="2 replicas Running")
    kept = ps[0]["metadata"]
    # The companion is past its start-up (which finished recorded moves even before): its loops
    # run, the admission loop wrote a policy's status; then a few move-back passes go by.
    name = f"mb-{uuid.uuid4().hex[:6]}"
    await objects.create(POLICIES, moveback_policy(name, namespace))
    await eventually(lambda: kube.get(f"{POLICIES}/{name}"), timeout=60,
                     until=lambda p: bool((p.get("status") or {}).get("conditions")),
                     what="the companion's loops running")
    await asyncio.sleep(3)
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    intent = {"pod": kept["name"], "pod_uid": kept["uid"], "replicas": 2,
              "started": time.time(), "policy": "gone"}
    await kube.patch(dep_path, {"metadata": {"annotations": {INTENT: json.dumps(intent)}},
                                "spec": {"replicas": 5}})
    dep = await eventually(lambda: kube.get(dep_path), timeout=60, interval=0.3,
                           until=lambda d: INTENT not in (d["metadata"].get("annotations") or {}),
                           what="the orphaned intent finished")
    assert dep["spec"]["replicas"] == 4, "only the move's own surge replica is taken back"
    events = await eventually(
        lambda: deployment_events(kube, namespace), timeout=30,
        until=lambda ev: any(e["reason"] in ("MovedBack", "MoveBackFailed") for e in ev),
        what="the finished move's outcome")
    failed = [e for e in events if e["reason"] == "MoveBackFailed"]
    assert failed and kept["name"] in failed[0]["message"], events  # the pod stayed: rolled back
    pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{kept['name']}")
    assert pod["metadata"]["uid"] == kept["uid"] and not pod["metadata"].get("deletionTimestamp")


START_DELAY = "vkprovider.io/fake-start-delay"  # testing/fakekubelet.py: a pod's start, held


async def scale_during_a_live_move(
    *, kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster, to: int,
    move_back: dict[str, Any] | None = None,
) -> tuple[list[str], ReadyWatcher, dict[str, Any]]:
    """Four replicas overflowed to the clouds come home; while the first move is live (its
    intent recorded, the surge 4 -> 5 written, the surge pod held not Ready by a start delay on
    the internal node for 20 s) the user scales the Deployment to ``to`` through the scale
    subresource, as ``kubectl scale`` does. Returns the internal nodes, the armed watcher and
    that move's intent.
    """
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    internal: list[str] = []

    async def before_freeing() -> None:  # the GPUs are not free yet: no move has started
        internal.extend(gpu_nodes.created)
        await kube.patch(f"/api/v1/nodes/{internal[0]}",
                         {"metadata": {"annotations": {START_DELAY: "20"}}})

    _, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects, replicas=4,
        before_freeing=before_freeing, move_back=move_back)
    try:
        dep = await eventually(
            lambda: kube.get(dep_path), timeout=120, interval=0.1,
            until=lambda d: INTENT in (d["metadata"].get("annotations") or {})
            and d["spec"]["replicas"] == 5, what="a live move: its intent and the surge 4 -> 5")
        intent = json.loads(dep["metadata"]["annotations"][INTENT])
        assert intent["replicas"] == 4, intent
        surge_pods = [p for p in await pods(kube, namespace, "inference")
                      if p["spec"].get("nodeName") in internal]
        assert not any(c["type"] == "Ready" and c["status"] == "True"
                       for p in surge_pods for c in p["status"].get("conditions") or []), \
            "the surge pod is still held not Ready: the move is live"
        # kubectl scale --replicas=N: a merge patch of the scale subresource, no precondition
        await kube.patch(f"{dep_path}/scale", {"spec": {"replicas": to}})
        await kube.patch(f"/api/v1/nodes/{internal[0]}",  # the later moves need no window
                         {"metadata": {"annotations": {START_DELAY: None}}})
    except BaseException:
        await watcher.stop()
        raise
    return internal, watcher, intent


async def settled_home(kube: KubeClient, namespace: str, *, virtual: str,
                       ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Deployment once every move is over and each of its replicas runs inside."""
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"

    async def read() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        ps = await pods(kube, namespace, "inference")
        return await kube.get(dep_path), ps

    return await eventually(
        read, timeout=240, interval=0.5, what="no move left and every replica home",
        until=lambda r: INTENT not in (r[0]["metadata"].get("annotations") or {})
        and len(r[1]) == r[0]["spec"]["replicas"] and all(
            p["spec"].get("nodeName") not in (None, virtual)
            and p["status"].get("phase") == "Running" for p in r[1]))


async def assert_moved_pod_gone(kube: KubeClient, namespace: str,
                                intent: dict[str, Any]) -> None:
    try:
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{intent['pod']}")
    except NotFoundError:
        return
    assert pod["metadata"]["uid"] != intent["pod_uid"] or pod["metadata"].get(
        "deletionTimestamp"), f"the moved cloud pod {intent['pod']} is still there"


async def test_kubectl_scale_up_during_a_live_move_is_kept(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    """Issue 36: the scale-back used to write the recorded N (4) over a ``kubectl scale`` made
    while the move was live. The user adds two replicas to what they read (the surged 5 -> 7,
    4 -> 6 in their own count): the move takes back only its surge replica, and 6 stay."""
    _, watcher, intent = await scale_during_a_live_move(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects, to=7)
    try:
        # Room inside for all six, so every replica, the moved one among them, comes home.
        await gpu_nodes.create(count=1, gpus=2)
        dep, home = await settled_home(kube, namespace, virtual=system.node_name)
        await watcher.fresh()
    finally:
        await watcher.stop()
    assert dep["spec"]["replicas"] == 6, \
        f"the user's two replicas were taken back: {dep['spec']['replicas']} left, not 6"
    assert len(home) == 6
    await assert_moved_pod_gone(kube, namespace, intent)
    assert watcher.minimum is not None and watcher.minimum >= 4, \
        f"ready replicas dipped to {watcher.minimum}"
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=60,
                     what="every cloud instance deleted")


async def test_kubectl_scale_down_during_a_live_move_is_kept(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, objects: Cluster,
) -> None:
    """Issue 36: a ``kubectl scale`` down to 3 while a move of a 4-replica Deployment is live
    (surged to 5) stays 3: the scale-back finds nothing of its own left to take back, instead of
    writing 4. The ReplicaSet drops the not-ready surge pod and the marked cloud pod; the move
    ends at its timeout (short here) with the cloud pod gone."""
    _, watcher, intent = await scale_during_a_live_move(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects, to=3,
        move_back={"timeout": "20s"})
    try:
        dep, home = await settled_home(kube, namespace, virtual=system.node_name)
        await watcher.fresh()
    finally:
        await watcher.stop()
    assert dep["spec"]["replicas"] == 3, \
        f"the user's scale-down was reverted: {dep['spec']['replicas']} replicas, not 3"
    assert len(home) == 3
    await assert_moved_pod_gone(kube, namespace, intent)
    assert watcher.minimum is not None and watcher.minimum >= 3, \
        f"ready replicas dipped to {watcher.minimum} under the user's 3"
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=60,
                     what="every cloud instance deleted")

"""A hot cloud GPU is replaced make-before-break (issue 15 item 2, the cloud part).

Two replicas serve from the mock cloud under a policy with ``gpuHealth``; one instance's GPUs are
pinned at 90 °C. The provider marks its pod ``vkprovider.io/GPUHealthy=False`` after
``sustainedFor`` (2 s; GPU figures read every second), the companion surges the Deployment, waits
for the new replica to be Ready and scales back with the hot pod at the lowest deletion cost. A
watcher samples ready replicas every 200 ms: never below 2. The hot instance is deleted and
nothing leaks.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.testing.harness import CompanionProcess, MockCloudProcess, ProviderProcess
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_moveback import ReadyWatcher, live_instances
from .test_overflow import POLICIES, gpu_deployment, pods, policy
from .test_pods import pod_spec

pytestmark = pytest.mark.cluster
INTENT = "vkprovider.io/hot-swap"
CONDITION = "vkprovider.io/GPUHealthy"


@pytest_asyncio.fixture
async def objects(cluster_objects: Cluster) -> Cluster:
    return cluster_objects


async def start(system: System, namespace: str, companion_kubeconfig: Path, *,
                inventory: str = "H100:us-east:64:2.49,H100:eu-west:64:2.19",
                offers: list[dict[str, Any]] | None = None,
                pods: dict[str, Any] | None = None,
                kubelet_api: dict[str, Any] | None = None,
                companion: bool = True) -> MockCloudProcess:
    """One mock cloud (``offers``, when given, replace its inventory before the provider reads
    it), the provider (by default reading GPU figures every second) and the companion (unless
    ``companion`` is False)."""
    cloud = MockCloudProcess(work_dir=system.work_dir, name="cloud0", boot_delay=0.3,
                             inventory=inventory, address_map_dir=system.network, public_block=0)
    await cloud.start()
    system.clouds.append(cloud)
    if offers is not None:
        await cloud.admin("PUT", "/admin/inventory", json={"offers": offers})
    lab = {"probe_address_map": str(system.network)} if system.network else {}
    system.provider = ProviderProcess(
        work_dir=system.work_dir, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=system.clouds, pods={**lab, **(pods or {})},
        node={"labels": {"vkprovider.io/pool": namespace}}, client_ca_file=system.client_ca,
        kubelet_api=kubelet_api if kubelet_api is not None else {
            "gpu_metrics_interval_seconds": 1})
    system.provider.start()
    if not companion:
        return cloud
    system.companion = CompanionProcess(work_dir=system.work_dir, kubeconfig=companion_kubeconfig,
                                        node_name=system.node_name, interval=0.5,
                                        move_back_interval=1.0)
    system.companion.start()
    return cloud


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    """The pod's condition of that type ({} when it has none)."""
    status = pod.get("status") or {}
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


async def two_replicas_on_the_cloud(
        kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
        objects: Cluster) -> tuple[MockCloudProcess, str, list[dict[str, Any]]]:
    """The provider and companion, a policy with ``gpuHealth`` (82 °C for 2 s), and a
    Deployment of two replicas serving from the cloud and reported Ready; returns the cloud,
    the Deployment's path and its pods."""
    cloud = await start(system, namespace, companion_kubeconfig)
    body = policy(f"hot-{uuid.uuid4().hex[:6]}", namespace=namespace, app="inference",
                  providers=["cloud0"])
    body["spec"]["gpuHealth"] = {"maxTemperatureCelsius": 82, "sustainedFor": "2s"}
    body["spec"]["moveBack"] = {"timeout": "90s", "cooldown": "5s"}
    await objects.create(POLICIES, body)
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=2, pool=namespace))
    first = await eventually(lambda: pods(kube, namespace, "inference"),
                             until=lambda ps: len(ps) == 2 and all(
                                 p["spec"].get("nodeName") == system.node_name
                                 and p["status"].get("phase") == "Running" for p in ps),
                             timeout=120, what="both replicas serving from the cloud")
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    await eventually(lambda: kube.get(dep_path), timeout=60,
                     until=lambda d: int(d.get("status", {}).get("readyReplicas") or 0) == 2,
                     what="the Deployment reporting 2 ready")
    return cloud, dep_path, first


async def test_a_hot_cloud_gpu_is_replaced_before_it_is_removed(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    objects: Cluster,
) -> None:
    cloud, dep_path, first = await two_replicas_on_the_cloud(
        kube, namespace, system, companion_kubeconfig, objects)
    assert all(condition(p, CONDITION).get("status") != "False" for p in first)
    hot = first[0]
    hot_name = hot["metadata"]["name"]
    hot_instance = hot["metadata"]["annotations"]["vkprovider.io/instance-id"]
    watcher = ReadyWatcher(kube, dep_path)
    watcher.start()
    await watcher.fresh()
    try:
        await cloud.admin("POST", f"/admin/instances/{hot_instance}/temperature",
                          json={"celsius": 90})
        marked = await eventually(
            lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{hot_name}"),
            until=lambda p: condition(p, CONDITION).get("status") == "False",
            timeout=60, interval=0.3, what="the hot pod marked GPUHealthy=False")
        cond = condition(marked, CONDITION)
        assert cond.get("reason") == "GPUTooHot"
        assert "90 °C" in str(cond.get("message")) and "82 °C" in str(cond.get("message"))
        after = await eventually(
            lambda: pods(kube, namespace, "inference"),
            until=lambda ps: len(ps) == 2 and hot_name not in {p["metadata"]["name"] for p in ps}
            and all(p["status"].get("phase") == "Running" for p in ps),
            timeout=150, interval=0.5, what="the hot replica replaced")
        dep = await eventually(lambda: kube.get(dep_path), timeout=60,
                               until=lambda d: INTENT not in (d["metadata"].get("annotations")
                                                              or {})
                               and int(d.get("status", {}).get("readyReplicas") or 0) == 2,
                               what="the swap finished, 2 ready")
        await watcher.fresh()
    finally:
        await watcher.stop()
    assert watcher.minimum is not None and watcher.minimum >= 2, \
        f"ready replicas dipped to {watcher.minimum}"
    assert dep["spec"]["replicas"] == 2
    assert all(p["spec"]["nodeName"] == system.node_name for p in after)
    # the hot instance is gone; one instance per replica again
    await eventually(cloud.ledger, timeout=60, what="the hot instance deleted",
                     until=lambda led: any(e["id"] == hot_instance and e["state"] == "deleted"
                                           for e in led))
    await eventually(lambda: live_instances(system), until=lambda n: n == 2, timeout=60,
                     what="one instance per replica")
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    reasons = {(e["involvedObject"]["kind"], e["reason"]) for e in events}
    assert {("Pod", "GPUTooHot"), ("Deployment", "ReplacingHotReplica"),
            ("Deployment", "ReplacedHotReplica")} <= reasons, reasons
    # nothing leaks: the Deployment gone, every instance is deleted
    await kube.delete(dep_path)
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=90,
                     what="every cloud instance deleted")


async def test_a_restarted_provider_keeps_a_hot_pod_marked_until_its_gpu_reads_cool(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    objects: Cluster,
) -> None:
    """Issue 35 item 8: the provider marks a hot pod, restarts while that GPU is still hot, and
    must not unmark it (its tracker starts empty, but the pod's condition says hot). A second
    pod that heats only after the restart is the witness that the restarted provider has read
    and judged GPU figures for a whole window; the first pod's condition is then still the one
    written before the restart. A cool reading unmarks it."""
    cloud = await start(system, namespace, companion_kubeconfig, companion=False)
    name = f"hot-{uuid.uuid4().hex[:6]}"
    body = policy(name, namespace=namespace, app="inference", providers=["cloud0"])
    body["spec"]["gpuHealth"] = {"maxTemperatureCelsius": 82, "sustainedFor": "2s"}
    await objects.create(POLICIES, body)
    path = f"/api/v1/namespaces/{namespace}/pods"
    for pod_name in ("hot", "witness"):
        await kube.create(path, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": {"app": "inference"},
                         "annotations": {"vkprovider.io/gpu-type": "H100",
                                         "vkprovider.io/overflow-policy": name}},
            "spec": pod_spec(system.node_name)})
    running = await eventually(lambda: pods(kube, namespace, "inference"),
                               until=lambda ps: len(ps) == 2 and all(
                                   p["status"].get("phase") == "Running"
                                   and "vkprovider.io/instance-id" in p["metadata"]["annotations"]
                                   for p in ps),
                               timeout=120, what="both pods running on the cloud")
    instance = {p["metadata"]["name"]: p["metadata"]["annotations"]["vkprovider.io/instance-id"]
                for p in running}
    await cloud.admin("POST", f"/admin/instances/{instance['hot']}/temperature",
                      json={"celsius": 90})
    marked = await eventually(lambda: kube.get(f"{path}/hot"),
                              until=lambda p: condition(p, CONDITION).get("status") == "False",
                              timeout=60, interval=0.3, what="the hot pod marked")
    before = condition(marked, CONDITION)

    assert system.provider is not None
    system.provider.stop()
    system.provider.start()
    await cloud.admin("POST", f"/admin/instances/{instance['witness']}/temperature",
                      json={"celsius": 90})
    await eventually(lambda: kube.get(f"{path}/witness"),
                     until=lambda p: condition(p, CONDITION).get("status") == "False",
                     timeout=90, interval=0.3, what="the restarted provider marking the witness")
    # the restarted provider has judged a whole window of readings: the hot pod's condition is
    # the one written before the restart (not unmarked, not unmarked and marked again)
    assert condition(await kube.get(f"{path}/hot"), CONDITION) == before

    await cloud.admin("POST", f"/admin/instances/{instance['hot']}/temperature",
                      json={"celsius": 60})
    await eventually(lambda: kube.get(f"{path}/hot"),
                     until=lambda p: condition(p, CONDITION).get("status") == "True",
                     timeout=60, interval=0.3, what="the cooled pod unmarked")
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events", params={
        "fieldSelector": "involvedObject.name=hot,reason=GPUTooHot"}))["items"]
    assert sum(int(e.get("count") or 1) for e in events) == 1  # told once, before the restart


async def test_kubectl_scale_up_during_a_live_hot_swap_is_kept(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    objects: Cluster,
) -> None:
    """Issue 36: a swap's scale-back takes back its own surge relative to the count it finds,
    so a ``kubectl scale`` made while the swap is live stays. Two replicas serve from the cloud;
    one GPU runs hot; the companion surges 2 -> 3 and the new instance is held booting (the
    cloud's boot delay raised to 15 s before it is created); meanwhile the user scales what they
    read (3) to 4 through the scale subresource. The swap ends with the hot pod gone and 3
    replicas (the user's +1 kept, only the surge taken back), never fewer than 2 ready."""
    cloud, dep_path, first = await two_replicas_on_the_cloud(
        kube, namespace, system, companion_kubeconfig, objects)
    hot = first[0]
    hot_name, hot_uid = hot["metadata"]["name"], hot["metadata"]["uid"]
    hot_instance = hot["metadata"]["annotations"]["vkprovider.io/instance-id"]
    await cloud.admin("PATCH", "/admin/config", json={"boot_delay": 15.0})
    watcher = ReadyWatcher(kube, dep_path)
    watcher.start()
    await watcher.fresh()
    try:
        await cloud.admin("POST", f"/admin/instances/{hot_instance}/temperature",
                          json={"celsius": 90})
        live = await eventually(
            lambda: kube.get(dep_path), timeout=90, interval=0.1,
            until=lambda d: INTENT in (d["metadata"].get("annotations") or {})
            and d["spec"]["replicas"] == 3, what="a live swap: its intent and the surge 2 -> 3")
        assert int(live.get("status", {}).get("readyReplicas") or 0) <= 2, \
            "the surge replica is still booting: the swap is live"
        # kubectl scale --replicas=4: a merge patch of the scale subresource, no precondition
        await kube.patch(f"{dep_path}/scale", {"spec": {"replicas": 4}})
        await cloud.admin("PATCH", "/admin/config", json={"boot_delay": 0.3})
        dep = await eventually(
            lambda: kube.get(dep_path), timeout=150, interval=0.5,
            until=lambda d: INTENT not in (d["metadata"].get("annotations") or {})
            and int(d.get("status", {}).get("readyReplicas") or 0) == d["spec"]["replicas"],
            what="the swap finished and every replica ready")
        after = await eventually(
            lambda: pods(kube, namespace, "inference"),
            until=lambda ps: len(ps) == dep["spec"]["replicas"]
            and all(p["status"].get("phase") == "Running" for p in ps),
            timeout=60, what="the ReplicaSet settled")
        await watcher.fresh()
    finally:
        await watcher.stop()
    assert dep["spec"]["replicas"] == 3, \
        f"the user's scale-up was taken back: {dep['spec']['replicas']} replicas, not 3"
    assert hot_uid not in {p["metadata"]["uid"] for p in after}, \
        f"the hot pod {hot_name} is still there: the ReplicaSet removed another one"
    assert watcher.minimum is not None and watcher.minimum >= 2, \
        f"ready replicas dipped to {watcher.minimum}"
    reasons = {e["reason"] for e in (await kube.get(
        f"/api/v1/namespaces/{namespace}/events"))["items"]
        if e["involvedObject"]["kind"] == "Deployment"}
    assert "ReplacedHotReplica" in reasons, reasons
    await kube.delete(dep_path)
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=90,
                     what="every cloud instance deleted")

"""Overflow by policy: who may burst, to which clouds, within which budget (issue 6).

Real control plane, simulated internal GPU nodes, two mock clouds, the provider and the companion
as processes with the RBAC from manifests/.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System

pytestmark = pytest.mark.cluster

TAINT_KEY = "virtual-kubelet.io/provider"


def policy(name: str, *, namespace: str, app: str, providers: list[str],
           limits: dict[str, Any] | None = None, min_priority: int | None = None
           ) -> dict[str, Any]:
    selector: dict[str, Any] = {"namespaces": [namespace],
                                "podSelector": {"matchLabels": {"app": app}}}
    if min_priority is not None:
        selector["minPriority"] = min_priority
    return {"apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
            "metadata": {"name": name},
            "spec": {"selector": selector, "providers": providers,
                     "limits": limits or {}, "overflowAfter": "0s"}}


def gpu_deployment(name: str, *, replicas: int, pool: str, priority_class: str | None = None,
                   gpu_type: str = "H100") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "server", "image": f"example.com/{name}:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "nodeSelector": {"vkprovider.io/pool": pool},
        "terminationGracePeriodSeconds": 1,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name},
                                               "annotations": {"vkprovider.io/gpu-type": gpu_type}},
                                  "spec": spec}}}


async def pods(kube: KubeClient, ns: str, app: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"app={app}"})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def tolerates(pod: dict[str, Any]) -> bool:
    return any(t.get("key") == TAINT_KEY for t in pod["spec"].get("tolerations") or [])


async def reasons(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/events",
                          params={"fieldSelector": f"involvedObject.name={name}"})
    return list(body["items"])


POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """The ``kind`` condition in an object's status ({} if absent)."""
    return next((dict(c) for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})
PRIORITY = "/apis/scheduling.k8s.io/v1/priorityclasses"


async def start(system: System, namespace: str, companion_kubeconfig: Path,
                inventories: list[str] | None = None) -> None:
    await system.start(clouds=2, node_labels={"vkprovider.io/pool": namespace},
                       inventories=inventories)
    system.start_companion(kubeconfig=companion_kubeconfig)


async def test_training_preempts_inference_which_overflows_to_the_clouds(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster,
) -> None:
    internal = await gpu_nodes.create(count=2, gpus=4)
    await start(system, namespace, companion_kubeconfig)
    tag = uuid.uuid4().hex[:6]
    low, high = f"inference-{tag}", f"training-{tag}"
    await cluster_objects.create(PRIORITY, {"apiVersion": "scheduling.k8s.io/v1",
                                            "kind": "PriorityClass", "metadata": {"name": low},
                                            "value": 100})
    await cluster_objects.create(PRIORITY, {"apiVersion": "scheduling.k8s.io/v1",
                                            "kind": "PriorityClass", "metadata": {"name": high},
                                            "value": 1000})
    await cluster_objects.create(POLICIES, policy(f"burst-{tag}", namespace=namespace,
                                                  app="inference", providers=["cloud0", "cloud1"],
                                                  limits={"maxPods": 20, "maxGPUs": 20}))
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=8, pool=namespace,
                                     priority_class=low))
    inside = await eventually(
        lambda: pods(kube, namespace, "inference"),
        until=lambda ps: len(ps) == 8 and all(p["status"].get("phase") == "Running" for p in ps),
        timeout=90, what="8 inference replicas Running inside")
    assert {p["spec"]["nodeName"] for p in inside} <= set(internal)
    assert not any(tolerates(p) for p in inside), "internal first: nothing admitted while it fits"

    await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "training"},
        "spec": {"parallelism": 8, "completions": 8, "backoffLimit": 0,
                 "template": {"metadata": {"labels": {"app": "training"}},
                              "spec": {"restartPolicy": "Never", "priorityClassName": high,
                                       "nodeSelector": {"vkprovider.io/pool": namespace},
                                       "containers": [{"name": "train", "image": "trainer:1",
                                                       "resources": {"limits": {
                                                           "nvidia.com/gpu": "1"}}}]}}}})

    def overflowed(ps: list[dict[str, Any]]) -> bool:
        out = [p for p in ps if p["spec"].get("nodeName") == system.node_name
               and p["status"].get("phase") == "Running"]
        return len(ps) == 8 and len(out) == 8

    moved = await eventually(lambda: pods(kube, namespace, "inference"), until=overflowed,
                             timeout=180, what="8 inference replicas Running on the clouds")
    for p in moved:
        ann = p["metadata"]["annotations"]
        assert ann["vkprovider.io/overflow-policy"] == f"burst-{tag}"
        assert ann["vkprovider.io/provider"] in ("cloud0", "cloud1")
    training = await eventually(
        lambda: pods(kube, namespace, "training"),
        until=lambda ps: len(ps) == 8 and all(p["status"].get("phase") == "Running" for p in ps),
        timeout=90, what="8 training pods Running inside")
    assert all(p["spec"]["nodeName"] in internal for p in training)
    assert not any(tolerates(p) for p in training), "training must never be admitted"
    events = await reasons(kube, namespace, moved[0]["metadata"]["name"])
    assert any(e["reason"] == "OverflowAdmitted" for e in events)
    ledgers = [await c.ledger() for c in system.clouds]
    uids = [e["uid"] for led in ledgers for e in led if e["state"] != "deleted"]
    assert sorted(uids) == sorted(p["metadata"]["uid"] for p in moved)


async def test_capacity_failover_to_the_next_cloud(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    cluster_objects: Cluster,
) -> None:
    await start(system, namespace, companion_kubeconfig,
                inventories=["H100:us-east:0:1.99,A100:us-east:8:1.29", "H100:eu-west:8:2.19"])
    await cluster_objects.create(POLICIES, policy(f"fo-{uuid.uuid4().hex[:6]}",
                                                  namespace=namespace, app="inference",
                                                  providers=["cloud0", "cloud1"]))
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=3, pool=namespace))
    running = await eventually(
        lambda: pods(kube, namespace, "inference"),
        until=lambda ps: len(ps) == 3 and all(p["status"].get("phase") == "Running" for p in ps),
        timeout=120, what="3 replicas Running on the cloud that has H100s")
    assert {p["metadata"]["annotations"]["vkprovider.io/provider"] for p in running} == {
        "cloud1"}
    stats = await system.clouds[0].stats()
    assert stats["instances_created"] == 0
    assert stats["create_calls"] >= 1, "cloud0 is first in order: it must have been asked"


async def test_budget_cap_keeps_further_pods_pending_and_lowers_allocatable(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    cluster_objects: Cluster,
) -> None:
    await start(system, namespace, companion_kubeconfig,
                inventories=["H100:us-east:32:2.00", "H100:eu-west:32:3.00"])
    name = f"cap-{uuid.uuid4().hex[:6]}"
    await cluster_objects.create(POLICIES, policy(name, namespace=namespace, app="inference",
                                                  providers=["cloud0", "cloud1"],
                                                  limits={"maxPricePerHour": 5.0}))
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=4, pool=namespace))

    def split(ps: list[dict[str, Any]]) -> tuple[int, int]:
        run = sum(1 for p in ps if p["status"].get("phase") == "Running")
        return run, len(ps) - run

    ps = await eventually(lambda: pods(kube, namespace, "inference"),
                          until=lambda ps: len(ps) == 4 and split(ps) == (2, 2), timeout=120,
                          what="2 Running within $5/h, 2 Pending")
    await asyncio.sleep(3)  # the cap holds: nothing else gets admitted
    ps = await pods(kube, namespace, "inference")
    assert split(ps) == (2, 2)
    pending = [p for p in ps if p["status"].get("phase") == "Pending"]
    assert not any(tolerates(p) for p in pending)
    events = await eventually(lambda: reasons(kube, namespace, pending[0]["metadata"]["name"]),
                              until=lambda ev: any(e["reason"] == "OverflowRefused" for e in ev),
                              timeout=30, what="an OverflowRefused event")
    refused = next(e for e in events if e["reason"] == "OverflowRefused")
    assert "maxPricePerHour" in refused["message"] and name in refused["message"]
    # the policy says so too: $4/h outside, one more GPU at up to $3/h (the dearest offer)
    # would pass $5/h
    obj = await eventually(lambda: kube.get(f"{POLICIES}/{name}"), timeout=30,
                           until=lambda o: condition(o, "BudgetExhausted").get("status") == "True",
                           what="BudgetExhausted=True")
    exhausted = condition(obj, "BudgetExhausted")
    assert exhausted["reason"] == "MaxPricePerHour"
    assert "maxPricePerHour $5.00 reached" in exhausted["message"]
    node = await eventually(
        lambda: kube.get(f"/api/v1/nodes/{system.node_name}"),
        until=lambda n: n["status"]["allocatable"].get("nvidia.com/gpu") == "2", timeout=30,
        what="allocatable nvidia.com/gpu down to the 2 held")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"


async def test_pod_no_policy_selects_is_never_given_the_toleration(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    cluster_objects: Cluster,
) -> None:
    """Nor a Warning (issue 36): a pod no policy is meant for is not a refusal. The inference
    pod created after it is admitted in a pass that looked at the batch pod first (candidates go
    oldest first), so by then a Warning for it would have been written."""
    await start(system, namespace, companion_kubeconfig)
    await cluster_objects.create(POLICIES, policy(f"only-inf-{uuid.uuid4().hex[:6]}",
                                                  namespace=namespace, app="inference",
                                                  providers=["cloud0"]))
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("batch", replicas=1, pool=namespace))
    [pod] = await eventually(
        lambda: pods(kube, namespace, "batch"), timeout=30, what="the batch pod unschedulable",
        until=lambda ps: len(ps) == 1 and any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (ps[0].get("status") or {}).get("conditions") or []))
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=1, pool=namespace))
    [inference] = await eventually(lambda: pods(kube, namespace, "inference"),
                                   until=lambda ps: len(ps) == 1, timeout=30,
                                   what="the inference pod")
    await eventually(lambda: reasons(kube, namespace, inference["metadata"]["name"]),
                     until=lambda ev: any(e["reason"] == "OverflowAdmitted" for e in ev),
                     timeout=30, what="the inference pod admitted")
    events = await reasons(kube, namespace, pod["metadata"]["name"])
    assert not [e for e in events if e["reason"] == "OverflowRefused"], \
        "a pod no policy selects got a Warning"
    [pod] = await pods(kube, namespace, "batch")
    assert not tolerates(pod)
    assert pod["status"]["phase"] == "Pending"


async def sneaky_pod_fails(kube: KubeClient, namespace: str, node: str, *,
                           annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A GPU pod bound to the virtual node by hand, tolerating its taint; returns it Failed."""
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sneaky", "labels": {"app": "sneaky"},
                     "annotations": annotations or {}},
        "spec": {"nodeName": node,
                 "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
                 "containers": [{"name": "c", "image": "x:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    return await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/sneaky"),
                            until=lambda p: p["status"].get("phase") == "Failed", timeout=60,
                            what="sneaky Failed")


async def test_hand_tolerated_pod_matching_no_policy_fails_not_admitted_without_cloud_call(
    kube: KubeClient, namespace: str, system: System, cluster_objects: Cluster,
) -> None:
    await system.start(clouds=1)
    await cluster_objects.create(POLICIES, policy(f"other-{uuid.uuid4().hex[:6]}",
                                                  namespace=namespace, app="inference",
                                                  providers=["cloud0"]))
    pod = await sneaky_pod_fails(kube, namespace, system.node_name)
    assert pod["status"]["reason"] == "NotAdmitted"
    assert (await system.clouds[0].stats())["create_calls"] == 0


@pytest.mark.parametrize("forged", ["labels", "namespace-labels"])
async def test_a_pod_naming_a_policy_that_does_not_select_it_is_refused_before_any_cloud_call(
    kube: KubeClient, namespace: str, system: System, cluster_objects: Cluster, forged: str,
) -> None:
    """The policy annotation is a claim anyone who can create pods can write: the provider
    checks the named policy's selector again, namespaceSelector included, before spending."""
    await system.start(clouds=1)
    name = f"paid-{uuid.uuid4().hex[:6]}"
    body = policy(name, namespace=namespace, app="inference", providers=["cloud0"])
    if forged == "namespace-labels":
        body["spec"]["selector"]["podSelector"] = {"matchLabels": {"app": "sneaky"}}
        body["spec"]["selector"]["namespaceSelector"] = {"matchLabels": {"team": "ml"}}
    await cluster_objects.create(POLICIES, body)
    pod = await sneaky_pod_fails(kube, namespace, system.node_name,
                                 annotations={"vkprovider.io/overflow-policy": name})
    assert pod["status"]["reason"] == "NotAdmitted"
    expected = ("podSelector" if forged == "labels" else "namespaceSelector")
    assert f"names OverflowPolicy {name}, which does not select it" in pod["status"]["message"]
    assert expected in pod["status"]["message"]
    assert (await system.clouds[0].stats())["create_calls"] == 0


async def test_internal_first_new_replicas_stay_inside_while_gpus_are_free(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster,
) -> None:
    internal = await gpu_nodes.create(count=1, gpus=4)
    await start(system, namespace, companion_kubeconfig)
    await cluster_objects.create(POLICIES, policy(f"inf-{uuid.uuid4().hex[:6]}",
                                                  namespace=namespace, app="inference",
                                                  providers=["cloud0", "cloud1"]))
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=2, pool=namespace))
    await eventually(lambda: pods(kube, namespace, "inference"),
                     until=lambda ps: len(ps) == 2 and all(
                         p["status"].get("phase") == "Running" for p in ps), timeout=60,
                     what="2 replicas Running")
    await kube.patch(f"/apis/apps/v1/namespaces/{namespace}/deployments/inference/scale",
                     {"spec": {"replicas": 4}})
    ps = await eventually(lambda: pods(kube, namespace, "inference"),
                          until=lambda ps: len(ps) == 4 and all(
                              p["status"].get("phase") == "Running" for p in ps), timeout=60,
                          what="4 replicas Running")
    assert {p["spec"]["nodeName"] for p in ps} == set(internal)
    assert not any(tolerates(p) for p in ps)
    assert [(await c.stats())["create_calls"] for c in system.clouds] == [0, 0]


async def test_policy_naming_an_unknown_provider_is_flagged_with_the_field(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    cluster_objects: Cluster,
) -> None:
    await start(system, namespace, companion_kubeconfig)
    tag = uuid.uuid4().hex[:6]
    await cluster_objects.create("/apis/vkprovider.io/v1alpha1/gpuproviders", {
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "GPUProvider",
        "metadata": {"name": f"known-{tag}"},
        "spec": {"type": "mock", "endpoint": "http://127.0.0.1:9", "gpuTypes": {"H100": "H100"}}})
    good, bad = f"good-{tag}", f"bad-{tag}"
    await cluster_objects.create(POLICIES, policy(good, namespace=namespace, app="inference",
                                                  providers=[f"known-{tag}"]))
    body = policy(bad, namespace=namespace, app="inference", providers=[f"known-{tag}", "nope"])
    body["spec"]["gpuTypes"] = ["H100", "B300"]
    await cluster_objects.create(POLICIES, body)

    def valid(obj: dict[str, Any]) -> dict[str, Any]:
        return next((c for c in (obj.get("status") or {}).get("conditions") or []
                     if c["type"] == "Valid"), {})

    flagged = await eventually(lambda: kube.get(f"{POLICIES}/{bad}"),
                               until=lambda o: valid(o).get("status") == "False", timeout=30,
                               what="Valid=False on the broken policy")
    cond = valid(flagged)
    assert cond["reason"] == "UnknownProvider"
    assert "spec.providers[1]" in cond["message"] and "nope" in cond["message"]
    assert "spec.gpuTypes[1]" in cond["message"] and "B300" in cond["message"]
    assert (condition(flagged, "Ready")["status"], condition(flagged, "Ready")["reason"]) == (
        "False", "Invalid")
    ok = await eventually(lambda: kube.get(f"{POLICIES}/{good}"),
                          until=lambda o: valid(o).get("status") == "True", timeout=30,
                          what="Valid=True on the good policy")
    assert valid(ok)["lastTransitionTime"]
    # its only provider listens nowhere (port 9): never Ready=True
    assert condition(ok, "Ready")["status"] in ("Unknown", "False")
    assert condition(ok, "BudgetExhausted")["reason"] == "WithinLimits"

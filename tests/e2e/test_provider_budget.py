"""The provider is the last gate on an OverflowPolicy's limits (issue 34).

Real control plane, one mock cloud, the provider as a process, and NO companion: pods are bound
by hand (``spec.nodeName`` and the toleration), which skips both the scheduler and the
companion's admission. The provider must still keep the policy's ``maxPods``, count pods by
what it created (not by the pod's annotation, which the pod's author can remove), and keep
counting after a restart (the policy tag on each instance).
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_pods import TOLERATION, node_ready

pytestmark = pytest.mark.cluster

POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
ANNOTATION = "vkprovider.io/overflow-policy"


def bound_pod(name: str, *, node: str, policy: str) -> dict[str, Any]:
    """A GPU pod bound to the virtual node by hand, naming its policy as the companion would."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "burst"},
                         "annotations": {ANNOTATION: policy, "vkprovider.io/gpu-type": "H100"}},
            "spec": {"nodeName": node, "tolerations": [TOLERATION],
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "example.com/burst:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def pod(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return await kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")


async def events(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/events",
                          params={"fieldSelector": f"involvedObject.name={name}"})
    return list(body["items"])


def over_budget(evs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((e for e in evs if e["reason"] == "BudgetExceeded"), None)


async def told_over_budget(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    evs = await eventually(lambda: events(kube, ns, name), timeout=60,
                           until=lambda e: over_budget(e) is not None,
                           what=f"a BudgetExceeded event on {name}")
    event = over_budget(evs)
    assert event is not None
    return event


def running(p: dict[str, Any]) -> bool:
    return (p.get("status") or {}).get("phase") == "Running"


async def test_pods_bound_by_hand_cannot_spend_past_max_pods(
    kube: KubeClient, namespace: str, system: System, cluster_objects: Cluster,
) -> None:
    name = f"cap-{uuid.uuid4().hex[:6]}"
    await cluster_objects.create(POLICIES, {
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
        "metadata": {"name": name},
        "spec": {"selector": {"namespaces": [namespace],
                              "podSelector": {"matchLabels": {"app": "burst"}}},
                 "providers": ["cloud0"], "limits": {"maxPods": 2}, "overflowAfter": "0s"}})
    provider = await system.start(clouds=1)  # the policy exists before the provider lists
    cloud = system.clouds[0]
    await node_ready(kube, system.node_name)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(3):
        await kube.create(pods, bound_pod(f"p{i}", node=system.node_name, policy=name))

    # Exactly two run; the third is told which budget, and never reaches the cloud.
    async def states() -> list[dict[str, Any]]:
        return [await pod(kube, namespace, f"p{i}") for i in range(3)]

    ps = await eventually(states, timeout=90, what="two of the three pods Running",
                          until=lambda ps: sum(running(p) for p in ps) == 2)
    [waiting] = [p for p in ps if not running(p)]
    held = waiting["metadata"]["name"]
    event = await told_over_budget(kube, namespace, held)
    assert event["type"] == "Warning"
    assert f"OverflowPolicy {name}: maxPods 2 reached" in event["message"], event["message"]
    stats = await cloud.stats()
    assert stats["create_calls"] == 2 and stats["instances_created"] == 2, stats
    assert waiting["metadata"]["uid"] not in {e["uid"] for e in await cloud.ledger()}
    assert (await pod(kube, namespace, held))["status"].get("phase") == "Pending"

    # Removing the annotation from a running pod frees no slot: a new pod is still refused.
    first = next(p for p in ps if running(p))
    await kube.patch(f"{pods}/{first['metadata']['name']}",
                     {"metadata": {"annotations": {ANNOTATION: None}}})
    await kube.create(pods, bound_pod("p3", node=system.node_name, policy=name))
    event = await told_over_budget(kube, namespace, "p3")
    assert "maxPods 2 reached" in event["message"]

    # A restarted provider counts its instances again from their tags.
    provider.stop()
    provider.start()
    await kube.create(pods, bound_pod("p4", node=system.node_name, policy=name))
    event = await told_over_budget(kube, namespace, "p4")
    assert "maxPods 2 reached" in event["message"]
    stats = await cloud.stats()
    assert stats["instances_created"] == 2, stats

    # A pod of the policy ending frees its slot: one waiting pod is created, and only one.
    await kube.delete(f"{pods}/{first['metadata']['name']}")

    async def live_states() -> list[dict[str, Any]]:
        return [await pod(kube, namespace, n) for n in (held, "p3", "p4")]

    await eventually(live_states, timeout=90, what="one waiting pod created in the slot",
                     until=lambda ps: sum(running(p) for p in ps) == 1)
    stats = await eventually(cloud.stats, timeout=60, what="the freed instance gone",
                             until=lambda s: s["live_instances"] == 2)
    assert stats["instances_created"] == 3, stats


async def test_an_offer_that_would_break_max_price_per_hour_is_not_taken(
    kube: KubeClient, namespace: str, system: System, cluster_objects: Cluster,
) -> None:
    """$3/h on cloud0 (first in the policy), $1/h on cloud1, a cap of $4/h: the second pod goes
    to the cheaper cloud, the third fits nowhere and is not created."""
    name = f"dollars-{uuid.uuid4().hex[:6]}"
    await cluster_objects.create(POLICIES, {
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
        "metadata": {"name": name},
        "spec": {"selector": {"namespaces": [namespace],
                              "podSelector": {"matchLabels": {"app": "burst"}}},
                 "providers": ["cloud0", "cloud1"], "limits": {"maxPricePerHour": 4.0},
                 "overflowAfter": "0s"}})
    await system.start(clouds=2, inventories=["H100:us-east:16:3.00", "H100:us-east:16:1.00"])
    cloud0, cloud1 = system.clouds
    await node_ready(kube, system.node_name)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(2):  # one at a time: which cloud each takes is the point
        await kube.create(pods, bound_pod(f"d{i}", node=system.node_name, policy=name))
        await eventually(partial(pod, kube, namespace, f"d{i}"), until=running, timeout=60,
                         what=f"d{i} Running")
    where = [(await pod(kube, namespace, f"d{i}"))["metadata"]["annotations"][
        "vkprovider.io/provider"] for i in range(2)]
    assert where == ["cloud0", "cloud1"], "$3 + $3 would pass $4: the $1 offer is taken"
    await kube.create(pods, bound_pod("d2", node=system.node_name, policy=name))
    event = await told_over_budget(kube, namespace, "d2")
    assert f"OverflowPolicy {name}: maxPricePerHour $4.00" in event["message"], event["message"]
    assert (await cloud0.stats())["create_calls"] == 1
    assert (await cloud1.stats())["create_calls"] == 1

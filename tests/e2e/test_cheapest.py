"""OverflowPolicy ``placement: Cheapest``: the pod goes to the provider whose fitting offer is
cheapest now, not the first listed, and fails over when that one runs out."""

from __future__ import annotations

import uuid
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_overflow import POLICIES, policy
from .test_pods import create_pod, list_pods, node_ready, pod_spec


def running_on(pods: list[dict[str, Any]], name: str) -> str | None:
    pod = next((p for p in pods if p["metadata"]["name"] == name), None)
    if pod is None or (pod.get("status") or {}).get("phase") != "Running":
        return None
    return str(pod["metadata"]["annotations"].get("vkprovider.io/provider"))


async def test_cheapest_placement_takes_the_lower_live_price_and_fails_over(
        kube: KubeClient, namespace: str, system: System, cluster_objects: Cluster) -> None:
    # listed first but dearer (cloud0), then cheaper with room for exactly one pod (cloud1)
    await system.start(clouds=2, inventories=["H100:us-east:8:3.10", "H100:us-east:1:1.40"])
    await node_ready(kube, system.node_name)
    body = policy(f"cheap-{uuid.uuid4().hex[:6]}", namespace=namespace, app="cheap",
                  providers=["cloud0", "cloud1"])
    body["spec"]["placement"] = "Cheapest"
    await cluster_objects.create(POLICIES, body)

    await create_pod(kube, namespace, "first", pod_spec(system.node_name), labels={"app": "cheap"})
    pods = await eventually(lambda: list_pods(kube, namespace, "app=cheap"), timeout=60,
                            until=lambda ps: running_on(ps, "first") is not None,
                            what="the first pod Running")
    assert running_on(pods, "first") == "cloud1", "the cheaper offer, though listed second"

    await create_pod(kube, namespace, "second", pod_spec(system.node_name),
                     labels={"app": "cheap"})
    pods = await eventually(lambda: list_pods(kube, namespace, "app=cheap"), timeout=60,
                            until=lambda ps: running_on(ps, "second") is not None,
                            what="the second pod Running")
    assert running_on(pods, "second") == "cloud0", "cloud1 is full: the next cheapest"
    assert len(await system.clouds[1].ledger()) == 1

"""Which cloud a create goes to, and when a pod gives up, on two mock clouds (config order 0, 1).

* a cloud that can never run the spec (InvalidSpec) is skipped for the next one, not fatal;
* a quota refusal blocks that account and the next cloud runs the pod;
* a create whose outcome stays unknown past the create deadline fails the pod, never leaks;
* a pod whose instance vanished is re-created only on the cloud that ran it.
"""

from __future__ import annotations

from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_chaos_profiles import failed_with
from .test_pods import create_pod, list_pods, node_ready, pod_spec

pytestmark = pytest.mark.cluster

TWO = ["H100:us-east:16:1.99", "H100:eu-west:16:2.19"]


async def pod_named(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return next(p for p in await list_pods(kube, ns) if p["metadata"]["name"] == name)


def running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


async def test_a_refusal_or_a_quota_moves_on_to_the_next_cloud(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start(clouds=2, inventories=TWO)
    cloud0 = system.clouds[0]
    await node_ready(kube, system.node_name)
    await cloud0.admin("PATCH", "/admin/config", json={"max_gpus_per_instance": 1})
    await create_pod(kube, namespace, "two-gpus", pod_spec(system.node_name, gpus=2))
    pod = await eventually(lambda: pod_named(kube, namespace, "two-gpus"), until=running,
                           timeout=60, what="a 2-GPU pod Running on the cloud that can run it")
    assert pod["metadata"]["annotations"]["vkprovider.io/provider"] == "cloud1"
    assert (await cloud0.stats())["create_calls"] >= 1, "cloud0 is first: it was asked"

    await cloud0.admin("PATCH", "/admin/config", json={"max_gpus_per_instance": 8,
                                                       "quota_gpus": 0})
    await create_pod(kube, namespace, "quota-1", pod_spec(system.node_name))
    pod = await eventually(lambda: pod_named(kube, namespace, "quota-1"), until=running,
                           timeout=60, what="a pod Running on cloud1 after cloud0's quota")
    assert pod["metadata"]["annotations"]["vkprovider.io/provider"] == "cloud1"
    asked = (await cloud0.stats())["create_calls"]
    await create_pod(kube, namespace, "quota-2", pod_spec(system.node_name))
    await eventually(lambda: pod_named(kube, namespace, "quota-2"), until=running, timeout=60,
                     what="the next pod Running on cloud1")
    assert (await cloud0.stats())["create_calls"] == asked, "cloud0 is blocked after a quota"
    assert (await cloud0.stats())["instances_created"] == 0


async def test_an_unknown_outcome_past_the_deadline_fails_the_pod(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start(clouds=1, pods={"create_deadline_seconds": 6})
    cloud = system.clouds[0]
    await node_ready(kube, system.node_name)
    await cloud.admin("PUT", "/admin/scenario", json={
        "name": "creates-fail", "seed": 1,
        "faults": {"endpoints": {"create": {"error_rate": 1.0, "error_status": 503}}}})
    await create_pod(kube, namespace, "doomed", pod_spec(system.node_name))
    pod = await eventually(lambda: pod_named(kube, namespace, "doomed"), timeout=60,
                           until=lambda p: failed_with(p, "ProviderUnavailable"),
                           what="the pod Failed ProviderUnavailable after the deadline")
    assert "the last try: cloud0" in pod["status"]["message"]
    assert (await cloud.stats())["instances_created"] == 0


async def test_a_vanished_instance_is_recreated_only_where_the_pod_ran(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start(clouds=2, inventories=["H100:us-east:0:1.99", TWO[1]])
    cloud0, cloud1 = system.clouds
    await node_ready(kube, system.node_name)
    await create_pod(kube, namespace, "moved", pod_spec(system.node_name))
    pod = await eventually(lambda: pod_named(kube, namespace, "moved"), until=running,
                           timeout=60, what="the pod Running on cloud1 (cloud0 has no H100)")
    first = pod["metadata"]["annotations"]["vkprovider.io/instance-id"]
    first_ip = pod["status"]["hostIP"]
    await cloud0.admin("PUT", "/admin/inventory", json={"offers": [
        {"gpu_type": "H100", "region": "us-east", "count": 16, "price_per_gpu_hour": 1.99}]})
    await cloud1.admin("DELETE", f"/instances/{first}")  # someone else deleted it

    pod = await eventually(
        lambda: pod_named(kube, namespace, "moved"), timeout=60,
        until=lambda p: running(p) and p["metadata"]["annotations"][
            "vkprovider.io/instance-id"] != first,
        what="the pod re-created on a new instance")
    assert pod["metadata"]["annotations"]["vkprovider.io/provider"] == "cloud1"
    # the status follows the new instance (IP lists replaced, not merged into two IPs)
    assert pod["status"]["hostIP"] != first_ip
    assert pod["status"]["hostIPs"] == [{"ip": pod["status"]["hostIP"]}]
    assert (await cloud0.stats())["instances_created"] == 0, "never where it did not run"
    uid = pod["metadata"]["uid"]
    assert [e["uid"] for e in await cloud1.ledger()] == [uid, uid]

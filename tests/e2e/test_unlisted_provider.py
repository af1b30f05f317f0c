"""A cloud that cannot be listed holds back only the pods whose instance it might hide.

Two mock clouds; cloud0's list answers 500 to every call. New pods go to cloud1 (nothing is
placed where it cannot be seen). A pod bound while the provider was down is inherited by the
next process: a predecessor may have created its instance on cloud0 and died before annotating
the pod, so it waits (on no cloud) until cloud0 can be listed, and then runs exactly once.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, list_pods, node_ready, pod_spec

pytestmark = pytest.mark.cluster

BROKEN_LISTS = {"name": "broken-lists", "seed": 1,
                "faults": {"endpoints": {"list": {"error_rate": 1.0, "error_status": 500}}}}


def phase(pods: list[dict[str, Any]], name: str) -> str | None:
    pod = next((p for p in pods if p["metadata"]["name"] == name), None)
    return None if pod is None else (pod.get("status") or {}).get("phase")


async def test_an_unlistable_cloud_holds_back_only_pods_it_may_hide(
    kube: KubeClient, namespace: str, system: System
) -> None:
    provider = await system.start(clouds=2, inventories=["H100:us-east:16:1.99",
                                                         "H100:eu-west:16:2.19"])
    cloud0, cloud1 = system.clouds
    await node_ready(kube, system.node_name)
    await cloud0.admin("PUT", "/admin/scenario", json=BROKEN_LISTS)
    async def log() -> str:
        return provider.log_text()

    synced = "pods synced and instances adopted"

    await eventually(log, until=lambda t: "list instances failed" in t, timeout=30,
                     what="a sweep that could not list cloud0")
    spec = pod_spec(system.node_name)

    await create_pod(kube, namespace, "fresh", spec)
    pods = await eventually(lambda: list_pods(kube, namespace), timeout=60,
                            until=lambda ps: phase(ps, "fresh") == "Running",
                            what="a new pod Running although cloud0 cannot be listed")
    fresh = next(p for p in pods if p["metadata"]["name"] == "fresh")
    assert fresh["metadata"]["annotations"]["vkprovider.io/provider"] == "cloud1"
    assert (await cloud0.stats())["instances_created"] == 0, "nothing placed where unseen"

    provider.kill()
    await create_pod(kube, namespace, "inherited", spec)  # bound while nobody was acting
    await eventually(lambda: list_pods(kube, namespace), timeout=30,
                     until=lambda ps: bool((next(p for p in ps
                                                 if p["metadata"]["name"] == "inherited")
                                            .get("spec") or {}).get("nodeName")),
                     what="the inherited pod bound to the virtual node")
    provider.start()
    await eventually(log, until=lambda t: t.count(synced) == 2, timeout=30,
                     what="the restarted provider synced (it inherits what is bound now)")
    await create_pod(kube, namespace, "after", spec)
    await eventually(lambda: list_pods(kube, namespace), timeout=60,
                     until=lambda ps: phase(ps, "after") == "Running",
                     what="a pod bound after the restart Running on cloud1")
    ledger = await cloud0.ledger() + await cloud1.ledger()
    inherited = next(p for p in await list_pods(kube, namespace)
                     if p["metadata"]["name"] == "inherited")
    assert inherited["metadata"]["uid"] not in {e["uid"] for e in ledger}, (
        "the inherited pod must wait: cloud0 may hide its instance")
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    said = [e["message"] for e in events if e["involvedObject"]["name"] == "inherited"
            and e["reason"] == "WaitingForProvider"]
    assert said and "cloud0 not listed yet" in said[0], said

    await cloud0.admin("DELETE", "/admin/scenario")  # cloud0 lists again
    await eventually(lambda: list_pods(kube, namespace), timeout=60,
                     until=lambda ps: phase(ps, "inherited") == "Running",
                     what="the inherited pod Running once cloud0 can be listed")
    ledger = await cloud0.ledger() + await cloud1.ledger()
    per_uid = collections.Counter(e["uid"] for e in ledger)
    assert set(per_uid.values()) == {1} and len(per_uid) == 3, per_uid

"""Under a $/h cap with no pod priced yet, a surge is admitted in one pass (issue 36, item 10).

Real control plane; the provider runs as a process against two mock clouds (cloud0 sells H100 at
$2.00/GPU-h, cloud1 at $3.00) and publishes their offers' prices on its Node
(``vkprovider.io/offer-prices``). The admission loop runs in this process with the companion's
ServiceAccount (manifests/ RBAC), its passes called by the test. The surge's pods name a
scheduler that does not exist, so no pod is ever bound, created on a cloud or priced: every
decision below is made with no price of the policy known, from the published offers alone.

* A cap with room for the whole surge admits all of it in one pass. Before the provider
  published its offers, the companion admitted one pod and waited for a cloud to price it.
* A cap with room for some admits exactly as many as fit at the dearest offer the policy could
  take ($3.00), not at the cheapest ($2.00), and no more on the next pass while none is priced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.descheduler.admission import POLICIES_PATH, OverflowAdmission
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer
from vkprovider.placement.budget import POLICY_ANNOTATION, PRICE_ANNOTATION
from vkprovider.placement.offerprices import OFFER_PRICES_ANNOTATION
from vkprovider.semantics.timefmt import format_time
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System

pytestmark = pytest.mark.cluster

SURGE = 8
APP = "surge"


def surge_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": APP},
                         "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": {"schedulerName": "vkp-test-nobody",  # never bound: never priced
                     "containers": [{"name": "c", "image": "example.com/x:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "terminationGracePeriodSeconds": 0}}


async def unschedulable_surge(kube: KubeClient, ns: str) -> list[str]:
    since = format_time(datetime.now(UTC) - timedelta(seconds=60))
    names = [f"{APP}-{i}" for i in range(SURGE)]
    for name in names:
        await kube.create(f"/api/v1/namespaces/{ns}/pods", surge_pod(name))
        await kube.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {
            "conditions": [{"type": "PodScheduled", "status": "False",
                            "reason": "Unschedulable", "message": "0/0 nodes are available",
                            "lastTransitionTime": since}]}})
    return names


async def in_store(informer: Informer, key: str, check: Any = bool) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        return informer.store.get(key)

    found: dict[str, Any] = await eventually(
        probe, until=lambda p: p is not None and check(p), timeout=60,
        what=f"{key} in the {informer.name} watch")
    return found


@pytest_asyncio.fixture
async def published(kube: KubeClient, system: System) -> AsyncIterator[str]:
    """The provider's Node, once it carries the offers' prices; yields its name."""
    await system.start(clouds=2, inventories=["H100:us-east:32:2.00", "H100:eu-west:32:3.00"])

    async def node() -> dict[str, Any]:
        try:
            return await kube.get(f"/api/v1/nodes/{system.node_name}")
        except NotFoundError:  # not registered yet
            return {"metadata": {}}

    got = await eventually(node, timeout=60, what="the provider's Node with its offer prices",
                           until=lambda n: OFFER_PRICES_ANNOTATION in (
                               n["metadata"].get("annotations") or {}))
    prices = json.loads(got["metadata"]["annotations"][OFFER_PRICES_ANNOTATION])
    assert prices == {"cloud0": {"H100": {"min": 2.0, "max": 2.0}},
                      "cloud1": {"H100": {"min": 3.0, "max": 3.0}}}
    yield system.node_name


@pytest_asyncio.fixture
async def admission(published: str, companion_kubeconfig: Path, kube: KubeClient,
                    namespace: str) -> AsyncIterator[OverflowAdmission]:
    client = KubeClient.from_kubeconfig(kubeconfig=str(companion_kubeconfig))
    events = EventRecorder(client=client, component="vkprovider-companion-test")
    adm = OverflowAdmission(client=client, events=events, node_names=[published],
                            interval=3600)
    tasks = [asyncio.ensure_future(i.run()) for i in adm.informers]
    try:
        for informer in adm.informers:
            await asyncio.wait_for(informer.synced.wait(), timeout=60)
        yield adm
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await events.aclose()
        await client.aclose()
        pods = await kube.get(f"/api/v1/namespaces/{namespace}/pods")
        for pod in pods["items"]:
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"/api/v1/namespaces/{namespace}/pods/"
                                  f"{pod['metadata']['name']}", grace_period_seconds=0)


async def capped_policy(objects: Cluster, *, namespace: str, cap: float) -> str:
    name = f"capped-{uuid.uuid4().hex[:6]}"
    await objects.create(POLICIES_PATH, {
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
        "metadata": {"name": name},
        "spec": {"selector": {"namespaces": [namespace],
                              "podSelector": {"matchLabels": {"app": APP}}},
                 "providers": ["cloud0", "cloud1"],
                 "limits": {"maxPricePerHour": cap}, "overflowAfter": "0s"}})
    return name


async def ready_to_decide(adm: OverflowAdmission, *, policy: str, node: str, ns: str,
                          names: list[str]) -> None:
    await in_store(adm.policies, policy)
    # the node watch has caught up with the published prices (a companion that does not keep
    # them, as before this change, has nothing to wait for)
    await in_store(adm.virtual_nodes, node,
                   lambda n: n.get("offerPrices") or "offerPrices" not in n)
    for name in names:
        await in_store(adm.pending, f"{ns}/{name}",
                       lambda p: (p.get("status") or {}).get("conditions"))


async def admitted(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/pods",
                          params={"labelSelector": f"app={APP}"})
    return [p for p in body["items"]
            if POLICY_ANNOTATION in (p["metadata"].get("annotations") or {})]


def priced(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods
            if PRICE_ANNOTATION in (p["metadata"].get("annotations") or {})]


async def first_pass(kube: KubeClient, namespace: str, objects: Cluster, *, published: str,
                     admission: OverflowAdmission, cap: float) -> list[dict[str, Any]]:
    """A policy capped at ``cap`` $/h, the unschedulable surge, one admission pass once the
    companion's watches hold them all; returns the pods that pass admitted."""
    policy = await capped_policy(objects, namespace=namespace, cap=cap)
    names = await unschedulable_surge(kube, namespace)
    await ready_to_decide(admission, policy=policy, node=published, ns=namespace, names=names)
    await admission.pass_once()
    return await admitted(kube, namespace)


async def test_a_surge_within_the_cap_is_admitted_in_one_pass_before_any_pod_is_priced(
    kube: KubeClient, namespace: str, cluster_objects: Cluster, published: str,
    admission: OverflowAdmission,
) -> None:
    # room for 10 GPUs at the dearest offer ($3.00): the whole surge of 8
    pods = await first_pass(kube, namespace, cluster_objects, published=published,
                            admission=admission, cap=30.0)
    assert not priced(pods)
    assert len(pods) == SURGE, (
        f"{len(pods)} of {SURGE} admitted in one pass: the companion did not use the offers' "
        "prices the provider publishes, and admitted one pod to wait for a price")


async def test_a_cap_too_small_for_the_surge_admits_as_many_as_fit_at_the_dearest_offer(
    kube: KubeClient, namespace: str, cluster_objects: Cluster, published: str,
    admission: OverflowAdmission,
) -> None:
    # $10/h: 3 GPUs at $3.00 (cloud1), though 5 would fit at cloud0's $2.00
    first = await first_pass(kube, namespace, cluster_objects, published=published,
                             admission=admission, cap=10.0)
    assert len(first) == 3 and not priced(first)
    for pod in first:  # the pod watch shows them admitted: the next pass counts them from it
        await in_store(admission.pods, f"{namespace}/{pod['metadata']['name']}",
                       lambda p: POLICY_ANNOTATION in (p["metadata"].get("annotations") or {}))
    await admission.pass_once()
    assert len(await admitted(kube, namespace)) == 3

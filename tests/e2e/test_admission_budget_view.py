"""Admission budgets come from one view of the pods (issue 36, item 6).

Real control plane; the admission loop runs in this process against it, its passes called by the
test. The scheduler is the test itself: pods name a scheduler that does not exist (so the real
one leaves them alone), the test writes their ``Unschedulable`` condition and binds them to a
virtual node name through the Binding subresource, as kube-scheduler would.

* A pod bound between two passes is counted by the second pass, however the pod watches lag one
  another: the test stops every pod watch but the one of unscheduled pods (the candidates) before
  it binds, the moment two unsynchronised watches could show the pod in neither.
* A cloud pod being deleted still counts against ``maxPods`` until its object is gone (its
  instance bills until the provider deleted it).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.descheduler.admission import POLICIES_PATH, OverflowAdmission
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer
from vkprovider.placement.budget import POLICY_ANNOTATION
from vkprovider.semantics.timefmt import format_time
from vkprovider.testing.waiting import eventually

from .conftest import Cluster

pytestmark = pytest.mark.cluster

HOLD = "vkprovider.io/test-hold"


def pod_body(name: str, *, app: str, node: str | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "vkp-test-nobody",  # kube-scheduler leaves it to the test
        "containers": [{"name": "c", "image": "example.com/x:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "terminationGracePeriodSeconds": 30,
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app},
                         "annotations": annotations or {}, "finalizers": [HOLD]},
            "spec": spec}


async def unschedulable_pod(kube: KubeClient, ns: str, name: str, *, app: str) -> None:
    await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_body(name, app=app))
    since = format_time(datetime.now(UTC) - timedelta(seconds=60))
    await kube.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/0 nodes are available", "lastTransitionTime": since}]}})


async def admitted(kube: KubeClient, ns: str, name: str) -> bool:
    pod = await kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return POLICY_ANNOTATION in (pod["metadata"].get("annotations") or {})


def pod_watches(adm: OverflowAdmission) -> list[Informer]:
    return [i for i in adm.informers if getattr(i, "_path", None) == "/api/v1/pods"]


class Running:
    """The admission's watches, each in a task the test can stop (a watch that lags)."""

    def __init__(self, adm: OverflowAdmission) -> None:
        self.tasks = {id(i): asyncio.ensure_future(i.run()) for i in adm.informers}

    def stop(self, informer: Informer) -> None:
        self.tasks[id(informer)].cancel()

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


@pytest_asyncio.fixture
async def admission(kube: KubeClient, namespace: str, cluster_objects: Cluster
                    ) -> AsyncIterator[tuple[OverflowAdmission, Running, str]]:
    node = f"vk-budget-{uuid.uuid4().hex[:6]}"
    events = EventRecorder(client=kube, component="vkprovider-companion-test")
    adm = OverflowAdmission(client=kube, events=events, node_names=[node], interval=3600)
    running = Running(adm)
    try:
        for informer in adm.informers:
            await asyncio.wait_for(informer.synced.wait(), timeout=60)
        yield adm, running, node
    finally:
        await running.close()
        await events.aclose()
        pods = await kube.get(f"/api/v1/namespaces/{namespace}/pods")
        for pod in pods["items"]:  # the test's hold on them, then the pods themselves
            path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
            with contextlib.suppress(NotFoundError):
                await kube.patch(path, {"metadata": {"finalizers": None}})
            with contextlib.suppress(NotFoundError):
                await kube.delete(path, grace_period_seconds=0)


async def max_pods_policy(objects: Cluster, *, namespace: str, app: str) -> str:
    name = f"budget-{uuid.uuid4().hex[:6]}"
    await objects.create(POLICIES_PATH, {
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
        "metadata": {"name": name},
        "spec": {"selector": {"namespaces": [namespace],
                              "podSelector": {"matchLabels": {"app": app}}},
                 "providers": ["mock"], "limits": {"maxPods": 1}, "overflowAfter": "0s"}})
    return name


async def in_store(informer: Informer, key: str, check: Any = bool) -> None:
    async def probe() -> dict[str, Any] | None:
        return informer.store.get(key)

    await eventually(probe, until=lambda p: p is not None and check(p), timeout=30,
                     what=f"{key} in the {informer.name} watch")


async def test_a_pod_bound_between_passes_counts_however_the_watches_lag(
    kube: KubeClient, namespace: str, cluster_objects: Cluster,
    admission: tuple[OverflowAdmission, Running, str],
) -> None:
    adm, running, node = admission
    app = "burst"
    policy = await max_pods_policy(cluster_objects, namespace=namespace, app=app)
    await in_store(adm.policies, policy)
    await unschedulable_pod(kube, namespace, "first", app=app)
    await in_store(adm.pending, f"{namespace}/first",
                   lambda p: (p.get("status") or {}).get("conditions"))
    await adm.pass_once()
    assert await admitted(kube, namespace, "first")
    for watch in pod_watches(adm):  # every watch that holds unbound pods saw the admission
        if getattr(watch, "_params", {}).get("fieldSelector", "spec.nodeName=") != \
                "spec.nodeName=":
            continue  # a watch of one node's pods
        await in_store(watch, f"{namespace}/first",
                       lambda p: POLICY_ANNOTATION in (p["metadata"].get("annotations") or {}))

    # From here on only the watch of unscheduled pods delivers: the others lag behind it.
    for watch in pod_watches(adm):
        if watch is not adm.pending:
            running.stop(watch)
    await kube.create(f"/api/v1/namespaces/{namespace}/pods/first/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "first"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})

    async def gone() -> bool:
        return f"{namespace}/first" not in adm.pending.store

    await eventually(gone, timeout=30, what="the bound pod leaves the unscheduled watch")
    await unschedulable_pod(kube, namespace, "second", app=app)
    await in_store(adm.pending, f"{namespace}/second",
                   lambda p: (p.get("status") or {}).get("conditions"))
    await adm.pass_once()
    assert not await admitted(kube, namespace, "second"), \
        "admitted past maxPods 1: the pass did not count the pod bound since the last one"


async def test_a_terminating_cloud_pod_counts_until_it_is_gone(
    kube: KubeClient, namespace: str, cluster_objects: Cluster,
    admission: tuple[OverflowAdmission, Running, str],
) -> None:
    adm, _running, node = admission
    app = "burst"
    policy = await max_pods_policy(cluster_objects, namespace=namespace, app=app)
    await in_store(adm.policies, policy)
    # A cloud pod of the policy, being deleted: the provider has not deleted its instance yet.
    await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                      pod_body("cloud", app=app, node=node,
                               annotations={POLICY_ANNOTATION: policy}))
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/cloud")
    for watch in pod_watches(adm):
        if watch is not adm.pending:
            await in_store(watch, f"{namespace}/cloud",
                           lambda p: p["metadata"].get("deletionTimestamp"))
    await unschedulable_pod(kube, namespace, "waiting", app=app)
    await in_store(adm.pending, f"{namespace}/waiting",
                   lambda p: (p.get("status") or {}).get("conditions"))
    await adm.pass_once()
    assert not await admitted(kube, namespace, "waiting"), \
        "admitted past maxPods 1 while the terminating cloud pod still bills"

    # Once its object is gone (the instance is), the budget has room again.
    await kube.patch(f"/api/v1/namespaces/{namespace}/pods/cloud",
                     {"metadata": {"finalizers": None}})
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/cloud", grace_period_seconds=0)

    async def cloud_gone() -> bool:
        return all(f"{namespace}/cloud" not in w.store for w in pod_watches(adm))

    await eventually(cloud_gone, timeout=30, what="the cloud pod leaves the watches")
    await adm.pass_once()
    assert await admitted(kube, namespace, "waiting")

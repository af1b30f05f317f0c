"""Provider-managed EndpointSlices against the real control plane (issue 13, item 2).

The controller runs in-process with the provider's own ServiceAccount (RBAC from manifests/base),
so a missing permission fails here. Pods are told to it as the integrator does (``set_pod``); the
Services, slices, garbage collector and Events are real. Addresses are 198.18.0.x and 2001:db8::x
(the API server refuses loopback in slices); nothing dials them.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.metrics import Metrics
from vkprovider.node.endpointslices import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    SERVICE_NAME_LABEL,
    EndpointSliceController,
    EndpointTarget,
    managed_selector,
)
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster

PORTS = (("main", "http", 8080, "TCP"),)


def target(host: str, published: int, *, ready: bool = True, kind: str = "ip",
           terminating: bool = False) -> EndpointTarget:
    return EndpointTarget(container_port=8080, protocol="TCP", host=host, port=published,
                          kind=kind,  # type: ignore[arg-type]
                          ready=ready, serving=ready, terminating=terminating)


class Harness:
    """Controllers for one virtual node, started and stopped in the test's loop."""

    def __init__(self, *, client: KubeClient, kube: KubeClient, namespace: str) -> None:
        self.client = client  # the provider's ServiceAccount
        self.kube = kube  # admin: creates Services, reads what the controller wrote
        self.ns = namespace
        self.node = f"vk-es-{uuid.uuid4().hex[:8]}"
        self.tasks: list[asyncio.Task[None]] = []
        self.events = EventRecorder(client=client, component="vkprovider", host=self.node)

    async def start(self, *, pods: list[dict[str, Any]] | None = None
                    ) -> EndpointSliceController:
        self.metrics = Metrics()
        ctl = EndpointSliceController(client=self.client, node=self.node, events=self.events,
                                      metrics=self.metrics, batch_seconds=0.05, max_backoff=2.0)
        for p in pods or []:
            self.tell(ctl, **p)
        ctl.mark_pods_synced()
        self.tasks.append(asyncio.create_task(ctl.run()))
        await asyncio.wait_for(ctl.started.wait(), 30)
        return ctl

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks.clear()

    def tell(self, ctl: EndpointSliceController, *, uid: str, endpoints: list[EndpointTarget],
             labels: dict[str, str] | None = None) -> None:
        ctl.set_pod(namespace=self.ns, name=f"pod-{uid}", uid=uid,
                    labels=labels or {"app": "web"}, container_ports=PORTS, endpoints=endpoints)

    async def service(self, name: str = "web", *, selector: dict[str, str] | None = None,
                      ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return await self.kube.create(f"/api/v1/namespaces/{self.ns}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": selector or {"app": "web"},
                     "ports": ports or [{"name": "http", "port": 80, "targetPort": "http"}]}})

    async def slices(self, service: str | None = None) -> list[dict[str, Any]]:
        selector = managed_selector(self.node)
        if service:
            selector += f",{SERVICE_NAME_LABEL}={service}"
        body = await self.kube.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{self.ns}/endpointslices",
            params={"labelSelector": selector})
        return list(body.get("items") or [])

    async def wait_slices(self, until: Any, what: str, service: str | None = None,
                          timeout: float = 20.0) -> list[dict[str, Any]]:
        return await eventually(lambda: self.slices(service), until=until, timeout=timeout,
                                what=what, interval=0.1)


@pytest_asyncio.fixture
async def provider_client(provider_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_kubeconfig(kubeconfig=str(provider_kubeconfig))
    try:
        yield client
    finally:
        await client.aclose()


@pytest_asyncio.fixture
async def h(provider_client: KubeClient, kube: KubeClient, namespace: str
            ) -> AsyncIterator[Harness]:
    harness = Harness(client=provider_client, kube=kube, namespace=namespace)
    try:
        yield harness
    finally:
        await harness.stop()
        await harness.events.aclose()


def _endpoints(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["targetRef"]["uid"]: e for s in slices for e in s.get("endpoints") or []}


async def test_a_slice_has_the_published_address_and_follows_readiness(h: Harness) -> None:
    svc = await h.service()
    ctl = await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001,
                                                                 ready=False)]}])
    [s] = await h.wait_slices(len, "the slice")
    meta = s["metadata"]
    assert meta["labels"][SERVICE_NAME_LABEL] == "web"
    assert meta["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert meta["labels"][NODE_LABEL] == h.node
    assert meta["name"].startswith("web-") and len(meta["name"]) <= 63
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"],
            owner["blockOwnerDeletion"]) == ("Service", "web", svc["metadata"]["uid"], True, True)
    assert s["addressType"] == "IPv4"
    assert s["ports"] == [{"name": "http", "protocol": "TCP", "port": 40001}]
    [ep] = s["endpoints"]
    assert ep["addresses"] == ["198.18.0.1"]
    assert ep["conditions"] == {"ready": False, "serving": False, "terminating": False}
    assert ep["targetRef"] == {"kind": "Pod", "namespace": h.ns, "name": "pod-u1", "uid": "u1"}
    assert ep["nodeName"] == h.node

    h.tell(ctl, uid="u1", endpoints=[target("198.18.0.1", 40001, ready=True)])
    await h.wait_slices(lambda ss: ss and _endpoints(ss)["u1"]["conditions"]["ready"],
                        "the endpoint turning ready")
    writes = ctl.writes
    for _ in range(20):  # probe ticks with no news write nothing
        h.tell(ctl, uid="u1", endpoints=[target("198.18.0.1", 40001, ready=True)])
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    assert ctl.writes == writes

    # draining: not ready, terminating; then the pod goes and its slice with it
    h.tell(ctl, uid="u1", endpoints=[target("198.18.0.1", 40001, terminating=True)])
    await h.wait_slices(lambda ss: ss and _endpoints(ss)["u1"]["conditions"] == {
        "ready": False, "serving": True, "terminating": True}, "a terminating endpoint")
    ctl.remove_pod(uid="u1")
    await h.wait_slices(lambda ss: ss == [], "no slice once the pod is gone")


async def test_a_service_created_after_the_pod_and_its_selector_changes(h: Harness) -> None:
    ctl = await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001)]},
                              {"uid": "u2", "endpoints": [target("198.18.0.2", 40002)]}])
    await h.service("other", selector={"app": "nothing-here"})
    await h.service()
    slices = await h.wait_slices(lambda ss: len(ss) == 2, "one slice per port set")
    assert sorted(s["ports"][0]["port"] for s in slices) == [40001, 40002]
    assert {s["metadata"]["labels"][SERVICE_NAME_LABEL] for s in slices} == {"web"}

    # the selector no longer matches: the slices go; back again: they return
    path = f"/api/v1/namespaces/{h.ns}/services/web"
    await h.kube.patch(path, {"spec": {"selector": {"app": "web", "tier": "gold"}}})
    await h.wait_slices(lambda ss: ss == [], "no slice for a selector matching no cloud pod")
    h.tell(ctl, uid="u2", endpoints=[target("198.18.0.2", 40002)],
           labels={"app": "web", "tier": "gold"})
    [s] = await h.wait_slices(lambda ss: len(ss) == 1, "the relabelled pod's slice")
    assert list(_endpoints([s])) == ["u2"]

    # a Service port change renames the slice's ports
    await h.kube.patch(path, {"spec": {"ports": [{"name": "web", "port": 81,
                                                  "targetPort": 8080}]}})
    await h.wait_slices(lambda ss: len(ss) == 1 and ss[0]["ports"][0]["name"] == "web",
                        "the renamed port")
    assert await h.slices("other") == []


async def test_deleting_the_service_removes_its_slices(h: Harness) -> None:
    await h.service()
    await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001)]},
                        {"uid": "u2", "endpoints": [target("198.18.0.2", 40002)]}])
    await h.wait_slices(lambda ss: len(ss) == 2, "two slices")
    await h.kube.delete(f"/api/v1/namespaces/{h.ns}/services/web")
    await h.wait_slices(lambda ss: ss == [], "no slice after the Service is deleted")


async def test_the_garbage_collector_removes_slices_of_a_service_deleted_while_down(
        h: Harness) -> None:
    await h.service()
    await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001)]}])
    await h.wait_slices(len, "the slice")
    await h.stop()
    await h.kube.delete(f"/api/v1/namespaces/{h.ns}/services/web")
    await h.wait_slices(lambda ss: ss == [], "the slice collected with its owner", timeout=60)


async def test_a_restarted_controller_adopts_and_fixes_its_slices(h: Harness) -> None:
    await h.service()
    await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001)]},
                        {"uid": "u2", "endpoints": [target("198.18.0.2", 40002)]}])
    before = await h.wait_slices(lambda ss: len(ss) == 2, "two slices")
    by_port = {s["ports"][0]["port"]: s["metadata"] for s in before}
    await h.stop()

    # while it was down, u2 went away and u1 stopped being ready
    ctl = await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001,
                                                                 ready=False)]}])
    [s] = await h.wait_slices(
        lambda ss: len(ss) == 1 and not _endpoints(ss)["u1"]["conditions"]["ready"],
        "the kept slice fixed, the stale one deleted")
    assert (s["metadata"]["name"], s["metadata"]["uid"]) == (
        by_port[40001]["name"], by_port[40001]["uid"])  # adopted, not recreated
    await asyncio.sleep(0.5)
    assert len(await h.slices()) == 1
    assert ctl.writes == 2  # one update, one delete: nothing recreated

    # a third start with nothing to change writes nothing
    await h.stop()
    again = await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001,
                                                                   ready=False)]}])
    await asyncio.sleep(1.0)
    assert again.writes == 0
    assert [x["metadata"]["uid"] for x in await h.slices()] == [s["metadata"]["uid"]]


async def test_an_ipv6_address_gets_an_ipv6_slice(h: Harness) -> None:
    await h.service()
    await h.start(pods=[{"uid": "u4", "endpoints": [target("198.18.0.4", 40001)]},
                        {"uid": "u6", "endpoints": [target("2001:db8:0::6", 40001)]}])
    slices = await h.wait_slices(lambda ss: len(ss) == 2, "one slice per family")
    by_family = {s["addressType"]: s for s in slices}
    assert set(by_family) == {"IPv4", "IPv6"}
    assert by_family["IPv6"]["endpoints"][0]["addresses"] == ["2001:db8::6"]
    assert by_family["IPv6"]["endpoints"][0]["targetRef"]["uid"] == "u6"


async def test_a_hostname_only_endpoint_gets_no_slice_but_a_warning(h: Harness) -> None:
    svc = await h.service()
    ctl = await h.start(pods=[{"uid": "u9", "endpoints": [
        target("u9-8080.proxy.example.net", 443, kind="hostname")]}])

    async def warnings() -> list[dict[str, Any]]:
        body = await h.kube.get(f"/api/v1/namespaces/{h.ns}/events",
                                params={"fieldSelector": "reason=EndpointNotRoutable"})
        return list(body.get("items") or [])

    [event] = await eventually(warnings, what="the EndpointNotRoutable event", timeout=20)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Service"
    assert event["involvedObject"]["uid"] == svc["metadata"]["uid"]
    assert "pod-u9" in event["message"] and "vkprovider.io/ports" in event["message"]
    assert "u9-8080.proxy.example.net:443" in event["message"]
    assert await h.slices() == []
    assert h.metrics.registry.get_sample_value(
        "vkprovider_endpointslice_hostname_only_endpoints") == 1

    # the same pod told again (probe ticks) is not told again
    for ready in (False, True, False):
        h.tell(ctl, uid="u9", endpoints=[target("u9-8080.proxy.example.net", 443,
                                                kind="hostname", ready=ready)])
        await asyncio.sleep(0.2)
    await h.events.flush()
    [again] = await warnings()
    assert again.get("count", 1) == 1
    assert ctl.writes == 0


async def test_slices_deleted_by_hand_come_back(h: Harness) -> None:
    await h.service()
    await h.start(pods=[{"uid": "u1", "endpoints": [target("198.18.0.1", 40001)]}])
    [s] = await h.wait_slices(len, "the slice")
    with contextlib.suppress(NotFoundError):
        await h.kube.delete(
            f"/apis/discovery.k8s.io/v1/namespaces/{h.ns}/endpointslices/"
            f"{s['metadata']['name']}")
    [back] = await h.wait_slices(
        lambda ss: len(ss) == 1 and ss[0]["metadata"]["uid"] != s["metadata"]["uid"],
        "the slice recreated")
    assert back["metadata"]["name"] == s["metadata"]["name"]

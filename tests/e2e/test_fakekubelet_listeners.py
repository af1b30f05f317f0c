"""Internal replicas are real listeners behind virtual pod IPs (issue 13, item 4, fake kubelet).

A Deployment's pods on simulated GPU nodes load a model for 3 s: Running but not Ready until
their readiness probe (run by the fake kubelet through the address map) passes; a Service over
them, loaded by the load generator, reaches both with no failure; the servers' own counters tell
traffic from probes; a deleted pod keeps serving through its grace period and no request fails
meanwhile; a liveness probe failing past its threshold restarts the container.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import Any

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import AddressMap, NoRoute
from vkprovider.probing.transport import DialingTransport
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.fakekubelet import read_counters
from vkprovider.testing.loadgen import LoadGenerator
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster


def server_deployment(name: str, *, pool: str, replicas: int, load_seconds: float,
                      liveness: dict[str, Any] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "server", "image": "example.com/model:1",
        "ports": [{"name": "http", "containerPort": 8000}],
        "env": [{"name": "MOCK_LOAD_SECONDS", "value": str(load_seconds)}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1},
    }
    if liveness is not None:
        container["livenessProbe"] = liveness
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [container],
                                           "nodeSelector": {"vkprovider.io/pool": pool},
                                           "terminationGracePeriodSeconds": 1}}}}


async def live_pods(kube: KubeClient, ns: str, app: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"app={app}"})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def transition(pod: dict[str, Any], kind: str) -> datetime:
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == kind)
    return datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))


async def test_pods_load_then_serve_a_service_and_drain_on_delete(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, local_cluster: LocalCluster,
) -> None:
    amap = local_cluster.address_map_dir
    await gpu_nodes.create(count=1, gpus=8)
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      server_deployment("web", pool=namespace, replicas=2, load_seconds=3))
    await kube.create(f"/api/v1/namespaces/{namespace}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})

    running = await eventually(
        lambda: live_pods(kube, namespace, "web"),
        until=lambda ps: len(ps) == 2 and all(p["status"].get("podIP") for p in ps),
        timeout=30, what="2 pods Running with an IP")
    assert not any(ready(p) for p in running), "Ready before the model loaded"
    pods = await eventually(lambda: live_pods(kube, namespace, "web"),
                            until=lambda ps: len(ps) == 2 and all(ready(p) for p in ps),
                            timeout=30, interval=0.1, what="both pods Ready")
    for p in pods:
        took = (transition(p, "Ready") - datetime.fromisoformat(
            p["status"]["startTime"].replace("Z", "+00:00"))).total_seconds()
        assert 2 <= took <= 7, f"{p['metadata']['name']} Ready {took}s after it started"
        assert p["status"]["containerStatuses"][0]["ready"] is True

    names = sorted(p["metadata"]["name"] for p in pods)
    async with LoadGenerator(kube=kube, namespace=namespace, service="web", rate=30,
                             address_map=amap, timeout=1.0, chapter="steady") as lg:
        await eventually(lambda: _value(len(lg.endpoints)), until=lambda n: n == 2, timeout=20,
                         what="both pods in the Service's slice")
        lg.mark("steady")
        await asyncio.sleep(2.0)
        victim = pods[0]
        meta = victim["metadata"]
        lg.mark("drain")
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{meta['name']}")
        # during the grace period the pod's server still answers at its virtual address
        async with httpx.AsyncClient(transport=DialingTransport(dialer=AddressMap(amap))) as http:
            answer = await http.get(f"http://{victim['status']['podIP']}:8000/")
        assert answer.status_code == 200 and answer.json()["pod"] == meta["name"]
        # and once the pod is gone, nothing listens there any more
        await eventually(lambda: _no_route(amap, victim["status"]["podIP"]), timeout=20,
                         what="the deleted pod's route withdrawn")
        await asyncio.sleep(1.0)

    report = lg.report()
    print(report.as_dict() | {"failures": [f.detail for f in report.failures][:5]})
    steady, drain = report.chapter("steady"), report.chapter("drain")
    assert report.failed == 0, report.failures_by_kind
    assert sorted(steady.by_replica) == names and min(steady.by_replica.values()) >= 10
    assert drain.sent >= 30 and drain.failed == 0

    served = report.ok + 1  # the load and the one request sent during the grace period

    def settled(c: dict[str, Any]) -> bool:
        return (all(f"{namespace}/{n}" in c for n in names)
                and c[f"{namespace}/{meta['name']}"]["closed"]
                and sum(c[f"{namespace}/{n}"]["traffic"] for n in names) >= served)

    # the file is rewritten ~4 times a second: wait for the write after the last request
    counters = await eventually(lambda: _value(read_counters(amap)), until=settled, timeout=10,
                                what="counters of both pods (the deleted one closed) with "
                                     f"{served} requests served")
    assert sum(counters[f"{namespace}/{n}"]["traffic"] for n in names) == served
    for n in names:
        c = counters[f"{namespace}/{n}"]
        assert c["probes"] >= 3 and c["ports"]["8000"]["probes_failed"] >= 1  # 503 while loading
        assert c["ports"]["8000"]["traffic_5xx"] == 0  # no traffic reached a loading server


async def test_liveness_failure_restarts_the_container(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory,
) -> None:
    await gpu_nodes.create(count=1, gpus=8)
    liveness = {"httpGet": {"path": "/healthz", "port": 8000}, "periodSeconds": 1,
                "failureThreshold": 2}  # /healthz answers 503 while the model loads
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      server_deployment("slow", pool=namespace, replicas=1, load_seconds=60,
                                        liveness=liveness))
    pods = await eventually(
        lambda: live_pods(kube, namespace, "slow"),
        until=lambda ps: len(ps) == 1 and ps[0]["status"].get("containerStatuses")
        and ps[0]["status"]["containerStatuses"][0]["restartCount"] >= 1,
        timeout=30, what="the container restarted after liveness failures")
    assert not ready(pods[0])


async def _value(value: Any) -> Any:
    return value


async def _no_route(amap: Any, ip: str) -> bool:
    with contextlib.suppress(NoRoute):
        AddressMap(amap).resolve(ip, 8000)
        return False
    return True

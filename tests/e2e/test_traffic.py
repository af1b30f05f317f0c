"""Traffic reaches cloud replicas: readiness by probes, provider-managed endpoints, drain.

Real control plane, real provider process, mock clouds whose instances are real HTTP servers on
loopback behind virtual addresses (the lab's address map plays DNAT; nothing dials 198.18.x.y),
the fake kubelet serving internal pods the same way, and a load generator that follows the
Service's EndpointSlices as kube-proxy would. Failures are counted in requests.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from providers.mock.records import is_public_address
from vkprovider.kube import KubeClient
from vkprovider.testing.loadgen import LoadGenerator, LoadReport
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import System
from .invariants import overlapping_live_instances
from .test_pods import create_pod, list_pods, node_ready, pod_spec

MANAGED_BY = "endpointslice.kubernetes.io/managed-by"


def server(*, load_seconds: float = 0.0, liveness: bool = False,
           readiness: bool = True) -> dict[str, Any]:
    """A model server container: port 8000 ("http"), loading for ``load_seconds``."""
    c: dict[str, Any] = {
        "ports": [{"name": "http", "containerPort": 8000}],
        "env": [{"name": "MOCK_LOAD_SECONDS", "value": str(load_seconds)}],
    }
    if readiness:
        c["readinessProbe"] = {"httpGet": {"path": "/ready", "port": "http"},
                               "periodSeconds": 1, "failureThreshold": 1}
    if liveness:
        c["livenessProbe"] = {"httpGet": {"path": "/live", "port": "http"},
                              "periodSeconds": 1, "failureThreshold": 2}
    return c


async def service(kube: KubeClient, ns: str, name: str, app: str) -> None:
    await kube.create(f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"selector": {"app": app},
                 "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}})


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase"))


async def slices(kube: KubeClient, ns: str, svc: str, *, ours: bool | None = None
                 ) -> list[dict[str, Any]]:
    items = (await kube.get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                            params={"labelSelector": f"kubernetes.io/service-name={svc}"}))["items"]
    if ours is None:
        return list(items)
    return [s for s in items
            if (s["metadata"].get("labels", {}).get(MANAGED_BY) == "vkprovider.io") == ours]


def endpoint_ready(items: list[dict[str, Any]], pod_name: str) -> bool | None:
    for s in items:
        for ep in s.get("endpoints") or []:
            if (ep.get("targetRef") or {}).get("name") == pod_name:
                return bool((ep.get("conditions") or {}).get("ready"))
    return None


async def test_a_loading_server_is_running_not_ready_and_so_is_its_endpoint(
        kube: KubeClient, namespace: str, system: System, local_cluster: Any) -> None:
    await system.start(boot_delay=0.3)
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "llm", "llm")
    await create_pod(kube, namespace, "llm-0", pod_spec(
        system.node_name, container=server(load_seconds=8)), labels={"app": "llm"})

    seen: list[tuple[float, bool, bool | None]] = []  # (t, pod Ready, endpoint ready)

    async def observe() -> dict[str, Any]:
        pod = next(p for p in await list_pods(kube, namespace) if p["metadata"]["name"] == "llm-0")
        ep = endpoint_ready(await slices(kube, namespace, "llm", ours=True), "llm-0")
        if phase(pod) == "Running":
            seen.append((time.monotonic(), ready(pod), ep))
        return pod

    pod = await eventually(observe, until=ready, timeout=90, interval=0.25,
                           what="the pod Ready once its server loaded")
    running_not_ready = [s for s in seen if not s[1]]
    assert running_not_ready, "the pod was Running and not Ready while the server loaded"
    assert running_not_ready[-1][0] - running_not_ready[0][0] > 4.0, (
        "not Ready for most of the 8 s load", seen[:3], seen[-3:])
    assert all(ep is not True for _, r, ep in seen if not r), (
        "the endpoint never turned ready before the pod did")
    final = await eventually(lambda: slices(kube, namespace, "llm", ours=True),
                             until=lambda items: endpoint_ready(items, "llm-0") is True,
                             timeout=10, what="the endpoint ready with the pod")
    (sl,) = final
    assert sl["addressType"] == "IPv4"
    assert sl["ports"] == [{"name": "web", "port": 30000, "protocol": "TCP"}]
    (ep,) = sl["endpoints"]
    assert is_public_address(ep["addresses"][0]), ep
    assert ep["nodeName"] == system.node_name
    assert "podIP" not in pod["status"], "the mock remaps ports: no pod IP for the stock slices"
    stock = await slices(kube, namespace, "llm", ours=False)
    assert all(not (s.get("endpoints") or []) for s in stock), "no unreachable pod IP published"

    async with LoadGenerator(kube=kube, namespace=namespace, service="llm", rate=20,
                             address_map=Path(local_cluster.address_map_dir)) as lg:
        await eventually(lambda: _sent(lg), until=lambda n: n >= 40, timeout=30,
                         what="40 requests")
    report = lg.report()
    assert report.failed == 0, report.as_dict()
    instance = pod["metadata"]["annotations"]["vkprovider.io/instance-id"]
    traffic = await system.clouds[0].admin("GET", "/admin/traffic")
    assert traffic[instance]["traffic"] >= report.ok > 0


async def _sent(lg: LoadGenerator) -> int:
    return lg.report().sent


async def _endpoints(lg: LoadGenerator) -> int:
    return len(lg.endpoints)


async def test_requests_reach_replicas_inside_and_on_the_cloud(
        kube: KubeClient, namespace: str, system: System, gpu_nodes: GPUNodeFactory,
        local_cluster: Any) -> None:
    (inside,) = await gpu_nodes.create(count=1, gpus=2)
    await system.start(boot_delay=0.3)
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "web", "web")
    internal_spec = {"containers": [{"name": "main", "image": "server:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                     **server(load_seconds=1)}],
                     "nodeName": inside, "terminationGracePeriodSeconds": 5}
    await create_pod(kube, namespace, "web-inside", internal_spec, labels={"app": "web"})
    await create_pod(kube, namespace, "web-cloud", pod_spec(
        system.node_name, container=server(load_seconds=1)), labels={"app": "web"})
    await eventually(lambda: list_pods(kube, namespace, "app=web"),
                     until=lambda ps: len(ps) == 2 and all(ready(p) for p in ps),
                     timeout=90, what="both replicas Ready")
    await eventually(lambda: slices(kube, namespace, "web"), timeout=30,
                     until=lambda items: endpoint_ready(items, "web-inside") is True
                     and endpoint_ready(items, "web-cloud") is True,
                     what="both endpoints ready (stock slice and ours)")

    async with LoadGenerator(kube=kube, namespace=namespace, service="web", rate=40,
                             address_map=Path(local_cluster.address_map_dir)) as lg:
        await eventually(lambda: _sent(lg), until=lambda n: n >= 120, timeout=30,
                         what="120 requests")
    report = lg.report()
    assert report.failed == 0, report.as_dict()
    by_replica = dict(report.by_replica)
    assert by_replica.get("web-inside", 0) > 20, by_replica
    assert any(k != "web-inside" and v > 20 for k, v in by_replica.items()), by_replica


async def test_a_failing_liveness_probe_restarts_the_instance_in_place(
        kube: KubeClient, namespace: str, system: System) -> None:
    await system.start(boot_delay=0.3)
    await node_ready(kube, system.node_name)
    await create_pod(kube, namespace, "live", pod_spec(
        system.node_name, container=server(liveness=True)), labels={"app": "live"})
    pod = await eventually(lambda: list_pods(kube, namespace, "app=live"),
                           until=lambda ps: len(ps) == 1 and ready(ps[0]), timeout=60,
                           what="the pod Ready")
    instance = pod[0]["metadata"]["annotations"]["vkprovider.io/instance-id"]
    cloud = system.clouds[0]
    await cloud.admin("POST", f"/admin/instances/{instance}/health", json={"live": False})

    def restarted(ps: list[dict[str, Any]]) -> bool:
        statuses = ps[0]["status"].get("containerStatuses") or [{}]
        return int(statuses[0].get("restartCount") or 0) >= 1

    await eventually(lambda: list_pods(kube, namespace, "app=live"), until=restarted,
                     timeout=60, what="restartCount 1 after the liveness failures")
    await cloud.admin("POST", f"/admin/instances/{instance}/health", json={"live": True})
    pods = await eventually(lambda: list_pods(kube, namespace, "app=live"),
                            until=lambda ps: ready(ps[0]), timeout=60,
                            what="Ready again after the restart")
    assert pods[0]["metadata"]["annotations"]["vkprovider.io/instance-id"] == instance
    ledger = await cloud.ledger()
    assert [e["id"] for e in ledger] == [instance], "restarted in place, never a second one"
    assert overlapping_live_instances(ledger) == []
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events",
                             params={"fieldSelector": "involvedObject.name=live"}))["items"]
    reasons = {e["reason"] for e in events}
    assert {"Unhealthy", "Killing"} <= reasons, reasons


async def test_deleting_a_cloud_replica_drains_it_without_failing_a_request(
        kube: KubeClient, namespace: str, system: System, local_cluster: Any) -> None:
    await system.start(boot_delay=0.3, pods={"drain_seconds": 3})
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "api", "api")
    for name in ("api-0", "api-1"):
        spec = pod_spec(system.node_name, container=server())
        spec["terminationGracePeriodSeconds"] = 30
        await create_pod(kube, namespace, name, spec, labels={"app": "api"})
    await eventually(lambda: slices(kube, namespace, "api", ours=True), timeout=60,
                     until=lambda items: endpoint_ready(items, "api-0") is True
                     and endpoint_ready(items, "api-1") is True, what="both endpoints ready")
    async with LoadGenerator(kube=kube, namespace=namespace, service="api", rate=50,
                             address_map=Path(local_cluster.address_map_dir)) as lg:
        await eventually(lambda: _sent(lg), until=lambda n: n >= 50, timeout=30,
                         what="50 requests before the delete")
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/api-0")
        await eventually(lambda: list_pods(kube, namespace, "app=api"),
                         until=lambda ps: [p["metadata"]["name"] for p in ps] == ["api-1"],
                         timeout=60, what="api-0 gone")
        sent = lg.report().sent
        await eventually(lambda: _sent(lg), until=lambda n: n >= sent + 50, timeout=30,
                         what="50 requests after the delete")
    report = lg.report()
    assert report.failed == 0, report.as_dict()
    ledger = await system.clouds[0].ledger()
    assert sum(1 for e in ledger if e["state"] == "deleted") == 1


async def play_story(*, kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory,
                     system: System, companion_kubeconfig: Path, objects: Any,
                     address_map: Path, overflow_after: str = "0s",
                     companion_args: tuple[str, ...] = ()) -> LoadReport:
    """The story under 50 req/s, one chapter per step; returns the load report."""
    from .test_moveback import live_instances, overflow_then_free

    held: dict[str, LoadGenerator] = {}

    async def start_load() -> None:
        await service(kube, namespace, "inference", "inference")
        await eventually(lambda: slices(kube, namespace, "inference"), timeout=60,
                         until=lambda items: sum(
                             1 for s in items for ep in s.get("endpoints") or []
                             if (ep.get("conditions") or {}).get("ready")) == 4,
                         what="4 ready endpoints inside")
        lg = LoadGenerator(kube=kube, namespace=namespace, service="inference", rate=50,
                           address_map=address_map, chapter="inside")
        await lg.start()
        await eventually(lambda: _sent(lg), until=lambda n: n >= 50, timeout=30,
                         what="a second of load inside")
        lg.mark("way out")
        held["lg"] = lg

    internal, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=objects,
        container=server(load_seconds=2), before_preemption=start_load,
        overflow_after=overflow_after, companion_args=companion_args)
    lg = held["lg"]
    try:
        # The chapter starts when traffic can reach the cloud replicas: the Deployment counts a
        # pod ready from its status, and the EndpointSlice the load generator follows (as
        # kube-proxy would) is written from that status a watch event later, so a Deployment
        # that reports 4 ready can still be tens of milliseconds ahead of the slices.
        await eventually(lambda: _endpoints(lg), until=lambda n: n >= 4, timeout=30,
                         what="the load generator balancing over 4 ready endpoints")
        lg.mark("on the cloud")
        sent = lg.report().sent
        await eventually(lambda: _sent(lg), until=lambda n: n >= sent + 100,
                         timeout=30, what="two seconds of load on the cloud")
        lg.mark("way back")
        await eventually(lambda: _pods(kube, namespace), timeout=180, interval=0.5,
                         until=lambda ps: len(ps) == 4 and all(
                             p["spec"].get("nodeName") in internal and ready(p) for p in ps),
                         what="every replica back inside and Ready")
        await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=60,
                         what="every cloud instance deleted")
        lg.mark("home")
        sent = lg.report().sent
        await eventually(lambda: _sent(lg), until=lambda n: n >= sent + 50,
                         timeout=30, what="a second of load at home")
    finally:
        await watcher.stop()
        report = await lg.stop()
    print(f"\nthe story at 50 req/s (overflowAfter {overflow_after}"
          f"{', ' + ' '.join(companion_args) if companion_args else ''}):")
    for c in report.chapters:
        print(f"  {c.label:<14} sent {c.sent:>6}  failed {c.failed:>5}  "
              f"longest no-endpoint {c.longest_no_endpoint:6.2f}s  by kind "
              f"{dict(c.failures_by_kind)}")
    assert watcher.minimum is not None and watcher.minimum >= 4, "the way back never dipped"
    return report


async def preemption_admissions(kube: KubeClient, objects: Any) -> tuple[list[Any], list[Any]]:
    """The story policy's Admitted decisions: (all of them, those by the preemption fast path)."""
    policy_path = next(p for p in reversed(objects.paths) if "overflowpolicies" in p)
    decisions = (await kube.get(policy_path)).get("status", {}).get("lastDecisions") or []
    admitted = [d for d in decisions if d["decision"] == "Admitted"]
    fast = [d for d in admitted if "preempted by the scheduler" in d["reason"]]
    assert admitted, decisions
    return admitted, fast


async def test_the_story_measured_in_requests_way_out_and_way_back(
        kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
        companion_kubeconfig: Path, cluster_objects: Any, local_cluster: Any) -> None:
    """50 req/s through the whole story. The way back (make-before-break, drained deletes)
    fails no request; the way out (the scheduler preempts inference for a training gang, the
    replacements overflow and load on the cloud) is measured and reported: it is the baseline
    that pre-warming must bring to zero.

    The policy says ``overflowAfter: 10s`` and the companion runs with the preemption fast path
    (its default): every preempted replica's replacement is admitted at once, by the fast path
    (the decisions say so), and the printed way-out figures are the dip with it (docs/traffic.md
    quotes them). One story run covers both: they were two runs of the same story (~35 s)."""
    report = await play_story(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes,
                              system=system, companion_kubeconfig=companion_kubeconfig,
                              objects=cluster_objects,
                              address_map=Path(local_cluster.address_map_dir),
                              overflow_after="10s")
    chapters = {c.label: c for c in report.chapters}
    assert chapters["inside"].failed == 0
    assert chapters["on the cloud"].failed == 0, chapters["on the cloud"].as_dict()
    assert chapters["way back"].failed == 0, chapters["way back"].as_dict()
    assert chapters["home"].failed == 0
    assert chapters["way back"].longest_no_endpoint == 0
    replicas_seen = set(report.by_replica)
    assert any(r.startswith("inference-") for r in replicas_seen), replicas_seen
    assert any(r.startswith("mi-") for r in replicas_seen), "cloud replicas served too"
    admitted, fast = await preemption_admissions(kube, cluster_objects)
    assert len(fast) == len(admitted) == 4, admitted


async def test_the_way_out_without_the_preemption_fast_path_waits_overflow_after(
        kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
        companion_kubeconfig: Path, cluster_objects: Any, local_cluster: Any) -> None:
    """With overflowAfter 10s and no fast path, a preempted replica's replacement overflows
    only after 10 s Unschedulable; the printed way-out figures are the dip without the fast path
    (docs/traffic.md quotes them; with it: the story test above)."""
    report = await play_story(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
        address_map=Path(local_cluster.address_map_dir), overflow_after="10s",
        companion_args=("--no-preemption-fast-path",))
    assert report.chapter("way back").failed == 0
    admitted, fast = await preemption_admissions(kube, cluster_objects)
    assert fast == [] and all("Unschedulable for 1" in d["reason"] for d in admitted), admitted


async def _pods(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    return [p for p in await list_pods(kube, ns, "app=inference")
            if not p["metadata"].get("deletionTimestamp")]

"""Pods on the virtual node run on the mock cloud: the acceptance tests of the pod lifecycle.

Each test gets its own virtual node, mock cloud and provider process (authenticated with the
ServiceAccount token from manifests/base/rbac.yaml), and its own namespace.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import InvalidError
from vkprovider.testing.waiting import eventually

from .conftest import System

pytestmark = pytest.mark.cluster

TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vkprovider",
              "effect": "NoSchedule"}


def pod_spec(node: str, *, gpus: int = 1, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main", "image": "vllm/vllm-openai:v0.6",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    container.update(extra.pop("container", {}))
    spec: dict[str, Any] = {
        "containers": [container],
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [TOLERATION],
        "terminationGracePeriodSeconds": 5,
    }
    spec.update(extra)
    return spec


async def create_pod(kube: KubeClient, ns: str, name: str, spec: dict[str, Any],
                     labels: dict[str, str] | None = None, gpu_type: str = "H100"
                     ) -> dict[str, Any]:
    return await kube.create(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {},
                     "annotations": {"vkprovider.io/gpu-type": gpu_type}},
        "spec": spec})


async def list_pods(kube: KubeClient, ns: str, selector: str = "") -> list[dict[str, Any]]:
    params = {"labelSelector": selector} if selector else None
    return list((await kube.get(f"/api/v1/namespaces/{ns}/pods", params=params))["items"])


async def node_ready(kube: KubeClient, name: str) -> dict[str, Any]:
    def ready(node: dict[str, Any] | None) -> bool:
        conds = (node or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    async def get() -> dict[str, Any] | None:
        try:
            return await kube.get(f"/api/v1/nodes/{name}")
        except Exception:
            return None

    node = await eventually(get, until=ready, timeout=60, what=f"virtual node {name} Ready")
    assert node is not None
    return node


async def events_for(kube: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/events",
                          params={"fieldSelector": f"involvedObject.name={name}"})
    return list(body["items"])


def running(pods: list[dict[str, Any]], n: int) -> bool:
    return len(pods) == n and all(p.get("status", {}).get("phase") == "Running" for p in pods)


async def test_virtual_node_is_ready_with_cloud_gpus_and_renews_its_lease(
    kube: KubeClient, system: System
) -> None:
    await system.start()
    node = await node_ready(kube, system.node_name)
    labels = node["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet"
    assert {"key": "virtual-kubelet.io/provider", "value": "vkprovider",
            "effect": "NoSchedule"} in [{k: t.get(k) for k in ("key", "value", "effect")}
                                        for t in node["spec"]["taints"]]
    inventory = await system.clouds[0].admin("GET", "/admin/inventory")
    offers = inventory["offers"] if isinstance(inventory, dict) else inventory
    total = sum(o["count"] for o in offers)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(total)
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] > 0
    assert any(a["type"] == "InternalIP" for a in node["status"]["addresses"])

    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{system.node_name}"
    first = (await kube.get(path))["spec"]["renewTime"]
    await eventually(lambda: kube.get(path),
                     until=lambda lease: lease["spec"]["renewTime"] != first,
                     timeout=30, what="lease renewal")


async def test_fifty_pods_run_on_the_cloud_and_deleting_them_deletes_instances(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    await asyncio.gather(*(create_pod(kube, namespace, f"p{i}", pod_spec(system.node_name),
                                      labels={"app": "burst"}) for i in range(50)))
    pods = await eventually(lambda: list_pods(kube, namespace, "app=burst"),
                            until=lambda p: running(p, 50), timeout=120,
                            what="50 pods Running")
    cloud = system.clouds[0]
    ledger = await cloud.ledger()
    assert len(ledger) == 50
    by_uid = {e["uid"]: e for e in ledger}
    for pod in pods:
        ann = pod["metadata"]["annotations"]
        entry = by_uid[pod["metadata"]["uid"]]
        assert ann["vkprovider.io/provider"] == "cloud0"
        assert ann["vkprovider.io/instance-id"] == entry["id"]
        assert ann["vkprovider.io/gpu-type"] == "H100"
        assert ann["vkprovider.io/region"] == entry["region"]
        assert float(ann["vkprovider.io/price-per-hour"]) == pytest.approx(entry["price_per_hour"])
        assert pod["status"]["containerStatuses"][0]["ready"] is True
        assert pod["status"]["hostIP"]
        assert "podIP" not in pod["status"], "no port maps one-to-one: no pod IP to publish"

    await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
                       params={"labelSelector": "app=burst"})
    await eventually(lambda: list_pods(kube, namespace, "app=burst"), until=lambda p: not p,
                     timeout=120, what="all pods gone")
    ledger = await cloud.ledger()
    assert [e for e in ledger if e["state"] != "deleted"] == []
    assert len(ledger) == 50


async def test_kill_9_mid_burst_then_restart_runs_each_pod_exactly_once(
    kube: KubeClient, namespace: str, system: System
) -> None:
    provider = await system.start(boot_delay=0.5, pods={"orphan_grace_seconds": 2})
    await node_ready(kube, system.node_name)
    await asyncio.gather(*(create_pod(kube, namespace, f"p{i}", pod_spec(system.node_name),
                                      labels={"app": "crash"}) for i in range(200)))
    cloud = system.clouds[0]
    await eventually(cloud.stats, until=lambda s: s["instances_created"] >= 20, timeout=120,
                     interval=0.05, what="a partial burst")
    provider.kill()
    created_at_kill = (await cloud.stats())["instances_created"]
    assert created_at_kill < 200, "the burst finished before the kill; the test proves nothing"
    provider.start()

    pods = await eventually(lambda: list_pods(kube, namespace, "app=crash"),
                            until=lambda p: running(p, 200), timeout=240,
                            what="200 pods Running after the restart")
    ledger = await cloud.ledger()
    per_uid = collections.Counter(e["uid"] for e in ledger)
    assert set(per_uid) == {p["metadata"]["uid"] for p in pods}
    assert max(per_uid.values()) == 1, "a pod ran twice"
    await asyncio.sleep(5)  # > two orphan sightings: nothing may be collected wrongly
    live = [e for e in await cloud.ledger() if e["state"] != "deleted"]
    assert len(live) == 200


async def test_a_failed_instance_of_a_deployment_pod_is_restarted_in_place(
    kube: KubeClient, namespace: str, system: System
) -> None:
    """restartPolicy Always (a Deployment's): the kubelet restarts a failed container after a
    back-off; so does the provider, on the same instance, and restartCount follows."""
    await system.start(pods={"crash_backoff_seconds": 1})
    await node_ready(kube, system.node_name)
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "infer"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "infer"}},
                 "template": {"metadata": {"labels": {"app": "infer"}, "annotations": {
                     "vkprovider.io/gpu-type": "H100"}},
                              "spec": pod_spec(system.node_name)}}})
    pods = await eventually(lambda: list_pods(kube, namespace, "app=infer"),
                            until=lambda p: running(p, 2), timeout=90, what="2 replicas Running")
    victim = pods[0]
    instance = victim["metadata"]["annotations"]["vkprovider.io/instance-id"]
    await system.clouds[0].admin("POST", f"/admin/instances/{instance}/fail",
                                 json={"message": "GPU fell off the bus (Xid 79)",
                                       "exit_code": 137})
    path = f"/api/v1/namespaces/{namespace}/pods/{victim['metadata']['name']}"
    backoff = await eventually(lambda: kube.get(path), timeout=60, what="CrashLoopBackOff",
                               until=lambda p: (p["status"]["containerStatuses"][0]["state"]
                                                .get("waiting") or {}).get("reason")
                               == "CrashLoopBackOff")
    last = backoff["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 137 and "Xid 79" in last["message"]
    assert backoff["status"]["phase"] == "Running", "a restart is coming: never Failed"
    again = await eventually(
        lambda: kube.get(path), timeout=60, what="Running again after the restart",
        until=lambda p: p["status"]["containerStatuses"][0]["restartCount"] == 1
        and "running" in p["status"]["containerStatuses"][0]["state"])
    assert again["metadata"]["annotations"]["vkprovider.io/instance-id"] == instance
    assert again["metadata"]["uid"] == victim["metadata"]["uid"], "the same pod, not replaced"
    reasons = {e["reason"] for e in await events_for(kube, namespace, victim["metadata"]["name"])}
    assert "BackOff" in reasons
    ledger = await system.clouds[0].ledger()
    assert len(ledger) == 2, "restarted, never a second instance"


@pytest.mark.parametrize(("policy", "exit_code", "phase"), [
    ("Never", 3, "Failed"), ("Never", 0, "Succeeded"),
    ("OnFailure", 0, "Succeeded"), ("OnFailure", 4, "Running"),
])
async def test_restart_policy_decides_what_an_exit_does(
    kube: KubeClient, namespace: str, system: System, policy: str, exit_code: int,
    phase: str,
) -> None:
    await system.start(pods={"crash_backoff_seconds": 1})
    await node_ready(kube, system.node_name)
    await create_pod(kube, namespace, "job", pod_spec(system.node_name, restartPolicy=policy),
                     labels={"app": "job"})
    pods = await eventually(lambda: list_pods(kube, namespace, "app=job"),
                            until=lambda p: running(p, 1), timeout=60, what="Running")
    instance = pods[0]["metadata"]["annotations"]["vkprovider.io/instance-id"]
    await system.clouds[0].admin("POST", f"/admin/instances/{instance}/exit",
                                 json={"exit_code": exit_code})
    path = f"/api/v1/namespaces/{namespace}/pods/job"
    if phase == "Running":  # OnFailure and a failure: restarted in place
        pod = await eventually(lambda: kube.get(path), timeout=60, what="restarted",
                               until=lambda p: p["status"]["containerStatuses"][0][
                                   "restartCount"] == 1 and p["status"]["phase"] == "Running"
                               and "running" in p["status"]["containerStatuses"][0]["state"])
        return
    pod = await eventually(lambda: kube.get(path), timeout=60, what=phase,
                           until=lambda p: p["status"]["phase"] == phase)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == exit_code
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    await eventually(system.clouds[0].ledger, timeout=30, what="the instance deleted",
                     until=lambda led: led[0]["state"] == "deleted")


async def test_active_deadline_ends_an_overrunning_pod_and_its_instance(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    await create_pod(kube, namespace, "deadline",
                     pod_spec(system.node_name, activeDeadlineSeconds=4), labels={"app": "dl"})
    path = f"/api/v1/namespaces/{namespace}/pods/deadline"
    pod = await eventually(lambda: kube.get(path), timeout=60, what="DeadlineExceeded",
                           until=lambda p: p["status"].get("phase") == "Failed")
    assert pod["status"]["reason"] == "DeadlineExceeded"
    await eventually(system.clouds[0].ledger, timeout=30, what="the instance deleted",
                     until=lambda led: len(led) == 1 and led[0]["state"] == "deleted")


BAD_PODS: list[tuple[str, dict[str, Any], str, str]] = [
    ("two-containers",
     {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
     "UnsupportedPodSpec", "spec.containers"),
    ("hostpath",
     {"volumes": [{"name": "host", "hostPath": {"path": "/var/run"}}]},
     "UnsupportedPodSpec", "spec.volumes[0]"),
    ("pvc",
     {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "weights"}}]},
     "UnsupportedPodSpec", "spec.volumes[0]"),
    ("privileged",
     {"container": {"securityContext": {"privileged": True}}},
     "UnsupportedPodSpec", "privileged"),
    ("host-network", {"hostNetwork": True}, "UnsupportedPodSpec", "spec.hostNetwork"),
    ("absurd-cpu",
     {"container": {"resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "100000"}}}},
     "InvalidResources", "cpu"),
    ("too-many-gpus", {"gpus": 512}, "GPUCountUnavailable", "512 GPUs"),
    ("unknown-gpu-type", {"gpu_type": "B300"}, "UnknownGPUType", "B300"),
    # probes run over the network: no exec, and only declared ports (issue 13's bad input)
    ("exec-probe", {"container": {"readinessProbe": {"exec": {"command": ["cat", "/ok"]}}}},
     "UnsupportedPodSpec", "spec.containers[0].readinessProbe.exec"),
    ("undeclared-probe-port",
     {"container": {"ports": [{"name": "http", "containerPort": 8000}],
                    "livenessProbe": {"httpGet": {"path": "/", "port": "metrics"}}}},
     "UnsupportedPodSpec", "named port 'metrics' does not exist"),
    ("undeclared-numeric-probe-port",
     {"container": {"ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"tcpSocket": {"port": 9000}}}},
     "UnsupportedPodSpec", "spec.containers[0].readinessProbe.tcpSocket.port: port 9000 is not "
                           "declared"),
    # the mock rents GPU machines only: a GPU-less pod never reaches it (it would answer 422)
    ("zero-gpus", {"gpus": 0}, "InvalidResources",
     "resources.limits[nvidia.com/gpu]: no GPU requested"),
]


@pytest.mark.parametrize(("name", "change", "reason", "mention"), BAD_PODS,
                         ids=[b[0] for b in BAD_PODS])
async def test_bad_pod_fails_with_reason_and_event_and_the_cloud_is_never_called(
    kube: KubeClient, namespace: str, system: System, name: str, change: dict[str, Any],
    reason: str, mention: str,
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    change = dict(change)
    gpu_type = change.pop("gpu_type", "H100")
    spec = pod_spec(system.node_name, gpus=change.pop("gpus", 1))
    if "container" in change:
        spec["containers"][0].update(change.pop("container"))
    spec.update(change)
    # Bound directly, as by another scheduler: the real scheduler would (rightly) keep some of
    # these Pending (missing PVC, more CPU or GPUs than the node has); our checks must hold
    # for pods that reach the node anyway.
    del spec["nodeSelector"]
    spec["nodeName"] = system.node_name
    await create_pod(kube, namespace, name, spec, gpu_type=gpu_type)

    pod = await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}"),
                           until=lambda p: p.get("status", {}).get("phase") == "Failed",
                           timeout=60, what=f"{name} Failed")
    assert pod["status"]["reason"] == reason
    assert mention in pod["status"]["message"]
    events = await eventually(lambda: events_for(kube, namespace, name),
                              until=lambda ev: any(e["reason"] == reason for e in ev),
                              timeout=30, what="a Warning event")
    warning = next(e for e in events if e["reason"] == reason)
    assert warning["type"] == "Warning"
    assert mention in warning["message"]
    stats = await system.clouds[0].stats()
    assert stats["create_calls"] == 0


async def test_missing_secret_waits_then_runs_once_it_exists_and_optional_runs_at_once(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    secret_env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf",
                                                                     "key": "token"}}}]
    optional_env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "absent", "key": "token", "optional": True}}}]
    await create_pod(kube, namespace, "needs-secret",
                     pod_spec(system.node_name, container={"env": secret_env}))
    await create_pod(kube, namespace, "optional-secret",
                     pod_spec(system.node_name, container={"env": optional_env}))

    def waiting_reason(p: dict[str, Any]) -> str | None:
        statuses = p.get("status", {}).get("containerStatuses") or [{}]
        return (statuses[0].get("state", {}).get("waiting") or {}).get("reason")

    pod = await eventually(
        lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/needs-secret"),
        until=lambda p: waiting_reason(p) == "CreateContainerConfigError", timeout=60,
        what="CreateContainerConfigError")
    assert pod["status"]["phase"] == "Pending"
    await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/optional-secret"),
                     until=lambda p: p["status"].get("phase") == "Running", timeout=60,
                     what="the optional-secret pod Running")
    events = await events_for(kube, namespace, "needs-secret")
    assert any(e["type"] == "Warning" and "hf" in e["message"] for e in events)

    secret_value = "hf_s3cr3t_value_never_logged"
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"},
        "stringData": {"token": secret_value}})
    await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/needs-secret"),
                     until=lambda p: p["status"].get("phase") == "Running", timeout=90,
                     what="the pod Running once the Secret exists")
    assert system.provider is not None
    assert secret_value not in system.provider.log_text()
    assert secret_value not in await system.provider.metrics()


async def test_pod_without_image_is_refused_before_it_reaches_the_node(
    kube: KubeClient, namespace: str, system: System
) -> None:
    """The API server itself refuses a missing or blank image, naming the field; our own check
    (InvalidImageName, unit-tested) is the second line for pods that bypass validation."""
    await system.start()
    await node_ready(kube, system.node_name)
    for image in ("", "  "):
        spec = pod_spec(system.node_name, container={"image": image})
        with pytest.raises(InvalidError) as err:
            await create_pod(kube, namespace, "no-image", spec)
        assert "spec.containers[0].image" in str(err.value)
    assert (await system.clouds[0].stats())["create_calls"] == 0

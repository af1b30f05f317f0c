"""The kubelet API through the real API server: logs, auth, stats, resource metrics, no leaks.

``kubectl logs`` goes API server -> node InternalIP:daemon port with the API server's
kubelet-client certificate (signed by the cluster CA, O=system:masters); the provider trusts
that CA (``kubelet_api.client_ca_file``). Other tests call the kubelet API directly to check
401/403 and client certificates.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, BadRequestError, NotFoundError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.waiting import eventually

from .conftest import System

pytestmark = pytest.mark.cluster

TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vkprovider",
              "effect": "NoSchedule"}


def pod_body(node: str, name: str, *, gpus: int = 1, env: list[dict[str, Any]] | None = None
             ) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "vllm/vllm-openai:v0.6",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    if env:
        container["env"] = env
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": {"containers": [container],
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 5}}


async def node_ready(kube: KubeClient, name: str) -> None:
    async def get() -> dict[str, Any] | None:
        try:
            return await kube.get(f"/api/v1/nodes/{name}")
        except APIError:
            return None

    def ready(node: dict[str, Any] | None) -> bool:
        conds = (node or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    await eventually(get, until=ready, timeout=60, what=f"node {name} Ready")


async def running_pod(kube: KubeClient, system: System, ns: str, name: str, *, gpus: int = 1,
                      env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    await kube.create(f"/api/v1/namespaces/{ns}/pods",
                      pod_body(system.node_name, name, gpus=gpus, env=env))
    pod = await eventually(lambda: kube.get(f"/api/v1/namespaces/{ns}/pods/{name}"),
                           until=lambda p: p.get("status", {}).get("phase") == "Running",
                           timeout=90, what=f"pod {name} Running")
    return pod


def kubelet_client(system: System, *, cert: tuple[Path, Path] | None = None,
                   token: str | None = None) -> httpx.AsyncClient:
    assert system.provider is not None
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the kubelet API's serving certificate is self-signed
    if cert is not None:
        ctx.load_cert_chain(cert[0], cert[1])
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return httpx.AsyncClient(base_url=f"https://127.0.0.1:{system.provider.kubelet_port}",
                             verify=ctx, headers=headers, timeout=30)


def metrics_reader(system: System, cluster: LocalCluster) -> httpx.AsyncClient:
    """A client certificate of the cluster CA in group system:masters (metrics-server-like)."""
    pair = cluster.ca.issue(stem=f"e2e-reader-{uuid.uuid4().hex[:6]}", common_name="e2e-reader",
                            organization="system:masters", client=True)
    return kubelet_client(system, cert=(pair.cert, pair.key))


async def get_json(http: httpx.AsyncClient, path: str) -> dict[str, Any]:
    resp = await http.get(path)
    resp.raise_for_status()
    body = resp.json()
    assert isinstance(body, dict)
    return body


async def sa_token(kube: KubeClient, ns: str, name: str) -> str:
    await kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts",
                      {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    body = await kube.create(
        f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600}})
    return str(body["status"]["token"])


@contextlib.asynccontextmanager
async def cluster_role(kube: KubeClient, *, name: str, rules: list[dict[str, Any]],
                       sa_namespace: str, sa_name: str) -> AsyncIterator[None]:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await kube.create(f"{rbac}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": rules})
    await kube.create(f"{rbac}/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_namespace}]})
    try:
        yield
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{rbac}/{kind}/{name}")


async def test_kubectl_logs_and_logs_follow_through_the_api_server(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    pod = await running_pod(kube, system, namespace, "talker")
    uid = pod["metadata"]["uid"]
    path = f"/api/v1/namespaces/{namespace}/pods/talker/log"

    # kubectl logs talker
    body = await eventually(lambda: kube.get(path),
                            until=lambda b: "heartbeat" in b.get("text", ""),
                            timeout=30, what="a heartbeat in the log")
    text = body["text"]
    assert "[mock] pulling image vllm/vllm-openai:v0.6" in text
    assert f"[mock] started {system.node_name}-{uid}" in text

    # kubectl logs --tail=1 --timestamps talker
    tail = (await kube.get(path, params={"tailLines": 1, "timestamps": True}))["text"]
    (line,) = tail.splitlines()
    stamp, _, rest = line.partition(" ")
    assert stamp.endswith("Z") and stamp[4] == "-" and "T" in stamp
    assert rest.startswith("[mock]")

    # kubectl logs --limit-bytes=10 talker
    assert len((await kube.get(path, params={"limitBytes": 10}))["text"]) == 10

    # kubectl logs -f talker: read a few new lines, then hang up
    seen: list[str] = []
    async with asyncio.timeout(30), kube.stream(
        path, params={"follow": True, "tailLines": 0}, read_timeout=20
    ) as resp:
        async for line in resp.aiter_lines():
            seen.append(line)
            if len(seen) >= 3:
                break
    assert len(seen) == 3 and all("heartbeat" in s for s in seen), seen
    numbers = [int(s.rsplit(" ", 1)[1]) for s in seen]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3

    # kubectl logs -p talker: clouds keep no previous containers
    with pytest.raises(BadRequestError) as err:
        await kube.get(path, params={"previous": True})
    assert "keeps no logs of previous containers" in str(err.value)

    # the API server's own kubelet-client certificate was what got these through
    metrics = await system.provider.metrics()  # type: ignore[union-attr]
    assert 'vkprovider_kubelet_api_auth_total{method="cert",outcome="allowed"}' in metrics


async def test_kubelet_api_refuses_anonymous_and_unauthorized_callers(
    kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster
) -> None:
    provider = await system.start()
    await node_ready(kube, system.node_name)
    await running_pod(kube, system, namespace, "guarded")

    async with kubelet_client(system) as http:
        resp = await http.get("/pods")
        assert resp.status_code == 401
        assert (await http.get("/containerLogs/x/y/z")).status_code == 401

    nobody = await sa_token(kube, namespace, "nobody")
    async with kubelet_client(system, token=nobody) as http:
        resp = await http.get("/pods")
        assert resp.status_code == 403
        assert f"user=system:serviceaccount:{namespace}:nobody" in resp.text
        assert "subresource=proxy" in resp.text

    reader = await sa_token(kube, namespace, "log-reader")
    role = f"kubelet-proxy-{uuid.uuid4().hex[:6]}"
    rules = [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]
    async with cluster_role(kube, name=role, sa_namespace=namespace, sa_name="log-reader",
                            rules=rules), kubelet_client(system, token=reader) as http:
        resp = await eventually(lambda: http.get(f"/containerLogs/{namespace}/guarded/main"),
                                until=lambda r: r.status_code == 200, timeout=45,
                                what="RBAC grant visible (deny cache is 30 s)")
        assert "[mock] pulling image" in resp.text
        assert (await http.get("/stats/summary")).status_code == 403  # nodes/stats: no

    admin = local_cluster.ca.issue(stem=f"e2e-admin-{uuid.uuid4().hex[:6]}",
                                   common_name="e2e-admin", organization="system:masters",
                                   client=True)
    async with kubelet_client(system, cert=(admin.cert, admin.key)) as http:
        resp = await http.get("/pods")
        assert resp.status_code == 200
        names = [p["metadata"]["name"] for p in resp.json()["items"]]
        assert names == ["guarded"]
        resp = await http.post(f"/exec/{namespace}/guarded/main",
                               params={"command": "nvidia-smi", "stdout": "true"},
                               headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1"})
        assert resp.status_code == 501
        assert resp.text.startswith("exec is not supported by provider cloud0")

    stranger = local_cluster.ca.issue(stem=f"e2e-stranger-{uuid.uuid4().hex[:6]}",
                                      common_name="e2e-stranger", client=True)
    async with kubelet_client(system, cert=(stranger.cert, stranger.key)) as http:
        resp = await http.get("/pods")
        assert resp.status_code == 403
        assert "user=e2e-stranger" in resp.text

    log = provider.log_text()
    assert nobody not in log and reader not in log


async def test_stats_summary_and_metrics_resource_carry_gpu_figures(
    kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    pod = await running_pod(kube, system, namespace, "trainer", gpus=2)
    uid = pod["metadata"]["uid"]

    def has_gpus(summary: dict[str, Any]) -> bool:
        return any(p["podRef"]["uid"] == uid and p["containers"][0].get("accelerators")
                   for p in summary.get("pods", []))

    # as metrics-server does: straight to the kubelet port with a cluster-CA client cert
    # (the API server's nodes/proxy refuses loopback InternalIPs, so it cannot be used here)
    async with metrics_reader(system, local_cluster) as http:
        summary = await eventually(lambda: get_json(http, "/stats/summary"), until=has_gpus,
                                   timeout=30, what="GPU figures in /stats/summary")
        resp = await http.get("/metrics/resource")
        assert resp.status_code == 200
        text = resp.text
    assert summary["node"]["nodeName"] == system.node_name
    (entry,) = [p for p in summary["pods"] if p["podRef"]["uid"] == uid]
    assert entry["podRef"] == {"name": "trainer", "namespace": namespace, "uid": uid}
    accs = entry["containers"][0]["accelerators"]
    assert len(accs) == 2
    for acc in accs:
        assert acc["model"] == "H100" and acc["make"] == "nvidia"
        assert 0 < acc["utilization"] <= 1 and 0 <= acc["tensorActive"] <= 1
        assert 0 < acc["memoryUsed"] <= acc["memoryTotal"]
        assert acc["temperatureCelsius"] > 0 and acc["powerWatts"] > 0
    families = {f.name: f for f in text_string_to_metric_families(text)}
    util = [s for s in families["vkprovider_pod_gpu_utilization_ratio"].samples
            if s.labels["pod"] == "trainer"]
    assert sorted(s.labels["gpu"] for s in util) == ["0", "1"]
    assert all(s.labels["namespace"] == namespace and s.labels["provider"] == "cloud0"
               for s in util)
    assert all(0 < s.value <= 1 for s in util)
    starts = families["container_start_time_seconds"].samples
    assert any(s.labels == {"container": "main", "namespace": namespace, "pod": "trainer"}
               for s in starts)
    assert families["resource_scrape_error"].samples[0].value == 0

    metrics = await system.provider.metrics()  # type: ignore[union-attr]
    prom = {f.name: f for f in text_string_to_metric_families(metrics)}
    power = [s for s in prom["vkprovider_pod_gpu_power_watts"].samples
             if s.labels.get("pod") == "trainer"]
    assert len(power) == 2

    async def pods_gauge() -> dict[tuple[str, str], float]:
        text = await system.provider.metrics()  # type: ignore[union-attr]
        return {(s.labels["phase"], s.labels["provider"]): s.value
                for f in text_string_to_metric_families(text) if f.name == "vkprovider_pods"
                for s in f.samples}

    await eventually(pods_gauge, until=lambda g: g.get(("Running", "cloud0")) == 1,
                     timeout=15, what="vkprovider_pods{phase=Running,provider=cloud0} == 1")


async def test_secret_env_values_never_reach_logs_or_metrics(
    kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster
) -> None:
    secret_value = f"s3cr3t-{uuid.uuid4().hex}"
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"},
        "stringData": {"token": secret_value}})
    provider = await system.start()
    await node_ready(kube, system.node_name)
    env = [{"name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]
    await running_pod(kube, system, namespace, "secretive", env=env)
    async with metrics_reader(system, local_cluster) as http:
        await eventually(lambda: get_json(http, "/stats/summary"),
                         until=lambda s: any(p["containers"][0].get("accelerators")
                                             for p in s.get("pods", [])),
                         timeout=30, what="a GPU metrics refresh")
        kubelet = {path: (await http.get(path)).text
                   for path in ("/stats/summary", "/metrics/resource", "/pods",
                                "/runningpods/")}
    log_text = (await kube.get(f"/api/v1/namespaces/{namespace}/pods/secretive/log"))["text"]
    assert "env_vars=1" in log_text  # the cloud got the resolved variable

    outputs = {"provider log": provider.log_text(), "/metrics": await provider.metrics(),
               **kubelet}
    for where, text in outputs.items():
        assert text, where
        assert secret_value not in text, f"the Secret's value leaked into {where}"

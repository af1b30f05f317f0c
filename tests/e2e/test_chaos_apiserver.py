"""kube-apiserver stops and starts mid-burst: the provider's watches relist and it converges.

Runs on its own LocalCluster (not the session's shared one), since it restarts the API server.
Pods created while the provider's watch was broken, and pods whose status writes failed during
the outage, must all end Running with exactly one instance per pod UID.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest

from vkprovider.testing.cluster import LocalCluster, find_binaries
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess, install_provider_rbac
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster

NODE = "vk-apiserver-restart"
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "restart"},
                         "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": {"nodeName": NODE, "tolerations": [TOLERATION],
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def test_provider_converges_after_an_apiserver_restart_mid_burst(tmp_path: Path) -> None:
    cluster = LocalCluster(bin_dir=find_binaries(), log_dir=tmp_path / "logs")
    cloud = MockCloudProcess(work_dir=tmp_path, name="restart", boot_delay=0.5,
                             inventory="H100:us-east:200:2.49")
    provider: ProviderProcess | None = None
    try:
        await cluster.start()
        async with cluster.client() as kube:
            kubeconfig = await install_provider_rbac(kube=kube, cluster=cluster,
                                                     path=tmp_path / "provider.kubeconfig")
            await cloud.start()
            provider = ProviderProcess(work_dir=tmp_path, kubeconfig=kubeconfig, node_name=NODE,
                                       clouds=[cloud], client_ca_file=cluster.ca_path)
            provider.start()

            async def node() -> dict[str, Any] | None:
                try:
                    return await kube.get(f"/api/v1/nodes/{NODE}")
                except Exception:
                    return None

            await eventually(node, timeout=60, what="the virtual node registered",
                             until=lambda n: bool(n) and n["status"].get("allocatable", {}).get(
                                 "nvidia.com/gpu", "0") != "0")
            await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": "restart"}})
            await asyncio.gather(*(kube.create("/api/v1/namespaces/restart/pods", pod(f"a{i}"))
                                   for i in range(30)))
            await eventually(cloud.stats, until=lambda s: s["instances_created"] >= 5,
                             timeout=60, interval=0.05, what="a partial burst")

            cluster.restart_apiserver()
            await cluster.wait_ready(timeout=60)
            await asyncio.gather(*(kube.create("/api/v1/namespaces/restart/pods", pod(f"b{i}"))
                                   for i in range(30)))

            async def pods() -> list[dict[str, Any]]:
                body = await kube.get("/api/v1/namespaces/restart/pods")
                return list(body["items"])

            running = await eventually(
                pods, timeout=180, interval=0.5, what="60 pods Running after the restart",
                until=lambda ps: len(ps) == 60 and all(
                    p["status"].get("phase") == "Running" for p in ps))
            assert provider.component.alive(), "the provider must ride out the outage"
            ledger = await cloud.ledger()
            per_uid = collections.Counter(e["uid"] for e in ledger)
            assert set(per_uid) == {p["metadata"]["uid"] for p in running}
            assert max(per_uid.values()) == 1, "a pod ran twice"

            await kube.request("DELETE", "/api/v1/namespaces/restart/pods")
            await eventually(cloud.ledger, timeout=90, what="zero live instances",
                             until=lambda led: all(e["state"] == "deleted" for e in led))
    finally:
        if provider is not None:
            provider.stop()
        cloud.stop()
        cluster.stop()

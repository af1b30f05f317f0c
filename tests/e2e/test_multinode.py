"""Several virtual nodes, one companion: shared budgets, node-scoped policies, move-back from all.

A cluster that outgrows one provider process runs several virtual nodes (one Deployment each,
e.g. per cloud or region); one companion serves them all. Node A's cloud has room for 2 GPUs
and node B's for 3, 2 of which the pinned replicas take first: the 3 inference replicas the
budget allows must use both nodes, and no more may be admitted (given the toleration) at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import CompanionProcess, grant_provider_node
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_overflow import POLICIES, gpu_deployment, pods, policy

pytestmark = pytest.mark.cluster


def external(ps: list[dict[str, Any]], nodes: set[str]) -> list[dict[str, Any]]:
    return [p for p in ps if p["spec"].get("nodeName") in nodes
            and p["status"].get("phase") == "Running"]


async def test_one_companion_serves_two_virtual_nodes(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    provider_kubeconfig: Path, companion_kubeconfig: Path, local_cluster: LocalCluster,
    cluster_objects: Cluster, tmp_path: Path,
) -> None:
    pool = {"vkprovider.io/pool": namespace}
    await system.start(clouds=1, node_labels=pool, taint_value="vkprovider-a",
                       inventories=["H100:us-east:2:2.49"])
    other = System(work_dir=tmp_path / "b", kubeconfig=provider_kubeconfig, kube=kube,
                   client_ca=local_cluster.ca_path)
    (tmp_path / "b").mkdir()
    await grant_provider_node(kube=kube, node=other.node_name)
    a, b = system.node_name, other.node_name
    companion = CompanionProcess(work_dir=tmp_path, kubeconfig=companion_kubeconfig,
                                 node_name=[a, b], interval=0.5, move_back_interval=1.0)
    try:
        await other.start(clouds=1, node_labels=pool, taint_value="vkprovider-b",
                          inventories=["H100:us-east:3:2.49"])
        companion.start()
        tag = uuid.uuid4().hex[:6]
        scoped = policy(f"scoped-{tag}", namespace=namespace, app="pinned", providers=["cloud0"])
        scoped["spec"]["nodes"] = [b]
        scoped["spec"]["moveBack"] = {"enabled": False}
        shared = policy(f"shared-{tag}", namespace=namespace, app="inference",
                        providers=["cloud0"], limits={"maxPods": 3})
        shared["spec"]["moveBack"] = {"enabled": True, "stableFor": "1s", "maxConcurrent": 3,
                                      "cooldown": "1s", "timeout": "60s"}
        await cluster_objects.create(POLICIES, scoped)
        await cluster_objects.create(POLICIES, shared)
        deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        await kube.create(deployments, gpu_deployment("pinned", replicas=2, pool=namespace))

        pinned = await eventually(lambda: pods(kube, namespace, "pinned"), timeout=120,
                                  until=lambda ps: len(external(ps, {a, b})) == 2,
                                  what="the pinned replicas Running outside")
        assert {p["spec"]["nodeName"] for p in pinned} == {b}, "spec.nodes keeps them to node B"
        # bound to node A by hand anyway: node A's provider refuses it, no cloud call
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "stray", "labels": {"app": "pinned"},
                         "annotations": {"vkprovider.io/overflow-policy": scoped["metadata"][
                             "name"]}},
            "spec": {"nodeName": a, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "x:1", "resources": {
                         "limits": {"nvidia.com/gpu": "1"}}}]}})
        stray = await eventually(
            lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/stray"), timeout=60,
            until=lambda p: p["status"].get("phase") == "Failed", what="the stray pod refused")
        assert stray["status"]["reason"] == "NotAdmitted"
        assert f"do not include {a}" in stray["status"]["message"]

        await kube.create(deployments, gpu_deployment("inference", replicas=5, pool=namespace))

        running = await eventually(lambda: pods(kube, namespace, "inference"), timeout=90,
                                   until=lambda ps: len(external(ps, {a, b})) == 3,
                                   what="3 inference replicas outside (maxPods 3)")
        assert {p["spec"]["nodeName"] for p in external(running, {a, b})} == {a, b}, \
            "neither node has room for all 3"
        # the budget holds across both nodes: the two others are never admitted
        for _ in range(6):
            now = await pods(kube, namespace, "inference")
            admitted = [p for p in now if (p["metadata"].get("annotations") or {}).get(
                "vkprovider.io/overflow-policy")]
            assert len(admitted) == 3, [p["metadata"]["name"] for p in admitted]
            await asyncio.sleep(0.5)

        internal = await gpu_nodes.create(count=1, gpus=5)
        home = await eventually(
            lambda: pods(kube, namespace, "inference"), timeout=180,
            until=lambda ps: len(ps) == 5 and all(
                p["spec"].get("nodeName") in internal and p["status"].get("phase") == "Running"
                for p in ps),
            what="every inference replica home, from both virtual nodes")
        assert len(home) == 5
        still = [p for p in await pods(kube, namespace, "pinned")
                 if p["metadata"]["name"] != "stray"]
        assert {p["spec"]["nodeName"] for p in still} == {b}, "moveBack disabled: they stay"
    finally:
        companion.stop()
        other.stop()
        with contextlib.suppress(Exception):
            await kube.delete(f"/api/v1/nodes/{b}")

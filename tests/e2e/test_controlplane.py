"""The local control plane behaves like a real cluster: scheduling, preemption, teardown."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import COMPONENTS, LocalCluster, find_binaries
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster


def gpu_container(gpus: int) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "inference:1",
        "resources": {
            "requests": {"nvidia.com/gpu": str(gpus)},
            "limits": {"nvidia.com/gpu": str(gpus)},
        },
    }


def deployment(
    name: str, *, replicas: int, pool: str, gpus: int = 1, priority_class: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [gpu_container(gpus)],
        "nodeSelector": {"vkprovider.io/pool": pool},
        "terminationGracePeriodSeconds": 1,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


async def pods_of(kube: KubeClient, namespace: str, app: str) -> list[dict[str, Any]]:
    body = await kube.get(
        f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": f"app={app}"}
    )
    return list(body["items"])


def test_binaries_report_their_release_version() -> None:
    folder = find_binaries()
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        out = subprocess.run(
            [str(folder / name), "--version"], capture_output=True, text=True, check=True
        ).stdout
        assert "v1.37.2" in out, f"{name}: {out}"
    etcd = subprocess.run(
        [str(folder / "etcd"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert "etcd Version: 3." in etcd


async def test_gpu_deployment_is_scheduled_onto_simulated_gpu_nodes(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory
) -> None:
    nodes = await gpu_nodes.create(count=2, gpus=2)
    await kube.create(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        deployment("infer", replicas=3, pool=namespace),
    )

    dep = await eventually(
        lambda: kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/infer"),
        until=lambda d: d.get("status", {}).get("availableReplicas") == 3,
        timeout=90,
        what="3 available replicas",
    )
    assert dep["status"]["availableReplicas"] == 3
    pods = await pods_of(kube, namespace, "infer")
    assert len(pods) == 3
    assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)
    assert all(p["status"]["phase"] == "Running" for p in pods)


async def test_pod_asking_more_gpus_than_any_node_stays_unschedulable(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory
) -> None:
    await gpu_nodes.create(count=1, gpus=4)
    await kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "too-big"},
            "spec": {
                "containers": [gpu_container(8)],
                "nodeSelector": {"vkprovider.io/pool": namespace},
            },
        },
    )

    def unschedulable(pod: dict[str, Any]) -> bool:
        conds = pod.get("status", {}).get("conditions") or []
        return any(
            c["type"] == "PodScheduled"
            and c["status"] == "False"
            and c.get("reason") == "Unschedulable"
            for c in conds
        )

    pod = await eventually(
        lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/too-big"),
        until=unschedulable,
        timeout=60,
        what="PodScheduled=False",
    )
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    msg = next(c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "nvidia.com/gpu" in msg


async def test_higher_priority_pod_preempts_and_replacement_stays_pending(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory
) -> None:
    await gpu_nodes.create(count=1, gpus=2)
    low, high = f"{namespace}-low", f"{namespace}-high"
    for name, value in ((low, 100), (high, 1000)):
        await kube.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    try:
        await kube.create(
            f"/apis/apps/v1/namespaces/{namespace}/deployments",
            deployment("infer", replicas=2, pool=namespace, priority_class=low),
        )
        await eventually(
            lambda: kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/infer"),
            until=lambda d: d.get("status", {}).get("availableReplicas") == 2,
            timeout=90,
            what="2 low-priority replicas available",
        )
        before = {p["metadata"]["uid"] for p in await pods_of(kube, namespace, "infer")}

        await kube.create(
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "train-0"},
                "spec": {
                    "containers": [gpu_container(1)],
                    "priorityClassName": high,
                    "nodeSelector": {"vkprovider.io/pool": namespace},
                },
            },
        )
        train = await eventually(
            lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/train-0"),
            until=lambda p: p.get("status", {}).get("phase") == "Running",
            timeout=90,
            what="the high-priority pod running",
        )
        assert train["spec"]["nodeName"]

        def replaced(pods: list[dict[str, Any]]) -> bool:
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            new = [p for p in live if p["metadata"]["uid"] not in before]
            return len(live) == 2 and len(new) == 1 and _unschedulable(new[0])

        pods = await eventually(
            lambda: pods_of(kube, namespace, "infer"),
            until=replaced,
            timeout=90,
            what="a pending replacement for the victim",
        )
        victims = before - {p["metadata"]["uid"] for p in pods}
        assert len(victims) == 1
        # The replacement stays Pending: the node is full with higher-priority work.
        await asyncio.sleep(3)
        pods = await pods_of(kube, namespace, "infer")
        new = [p for p in pods if p["metadata"]["uid"] not in before]
        assert [p["status"]["phase"] for p in new] == ["Pending"]
    finally:
        for name in (low, high):
            await kube.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def _unschedulable(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)


async def test_teardown_leaves_no_process_and_no_temp_files(tmp_path: Path) -> None:
    cluster = LocalCluster(bin_dir=find_binaries())
    await cluster.start()
    pids = cluster.pids()
    assert len(pids) == len(COMPONENTS)
    work = cluster.work_dir
    cluster.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not work.exists()


async def test_another_process_adopts_a_running_cluster_and_stops_it_by_process_group(
        tmp_path: Path) -> None:
    """How pytest-xdist workers share one cluster (vkprovider.testing.plugin): one starts it and
    saves its state, another adopts it (its API, its CA, its logs), and the controller, which
    started none of its processes, stops it."""
    cluster = LocalCluster(bin_dir=find_binaries())
    await cluster.start()
    try:
        state = tmp_path / "cluster.json"
        cluster.save(state)
        adopted = LocalCluster.adopt(state)
        assert sorted(adopted.pids()) == sorted(cluster.pids())
        assert adopted.server == cluster.server
        async with adopted.client() as kube:
            assert (await kube.get("/api/v1/namespaces/default"))["metadata"]["name"] == "default"
        pair = adopted.ca.issue(stem="adopter", common_name="adopter", client=True)
        issued = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        issued.verify_directly_issued_by(
            x509.load_pem_x509_certificate(cluster.ca_path.read_bytes()))
        assert {n: c.log_path for n, c in adopted.components.items()} == {
            n: c.log_path for n, c in cluster.components.items()}
        adopted.stop()
        assert not any(c.alive() for c in adopted.components.values())
        assert not cluster.work_dir.exists()
    finally:
        cluster.stop()  # reaps what the adopter ended (they are this process's children)
    for pid in adopted.pids():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

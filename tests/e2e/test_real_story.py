"""The story over the real path: overflow and move-back under a client pod's load, via kube-proxy.

Inference (two replicas, busybox httpd) runs on the real node, which advertises two GPUs for
the test. A training Job of higher priority takes them: the scheduler preempts inference, the
companion overflows the replacements to the mock cloud, whose instances' public addresses live
in namespaces beside the node (:class:`vkprovider.testing.netspace.InstanceSpaces`, a model
server on each published port, gone when the instance stops running). Training ends, the
companion moves the replicas back make-before-break and the instances are deleted. A client pod
on the real node sends requests to the Service's ClusterIP the whole time; kube-proxy's rules
deliver them; the client counts what failed, chapter by chapter. No address table anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import CompanionProcess, grant_provider_node
from vkprovider.testing.netspace import InstanceSpaces
from vkprovider.testing.realnode import BUSYBOX_IMAGE, TOLERATION, RealNode, find_kubectl
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_moveback import live_instances
from .test_overflow import POLICIES, PRIORITY, policy
from .test_pods import node_ready
from .test_real_node import busybox_pod, running
from .test_real_traffic import GPU, PORT

pytestmark = pytest.mark.cluster

REPLICAS = 2
PRODUCT = "NVIDIA-H100-80GB-HBM3"
TRAINING_SECONDS = 15

#: the client's load: requests one after another, forever; one line per request
CLIENT = """\
while true; do
  reply=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 80 2>&1)
  case "$reply" in
    "HTTP/1."?" 200 "*) echo "ok $(printf '%s\\n' "$reply" | tail -n 1)" ;;
    *) echo "fail $(printf '%s\\n' "$reply" | head -n 1)" ;;
  esac
done
"""


def inference(*, pool: str, priority_class: str) -> dict[str, Any]:
    labels = {"app": "inference"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "inference"},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels, "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": {
                "nodeSelector": {"vkprovider.io/pool": pool},
                "tolerations": [TOLERATION],
                "priorityClassName": priority_class,
                "terminationGracePeriodSeconds": 1,
                "automountServiceAccountToken": False,
                "containers": [{
                    "name": "server", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c",
                                "mkdir -p /www && printf '{\"replica\":\"%s\"}\\n' "
                                "\"$(hostname)\" > /www/index.html && "
                                f"exec httpd -f -p {PORT} -h /www"],
                    "ports": [{"name": "http", "containerPort": PORT}],
                    "resources": {"limits": {GPU: "1"}},
                }]}}}}


def training(*, node: str, priority_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "training"},
        "spec": {"parallelism": REPLICAS, "completions": REPLICAS, "backoffLimit": 0,
                 "template": {"metadata": {"labels": {"app": "training"}}, "spec": {
                     "restartPolicy": "Never", "priorityClassName": priority_class,
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [TOLERATION],
                     "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "t", "image": BUSYBOX_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["sleep", str(TRAINING_SECONDS)],
                                     "resources": {"limits": {GPU: "1"}}}]}}}}


def client_log(cluster: LocalCluster, ns: str, pod: str) -> list[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run([str(find_kubectl()), "-n", ns, "logs", pod], capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done
    return [line for line in done.stdout.splitlines() if line.startswith(("ok ", "fail "))]


class Chapters:
    """Marks in the client's log: a chapter is the lines between two marks."""

    def __init__(self, *, cluster: LocalCluster, ns: str, pod: str) -> None:
        self.cluster, self.ns, self.pod = cluster, ns, pod
        self.marks: list[tuple[str, int, float]] = []
        self.lines: list[str] = []

    async def read(self) -> int:
        self.lines = await asyncio.to_thread(client_log, self.cluster, self.ns, self.pod)
        return len(self.lines)

    async def mark(self, label: str) -> None:
        self.marks.append((label, await self.read(), time.monotonic()))

    def table(self) -> list[dict[str, Any]]:
        rows = []
        for (label, start, t0), (_, end, t1) in zip(self.marks, self.marks[1:], strict=False):
            lines = self.lines[start:end]
            by: Counter[str] = Counter()
            failed: Counter[str] = Counter()
            for line in lines:
                verdict, _, rest = line.partition(" ")
                if verdict == "ok":
                    by[json.loads(rest)["replica"]] += 1
                else:
                    failed[rest] += 1
            rows.append({"chapter": label, "seconds": round(t1 - t0, 1), "requests": len(lines),
                         "failed": sum(failed.values()), "failures": dict(failed),
                         "by replica": dict(by)})
        return rows


async def inference_pods(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/pods",
                          params={"labelSelector": "app=inference"})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def all_on(pods: list[dict[str, Any]], node: str) -> bool:
    return len(pods) == REPLICAS and all(
        p["spec"].get("nodeName") == node and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []) for p in pods)


async def test_overflow_and_move_back_under_a_client_pods_load_through_kube_proxy(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str,
        provider_kubeconfig: Path, companion_kubeconfig: Path, cluster_objects: Cluster,
        tmp_path: Path) -> None:
    t0 = time.monotonic()
    system = System(work_dir=tmp_path, kubeconfig=provider_kubeconfig, kube=kube,
                    client_ca=local_cluster.ca_path, network=None)
    await grant_provider_node(kube=kube, node=system.node_name)
    node_path = f"/api/v1/nodes/{real_node.name}"
    spaces: InstanceSpaces | None = None
    chapters: Chapters | None = None
    try:
        # the real node is this namespace's GPU pool: two H100s, as a GPU node would say
        await kube.patch(node_path, {"metadata": {"labels": {
            "vkprovider.io/pool": namespace, "nvidia.com/gpu.product": PRODUCT,
            "nvidia.com/gpu.count": str(REPLICAS)}}})
        await kube.patch(f"{node_path}/status", {"status": {"capacity": {GPU: str(REPLICAS)}}})
        await eventually(lambda: kube.get(node_path), timeout=30,
                         until=lambda n: n["status"].get("allocatable", {}).get(GPU)
                         == str(REPLICAS), what="the real node's GPUs allocatable")
        await system.start(clouds=1, node_labels={"vkprovider.io/pool": namespace})
        await node_ready(kube, system.node_name)
        system.companion = CompanionProcess(work_dir=tmp_path, kubeconfig=companion_kubeconfig,
                                            node_name=system.node_name, interval=0.5,
                                            move_back_interval=1.0)
        system.companion.start()
        tag = uuid.uuid4().hex[:6]
        low, high = f"inf-{tag}", f"train-{tag}"
        for name, value in ((low, 100), (high, 1000)):
            await cluster_objects.create(PRIORITY, {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value})
        body = policy(f"mb-{tag}", namespace=namespace, app="inference", providers=["cloud0"])
        body["spec"]["moveBack"] = {"enabled": True, "stableFor": "2s", "maxConcurrent": 2,
                                    "cooldown": "5s", "timeout": "60s"}
        await cluster_objects.create(POLICIES, body)
        svc = await kube.create(f"/api/v1/namespaces/{namespace}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "inference"},
            "spec": {"selector": {"app": "inference"},
                     "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}})
        cluster_ip = svc["spec"]["clusterIP"]
        await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                          inference(pool=namespace, priority_class=low))
        await eventually(lambda: inference_pods(kube, namespace), timeout=90,
                         until=lambda ps: all_on(ps, real_node.name),
                         what="inference Ready on the real node")
        spaces = InstanceSpaces(node=real_node, instances=system.clouds[0].instances,
                                container_port=PORT)
        await spaces.start()
        client = f"client-{tag}"
        await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                          busybox_pod(real_node, client, CLIENT.format(ip=cluster_ip)))
        await running(kube, namespace, client)
        chapters = Chapters(cluster=local_cluster, ns=namespace, pod=client)
        await eventually(chapters.read, until=lambda n: n >= 20, timeout=60,
                         what="the client's first requests")
        await chapters.mark("inside")
        await eventually(chapters.read, until=lambda n: n >= chapters.marks[-1][1] + 50,
                         timeout=60, what="load inside")

        await chapters.mark("way out")
        await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs",
                          training(node=real_node.name, priority_class=high))
        await eventually(lambda: inference_pods(kube, namespace), timeout=120,
                         until=lambda ps: all_on(ps, system.node_name),
                         what="inference Ready on the cloud")
        await eventually(lambda: asyncio.sleep(0, spaces.open_count()), timeout=60,
                         until=lambda n: n == REPLICAS, what="the instances' addresses served")
        await chapters.mark("on the cloud")
        await eventually(chapters.read, until=lambda n: n >= chapters.marks[-1][1] + 50,
                         timeout=60, what="load on the cloud")

        await chapters.mark("way back")
        await eventually(lambda: inference_pods(kube, namespace), timeout=180, interval=0.5,
                         until=lambda ps: all_on(ps, real_node.name),
                         what="every replica back on the real node and Ready")
        await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=60,
                         what="every cloud instance deleted")
        await chapters.mark("home")
        await eventually(chapters.read, until=lambda n: n >= chapters.marks[-1][1] + 50,
                         timeout=60, what="load at home")
        await chapters.mark("end")
        rows = chapters.table()
        served = {name: s.counters.traffic for name, s in spaces.servers.items()}
        print("\nthe story over kube-proxy (client pod's counts):")
        for row in rows:
            print(f"  {row['chapter']:<13} {row['seconds']:>6}s  requests {row['requests']:>5}"
                  f"  failed {row['failed']:>4}  by replica {row['by replica']}"
                  f"{'  failures ' + str(row['failures']) if row['failures'] else ''}")
        print(f"  cloud model servers counted {served}; bring-up {round(time.monotonic() - t0)}s")
        by = {row["chapter"]: row for row in rows}
        assert by["inside"]["failed"] == 0 and by["home"]["failed"] == 0, rows
        assert by["on the cloud"]["failed"] == 0, rows
        cloud_seen = {r for row in rows for r in row["by replica"] if r in served}
        assert len(cloud_seen) == REPLICAS, (rows, served)  # both instances answered
        # each cloud server counted exactly what the client saw it answer
        for name, count in served.items():
            assert count == sum(row["by replica"].get(name, 0) for row in rows), (rows, served)
        assert not any(r in served for r in by["home"]["by replica"]), rows
        assert by["way back"]["failed"] == 0, rows
    finally:
        if chapters is not None and chapters.marks:
            with contextlib.suppress(Exception):
                await chapters.read()
        if spaces is not None:
            await spaces.stop()
        system.stop()
        if system.companion is not None:
            system.companion.stop()
        for path in (f"/apis/apps/v1/namespaces/{namespace}/deployments/inference",
                     f"/apis/batch/v1/namespaces/{namespace}/jobs/training",
                     f"/api/v1/nodes/{system.node_name}"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)
        await kube.patch(f"{node_path}/status", {"status": {"capacity": {GPU: None},
                                                            "allocatable": {GPU: None}}})
        await kube.patch(node_path, {"metadata": {"labels": {
            "vkprovider.io/pool": None, "nvidia.com/gpu.product": None,
            "nvidia.com/gpu.count": None}}})

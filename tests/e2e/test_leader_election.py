"""Two replicas of ``vkprovider run`` for one virtual node: one acts, the other takes over.

Real control plane, one mock cloud, two provider processes with leader election on (a Lease in
vkprovider-system, RBAC from manifests/). The leader is killed with SIGKILL in the middle of a
burst; the mock cloud's ledger proves that every pod ran exactly once and nothing leaked.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.waiting import eventually

from .conftest import System

pytestmark = pytest.mark.cluster

TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vkprovider",
              "effect": "NoSchedule"}
LEASE_DURATION = 10.0
ELECTION = {"enabled": True, "lease_duration_seconds": LEASE_DURATION,
            "renew_deadline_seconds": 6, "retry_period_seconds": 1}
PODS = 50


class Replicas:
    def __init__(self) -> None:
        self.all: list[ProviderProcess] = []


@pytest_asyncio.fixture
async def replicas(system: System) -> AsyncIterator[Replicas]:
    out = Replicas()
    try:
        yield out
    finally:
        for proc in out.all:
            if proc is not system.provider:
                proc.stop()


def replica(system: System, local_cluster: LocalCluster, cloud: MockCloudProcess, name: str
            ) -> ProviderProcess:
    return ProviderProcess(
        work_dir=system.work_dir, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=[cloud], client_ca_file=local_cluster.ca_path, replica=name,
        env={"POD_NAME": f"{system.node_name}-{name}"},
        extra={"leader_election": ELECTION})


async def lease_holder(kube: KubeClient, node: str) -> str | None:
    try:
        lease = await kube.get("/apis/coordination.k8s.io/v1/namespaces/vkprovider-system/"
                               f"leases/vkprovider-{node}")
    except Exception:
        return None
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


async def kubelet_port(kube: KubeClient, node: str) -> int | None:
    try:
        body = await kube.get(f"/api/v1/nodes/{node}")
    except Exception:
        return None
    ready = any(c["type"] == "Ready" and c["status"] == "True"
                for c in (body.get("status") or {}).get("conditions") or [])
    port = (((body.get("status") or {}).get("daemonEndpoints") or {}).get("kubeletEndpoint")
            or {}).get("Port")
    return int(port) if ready and port else None


async def pods(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    return list((await kube.get(f"/api/v1/namespaces/{ns}/pods"))["items"])


async def test_one_replica_acts_and_the_standby_takes_over_after_kill_9(
    kube: KubeClient, namespace: str, system: System, replicas: Replicas,
    local_cluster: LocalCluster,
) -> None:
    cloud = MockCloudProcess(work_dir=system.work_dir, name="cloud0", boot_delay=0.5,
                             inventory="H100:us-east:256:2.49")
    await cloud.start()
    system.clouds.append(cloud)
    node = system.node_name
    first = replica(system, local_cluster, cloud, "a")
    second = replica(system, local_cluster, cloud, "b")
    replicas.all += [first, second]
    system.provider = first  # its log is printed if the test fails
    first.start()
    await eventually(lambda: lease_holder(kube, node), until=lambda h: h == f"{node}-a",
                     timeout=30, what="replica a leads")
    second.start()
    assert await eventually(lambda: kubelet_port(kube, node),
                            until=lambda p: p == first.kubelet_port, timeout=60,
                            what="the node registered by the leader (its kubelet port)")
    await asyncio.sleep(2)
    assert "waiting for leadership" in second.log_text()
    assert '"msg":"starting"' not in second.log_text(), "the standby must not act"
    assert await lease_holder(kube, node) == f"{node}-a"

    await asyncio.gather(*(kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"burst-{i}", "annotations": {"vkprovider.io/gpu-type": "H100"}},
        "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                 "nodeSelector": {"kubernetes.io/hostname": node},
                 "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 1}})
        for i in range(PODS)))
    await eventually(cloud.ledger, until=lambda led: len(led) >= 10, timeout=60, interval=0.05,
                     what="the leader in the middle of the burst")
    first.kill()
    killed = time.monotonic()
    await eventually(lambda: lease_holder(kube, node), until=lambda h: h == f"{node}-b",
                     timeout=LEASE_DURATION + 10, interval=0.2, what="replica b takes over")
    took = time.monotonic() - killed
    assert took <= LEASE_DURATION + 5, f"takeover took {took:.1f}s"

    everything = await eventually(
        lambda: pods(kube, namespace), timeout=120, interval=0.5, what="all pods Running",
        until=lambda ps: len(ps) == PODS and all(p["status"].get("phase") == "Running"
                                                 for p in ps))
    assert await kubelet_port(kube, node) == second.kubelet_port
    uids = {p["metadata"]["uid"] for p in everything}
    ledger = await cloud.ledger()
    per_uid = collections.Counter(e["uid"] for e in ledger)
    assert set(per_uid) == uids, "an instance for no pod (orphan) or a pod without one"
    assert all(n == 1 for n in per_uid.values()), [u for u, n in per_uid.items() if n > 1]
    assert sum(1 for e in ledger if e["state"] not in ("deleted", "terminating")) == PODS
    assert "instance created" not in second.log_text().split("became leader")[0]

    # A clean stop hands the Lease over at once.
    second.stop()
    assert second.returncode() == 0
    assert await eventually(lambda: lease_holder(kube, node), until=lambda h: h is None,
                            timeout=5, what="the Lease released") is None
    with contextlib.suppress(Exception):
        await kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/vkprovider-system/leases/"
                          f"vkprovider-{node}")

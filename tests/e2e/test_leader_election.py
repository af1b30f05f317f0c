"""Two replicas of ``vkprovider run`` for one virtual node: one acts, the other takes over.

Real control plane, one mock cloud, two provider processes with leader election on (a Lease in
vkprovider-system, RBAC from manifests/). The leader is killed with SIGKILL in the middle of a
burst; the mock cloud's ledger proves that every pod ran exactly once and nothing leaked.

A partition is not a crash: the leader that talks to the API server through a
:class:`BlackHoleProxy` keeps running, with its connections open and unanswered, when the proxy
is black-holed. Its renewals are bounded by the renew deadline, so it stops acting (the logs'
timestamps) before the standby becomes leader, and the ledger again shows each pod ran once. Its
process is gone before the standby's acquireTime (it sends nothing more over the failed link);
the companion, partitioned the same way, too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from vkprovider.kube import KubeClient
from vkprovider.metrics import LEADER, Metrics, StandbyMetrics
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import CompanionProcess, MockCloudProcess, ProviderProcess
from vkprovider.testing.proxy import BlackHoleProxy
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


def replica(system: System, local_cluster: LocalCluster, cloud: MockCloudProcess, name: str,
            *, kubeconfig: Path | None = None) -> ProviderProcess:
    return ProviderProcess(
        work_dir=system.work_dir, kubeconfig=kubeconfig or system.kubeconfig,
        node_name=system.node_name,
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


async def standby_health(port: int) -> str:
    """``/healthz`` of a replica's metrics port ("" while it does not answer)."""
    async with httpx.AsyncClient(timeout=5) as http:
        try:
            return (await http.get(f"http://127.0.0.1:{port}/healthz")).text
        except httpx.TransportError:
            return ""


async def pods(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    return list((await kube.get(f"/api/v1/namespaces/{ns}/pods"))["items"])


async def start_cloud(system: System) -> MockCloudProcess:
    """The one mock cloud both replicas share (stopped with the system)."""
    cloud = MockCloudProcess(work_dir=system.work_dir, name="cloud0", boot_delay=0.5,
                             inventory="H100:us-east:256:2.49")
    await cloud.start()
    system.clouds.append(cloud)
    return cloud


async def test_one_replica_acts_and_the_standby_takes_over_after_kill_9(
    kube: KubeClient, namespace: str, system: System, replicas: Replicas,
    local_cluster: LocalCluster,
) -> None:
    cloud = await start_cloud(system)
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
    await eventually(lambda: standby_health(second.metrics_port), timeout=60,
                     until=lambda text: "standby" in text,
                     what="replica b up and standing by")  # a loaded machine starts it slowly
    await asyncio.sleep(2)
    assert "waiting for leadership" in second.log_text()
    assert '"msg":"starting"' not in second.log_text(), "the standby must not act"
    assert await lease_holder(kube, node) == f"{node}-a"
    async with httpx.AsyncClient() as http:  # both replicas Ready: a standby is healthy too
        health = await http.get(f"http://127.0.0.1:{second.metrics_port}/healthz")
        scrapes = {name: await http.get(f"http://127.0.0.1:{proc.metrics_port}/metrics")
                   for name, proc in (("leader", first), ("standby", second))}
    assert health.status_code == 200 and "standby" in health.text
    # both are scraped (no target down); the names each serves are its registry's, which
    # tests/unit/test_alerts.py holds the alerts against
    for name, answer in scrapes.items():
        assert answer.status_code == 200, (name, answer.status_code)  # no target down
    families = {name: {f.name: f for f in text_string_to_metric_families(answer.text)}
                for name, answer in scrapes.items()}
    for name in scrapes:
        (leading,) = families[name][LEADER].samples
        assert leading.labels == {"virtual_node": node}
        assert leading.value == (1 if name == "leader" else 0), name
    for name, registry in (("leader", Metrics().registry),
                           ("standby", StandbyMetrics(node=node).registry)):
        served = {n for n in families[name] if not n.endswith("_created")}  # parsed apart
        assert served == {f.name for f in registry.collect()}, name

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


def kubeconfig_via(*, source: Path, server: str, path: Path) -> Path:
    """A copy of ``source`` whose cluster ``server`` is ``server`` (same CA, same token)."""
    config = yaml.safe_load(source.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def log_records(proc: ProviderProcess) -> list[dict[str, Any]]:
    """The JSON lines of a provider's log, each with ``at`` (its ``ts`` as a datetime)."""
    out = []
    for line in proc.log_text().splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            record["at"] = datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
            out.append(record)
    return out


def first_at(records: list[dict[str, Any]], msg: str) -> datetime:
    found = [r["at"] for r in records if r.get("msg") == msg]
    assert found, f"no {msg!r} in the log"
    return min(found)


def pod_body(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 1}}


async def test_a_partitioned_leader_stops_acting_before_the_standby_takes_over(
    kube: KubeClient, namespace: str, system: System, replicas: Replicas,
    local_cluster: LocalCluster,
) -> None:
    cloud = await start_cloud(system)
    node = system.node_name
    api = urlsplit(local_cluster.server)
    assert api.hostname and api.port
    async with BlackHoleProxy(target_host=api.hostname, target_port=api.port) as proxy:
        proxied = kubeconfig_via(source=system.kubeconfig, server=proxy.url,
                                 path=system.work_dir / "proxied.kubeconfig")
        first = replica(system, local_cluster, cloud, "a", kubeconfig=proxied)
        second = replica(system, local_cluster, cloud, "b")
        replicas.all += [first, second]
        system.provider = first  # its log is printed if the test fails
        first.start()
        exited = asyncio.ensure_future(asyncio.to_thread(exit_time, first.component.process))
        await eventually(lambda: lease_holder(kube, node), until=lambda h: h == f"{node}-a",
                         timeout=30, what="replica a (behind the proxy) leads")
        second.start()
        assert await eventually(lambda: kubelet_port(kube, node),
                                until=lambda p: p == first.kubelet_port, timeout=60,
                                what="the node registered by the leader (its kubelet port)")
        await eventually(lambda: asyncio.sleep(0, second.log_text()),
                         until=lambda text: "waiting for leadership" in text, timeout=30,
                         what="replica b standing by")

        # The leader acts: it runs pods (through the proxy to the API, directly to the cloud).
        before = [f"before-{i}" for i in range(3)]
        for name in before:
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_body(name, node))
        await eventually(
            lambda: pods(kube, namespace), timeout=60, interval=0.5,
            what="the leader runs the first pods",
            until=lambda ps: len(ps) == len(before)
            and all(p["status"].get("phase") == "Running" for p in ps))
        assert await lease_holder(kube, node) == f"{node}-a"
        assert '"msg":"starting"' not in second.log_text(), "the standby must not act"

        # Partition: replica a's connections stay open, nothing answers; it keeps running.
        proxy.black_hole()
        holed, holed_at = time.monotonic(), datetime.now(UTC)
        held_connections = proxy.accepted
        during = [f"during-{i}" for i in range(3)]
        for name in during:  # nobody can run these until the standby leads
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_body(name, node))
        await eventually(lambda: lease_holder(kube, node), until=lambda h: h == f"{node}-b",
                         timeout=LEASE_DURATION + 30, interval=0.2, what="replica b takes over")
        took = time.monotonic() - holed
        assert '"msg":"leadership lost"' in first.log_text(), (
            "replica b leads while the partitioned replica a never stepped down")
        assert await eventually(lambda: asyncio.sleep(0, first.returncode()),
                                until=lambda rc: rc is not None, timeout=30,
                                what="replica a exits") == 1, "a lost leader exits non-zero"

        everything = await eventually(
            lambda: pods(kube, namespace), timeout=120, interval=0.5,
            what="all pods Running under the new leader",
            until=lambda ps: len(ps) == len(before) + len(during)
            and all(p["status"].get("phase") == "Running" for p in ps))
        assert await kubelet_port(kube, node) == second.kubelet_port

    # No overlap: a stopped acting before b started, on the one clock of this machine.
    a_log, b_log = log_records(first), log_records(second)
    b_leads = first_at(b_log, "became leader")
    a_lost = first_at(a_log, "leadership lost")
    a_stopped = first_at(a_log, "stopped leading")
    assert a_lost <= a_stopped < b_leads, (a_lost, a_stopped, b_leads)
    late = [r for r in a_log if r["at"] >= b_leads]
    assert not late, f"replica a still logging once b leads: {late[:5]}"
    assert any(r.get("msg") == "instance created" for r in a_log), "a acted before the cut"
    assert not any(r.get("msg") == "instance created" and r["at"] >= b_leads for r in a_log)
    assert not [r for r in b_log if r.get("msg") == "instance created" and r["at"] < b_leads]

    # Exactly one instance per pod in the cloud: nothing created twice across the handover.
    uids = {p["metadata"]["uid"] for p in everything}
    ledger = await cloud.ledger()
    per_uid = collections.Counter(e["uid"] for e in ledger)
    assert set(per_uid) == uids, "an instance for no pod (orphan) or a pod without one"
    assert all(n == 1 for n in per_uid.values()), [u for u, n in per_uid.items() if n > 1]

    lease = await kube.get("/apis/coordination.k8s.io/v1/namespaces/vkprovider-system/"
                           f"leases/vkprovider-{node}")
    assert lease["spec"]["holderIdentity"] == f"{node}-b"
    acquired = datetime.fromisoformat(lease["spec"]["acquireTime"].replace("Z", "+00:00"))
    assert a_stopped < acquired, "b's acquireTime (its own clock) is after a stepped down"
    # ...and a's process was gone by then: it exits at once on the loss, with no request (a
    # release, an Event) over the link that just failed, which would hold it past the takeover
    a_exited = await exited
    assert a_exited < acquired, (
        f"replica a exited {(a_exited - acquired).total_seconds():.3f}s after b acquired "
        f"the Lease (a stopped leading {(a_stopped - acquired).total_seconds():+.3f}s)")
    def since(moment: datetime) -> str:
        return f"{(moment - holed_at).total_seconds():+.3f}s"

    print(f"\nblack hole at {holed_at.isoformat()} ({held_connections} connection(s) of a "
          f"through the proxy): a lost {since(a_lost)}, a stopped leading {since(a_stopped)}, "
          f"b became leader {since(b_leads)} (seen by the test after {took:.1f}s), "
          f"a exited {since(a_exited)}\n" + "\n".join(
              f"  a {r['ts']} {r['msg']} {r.get('error', '')}" for r in a_log
              if r.get("msg") in ("became leader", "lease renewal failed", "leadership lost",
                                  "leadership lost; stopping at once", "stopped leading")))

    second.stop()
    with contextlib.suppress(Exception):
        await kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/vkprovider-system/leases/"
                          f"vkprovider-{node}")


async def test_a_partitioned_companion_exits_before_its_standby_takes_over(
    kube: KubeClient, system: System, companion_kubeconfig: Path, crds: list[str],
    local_cluster: LocalCluster,
) -> None:
    """The companion leads the same way (its own Lease, default timings: 15 s lease, 10 s renew
    deadline): cut off from the API server, it is gone before its standby acquires the Lease."""
    api = urlsplit(local_cluster.server)
    assert api.hostname and api.port
    lease_path = ("/apis/coordination.k8s.io/v1/namespaces/vkprovider-system/leases/"
                  f"vkprovider-companion-{system.node_name}")

    async def holder() -> str | None:
        try:
            lease = await kube.get(lease_path)
        except Exception:
            return None
        return (lease.get("spec") or {}).get("holderIdentity")

    def companion(name: str, kubeconfig: Path) -> CompanionProcess:
        work_dir = system.work_dir / f"companion-{name}"  # its own log file
        work_dir.mkdir()
        return CompanionProcess(work_dir=work_dir, kubeconfig=kubeconfig,
                                node_name=system.node_name, interval=0.5,
                                move_back_interval=1.0, extra_args=["--leader-elect"])

    async with BlackHoleProxy(target_host=api.hostname, target_port=api.port) as proxy:
        proxied = kubeconfig_via(source=companion_kubeconfig, server=proxy.url,
                                 path=system.work_dir / "companion-proxied.kubeconfig")
        first, second = companion("a", proxied), companion("b", companion_kubeconfig)
        try:
            first.start()
            a_proc = first.component.process
            assert a_proc is not None
            exited = asyncio.ensure_future(asyncio.to_thread(exit_time, a_proc))
            a_id = f"{socket.gethostname()}-{a_proc.pid}"
            await eventually(holder, until=lambda h: h == a_id, timeout=60,
                             what="companion a (behind the proxy) leads")
            second.start()
            assert second.component.process is not None
            b_id = f"{socket.gethostname()}-{second.component.process.pid}"
            await eventually(lambda: asyncio.sleep(0, second.log_text()),
                             until=lambda text: "companion starting" in text,
                             timeout=30, what="companion b standing by")
            assert await holder() == a_id

            proxy.black_hole()
            await eventually(holder, until=lambda h: h == b_id, timeout=60, interval=0.2,
                             what="companion b takes over")
            lease = await kube.get(lease_path)
            acquired = datetime.fromisoformat(
                lease["spec"]["acquireTime"].replace("Z", "+00:00"))
            a_exited = await asyncio.wait_for(exited, timeout=60)
            assert a_proc.returncode == 1, first.component.tail()
            assert a_exited < acquired, (
                f"companion a exited {(a_exited - acquired).total_seconds():.3f}s after b "
                "acquired the Lease")
            assert "leadership lost" in first.log_text()
        finally:
            first.stop()
            second.stop()
    with contextlib.suppress(Exception):
        await kube.delete(lease_path)


def exit_time(process: subprocess.Popen[bytes] | None) -> datetime:
    """Wait (in a thread) for ``process`` to end; the wall time it ended, seen at once."""
    assert process is not None
    process.wait()
    return datetime.now(UTC)

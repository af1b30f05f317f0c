"""The mixed chaos run: pods through a misbehaving cloud while the control side breaks too.

Why it exists: each fault is survivable alone (unit tests, test_chaos_profiles.py); production
meets them together. This run has them all at once, on a LocalCluster of its own (it restarts
kube-apiserver, which the session's shared control plane must not suffer):

* the mock cloud runs the ``mixed`` profile below, as a scenario file (the way users run it):
  5xx on every endpoint, a 1.5 s 429 burst every 6 s, the duplicate trap (15% of creates
  succeed on the cloud but answer 504), lists that lag 3 s behind creates, slow deletes and
  deletes the cloud accepts and then silently undoes;
* two replicas of ``vkprovider run`` with leader election, as manifests/ deploys them;
* the pods arrive in four waves, and during each wave one thing breaks:
  1. kill -9 of the leader (the standby, or the killed pod's replacement, takes over once its
     Lease has expired, never before),
  2. kill -9 of both replicas (the provider is down; the kubelet restarts both containers in
     their pods, so the old leader's identity takes its Lease back at once),
  3. kube-apiserver stopped and started, an outage of about 12 s (the leader must ride it out,
     its renew deadline being 14 s: its watches relist),
  4. kill -9 of both replicas again.

Checked from the ledger and the API server: every pod Running with the instance the ledger
has for it; exactly one instance per pod UID ever created; never two live at any moment; none
live once the pods are deleted; and the spend the provider counted (persisted on the Node, so
it survives all of the above) equal to the ledger's bill within the documented bound.

Sized to fit CI's budget: ``VKP_CHAOS_PODS`` pods, 120 by default (30 a wave: each fault strikes
once the wave's first 12 instances exist, and the other 18 pods are created while it holds, with
no leader, no provider running, or just after the API server came back; the run also asserts
that every fault of the profile bit several times). Most of the run's time is the faults
themselves (the Lease expiring, the API server's restart), not the pods. The full-size run,
300 pods as the suite used to run it:
``VKP_CHAOS_PODS=300 .venv/bin/python -m pytest tests/e2e/test_chaos_mixed.py``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster, find_binaries
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess, install_provider_rbac
from vkprovider.testing.waiting import eventually

from .invariants import check_spend, overlapping_live_instances

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster]

NODE = "vk-chaos-mixed"
NS = "chaos"
PODS = int(os.environ.get("VKP_CHAOS_PODS", "120"))  # 300: the full-size run
WAVES = 4
IN_FLIGHT = PODS // WAVES * 2 // 5  # instances created in a wave before its fault strikes
MIN_BITES = 3  # each injected fault kind, at least, in the run
assert PODS >= 80 and PODS % WAVES == 0, "VKP_CHAOS_PODS: a multiple of 4, at least 80"
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
LEASE = "/apis/coordination.k8s.io/v1/namespaces/vkprovider-system/leases/vkprovider-" + NODE
# renew_deadline outlasts an API server restart (~12 s here), so the leader rides it out
ELECTION = {"enabled": True, "lease_duration_seconds": 18, "renew_deadline_seconds": 14,
            "retry_period_seconds": 1}
MIXED: dict[str, Any] = {
    "name": "chaos-mixed",
    "seed": 1234,
    "faults": {
        "endpoints": {
            "create": {"error_rate": 0.08, "error_status": 503},
            "list": {"error_rate": 0.05, "error_status": 500},
            "get": {"error_rate": 0.03, "error_status": 502},
            "delete": {"error_rate": 0.05, "error_status": 503},
        },
        "rate_limits": [{"endpoints": ["create", "delete", "list"], "start": 1,
                         "duration": 1.5, "every": 6, "retry_after": 1}],
        "lost_create_responses": {"rate": 0.15, "mode": "504"},
        "list_lag_seconds": 3,
        # fail_rate: deletes the cloud accepts, then silently undoes: the provider must notice
        # the instance is still there and delete it again, or it bills forever
        "deletes": {"slow_rate": 0.3, "slow_seconds": 4, "fail_rate": 0.2},
    },
}


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "chaos"},
                         "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


class Provider:
    """Two replicas of the provider. A replaced pod gets a new name (identity); a restarted
    container keeps its pod's."""

    def __init__(self, *, work_dir: Path, kubeconfig: Path, cloud: MockCloudProcess,
                 ca: Path) -> None:
        self._args = {"work_dir": work_dir, "kubeconfig": kubeconfig, "cloud": cloud, "ca": ca}
        self.incarnations = 0
        self.replicas: dict[str, ProviderProcess] = {}
        self.retired: list[ProviderProcess] = []
        self._led_before: dict[int, int] = {}  # id(process) -> "became leader" lines at start

    def start(self, slot: str, *, same_pod: ProviderProcess | None = None) -> ProviderProcess:
        self.incarnations += 1
        name = same_pod.replica if same_pod is not None and same_pod.replica else \
            f"{slot}{self.incarnations}"
        proc = ProviderProcess(
            work_dir=self._args["work_dir"], kubeconfig=self._args["kubeconfig"], node_name=NODE,
            clouds=[self._args["cloud"]], client_ca_file=self._args["ca"], replica=name,
            env={"POD_NAME": f"{NODE}-{name}"}, extra={"leader_election": ELECTION},
            pods={"orphan_grace_seconds": 2, "delete_retry_seconds": 3, "workers": 20,
                  "spend_record_seconds": 1})
        log = proc.component.log_path  # a restarted container appends to its pod's log
        self._led_before[id(proc)] = log.read_text().count("became leader") if log.exists() \
            else 0
        proc.start()
        self.replicas[slot] = proc
        return proc

    def leads(self, slot: str) -> bool:
        """Whether this incarnation (not an earlier one in the same pod) became leader."""
        proc = self.replicas[slot]
        return proc.log_text().count("became leader") > self._led_before[id(proc)]

    def kill(self, slot: str) -> ProviderProcess:
        proc = self.replicas.pop(slot)
        proc.kill()
        self.retired.append(proc)
        return proc

    def slot_of(self, holder: str | None) -> str | None:
        return next((s for s, p in self.replicas.items()
                     if holder == f"{NODE}-{p.replica}"), None)

    def stop(self) -> None:
        for proc in [*self.replicas.values(), *self.retired]:
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.replica} ---\n" + "\n".join(p.log_text().splitlines()[-40:])
                         for p in [*self.retired, *self.replicas.values()])


async def holder(kube: KubeClient) -> str | None:
    try:
        lease = await kube.get(LEASE)
    except Exception:
        return None
    return (lease.get("spec") or {}).get("holderIdentity") or None


async def leader(kube: KubeClient, provider: Provider) -> str:
    """The slot of the replica that holds the Lease (waiting for a hand-over if need be)."""
    def led_by_live(h: str | None) -> bool:
        slot = provider.slot_of(h)
        return slot is not None and provider.leads(slot)

    found = await eventually(lambda: holder(kube), until=led_by_live, timeout=40, interval=0.2,
                             what="a live replica holds the Lease and says it leads")
    slot = provider.slot_of(found)
    assert slot is not None
    return slot


async def test_the_pods_survive_mixed_faults_kills_a_leader_kill_and_an_apiserver_restart(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    cluster = LocalCluster(bin_dir=find_binaries(), log_dir=tmp_path / "logs")
    scenario = tmp_path / "chaos-mixed.yaml"
    scenario.write_text(yaml.safe_dump(MIXED))
    cloud = MockCloudProcess(work_dir=tmp_path, name="mixed", boot_delay=0.5, delete_delay=0.5,
                             inventory="H100:us-east:400:2.49", scenario=scenario)
    provider: Provider | None = None
    timeline: list[tuple[str, float]] = []

    def mark(what: str) -> None:
        timeline.append((what, round(time.monotonic() - began, 1)))

    try:
        await cluster.start()
        async with cluster.client() as kube:
            kubeconfig = await install_provider_rbac(kube=kube, cluster=cluster,
                                                     path=tmp_path / "provider.kubeconfig",
                                                     nodes=[NODE])
            await cloud.start()
            provider = Provider(work_dir=tmp_path, kubeconfig=kubeconfig, cloud=cloud,
                                ca=cluster.ca_path)
            provider.start("a")
            provider.start("b")
            await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": NS}})

            async def node_ready() -> bool:
                try:
                    node = await kube.get(f"/api/v1/nodes/{NODE}")
                except Exception:
                    return False
                return any(c["type"] == "Ready" and c["status"] == "True"
                           for c in node["status"].get("conditions") or [])

            await eventually(node_ready, until=bool, timeout=60, what="the virtual node Ready")
            mark("node ready")
            sem = asyncio.Semaphore(32)

            async def make(i: int) -> None:
                async with sem:
                    await kube.create(f"/api/v1/namespaces/{NS}/pods", pod(f"c{i}"))

            per_wave = PODS // WAVES
            # Each wave's first IN_FLIGHT pods go first; its fault strikes once their instances
            # exist, and the rest of the wave is created right after the fault struck, so every
            # fault meets a wave under way by construction (a whole wave created at once could
            # be finished by a fast provider before the fault, and then it would prove nothing).
            for wave in range(WAVES):
                first = wave * per_wave
                await asyncio.gather(*(make(i) for i in range(first, first + IN_FLIGHT)))
                want = first + IN_FLIGHT
                created = await eventually(
                    cloud.stats, until=lambda s, w=want: s["instances_created"] >= w,
                    timeout=120, interval=0.05, what=f"wave {wave} under way")
                assert created["instances_created"] < (wave + 1) * per_wave, (
                    f"wave {wave} finished before its fault: the test proves nothing")
                rest = range(first + IN_FLIGHT, first + per_wave)
                if wave == 0:
                    slot = await leader(kube, provider)
                    provider.kill(slot)
                    killed_at = time.monotonic()
                    mark(f"kill -9 leader {slot}")
                    await asyncio.gather(*(make(i) for i in rest))  # no leader acts now
                    provider.start(slot)  # its replacement pod: a new identity
                    new = await leader(kube, provider)
                    # The standby or the replacement may win (both wait out the same Lease; on
                    # a loaded machine either can be first), but nobody before the dead
                    # leader's Lease expired: its last renewal was at most a retry period ago.
                    waited = time.monotonic() - killed_at
                    least = (ELECTION["lease_duration_seconds"]
                             - ELECTION["retry_period_seconds"] - 1)
                    assert waited >= least, f"a new leader after {waited:.1f}s < {least}s"
                    mark(f"{new} took over")
                elif wave in (1, 3):
                    was = await leader(kube, provider)
                    dead = {slot: provider.kill(slot) for slot in list(provider.replicas)}
                    mark("kill -9 both replicas")
                    await asyncio.gather(*(make(i) for i in rest))  # nobody runs now
                    for slot, proc in dead.items():
                        provider.start(slot, same_pod=proc)
                    assert await leader(kube, provider) == was
                    mark(f"{was} restarted and leads again")
                else:
                    before = provider.replicas[await leader(kube, provider)]
                    cluster.restart_apiserver()
                    await cluster.wait_ready(timeout=60)
                    mark("kube-apiserver restarted")
                    await asyncio.gather(*(make(i) for i in rest))  # the leader relists
                    after = provider.replicas[await leader(kube, provider)]
                    assert after is before and before.component.alive(), (
                        "the leader must ride out an API server restart (its watches relist)")

            async def pods() -> list[dict[str, Any]]:
                return list((await kube.get(f"/api/v1/namespaces/{NS}/pods"))["items"])

            running = await eventually(
                pods, timeout=240, interval=1.0, what=f"{PODS} pods Running",
                until=lambda ps: len(ps) == PODS and all(
                    p["status"].get("phase") == "Running" for p in ps))
            mark("all Running")
            converged = time.monotonic() - began
            stats = await cloud.stats()
            for fault in ("lost_creates", "errors"):
                assert stats[f"injected_{fault}"] >= MIN_BITES, f"the profile did not bite: {stats}"
            # A rate limit is a time window (1.5 s every 6 s), not a share of calls: how many
            # calls land in one depends on the run's timing, so one is enough to prove it bit.
            assert stats["injected_rate_limited"] >= 1, f"the profile did not bite: {stats}"

            ledger = await cloud.ledger()
            uids = {p["metadata"]["uid"] for p in running}
            per_uid = collections.Counter(e["uid"] for e in ledger)
            assert set(per_uid) == uids, "an instance without a pod, or a pod without one"
            assert max(per_uid.values()) == 1, (
                f"a pod got a second instance: {[u for u, n in per_uid.items() if n > 1]}")
            assert overlapping_live_instances(ledger) == []
            by_uid = {e["uid"]: e for e in ledger}
            for p in running:
                assert p["metadata"]["annotations"]["vkprovider.io/instance-id"] == \
                    by_uid[p["metadata"]["uid"]]["id"]

            await kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods")
            await eventually(pods, until=lambda ps: not ps, timeout=120, what="all pods gone")
            ledger = await eventually(
                cloud.ledger, timeout=90, what="zero live instances",
                until=lambda led: all(e["state"] == "deleted" for e in led))
            mark("zero live instances")
            assert overlapping_live_instances(ledger) == []
            final = await cloud.stats()
            assert final["live_instances"] == 0, final
            # and they were deleted again (slow ones too)
            assert final["injected_failed_deletes"] >= MIN_BITES, final
            assert final["injected_slow_deletes"] >= MIN_BITES, final
            total = (await cloud.admin("GET", "/admin/ledger"))["total_cost"]
            last = provider.replicas[await leader(kube, provider)]
            spend = await check_spend(kube=kube, node=NODE, ledger=ledger, total_cost=total,
                                      metrics=last.metrics)
            print(f"\nchaos[mixed+control-plane]: {PODS} pods Running in {converged:.1f}s; "
                  f"instances {len(ledger)}; processes {provider.incarnations}; spend {spend}; "
                  f"timeline {timeline}; "
                  f"{ {k: v for k, v in final.items() if k.startswith('injected_') and v} }")
    except BaseException:
        if provider is not None:
            print(f"timeline {timeline}\n{provider.logs()}")
        raise
    finally:
        if provider is not None:
            provider.stop()
        cloud.stop()
        cluster.stop()

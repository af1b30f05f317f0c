"""Chaos, CI-sized: 60 pods through a misbehaving cloud and a kill -9, then the invariants.

Why it exists: every fault the mock cloud can inject is survivable one at a time in unit tests;
this proves the shipped processes survive them together, including a provider killed mid-burst.
The mock cloud runs the ``mixed`` profile below (as a scenario file, the way users run it):
5xx on every instance endpoint, a 1.5 s 429 burst every 6 s, the duplicate trap (creates that
succeed on the cloud but answer 504), lists that lag 3 s behind creates and slow deletes. There
is no crash rate, so every pod must reach Running.

Checked from the ledger and the API server: every pod Running; never two live instances for one
pod UID at any moment; nothing live once the pods are deleted; every instance stopped and the
total cost finite. The API server is not restarted here (the session shares one control plane);
docs/testing-with-the-mock-cloud.md says how to run that chaos on a LocalCluster of its own.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import time
from datetime import datetime
from typing import Any

import pytest
import yaml

from vkprovider.kube import KubeClient
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, list_pods, node_ready, pod_spec

pytestmark = pytest.mark.cluster

PODS = 60
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


def _t(value: str | None) -> float:
    return math.inf if value is None else datetime.fromisoformat(value).timestamp()


def overlapping_live_instances(ledger: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(uid, id, id) for every two instances of one pod UID alive at the same moment."""
    by_uid: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for entry in ledger:
        by_uid[entry["uid"]].append(entry)
    overlaps = []
    for uid, entries in by_uid.items():
        for a, b in itertools.combinations(entries, 2):
            if max(_t(a["created_at"]), _t(b["created_at"])) < min(_t(a["stopped_at"]),
                                                                   _t(b["stopped_at"])):
                overlaps.append((uid, a["id"], b["id"]))
    return overlaps


async def test_mixed_faults_and_a_kill_9_keep_every_invariant(
    kube: KubeClient, namespace: str, system: System
) -> None:
    began = time.monotonic()
    scenario = system.work_dir / "chaos-mixed.yaml"
    scenario.write_text(yaml.safe_dump(MIXED))
    cloud = MockCloudProcess(work_dir=system.work_dir, name="cloud0", boot_delay=0.5,
                             delete_delay=0.5, inventory="H100:us-east:256:2.49",
                             scenario=scenario)
    await cloud.start()
    system.clouds.append(cloud)
    provider = ProviderProcess(work_dir=system.work_dir, kubeconfig=system.kubeconfig,
                               node_name=system.node_name, clouds=system.clouds,
                               pods={"orphan_grace_seconds": 2, "delete_retry_seconds": 3},
                               client_ca_file=system.client_ca)
    system.provider = provider
    provider.start()
    await node_ready(kube, system.node_name)

    await asyncio.gather(*(create_pod(kube, namespace, f"c{i}", pod_spec(system.node_name),
                                      labels={"app": "chaos"}) for i in range(PODS)))
    await eventually(cloud.stats, until=lambda s: s["instances_created"] >= 12, timeout=120,
                     interval=0.05, what="a partial burst")
    provider.kill()
    at_kill = (await cloud.stats())["instances_created"]
    assert at_kill < PODS, "the burst finished before the kill; the test proves nothing"
    provider.start()

    pods = await eventually(lambda: list_pods(kube, namespace, "app=chaos"),
                            until=lambda p: len(p) == PODS and all(
                                x.get("status", {}).get("phase") == "Running" for x in p),
                            timeout=150, what=f"{PODS} pods Running under chaos")
    converged = time.monotonic() - began
    stats = await cloud.stats()
    # the profile really bit: otherwise the test proves nothing
    assert stats["injected_lost_creates"] > 0, stats
    assert stats["injected_errors"] > 0, stats
    assert stats["injected_rate_limited"] > 0, stats

    ledger = await cloud.ledger()
    uids = {p["metadata"]["uid"] for p in pods}
    assert {e["uid"] for e in ledger} == uids, "an instance without a pod, or a pod without one"
    assert overlapping_live_instances(ledger) == []
    live_per_uid = collections.Counter(e["uid"] for e in ledger if e["state"] != "deleted")
    assert set(live_per_uid.values()) == {1}, f"live instances per pod: {live_per_uid}"
    assert len(ledger) == PODS, (
        f"{len(ledger) - PODS} duplicate instances were created (and deleted)")
    for pod in pods:
        entry = next(e for e in ledger if e["uid"] == pod["metadata"]["uid"]
                     and e["state"] != "deleted")
        assert pod["metadata"]["annotations"]["vkprovider.io/instance-id"] == entry["id"]

    await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
                       params={"labelSelector": "app=chaos"})
    await eventually(lambda: list_pods(kube, namespace, "app=chaos"), until=lambda p: not p,
                     timeout=90, what="all pods gone")
    ledger = await eventually(
        cloud.ledger, until=lambda led: all(e["state"] == "deleted" for e in led), timeout=60,
        what="zero live instances")
    assert all(e["stopped_at"] is not None for e in ledger)
    assert overlapping_live_instances(ledger) == []
    body = await cloud.admin("GET", "/admin/ledger")
    assert math.isfinite(body["total_cost"]) and body["total_cost"] > 0
    final = await cloud.stats()
    assert final["injected_slow_deletes"] > 0, final
    assert final["injected_failed_deletes"] > 0, final  # and they were deleted again
    assert final["live_instances"] == 0, final
    print(f"chaos: converged in {converged:.1f}s, whole test {time.monotonic() - began:.1f}s, "
          f"created at kill {at_kill}, cost {body['total_cost']}, stats {final}")

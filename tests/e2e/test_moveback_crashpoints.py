"""A crash between any two writes of a move loses nothing (issue 36, crash points).

The companion is started with the test hook ``VKP_CRASH_AFTER_WRITE=k`` (descheduler/
crashpoint.py): it exits dead (status 137, as after SIGKILL) right after the k-th write of the
first move: 1 the intent, 2 the cloud pod's deletion cost, 3 the surge, 4 the scale-back (with
the intent marked), 5 the intent cleared. It is restarted without the hook and must converge:
the replica comes home, the Deployment ends at its original count, no intent is left behind, and
no ``MoveBackFailed`` is reported for a move that worked. In every run the move that took the
cloud pod away is counted ``finished`` (the last move judged ``moved``, a ``MovedBack`` Event
naming that pod), including after a crash right after the intent is cleared; a
``MoveBackFailed`` only ever reports a move the cloud pod outlived (an interrupted move rolled
back, before the one that worked).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_moveback import INTENT, deployment_events, live_instances, overflow_then_free
from .test_overflow import pods

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
async def test_a_crash_right_after_any_write_of_a_move_converges(
    k: int, kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    companion_kubeconfig: Path, cluster_objects: Cluster,
) -> None:
    internal, watcher = await overflow_then_free(
        kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
        companion_kubeconfig=companion_kubeconfig, objects=cluster_objects, replicas=1,
        crash_after_write=k)
    assert system.companion is not None
    [cloud] = [p["metadata"]["name"] for p in await pods(kube, namespace, "inference")]
    dep_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/inference"
    try:
        await eventually(lambda: _exited(system), until=lambda code: code is not None,
                         timeout=120, interval=0.2, what=f"the companion dead after write {k}")
        assert system.companion.component.process is not None
        assert system.companion.component.process.returncode == 137
        assert "crash point reached" in system.companion.log_text()
        left = await kube.get(dep_path)
        system.companion.component.stop()
        system.companion.start()  # without the hook
        home = await eventually(
            lambda: pods(kube, namespace, "inference"), timeout=180, interval=0.5,
            until=lambda ps: len(ps) == 1 and all(
                p["spec"].get("nodeName") in internal and p["status"].get("phase") == "Running"
                for p in ps), what="the replica back inside")
    finally:
        await watcher.stop()
    dep = await eventually(lambda: kube.get(dep_path), timeout=60,
                           until=lambda d: INTENT not in (d["metadata"].get("annotations") or {}),
                           what="no intent left behind")
    print(f"\ncrash after write {k}: left spec.replicas {left['spec']['replicas']}, intent "
          f"{'kept' if INTENT in (left['metadata'].get('annotations') or {}) else 'none'}; "
          f"fewest ready {watcher.minimum}")
    assert dep["spec"]["replicas"] == 1, "back at the original count"
    assert watcher.minimum is not None and watcher.minimum >= 1
    assert not (home[0]["metadata"].get("annotations") or {}).get(
        "controller.kubernetes.io/pod-deletion-cost")
    await eventually(lambda: live_instances(system), until=lambda n: n == 0, timeout=60,
                     what="the cloud instance deleted")
    # The cloud pod went away: the move that took it is counted finished, in every run. With
    # one replica every move is of that pod, and none starts after it is gone, so the last one
    # judged must be "moved"; a rolled-back move before it is one the pod outlived.
    judged = [json.loads(line)["result"] for line in system.companion.log_text().splitlines()
              if '"move finished"' in line]
    events = await deployment_events(kube, namespace)
    moved = [e for e in events if e["reason"] == "MovedBack"]
    failed = [e for e in events if e["reason"] == "MoveBackFailed"]
    print(f"  moves judged {judged}; MovedBack {len(moved)}, MoveBackFailed {len(failed)}")
    assert judged and judged[-1] == "moved", judged
    assert any(e["message"].startswith(f"{cloud} replaced") for e in moved), events
    assert sum(int(e.get("count") or 1) for e in failed) == judged.count("rolled-back"), events
    if k >= 4:  # the scale-back was written: the move worked, whoever judges it
        assert not failed, events


async def _exited(system: System) -> int | None:
    await asyncio.sleep(0)
    assert system.companion is not None
    proc = system.companion.component.process
    return None if proc is None else proc.poll()

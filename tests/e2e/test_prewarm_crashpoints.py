"""A crash between any two writes of a pre-warm converges (issue 36, crash points).

Real control plane, real Kueue, the story of tests/e2e/test_prewarm.py: inference (4 replicas x
1 GPU, under load) fills a 4-GPU node, a Kueue gang that displaces every replica arrives in a
ClusterQueue with the ``vkprovider.io/prewarm`` check. The companion is started with the test
hook ``VKP_CRASH_AFTER_WRITE`` naming one write of the pre-warm (descheduler/crashpoint.py): it
exits dead (status 137, as after SIGKILL) right after the first write of that name. Named, not
counted: the surge is an idempotent absolute write that a pass may repeat while a watch cache
lags, so a count would not always stop at the same step; the log still says which write (k) it
was. It is restarted without the hook and must converge.

The way out, in order (:data:`WRITES`): the intent recorded (label and annotation), the surge
(N -> N + 4), the check ``Pending`` ("surging ..."), the intent marked ``Ready``, the check
``Ready`` (Kueue admits the gang, the scheduler preempts the replicas), the surge taken back
(with the intent marked ``Restoring``, ``scaled_back``), the intent cleared. After each: the gang
admitted with the pre-warm's message, the Deployment back at N with no intent, one surge (never
past N + 4), no failed request, never fewer than N ready replicas.

With no cloud capacity and ``onTimeout: Retry`` the pre-warm times out and the check goes
``Retry`` (:data:`RETRY_WRITES`: the writes not on the way out are the surge taken back with the
outcome ``Retry`` recorded, and the check ``Retry``). After each: Kueue counts a retry, the
attempt surged once (no second surge before the ``Retry``), no ``Retry`` is written twice for
one attempt, and the Deployment ends at N with no intent once the gang is deleted. Kueue's
``Retry`` state and ``Evicted`` condition are transient (it evicts, requeues and puts the check
back to ``Pending``): the retry is read from what lasts, ``retryCount`` and
``schedulingStats.evictions`` (:func:`retries`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.descheduler.crashpoint import ENV, EXIT_STATUS
from vkprovider.kube import KubeClient
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import Sampler, eventually

from .conftest import Cluster, System
from .test_prewarm import (
    DISPLACED,
    INTENT,
    REPLICAS,
    Story,
    check_state,
    condition,
    finish_load,
    plan_label_gone,
    retries,
    retry_seen,
    start_story,
)

pytestmark = pytest.mark.cluster

WRITES = ("pre-warm: intent recorded", "pre-warm: surge written", "pre-warm: check Pending",
          "pre-warm: intent marked Ready", "pre-warm: check Ready",
          "pre-warm: surge taken back", "pre-warm: intent cleared")
RETRY_WRITES = ("pre-warm: surge taken back", "pre-warm: check Retry")
NO_CAPACITY = "H100:us-east:0:2.49"


def _id(write: str) -> str:
    return write.removeprefix("pre-warm: ").replace(" ", "-")


async def _exited(story: Story) -> int | None:
    await asyncio.sleep(0)
    proc = story.companion.component.process
    return None if proc is None else proc.poll()


async def crash_then_restart(story: Story, write: str) -> int:
    """Wait for the companion to stop dead at ``write``, restart it without the hook; returns
    which write of the process it was (k, from its log)."""
    await eventually(lambda: _exited(story), until=lambda code: code is not None, timeout=120,
                     interval=0.1, what=f"the companion dead after {write!r}")
    assert story.companion.component.process is not None
    assert story.companion.component.process.returncode == EXIT_STATUS
    crashed = [json.loads(line) for line in story.companion.log_text().splitlines()
               if "crash point reached" in line]
    assert [c["what"] for c in crashed] == [write], crashed
    story.companion.component.stop()
    story.companion.start()  # without the hook
    return int(crashed[0]["write"])


class Attempts(Sampler):
    """Samples the Workload, the Deployment, the Workload again, every 200 ms: the pre-warm
    intents (by their start) seen before Kueue counted any retry, and whether a sample ever saw
    more retries than intents (a ``Retry`` written twice for one attempt). Reading the Workload
    after the Deployment makes "before the retry" exact: retries only grow."""

    def __init__(self, story: Story, check: str) -> None:
        super().__init__()
        self.story, self.check = story, check
        self.before_retry: set[float] = set()
        self.intents: set[float] = set()
        self.over: list[str] = []

    async def sample(self) -> None:
        first = retries(await self.story.workload(), self.check)
        dep = await self.story.kube.get(self.story.dep_path)
        wl = await self.story.workload()
        if wl is None:
            return  # no Workload: nothing to tell an attempt from the next
        after = retries(wl, self.check)
        raw = (dep["metadata"].get("annotations") or {}).get(INTENT)
        if raw:
            started = float(json.loads(raw)["started"])
            self.intents.add(started)
            if after == 0:
                self.before_retry.add(started)
        if first > len(self.intents):
            self.over.append(f"{first} retries after {len(self.intents)} intent(s)")


@dataclass
class Stage:
    """What a story needs from the session (the fixtures), to start one with the hook set."""

    kube: KubeClient
    namespace: str
    gpu_nodes: GPUNodeFactory
    system: System
    companion_kubeconfig: Path
    objects: Cluster
    kueue_paths: list[str]
    local_cluster: Any

    async def story(self, write: str, **options: Any) -> Story:
        """The pre-warm story, the companion set to stop dead right after ``write``."""
        return await start_story(
            kube=self.kube, namespace=self.namespace, gpu_nodes=self.gpu_nodes,
            system=self.system, companion_kubeconfig=self.companion_kubeconfig,
            objects=self.objects, kueue_paths=self.kueue_paths,
            local_cluster=self.local_cluster, with_check=True, companion_env={ENV: write},
            **options)


@pytest_asyncio.fixture
async def stage(kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
                companion_kubeconfig: Path, cluster_objects: Cluster, kueue_objects: list[str],
                local_cluster: Any) -> Stage:
    return Stage(kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
                 companion_kubeconfig=companion_kubeconfig, objects=cluster_objects,
                 kueue_paths=kueue_objects, local_cluster=local_cluster)


def print_row(k: int, write: str, outcome: str, failed: int, story: Story) -> None:
    print(f"\ncrash after write {k} ({write}): {outcome}; failed requests {failed}; fewest "
          f"ready {story.watch.min_ready} of {REPLICAS}; spec.replicas at most "
          f"{story.watch.max_replicas}")


@pytest.mark.parametrize("write", WRITES, ids=_id)
async def test_a_crash_right_after_any_write_of_a_prewarm_converges(
        write: str, stage: Stage) -> None:
    story = await stage.story(write)
    assert story.check is not None
    check = story.check
    try:
        await story.gang()
        k = await crash_then_restart(story, write)
        wl = await eventually(story.workload, timeout=120, interval=0.3,
                              until=lambda w: condition(w, "Admitted").get("status") == "True",
                              what="Kueue admitting the gang once the check is Ready")
        await story.gang_running()
        dep = await story.settled()
        report = await finish_load(story)
    finally:
        await story.stop()
    entry = check_state(wl, check)
    print_row(k, write, f"admitted ({entry.get('message')})", report.failed, story)
    assert entry["state"] == "Ready" and "pre-warmed" in entry["message"], entry
    assert report.failed == 0, [c.as_dict() for c in report.chapters]
    assert story.watch.min_ready is not None and story.watch.min_ready >= REPLICAS
    assert story.watch.max_replicas == REPLICAS + DISPLACED, "one surge, never a second"
    assert dep["spec"]["replicas"] == REPLICAS and plan_label_gone(dep)
    outside = await story.on_virtual_node()
    assert len(outside) == DISPLACED, "the displaced replicas serve from the cloud"
    assert await story.live_instances() == len(outside), "no instance leaked"


@pytest.mark.parametrize("write", RETRY_WRITES, ids=_id)
async def test_a_crash_right_after_a_retry_write_still_retries_once(
        write: str, stage: Stage) -> None:
    story = await stage.story(write, prewarm={"timeout": "8s", "onTimeout": "Retry"},
                              inventory=NO_CAPACITY)
    assert story.check is not None
    check = story.check
    attempts = Attempts(story=story, check=check)
    try:
        await story.gang()
        attempts.start()
        k = await crash_then_restart(story, write)
        retried = await eventually(story.workload, timeout=90, interval=0.2,
                                   until=lambda w: retry_seen(w, check),
                                   what="Kueue retrying the gang")
        await attempts.stop()  # before the gang goes: a Workload gone counts no retries
        await story.kube.delete(f"/apis/batch/v1/namespaces/{story.namespace}/jobs/gang",
                          propagation="Background")
        dep = await story.settled()
        report = await finish_load(story)
    finally:
        await attempts.stop()
        await story.stop()
    print_row(k, write, f"Retry (retries seen {retries(retried, check)}, attempts surged "
              f"before it {len(attempts.before_retry)})", report.failed, story)
    assert len(attempts.before_retry) == 1, "the attempt surged once before its Retry"
    assert not attempts.over, attempts.over
    assert report.failed == 0, [c.as_dict() for c in report.chapters]
    assert story.watch.min_ready is not None and story.watch.min_ready >= REPLICAS
    assert story.watch.max_replicas <= REPLICAS + DISPLACED, "never past one surge"
    assert dep["spec"]["replicas"] == REPLICAS and plan_label_gone(dep)
    timed_out = [e for e in await story.events("Workload") if e["reason"] == "PrewarmTimedOut"]
    assert timed_out and "retrying later" in timed_out[0]["message"], timed_out

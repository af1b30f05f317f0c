"""A crash between any two writes of a move-back loses nothing (issue 36, crash points).

Real control plane, real Kueue, the load generator counting requests: the pre-warm story of
tests/e2e/test_prewarm.py with ``moveBack`` on. The gang is admitted through the pre-warm check,
the four displaced replicas serve from the cloud, the gang ends (its Job deleted) and the
replicas come home. The companion is started with the test hook ``VKP_CRASH_AFTER_WRITE``
naming one write of a move (descheduler/crashpoint.py): the intent recorded, the cloud pod's
deletion cost, the surge, the scale-back (with the intent marked), the intent cleared. It exits
dead (status 137, as after SIGKILL) right after the first write of that name, is restarted
without the hook, and must converge: every replica home, the Deployment at its count with no
intent, no failed request and never fewer than 4 ready from the first request to the last. In
every run each cloud pod that went away is counted in a ``MovedBack`` naming it, including after
a crash right after the intent is cleared; a ``MoveBackFailed`` only ever reports a move the cloud
pod outlived (an interrupted move rolled back, before the one that worked).
"""

from __future__ import annotations

import json

import pytest

from vkprovider.testing.waiting import eventually

from .test_moveback import INTENT as MOVE_INTENT
from .test_overflow import pods
from .test_prewarm import DISPLACED, RATE, REPLICAS, _sent
from .test_prewarm_crashpoints import Stage, crash_then_restart
from .test_prewarm_crashpoints import stage as stage  # the fixture: the pre-warm story's stage

pytestmark = pytest.mark.cluster


MOVE_BACK_WRITES = ("move-back: intent recorded", "move-back: deletion cost written",
                    "move-back: surge written", "move-back: surge taken back",
                    "move-back: intent cleared")


@pytest.mark.parametrize("write", MOVE_BACK_WRITES,
                         ids=lambda w: w.removeprefix("move-back: ").replace(" ", "-"))
async def test_a_crash_right_after_any_write_of_the_way_back_through_kueue_fails_no_request(
        write: str, stage: Stage) -> None:
    """The whole story with real Kueue, under the load generator: the gang is admitted through
    the pre-warm check, the displaced replicas serve from the cloud; the gang ends (its Job
    deleted) and the replicas come home, all four moves at once. The companion stops dead right
    after the first ``write`` of the way back and is restarted without the hook. After it:
    every replica home, the Deployment at its 4 with no intent, every cloud pod counted moved
    (a ``MovedBack`` naming it), no ``MoveBackFailed`` but for a move the pod outlived, no
    instance left, no failed request and never fewer than 4 ready, from first to last."""
    story = await stage.story(write, move_back={
        "enabled": True, "stableFor": "2s", "maxConcurrent": 4, "cooldown": "5s",
        "timeout": "60s"})
    try:
        await story.gang(run_seconds=600)  # it ends when the test deletes it
        await story.gang_running()
        await story.settled()
        cloud = [p["metadata"]["name"] for p in await story.on_virtual_node()]
        assert len(cloud) == DISPLACED, "the displaced replicas serve from the cloud"
        assert story.lg is not None
        story.lg.mark("on the cloud")
        sent = story.lg.report().sent
        await eventually(lambda: _sent(story.lg), until=lambda n: n >= sent + RATE, timeout=30,
                         what="a second of load on the cloud")
        await story.kube.delete(f"/apis/batch/v1/namespaces/{story.namespace}/jobs/gang",
                                propagation="Background")
        story.lg.mark("way back")
        k = await crash_then_restart(story, write)
        home = await eventually(
            lambda: pods(story.kube, story.namespace, "inference"), timeout=240, interval=0.5,
            until=lambda ps: len(ps) == REPLICAS and all(
                p["spec"].get("nodeName") not in (None, story.system.node_name)
                and p["status"].get("phase") == "Running" for p in ps),
            what="every replica back inside")
        dep = await eventually(
            lambda: story.kube.get(story.dep_path), timeout=90, interval=0.3,
            until=lambda d: MOVE_INTENT not in (d["metadata"].get("annotations") or {})
            and d["spec"]["replicas"] == REPLICAS
            and int(d.get("status", {}).get("readyReplicas") or 0) == REPLICAS,
            what="no move left, the Deployment at its count and Ready")
        story.lg.mark("home")
        sent = story.lg.report().sent
        await eventually(lambda: _sent(story.lg), until=lambda n: n >= sent + 2 * RATE, timeout=30,
                         what="two seconds of load at home")
        report = await story.lg.stop()
    finally:
        await story.stop()
    judged = [json.loads(line)["result"] for line in story.companion.log_text().splitlines()
              if '"move finished"' in line]
    events = await story.events("Deployment")
    moved = [e for e in events if e["reason"] == "MovedBack"]
    failed = [e for e in events if e["reason"] == "MoveBackFailed"]
    print(f"\ncrash after write {k} ({write}): moves judged {judged}; MovedBack {len(moved)}, "
          f"MoveBackFailed {len(failed)}; fewest ready {story.watch.min_ready} of {REPLICAS}; "
          f"requests {[(c.label, c.sent, c.failed) for c in report.chapters]}")
    assert report.failed == 0, [c.as_dict() for c in report.chapters]
    assert all(c.sent > 0 for c in report.chapters), "every chapter under load"
    assert story.watch.min_ready is not None and story.watch.min_ready >= REPLICAS
    assert dep["spec"]["replicas"] == REPLICAS and len(home) == REPLICAS
    assert not any((p["metadata"].get("annotations") or {}).get(
        "controller.kubernetes.io/pod-deletion-cost") for p in home)
    for name in cloud:  # each cloud pod went away in a move counted finished
        assert any(e["message"].startswith(f"{name} replaced") for e in moved), (name, events)
    assert sum(int(e.get("count") or 1) for e in failed) == judged.count("rolled-back"), events
    if write in MOVE_BACK_WRITES[3:]:  # the scale-back was written: that move worked
        assert not failed, events
    await eventually(story.live_instances, until=lambda n: n == 0, timeout=90,
                     what="every cloud instance deleted")


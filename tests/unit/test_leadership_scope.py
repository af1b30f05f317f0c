"""Nothing writes after leadership is lost (issue 36, item 7).

The companion's acting replica runs its loops through ``service.act``; the leader is faked by
the ``lost`` Event the elector would set. A move-back task that is running when the Lease is
lost (here: finishing a recorded move, waiting for the ReplicaSet to settle) must make no request
after the loss, even when what it waits for then happens: the next leader finishes the move
from its intent. The API is a recording stand-in (this is a unit test of the task scoping; the
informers are marked synced with their stores filled by hand, as their watches would).
"""

from __future__ import annotations

import asyncio
from typing import Any

from vkprovider.descheduler.admission import OverflowAdmission
from vkprovider.descheduler.hotswap import HotSwap
from vkprovider.descheduler.moveback import INTENT, Intent, MoveBack
from vkprovider.descheduler.scoped import TaskScope
from vkprovider.descheduler.service import act
from vkprovider.kube.errors import NotFoundError
from vkprovider.kube.events import EventRecorder

NODE = "vk-test"


class RecordingAPI:
    """Every request made, in order; reads of pods answer 404 (the cloud pod is gone)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    async def get(self, path: str, **_kw: Any) -> dict[str, Any]:
        self.requests.append(("GET", path))
        raise NotFoundError(f"{path} not found", status=404)

    async def patch(self, path: str, body: Any, **_kw: Any) -> dict[str, Any]:
        self.requests.append(("PATCH", path))
        return {}

    async def create(self, path: str, body: Any, **_kw: Any) -> dict[str, Any]:
        self.requests.append(("POST", path))
        return {}

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] != "GET"]


async def _watch_forever() -> None:
    await asyncio.Event().wait()


def companion(api: RecordingAPI) -> tuple[OverflowAdmission, MoveBack]:
    events = EventRecorder(client=api, component="test")  # type: ignore[arg-type]
    admission = OverflowAdmission(client=api, events=events,  # type: ignore[arg-type]
                                  node_names=[NODE])
    moveback = MoveBack(client=api, events=events, node_names=[NODE],  # type: ignore[arg-type]
                        admission=admission, poll=0.01)
    for informer in {*admission.informers, *moveback.informers}:
        informer.run = _watch_forever  # type: ignore[method-assign]
        informer.synced.set()
    return admission, moveback


def recorded_move(*, replicas_now: int) -> dict[str, Any]:
    """A Deployment whose move was taken back to 1 replica; the ReplicaSet still has 2."""
    intent = Intent(pod="web-cloud", pod_uid="u1", replicas=1, started=0.0, policy="burst",
                    scaled_back=1)
    return {"metadata": {"name": "web", "namespace": "ns", "uid": "d1", "generation": 3,
                         "resourceVersion": "7", "annotations": {INTENT: intent.dumps()}},
            "spec": {"replicas": 1},
            "status": {"observedGeneration": 3, "replicas": replicas_now, "readyReplicas": 1}}


async def test_a_running_move_makes_no_request_after_leadership_is_lost() -> None:
    api = RecordingAPI()
    _admission, moveback = companion(api)
    moveback.deployments.store["ns/web"] = recorded_move(replicas_now=2)
    stop, lost = asyncio.Event(), asyncio.Event()
    acting = asyncio.ensure_future(act(loops=[moveback.run()], stop=stop, lost=lost))
    for _ in range(100):  # the first pass starts the move's task, which waits for the RS
        await asyncio.sleep(0.01)
        if "ns/web" in moveback.in_flight:
            break
    move = moveback.in_flight["ns/web"]
    assert not move.done()
    assert api.writes() == []

    lost.set()  # the elector lost the Lease
    await acting
    seen = len(api.requests)
    # What the move waited for happens now: it must not go on to write.
    moveback.deployments.store["ns/web"] = recorded_move(replicas_now=1)
    moveback.changed.set()
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert move.done()
    assert api.requests[seen:] == [], "a move task wrote after leadership was lost"
    assert api.writes() == []


async def test_hot_swaps_end_with_their_loop() -> None:
    api = RecordingAPI()
    _admission, moveback = companion(api)
    swap = HotSwap(moveback=moveback, interval=0.01)
    started = asyncio.Event()

    async def swapping() -> None:
        started.set()
        await asyncio.Event().wait()  # a swap waiting for its replica

    stop, lost = asyncio.Event(), asyncio.Event()
    acting = asyncio.ensure_future(act(loops=[swap.run()], stop=stop, lost=lost))
    await asyncio.sleep(0.05)
    task = swap.scope.spawn(swapping(), name="hot-swap ns/web")
    await started.wait()
    lost.set()
    await acting
    assert task.cancelled()


async def test_a_scope_cancels_what_is_running_and_forgets_what_ended() -> None:
    scope = TaskScope()

    async def quick() -> int:
        return 1

    done = scope.spawn(quick(), name="quick")
    assert await done == 1
    await asyncio.sleep(0)
    assert len(scope) == 0
    waiting = scope.spawn(asyncio.Event().wait(), name="waiting")
    assert len(scope) == 1
    await scope.close()
    assert waiting.cancelled()

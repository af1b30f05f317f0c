"""A create never waits for a sweep: a list in flight does not hold back a new pod's instance.

Why: issue 35 split the pod engine and made every provider's list a task of its own
(node/listing.py); the burst bench then showed creates starting later after binding, and one
suspect was a create waiting for a sweep (or its list) to finish. Per-phase timings of the burst
(bench/burst.py with the phase trace) showed none: a worker goes from taking the pod to the cloud
call in under a millisecond, at the tip as at 48cf15e. This pins it: while a sweep's list of the
pod's provider is still out (within the sweep's wait), a new pod's create goes to that provider
at once, and the sweep, once its list answers, keeps the instance it did not see yet.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from providers.base import Instance, InstanceSpec, InstanceState, Offer, Provider
from vkprovider.config import Settings
from vkprovider.metrics import Metrics
from vkprovider.node import podcreate, podsweep
from vkprovider.node.pods import PodController


class SlowListCloud:
    """A cloud whose list answers only when the test says so; creates answer at once."""

    name = "mock"

    def __init__(self) -> None:
        self.answer_list = asyncio.Event()
        self.list_started = asyncio.Event()
        self.created: list[str] = []
        self.lists_answered = 0

    async def list(self) -> list[Instance]:
        self.list_started.set()
        await self.answer_list.wait()
        self.lists_answered += 1
        return []

    async def capacity(self) -> list[Offer]:
        return [Offer(provider="mock", gpu_type="H100", region="us-east", available=8,
                      price_per_gpu_hour=2.0)]

    async def create(self, spec: InstanceSpec) -> Instance:
        self.created.append(spec.name)
        # booting, as the cloud just made it: the engine writes no status before a list
        return Instance(id=f"i-{len(self.created)}", name=spec.name, provider="mock",
                        state=InstanceState.PENDING, gpu_count=spec.gpu_count,
                        tags=dict(spec.tags))

    async def aclose(self) -> None:
        return None


def new_pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid,
                         "creationTimestamp": "2030-01-01T00:00:00Z"},
            "spec": {"nodeName": "vk", "containers": [{
                "name": "main", "image": "server:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


async def test_a_create_goes_while_a_sweep_waits_for_its_list() -> None:
    cloud = SlowListCloud()
    ctl = PodController(client=cast(Any, None), settings=Settings(),
                        providers={"mock": cast(Provider, cloud)},
                        events=cast(Any, None), refs=cast(Any, None), metrics=Metrics())
    ctl.listed["mock"] = True  # listed OK by an earlier sweep
    ctl.listed_once.add("mock")
    pod = new_pod("u1")
    ctl.pods.watched("u1", "ns/p-u1")
    ctl.informer.store["ns/p-u1"] = pod

    # A sweep's lists (podsweep.sweep: the round, then its answers applied under the lock).
    lists = asyncio.create_task(ctl.lister.round([("mock", cast(Provider, cloud))]))
    await cloud.list_started.wait()  # the list is out; the sweep waits for it
    # (a bound so that a create that waited for the list fails here instead of hanging)
    await asyncio.wait_for(podcreate.create(ctl, pod, "u1"), timeout=30)
    assert len(cloud.created) == 1 and cloud.created[0].endswith("u1"), cloud.created
    assert cloud.lists_answered == 0 and not lists.done(), (
        "the create went while the sweep's list was still out")
    assert "u1" in ctl.placed and ctl.listed["mock"]

    cloud.answer_list.set()  # the list began before the create: it cannot show the instance
    results = await lists
    async with ctl.providers_lock:
        podsweep.apply_lists(ctl, results, served=["mock"])
    assert "u1" in ctl.placed, "a list that began before the create keeps the created instance"
    assert "u1" not in ctl.vanished
    await ctl.aclose()

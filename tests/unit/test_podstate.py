"""vkprovider.node.podstate: one record per pod, its named state, and what Services see of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

from providers.base import Instance, InstanceState, Provider, ProviderError, PublishedPort
from vkprovider.config import Settings
from vkprovider.metrics import Metrics
from vkprovider.node.placements import Placed
from vkprovider.node.pods import PodController
from vkprovider.node.podstate import PodStates, Retry, Serving, Stage, serving_of, stage_of


class Sink:
    """The endpoint sink's protocol (node/endpointslices.py), recording what it was told."""

    def __init__(self) -> None:
        self.pods: dict[str, list[Any]] = {}

    def set_pod(self, *, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                container_ports: Sequence[tuple[str, str | None, int, str]],
                endpoints: Sequence[Any]) -> None:
        self.pods[uid] = list(endpoints)

    def remove_pod(self, *, uid: str) -> None:
        self.pods.pop(uid)


class RefusingCloud:
    """A cloud whose delete fails (an outage): the pod engine must retry it."""

    name = "mock"

    async def delete(self, instance_id: str) -> None:
        raise ProviderError("503 from the cloud")

    async def aclose(self) -> None:
        return None


def pod(uid: str, *, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"p-{uid}", "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"containers": [
        {"name": "web", "ports": [{"containerPort": 8080}]}]}, "status": {"phase": phase}}


def placed(uid: str, state: InstanceState = InstanceState.RUNNING) -> Placed:
    return Placed(provider="mock", seen_at=0.0, instance=Instance(
        id=f"i-{uid}", name=f"vk-{uid}", provider="mock", state=state,
        tags={"vkprovider.io/uid": uid, "vkprovider.io/node": "vk"},
        published=(PublishedPort(container_port=8080, host="203.0.113.7", port=31000,
                                 kind="ip"),)))


def test_a_pods_record_goes_as_a_whole() -> None:
    now = [10.0]
    states = PodStates(clock=lambda: now[0])
    record = states.watched("u1", "ns/p1")
    assert record.first_seen == 10.0 and states.keys["u1"] == "ns/p1"
    states.unsure["u1"] = ("a", 3.0)
    record.wait().told_blind, record.wait().unplaced_tries = True, 2
    states.unwatched("u1")  # the watch says deleted: the record waits for its instance
    assert "u1" not in states.keys and len(states.keys) == 0
    assert states.get("u1") is record and states.unsure["u1"] == ("a", 3.0)
    states.drop("u1")
    assert states.get("u1") is None and "u1" not in states.unsure and len(states.unsure) == 0
    again = states.watched("u1", "ns/p1")  # same UID seen again: nothing carried over
    assert again.unsure is None and again.waiting is None  # nothing carried over


def test_the_named_states() -> None:
    states = PodStates(clock=lambda: 0.0)
    record = states.watched("u1", "ns/p1")
    assert stage_of(pod=None, placed=placed("u1"), record=record) is Stage.GONE
    assert stage_of(pod=pod("u1", deleting=True), placed=None, record=record) \
        is Stage.TERMINATING
    assert stage_of(pod=pod("u1", phase="Succeeded"), placed=placed("u1"), record=record) \
        is Stage.FINISHED
    assert stage_of(pod=pod("u1", phase="Pending"), placed=None, record=record) \
        is Stage.UNPLACED
    states.unsure["u1"] = ("mock", 0.0)
    assert stage_of(pod=pod("u1", phase="Pending"), placed=None, record=record) is Stage.UNSURE
    assert stage_of(pod=pod("u1"), placed=placed("u1", InstanceState.PENDING),
                    record=record) is Stage.BOOTING
    assert stage_of(pod=pod("u1"), placed=placed("u1"), record=record) is Stage.RUNNING
    assert stage_of(pod=pod("u1"), placed=placed("u1", InstanceState.FAILED),
                    record=record) is Stage.EXITED


@pytest.mark.parametrize(("stage", "held", "draining", "expected"), [
    (Stage.RUNNING, False, False, Serving.REPLICA),
    (Stage.BOOTING, False, False, Serving.REPLICA),
    (Stage.EXITED, False, False, Serving.REPLICA),
    (Stage.TERMINATING, False, True, Serving.TERMINATING),
    (Stage.TERMINATING, False, False, Serving.NONE),
    (Stage.GONE, False, False, Serving.NONE),
    (Stage.FINISHED, False, False, Serving.NONE),
    (Stage.UNPLACED, False, False, Serving.NONE),
    (Stage.UNSURE, False, False, Serving.NONE),
    (Stage.UNPLACED, True, False, Serving.HELD),
])
def test_what_a_service_sees_is_a_function_of_the_state(
        stage: Stage, held: bool, draining: bool, expected: Serving) -> None:
    assert serving_of(stage, held=held, draining=draining) is expected


def controller(sink: Sink) -> PodController:
    ctl = PodController(client=cast(Any, None), settings=Settings(),
                        providers={"mock": cast(Provider, RefusingCloud())},
                        events=cast(Any, None), refs=cast(Any, None), metrics=Metrics(),
                        endpoints=sink)
    ctl.listed["mock"] = True
    return ctl


async def test_a_gone_pod_has_no_endpoints_while_its_instance_delete_is_retried() -> None:
    sink = Sink()
    ctl = controller(sink)
    ctl.placed.set("u1", placed("u1"))
    ctl.replicas.running(uid="u1", pod=pod("u1"), provider="mock",
                         instance=ctl.placed["u1"].instance)
    assert sink.pods["u1"], "published while it ran"
    with pytest.raises(Retry):  # the pod is gone from the API; its instance delete fails
        await ctl.reconcile("u1")
    assert "u1" not in sink.pods, "a Service must not send requests to a pod that is gone"
    assert "u1" in ctl.placed, "the instance is still deleted on a later reconcile"


async def test_a_finished_pod_whose_placement_went_has_no_endpoints() -> None:
    sink = Sink()
    ctl = controller(sink)
    done = pod("u1", phase="Succeeded")
    ctl.pod_keys["u1"] = "ns/p-u1"
    ctl.informer.store["ns/p-u1"] = done
    ctl.replicas.running(uid="u1", pod=pod("u1"), provider="mock",
                         instance=placed("u1").instance)
    await ctl.reconcile("u1")  # no placement (its provider removed, say): nothing to delete
    assert "u1" not in sink.pods

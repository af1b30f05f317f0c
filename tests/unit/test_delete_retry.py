"""An accepted delete the cloud never carries out must be sent again (or it bills forever)."""

from __future__ import annotations

from typing import Any, cast

from providers.base import Instance, InstanceState
from vkprovider.config import Settings
from vkprovider.metrics import Metrics
from vkprovider.node.placements import Placed
from vkprovider.node.pods import PodController


def controller(now: list[float]) -> PodController:
    return PodController(client=cast(Any, None), settings=Settings(), providers={},
                         events=cast(Any, None), refs=cast(Any, None), metrics=Metrics(),
                         clock=lambda: now[0])


def inst(state: InstanceState) -> Placed:
    return Placed(provider="mock", instance=Instance(id="i-1", name="vk-uid", provider="mock",
                                                     state=state), seen_at=0.0)


def test_a_delete_is_trusted_only_for_delete_retry_seconds_unless_the_cloud_shows_progress(
) -> None:
    now = [1000.0]
    pc = controller(now)
    assert pc.settings.pods.delete_retry_seconds == 30.0
    assert not pc._delete_in_progress(inst(InstanceState.RUNNING))  # never asked
    pc.placed.mark_deleting(("mock", "i-1"), at=1000.0)
    now[0] = 1029.0
    assert pc._delete_in_progress(inst(InstanceState.RUNNING))
    now[0] = 1031.0
    assert not pc._delete_in_progress(inst(InstanceState.RUNNING)), "must delete again"
    assert not pc._delete_in_progress(inst(InstanceState.FAILED)), "a finished one too"
    assert pc._delete_in_progress(inst(InstanceState.TERMINATING)), "the cloud is on it"

"""The README's first command: the whole story must play, end to end, as `make demo` plays it.

It runs its own control plane (as `vkprovider demo` does), two mock clouds, the provider and the
companion; training preempts inference, inference bursts to the clouds and comes home.
"""

from __future__ import annotations

import pytest

from vkprovider.demo import run_story

pytestmark = pytest.mark.cluster


async def test_the_demo_story_plays_with_no_leak_no_dip_and_spend_counted() -> None:
    result = await run_story(narrate=False, replicas=4, training_seconds=15.0)
    assert result.moved_out == 4 and result.moved_back == 4, result
    assert result.min_ready_during_moves is not None
    assert result.min_ready_during_moves >= result.replicas, "ready replicas dipped on the way home"
    assert result.leaks == 0, result
    assert result.instances_created == result.instances_deleted == 4, result
    assert result.counted_dollars is not None, "the provider's spend record was never final"
    assert 0 < result.counted_dollars <= result.dollars + 1e-6, result

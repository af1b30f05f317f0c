"""The event-loop lag sampler records how late the loop woke when something held it."""

from __future__ import annotations

import asyncio
import time

from vkprovider.looplag import sample_lag
from vkprovider.metrics import Metrics

NAME = "vkprovider_event_loop_lag_seconds"


async def test_a_blocking_call_on_the_loop_is_recorded_as_lag() -> None:
    metrics = Metrics()
    task = asyncio.create_task(sample_lag(histogram=metrics.event_loop_lag, interval=0.01))
    try:
        await asyncio.sleep(0)  # the sampler takes its first due time
        time.sleep(0.05)  # noqa: ASYNC251 - the point: hold the loop past the sampler's wake-up
        while not metrics.registry.get_sample_value(f"{NAME}_count"):
            await asyncio.sleep(0.005)
    finally:
        task.cancel()
    assert (metrics.registry.get_sample_value(f"{NAME}_sum") or 0.0) > 0.0


def test_the_metric_is_registered_with_buckets_from_1_ms_to_5_s() -> None:
    metrics = Metrics()
    metrics.event_loop_lag.observe(0.0)
    assert metrics.registry.get_sample_value(f"{NAME}_bucket", {"le": "0.001"}) == 1.0
    assert metrics.registry.get_sample_value(f"{NAME}_bucket", {"le": "5.0"}) == 1.0


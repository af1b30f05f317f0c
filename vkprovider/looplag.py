"""Event-loop lag: how late the provider's one asyncio loop runs what it was asked to run.

Why it exists: the provider does everything on one event loop: the status sweeps, the workers'
reconciles, the watches, the node lease, the kubelet API and, since issue 13, one readiness or
liveness probe per replica and period. A blocking call or too much work per loop iteration makes
every timer fire late: probes time out although the replica is fine, the lease renewal slips, the
kubelet API stalls. CPU figures say how much work there is, not whether the loop keeps up; this
sampler does. It sleeps a fixed interval and records how much later than asked it woke, in
``vkprovider_event_loop_lag_seconds`` (docs/operations.md). A healthy loop stays around a
millisecond; p99 in the hundreds of milliseconds means something holds the loop.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

__all__ = ["INTERVAL_SECONDS", "sample_lag"]

#: How often the sampler wakes. Short enough to see a stall of a quarter second, long enough to
#: cost nothing (four wake-ups a second).
INTERVAL_SECONDS = 0.25


async def sample_lag(*, histogram: Histogram, interval: float = INTERVAL_SECONDS) -> None:
    """Until cancelled: sleep ``interval``, observe how late the wake-up came (never < 0)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        histogram.observe(max(0.0, loop.time() - due))

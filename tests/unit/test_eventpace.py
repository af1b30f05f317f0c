"""The Event sender: pacing (the kubelet's eventRecordQPS), Warnings first, counts as metrics."""

from __future__ import annotations

from typing import Any

import pytest

from vkprovider.kube.events import EventRecorder, Pace
from vkprovider.metrics import Metrics


def test_a_burst_goes_at_once_then_each_write_waits_its_turn() -> None:
    pace = Pace(qps=10.0, burst=3)
    assert [pace.take(now=0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    # the 4th token comes 0.1 s later, the 5th 0.2 s later: each caller sleeps until its own
    assert pace.take(now=0.0) == pytest.approx(0.1)
    assert pace.take(now=0.0) == pytest.approx(0.2)


def test_the_bucket_refills_at_the_rate_and_never_past_the_burst() -> None:
    pace = Pace(qps=2.0, burst=2)
    pace.take(now=0.0)
    pace.take(now=0.0)
    assert pace.take(now=0.5) == 0.0, "half a second at 2/s is one token"
    assert pace.take(now=0.5) == pytest.approx(0.5)
    # a long quiet spell refills to the burst, not beyond it
    assert [pace.take(now=100.0) for _ in range(2)] == [0.0, 0.0]
    assert pace.take(now=100.0) == pytest.approx(0.5)


def test_a_writer_that_waited_is_not_charged_twice() -> None:
    pace = Pace(qps=1.0, burst=1)
    assert pace.take(now=0.0) == 0.0
    assert pace.take(now=0.0) == pytest.approx(1.0)  # sleeps 1 s, writes at t=1
    assert pace.take(now=1.0) == pytest.approx(1.0), "the next one writes at t=2, not t=3"


@pytest.mark.parametrize(("qps", "burst"), [(-1.0, 1), (1.0, 0)])
def test_nonsense_pacing_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="event pacing"):
        EventRecorder(client=None, component="t", qps=qps, burst=burst)  # type: ignore[arg-type]


class RecordingClient:
    """Takes the recorder's writes in order (the e2e tests write to a real API server)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    async def create(self, path: str, body: dict[str, Any], *, want_body: bool) -> dict[str, Any]:
        self.reasons.append(body["reason"])
        return {}


async def test_queued_warnings_are_written_before_normal_events() -> None:
    client = RecordingClient()
    recorder = EventRecorder(client=client, component="t",  # type: ignore[arg-type]
                             qps=20.0, burst=1)
    for i in range(3):
        pod = {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}}
        await recorder.emit(obj=pod, reason=f"Started{i}", message="started")
    failed = {"metadata": {"name": "bad", "namespace": "ns", "uid": "u-bad"}}
    await recorder.emit(obj=failed, reason="NotAdmitted", type_="Warning", message="no policy")
    assert recorder.queued == 4
    assert await recorder.flush(timeout=10)
    assert client.reasons == ["NotAdmitted", "Started0", "Started1", "Started2"]
    assert recorder.counts() == (0, 4, 0)
    metrics = Metrics()
    metrics.events.source = recorder.counts
    scraped = metrics.render().decode()
    assert "vkprovider_events_written_total 4.0" in scraped
    assert "vkprovider_events_queued 0.0" in scraped
    await recorder.aclose()

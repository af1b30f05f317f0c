"""The README's first command: the whole story must play, end to end, as `make demo` plays it.

It runs its own control plane (as `vkprovider demo` does), two mock clouds, the provider and the
companion; training takes the internal GPUs, inference bursts to the clouds and comes home, with
real requests (a load generator through the inference Service) counted per chapter. The way out
plays through real Kueue with the pre-warm check (the demo's default when Kueue is built: it needs
``VKP_KUEUE_BIN``, and a missing build fails the test, never skips it) and by plain preemption
(``--no-kueue``, the measured baseline).
"""

from __future__ import annotations

import re

import pytest

from vkprovider.demo import run_story
from vkprovider.storyobjects import CHECK
from vkprovider.storyreport import (
    HOME,
    INSIDE,
    ON_CLOUD,
    PREEMPTION,
    PREWARM,
    WAY_BACK,
    WAY_OUT,
    StoryResult,
)

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster]


def check_the_story(result: StoryResult, printed: str) -> None:
    """What every way out must give: no leak, no dip on the way home, the spend counted, the
    site measured per chapter and printed as such."""
    assert result.moved_out == 4 and result.moved_back == 4, result
    assert result.min_ready_during_moves is not None
    assert result.min_ready_during_moves >= result.replicas, "ready replicas dipped on the way home"
    assert result.leaks == 0, result
    assert result.instances_created == result.instances_deleted >= 4, result
    assert result.counted_dollars is not None, "the provider's spend record was never final"
    assert 0 < result.counted_dollars <= result.dollars + 1e-6, result

    # the site, measured in requests: a chapter per step, each with traffic
    chapters = {c.label: c for c in result.requests}
    assert [c.label for c in result.requests] == [INSIDE, WAY_OUT, ON_CLOUD, WAY_BACK, HOME]
    assert all(c.sent >= result.rate for c in result.requests), result.requests  # >= 1 s each
    assert chapters[WAY_BACK].failed == 0, chapters[WAY_BACK]
    assert chapters[WAY_BACK].longest_no_endpoint == 0, chapters[WAY_BACK]
    assert result.failed_where_none_may == 0, result.requests
    assert result.ok, result
    w = result.way_out
    assert w.sent == chapters[WAY_OUT].sent and w.failed == chapters[WAY_OUT].failed
    assert w.gang_start_seconds is not None and w.gang_start_seconds > 0, w

    # as printed: the closing tables, the requests one with its columns and a row per chapter
    assert "leaks (live instances)" in printed and "way out" in printed
    header = next(line for line in printed.splitlines() if "REQUESTS SENT" in line)
    assert re.search(r"CHAPTER\s+REQUESTS SENT\s+FAILED\s+LONGEST NO-ENDPOINT WINDOW", header)
    for c in result.requests:
        row = next(line for line in printed.splitlines()
                   if line.strip().startswith(c.label + "  ") and " s" in line)
        assert re.search(rf"\s{c.sent}\s+{c.failed}\b", row), row
    assert f"inference serving {result.rate:g} req/s" in printed
    assert "Running on the clouds" in printed and "Ready" in printed


async def test_the_way_out_through_kueue_with_pre_warm_fails_no_request_and_never_dips(
        capsys: pytest.CaptureFixture[str]) -> None:
    result = await run_story(narrate=True, replicas=4, training_seconds=15.0, mode=PREWARM)
    printed = capsys.readouterr().out
    check_the_story(result, printed)
    w = result.way_out
    # judged, not measured: no failed request, never fewer ready replicas than desired
    assert not any(c.may_fail for c in result.requests)
    assert w.failed == 0 and w.longest_no_endpoint == 0, w
    assert w.min_ready == result.replicas and w.seconds_below_desired == 0, w
    assert w.max_replicas == 2 * result.replicas, "one surge, by the displaced count"
    # Kueue held the gang while the check was Pending, then admitted it
    assert w.gang_admission_seconds is not None and w.gang_admission_seconds > 1, w
    assert any(m.startswith("Pending: surging serving/inference 4 -> 8") for m in
               w.check_messages), w.check_messages
    assert any(m.startswith("Ready: pre-warmed serving/inference +4") for m in
               w.check_messages), w.check_messages
    # the narration: the check Pending -> Ready in its own words, the gang admitted
    assert f'AdmissionCheck {CHECK} on the Workload: Pending, "surging' in printed
    assert f'AdmissionCheck {CHECK} on the Workload: Ready, "pre-warmed' in printed
    assert "pre-warming 4 replicas on the clouds" in printed
    assert "4 ready: admitting the gang" in printed
    assert re.search(r"Workload job-training-\w+ Admitted", printed)
    assert "failed requests (the way out included)" in printed
    assert "(measured: the baseline)" not in printed


async def test_the_way_out_by_plain_preemption_is_the_measured_baseline(
        capsys: pytest.CaptureFixture[str]) -> None:
    result = await run_story(narrate=True, replicas=4, training_seconds=15.0, mode=PREEMPTION)
    printed = capsys.readouterr().out
    check_the_story(result, printed)
    assert result.instances_created == 4, result
    assert [c.label for c in result.requests if c.may_fail] == [WAY_OUT]
    assert result.way_out.gang_admission_seconds is None  # no Kueue, no Workload
    assert result.way_out.max_replicas == result.replicas
    assert "failed requests outside the way out" in printed
    assert "plain preemption, no Kueue" in printed

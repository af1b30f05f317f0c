"""The README's first command: the whole story must play, end to end, as `make demo` plays it.

It runs its own control plane (as `vkprovider demo` does), two mock clouds, the provider and the
companion; training preempts inference, inference bursts to the clouds and comes home, with real
requests (a load generator through the inference Service) counted per chapter.
"""

from __future__ import annotations

import re

import pytest

from vkprovider.demo import HOME, INSIDE, ON_CLOUD, WAY_BACK, WAY_OUT, run_story

pytestmark = pytest.mark.cluster


async def test_the_demo_story_plays_with_no_leak_no_dip_no_failed_request_and_spend_counted(
        capsys: pytest.CaptureFixture[str]) -> None:
    result = await run_story(narrate=True, replicas=4, training_seconds=15.0)
    printed = capsys.readouterr().out
    assert result.moved_out == 4 and result.moved_back == 4, result
    assert result.min_ready_during_moves is not None
    assert result.min_ready_during_moves >= result.replicas, "ready replicas dipped on the way home"
    assert result.leaks == 0, result
    assert result.instances_created == result.instances_deleted == 4, result
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

    # as printed: the closing tables, the requests one with its columns and a row per chapter
    assert "leaks (live instances)" in printed and "failed requests outside the way out" in printed
    header = next(line for line in printed.splitlines() if "REQUESTS SENT" in line)
    assert re.search(r"CHAPTER\s+REQUESTS SENT\s+FAILED\s+LONGEST NO-ENDPOINT WINDOW", header)
    for c in result.requests:
        row = next(line for line in printed.splitlines()
                   if line.strip().startswith(c.label + "  ") and " s" in line)
        assert re.search(rf"\s{c.sent}\s+{c.failed}\b", row), row
    assert f"inference serving {result.rate:g} req/s" in printed
    assert "Running on the clouds" in printed and "Ready" in printed

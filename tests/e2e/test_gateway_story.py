"""The Krea story with one hostname-only cloud among the two (issue 38, acceptance 1).

The story of ``vkprovider demo`` (tests/e2e/test_demo.py), the way out through real Kueue with
the pre-warm check, but cloud-b publishes its replicas by hostname only: each replica port is an
HTTPS edge (``<instance>-8000.edge.cloud-b.test:443``, a certificate signed by a test CA) that
answers 401 without the cloud's API key in ``Salad-Api-Key``. The load generator speaks plain HTTP
to the Service's endpoints, so every request cloud-b's model servers count came through the
traffic gateway: a real HAProxy process the provider programs over its Runtime API (TLS
origination, SNI, the edge key added), standing as the gateway pod whose address the
EndpointSlices hold. Every chapter must fail no request, the way out included.
"""

from __future__ import annotations

import pytest

from vkprovider.demo import run_story
from vkprovider.storyreport import ON_CLOUD, PREWARM

from .test_demo import check_the_story

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster]


async def test_the_story_with_a_hostname_only_cloud_fails_no_request_and_serves_from_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    result = await run_story(narrate=True, replicas=4, training_seconds=15.0, mode=PREWARM,
                             hostname_only_cloud=True)
    printed = capsys.readouterr().out
    check_the_story(result, printed)
    # judged in every chapter, the way out through Kueue's pre-warm included
    assert not any(c.may_fail for c in result.requests)
    assert [c.failed for c in result.requests] == [0] * len(result.requests), result.requests
    assert result.way_out.min_ready == result.replicas, result.way_out

    # cloud-b ran replicas, fronted by the gateway: one ready endpoint at the gateway pod each
    b, a = result.per_cloud["cloud-b"], result.per_cloud["cloud-a"]
    assert b["created"] >= 1 and b["path"] == "gateway" and a["path"] == "direct", result
    assert result.gateway_endpoints is not None and result.gateway_endpoints >= 1, result
    # their share, counted by the model servers (probes apart): at least one replica's share
    # of the chapter on the clouds, and the clouds together served that whole chapter
    on_cloud = next(c for c in result.requests if c.label == ON_CLOUD)
    assert b["requests"] >= on_cloud.sent // result.replicas, (b, on_cloud)
    assert a["requests"] + b["requests"] >= on_cloud.sent, (a, b, on_cloud)
    assert "requests served (gateway)" in printed
    assert "the gateway pod's (100.64.250.1:<port>)" in printed

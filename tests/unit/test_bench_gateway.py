"""The gateway benchmark's bookkeeping: the open-loop schedule, rows, the difference, output."""

from __future__ import annotations

import pytest

from bench.gateway import Row, added, parse_args, payload, render, schedule, summarize

INFO = {"cpu": "Test CPU", "cores": 2, "memory_gib": 8.0, "python": "3.11.9",
        "haproxy": "2.6.12"}


def row(path: str, rate: int, *, p50: float, p99: float, gw: float, replica: float) -> Row:
    return Row(path=path, rate=rate, sent=1000, failed=0, p50_ms=p50, p99_ms=p99,
               gateway_us=gw, replica_us=replica, client_us=100.0)


def test_schedule_is_evenly_spaced_at_the_rate() -> None:
    due = schedule(rate=200, seconds=2)
    assert len(due) == 400
    assert due[0] == 0 and due[1] == pytest.approx(0.005) and due[-1] == pytest.approx(1.995)
    assert schedule(rate=0.5, seconds=1) == [0.0]  # at least one request


def test_summarize_gives_percentiles_and_cpu_per_sent_request() -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1 .. 100 ms
    r = summarize(path="gateway", rate=200, latencies=latencies, failed=100,
                  cpu={"gateway": 0.02, "replica": 0.01, "client": 0.04})
    assert (r.sent, r.failed) == (200, 100)
    assert r.p50_ms == pytest.approx(51.0) and r.p99_ms == pytest.approx(99.0)
    assert (r.gateway_us, r.replica_us, r.client_us) == pytest.approx((100, 50, 200))
    assert r.total_us == pytest.approx(350)
    direct = summarize(path="direct", rate=200, latencies=latencies, failed=0,
                       cpu={"replica": 0.01, "client": 0.01})
    assert direct.gateway_us == 0


def test_added_is_gateway_minus_direct_per_rate_and_skips_an_incomplete_rate() -> None:
    rows = [row("direct", 200, p50=0.5, p99=2.0, gw=0, replica=40),
            row("gateway", 200, p50=0.9, p99=3.5, gw=150, replica=90),
            row("direct", 1000, p50=0.4, p99=5.0, gw=0, replica=30)]
    assert added(rows) == [{"rate": 200, "p50_ms": 0.4, "p99_ms": 1.5,
                            "cpu_us_per_request": 200.0, "gateway_cpu_us_per_request": 150.0}]


def test_render_and_payload_name_the_machine_and_both_tables() -> None:
    rows = [row("direct", 200, p50=0.5, p99=2.0, gw=0, replica=40),
            row("gateway", 200, p50=0.9, p99=3.5, gw=150, replica=90)]
    text = render(rows, INFO)
    assert text.startswith("Machine: Test CPU, 2 cores, 8.0 GiB, Python 3.11.9; HAProxy 2.6.12")
    assert "| gateway | 200   | 1,000 |" in text
    assert "| 200   | +0.40  | +1.50  | +200       |" in text
    data = payload(rows, INFO, seconds=10)
    assert data["machine"]["cpu"] == "Test CPU" and data["seconds_per_phase"] == 10
    assert data["rows"][1]["total_us"] == 340.0
    assert data["added"][0]["rate"] == 200


def test_arguments_default_to_200_and_1000_per_second_and_refuse_nonsense() -> None:
    args = parse_args([])
    assert args.rates == [200, 1000] and args.seconds == 10.0 and args.connections == 32
    with pytest.raises(SystemExit):
        parse_args(["--rates", "0"])

"""The probe benchmark's bookkeeping: arguments, pod bodies, window rows, the difference, output."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.probes import (
    Snapshot,
    compare,
    is_ready,
    parse_args,
    payload,
    pod_body,
    probe_counts,
    render,
    save,
    window_row,
)
from bench.steady import Histogram

INFO = {"cpu": "Test CPU", "cores": 2, "memory_gib": 8.0, "python": "3.11.9"}


def lag(*, counts: Sequence[float], total: float) -> Histogram:
    bounds = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
              float("inf")]
    return Histogram(buckets=dict(zip(bounds, counts, strict=True)), count=counts[-1],
                     total=total)


def snap(*, at: float, cpu: float, probes: int, lag_hist: Histogram,
         writes: dict[tuple[str, str, str], float]) -> Snapshot:
    return Snapshot(at=at, provider_cpu=cpu, provider_rss_mib=80.0, mock_cpu=1.0, lag=lag_hist,
                    writes=writes, probes=probes, traffic=0)


def test_defaults_are_issue_13s_size_and_out_can_point_elsewhere(tmp_path: Path) -> None:
    args = parse_args([])
    assert (args.pods, args.window, args.period) == (1000, 60.0, 10)
    assert args.out.name == "results" and args.out.parent.name == "bench"
    assert not args.no_baseline
    args = parse_args(["--pods", "100", "--window", "20", "--period", "5", "--out",
                       str(tmp_path), "--no-baseline"])
    assert (args.pods, args.window, args.period, args.out) == (100, 20.0, 5, tmp_path)
    assert args.no_baseline
    with pytest.raises(SystemExit):
        parse_args(["--period", "0"])


def test_probe_pods_declare_the_port_the_probe_uses_and_the_baseline_has_no_probe() -> None:
    probed = pod_body(node="vk", i=3, period=10)["spec"]["containers"][0]
    assert probed["ports"] == [{"name": "http", "containerPort": 8000}]
    assert probed["readinessProbe"] == {"httpGet": {"path": "/ready", "port": "http"},
                                        "periodSeconds": 10}
    plain = pod_body(node="vk", i=3, period=None)
    assert "readinessProbe" not in plain["spec"]["containers"][0]
    assert plain["metadata"]["name"] == "p3" and plain["spec"]["nodeName"] == "vk"


def test_ready_means_the_ready_condition() -> None:
    assert is_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not is_ready({"status": {"phase": "Running",
                                    "conditions": [{"type": "Ready", "status": "False"}]}})
    assert not is_ready({"status": {}})


def test_probe_counts_sum_the_mock_traffic_over_instances() -> None:
    traffic = {"i-1": {"traffic": 2, "probes": 7, "ports": {"8000": {"traffic": 2, "probes": 7}}},
               "i-2": {"traffic": 0, "probes": 5, "ports": {}}}
    assert probe_counts(traffic) == (12, 2)
    assert probe_counts({}) == (0, 0)


def test_a_window_row_and_the_difference_to_the_baseline() -> None:
    writes = {("PUT", "leases", ""): 10.0}
    quiet = lag(counts=[0] * 13, total=0.0)
    # 240 samples in the window: 120 under 1 ms, 118 under 2.5 ms, 2 between 25 and 50 ms
    busy = lag(counts=[120, 238, 238, 238, 238, 240, 240, 240, 240, 240, 240, 240, 240],
               total=0.4)
    probed = window_row(
        mode="probes", n=100, period=10,
        start=snap(at=0.0, cpu=10.0, probes=1000, lag_hist=quiet, writes=writes),
        end=snap(at=60.0, cpu=13.0, probes=1600, lag_hist=busy,
                 writes={("PUT", "leases", ""): 16.0}),
        peak_rss=90.0)
    assert probed["probes"] == 600 and probed["probe_rounds"] == 6.0
    assert probed["cpu_per_minute_s"] == 3.0
    assert probed["cpu_per_probe_us"] == 5000.0  # 3 s over 600 probes
    assert probed["cpu_per_round_ms"] == 500.0
    assert probed["lag_samples"] == 240
    assert probed["lag_p50_ms"] == 1.0
    assert probed["lag_max_bucket_ms"] == 50.0 and not probed["lag_beyond_last_bucket"]
    assert probed["apiserver_writes_per_minute"] == 6.0
    assert probed["apiserver_writes_by_kind"] == {"PUT leases": 6.0}

    baseline = window_row(
        mode="baseline", n=100, period=None,
        start=snap(at=0.0, cpu=10.0, probes=0, lag_hist=quiet, writes=writes),
        end=snap(at=60.0, cpu=11.2, probes=0, lag_hist=quiet,
                 writes={("PUT", "leases", ""): 16.0}),
        peak_rss=85.0)
    assert baseline["cpu_per_probe_us"] is None and baseline["lag_p99_ms"] is None
    diff = compare(baseline=baseline, probed=probed)
    assert diff["extra_cpu_per_minute_s"] == 1.8
    assert diff["extra_core_percent"] == 3.0
    assert diff["net_cpu_per_probe_us"] == 3000.0  # 1.8 s over 600 probes
    assert diff["net_cpu_per_round_ms"] == 300.0
    assert diff["apiserver_writes_per_minute"] == [6.0, 6.0]

    for row in (baseline, probed):
        row["seconds_to_all_ready"] = 4.2
        row["ready_at_end"] = 100
    text = render(info=INFO, results=[baseline, probed], comparison=diff, load=(0.5, 0.4, 0.3))
    assert "Test CPU, 2 cores" in text
    assert "| probes " in text and "| baseline " in text
    assert "100/100" in text and "5000.0" in text
    assert "+1.8 CPU s/min (3.0% of a core), net 3000.0 µs per probe" in text


def test_a_lag_past_the_last_bucket_is_shown_as_such() -> None:
    stalled = lag(counts=[0] * 12 + [1], total=7.0)
    quiet = lag(counts=[0] * 13, total=0.0)
    row = window_row(mode="probes", n=10, period=10,
                     start=snap(at=0.0, cpu=0.0, probes=0, lag_hist=quiet, writes={}),
                     end=snap(at=20.0, cpu=1.0, probes=20, lag_hist=stalled, writes={}),
                     peak_rss=1.0)
    assert row["lag_beyond_last_bucket"] and row["lag_max_bucket_ms"] is None
    json.dumps(row, allow_nan=False)  # no NaN or Infinity in the results file


def test_the_results_are_json_with_machine_settings_results_and_comparison(
        tmp_path: Path) -> None:
    args = parse_args(["--pods", "10", "--window", "5", "--out", str(tmp_path / "out")])
    body = payload(info=INFO, args=args, results=[], comparison=None, load=(1.0, 1.0, 1.0))
    assert set(body) == {"machine", "settings", "results", "comparison"}
    assert body["settings"]["period_seconds"] == 10
    assert body["settings"]["pods"]["status_interval_seconds"] == 5
    paths = save(out=args.out, body=body, text="table\n")
    assert [p.name for p in paths] == ["probes.json", "probes.txt"]
    assert json.loads(paths[0].read_text())["machine"]["cores"] == 2
    assert paths[1].read_text() == "table\n"

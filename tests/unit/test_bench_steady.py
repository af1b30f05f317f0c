"""The steady benchmark's side-by-side rows for the Go virtual-kubelet."""

from __future__ import annotations

from pathlib import Path

from bench.burst import GoVK
from bench.steady import GoSnapshot, go_window_row, render_side_by_side


def test_a_go_window_row_counts_cpu_and_writes_over_the_window(tmp_path: Path) -> None:
    system = GoVK(binary=Path("/nowhere/govk"), work=tmp_path, kubeconfig=Path("/k"),
                  lift_limits=True)
    start = GoSnapshot(at=100.0, cpu=2.0, rss_mib=60.0,
                       writes={("PUT", "leases", ""): 10.0})
    end = GoSnapshot(at=130.0, cpu=2.5, rss_mib=61.0,
                     writes={("PUT", "leases", ""): 13.0, ("PATCH", "nodes", "status"): 1.0})
    row = go_window_row(system=system, n=1000, start=start, end=end, peak_rss=70.0)
    assert row["system"] == "go-vk lifted"
    assert row["provider_cpu_seconds"] == 0.5
    assert row["cpu_per_minute_s"] == 1.0
    assert row["apiserver_writes"] == 4.0
    assert row["apiserver_writes_per_minute"] == 8.0
    assert row["apiserver_writes_by_kind"] == {"PATCH nodes/status": 1.0, "PUT leases": 3.0}
    row["seconds_to_all_running"] = 12.0
    text = render_side_by_side([row])
    assert "go-vk lifted" in text and "61.0 / 70.0" in text

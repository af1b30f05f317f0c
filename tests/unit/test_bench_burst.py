"""The burst benchmark's bookkeeping: per-pod writes, the watch's times, time limits, the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.burst import (
    TOLERATION,
    PodWatch,
    Writes,
    cores_table,
    go_systems,
    lifecycle_mark,
    medians,
    phase_timeouts,
    pod_writes,
    render,
    wall_cell,
    writes_delta,
)
from bench.govk import TAINT, govk_argv


def test_lifecycle_writes_leave_out_the_bench_and_the_heartbeats() -> None:
    before: Writes = {("POST", "pods", ""): 10.0, ("PUT", "leases", ""): 5.0}
    after: Writes = {
        ("POST", "pods", ""): 110.0,  # the bench's 100 creates
        ("DELETE", "pods", ""): 130.0,  # its 100 deletes and 30 by the system
        ("PUT", "pods", "status"): 100.0,
        ("POST", "events", ""): 200.0,
        ("PUT", "leases", ""): 9.0,
        ("PATCH", "nodes", "status"): 2.0,
    }
    by_kind, per_pod, heartbeats = writes_delta(after, before, n=100, deleted=True)
    assert per_pod == 3.3  # 30 deletes + 100 status + 200 events over 100 pods
    assert heartbeats == 6.0
    assert by_kind["DELETE pods"] == 130.0
    assert by_kind["PUT pods/status"] == 100.0
    assert "PUT leases" in by_kind


def test_writes_to_running_do_not_subtract_deletes() -> None:
    after: Writes = {("POST", "pods", ""): 50.0, ("DELETE", "pods", ""): 5.0,
                     ("PATCH", "pods", "status"): 50.0}
    _, per_pod, _ = writes_delta(after, {}, n=50, deleted=False)
    assert per_pod == 1.1


def test_the_quiet_check_ignores_heartbeats() -> None:
    writes: Writes = {("PUT", "leases", ""): 7.0, ("PATCH", "nodes", "status"): 1.0,
                      ("POST", "events", ""): 4.0, ("PUT", "pods", "status"): 2.0}
    assert pod_writes(writes) == 6.0


def test_the_watch_keeps_first_sightings_and_deletions() -> None:
    watch = PodWatch()
    pod: dict[str, Any] = {"metadata": {"uid": "u1"}, "spec": {"nodeName": "n"},
                           "status": {"phase": "Pending"}}
    watch.on_pod("ADDED", pod)
    assert watch.running == {}
    pod["status"]["phase"] = "Running"
    watch.on_pod("MODIFIED", pod)
    first = watch.running["u1"]
    watch.on_pod("MODIFIED", pod)
    assert watch.running["u1"] == first
    watch.on_pod("DELETED", pod)
    assert watch.gone == {"u1"}


def test_phase_timeouts_default_grow_with_size_and_take_one_value_per_size() -> None:
    default = phase_timeouts([100, 1000], None)
    assert default[1000] > default[100]
    assert phase_timeouts([1000, 3000], [700.0, 240.0]) == {1000: 700.0, 3000: 240.0}
    with pytest.raises(SystemExit):
        phase_timeouts([1000, 3000], [700.0])


def row(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "system": "go-vk default", "pods": 10, "all_running_in_time": True, "quiet_in_time": True,
        "running_seen": 10, "wall_seconds_to_all_running": 1.5, "create_to_running_p50_ms": 10.0,
        "create_to_running_p99_ms": 20.0, "cpu_seconds_to_running": 0.1,
        "cpu_seconds_lifecycle": 0.2, "apiserver_writes_per_pod_to_running": 1.0,
        "apiserver_writes_per_pod_lifecycle": 3.0, "delete_to_quiet_seconds": 2.0,
        "peak_rss_mib": 60.0, "apiserver_writes_by_kind_lifecycle": {"POST events": 20.0},
        "non_2xx_writes_lifecycle": 0.0, "create_all_pods_seconds": 1.2,
    }
    return {**base, **overrides}


def test_a_timed_out_system_shows_how_far_it_got() -> None:
    assert wall_cell(row()) == "1.5"
    assert wall_cell(row(all_running_in_time=False, running_seen=4)) == (
        "timed out: 4/10 Running")


def test_the_table_leaves_the_cloud_columns_blank_for_go() -> None:
    info = {"cpu": "x", "cores": 2, "memory_gib": 1.0, "python": "3"}
    ours = row(system="vkprovider", bind_to_create_p50_ms=5.0, bind_to_create_p99_ms=9.0,
               seen_to_create_p50_ms=3.0, seen_to_create_p99_ms=7.0,
               running_to_pod_running_p50_ms=1.0, running_to_pod_running_p99_ms=2.0,
               cloud_cpu_seconds_lifecycle=1.25)
    text = render(info=info, results=[ours, row(quiet_in_time=False)], load=(1.0, 1.0, 1.0),
                  timeout_note="limits")
    lines: dict[str, str] = {}
    for line in text.splitlines():  # the first table's rows (the cores table comes after)
        if line.startswith("| ") and "system" not in line:
            lines.setdefault(line.split("|")[1].strip(), line)
    ours_cells = [c.strip() for c in lines["vkprovider"].split("|")]
    assert ours_cells[5:8] == ["5.0 / 9.0", "3.0 / 7.0", "1.0 / 2.0"]
    cells = [c.strip() for c in lines["go-vk default"].split("|")]
    assert cells[5] == "" and cells[6] == "" and cells[7] == "" and cells[10] == ""
    assert ours_cells[10] == "1.25"
    assert "3.0*" in lines["go-vk default"]
    assert "lower bound" in text


def test_the_cores_table_adds_up_every_user_of_the_cores() -> None:
    ours = row(system="vkprovider", cpu_seconds_to_running=1.25, cloud_cpu_seconds_to_running=0.5,
               control_plane_cpu_seconds_to_running=3.0, bench_cpu_seconds_to_running=1.0,
               create_all_pods_seconds=3.4)
    go = row(system="go-vk lifted", cpu_seconds_to_running=0.75, cloud_cpu_seconds_to_running=0.0,
             control_plane_cpu_seconds_to_running=2.5, bench_cpu_seconds_to_running=0.75)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in cores_table([ours, go]).splitlines()
            if line.startswith("| ") and "system" not in line}
    assert rows["vkprovider"] == ["vkprovider", "10", "3.4", "1.5", "1.25", "0.5", "3.0", "1.0",
                                  "5.75"]
    assert rows["go-vk lifted"][-1] == "4.0"


def test_a_go_node_with_a_cloud_is_set_against_each_system_with_its_cloud() -> None:
    ours = [row(system="vkprovider", pods=1000, wall_seconds_to_all_running=w,
                cpu_seconds_to_running=2.0, cloud_cpu_seconds_to_running=1.0) for w in (5.0, 6.0)]
    go = [row(system="go-vk lifted", pods=1000, wall_seconds_to_all_running=4.0,
              cpu_seconds_to_running=1.0) for _ in range(2)]
    go_cloud = [row(system="go-vk lifted+cloud", pods=1000, wall_seconds_to_all_running=5.0,
                    cpu_seconds_to_running=c, cloud_cpu_seconds_to_running=1.0)
                for c in (1.0, 1.0)]
    text = medians(ours + go + go_cloud)
    header = [c.strip() for c in text.splitlines()[0].split("|")[1:-1]]
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
             for line in text.splitlines()[2:]}
    assert header == ["system", "pods", "runs", "wall to all Running (s)", "vs go-vk lifted",
                      "vs go-vk lifted+cloud", "CPU to Running (s)", "vs go-vk lifted",
                      "CPU with its cloud to Running (s)", "vs go-vk lifted+cloud",
                      "CPU lifecycle (s)"]
    assert lines["vkprovider"][3:10] == ["5.5", "1.38x", "1.10x", "2.0", "2.00x", "3.0", "1.50x"]
    # the in-memory Go node has no cloud: its CPU with a cloud is its own
    assert lines["go-vk lifted"][8:10] == ["1.0", "0.50x"]
    # without a Go node with a cloud the columns are not there
    assert "lifted+cloud" not in medians(ours + go)


def test_go_modes_pick_the_go_nodes_in_a_fixed_order(tmp_path: Path) -> None:
    systems = go_systems(binary=Path("/b/govk"), work=tmp_path, kubeconfig=Path("/k"),
                         modes=("lifted-cloud", "default"), workers=8, n=100)
    assert [s.label for s in systems] == ["go-vk default", "go-vk lifted+cloud"]
    plain, clouded = systems
    assert plain.cloud is None and plain.helper_pid() is None
    assert clouded.cloud is not None
    argv = clouded.process.component.argv
    assert f"--cloud-url={clouded.cloud.url}" in argv and "--lift-limits" in argv
    assert not any(a.startswith("--cloud-url") for a in plain.process.component.argv)
    with pytest.raises(ValueError, match="unknown Go modes"):
        go_systems(binary=Path("/b/govk"), work=tmp_path, kubeconfig=Path("/k"),
                   modes=("fast",), workers=8, n=100)


def test_govk_runs_with_our_taint_and_lifts_limits_only_when_asked() -> None:
    argv = govk_argv(binary=Path("/b/govk"), kubeconfig=Path("/k"), node="n1",
                     lift_limits=False, workers=10)
    assert f"--taint={TAINT}" in argv and "--workers=10" in argv
    assert "--lift-limits" not in argv
    assert "--lift-limits" in govk_argv(binary=Path("/b/govk"), kubeconfig=Path("/k"),
                                        node="n1", lift_limits=True, workers=10)



def test_the_bench_pods_tolerate_the_go_node_taint() -> None:
    key, rest = TAINT.split("=", 1)
    value, effect = rest.split(":")
    assert (key, value, effect) == (TOLERATION["key"], TOLERATION["value"], TOLERATION["effect"])


def test_a_system_that_did_not_get_all_pods_running_is_marked_not_comparable() -> None:
    assert lifecycle_mark(row()) == ""
    assert lifecycle_mark(row(all_running_in_time=False)) == "†"
    assert lifecycle_mark(row(all_running_in_time=False, quiet_in_time=False)) == "*†"


def test_repeated_runs_get_medians_and_ratios_to_go_lifted() -> None:
    runs = [row(system="vkprovider", pods=1000, wall_seconds_to_all_running=w,
                cpu_seconds_to_running=c) for w, c in ((4.0, 2.0), (6.0, 3.0), (5.0, 2.5))]
    runs += [row(system="go-vk lifted", pods=1000, wall_seconds_to_all_running=w,
                 cpu_seconds_to_running=1.0) for w in (4.0, 5.0, 3.0)]
    runs.append(row(system="vkprovider", pods=1000, all_running_in_time=False))  # left out
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
             for line in medians(runs).splitlines() if line.startswith("| ")}
    assert lines["vkprovider"] == ["vkprovider", "1000", "3", "5.0", "1.25x", "2.5", "2.50x",
                                   "0.2"]
    assert lines["go-vk lifted"][2:5] == ["3", "4.0", "1.00x"]
    info = {"cpu": "x", "cores": 2, "memory_gib": 1.0, "python": "3"}
    text = render(info=info, results=runs, load=(1.0, 1.0, 1.0), timeout_note="l", repeat=3)
    assert "run 3 times per size" in text and "medians over the repeated runs" in text
    once = render(info=info, results=runs[:1], load=(1.0, 1.0, 1.0), timeout_note="l")
    assert "medians" not in once


def test_the_phase_trace_times_each_pods_first_steps(tmp_path: Path) -> None:
    from bench.phases import phase_figures

    prefix = tmp_path / "node.trace"
    (tmp_path / "node.trace.41").write_text("\n".join([
        "watch u1 10.000", "worker u1 10.010", "create_call u1 10.011",
        "create_answer u1 10.031", "status_write u1 10.032", "status_answer u1 10.432",
        "worker u1 20.000",  # a later reconcile: not the pod's first
        "watch u2 11.000",  # never created (refused, say): not counted
        "status_write u3",  # cut short by a kill
    ]) + "\n")
    figures = phase_figures(prefix)
    assert figures["phase_trace_pods"] == 1
    assert figures["phase_watch_to_worker_p50_ms"] == 10.0
    assert figures["phase_worker_to_cloud_call_p50_ms"] == 1.0
    assert figures["phase_cloud_create_call_p50_ms"] == 20.0
    assert figures["phase_created_to_status_write_p50_ms"] == 1.0
    assert figures["phase_status_write_p50_ms"] == 400.0

"""The day benchmark's bookkeeping: arguments, the script, money, events, the table and the JSON
(no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.day import (
    CHEAP,
    CLOUD_OUT,
    EVENING,
    HOT_GPU,
    MORNING,
    QUEUE_GANGS,
    TAINT,
    UNTAINT,
    DayResult,
    cheapest_price,
    count_events,
    describe,
    gpu_hours,
    held_by,
    money,
    parse_args,
    payload,
    render,
    save,
    timeline,
)

INFO = {"cpu": "Test CPU", "cores": 2, "memory_gib": 8.0, "python": "3.11.9"}


def test_defaults_fit_a_two_core_machine() -> None:
    args = parse_args([])
    assert (args.gpus_per_node, args.replicas, args.rate) == (4, 4, 25.0)
    assert args.gangs == [6, 8, 4] and args.run_seconds == 30.0
    assert args.out.name == "results" and args.out.parent.name == "bench"
    args = parse_args(["--gangs", "8", "2", "--run-seconds", "20", "--rate", "10",
                       "--taint-at", "5", "--taint-seconds", "2", "--out", "/tmp/x"])
    assert args.gangs == [8, 2] and args.run_seconds == 20 and args.rate == 10
    assert args.out == Path("/tmp/x")


@pytest.mark.parametrize("argv", [
    ["--rate", "0"], ["--gangs"], ["--gangs", "0"], ["--gangs", "9"], ["--replicas", "9"],
    ["--gpus-per-node", "0"], ["--hot-at", "-1"], ["--taint-seconds", "0"],
])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_the_script_plays_in_order_of_time() -> None:
    steps = timeline(parse_args([]))
    assert [(s.at, s.action) for s in steps] == [
        (0.0, ""), (10.0, QUEUE_GANGS), (35.0, HOT_GPU), (60.0, CLOUD_OUT), (75.0, TAINT),
        (105.0, UNTAINT)]
    assert steps[0].chapter == MORNING
    assert steps[1].target == "6 8 4"
    assert steps[3].target == CHEAP and steps[4].target == steps[5].target == "gpu-node-1"
    assert len({s.chapter for s in steps}) == len(steps)  # one chapter per step
    assert EVENING not in {s.chapter for s in steps}  # the evening comes when the queue empties
    # moved: still sorted, the untaint follows its taint
    steps = timeline(parse_args(["--taint-at", "1", "--taint-seconds", "3", "--hot-at", "50"]))
    assert [s.action for s in steps] == ["", TAINT, UNTAINT, QUEUE_GANGS, HOT_GPU, CLOUD_OUT]
    assert [s.at for s in steps] == sorted(s.at for s in steps)


def test_cost_against_the_cheapest_schedule() -> None:
    assert cheapest_price({"a": "H100:us:8:2.49", "b": "H100:eu:8:1.89,A100:eu:2:1.20"}) == 1.2
    with pytest.raises(ValueError, match="no offers"):
        cheapest_price({"a": ""})
    # an hour of 1 GPU at 2.49; half an hour of 2 GPUs at 3.78 $/h (1.89 each)
    dear = {"cost": 2.49, "price_per_hour": 2.49, "gpu_count": 1, "state": "deleted"}
    cheap = {"cost": 1.89, "price_per_hour": 3.78, "gpu_count": 2, "state": "running"}
    assert gpu_hours(dear) == 1.0 and gpu_hours(cheap) == 1.0
    assert gpu_hours({"cost": 1.0, "price_per_hour": 0}) == 0.0
    m = money({"cloud-a": [dear], "cloud-b": [cheap]}, cheapest=1.89)
    assert m["dollars"] == 4.38 and m["gpu_hours"] == 2.0
    assert m["cheapest_dollars"] == 3.78
    assert m["over_cheapest"] == pytest.approx(4.38 / 3.78 - 1, abs=1e-4)
    assert m["per_cloud"] == {
        "cloud-a": {"created": 1, "live": 0, "dollars": 2.49, "gpu_hours": 1.0},
        "cloud-b": {"created": 1, "live": 1, "dollars": 1.89, "gpu_hours": 1.0}}
    assert money({"cloud-a": []}, cheapest=1.0)["over_cheapest"] == 0.0


def test_held_moves_are_told_apart_by_their_message() -> None:
    kueue = ("Not moving inference-x back inside yet: Kueue will place 2 GPU(s) of workload "
             "serving/job-b (quota reserved) on these nodes")
    sick = ("Not moving inference-x back inside yet: the free internal GPUs are on unhealthy "
            "nodes: gpu-node-1 (health taint AggregatedNodeHealth=False:PreferNoSchedule)")
    room = "Not moving inference-x back inside yet: ...; the policy keeps 2 GPU(s) of headroom"
    assert (held_by(kueue), held_by(sick), held_by(room)) == ("kueue", "unhealthy", "headroom")
    events: list[dict[str, object]] = [{"reason": "MoveBackHeld", "message": kueue, "count": 3},
              {"reason": "MoveBackHeld", "message": sick},
              {"reason": "MovedBack", "message": "", "count": 2},
              {"reason": "MovedBack"}]
    assert count_events(events) == {"MoveBackHeld/kueue": 3, "MoveBackHeld/unhealthy": 1,
                                    "MovedBack": 3}


def result() -> DayResult:
    r = DayResult(replicas=4, rate=25.0, gangs=3, gangs_done=3, moves_out=7, moves_back=6,
                  preempted=10, pingpongs_avoided=2, held={"kueue": 2}, hot_replaced=1,
                  seconds_below_desired=17.1, min_ready=0, seconds=130.0)
    r.chapters = [{"label": MORNING, "start": 0.0, "sent": 250, "failed": 0,
                   "longest_no_endpoint": 0.0, "failures_by_kind": {}},
                  {"label": "gangs queued", "start": 10.0, "sent": 625, "failed": 134,
                   "longest_no_endpoint": 5.3, "failures_by_kind": {"connect": 134}}]
    r.money = money({"cloud-a": [{"cost": 0.2, "price_per_hour": 2.0, "gpu_count": 1,
                                  "state": "deleted"}]}, cheapest=1.0)
    return r


def test_the_table_and_the_json(tmp_path: Path) -> None:
    args = parse_args(["--out", str(tmp_path)])
    r = result()
    assert r.failed == 134 and r.ok
    text = describe(INFO, args) + render(r)
    assert "Test CPU, 2 cores" in text and "placement Cheapest" in text
    assert "10 gangs queued" in text
    for cell in ("| gangs queued", "| 134 ", "0.29 min (17.1 s; fewest ready 0 of 4)",
                 "| 7 / 6 ", "ping-pongs avoided (MoveBackHeld, kueue) | 2",
                 "| 0.1000 (at 1.00 $/GPU-h; +100.0%)", "0.2000 (0.1000 GPU-h)",
                 "leaks (live instances)"):
        assert cell in text, cell
    data = payload(info=INFO, args=args, result=r)
    paths = save(out=tmp_path, data=data, text=text)
    assert [p.name for p in paths] == ["day.json", "day.txt"]
    back = json.loads(paths[0].read_text())
    assert back["machine"]["cores"] == 2 and back["settings"]["gangs"] == [6, 8, 4]
    assert back["settings"]["out"] == str(tmp_path)
    assert [s["action"] for s in back["timeline"]][1] == QUEUE_GANGS
    res = back["result"]
    assert res["failed"] == 134 and res["ok"] is True and res["leaks"] == 0
    assert res["money"]["cheapest_per_gpu_hour"] == 1.0
    assert {"chapters", "seconds_below_desired", "moves_out", "moves_back",
            "pingpongs_avoided", "money", "leaks", "notes"} <= set(res)
    assert paths[1].read_text() == text
    # a day that did not finish: no result, the error said
    failed = payload(info=INFO, args=args, result=None, error="TimeoutError: the gang queue")
    assert failed["result"] is None and failed["error"].startswith("TimeoutError")


def test_a_leak_or_an_unfinished_queue_is_not_ok() -> None:
    r = result()
    r.leaks = 1
    assert not r.ok
    r = result()
    r.gangs_done = 2
    assert not r.ok

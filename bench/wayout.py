"""Way-out benchmark (issue 14): the dip when a training gang displaces inference, and what the
Kueue pre-warm check costs the gang, measured on the local cluster with real Kueue.

Each run is the demo's story (``vkprovider.demo.run_story``, unnarrated): two simulated internal
GPU nodes filled by an inference Deployment (readiness probe, weight load), a Service, a load
generator at ``--rate`` requests/s through it the whole time, a gang of as many 1-GPU pods at a
higher priority, two mock clouds (cloud-a holds half the replicas, then cloud-b), the provider and
the companion as processes; the gang trains for ``--training-seconds`` and inference comes home.
What differs is the way out (``--runs``):

* ``prewarm``: the gang is a Kueue batch Job whose ClusterQueue carries the ``vkprovider.io/
  prewarm`` AdmissionCheck: the companion surges inference onto the clouds before Kueue admits;
* ``kueue``: the same Kueue objects without the check (the scheduler preempts, replacements
  overflow through the preemption fast path);
* ``preemption``: no Kueue, the Job's pods preempt at once, fast path on;
* ``preemption-no-fast-path``: the same with the companion's ``--no-preemption-fast-path``, so
  the replacements wait the policy's ``overflowAfter`` (``--overflow-after``).

Per run, on the way out: failed requests (of those sent), the longest window with no ready
endpoint, seconds with fewer ready replicas than desired and the fewest seen (the Deployment,
sampled every 200 ms), the gang's admission delay (its Workload first seen -> Admitted, sampled
every 200 ms; Kueue runs only) and start delay (Job created -> every gang pod Running), spec
.replicas at its highest (the surge); for the whole story, cloud instances created and the clouds'
bill. Prints a table, writes ``wayout.json`` and ``wayout.txt`` to ``--out`` (bench/results).

    export VKP_CONTROLPLANE_BIN=$(bash tools/controlplane/build.sh)
    export VKP_KUEUE_BIN=$(bash tools/kueue/build.sh)
    .venv/bin/python -m bench.wayout                      # 4 replicas, 25 req/s, every run
    .venv/bin/python -m bench.wayout --runs prewarm kueue --replicas 8 --rate 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import RESULTS, machine, table
from vkprovider.cliflags import (
    positive_number,
    positive_seconds,
)
from vkprovider.demo import run_story
from vkprovider.storyreport import KUEUE, PREEMPTION, PREWARM, StoryResult

#: the policy's limits.maxPricePerHour in every run but "prewarm-no-cap" (the demo's)
PRICE_CAP = 100.0
#: run name -> (demo mode, preemption fast path, price cap)
RUNS: dict[str, tuple[str, bool, float | None]] = {
    "prewarm": (PREWARM, True, PRICE_CAP),
    "prewarm-no-cap": (PREWARM, True, None),
    "kueue": (KUEUE, True, PRICE_CAP),
    "preemption": (PREEMPTION, True, PRICE_CAP),
    "preemption-no-fast-path": (PREEMPTION, False, PRICE_CAP),
}
#: what the default run list leaves out (add it with --runs)
EXTRA_RUNS = ("prewarm-no-cap",)
TITLES = {
    "prewarm": "Kueue + pre-warm check",
    "prewarm-no-cap": "Kueue + pre-warm, no price cap",
    "kueue": "Kueue, no check",
    "preemption": "no Kueue, fast path",
    "preemption-no-fast-path": "no Kueue, no fast path",
}
HEADER = ["way out", "failed / sent", "longest no-endpoint (s)", "below desired (s)",
          "fewest ready", "gang admitted after (s)", "QuotaReserved->Admitted (s)",
          "gang running after (s)",
          "most replicas", "instances", "cloud $"]


def _replicas(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text}: at least 2 (one per internal node)")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="way-out benchmark (issue 14)")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS),
                        default=[r for r in RUNS if r not in EXTRA_RUNS],
                        help="which ways out to measure (default: all but prewarm-no-cap)")
    parser.add_argument("--replicas", type=_replicas, default=4,
                        help="inference replicas = internal GPUs = gang pods (default 4)")
    parser.add_argument("--rate", type=positive_number, default=25.0,
                        help="requests per second through the Service (default 25)")
    parser.add_argument("--load-seconds", type=positive_seconds, default=3.0,
                        help="the model server's weight load (default 3)")
    parser.add_argument("--training-seconds", type=positive_seconds, default=30.0,
                        help="how long the gang trains; longer than the slowest way out, or "
                             "training ends before inference is out (default 30)")
    parser.add_argument("--overflow-after", default="10s",
                        help="the policy's overflowAfter, which the fast path and the pre-warm "
                             "skip (default 10s)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="directory for wayout.json and wayout.txt (default bench/results)")
    return parser.parse_args(argv)


def row(name: str, r: StoryResult) -> dict[str, Any]:
    """One run's figures, flat (the JSON's ``runs`` and the table)."""
    w = r.way_out
    return {
        "run": name, "mode": w.mode, "fast_path": w.fast_path, "replicas": r.replicas,
        "rate": r.rate, "sent": w.sent, "failed": w.failed,
        "longest_no_endpoint_s": w.longest_no_endpoint,
        "seconds_below_desired": w.seconds_below_desired, "min_ready": w.min_ready,
        "gang_admission_s": w.gang_admission_seconds,
        "gang_reserved_to_admitted_s": w.gang_reserved_to_admitted_seconds,
        "gang_start_s": w.gang_start_seconds,
        "max_replicas": w.max_replicas, "check_messages": list(w.check_messages),
        "instances_created": r.instances_created, "leaks": r.leaks, "dollars": r.dollars,
        "failed_elsewhere": r.failed_where_none_may if w.mode != PREWARM else sum(
            c.failed for c in r.requests if c.label != "way out"),
        "ok": r.ok,
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(rows: Sequence[dict[str, Any]]) -> str:
    body = [[TITLES.get(x["run"], x["run"]), f"{x['failed']} / {x['sent']}",
             f"{x['longest_no_endpoint_s']:.1f}", f"{x['seconds_below_desired']:.1f}",
             f"{x['min_ready']} of {x['replicas']}", _s(x["gang_admission_s"]),
             _s(x.get("gang_reserved_to_admitted_s")), _s(x["gang_start_s"]),
             str(x["max_replicas"]),
             f"{x['instances_created']} ({x['leaks']} leaked)", f"{x['dollars']:.4f}"]
            for x in rows]
    return table(HEADER, body)


def describe(info: dict[str, Any], args: argparse.Namespace) -> str:
    return (f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
            f"Python {info['python']}\n"
            f"settings: {args.replicas} inference replicas x 1 GPU filling 2 internal nodes, a "
            f"gang of {args.replicas} x 1 GPU at higher priority, {args.rate:g} req/s, weight "
            f"load {args.load_seconds:g} s, cloud boot 1.0 s (cloud-a) / 1.5 s (cloud-b), "
            f"overflowAfter {args.overflow_after}, training {args.training_seconds:g} s, "
            f"maxPricePerHour ${PRICE_CAP:g} (but where a run says no price cap); "
            f"Kueue v0.17.0; samples every 200 ms\n")


def payload(*, info: dict[str, Any], args: argparse.Namespace,
            rows: Sequence[dict[str, Any]], stories: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"machine": info,
            "settings": {"runs": list(args.runs), "replicas": args.replicas, "rate": args.rate,
                         "load_seconds": args.load_seconds,
                         "training_seconds": args.training_seconds,
                         "overflow_after": args.overflow_after},
            "runs": list(rows), "stories": list(stories)}


def save(*, out: Path, data: dict[str, Any], text: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "wayout.json", out / "wayout.txt"]
    paths[0].write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    paths[1].write_text(text)
    return paths


def needs_kueue(runs: Sequence[str]) -> bool:
    return any(RUNS[r][0] in (PREWARM, KUEUE) for r in runs)


async def main(args: argparse.Namespace) -> int:
    logging.getLogger("vkprovider.testing.loadgen").setLevel(logging.WARNING)
    if needs_kueue(args.runs):
        from vkprovider.testing.kueue import KueueError, find_kueue

        try:
            find_kueue()
        except KueueError as exc:
            sys.stderr.write(f"bench.wayout: {exc}\n")
            return 2
    rows, stories, errors = [], [], []
    for name in args.runs:
        mode, fast, cap = RUNS[name]
        sys.stderr.write(f"way out: {TITLES[name]} ...\n")
        try:
            result = await run_story(replicas=args.replicas, narrate=False, rate=args.rate,
                                     load_seconds=args.load_seconds,
                                     training_seconds=args.training_seconds, mode=mode,
                                     fast_path=fast, overflow_after=args.overflow_after,
                                     max_price_per_hour=cap)
        except (TimeoutError, RuntimeError) as exc:  # one run that does not finish is reported
            errors.append({"run": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows.append(row(name, result))
        stories.append({"run": name, **asdict(result)})
    info = machine()
    text = describe(info, args) + render(rows) + "\n" + "".join(
        f"{TITLES[e['run']]}: did not finish: {e['error']}\n" for e in errors)
    sys.stdout.write(text)
    data = payload(info=info, args=args, rows=rows, stories=stories)
    data["errors"] = errors
    for path in save(out=args.out, data=data, text=text):
        sys.stdout.write(f"wrote {path}\n")
    # the pre-warm must fail no request and never dip; no run may leak or fail elsewhere
    good = not errors and all(x["leaks"] == 0 and x["failed_elsewhere"] == 0 for x in rows) and all(
        x["failed"] == 0 and (x["min_ready"] or 0) >= x["replicas"]
        for x in rows if x["mode"] == PREWARM)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))

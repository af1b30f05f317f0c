"""Move-back benchmark: the demo's story, unnarrated, measured.

Time from the training gang finishing (GPUs freed) to every inference replica home and every
cloud instance deleted; per-move time (intent recorded on the Deployment -> cleared, sampled every
200 ms); the fewest ready replicas seen during the moves (must equal the desired count).
Settings: stableFor 5 s, maxConcurrent 2 (one move per Deployment at a time), the fake kubelet
starts pods 1 s after binding. Prints a table, writes bench/results/moveback.json.

    .venv/bin/python -m bench.moveback --replicas 4 8
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict

from bench.common import machine, pct, table, write
from vkprovider.demo import run_story


async def main(sizes: list[int]) -> int:
    results = []
    for n in sizes:
        sys.stderr.write(f"story with {n} replicas ...\n")
        results.append(await run_story(replicas=n, narrate=False, training_seconds=15))
    info = machine()
    header = ["replicas", "freed -> all home (s)", "per move p50 / max (s)",
              "min ready / desired", "instances created / leaked", "$ spent"]
    rows = [[str(r.replicas), str(r.seconds_gpus_freed_to_all_home),
             f"{pct(r.per_move_seconds, 50):.1f} / {max(r.per_move_seconds, default=0):.1f}",
             f"{r.min_ready_during_moves} / {r.replicas}",
             f"{r.instances_created} / {r.leaks}", f"{r.dollars:.4f}"] for r in results]
    sys.stdout.write(f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
                     f"Python {info['python']}\n")
    sys.stdout.write("settings: stableFor 5 s (included in the total), maxConcurrent 2, one move "
                     "per Deployment at a time, pods start 1 s after binding\n")
    sys.stdout.write(table(header, rows) + "\n")
    path = write("moveback", {"machine": info, "results": [asdict(r) for r in results]})
    sys.stdout.write(f"wrote {path}\n")
    return 0 if all(r.leaks == 0 and r.min_ready_during_moves == r.replicas
                    for r in results) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="move-back benchmark")
    parser.add_argument("--replicas", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.replicas)))

"""The phase trace of a burst (bench/phasetrace) read back: per-step latencies inside a provider.

Why it exists: see bench/phasetrace/sitecustomize.py. Each pod's first watch event, first
reconcile, cloud create call and answer, first status write and answer give five phases; their
p50/p99 tell the provider's own work (queue wait, the steps before the cloud call) from what it
waits on (the cloud, the API server).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.common import pct

__all__ = ["PHASES", "TRACE_DIR", "phase_figures"]

#: sitecustomize.py's directory: first on a provider's PYTHONPATH, it traces that provider.
TRACE_DIR = Path(__file__).resolve().parent / "phasetrace"

#: (figure stem, from step, to step, column title)
PHASES = (
    ("watch_to_worker", "watch", "worker", "watch -> worker (queue)"),
    ("worker_to_cloud_call", "worker", "create_call", "worker -> cloud create call"),
    ("cloud_create_call", "create_call", "create_answer", "cloud create call"),
    ("created_to_status_write", "create_answer", "status_write", "created -> status write"),
    ("status_write", "status_write", "status_answer", "status write (API server)"),
)


def read_steps(lines: Iterable[str]) -> dict[str, dict[str, float]]:
    """uid -> step -> the first time it reached it."""
    steps: dict[str, dict[str, float]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 3:
            continue  # a line cut short by a kill
        kind, uid, at = parts
        steps.setdefault(uid, {}).setdefault(kind, float(at))
    return steps


def phase_figures(prefix: Path) -> dict[str, Any]:
    """p50/p99 (ms) of each phase over the pods created through the traced provider (every
    ``<prefix>.<pid>`` file: the provider's process)."""
    lines: list[str] = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}.*")):
        lines += path.read_text().splitlines()
    steps = {uid: s for uid, s in read_steps(lines).items() if "create_call" in s}
    out: dict[str, Any] = {"phase_trace_pods": len(steps)}
    for stem, start, end, _ in PHASES:
        values = [(s[end] - s[start]) * 1000 for s in steps.values() if start in s and end in s]
        out[f"phase_{stem}_p50_ms"] = round(pct(values, 50), 1) if values else None
        out[f"phase_{stem}_p99_ms"] = round(pct(values, 99), 1) if values else None
    return out

"""Shared bits of the benchmarks: machine description, percentiles, tables, JSON results."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vkprovider.kube import KubeClient

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in rows]
    return "\n".join(out)


def write(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


async def populate(kube: KubeClient, *, namespace: str, n: int,
                   body: Callable[[int], dict[str, Any]], concurrency: int,
                   then: Callable[[int], Awaitable[None]] | None = None) -> None:
    """Create ``namespace`` and pods ``body(0)`` .. ``body(n - 1)`` in it, ``concurrency`` at a
    time; ``then(i)`` runs right after pod ``i`` is created (e.g. to give it a status)."""
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": namespace}})
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", body(i), want_body=False)
            if then is not None:
                await then(i)

    await asyncio.gather(*(one(i) for i in range(n)))


def proc_usage(pid: int) -> tuple[float, float]:
    """(peak RSS MiB, CPU seconds) of a live process, from /proc."""
    peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            peak = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return peak, cpu


class Profiler:
    """py-spy sampling a running process into collapsed stacks (``--format raw``), for finding
    where a bench's CPU goes. py-spy comes with the ``bench`` extra (``pip install -e .[bench]``);
    it needs ptrace rights over the process (root, or the same user with ptrace allowed)."""

    def __init__(self, *, pid: int, out: Path, rate: int = 250) -> None:
        self.out = out
        binary = Path(sys.executable).with_name("py-spy")
        if not binary.exists():
            raise SystemExit(f"--profile needs py-spy next to {sys.executable}: "
                             "install the bench extra (pip install -e '.[bench]')")
        out.parent.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [str(binary), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
             "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> Path:
        """Stop sampling and write the stacks (py-spy writes its file on SIGINT)."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        return self.out


REPO = Path(__file__).resolve().parent.parent


def runtime_python() -> Path:
    """A Python with only the project's runtime dependencies, for the provider under test.

    The dev venv also holds pytest, mypy and import-linter, and with them rich and pygments,
    which httpx imports when they are installed (``httpx._main``, its command line): 4.4 MiB
    the deployed image never carries. Memory is measured as deployed, so the provider runs
    from ``.artifacts/runtime-venv-<hash>`` (built once per set of dependencies, the project's
    own code taken from this tree through PYTHONPATH, so edits need no reinstall)."""
    import hashlib
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    key = hashlib.sha256("\n".join([sys.version, *deps]).encode()).hexdigest()[:12]
    venv = REPO / ".artifacts" / f"runtime-venv-{key}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    sys.stderr.write(f"building the runtime-only venv {venv} ...\n")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *deps], check=True)
    (venv / ".complete").write_text(key + "\n")
    return python


def runtime_env(tree: Path | None = None) -> dict[str, str]:
    """Environment additions that let :func:`runtime_python` import this tree's code (or
    ``tree``'s: another checkout of the project, for a before/after in one run)."""
    return {"PYTHONPATH": str(tree or REPO)}

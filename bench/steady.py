"""Steady-state benchmark: N pods Running on the virtual node, nothing changing, measured.

One control plane, one mock cloud (no boot delay) and one provider with production settings
(status sweep every 5 s, 64 workers, GPU figures read every 15 s, in one call per provider
since the mock offers ``gpu_metrics_all``; capacity refresh every 30 s). For each size N: bind
N pods to the virtual node (32 concurrent creates), wait until
all are Running (only the time is reported), let it settle 10 s and until no pod or event write
has come for 3 s, then watch a window of ``--window`` seconds in which nothing changes. Over the
window it reports:

* the provider's RSS at the start and end of the window (VmRSS) and its peak (VmHWM), in MiB;
* the provider's CPU seconds, the number of sweeps, CPU per sweep and per pod-sweep. This is the
  whole process's CPU divided by the sweeps, so it includes everything else a steady node does
  (GPU-figure reads, lease and node status); ``--gpu-metrics-interval 100000`` leaves it to the
  sweep, lease and node status alone;
* sweep duration from the provider's ``vkprovider_sweep_duration_seconds`` histogram, read
  before and after the window: the mean (sum / count, exact), p50 and p99 interpolated linearly
  within the buckets of the window's delta (as PromQL's ``histogram_quantile``; coarse, the
  buckets are 10, 25, 50, 100, 250, 500 ms, ...), and the bound of the highest bucket hit (every
  sweep took at most that long). The histogram times the list, the matching, the orphan check and
  the spend book, not the reconcile of every pod the sweep then enqueues: that work shows in the
  CPU figures only;
* API server writes (``apiserver_request_total``) in total and per minute: only the node lease
  and status and a spend record every 15 s are expected, whatever N;
* the mock cloud's CPU seconds (it serves the list calls and the GPU-figure reads on the same
  machine), and its list and GPU-metrics calls.

Then the pods are deleted and the cloud drained before the next size, so sizes do not stack.

``--compare-go`` then runs the upstream Go virtual-kubelet (``tools/govk``: v1.14.1 with an
in-memory provider; library defaults, then with its work-queue rate limiters and client QPS
lifted) through the same sizes, pods and window, each on its own node, and adds a side-by-side
table of what all systems share: time to all Running, CPU in the window and per minute, RSS, API
writes per minute.

Prints the tables, writes ``bench/results/steady.json`` and the printed text to
``bench/results/steady.txt``.

    .venv/bin/python -m bench.steady --pods 1000 5000 --window 60
    .venv/bin/python -m bench.steady --pods 1000 --window 60 --compare-go
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.burst import TOLERATION, GoVK, Writes, apiserver_writes, wait_quiet
from bench.burst import wait_node as wait_go_node
from bench.common import RESULTS, machine, proc_usage, runtime_env, runtime_python, table, write
from bench.govk import govk_binary
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.kube.watching import Informer
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import (
    MockCloudProcess,
    ProviderProcess,
    grant_provider_node,
    install_provider_rbac,
)

SWEEP_HISTOGRAM = "vkprovider_sweep_duration_seconds"
SETTLE_SECONDS = 10.0
CREATE_CONCURRENCY = 32
SETTINGS: dict[str, Any] = {
    "pods": {"status_interval_seconds": 5, "workers": 64, "orphan_grace_seconds": 30},
    # thousands of pods on one node: its allocatable pods must hold them (the provider refuses
    # past it, OutOfpods, as a kubelet does)
    "node": {"capacity_refresh_seconds": 30, "pods": 20000},
}


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """A Prometheus histogram: cumulative counts by upper bound (``inf`` last), count, sum."""

    buckets: dict[float, float]
    count: float
    total: float

    def minus(self, other: Histogram) -> Histogram:
        return Histogram(buckets={le: c - other.buckets.get(le, 0.0)
                                  for le, c in self.buckets.items()},
                         count=self.count - other.count, total=self.total - other.total)

    def quantile(self, q: float) -> float:
        """Linear interpolation within the bucket holding rank q * count (histogram_quantile)."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                if cumulative == below:
                    return le
                return lower + (le - lower) * (rank - below) / (cumulative - below)
            lower, below = le, cumulative
        return lower

    def max_bound(self) -> float:
        """The smallest bucket bound every observation fits under."""
        return min((le for le, c in self.buckets.items() if c >= self.count), default=math.nan)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    at: float
    provider_cpu: float
    provider_rss_mib: float
    mock_cpu: float
    sweeps: Histogram
    writes: dict[tuple[str, str, str], float]
    mock_stats: dict[str, Any]


def parse_histogram(*, text: str, name: str) -> Histogram:
    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name == f"{name}_count":
                count = sample.value
            elif sample.name == f"{name}_sum":
                total = sample.value
    return Histogram(buckets=buckets, count=count, total=total)


def rss_mib(*, pid: int) -> float:
    """Current resident set (VmRSS) of a live process in MiB; ``proc_usage`` gives the peak."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return math.nan


def pid_of(process: ProviderProcess | MockCloudProcess) -> int:
    proc = process.component.process
    if proc is None:
        raise RuntimeError(f"{process.component.name} is not running")
    return proc.pid


async def snapshot(*, kube: KubeClient, cloud: MockCloudProcess,
                   provider: ProviderProcess) -> Snapshot:
    text = await provider.metrics()
    writes = await apiserver_writes(kube)
    stats = await cloud.stats()
    pid = pid_of(provider)
    return Snapshot(at=time.monotonic(), provider_cpu=proc_usage(pid)[1],
                    provider_rss_mib=rss_mib(pid=pid), mock_cpu=proc_usage(pid_of(cloud))[1],
                    sweeps=parse_histogram(text=text, name=SWEEP_HISTOGRAM), writes=writes,
                    mock_stats=stats)


def check_alive(*, provider: ProviderProcess, cloud: MockCloudProcess) -> None:
    for process in (provider, cloud):
        if not process.alive():
            raise RuntimeError(f"{process.component.name} died:\n{process.component.tail()}")


async def wait_node(*, kube: KubeClient, node: str, provider: ProviderProcess,
                    cloud: MockCloudProcess) -> None:
    """Until the virtual node offers GPUs (the provider has read the cloud's capacity)."""
    while True:
        try:
            got = await kube.get(f"/api/v1/nodes/{node}")
            if got.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "0") != "0":
                return
        except Exception:
            pass
        check_alive(provider=provider, cloud=cloud)
        await asyncio.sleep(0.2)


def pod_body(*, node: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "annotations": {"vkprovider.io/gpu-type": "H100"}},
        "spec": {"nodeName": node, "tolerations": [TOLERATION],
                 "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


async def create_pods(*, kube: KubeClient, ns: str, node: str, n: int) -> None:
    sem = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(i: int) -> None:
        async with sem:
            await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_body(node=node, i=i))

    await asyncio.gather(*(create(i) for i in range(n)))


async def run_to_all_running(*, kube: KubeClient, ns: str, node: str, n: int,
                             check: Callable[[], None]) -> float:
    """Create the pods; seconds from the first create until the watch saw all of them Running."""
    running: set[str] = set()

    def on_pod(event: str, pod: dict[str, Any]) -> None:
        if event != "DELETED" and pod.get("status", {}).get("phase") == "Running":
            running.add(pod["metadata"]["uid"])

    informer = Informer(client=kube, path=f"/api/v1/namespaces/{ns}/pods", handler=on_pod,
                        name="bench")
    watch = asyncio.create_task(informer.run())
    try:
        await informer.synced.wait()
        t0 = time.monotonic()
        await create_pods(kube=kube, ns=ns, node=node, n=n)
        deadline = t0 + 120 + n * 0.5
        while len(running) < n:
            check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(running)} of {n} pods Running")
            await asyncio.sleep(0.1)
        return time.monotonic() - t0
    finally:
        watch.cancel()  # no watch of ours during the window


async def drain(*, kube: KubeClient, ns: str, n: int, check: Callable[[], None],
                live_instances: Callable[[], Awaitable[int]]) -> float:
    """Delete every pod of ``ns``; seconds until none is left and the cloud has no instance."""
    t0 = time.monotonic()
    await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods")  # deletecollection
    deadline = t0 + 120 + n * 0.5
    while True:
        live = await live_instances()
        pods = (await kube.get(f"/api/v1/namespaces/{ns}/pods", params={"limit": 1}))["items"]
        if live == 0 and not pods:
            break
        check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{live} instances still live, pods left: {bool(pods)}")
        await asyncio.sleep(0.5)
    await kube.delete(f"/api/v1/namespaces/{ns}")
    return time.monotonic() - t0


def window_row(*, n: int, start: Snapshot, end: Snapshot, peak_rss: float) -> dict[str, Any]:
    seconds = end.at - start.at
    sweeps = end.sweeps.minus(start.sweeps)
    count = round(sweeps.count)
    cpu = end.provider_cpu - start.provider_cpu
    mock_cpu = end.mock_cpu - start.mock_cpu
    writes = {k: v - start.writes.get(k, 0.0) for k, v in end.writes.items()}
    writes = {k: v for k, v in writes.items() if v > 0}
    total_writes = sum(writes.values())
    calls = {k: end.mock_stats[k] - start.mock_stats.get(k, 0)
             for k in ("list_calls", "metrics_calls")}

    def per_sweep_ms(value: float) -> float:
        return round(value / count * 1000, 2) if count else math.nan

    return {
        "pods": n, "window_seconds": round(seconds, 1), "sweeps": count,
        "provider_cpu_seconds": round(cpu, 2), "cpu_per_sweep_ms": per_sweep_ms(cpu),
        "cpu_per_pod_sweep_us": round(cpu / count / n * 1e6, 2) if count else math.nan,
        "sweep_mean_ms": round(sweeps.total / count * 1000, 1) if count else math.nan,
        "sweep_p50_ms": round(sweeps.quantile(0.5) * 1000, 1),
        "sweep_p99_ms": round(sweeps.quantile(0.99) * 1000, 1),
        "sweep_max_bucket_ms": round(sweeps.max_bound() * 1000, 1),
        "provider_rss_start_mib": round(start.provider_rss_mib, 1),
        "provider_rss_mib": round(end.provider_rss_mib, 1),
        "provider_peak_rss_mib": round(peak_rss, 1),
        "apiserver_writes": total_writes,
        "apiserver_writes_per_minute": round(total_writes / seconds * 60, 1),
        "apiserver_writes_by_kind": {f"{v} {r}{'/' + s if s else ''}": c
                                     for (v, r, s), c in sorted(writes.items())},
        "mock_cpu_seconds": round(mock_cpu, 2), "mock_cpu_per_sweep_ms": per_sweep_ms(mock_cpu),
        "mock_list_calls": calls["list_calls"], "mock_gpu_metrics_calls": calls["metrics_calls"],
    }


async def run_size(*, kube: KubeClient, node: str, provider: ProviderProcess,
                   cloud: MockCloudProcess, n: int, window: float) -> dict[str, Any]:
    ns = f"steady-{n}-{uuid.uuid4().hex[:4]}"
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns}})
    def check() -> None:
        check_alive(provider=provider, cloud=cloud)

    async def live_instances() -> int:
        return int((await cloud.stats())["live_instances"])

    to_running = await run_to_all_running(kube=kube, ns=ns, node=node, n=n, check=check)
    sys.stderr.write(f"  all {n} Running after {to_running:.1f} s; settling, then a "
                     f"{window:.0f} s window ...\n")
    await settle(kube=kube, n=n, check=check)
    start = await snapshot(kube=kube, cloud=cloud, provider=provider)
    await asyncio.sleep(window)
    end = await snapshot(kube=kube, cloud=cloud, provider=provider)
    check_alive(provider=provider, cloud=cloud)
    peak = proc_usage(pid_of(provider))[0]
    row = window_row(n=n, start=start, end=end, peak_rss=peak)
    row["system"] = "vkprovider"
    row["cpu_per_minute_s"] = round(row["provider_cpu_seconds"] / row["window_seconds"] * 60, 3)
    row["seconds_to_all_running"] = round(to_running, 1)
    drained = await drain(kube=kube, ns=ns, n=n, check=check, live_instances=live_instances)
    sys.stderr.write(f"  deleted, cloud drained in {drained:.1f} s\n")
    return row


async def settle(*, kube: KubeClient, n: int, check: Callable[[], None]) -> None:
    """SETTLE_SECONDS, then until no pod or event write came for 3 s (a backlog of events, as
    the Go virtual-kubelet with client QPS 5 has, must not land in the window)."""
    await asyncio.sleep(SETTLE_SECONDS)
    if not await wait_quiet(kube=kube, check=check, deadline=time.monotonic() + 120 + n * 0.5):
        raise RuntimeError("pod and event writes did not stop after all pods were Running")


# ---- the upstream Go virtual-kubelet beside it (--compare-go) --------------------------------


@dataclass(frozen=True, kw_only=True)
class GoSnapshot:
    at: float
    cpu: float
    rss_mib: float
    writes: Writes


async def go_snapshot(*, kube: KubeClient, system: GoVK) -> GoSnapshot:
    writes = await apiserver_writes(kube)
    pid = system.pid()
    return GoSnapshot(at=time.monotonic(), cpu=proc_usage(pid)[1], rss_mib=rss_mib(pid=pid),
                      writes=writes)


def go_window_row(*, system: GoVK, n: int, start: GoSnapshot, end: GoSnapshot,
                  peak_rss: float) -> dict[str, Any]:
    seconds = end.at - start.at
    cpu = end.cpu - start.cpu
    writes = {k: v - start.writes.get(k, 0.0) for k, v in end.writes.items()}
    writes = {k: v for k, v in writes.items() if v > 0}
    total_writes = sum(writes.values())
    return {
        "system": system.label, "pods": n, "window_seconds": round(seconds, 1),
        "provider_cpu_seconds": round(cpu, 2), "cpu_per_minute_s": round(cpu / seconds * 60, 3),
        "provider_rss_start_mib": round(start.rss_mib, 1),
        "provider_rss_mib": round(end.rss_mib, 1), "provider_peak_rss_mib": round(peak_rss, 1),
        "apiserver_writes": total_writes,
        "apiserver_writes_per_minute": round(total_writes / seconds * 60, 1),
        "apiserver_writes_by_kind": {f"{v} {r}{'/' + s if s else ''}": c
                                     for (v, r, s), c in sorted(writes.items())},
    }


async def go_size(*, kube: KubeClient, system: GoVK, n: int, window: float) -> dict[str, Any]:
    ns = f"steady-go-{n}-{uuid.uuid4().hex[:4]}"
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns}})
    to_running = await run_to_all_running(kube=kube, ns=ns, node=system.node, n=n,
                                          check=system.check_alive)
    sys.stderr.write(f"  all {n} Running after {to_running:.1f} s; settling, then a "
                     f"{window:.0f} s window ...\n")
    await settle(kube=kube, n=n, check=system.check_alive)
    start = await go_snapshot(kube=kube, system=system)
    await asyncio.sleep(window)
    end = await go_snapshot(kube=kube, system=system)
    system.check_alive()
    row = go_window_row(system=system, n=n, start=start, end=end,
                        peak_rss=proc_usage(system.pid())[0])
    row["seconds_to_all_running"] = round(to_running, 1)

    async def no_instances() -> int:
        return 0

    drained = await drain(kube=kube, ns=ns, n=n, check=system.check_alive,
                          live_instances=no_instances)
    sys.stderr.write(f"  deleted in {drained:.1f} s\n")
    return row


async def run_go(*, kube: KubeClient, system: GoVK, sizes: list[int],
                 window: float) -> list[dict[str, Any]]:
    """One Go virtual node for every size, like the provider's; stopped and removed after."""
    rows: list[dict[str, Any]] = []
    await system.start()
    try:
        await wait_go_node(kube=kube, system=system)
        for n in sizes:
            sys.stderr.write(f"steady state with {n} pods on {system.label} ...\n")
            rows.append(await go_size(kube=kube, system=system, n=n, window=window))
    finally:
        system.stop()
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/nodes/{system.node}")
    return rows


def render_side_by_side(results: list[dict[str, Any]]) -> str:
    header = ["system", "pods", "to all Running (s)", "window (s)", "CPU in window (s)",
              "CPU per minute (s)", "RSS now/peak (MiB)", "API writes/min"]
    rows = [[r["system"], str(r["pods"]), str(r["seconds_to_all_running"]),
             str(r["window_seconds"]), str(r["provider_cpu_seconds"]), str(r["cpu_per_minute_s"]),
             f"{r['provider_rss_mib']} / {r['provider_peak_rss_mib']}",
             str(r["apiserver_writes_per_minute"])] for r in results]
    return table(header, rows)


def render(*, info: dict[str, Any], results: list[dict[str, Any]], window: float,
           gpu_interval: float) -> str:
    header = ["pods", "to all Running (s)", "sweeps", "CPU/sweep (ms)", "CPU per pod-sweep (µs)",
              "sweep mean (ms)", "sweep p50/p99 (ms)", "sweep max ≤ (ms)", "RSS now/peak (MiB)",
              "API writes/min", "mock CPU/sweep (ms)"]
    rows = [[str(r["pods"]), str(r["seconds_to_all_running"]), str(r["sweeps"]),
             str(r["cpu_per_sweep_ms"]), str(r["cpu_per_pod_sweep_us"]), str(r["sweep_mean_ms"]),
             f"{r['sweep_p50_ms']} / {r['sweep_p99_ms']}", str(r["sweep_max_bucket_ms"]),
             f"{r['provider_rss_mib']} / {r['provider_peak_rss_mib']}",
             str(r["apiserver_writes_per_minute"]), str(r["mock_cpu_per_sweep_ms"])]
            for r in results]
    lines = [f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
             f"Python {info['python']}",
             f"settings: mock cloud boot delay 0, 64 workers, status sweep 5 s, GPU figures every "
             f"{gpu_interval:g} s, capacity refresh 30 s; settle {SETTLE_SECONDS:g} s, window "
             f"{window:g} s; sweep p50/p99 interpolated within histogram buckets",
             table(header, rows)]
    for r in results:
        lines.append(f"{r['pods']} pods: RSS {r['provider_rss_start_mib']} -> "
                     f"{r['provider_rss_mib']} MiB over the window; cloud calls: "
                     f"{r['mock_list_calls']} list, {r['mock_gpu_metrics_calls']} GPU metrics; "
                     f"writes by kind: {r['apiserver_writes_by_kind']}")
    return "\n".join(lines) + "\n"


async def run_ours(*, kube: KubeClient, kubeconfig: Path, work: Path, sizes: list[int],
                   window: float, gpu_interval: float, inventory: str,
                   python: Path | None) -> list[dict[str, Any]]:
    node = f"vk-steady-{uuid.uuid4().hex[:6]}"
    results: list[dict[str, Any]] = []
    cloud = MockCloudProcess(work_dir=work, name="steady", boot_delay=0.0, inventory=inventory)
    await cloud.start()
    await grant_provider_node(kube=kube, node=node)  # its Node and Leases (RBAC resourceNames)
    provider = ProviderProcess(
        work_dir=work, kubeconfig=kubeconfig, node_name=node, clouds=[cloud],
        pods=SETTINGS["pods"], node=SETTINGS["node"],
        kubelet_api={"gpu_metrics_interval_seconds": gpu_interval},
        python=python, env=runtime_env() if python is not None else None)
    provider.start()
    try:
        await wait_node(kube=kube, node=node, provider=provider, cloud=cloud)
        for n in sizes:
            sys.stderr.write(f"steady state with {n} pods ...\n")
            results.append(await run_size(kube=kube, node=node, provider=provider,
                                          cloud=cloud, n=n, window=window))
    finally:
        provider.stop()
        cloud.stop()
    return results


async def main(*, sizes: list[int], window: float, gpu_interval: float,
               compare_go: bool, dev_venv: bool = False) -> int:
    work = Path(tempfile.mkdtemp(prefix="vkp-bench-"))
    binary = govk_binary() if compare_go else None
    python = None if dev_venv else runtime_python()
    load = os.getloadavg()
    cluster = LocalCluster(log_dir=work / "logs")
    inventory = f"H100:us-east:{max(sizes) + 1000}:2.49"
    go_results: list[dict[str, Any]] = []
    try:
        await cluster.start()
        async with cluster.client() as kube:
            kubeconfig = await install_provider_rbac(kube=kube, cluster=cluster,
                                                     path=work / "provider.kubeconfig")
            results = await run_ours(kube=kube, kubeconfig=kubeconfig, work=work, sizes=sizes,
                                     window=window, gpu_interval=gpu_interval,
                                     inventory=inventory, python=python)
            if binary is not None:
                for lift in (False, True):
                    system = GoVK(binary=binary, work=work, kubeconfig=cluster.kubeconfig,
                                  lift_limits=lift)
                    go_results += await run_go(kube=kube, system=system, sizes=sizes,
                                               window=window)
    finally:
        cluster.stop()
    info = machine()
    text = render(info=info, results=results, window=window, gpu_interval=gpu_interval)
    if go_results:
        text += go_note(load) + render_side_by_side(results + go_results) + "\n"
    sys.stdout.write(text)
    settings = {**SETTINGS, "kubelet_api": {"gpu_metrics_interval_seconds": gpu_interval},
                "mock_cloud": {"boot_delay": 0.0, "inventory": inventory},
                "settle_seconds": SETTLE_SECONDS, "window_seconds": window,
                "create_concurrency": CREATE_CONCURRENCY, "compare_go": compare_go,
                "load_average_at_start": list(load),
                "provider_python": "dev venv" if dev_venv else "runtime-only venv"}
    path = write("steady", {"machine": info, "settings": settings, "results": results,
                            "go_results": go_results})
    (RESULTS / "steady.txt").write_text(text)
    sys.stdout.write(f"wrote {path} and {RESULTS / 'steady.txt'}\n")
    return 0


def go_note(load: tuple[float, ...]) -> str:
    return ("side by side with the upstream Go virtual-kubelet (v1.14.1 nodeutil, in-memory "
            "provider, 10 workers, admin kubeconfig; default = library defaults, lifted = "
            "unlimited work-queue rate limiters and client QPS/burst 1e6), each on its own node "
            "with the same pods and window, run once (noisy: the machine is shared; load "
            f"average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}):\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="steady-state benchmark")
    parser.add_argument("--pods", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured per size")
    parser.add_argument("--gpu-metrics-interval", type=float, default=15.0,
                        help="kubelet_api.gpu_metrics_interval_seconds (production: 15)")
    parser.add_argument("--compare-go", action="store_true",
                        help="also run the upstream Go virtual-kubelet (tools/govk), default and "
                             "with its limits lifted, on the same sizes and window")
    parser.add_argument("--dev-venv", action="store_true",
                        help="run the provider from the dev venv instead of a runtime-only one "
                             "(bench.common.runtime_python); dev tools add ~4 MiB of RSS")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(sizes=args.pods, window=args.window,
                              gpu_interval=args.gpu_metrics_interval,
                              compare_go=args.compare_go, dev_venv=args.dev_venv)))

"""Probe cost benchmark (issue 13): N Ready cloud pods probed by the provider, against none probed.

Cloud pods are Ready by their readiness probes, which the provider runs itself: one shared
``vkprovider.probing.Prober`` per process, one probe per pod and ``periodSeconds``, over the
network to the address the cloud publishes. This bench measures what that costs the provider.

One control plane. For each of two runs, a fresh mock cloud (no boot delay, real HTTP listeners
on loopback for each instance's declared port, routes published in an address map of its own)
and a fresh provider with production settings (status sweep every 5 s, 20 workers, GPU figures
every 15 s, capacity refresh 30 s; ``pods.probe_address_map`` so its probes dial through the
map; ``pods.probe_concurrency`` left at its default):

* **probes**: N pods each declaring port 8000 ("http") with a ``readinessProbe`` ``httpGet
  /ready`` on it every ``--period`` seconds (timeout 1 s, thresholds 1/3: the defaults);
* **baseline**: the same N pods without the probe (Ready as soon as their instance runs).

Each run binds the N pods to its virtual node (32 concurrent creates), waits until all are Ready
(the time is reported), lets it settle 10 s and until no pod or event write has come for 3 s,
then watches a window of ``--window`` seconds in which nothing changes. Over the window:

* the provider's CPU seconds (whole process, from /proc), per minute, and in the probe run per
  probe and per probe round (N probes); the difference to the baseline is the probes' cost;
* probes served in the window, from the mock cloud's ``GET /admin/traffic`` (probe counts summed
  over instances, before and after the window): about N x window / period;
* event-loop lag from the provider's ``vkprovider_event_loop_lag_seconds`` histogram (a 0.25 s
  sleep, how late it woke), its window delta: p50 and p99 interpolated within the buckets (1, 2.5,
  5, 10, 25, 50, 100, 250 ms, ...), and the bound of the highest bucket hit;
* RSS at the end of the window (VmRSS) and the peak (VmHWM);
* API server writes per minute (``apiserver_request_total``): probes whose result does not change
  must not write, so both runs should show the same (lease, node status, spend record);
* Ready pods at the end of the window (a starved loop would time probes out and pull pods out of
  Ready), and the mock cloud's CPU (it serves the probes on the same machine).

Then the pods are deleted and the cloud drained, and the next run starts from scratch. Prints the
table and the difference, writes ``probes.json`` and ``probes.txt`` to ``--out`` (default
``bench/results``).

    .venv/bin/python -m bench.probes --pods 1000 --window 60 --period 10
    .venv/bin/python -m bench.probes --pods 100 --window 20 --out /tmp/probes-trial
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.burst import TOLERATION, Writes, apiserver_writes
from bench.common import RESULTS, machine, proc_usage, table
from bench.steady import (
    CREATE_CONCURRENCY,
    SETTLE_SECONDS,
    Histogram,
    check_alive,
    drain,
    parse_histogram,
    pid_of,
    rss_mib,
    settle,
    wait_node,
)
from vkprovider.kube import KubeClient
from vkprovider.kube.watching import Informer
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import (
    MockCloudProcess,
    ProviderProcess,
    grant_provider_node,
    install_provider_rbac,
)

LAG_HISTOGRAM = "vkprovider_event_loop_lag_seconds"
MODES = ("baseline", "probes")
PORT = 8000
PROBE_PATH = "/ready"
SETTINGS: dict[str, Any] = {
    "pods": {"status_interval_seconds": 5, "workers": 20, "orphan_grace_seconds": 30},
    "node": {"capacity_refresh_seconds": 30, "pods": 20000},  # thousands on one node
    "kubelet_api": {"gpu_metrics_interval_seconds": 15},
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="probe cost benchmark (issue 13)")
    parser.add_argument("--pods", type=int, default=1000, help="Ready cloud pods (default 1000)")
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds measured in each run (default 60)")
    parser.add_argument("--period", type=int, default=10,
                        help="the readiness probe's periodSeconds (default 10)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="directory for probes.json and probes.txt (default bench/results)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="only the run with probes (no difference is reported)")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.window <= 0 or args.period < 1:
        parser.error("--pods and --period must be >= 1, --window > 0")
    return args


def pod_body(*, node: str, i: int, period: int | None) -> dict[str, Any]:
    """A model server on the cloud: port 8000 declared; a readiness probe on it unless
    ``period`` is None (the baseline)."""
    container: dict[str, Any] = {
        "name": "main", "image": "vllm/vllm-openai:v0.6",
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    if period is not None:
        container["readinessProbe"] = {"httpGet": {"path": PROBE_PATH, "port": "http"},
                                       "periodSeconds": period}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "annotations": {"vkprovider.io/gpu-type": "H100"}},
        "spec": {"nodeName": node, "tolerations": [TOLERATION],
                 "terminationGracePeriodSeconds": 5, "containers": [container]},
    }


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def probe_counts(traffic: dict[str, Any]) -> tuple[int, int]:
    """(probes, other requests) the mock's listeners served, summed over instances, from
    ``GET /admin/traffic``."""
    probes = sum(int(v.get("probes", 0)) for v in traffic.values())
    served = sum(int(v.get("traffic", 0)) for v in traffic.values())
    return probes, served


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    at: float
    provider_cpu: float
    provider_rss_mib: float
    mock_cpu: float
    lag: Histogram
    writes: Writes
    probes: int
    traffic: int


async def snapshot(*, kube: KubeClient, cloud: MockCloudProcess,
                   provider: ProviderProcess) -> Snapshot:
    text = await provider.metrics()
    writes = await apiserver_writes(kube)
    probes, traffic = probe_counts(await cloud.admin("GET", "/admin/traffic"))
    pid = pid_of(provider)
    return Snapshot(at=time.monotonic(), provider_cpu=proc_usage(pid)[1],
                    provider_rss_mib=rss_mib(pid=pid), mock_cpu=proc_usage(pid_of(cloud))[1],
                    lag=parse_histogram(text=text, name=LAG_HISTOGRAM), writes=writes,
                    probes=probes, traffic=traffic)


def ms(seconds: float) -> float | None:
    """Milliseconds, rounded; None for "no value" (nan) or "beyond the last bucket" (inf)."""
    return None if math.isnan(seconds) or math.isinf(seconds) else round(seconds * 1000, 2)


def window_row(*, mode: str, n: int, period: int | None, start: Snapshot, end: Snapshot,
               peak_rss: float) -> dict[str, Any]:
    seconds = end.at - start.at
    cpu = end.provider_cpu - start.provider_cpu
    probes = end.probes - start.probes
    rounds = probes / n
    lag = end.lag.minus(start.lag)
    writes = {k: v - start.writes.get(k, 0.0) for k, v in end.writes.items()}
    writes = {k: v for k, v in writes.items() if v > 0}
    total_writes = sum(writes.values())
    return {
        "mode": mode, "pods": n, "period_seconds": period, "window_seconds": round(seconds, 1),
        "probes": probes, "probe_rounds": round(rounds, 2),
        "probes_per_second": round(probes / seconds, 1),
        "traffic_requests": end.traffic - start.traffic,
        "provider_cpu_seconds": round(cpu, 2),
        "cpu_per_minute_s": round(cpu / seconds * 60, 3),
        "cpu_per_probe_us": round(cpu / probes * 1e6, 1) if probes else None,
        "cpu_per_round_ms": round(cpu / rounds * 1000, 1) if probes else None,
        "lag_samples": round(lag.count),
        "lag_mean_ms": ms(lag.total / lag.count) if lag.count else None,
        "lag_p50_ms": ms(lag.quantile(0.5)), "lag_p99_ms": ms(lag.quantile(0.99)),
        "lag_max_bucket_ms": ms(lag.max_bound()),
        "lag_beyond_last_bucket": bool(lag.count and math.isinf(lag.max_bound())),
        "provider_rss_start_mib": round(start.provider_rss_mib, 1),
        "provider_rss_mib": round(end.provider_rss_mib, 1),
        "provider_peak_rss_mib": round(peak_rss, 1),
        "apiserver_writes": total_writes,
        "apiserver_writes_per_minute": round(total_writes / seconds * 60, 1),
        "apiserver_writes_by_kind": {f"{v} {r}{'/' + s if s else ''}": c
                                     for (v, r, s), c in sorted(writes.items())},
        "mock_cpu_seconds": round(end.mock_cpu - start.mock_cpu, 2),
    }


def compare(*, baseline: dict[str, Any], probed: dict[str, Any]) -> dict[str, Any]:
    """What the probes add: CPU per minute, net CPU per probe and per round, lag, RSS, writes."""
    extra_cpu_min = probed["cpu_per_minute_s"] - baseline["cpu_per_minute_s"]
    # the probe run's extra CPU in its own window, spread over its probes
    extra_cpu = extra_cpu_min * probed["window_seconds"] / 60
    probes = probed["probes"]
    return {
        "extra_cpu_per_minute_s": round(extra_cpu_min, 3),
        "extra_core_percent": round(extra_cpu_min / 60 * 100, 2),
        "net_cpu_per_probe_us": round(extra_cpu / probes * 1e6, 1) if probes else None,
        "net_cpu_per_round_ms": (round(extra_cpu / probes * probed["pods"] * 1000, 1)
                                 if probes else None),
        "lag_p99_ms": [baseline["lag_p99_ms"], probed["lag_p99_ms"]],
        "extra_rss_mib": round(probed["provider_rss_mib"] - baseline["provider_rss_mib"], 1),
        "apiserver_writes_per_minute": [baseline["apiserver_writes_per_minute"],
                                        probed["apiserver_writes_per_minute"]],
        "extra_mock_cpu_seconds": round(probed["mock_cpu_seconds"] - baseline["mock_cpu_seconds"],
                                        2),
    }


def cell(value: Any) -> str:
    return "-" if value is None else str(value)


def lag_max_cell(row: dict[str, Any]) -> str:
    return "> 5000" if row["lag_beyond_last_bucket"] else cell(row["lag_max_bucket_ms"])


def render(*, info: dict[str, Any], results: list[dict[str, Any]],
           comparison: dict[str, Any] | None, load: Sequence[float]) -> str:
    header = ["run", "pods", "period (s)", "to all Ready (s)", "window (s)", "probes",
              "probe rounds", "CPU (s)", "CPU/min (s)", "CPU/probe (µs)", "CPU/round (ms)",
              "lag p50/p99 (ms)", "lag max ≤ (ms)", "RSS now/peak (MiB)", "API writes/min",
              "Ready at end", "mock CPU (s)"]
    rows = [[r["mode"], str(r["pods"]), cell(r["period_seconds"]),
             str(r["seconds_to_all_ready"]), str(r["window_seconds"]), str(r["probes"]),
             str(r["probe_rounds"]), str(r["provider_cpu_seconds"]), str(r["cpu_per_minute_s"]),
             cell(r["cpu_per_probe_us"]), cell(r["cpu_per_round_ms"]),
             f"{cell(r['lag_p50_ms'])} / {cell(r['lag_p99_ms'])}", lag_max_cell(r),
             f"{r['provider_rss_mib']} / {r['provider_peak_rss_mib']}",
             str(r["apiserver_writes_per_minute"]), f"{r['ready_at_end']}/{r['pods']}",
             str(r["mock_cpu_seconds"])] for r in results]
    lines = [f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
             f"Python {info['python']}; load average at start "
             + " ".join(f"{x:.2f}" for x in load),
             "settings: mock cloud boot delay 0, listeners on loopback behind an address map; "
             "provider: 20 workers, status sweep 5 s, GPU figures every 15 s, capacity refresh "
             f"30 s, probe concurrency 64 (default); readinessProbe httpGet {PROBE_PATH} on port "
             f"{PORT}, timeout 1 s; settle {SETTLE_SECONDS:g} s; CPU is the whole provider "
             "process; lag p50/p99 interpolated within the histogram's buckets",
             table(header, rows)]
    if comparison is not None:
        c = comparison
        lines.append(
            f"probe cost (probes - baseline): +{c['extra_cpu_per_minute_s']} CPU s/min "
            f"({c['extra_core_percent']}% of a core), net {cell(c['net_cpu_per_probe_us'])} µs "
            f"per probe, {cell(c['net_cpu_per_round_ms'])} ms per round of "
            f"{results[-1]['pods']} probes; lag p99 {cell(c['lag_p99_ms'][0])} -> "
            f"{cell(c['lag_p99_ms'][1])} ms; RSS {c['extra_rss_mib']:+} MiB; API writes/min "
            f"{c['apiserver_writes_per_minute'][0]} -> {c['apiserver_writes_per_minute'][1]}; "
            f"mock CPU {c['extra_mock_cpu_seconds']:+} s")
    for r in results:
        lines.append(f"{r['mode']}: writes by kind {r['apiserver_writes_by_kind']}; other "
                     f"requests to the listeners {r['traffic_requests']}; lag samples "
                     f"{r['lag_samples']}, mean {cell(r['lag_mean_ms'])} ms")
    return "\n".join(lines) + "\n"


def payload(*, info: dict[str, Any], args: argparse.Namespace, results: list[dict[str, Any]],
            comparison: dict[str, Any] | None, load: Sequence[float]) -> dict[str, Any]:
    settings = {**SETTINGS, "period_seconds": args.period, "window_seconds": args.window,
                "settle_seconds": SETTLE_SECONDS, "create_concurrency": CREATE_CONCURRENCY,
                "probe": {"httpGet": {"path": PROBE_PATH, "port": PORT}, "timeoutSeconds": 1},
                "mock_cloud": {"boot_delay": 0.0, "listeners": True},
                "load_average_at_start": list(load)}
    return {"machine": info, "settings": settings, "results": results, "comparison": comparison}


# ---- running it --------------------------------------------------------------------------------


async def run_to_all_ready(*, kube: KubeClient, ns: str, node: str, n: int, period: int | None,
                           check: Callable[[], None]) -> float:
    """Create the pods; seconds from the first create until the watch saw all of them Ready."""
    ready: set[str] = set()

    def on_pod(event: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if event != "DELETED" and is_ready(pod):
            ready.add(uid)
        else:
            ready.discard(uid)

    informer = Informer(client=kube, path=f"/api/v1/namespaces/{ns}/pods", handler=on_pod,
                        name="bench")
    watch = asyncio.create_task(informer.run())
    sem = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(i: int) -> None:
        async with sem:
            await kube.create(f"/api/v1/namespaces/{ns}/pods",
                              pod_body(node=node, i=i, period=period))

    try:
        await informer.synced.wait()
        t0 = time.monotonic()
        await asyncio.gather(*(create(i) for i in range(n)))
        deadline = t0 + 120 + n * 0.5 + (period or 0)
        while len(ready) < n:
            check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(ready)} of {n} pods Ready")
            await asyncio.sleep(0.1)
        return time.monotonic() - t0
    finally:
        watch.cancel()  # no watch of ours during the window


async def ready_count(*, kube: KubeClient, ns: str) -> int:
    pods = (await kube.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
    return sum(1 for p in pods if is_ready(p))


async def run_mode(*, kube: KubeClient, kubeconfig: Path, work: Path, mode: str, n: int,
                   window: float, period: int) -> dict[str, Any]:
    node = f"vk-probes-{mode}-{uuid.uuid4().hex[:6]}"
    probe_period = period if mode == "probes" else None
    network = work / f"addressmap-{mode}"  # one map per run: no stale routes of the last run
    cloud = MockCloudProcess(work_dir=work, name=mode, boot_delay=0.0,
                             inventory=f"H100:us-east:{n + 1000}:2.49", address_map_dir=network)
    await cloud.start()
    await grant_provider_node(kube=kube, node=node)  # its Node and Leases (RBAC resourceNames)
    provider = ProviderProcess(
        work_dir=work, kubeconfig=kubeconfig, node_name=node, clouds=[cloud],
        pods={**SETTINGS["pods"], "probe_address_map": str(network)}, node=SETTINGS["node"],
        kubelet_api=SETTINGS["kubelet_api"])
    provider.start()

    def check() -> None:
        check_alive(provider=provider, cloud=cloud)

    async def live_instances() -> int:
        return int((await cloud.stats())["live_instances"])

    try:
        await wait_node(kube=kube, node=node, provider=provider, cloud=cloud)
        ns = f"probes-{mode}-{uuid.uuid4().hex[:4]}"
        await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}})
        sys.stderr.write(f"{mode}: {n} pods ...\n")
        to_ready = await run_to_all_ready(kube=kube, ns=ns, node=node, n=n,
                                          period=probe_period, check=check)
        sys.stderr.write(f"  all {n} Ready after {to_ready:.1f} s; settling, then a "
                         f"{window:.0f} s window ...\n")
        await settle(kube=kube, n=n, check=check)
        start = await snapshot(kube=kube, cloud=cloud, provider=provider)
        await asyncio.sleep(window)
        end = await snapshot(kube=kube, cloud=cloud, provider=provider)
        check()
        row = window_row(mode=mode, n=n, period=probe_period, start=start, end=end,
                         peak_rss=proc_usage(pid_of(provider))[0])
        row["seconds_to_all_ready"] = round(to_ready, 1)
        row["ready_at_end"] = await ready_count(kube=kube, ns=ns)
        drained = await drain(kube=kube, ns=ns, n=n, check=check, live_instances=live_instances)
        sys.stderr.write(f"  deleted, cloud drained in {drained:.1f} s\n")
        return row
    finally:
        provider.stop()
        cloud.stop()


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="vkp-bench-probes-"))
    load = os.getloadavg()
    cluster = LocalCluster(log_dir=work / "logs")
    modes = ["probes"] if args.no_baseline else list(MODES)
    results: list[dict[str, Any]] = []
    try:
        await cluster.start()
        async with cluster.client() as kube:
            kubeconfig = await install_provider_rbac(kube=kube, cluster=cluster,
                                                     path=work / "provider.kubeconfig")
            for mode in modes:
                results.append(await run_mode(kube=kube, kubeconfig=kubeconfig, work=work,
                                              mode=mode, n=args.pods, window=args.window,
                                              period=args.period))
    finally:
        cluster.stop()
    by_mode = {r["mode"]: r for r in results}
    comparison = (compare(baseline=by_mode["baseline"], probed=by_mode["probes"])
                  if "baseline" in by_mode else None)
    info = machine()
    text = render(info=info, results=results, comparison=comparison, load=load)
    sys.stdout.write(text)
    body = payload(info=info, args=args, results=results, comparison=comparison, load=load)
    written = save(out=args.out, body=body, text=text)
    sys.stdout.write(f"wrote {' and '.join(str(p) for p in written)}\n")
    return 0


def save(*, out: Path, body: dict[str, Any], text: str) -> list[Path]:
    """``probes.json`` and ``probes.txt`` in ``out`` (bench/results unless --out says else)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "probes.json", out / "probes.txt"]
    paths[0].write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    paths[1].write_text(text)
    return paths


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))

"""Relist benchmark: how long the event loop stalls while an informer takes in thousands of pods.

A provider relists its pods when it starts, when it takes over leadership and when its watch
falls too far behind (410 Gone). Everything it does runs on one event loop, so a relist that
holds the loop for long delays probes, Lease renewals and the kubelet API. This bench creates
N pods (bound to a node no kubelet serves, with a Running status of the size a cloud pod carries,
so they stay put) on a LocalCluster, then, in this process, lists them with the provider's
Informer (``vkprovider.kube.watching``, the same client and page size) while a sampler wakes every
millisecond and records how late it woke. The handler is trivial: this measures the client, the
JSON decoding and the store replace, not the provider's reaction to the events.

Prints a table per run, writes ``bench/results/relist.json`` and ``relist.txt``.

    .venv/bin/python -m bench.relist --pods 5000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, machine, pct, populate, proc_usage, table, write
from vkprovider.kube import KubeClient
from vkprovider.kube.gcpause import tune
from vkprovider.kube.watching import PAGE, Informer
from vkprovider.testing.cluster import LocalCluster

NODE = "relist-nowhere"
NS = "relist"
CONCURRENCY = 32
TICK = 0.001


def pod_body(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i}", "labels": {"app": "relist"},
                         "annotations": {"vkprovider.io/provider": "cloud-a",
                                         "vkprovider.io/instance-id": f"mi-{i:08x}",
                                         "vkprovider.io/gpu-type": "H100"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                     "ports": [{"containerPort": 8000}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def running_status(i: int) -> dict[str, Any]:
    at = "2026-12-03T16:00:00Z"
    return {"status": {
        "phase": "Running", "hostIP": f"198.18.{i // 250}.{i % 250}", "startTime": at,
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": at}
                       for t in ("PodReadyToStartContainers", "Initialized", "Ready",
                                 "ContainersReady", "PodScheduled")],
        "containerStatuses": [{"name": "main", "ready": True, "started": True,
                               "restartCount": 0, "image": "vllm/vllm-openai:v0.6",
                               "imageID": "", "containerID": f"vkprovider://mi-{i:08x}",
                               "state": {"running": {"startedAt": at}}}]}}


async def populate_running(kube: KubeClient, n: int) -> None:
    """N pods in :data:`NS`, each given its Running status as soon as it is created."""
    async def running(i: int) -> None:
        await kube.patch(f"/api/v1/namespaces/{NS}/pods/p{i}/status", running_status(i),
                         patch_type="strategic", want_body=False)

    await populate(kube, namespace=NS, n=n, body=pod_body, concurrency=CONCURRENCY,
                   then=running)


async def sample(lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + TICK
        await asyncio.sleep(TICK)
        lags.append(max(0.0, loop.time() - due))


async def one_relist(kube: KubeClient, n: int) -> dict[str, Any]:
    seen = 0

    def on_pod(event: str, pod: dict[str, Any]) -> None:
        nonlocal seen
        seen += 1

    informer = Informer(client=kube, path=f"/api/v1/namespaces/{NS}/pods", handler=on_pod,
                        name="relist")
    lags: list[float] = []
    pauses: list[float] = []  # full (generation 2) collections of the cyclic GC, seconds
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(on_gc)
    sampler = asyncio.create_task(sample(lags))
    cpu0 = proc_usage(os.getpid())[1]
    t0 = time.monotonic()
    task = asyncio.create_task(informer.run())
    await informer.synced.wait()
    took = time.monotonic() - t0
    cpu = proc_usage(os.getpid())[1] - cpu0
    task.cancel()
    sampler.cancel()
    gc.callbacks.remove(on_gc)
    if len(informer.store) != n or seen < n:
        raise RuntimeError(f"relist saw {len(informer.store)} pods, expected {n}")
    ms = [x * 1000 for x in lags]
    return {"pods": n, "relist_seconds": round(took, 3), "cpu_seconds": round(cpu, 3),
            "lag_samples": len(ms), "lag_p50_ms": round(pct(ms, 50), 2),
            "lag_p99_ms": round(pct(ms, 99), 2), "lag_max_ms": round(max(ms), 2),
            "full_gc_count": len(pauses),
            "full_gc_max_ms": round(max(pauses) * 1000, 1) if pauses else 0.0}


async def main(*, n: int, runs: int) -> int:
    tune()  # as `vkprovider run` does at start
    work = Path(tempfile.mkdtemp(prefix="vkp-relist-"))
    cluster = LocalCluster(log_dir=work / "logs")
    rows: list[dict[str, Any]] = []
    try:
        await cluster.start()
        async with cluster.client() as kube:
            sys.stderr.write(f"creating {n} pods ...\n")
            await populate_running(kube, n)
            for i in range(runs):
                sys.stderr.write(f"relist {i + 1} of {runs} ...\n")
                rows.append(await one_relist(kube, n))
    finally:
        cluster.stop()
    info = machine()
    header = ["pods", "relist (s)", "CPU (s)", "loop lag p50 (ms)", "loop lag p99 (ms)",
              "loop lag max (ms)", "samples", "full GCs (longest ms)"]
    text = (f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
            f"Python {info['python']}\n"
            f"settings: {n} Running pods in one namespace on a LocalCluster; the provider's "
            f"Informer (pages of {PAGE}) in this process with a trivial handler, the GC tuned "
            f"as `vkprovider run` tunes it (vkprovider/kube/gcpause.py); a sampler wakes "
            f"every {TICK * 1000:g} ms and records how late; one row per relist\n"
            + table(header, [[str(r["pods"]), str(r["relist_seconds"]), str(r["cpu_seconds"]),
                              str(r["lag_p50_ms"]), str(r["lag_p99_ms"]), str(r["lag_max_ms"]),
                              str(r["lag_samples"]),
                              f"{r['full_gc_count']} ({r['full_gc_max_ms']})"]
                             for r in rows]) + "\n")
    sys.stdout.write(text)
    path = write("relist", {"machine": info, "settings": {"pods": n, "tick_seconds": TICK},
                            "results": rows})
    (RESULTS / "relist.txt").write_text(text)
    sys.stdout.write(f"wrote {path} and {RESULTS / 'relist.txt'}\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="relist benchmark")
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(n=args.pods, runs=args.runs)))

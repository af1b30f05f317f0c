"""Burst benchmark: N pods bound to the virtual node at once, mock cloud with no boot delay.

Measures wall time until every pod is Running, p50/p99 of bind -> cloud create call and of
cloud running -> pod Running (bench's own watch timestamps against the mock cloud's ledger, same
machine clock), API server writes per pod (``apiserver_request_total`` before and after), and the
provider's peak RSS and CPU seconds. Prints a table, writes ``bench/results/burst.json``.

    .venv/bin/python -m bench.burst --pods 100 1000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import machine, pct, proc_usage, table, write
from vkprovider.kube import KubeClient
from vkprovider.kube.watching import Informer
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess, install_provider_rbac

TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vkprovider",
              "effect": "NoSchedule"}
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY"}


async def apiserver_writes(kube: KubeClient) -> dict[tuple[str, str, str], float]:
    text = (await kube.request("GET", "/metrics"))["text"]
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            verb = sample.labels.get("verb", "")
            if verb not in WRITE_VERBS:
                continue
            key = (verb, sample.labels.get("resource", ""), sample.labels.get("subresource", ""))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


async def run_one(*, cluster: LocalCluster, kube: KubeClient, kubeconfig: Path, work: Path,
                  n: int) -> dict[str, Any]:
    node = f"vk-bench-{uuid.uuid4().hex[:6]}"
    ns = f"burst-{n}-{uuid.uuid4().hex[:4]}"
    cloud = MockCloudProcess(work_dir=work, name=f"bench{n}", boot_delay=0.0,
                             inventory=f"H100:us-east:{n * 2}:2.49")
    await cloud.start()
    provider = ProviderProcess(work_dir=work, kubeconfig=kubeconfig, node_name=node,
                               clouds=[cloud], pods={"status_interval_seconds": 5,
                                                     "orphan_grace_seconds": 30})
    provider.start()
    try:
        while True:
            try:
                got = await kube.get(f"/api/v1/nodes/{node}")
                if got.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "0") != "0":
                    break
            except Exception:
                pass
            await asyncio.sleep(0.2)
        await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}})
        bound: dict[str, float] = {}
        running: dict[str, float] = {}

        def on_pod(event: str, pod: dict[str, Any]) -> None:
            uid = pod["metadata"]["uid"]
            now = time.time()
            if pod["spec"].get("nodeName"):
                bound.setdefault(uid, now)
            if pod.get("status", {}).get("phase") == "Running":
                running.setdefault(uid, now)

        informer = Informer(client=kube, path=f"/api/v1/namespaces/{ns}/pods", handler=on_pod,
                            name="bench")
        watch = asyncio.create_task(informer.run())
        await informer.synced.wait()
        before = await apiserver_writes(kube)
        sem = asyncio.Semaphore(32)

        async def create(i: int) -> None:
            async with sem:
                await kube.create(f"/api/v1/namespaces/{ns}/pods", {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"p{i}",
                                 "annotations": {"vkprovider.io/gpu-type": "H100"}},
                    "spec": {"nodeName": node, "tolerations": [TOLERATION],
                             "terminationGracePeriodSeconds": 5,
                             "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                })

        t0 = time.time()
        await asyncio.gather(*(create(i) for i in range(n)))
        created_all = time.time() - t0
        while len(running) < n:
            if not provider.component.alive():
                raise RuntimeError(f"provider died:\n{provider.component.tail()}")
            await asyncio.sleep(0.1)
        wall = max(running.values()) - t0
        after = await apiserver_writes(kube)
        rss, cpu = proc_usage(provider.component.process.pid)  # type: ignore[union-attr]
        ledger = {e["uid"]: e for e in await cloud.ledger()}
        to_create = [ts(ledger[u]["created_at"]) - bound[u]  # type: ignore[operator]
                     for u in bound if u in ledger]
        to_running = [running[u] - ts(ledger[u]["started_at"]) for u in running  # type: ignore[operator]
                      if u in ledger and ledger[u]["started_at"]]
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        delta = {k: v for k, v in delta.items() if v > 0}
        total_writes = sum(delta.values())
        bench_writes = delta.get(("POST", "pods", ""), 0.0)  # the benchmark's own pod creates
        watch.cancel()
        return {
            "pods": n, "wall_seconds_to_all_running": round(wall, 2),
            "create_all_pods_seconds": round(created_all, 2),
            "bind_to_create_p50_ms": round(pct(to_create, 50) * 1000, 1),
            "bind_to_create_p99_ms": round(pct(to_create, 99) * 1000, 1),
            "running_to_pod_running_p50_ms": round(pct(to_running, 50) * 1000, 1),
            "running_to_pod_running_p99_ms": round(pct(to_running, 99) * 1000, 1),
            "apiserver_writes_per_pod_by_provider": round((total_writes - bench_writes) / n, 2),
            "apiserver_writes_by_kind": {f"{v} {r}{'/' + s if s else ''}": c
                                         for (v, r, s), c in sorted(delta.items())},
            "provider_peak_rss_mib": round(rss, 1), "provider_cpu_seconds": round(cpu, 2),
            "instances_created": len(ledger),
        }
    finally:
        provider.stop()
        cloud.stop()
        try:
            await kube.delete(f"/api/v1/namespaces/{ns}")
            await kube.delete(f"/api/v1/nodes/{node}")
        except Exception:
            pass


async def main(sizes: list[int]) -> int:
    work = Path(tempfile.mkdtemp(prefix="vkp-bench-"))
    cluster = LocalCluster(log_dir=work / "logs")
    results = []
    try:
        await cluster.start()
        async with cluster.client() as kube:
            kubeconfig = await install_provider_rbac(kube=kube, cluster=cluster,
                                                     path=work / "provider.kubeconfig")
            for n in sizes:
                sys.stderr.write(f"burst of {n} pods ...\n")
                results.append(await run_one(cluster=cluster, kube=kube, kubeconfig=kubeconfig,
                                             work=work, n=n))
    finally:
        cluster.stop()
    header = ["pods", "wall to all Running (s)", "bind->create p50/p99 (ms)",
              "cloud running->pod Running p50/p99 (ms)", "API writes/pod (provider)",
              "peak RSS (MiB)", "CPU (s)"]
    rows = [[str(r["pods"]), str(r["wall_seconds_to_all_running"]),
             f"{r['bind_to_create_p50_ms']} / {r['bind_to_create_p99_ms']}",
             f"{r['running_to_pod_running_p50_ms']} / {r['running_to_pod_running_p99_ms']}",
             str(r["apiserver_writes_per_pod_by_provider"]), str(r["provider_peak_rss_mib"]),
             str(r["provider_cpu_seconds"])] for r in results]
    info = machine()
    sys.stdout.write(f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
                     f"Python {info['python']}\n")
    sys.stdout.write("settings: mock cloud boot delay 0, 10 workers, status sweep 5 s; pods "
                     "created by 32 concurrent clients with spec.nodeName set\n")
    sys.stdout.write(table(header, rows) + "\n")
    for r in results:
        sys.stdout.write(f"writes for {r['pods']} pods by kind: {r['apiserver_writes_by_kind']}\n")
    path = write("burst", {"machine": info, "results": results})
    sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="burst benchmark")
    parser.add_argument("--pods", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.pods)))

"""Status-write benchmark: what one pod status write costs the control plane, by how it is sent.

Every pod writes its status once on its way to Running, so in a burst of thousands of pods the
API server's CPU per status write is paid per pod, on the same cores as everything else. The
provider sends it as a ``PUT`` of ``pods/status`` guarded by the cached ``resourceVersion``
(``vkprovider.kube.podstatus_write``) and falls back to a strategic merge patch on a conflict;
docs/architecture.md ("Choices and their reasons") gives the figures from this bench.

On one LocalCluster, N pods are bound to a node no kubelet serves (so nothing else writes
them). Each round relists them (fresh resourceVersions, outside the measurement), then 32
concurrent writers write every pod's status once, as a kubelet would on Running (phase,
conditions, container status, podIP and the instance annotations, all new values each round),
in each mode:

* ``strategic``: a strategic merge patch of status and annotations (what the provider sent
  before);
* ``merge``: the same as a JSON merge patch;
* ``replace``: the ``PUT`` the provider sends now (``PodStatusWriter``).

The modes take turns within a round, in an order that rotates from round to round, so drift in
the machine falls on all of them. The CPU of each control-plane process and of this process (the
writers) is read from /proc around each mode's writes; the table gives medians of CPU ms per
write over the rounds (the API server's range beside it) and how many rounds each mode was the
cheapest for the API server.

Prints a table, writes ``bench/results/statuswrite.json`` and ``statuswrite.txt``.

    .venv/bin/python -m bench.statuswrite --pods 1000 --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import RESULTS, machine, populate, proc_usage, table, write
from vkprovider.kube import KubeClient
from vkprovider.kube.podstatus_write import (
    PodStatusWriter,
    StatusWrite,
    pod_status_path,
    strategic_patch,
)
from vkprovider.testing.cluster import LocalCluster

NODE = "statuswrite-nowhere"
NS = "statuswrite"
WRITERS = 32
MODES = ("strategic", "merge", "replace")

Body = dict[str, Any]
Writer = Callable[[Body, Body, dict[str, str]], Awaitable[None]]


def pod_body(i: int) -> Body:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i}", "labels": {"app": "statuswrite"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                     "ports": [{"containerPort": 8000}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def running(i: int, *, round_: int) -> tuple[Body, dict[str, str]]:
    """A Running status and its annotations for pod ``i``, different in every round."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_790_000_000 + round_))
    ip = f"198.{18 + round_ % 2}.{i // 250}.{i % 250}"
    status: Body = {
        "phase": "Running", "hostIP": ip, "podIP": ip, "podIPs": [{"ip": ip}],
        "hostIPs": [{"ip": ip}], "startTime": at, "qosClass": "BestEffort",
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": at}
                       for t in ("PodReadyToStartContainers", "Initialized", "Ready",
                                 "ContainersReady", "PodScheduled")],
        "containerStatuses": [{"name": "main", "ready": True, "started": True,
                               "restartCount": round_, "image": "vllm/vllm-openai:v0.6",
                               "imageID": "", "containerID": f"vkprovider://mi-{round_}-{i}",
                               "state": {"running": {"startedAt": at}}}]}
    annotations = {"vkprovider.io/provider": "cloud-a",
                   "vkprovider.io/instance-id": f"mi-{round_}-{i}",
                   "vkprovider.io/gpu-type": "H100"}
    return status, annotations


def writers(kube: KubeClient) -> dict[str, Writer]:
    replacer = PodStatusWriter(kube)

    async def strategic(pod: Body, status: Body, annotations: dict[str, str]) -> None:
        await kube.patch(pod_status_path(pod),
                         strategic_patch(status=status, annotations=annotations),
                         patch_type="strategic", want_body=False)

    async def merge(pod: Body, status: Body, annotations: dict[str, str]) -> None:
        await kube.patch(pod_status_path(pod),
                         {"metadata": {"annotations": annotations}, "status": status},
                         patch_type="merge", want_body=False)

    async def replace(pod: Body, status: Body, annotations: dict[str, str]) -> None:
        landed = await replacer.write(pod=pod, status=status, annotations=annotations)
        if landed is not StatusWrite.REPLACED:  # nothing else writes these pods
            raise RuntimeError(f"{pod['metadata']['name']}: the replace {landed.value}")

    return {"strategic": strategic, "merge": merge, "replace": replace}


def cpu(pids: dict[str, int]) -> dict[str, float]:
    out = {name: proc_usage(pid)[1] for name, pid in pids.items()}
    out["writers"] = proc_usage(os.getpid())[1]
    return out


async def one_mode(kube: KubeClient, *, write_one: Writer, pids: dict[str, int],
                   round_: int) -> dict[str, float]:
    """CPU ms per write of each process while every pod's status is written once."""
    pods, _ = await kube.list_all(f"/api/v1/namespaces/{NS}/pods")
    pods.sort(key=lambda p: int(p["metadata"]["name"][1:]))
    bodies = [running(i, round_=round_) for i in range(len(pods))]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(pods)):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            status, annotations = bodies[i]
            await write_one(pods[i], status, annotations)

    before = cpu(pids)
    await asyncio.gather(*(worker() for _ in range(WRITERS)))
    after = cpu(pids)
    return {name: (after[name] - before[name]) * 1000 / len(pods) for name in before}


async def main(*, n: int, rounds: int) -> int:
    work = Path(tempfile.mkdtemp(prefix="vkp-statuswrite-"))
    cluster = LocalCluster(log_dir=work / "logs")
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        await cluster.start()
        pids = {name: c.process.pid for name, c in cluster.components.items()
                if c.process is not None}
        async with cluster.client() as kube:
            sys.stderr.write(f"creating {n} pods ...\n")
            await populate(kube, namespace=NS, n=n, body=pod_body, concurrency=WRITERS)
            by_mode = writers(kube)
            # one unmeasured pass per mode: connections, caches and the first writes' setup
            for mode in MODES:
                await one_mode(kube, write_one=by_mode[mode], pids=pids, round_=0)
            for r in range(rounds):
                order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
                sys.stderr.write(f"round {r + 1} of {rounds}: {', '.join(order)}\n")
                for k, mode in enumerate(order):
                    samples[mode].append(await one_mode(
                        kube, write_one=by_mode[mode], pids=pids,
                        round_=1 + r * len(MODES) + k))
    finally:
        cluster.stop()
    text, payload = summarise(n=n, rounds=rounds, samples=samples, info=machine())
    sys.stdout.write(text)
    path = write("statuswrite", payload)
    (RESULTS / "statuswrite.txt").write_text(text)
    sys.stdout.write(f"wrote {path} and {RESULTS / 'statuswrite.txt'}\n")
    return 0


def summarise(*, n: int, rounds: int, samples: dict[str, list[dict[str, float]]],
              info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(the printed table, the JSON payload) of every mode's rounds of CPU ms per write."""
    processes = list(samples[MODES[0]][0])
    cheapest = dict.fromkeys(MODES, 0)
    for r in range(rounds):
        cheapest[min(MODES, key=lambda m: samples[m][r]["kube-apiserver"])] += 1
    results: dict[str, Any] = {}
    rows = []
    for mode in MODES:
        per = {p: statistics.median(s[p] for s in samples[mode]) for p in processes}
        total = statistics.median(sum(s.values()) for s in samples[mode])
        api = [s["kube-apiserver"] for s in samples[mode]]
        results[mode] = {"median_ms_per_write": {p: round(v, 3) for p, v in per.items()},
                         "median_total_ms_per_write": round(total, 3),
                         "apiserver_ms_per_write_rounds": [round(v, 3) for v in api],
                         "rounds_cheapest_for_apiserver": cheapest[mode]}
        rows.append([mode, f"{per['kube-apiserver']:.2f} ({min(api):.2f}-{max(api):.2f})",
                     *(f"{per[p]:.2f}" for p in processes if p != "kube-apiserver"),
                     f"{total:.2f}", f"{cheapest[mode]} of {rounds}"])
    header = ["mode", "kube-apiserver", *(p for p in processes if p != "kube-apiserver"),
              "sum", "cheapest (API server)"]
    text = (f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
            f"Python {info['python']}\n"
            f"settings: {n} pods bound to a node nobody serves, {WRITERS} concurrent writers, "
            f"{rounds} rounds, the modes in turn (rotating order); CPU ms per status write, "
            f"median over rounds (the API server's range in brackets)\n"
            + table(header, rows) + "\n")
    return text, {"machine": info, "settings": {"pods": n, "rounds": rounds, "writers": WRITERS},
                  "results": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="status-write benchmark")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if args.pods < 1 or args.rounds < 1:
        parser.error("--pods and --rounds must be at least 1")
    sys.exit(asyncio.run(main(n=args.pods, rounds=args.rounds)))

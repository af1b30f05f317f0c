"""Burst benchmark: N pods bound to a virtual node at once, then deleted; one pod lifecycle each.

For each size N and each system, on one LocalCluster and with the same pods (same spec, created
by 32 concurrent clients with ``spec.nodeName`` set, deleted by 32 concurrent clients with grace
0 once all are Running), it measures what follows. Before anything is measured, 1,000 pods bound
to a node nobody serves are created and deleted, so the first system does not pay for a cold API
server.

* wall time from the first create until the bench's watch saw every pod Running, and per pod the
  time from its create call returning (it is created bound) to the watch seeing it Running,
  p50/p99;
* for every system with a mock cloud (no boot delay): bind -> cloud create call, watch -> cloud
  create call (from the bench's own watch first showing the pod, so the API server's watch
  delivery under load is left out) and cloud running -> pod Running, p50/p99 (bench's
  timestamps against the mock cloud's ledger, same clock);
* the system's own CPU seconds (``/proc``, the process alone) from the first create until all
  are Running, and until the end of the deletion phase; its peak RSS (VmHWM);
* API server writes (``apiserver_request_total``, write verbs) per pod, to Running and for the
  whole lifecycle: the deletion phase ends when every pod is gone, the system is drained (no
  live cloud instance) and no pod, pod status or event write has come for 3 s. The bench's own
  creates and deletes and the node's heartbeats (leases, node status) are left out of the
  per-pod figures and listed by kind.

``--compare-go`` adds, beside vkprovider, the upstream Go virtual-kubelet (``tools/govk``: v1.14.1
with an in-memory provider) twice: with the library's defaults and with its work-queue rate
limiters and client QPS lifted. ``--go-modes lifted-cloud`` adds a third: lifted, its provider
renting an instance per pod from a mock cloud of its own (set up as vkprovider's) and deleting
it with the pod, so both nodes make the same cloud calls and pay for a cloud on the same cores.
Each system gets its own node and namespace and runs alone; its process is stopped before the
next starts. Prints a table, writes ``bench/results/burst.json``
and the printed text to ``bench/results/burst.txt``.

``--phases`` times each pod's steps inside every vkprovider system (bench/phasetrace: watch event
-> worker -> cloud create call -> answer -> status write -> answer), so a slower burst can be
told apart: the provider's own steps, or what it waits on (the cloud, the API server).

``--repeat N`` runs every size N times (each round alternates which system goes first, since the
cluster warms and ages as the runs go) and adds a table of medians with ratios to the Go node
with lifted limits; one run per size is too noisy to judge a gap of 10-20%. Before the rounds,
one burst of the first size runs on vkprovider unmeasured (``--no-settle`` skips it): after the
warm-up alone the first system measured was ~2x slower at p50, whatever code it ran
(bench/results/burst-order.txt and burst-same.txt). This release's
results came from:

    .venv/bin/python -m bench.burst --pods 1000 3000 5000 --repeat 3 --compare-go --go-modes lifted
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    RESULTS,
    Profiler,
    machine,
    pct,
    proc_usage,
    runtime_env,
    runtime_python,
    table,
    write,
)
from bench.govk import GoVKProcess, govk_binary
from bench.phases import PHASES, TRACE_DIR, phase_figures
from vkprovider.config import PodSettings
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

TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vkprovider",
              "effect": "NoSchedule"}
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY"}
READ_VERBS = {"GET", "LIST", "WATCH"}
CREATE_CONCURRENCY = 32
WORKERS = PodSettings().workers  # the provider's default; the Go node gets as many
WARM_UP_PODS = 1000  # created and deleted before anything is measured (warm_up)
QUIET_SECONDS = 3.0
HEARTBEAT_RESOURCES = {"leases", "nodes"}
Writes = dict[tuple[str, str, str], float]


async def write_counts(kube: KubeClient) -> tuple[Writes, float]:
    """API server writes by (verb, resource, subresource), and how many of all were not 2xx."""
    writes, _, failed = await request_counts(kube)
    return writes, failed


async def request_counts(kube: KubeClient) -> tuple[Writes, Writes, float]:
    """API server writes and reads (GET, LIST, WATCH) by (verb, resource, subresource), and how
    many writes were not 2xx. Reads are counted too: a system that reads more (a LIST per pod,
    a watch re-opened) loads the API server and etcd, and the watch delivery to every client
    with them, without writing more."""
    text = (await kube.request("GET", "/metrics"))["text"]
    out: Writes = {}
    reads: Writes = {}
    failed = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            verb = sample.labels.get("verb", "")
            key = (verb, sample.labels.get("resource", ""), sample.labels.get("subresource", ""))
            if verb not in WRITE_VERBS:
                if verb in READ_VERBS:
                    reads[key] = reads.get(key, 0.0) + sample.value
                continue
            out[key] = out.get(key, 0.0) + sample.value
            if not sample.labels.get("code", "").startswith("2"):
                failed += sample.value
    return out, reads, failed


async def apiserver_writes(kube: KubeClient) -> Writes:
    return (await write_counts(kube))[0]


def ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


# ---- the systems under test ------------------------------------------------------------------


class System(Protocol):
    label: str
    node: str

    async def start(self) -> None: ...

    def pid(self) -> int: ...

    def helper_pid(self) -> int | None: ...

    def check_alive(self) -> None: ...

    async def drained(self) -> bool: ...

    async def extra(self, *, bound: dict[str, float], seen: dict[str, float],
                    running: dict[str, float]) -> dict[str, Any]: ...

    def stop(self) -> None: ...


def bench_cloud(*, work: Path, n: int, event_loop: str | None = None) -> MockCloudProcess:
    """A mock cloud that boots instantly with room for every pod (twice over)."""
    return MockCloudProcess(work_dir=work, name=f"bench{n}-{uuid.uuid4().hex[:4]}",
                            boot_delay=0.0, inventory=f"H100:us-east:{n * 2}:2.49",
                            event_loop=event_loop)


def cloud_latencies(*, ledger: list[dict[str, Any]], bound: dict[str, float],
                    seen: dict[str, float], running: dict[str, float]) -> dict[str, Any]:
    """Bind -> cloud create, watch -> cloud create and cloud running -> pod Running, p50/p99,
    from the mock cloud's ledger (instances tagged with their pod's uid) and the bench's times
    (same clock)."""
    by_uid = {e["uid"]: e for e in ledger}
    to_create = [created - bound[u] for u in bound if u in by_uid
                 if (created := ts(by_uid[u]["created_at"])) is not None]
    to_running = [running[u] - started for u in running if u in by_uid
                  if (started := ts(by_uid[u]["started_at"])) is not None]
    # from the bench's own watch first showing the pod: what the API server's watch delivery
    # adds under load is left out, the node's queue and create path remain
    seen_to_create = [created - seen[u] for u in seen if u in by_uid
                      if (created := ts(by_uid[u]["created_at"])) is not None]
    return {"bind_to_create_p50_ms": ms(pct(to_create, 50)),
            "bind_to_create_p99_ms": ms(pct(to_create, 99)),
            "seen_to_create_p50_ms": ms(pct(seen_to_create, 50)),
            "seen_to_create_p99_ms": ms(pct(seen_to_create, 99)),
            "running_to_pod_running_p50_ms": ms(pct(to_running, 50)),
            "running_to_pod_running_p99_ms": ms(pct(to_running, 99)),
            "instances_created": len(by_uid)}


class Ours:
    """vkprovider with a mock cloud that boots instantly."""

    def __init__(self, *, work: Path, kubeconfig: Path, n: int, workers: int = WORKERS,
                 event_loop: str | None = None, python: Path | None = None,
                 event_qps: float | None = None, tree: Path | None = None,
                 phases: Path | None = None) -> None:
        # the event loop (provider and mock cloud alike) and the Event pacing are named when
        # the bench chose them; otherwise the product's defaults run. ``tree``: the provider's
        # code from another checkout (--baseline), against the same mock cloud
        chosen = [event_loop] if event_loop else []
        if event_qps is not None:
            chosen.append(f"events {event_qps:g}/s" if event_qps else "events unpaced")
        if tree is not None:
            chosen.append(f"baseline {tree.name}")
        self.label = f"vkprovider ({', '.join(chosen)})" if chosen else "vkprovider"
        self.node = f"vk-bench-{uuid.uuid4().hex[:6]}"
        self.cloud = bench_cloud(work=work, n=n, event_loop=event_loop)
        env = (runtime_env(tree) if python is not None
               else {"PYTHONPATH": str(tree)} if tree else {})
        # --phases: each pod's steps inside the provider, timed (bench/phasetrace)
        self.phase_trace = phases / f"{self.node}.trace" if phases is not None else None
        if self.phase_trace is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(TRACE_DIR), env.get("PYTHONPATH") or str(Path(__file__).resolve().parents[1])])
            env["VKP_PHASE_TRACE"] = str(self.phase_trace)
        self.provider = ProviderProcess(work_dir=work, kubeconfig=kubeconfig, node_name=self.node,
                                        clouds=[self.cloud],
                                        pods={"status_interval_seconds": 5, "workers": workers,
                                              "orphan_grace_seconds": 30},
                                        # the product's defaults, not the tests' short ones
                                        node={"capacity_refresh_seconds": 30,
                                              "pods": max(1000, 2 * n),  # OutOfpods past it
                                              **({} if event_qps is None
                                                 else {"event_qps": event_qps})},
                                        kubelet_api={"gpu_metrics_interval_seconds": 15},
                                        extra={"event_loop": event_loop} if event_loop else None,
                                        python=python, env=env or None)

    async def start(self) -> None:
        await self.cloud.start()
        self.provider.start()

    def pid(self) -> int:
        proc = self.provider.component.process
        if proc is None:
            raise RuntimeError("provider not started")
        return proc.pid

    def helper_pid(self) -> int | None:
        """The mock cloud: it shares the machine, so its CPU is reported beside ours."""
        proc = self.cloud.component.process
        return None if proc is None else proc.pid

    def check_alive(self) -> None:
        for part in (self.provider, self.cloud):
            if not part.alive():
                raise RuntimeError(f"{part.component.name} died:\n{part.component.tail()}")

    async def drained(self) -> bool:
        return int((await self.cloud.stats())["live_instances"]) == 0

    async def extra(self, *, bound: dict[str, float], seen: dict[str, float],
                    running: dict[str, float]) -> dict[str, Any]:
        return cloud_latencies(ledger=await self.cloud.ledger(), bound=bound, seen=seen,
                               running=running)

    def stop(self) -> None:
        self.provider.stop()
        self.cloud.stop()


GO_MODES = ("default", "lifted", "lifted-cloud")


class GoVK:
    """The upstream Go virtual-kubelet with an in-memory provider (``tools/govk``); with
    ``cloud``, that provider rents an instance per pod from a mock cloud of its own, set up as
    vkprovider's (no boot delay), so both nodes make the same cloud calls."""

    def __init__(self, *, binary: Path, work: Path, kubeconfig: Path, lift_limits: bool,
                 workers: int = WORKERS, cloud: bool = False, n: int = 0) -> None:
        mode = "lifted" if lift_limits else "default"
        self.label = f"go-vk {mode}" + ("+cloud" if cloud else "")
        self.node = f"vk-go-{mode}{'-cloud' if cloud else ''}-{uuid.uuid4().hex[:6]}"
        self.cloud = bench_cloud(work=work, n=max(n, 1)) if cloud else None
        self.process = GoVKProcess(binary=binary, work_dir=work, kubeconfig=kubeconfig,
                                   node=self.node, lift_limits=lift_limits, workers=workers,
                                   cloud_url=self.cloud.url if self.cloud else None)

    async def start(self) -> None:
        if self.cloud is not None:
            await self.cloud.start()
        self.process.start()

    def pid(self) -> int:
        proc = self.process.component.process
        if proc is None:
            raise RuntimeError("govk not started")
        return proc.pid

    def helper_pid(self) -> int | None:
        """Its mock cloud, when it has one (the in-memory provider alone has none)."""
        proc = self.cloud.component.process if self.cloud is not None else None
        return None if proc is None else proc.pid

    def check_alive(self) -> None:
        if not self.process.alive():
            raise RuntimeError(f"govk died:\n{self.process.component.tail()}")
        if self.cloud is not None and not self.cloud.alive():
            raise RuntimeError(f"mock cloud died:\n{self.cloud.component.tail()}")

    async def drained(self) -> bool:
        if self.cloud is None:
            return True
        return int((await self.cloud.stats())["live_instances"]) == 0

    async def extra(self, *, bound: dict[str, float], seen: dict[str, float],
                    running: dict[str, float]) -> dict[str, Any]:
        if self.cloud is None:
            return {}
        return cloud_latencies(ledger=await self.cloud.ledger(), bound=bound, seen=seen,
                               running=running)

    def stop(self) -> None:
        self.process.stop()
        if self.cloud is not None:
            self.cloud.stop()


def go_systems(*, binary: Path, work: Path, kubeconfig: Path, modes: tuple[str, ...],
               workers: int, n: int) -> list[GoVK]:
    """One Go node per mode asked for, in :data:`GO_MODES` order."""
    unknown = set(modes) - set(GO_MODES)
    if unknown:
        raise ValueError(f"unknown Go modes {sorted(unknown)}; known: {', '.join(GO_MODES)}")
    return [GoVK(binary=binary, work=work, kubeconfig=kubeconfig,
                 lift_limits=mode != "default", cloud=mode.endswith("-cloud"),
                 workers=workers, n=n)
            for mode in GO_MODES if mode in modes]


# ---- one burst -------------------------------------------------------------------------------


@dataclass
class PodWatch:
    """When each pod's create call returned (it is created bound), and when the bench's watch
    first saw it Running and gone. The watch shares the bench's event loop with the creating
    clients, so a Running sighting can lag; every system gets the same lag."""

    created: dict[str, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)  # the watch's first sighting
    running: dict[str, float] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)

    def on_pod(self, event: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        now = time.time()
        if event == "DELETED":
            self.gone.add(uid)
            return
        self.seen.setdefault(uid, now)
        if pod.get("status", {}).get("phase") == "Running":
            self.running.setdefault(uid, now)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def pod_body(*, node: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "annotations": {"vkprovider.io/gpu-type": "H100"}},
        "spec": {"nodeName": node, "tolerations": [TOLERATION],
                 "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


async def bounded(n: int, job: Callable[[int], Any]) -> None:
    """Run ``job(i)`` for i in range(n) with CREATE_CONCURRENCY clients at once."""
    sem = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(i: int) -> None:
        async with sem:
            await job(i)

    await asyncio.gather(*(one(i) for i in range(n)))


async def create_pods(*, kube: KubeClient, ns: str, node: str, n: int, watch: PodWatch) -> None:
    async def create(i: int) -> None:
        got = await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_body(node=node, i=i))
        watch.created[got["metadata"]["uid"]] = time.time()

    await bounded(n, create)


async def delete_pods(*, kube: KubeClient, ns: str, n: int) -> None:
    async def delete(i: int) -> None:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/namespaces/{ns}/pods/p{i}", grace_period_seconds=0)

    await bounded(n, delete)


async def wait_node(*, kube: KubeClient, system: System, timeout: float = 120.0) -> None:
    """Until the node is Ready and offers GPUs."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = await kube.get(f"/api/v1/nodes/{system.node}")
            status = got.get("status", {})
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions", []))
            if ready and status.get("allocatable", {}).get("nvidia.com/gpu", "0") != "0":
                return
        except NotFoundError:
            pass
        system.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {system.node} not ready after {timeout:g} s")
        await asyncio.sleep(0.2)


async def wait_until(*, done: Callable[[], bool], system: System, deadline: float) -> bool:
    """Poll ``done`` every 0.1 s until it holds (True) or the deadline passes (False)."""
    while not done():
        system.check_alive()
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def pod_writes(writes: Writes) -> float:
    """Pod, pod status and event writes (what the quiet check watches)."""
    return sum(v for (_, r, _), v in writes.items() if r not in HEARTBEAT_RESOURCES)


async def wait_quiet(*, kube: KubeClient, check: Callable[[], None], deadline: float) -> bool:
    """Until no pod, pod status or event write came for QUIET_SECONDS (False: deadline first)."""
    last = pod_writes(await apiserver_writes(kube))
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_SECONDS:
        await asyncio.sleep(0.5)
        now = pod_writes(await apiserver_writes(kube))
        if now != last:
            last, quiet_since = now, time.monotonic()
        check()
        if time.monotonic() > deadline:
            return False
    return True


async def wait_drained_and_quiet(*, kube: KubeClient, system: System, deadline: float) -> bool:
    """Until the system has no live instance and no pod or event write came for QUIET_SECONDS."""
    while not await system.drained():
        system.check_alive()
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
    return await wait_quiet(kube=kube, check=system.check_alive, deadline=deadline)


def writes_delta(after: Writes, before: Writes, *, n: int,
                 deleted: bool) -> tuple[dict[str, float], float, float]:
    """(writes by kind, the system's per-pod writes, heartbeat writes) between two readings."""
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    delta = {k: v for k, v in delta.items() if v > 0}
    heartbeats = sum(v for (_, r, _), v in delta.items() if r in HEARTBEAT_RESOURCES)
    own = delta.get(("POST", "pods", ""), 0.0)  # the benchmark's creates
    if deleted:
        own += min(delta.get(("DELETE", "pods", ""), 0.0), n)  # and its deletes
    system = sum(delta.values()) - heartbeats - own
    by_kind = {f"{v} {r}{'/' + s if s else ''}": c for (v, r, s), c in sorted(delta.items())}
    return by_kind, round(system / n, 2), heartbeats


@dataclass(frozen=True, kw_only=True)
class Reading:
    """What the bench reads at a phase boundary."""

    at: float
    cpu: float
    helper_cpu: float
    #: the control plane's processes (etcd, API server, controller-manager, scheduler) together,
    #: and the bench's own (its 32 creating clients and its watch): the other users of the cores
    control_plane_cpu: float
    bench_cpu: float
    writes: Writes
    reads: Writes
    failed_writes: float


async def reading(*, kube: KubeClient, system: System,
                  control_plane: tuple[int, ...] = ()) -> Reading:
    writes, reads, failed = await request_counts(kube)
    helper = system.helper_pid()
    return Reading(at=time.time(), cpu=proc_usage(system.pid())[1],
                   helper_cpu=0.0 if helper is None else proc_usage(helper)[1],
                   control_plane_cpu=sum(proc_usage(pid)[1] for pid in control_plane),
                   bench_cpu=time.process_time(), writes=writes, reads=reads,
                   failed_writes=failed)


async def burst_phase(*, kube: KubeClient, system: System, ns: str, n: int, watch: PodWatch,
                      timeout: float, control_plane: tuple[int, ...] = (),
                      ) -> tuple[Reading, Reading, float, bool]:
    """Create the pods; (reading before, reading at all Running, seconds to create, in time)."""
    start = await reading(kube=kube, system=system, control_plane=control_plane)
    await create_pods(kube=kube, ns=ns, node=system.node, n=n, watch=watch)
    created = time.time() - start.at
    in_time = await wait_until(done=lambda: len(watch.running) >= n, system=system,
                               deadline=time.monotonic() + timeout)
    return (start, await reading(kube=kube, system=system, control_plane=control_plane),
            created, in_time)


async def delete_phase(*, kube: KubeClient, system: System, ns: str, n: int, watch: PodWatch,
                       timeout: float) -> tuple[Reading, float, bool]:
    """Delete the pods (grace 0); (reading at the end, seconds to drained and quiet, in time)."""
    t0 = time.time()
    deadline = time.monotonic() + timeout
    await delete_pods(kube=kube, ns=ns, n=n)
    in_time = await wait_until(done=lambda: len(watch.gone) >= len(watch.created), system=system,
                               deadline=deadline)
    in_time = in_time and await wait_drained_and_quiet(kube=kube, system=system,
                                                       deadline=deadline)
    seconds = time.time() - t0 - (QUIET_SECONDS if in_time else 0.0)
    return await reading(kube=kube, system=system), seconds, in_time


def result_row(*, system: System, n: int, watch: PodWatch, start: Reading, at_running: Reading,
               end: Reading, created: float, timings: dict[str, Any]) -> dict[str, Any]:
    to_running = [watch.running[u] - watch.created[u] for u in watch.running
                  if u in watch.created]
    by_kind_running, per_pod_running, _ = writes_delta(at_running.writes, start.writes, n=n,
                                                       deleted=False)
    by_kind, per_pod, heartbeats = writes_delta(end.writes, start.writes, n=n, deleted=True)
    wall = max(watch.running.values()) - start.at if watch.running else float("nan")
    return {
        "system": system.label, "pods": n, "node": system.node,
        "running_seen": len(watch.running), **timings,
        "wall_seconds_to_all_running": round(wall, 2),
        "create_all_pods_seconds": round(created, 2),
        "create_to_running_p50_ms": ms(pct(to_running, 50)),
        "create_to_running_p99_ms": ms(pct(to_running, 99)),
        "cpu_seconds_to_running": round(at_running.cpu - start.cpu, 2),
        "cpu_seconds_lifecycle": round(end.cpu - start.cpu, 2),
        "cloud_cpu_seconds_lifecycle": round(end.helper_cpu - start.helper_cpu, 2),
        "cloud_cpu_seconds_to_running": round(at_running.helper_cpu - start.helper_cpu, 2),
        "control_plane_cpu_seconds_to_running": round(
            at_running.control_plane_cpu - start.control_plane_cpu, 2),
        "bench_cpu_seconds_to_running": round(at_running.bench_cpu - start.bench_cpu, 2),
        "apiserver_writes_per_pod_to_running": per_pod_running,
        "apiserver_writes_per_pod_lifecycle": per_pod,
        "heartbeat_writes_lifecycle": heartbeats,
        "non_2xx_writes_lifecycle": end.failed_writes - start.failed_writes,
        "apiserver_writes_by_kind_to_running": by_kind_running,
        "apiserver_writes_by_kind_lifecycle": by_kind,
        # every client's reads (the bench's own watch and metric scrapes among them)
        "apiserver_reads_by_kind_to_running": {
            f"{v} {r}{'/' + s if s else ''}": c for (v, r, s), c in sorted(
                (k, at_running.reads[k] - start.reads.get(k, 0.0)) for k in at_running.reads)
            if c > 0},
    }


async def cleanup(*, kube: KubeClient, ns: str, node: str, timeout: float = 120.0) -> None:
    """Delete the namespace and node; wait until the namespace is gone (no spill-over)."""
    for path in (f"/api/v1/namespaces/{ns}", f"/api/v1/nodes/{node}"):
        with contextlib.suppress(NotFoundError):
            await kube.delete(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await kube.get(f"/api/v1/namespaces/{ns}")
        except NotFoundError:
            return
        await asyncio.sleep(0.5)


async def warm_up(*, kube: KubeClient, n: int) -> None:
    """Create ``n`` pods bound to a node nobody serves and delete them, once per run: the first
    system measured would otherwise also pay for a cold API server and etcd (caches, Go heaps,
    connections), measured as 0.3-0.5 s of p50 latency more than the same system run second."""
    ns = f"warm-up-{uuid.uuid4().hex[:4]}"
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns}})
    try:
        await create_pods(kube=kube, ns=ns, node="bench-warm-up", n=n, watch=PodWatch())
        await delete_pods(kube=kube, ns=ns, n=n)
    finally:
        await cleanup(kube=kube, ns=ns, node="bench-warm-up")


async def measure(*, kube: KubeClient, system: System, ns: str, n: int,
                  timeout: float, control_plane: tuple[int, ...] = ()) -> dict[str, Any]:
    watch = PodWatch()
    informer = Informer(client=kube, path=f"/api/v1/namespaces/{ns}/pods", handler=watch.on_pod,
                        name="bench")
    task = asyncio.create_task(informer.run())
    try:
        await informer.synced.wait()
        start, at_running, created, running_in_time = await burst_phase(
            kube=kube, system=system, ns=ns, n=n, watch=watch, timeout=timeout,
            control_plane=control_plane)
        end, delete_seconds, quiet_in_time = await delete_phase(
            kube=kube, system=system, ns=ns, n=n, watch=watch, timeout=timeout)
        rss = proc_usage(system.pid())[0]
        timings = {"all_running_in_time": running_in_time, "quiet_in_time": quiet_in_time,
                   "delete_to_quiet_seconds": round(delete_seconds, 2)}
        row = result_row(system=system, n=n, watch=watch, start=start, at_running=at_running,
                         end=end, created=created, timings=timings)
        row["peak_rss_mib"] = round(rss, 1)
        row.update(await system.extra(bound=watch.created, seen=watch.seen,
                                      running=watch.running))
        return row
    finally:
        task.cancel()


async def run_system(*, kube: KubeClient, system: System, n: int, timeout: float,
                     profile: Path | None = None,
                     control_plane: tuple[int, ...] = ()) -> dict[str, Any]:
    ns = f"burst-{n}-{uuid.uuid4().hex[:4]}"
    load = os.getloadavg()[0]
    await system.start()
    profilers: list[Profiler] = []
    try:
        await wait_node(kube=kube, system=system)
        await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}})
        if profile is not None:
            stem = f"{system.label.replace(' ', '-')}-{n}"
            profilers.append(Profiler(pid=system.pid(), out=profile / f"{stem}.txt"))
            if (helper := system.helper_pid()) is not None:
                profilers.append(Profiler(pid=helper, out=profile / f"{stem}-cloud.txt"))
        row = await measure(kube=kube, system=system, ns=ns, n=n, timeout=timeout,
                            control_plane=control_plane)
        row["load_average_1m_at_start"] = round(load, 2)
    finally:
        for profiler in profilers:
            sys.stderr.write(f"profile: {profiler.stop()}\n")
        system.stop()
        await cleanup(kube=kube, ns=ns, node=system.node)
    trace = getattr(system, "phase_trace", None)
    if trace is not None:  # complete once the process has exited (it flushes at exit)
        row.update(phase_figures(trace))
    return row


# ---- output ----------------------------------------------------------------------------------


def pair(row: dict[str, Any], stem: str) -> str:
    p50, p99 = row.get(f"{stem}_p50_ms"), row.get(f"{stem}_p99_ms")
    return "" if p50 is None else f"{p50} / {p99}"


def wall_cell(row: dict[str, Any]) -> str:
    if row["all_running_in_time"]:
        return str(row["wall_seconds_to_all_running"])
    return f"timed out: {row['running_seen']}/{row['pods']} Running"


def lifecycle_mark(row: dict[str, Any]) -> str:
    return ("" if row["quiet_in_time"] else "*") + ("" if row["all_running_in_time"] else "†")


def limits_note(timeouts: dict[int, float]) -> str:
    return "each phase (to Running; deletion) limited to " + ", ".join(
        f"{t:g} s at {n}" for n, t in timeouts.items())


def medians(results: list[dict[str, Any]]) -> str:
    """One row per system and size: the median of each run's figure, and its ratio to the Go
    virtual-kubelet with lifted limits at that size where it ran (below 1 = faster). Where the Go
    node also ran with a cloud (``lifted-cloud``), the wall and the CPU of each system with its
    cloud are also set against that: the like-for-like comparison."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        if r["all_running_in_time"]:
            groups.setdefault((r["system"], r["pods"]), []).append(r)

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return round(statistics.median(float(r.get(key) or 0.0) for r in rows), 2)

    def with_cloud(rows: list[dict[str, Any]]) -> float:
        return round(statistics.median(
            float(r["cpu_seconds_to_running"]) + float(r.get("cloud_cpu_seconds_to_running") or 0)
            for r in rows), 2)

    def ratio(value: float, of: float | None) -> str:
        return "" if not of else f"{value / of:.2f}x"

    clouds = any(label == "go-vk lifted+cloud" for label, _ in groups)
    header = ["system", "pods", "runs", "wall to all Running (s)", "vs go-vk lifted",
              *(["vs go-vk lifted+cloud"] if clouds else []),
              "CPU to Running (s)", "vs go-vk lifted",
              *(["CPU with its cloud to Running (s)", "vs go-vk lifted+cloud"] if clouds else []),
              "CPU lifecycle (s)"]
    rows = []
    for (label, n), runs in groups.items():
        go, go_cloud = groups.get(("go-vk lifted", n)), groups.get(("go-vk lifted+cloud", n))
        wall, cpu = med(runs, "wall_seconds_to_all_running"), med(runs, "cpu_seconds_to_running")
        row = [label, str(n), str(len(runs)), str(wall),
               ratio(wall, go and med(go, "wall_seconds_to_all_running"))]
        if clouds:
            row.append(ratio(wall, go_cloud and med(go_cloud, "wall_seconds_to_all_running")))
        row += [str(cpu), ratio(cpu, go and med(go, "cpu_seconds_to_running"))]
        if clouds:
            row += [str(with_cloud(runs)), ratio(with_cloud(runs),
                                                 go_cloud and with_cloud(go_cloud))]
        row.append(str(med(runs, "cpu_seconds_lifecycle")))
        rows.append(row)
    return table(header, rows)


def cores_table(results: list[dict[str, Any]]) -> str:
    """Where the two cores went until all pods were Running: the system under test shares them
    with the control plane, its cloud and the bench's clients, so CPU it spends is time the
    creates do not get."""
    header = ["system", "pods", "create all pods (s)", "wall to all Running (s)",
              "system CPU (s)", "mock cloud CPU (s)", "control plane CPU (s)", "bench CPU (s)",
              "all CPU (s)"]
    rows = []
    for r in results:
        parts = [r["cpu_seconds_to_running"], r.get("cloud_cpu_seconds_to_running", 0.0),
                 r.get("control_plane_cpu_seconds_to_running", 0.0),
                 r.get("bench_cpu_seconds_to_running", 0.0)]
        rows.append([r["system"], str(r["pods"]), str(r["create_all_pods_seconds"]),
                     wall_cell(r), *(str(p) for p in parts), str(round(sum(parts), 2))])
    return "where the cores went from the first create to all Running:\n" + table(header, rows)


def phases_table(results: list[dict[str, Any]]) -> str:
    rows = [[r["system"], str(r["pods"]), *(pair(r, f"phase_{stem}") for stem, *_ in PHASES)]
            for r in results if "phase_trace_pods" in r]
    return table(["system", "pods", *(title for *_, title in PHASES)], rows)


def render(*, info: dict[str, Any], results: list[dict[str, Any]], load: tuple[float, ...],
           workers: int = WORKERS, repeat: int = 1, settle: bool = False,
           timeout_note: str) -> str:
    header = ["system", "pods", "wall to all Running (s)", "create->Running p50/p99 (ms)",
              "bind->cloud create p50/p99 (ms)", "watch->cloud create p50/p99 (ms)",
              "cloud running->pod Running p50/p99 (ms)",
              "CPU to Running (s)", "CPU lifecycle (s)", "mock cloud CPU lifecycle (s)",
              "API writes/pod to Running",
              "API writes/pod lifecycle", "delete->quiet (s)", "peak RSS (MiB)"]
    rows = [[r["system"], str(r["pods"]), wall_cell(r), pair(r, "create_to_running"),
             pair(r, "bind_to_create"), pair(r, "seen_to_create"),
             pair(r, "running_to_pod_running"),
             str(r["cpu_seconds_to_running"]), str(r["cpu_seconds_lifecycle"]),
             str(r.get("cloud_cpu_seconds_lifecycle") or ""),
             str(r["apiserver_writes_per_pod_to_running"]),
             str(r["apiserver_writes_per_pod_lifecycle"]) + lifecycle_mark(r),
             str(r["delete_to_quiet_seconds"]), str(r["peak_rss_mib"])] for r in results]
    lines = [
        f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
        f"Python {info['python']}; load average at start {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} (the machine is shared: other work ran beside the bench)",
        f"settings: one LocalCluster, warmed up by {WARM_UP_PODS} pods created and deleted "
        + ("and one unmeasured burst on vkprovider " if settle else "")
        + "first; each system alone on its own node, "
        + ("run once per size (numbers are noisy)" if repeat == 1 else
           f"run {repeat} times per size (one row per run, medians below)")
        + f"; pods created by {CREATE_CONCURRENCY} concurrent clients with "
        f"spec.nodeName set, deleted with grace 0 by as many once all are Running; {workers} "
        "workers in every system; vkprovider: mock cloud boot delay 0, status sweep 5 s; go-vk: "
        "virtual-kubelet v1.14.1 nodeutil, in-memory provider, admin kubeconfig, default = "
        "library defaults (client QPS 5 / burst 10, queues 10/s burst 100), lifted = "
        "unlimited queue rate limiters and client QPS/burst 1e6, lifted+cloud = lifted with "
        "an instance rented per pod from a mock cloud of its own (boot delay 0, net/http "
        "keep-alive) before it is Running, deleted with the pod",
        "API writes/pod leave out the bench's own creates and deletes and the node heartbeats "
        "(leases, node status); lifecycle = create -> Running -> deleted, the deletion phase "
        f"ending {QUIET_SECONDS:g} s after the last pod or event write; CPU = the system's own "
        f"process from the first create; {timeout_note}",
        table(header, rows), "", cores_table(results)]
    if any("phase_trace_pods" in r for r in results):
        lines += ["", "inside the provider, per pod (--phases: first watch event, first reconcile, "
                  "cloud create call and answer, first status write and answer), p50/p99 (ms):",
                  phases_table(results)]
    for r in results:
        lines.append(f"{r['system']}, {r['pods']} pods: writes by kind over the lifecycle: "
                     f"{r['apiserver_writes_by_kind_lifecycle']}, of which not 2xx (mostly 404 on "
                     f"pods already gone): {r['non_2xx_writes_lifecycle']:g}")
    for r in results:
        lines.append(f"{r['system']}, {r['pods']} pods: reads by kind to all Running (every "
                     f"client): {r.get('apiserver_reads_by_kind_to_running', {})}")
    if len({(r["system"], r["pods"]) for r in results}) < len(results):
        lines += ["", "medians over the repeated runs (each round alternates which system goes "
                  "first):", medians(results)]
    if any(not r["quiet_in_time"] for r in results):
        lines.append("* the deletion phase hit the time limit before it was quiet: a lower bound")
    if any(not r["all_running_in_time"] for r in results):
        lines.append("† not every pod reached Running in the time limit: its writes cover only the "
                     "pods it got to, so the per-pod figures are not comparable")
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------------------------


def phase_timeouts(sizes: list[int], given: list[float] | None) -> dict[int, float]:
    """Time limit of each phase per size: as given (one per size), else 120 s + 0.6 s/pod."""
    if given is None:
        return {n: 120.0 + 0.6 * n for n in sizes}
    if len(given) != len(sizes):
        raise SystemExit("--phase-timeout needs one value per --pods size")
    return dict(zip(sizes, given, strict=True))


async def main(*, sizes: list[int], compare_go: bool, timeouts: dict[int, float],
               name: str = "burst", profile: Path | None = None,
               workers: int = WORKERS, event_loops: tuple[str, ...] = (),
               event_qps: tuple[float, ...] = (),
               go_modes: tuple[str, ...] = ("default", "lifted"), dev_venv: bool = False,
               repeat: int = 1, baseline: Path | None = None, phases: bool = False,
               settle: bool = True) -> int:
    work = Path(tempfile.mkdtemp(prefix="vkp-bench-"))
    traces = work / "phases" if phases else None
    if traces is not None:
        traces.mkdir()
    binary = govk_binary() if compare_go else None
    python = None if dev_venv else runtime_python()
    load = os.getloadavg()
    cluster = LocalCluster(log_dir=work / "logs")
    results: list[dict[str, Any]] = []
    try:
        await cluster.start()
        async with cluster.client() as kube:
            kubeconfig = await install_provider_rbac(kube=kube, cluster=cluster,
                                                     path=work / "provider.kubeconfig")
            sys.stderr.write(f"warm-up: {WARM_UP_PODS} pods created and deleted ...\n")
            await warm_up(kube=kube, n=WARM_UP_PODS)
            if settle:
                sys.stderr.write(f"settling burst: {sizes[0]} pods on vkprovider, not measured "
                                 "...\n")
                first = Ours(work=work, kubeconfig=kubeconfig, n=sizes[0], workers=workers,
                             python=python)
                await grant_provider_node(kube=kube, node=first.node)
                await run_system(kube=kube, system=first, n=sizes[0], timeout=timeouts[sizes[0]])
            for round_, n in enumerate(n for n in sizes for _ in range(repeat)):
                systems: list[System] = [Ours(work=work, kubeconfig=kubeconfig, n=n,
                                              workers=workers, event_loop=loop, python=python,
                                              event_qps=qps, phases=traces)
                                         for loop in event_loops or (None,)
                                         for qps in event_qps or (None,)]
                if baseline is not None:
                    systems.append(Ours(work=work, kubeconfig=kubeconfig, n=n, workers=workers,
                                        python=python, tree=baseline, phases=traces))
                if binary is not None:
                    systems += go_systems(binary=binary, work=work,
                                          kubeconfig=cluster.kubeconfig, modes=go_modes,
                                          workers=workers, n=n)
                for system in systems:  # ours: its Node and Leases (RBAC resourceNames)
                    if isinstance(system, Ours):
                        await grant_provider_node(kube=kube, node=system.node)
                if round_ % 2:  # alternate who goes first: the cluster warms and ages
                    systems.reverse()
                for system in systems:
                    sys.stderr.write(f"burst of {n} pods on {system.label} ...\n")
                    results.append(await run_system(kube=kube, system=system, n=n,
                                                    timeout=timeouts[n], profile=profile,
                                                    control_plane=tuple(cluster.pids())))
    finally:
        cluster.stop()
    info = machine()
    text = render(info=info, results=results, load=load, workers=workers, repeat=repeat,
                  settle=settle,
                  timeout_note=limits_note(timeouts))
    sys.stdout.write(text)
    settings = {"create_concurrency": CREATE_CONCURRENCY, "workers": workers,
                "quiet_seconds": QUIET_SECONDS,
                "phase_timeout_seconds": {str(n): t for n, t in timeouts.items()},
                "compare_go": compare_go, "load_average_at_start": list(load),
                "repeat": repeat,
                "event_loops": list(event_loops) or ["auto"],
                "event_qps": list(event_qps) or ["default"],
                "provider_python": "dev venv" if dev_venv else "runtime-only venv",
                "phase_trace": phases, "settling_burst": settle,
                "provider": {"capacity_refresh_seconds": 30,
                             "gpu_metrics_interval_seconds": 15}}
    path = write(name, {"machine": info, "settings": settings, "results": results})
    (RESULTS / f"{name}.txt").write_text(text)
    sys.stdout.write(f"wrote {path} and {RESULTS / (name + '.txt')}\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="burst benchmark")
    parser.add_argument("--pods", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--compare-go", action="store_true",
                        help="also run the upstream Go virtual-kubelet (tools/govk), default and "
                             "with its limits lifted")
    parser.add_argument("--phase-timeout", type=float, nargs="+", default=None,
                        help="time limit (s) of each phase, one per --pods size "
                             "(default 120 s + 0.6 s/pod); a system that hits it is reported "
                             "as timed out")
    parser.add_argument("--name", default="burst",
                        help="results file stem under bench/results (default burst)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="sample each system (and the mock cloud) with py-spy into DIR, "
                             "collapsed stacks per run")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"concurrent pod workers in every system (default {WORKERS})")
    parser.add_argument("--go-modes", nargs="+", choices=list(GO_MODES),
                        default=["default", "lifted"],
                        help="which Go virtual-kubelet configurations --compare-go runs "
                             "(lifted-cloud: lifted, its provider renting an instance per pod "
                             "from a mock cloud of its own, as vkprovider does)")
    parser.add_argument("--event-qps", nargs="+", type=float, default=[],
                        help="run vkprovider once per value of node.event_qps (0: Events "
                             "unpaced), each a system of its own; default: the product's")
    parser.add_argument("--event-loops", nargs="+", choices=["auto", "uvloop", "asyncio"],
                        default=[], help="run vkprovider (and its mock cloud) once per event "
                        "loop given, side by side (default: once, on the default: auto)")
    parser.add_argument("--dev-venv", action="store_true",
                        help="run the provider from the dev venv instead of a runtime-only one "
                             "(bench.common.runtime_python); dev tools add ~4 MiB of RSS")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every size this many times (each round alternates which "
                             "system goes first) and add a table of medians")
    parser.add_argument("--baseline", type=Path, default=None, metavar="TREE",
                        help="also run the provider from another checkout of the project (e.g. "
                             "`git worktree add /tmp/base REV`), as a system of its own in the "
                             "same run: a before/after on the same cluster and mock cloud")
    parser.add_argument("--no-settle", dest="settle", action="store_false",
                        help="skip the settling burst: by default one burst of the first size "
                             "runs on vkprovider, unmeasured, after the warm-up; without it the "
                             "first system measured is ~2x slower at p50 whatever code it runs "
                             "(bench/results/burst-order.txt, burst-same.txt)")
    parser.add_argument("--phases", action="store_true",
                        help="time each pod's steps inside every vkprovider system (watch event, "
                             "worker, cloud create call, status write; bench/phasetrace) and add "
                             "a table of them: what the provider does apart from what it waits on")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    sys.exit(asyncio.run(main(sizes=args.pods, compare_go=args.compare_go, workers=args.workers,
                              event_loops=tuple(args.event_loops),
                              event_qps=tuple(args.event_qps),
                              go_modes=tuple(args.go_modes),
                              timeouts=phase_timeouts(args.pods, args.phase_timeout),
                              name=args.name, profile=args.profile, dev_venv=args.dev_venv,
                              repeat=args.repeat, baseline=args.baseline,
                              phases=args.phases, settle=args.settle)))

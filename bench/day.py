"""A day on a shared GPU cluster (issue 15 item 4): a scripted day on the local cluster with real
Kueue, measured in requests, replicas, moves and money.

The cast: two simulated internal GPU nodes (``--gpus-per-node`` each, labelled for the Kueue
ResourceFlavor), an inference Deployment (``--replicas`` x 1 GPU, a readiness probe and a weight
load) behind a Service under ``--rate`` requests/s from the load generator the whole day, two
mock clouds selling H100s at different prices (cloud-a dear, cloud-b cheap) under an
OverflowPolicy with ``placement: Cheapest``, ``gpuHealth`` (82 °C for 2 s) and the pre-warm, the
provider (GPU figures read every second) and the companion as processes, and Kueue with a
ClusterQueue whose quota is the internal GPUs, ``StrictFIFO`` (gangs admitted in the order they
were queued), and which carries the pre-warm AdmissionCheck.

The script (:func:`timeline`, seconds from the moment the load starts; each step opens a chapter
of the load generator's report):

* ``morning``: inference serves inside;
* ``gangs queued``: ``--gangs`` Kueue batch Jobs (sizes in 1-GPU pods, ``--run-seconds`` each)
  created back to back in the LocalQueue: Kueue admits them one after the other, the companion
  pre-warms inference onto the clouds before each, and must not bring it home between them
  (``MoveBackHeld``, reason kueue: a ping-pong avoided);
* ``cloud GPU hot``: one cloud instance serving inference pinned at 90 °C (``POST /admin/
  instances/{id}/temperature``): replaced make-before-break;
* ``cloud-b runs out``: the cheap cloud's inventory drops to 0 (``PUT /admin/inventory``): new
  replicas go to cloud-a;
* ``gpu-node-1 unhealthy`` / ``gpu-node-1 healthy``: the health taint ``AggregatedNodeHealth``
  (PreferNoSchedule) on one internal node for ``--taint-seconds``: move-back does not count it;
* ``evening``: once every gang has finished, inference comes home and the instances stop.

Reported: failed requests per chapter, seconds (and minutes) with fewer ready replicas than
desired (sampled every 200 ms), moves out (inference pods placed on the virtual node) and back
(``MovedBack`` events), preemptions of inference, ping-pongs avoided (``MoveBackHeld`` events
whose reason is Kueue), hot replicas replaced, the clouds' bill against the cheapest possible
schedule for the same GPU-hours (the cheapest offer's $/GPU-h x the GPU-hours billed) and leaks
(live instances at the end; must be 0). Prints a table, writes ``day.json`` and ``day.txt`` to
``--out`` (bench/results).

    export VKP_CONTROLPLANE_BIN=$(bash tools/controlplane/build.sh)
    export VKP_KUEUE_BIN=$(bash tools/kueue/build.sh)
    .venv/bin/python -m bench.day
    .venv/bin/python -m bench.day --gangs 8 4 --run-seconds 20 --rate 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import RESULTS, machine, table
from vkprovider.cliflags import (
    non_negative_seconds,
    positive_count,
    positive_number,
    positive_seconds,
)

NS = "serving"
NODE = "vk-gpu-burst"
SERVICE, PORT = "inference", "web"
INTERNAL = ("gpu-node-0", "gpu-node-1")
POOL_LABEL = ("gpu-pool", "internal")
HEALTH_TAINT = {"key": "AggregatedNodeHealth", "value": "False", "effect": "PreferNoSchedule"}
HOT_CELSIUS, LIMIT_CELSIUS = 90, 82
#: The two clouds: name -> (region, price per GPU-hour, boot delay s). cloud-b is the cheap one,
#: and the one that runs out.
CLOUDS: dict[str, tuple[str, float, float]] = {"cloud-a": ("us-east", 2.49, 1.0),
                                               "cloud-b": ("eu-west", 1.89, 1.5)}
CHEAP = "cloud-b"
#: Actions of the script.
QUEUE_GANGS, HOT_GPU, CLOUD_OUT, TAINT, UNTAINT = ("queue-gangs", "hot-cloud-gpu", "cloud-out",
                                                   "taint", "untaint")
MORNING, EVENING = "morning", "evening"
#: The ClusterQueue's queueing strategy: gangs are admitted in the order they were queued.
QUEUEING = "StrictFIFO"
#: Seconds between two gangs' creation (timestamps have 1 s resolution: one gang per second).
GANG_SPACING = 1.05
HEADER = ["chapter", "from (s)", "requests", "failed", "longest no-endpoint (s)"]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One step of the day: at ``at`` seconds, do ``action`` (on ``target``); opens chapter
    ``chapter``."""

    at: float
    action: str
    chapter: str
    target: str = ""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a day on a shared GPU cluster (issue 15)")
    parser.add_argument("--gpus-per-node", type=positive_count, default=4,
                        help="nvidia.com/gpu on each of the 2 internal nodes (default 4)")
    parser.add_argument("--replicas", type=positive_count, default=4,
                        help="inference replicas x 1 GPU (default 4)")
    parser.add_argument("--rate", type=positive_number, default=25.0,
                        help="requests per second through the Service (default 25)")
    parser.add_argument("--load-seconds", type=positive_seconds, default=3.0,
                        help="the model server's weight load (default 3)")
    parser.add_argument("--gangs", type=positive_count, nargs="+", default=[6, 8, 4],
                        help="gang sizes in 1-GPU pods, queued back to back (default 6 8 4)")
    parser.add_argument("--run-seconds", type=positive_seconds, default=30.0,
                        help="how long each gang trains (default 30)")
    parser.add_argument("--gangs-at", type=non_negative_seconds, default=10.0,
                        help="when the gangs are queued, s after the load starts (default 10)")
    parser.add_argument("--hot-at", type=non_negative_seconds, default=35.0,
                        help="when a cloud GPU turns hot (default 35)")
    parser.add_argument("--cloud-out-at", type=non_negative_seconds, default=60.0,
                        help=f"when {CHEAP} (the cheap cloud) runs out of H100s (default 60)")
    parser.add_argument("--taint-at", type=non_negative_seconds, default=75.0,
                        help="when gpu-node-1 is tainted unhealthy (default 75)")
    parser.add_argument("--taint-seconds", type=positive_seconds, default=30.0,
                        help="how long it stays tainted (default 30)")
    parser.add_argument("--timeout", type=positive_seconds, default=600.0,
                        help="give up on the day after this many seconds (default 600)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="directory for day.json and day.txt (default bench/results)")
    args = parser.parse_args(argv)
    capacity = 2 * args.gpus_per_node
    if args.replicas > capacity:
        parser.error(f"--replicas {args.replicas}: more than the {capacity} internal GPUs")
    big = [g for g in args.gangs if g > capacity]
    if big:
        parser.error(f"--gangs {big[0]}: more than the {capacity} internal GPUs (Kueue's quota)")
    return args


def timeline(args: argparse.Namespace) -> list[Step]:
    """The day's script, in order of time (ties keep this order)."""
    steps = [
        Step(at=0.0, action="", chapter=MORNING),
        Step(at=args.gangs_at, action=QUEUE_GANGS,
             chapter="gangs queued", target=" ".join(str(g) for g in args.gangs)),
        Step(at=args.hot_at, action=HOT_GPU, chapter="cloud GPU hot"),
        Step(at=args.cloud_out_at, action=CLOUD_OUT, chapter=f"{CHEAP} runs out", target=CHEAP),
        Step(at=args.taint_at, action=TAINT, chapter=f"{INTERNAL[1]} unhealthy",
             target=INTERNAL[1]),
        Step(at=args.taint_at + args.taint_seconds, action=UNTAINT,
             chapter=f"{INTERNAL[1]} healthy", target=INTERNAL[1]),
    ]
    return sorted(steps, key=lambda s: s.at)


# ---- money -------------------------------------------------------------------------------


def cheapest_price(inventories: dict[str, str]) -> float:
    """The cheapest $/GPU-hour among ``name -> "GPU:region:count:price,..."`` inventories."""
    prices = [float(offer.split(":")[3]) for inv in inventories.values()
              for offer in inv.split(",") if offer]
    if not prices:
        raise ValueError("no offers")
    return min(prices)


def gpu_hours(entry: dict[str, Any]) -> float:
    """GPU-hours a ledger entry was billed for: its cost at its own $/h, times its GPUs."""
    price = float(entry.get("price_per_hour") or 0)
    if price <= 0:
        return 0.0
    return float(entry.get("cost") or 0) / price * int(entry.get("gpu_count") or 1)


def money(ledgers: dict[str, list[dict[str, Any]]], *, cheapest: float) -> dict[str, Any]:
    """The clouds' bill against the cheapest possible schedule for the same GPU-hours."""
    spent = sum(float(e.get("cost") or 0) for led in ledgers.values() for e in led)
    hours = sum(gpu_hours(e) for led in ledgers.values() for e in led)
    floor = hours * cheapest
    return {"dollars": round(spent, 4), "gpu_hours": round(hours, 5),
            "cheapest_per_gpu_hour": cheapest, "cheapest_dollars": round(floor, 4),
            "over_cheapest": round(spent / floor - 1, 4) if floor > 0 else 0.0,
            "per_cloud": {name: {"created": len(led),
                                 "live": sum(1 for e in led if e.get("state") != "deleted"),
                                 "dollars": round(sum(float(e.get("cost") or 0) for e in led), 4),
                                 "gpu_hours": round(sum(gpu_hours(e) for e in led), 5)}
                          for name, led in ledgers.items()}}


def held_by(message: str) -> str:
    """Which hold a ``MoveBackHeld`` event's message names: kueue, unhealthy or headroom."""
    if "Kueue will place" in message:
        return "kueue"
    if "unhealthy nodes" in message:
        return "unhealthy"
    return "headroom"


def count_events(events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Events by reason (``MoveBackHeld`` split as ``MoveBackHeld/<hold>``), with their
    counts (an Event repeated is one object with ``count``)."""
    out: dict[str, int] = {}
    for e in events:
        reason = str(e.get("reason") or "")
        if reason == "MoveBackHeld":
            reason = f"MoveBackHeld/{held_by(str(e.get('message') or ''))}"
        out[reason] = out.get(reason, 0) + int(e.get("count") or 1)
    return dict(sorted(out.items()))


# ---- the result ----------------------------------------------------------------------------


@dataclass
class DayResult:
    replicas: int
    rate: float
    chapters: list[dict[str, Any]] = field(default_factory=list)  # label, start, sent, failed
    seconds_below_desired: float = 0.0
    min_ready: int | None = None
    moves_out: int = 0  # inference pods placed on the virtual node
    moves_back: int = 0  # MovedBack events
    preempted: int = 0  # inference pods preempted (Preempted events on them)
    pingpongs_avoided: int = 0  # MoveBackHeld, reason kueue
    held: dict[str, int] = field(default_factory=dict)  # MoveBackHeld by hold
    hot_replaced: int = 0  # ReplacedHotReplica events
    gangs_done: int = 0
    gangs: int = 0
    money: dict[str, Any] = field(default_factory=dict)
    leaks: int = 0
    events: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # steps that could not play as scripted
    seconds: float = 0.0  # the day, from the load's start to the end of the evening

    @property
    def failed(self) -> int:
        return sum(int(c["failed"]) for c in self.chapters)

    @property
    def ok(self) -> bool:
        return self.leaks == 0 and self.gangs_done == self.gangs


def summary(r: DayResult) -> list[list[str]]:
    """The day's closing figures, as (what, value) rows."""
    m = r.money
    return [
        ["failed requests", f"{r.failed} of {sum(int(c['sent']) for c in r.chapters)}"],
        ["below desired replicas", f"{r.seconds_below_desired / 60:.2f} min "
                                   f"({r.seconds_below_desired:.1f} s; fewest ready "
                                   f"{r.min_ready} of {r.replicas})"],
        ["moves out / back", f"{r.moves_out} / {r.moves_back}"],
        ["inference preempted", str(r.preempted)],
        ["ping-pongs avoided (MoveBackHeld, kueue)", str(r.pingpongs_avoided)],
        ["moves held (by hold)", ", ".join(f"{k} {v}" for k, v in r.held.items()) or "-"],
        ["hot cloud replicas replaced", str(r.hot_replaced)],
        ["gangs finished", f"{r.gangs_done} of {r.gangs}"],
        ["cloud $ spent", f"{m.get('dollars', 0.0):.4f} ({m.get('gpu_hours', 0.0):.4f} GPU-h)"],
        ["cheapest schedule $", f"{m.get('cheapest_dollars', 0.0):.4f} (at "
                                f"{m.get('cheapest_per_gpu_hour', 0.0):.2f} $/GPU-h; "
                                f"+{100 * m.get('over_cheapest', 0.0):.1f}%)"],
        *[[f"  {name}", f"{c['created']} instances, ${c['dollars']:.4f}"]
          for name, c in sorted((m.get("per_cloud") or {}).items())],
        ["leaks (live instances)", str(r.leaks)],
    ]


def render(r: DayResult) -> str:
    chapters = table(HEADER, [[c["label"], f"{c['start']:.1f}", str(c["sent"]), str(c["failed"]),
                               f"{c['longest_no_endpoint']:.1f}"] for c in r.chapters])
    return chapters + "\n\n" + table(["the day", "value"], summary(r)) + "\n" + "".join(
        f"note: {n}\n" for n in r.notes)


def describe(info: dict[str, Any], args: argparse.Namespace) -> str:
    clouds = ", ".join(f"{k} {v[1]:.2f} $/GPU-h" for k, v in CLOUDS.items())
    return (f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
            f"Python {info['python']}\n"
            f"settings: 2 internal nodes x {args.gpus_per_node} GPUs, {args.replicas} inference "
            f"replicas x 1 GPU at {args.rate:g} req/s (weight load {args.load_seconds:g} s), "
            f"gangs {' '.join(map(str, args.gangs))} x 1 GPU for {args.run_seconds:g} s each "
            f"through Kueue ({QUEUEING}) with the pre-warm check; placement Cheapest over "
            f"{clouds}; "
            f"script (s): " + ", ".join(f"{s.at:g} {s.chapter}" for s in timeline(args))
            + "\n")


def payload(*, info: dict[str, Any], args: argparse.Namespace, result: DayResult | None,
            error: str | None = None) -> dict[str, Any]:
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {"machine": info, "settings": settings,
            "timeline": [asdict(s) for s in timeline(args)],
            "result": None if result is None else {**asdict(result), "failed": result.failed,
                                                    "ok": result.ok},
            "error": error}


def save(*, out: Path, data: dict[str, Any], text: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "day.json", out / "day.txt"]
    paths[0].write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    paths[1].write_text(text)
    return paths


# ---- the day on the cluster ----------------------------------------------------------------


def _inventories(args: argparse.Namespace) -> dict[str, str]:
    room = 2 * max([*args.gangs, args.replicas]) + args.replicas
    return {name: f"H100:{region}:{room}:{price}" for name, (region, price, _) in CLOUDS.items()}


def _policy(args: argparse.Namespace) -> dict[str, Any]:
    return {"apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
            "metadata": {"name": "inference-burst"},
            "spec": {"selector": {"namespaces": [NS],
                                  "podSelector": {"matchLabels": {"app": "inference"}}},
                     "providers": list(CLOUDS), "placement": "Cheapest",
                     "limits": {"maxGPUs": args.replicas * 3, "maxPricePerHour": 100},
                     "gpuHealth": {"maxTemperatureCelsius": LIMIT_CELSIUS, "sustainedFor": "2s"},
                     "moveBack": {"enabled": True, "stableFor": "5s", "maxConcurrent": 2,
                                  "cooldown": "10s"},
                     "prewarm": {"enabled": True, "timeout": "120s"}}}


def _gang(index: int, pods: int, run_seconds: float) -> dict[str, Any]:
    from vkprovider.storyobjects import QUEUE, training_job

    job = training_job(pods=pods, run_seconds=run_seconds, queue=QUEUE)
    job["metadata"]["name"] = f"gang-{index}-x{pods}"
    return job


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


async def run_day(args: argparse.Namespace) -> DayResult:
    """Play the day on a fresh local cluster (needs the control plane and Kueue builds)."""
    from vkprovider.kube.errors import APIError
    from vkprovider.storyobjects import inference_deployment, inference_service, kueue_objects
    from vkprovider.testing.cluster import LocalCluster
    from vkprovider.testing.fakekubelet import create_gpu_nodes
    from vkprovider.testing.harness import (
        CompanionProcess,
        MockCloudProcess,
        ProviderProcess,
        install_crds,
        install_provider_rbac,
        service_account_kubeconfig,
    )
    from vkprovider.testing.kueue import KueueManager
    from vkprovider.testing.loadgen import LoadGenerator, ready_endpoints

    result = DayResult(replicas=args.replicas, rate=args.rate, gangs=len(args.gangs))
    work = Path(tempfile.mkdtemp(prefix="vkp-day-"))
    cluster = LocalCluster(log_dir=work / "logs")
    network = cluster.address_map_dir
    inventories = _inventories(args)
    clouds = {name: MockCloudProcess(work_dir=work, name=name, boot_delay=boot,
                                     inventory=inventories[name], address_map_dir=network,
                                     public_block=i)
              for i, (name, (_, _, boot)) in enumerate(CLOUDS.items())}
    provider: ProviderProcess | None = None
    companion: CompanionProcess | None = None
    lg: LoadGenerator | None = None
    sampler: asyncio.Task[None] | None = None
    dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/inference"

    def say(text: str) -> None:
        sys.stderr.write(f"[{time.monotonic() - t_start:6.1f}s] {text}\n")

    async def until(what: str, probe: Any, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not await probe():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done after {timeout:.0f}s")
            await asyncio.sleep(0.5)

    t_start = time.monotonic()
    try:
        await cluster.start()
        cluster.start_fake_kubelet(start_delay=1, address_map_dir=network)
        async with cluster.client() as kube:
            await create_gpu_nodes(kube=kube, names=list(INTERNAL), gpus=args.gpus_per_node,
                                   labels={POOL_LABEL[0]: POOL_LABEL[1]})
            await install_crds(kube)
            vk_config = await install_provider_rbac(kube=kube, cluster=cluster,
                                                    path=work / "provider.kubeconfig")
            companion_config = await service_account_kubeconfig(
                kube=kube, cluster=cluster, namespace="vkprovider-system",
                name="vkprovider-companion", path=work / "companion.kubeconfig")
            kueue = KueueManager(cluster=cluster)  # cluster.stop() ends it
            await kueue.start()
            for cloud in clouds.values():
                await cloud.start()
            provider = ProviderProcess(work_dir=work, kubeconfig=vk_config, node_name=NODE,
                                       clouds=list(clouds.values()),
                                       client_ca_file=cluster.ca_path,
                                       pods={"spend_record_seconds": 1,
                                             "probe_address_map": str(network)},
                                       kubelet_api={"gpu_metrics_interval_seconds": 1})
            provider.start()
            companion = CompanionProcess(work_dir=work, kubeconfig=companion_config,
                                         node_name=NODE, interval=0.5, move_back_interval=1.0)
            companion.start()

            async def node_ready() -> bool:
                try:
                    node = await kube.get(f"/api/v1/nodes/{NODE}")
                except APIError:
                    return False
                return any(c["type"] == "Ready" and c["status"] == "True"
                           for c in node.get("status", {}).get("conditions") or [])

            await until(f"virtual node {NODE}", node_ready)
            say("cluster, Kueue, clouds, provider and companion up")
            await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": NS}})
            for name, value in (("inference", 100), ("training", 1000)):
                with contextlib.suppress(APIError):
                    await kube.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
                        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": name}, "value": value})
            await kube.create("/apis/vkprovider.io/v1alpha1/overflowpolicies", _policy(args))
            for path, body in kueue_objects(gpus=2 * args.gpus_per_node, with_check=True):
                if body["kind"] == "ClusterQueue":
                    # gangs in the order they were queued: BestEffortFIFO lets a small gang
                    # jump a big one that waits for quota, reordering the day
                    body["spec"]["queueingStrategy"] = QUEUEING
                await kube.create(path, body)
            await kube.create(f"/apis/apps/v1/namespaces/{NS}/deployments",
                              inference_deployment(replicas=args.replicas,
                                                   load_seconds=args.load_seconds))
            await kube.create(f"/api/v1/namespaces/{NS}/services", inference_service())

            async def inference_pods() -> list[dict[str, Any]]:
                body = await kube.get(f"/api/v1/namespaces/{NS}/pods",
                                      params={"labelSelector": "app=inference"})
                return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]

            async def inside() -> bool:
                ps = await inference_pods()
                home = sum(1 for p in ps if _ready(p)
                           and (p["spec"].get("nodeName") or "").startswith("gpu-node"))
                slices = await kube.get(
                    f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices",
                    params={"labelSelector": f"kubernetes.io/service-name={SERVICE}"})
                eps = len(ready_endpoints(slices["items"], port_name=PORT))
                return bool(home == args.replicas and eps == args.replicas)

            await until("inference inside", inside)
            lg = LoadGenerator(kube=kube, namespace=NS, service=SERVICE, rate=args.rate,
                               port=PORT, address_map=network, chapter=MORNING)
            await lg.start()
            t0 = time.monotonic()
            say(f"inference serving inside at {args.rate:g} req/s: the day starts")
            placed_out: set[str] = set()

            async def sample() -> None:
                last = time.monotonic()
                while True:
                    with contextlib.suppress(APIError, OSError):
                        dep = await kube.get(dep_path)
                        now = time.monotonic()
                        ready = int(dep.get("status", {}).get("readyReplicas") or 0)
                        if ready < args.replicas:
                            result.seconds_below_desired += now - last
                        result.min_ready = ready if result.min_ready is None else min(
                            result.min_ready, ready)
                        last = now
                        for p in await inference_pods():
                            if p["spec"].get("nodeName") == NODE:
                                placed_out.add(p["metadata"]["name"])
                    await asyncio.sleep(0.2)

            sampler = asyncio.get_running_loop().create_task(sample())

            async def hot_gpu() -> None:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    for p in await inference_pods():
                        a = p["metadata"].get("annotations") or {}
                        inst, cloud = a.get("vkprovider.io/instance-id"), a.get(
                            "vkprovider.io/provider")
                        if p["spec"].get("nodeName") == NODE and inst and cloud in clouds \
                                and _ready(p):
                            await clouds[cloud].admin(
                                "POST", f"/admin/instances/{inst}/temperature",
                                json={"celsius": HOT_CELSIUS})
                            say(f"{cloud} instance {inst} ({p['metadata']['name']}) at "
                                f"{HOT_CELSIUS} °C")
                            return
                    await asyncio.sleep(0.5)
                result.notes.append("cloud GPU hot: no inference replica on a cloud within "
                                    "60 s of the step; skipped")

            async def step(s: Step) -> None:
                if s.action == QUEUE_GANGS:
                    for i, pods in enumerate(args.gangs):
                        if i:
                            # Kueue orders by creation time, to the second: Workloads of the
                            # same second tie and Kueue may take them in any order
                            await asyncio.sleep(GANG_SPACING)
                        await kube.create(f"/apis/batch/v1/namespaces/{NS}/jobs",
                                          _gang(i, pods, args.run_seconds))
                    say(f"gangs queued: {s.target}")
                elif s.action == HOT_GPU:
                    await hot_gpu()
                elif s.action == CLOUD_OUT:
                    region = CLOUDS[s.target][0]
                    await clouds[s.target].admin("PUT", "/admin/inventory", json={"offers": [
                        {"gpu_type": "H100", "region": region, "count": 0,
                         "price_per_gpu_hour": CLOUDS[s.target][1]}]})
                    say(f"{s.target} out of H100s")
                elif s.action in (TAINT, UNTAINT):
                    taints = [HEALTH_TAINT] if s.action == TAINT else []
                    await kube.patch(f"/api/v1/nodes/{s.target}", {"spec": {"taints": taints}})
                    say(f"{s.target} {'tainted' if s.action == TAINT else 'untainted'}")

            for s in timeline(args):
                await asyncio.sleep(max(0.0, t0 + s.at - time.monotonic()))
                if s.chapter != MORNING:
                    lg.mark(s.chapter)
                await step(s)

            async def gangs_done() -> bool:
                body = await kube.get(f"/apis/batch/v1/namespaces/{NS}/jobs")
                result.gangs_done = sum(
                    1 for j in body["items"]
                    if int(j.get("status", {}).get("succeeded") or 0)
                    >= int(j["spec"].get("completions") or 1))
                return bool(result.gangs_done == len(args.gangs))

            left = args.timeout - (time.monotonic() - t0)
            await until("the gang queue", gangs_done, timeout=max(1.0, left))
            lg.mark(EVENING)
            say("every gang finished: the evening")

            async def home() -> bool:
                ps = await inference_pods()
                k = sum(1 for p in ps if _ready(p)
                        and (p["spec"].get("nodeName") or "").startswith("gpu-node"))
                live = 0
                for c in clouds.values():
                    live += sum(1 for e in await c.ledger() if e["state"] != "deleted")
                return bool(k == args.replicas and len(ps) == args.replicas and live == 0)

            left = args.timeout - (time.monotonic() - t0)
            try:
                await until("inference home", home, timeout=max(30.0, left))
            except TimeoutError as exc:
                result.notes.append(str(exc))
            await asyncio.sleep(3.0)
            report = await lg.stop()
            result.seconds = round(time.monotonic() - t0, 1)
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            result.seconds_below_desired = round(result.seconds_below_desired, 2)
            result.chapters = [{"label": c.label, "start": round(c.start - report.chapters[0]
                                                                 .start, 1),
                                "sent": c.sent, "failed": c.failed,
                                "longest_no_endpoint": round(c.longest_no_endpoint, 2),
                                "failures_by_kind": dict(c.failures_by_kind)}
                               for c in report.chapters]
            events = (await kube.get(f"/api/v1/namespaces/{NS}/events"))["items"]
            result.events = count_events(events)
            result.moves_out = len(placed_out)
            result.moves_back = result.events.get("MovedBack", 0)
            result.preempted = sum(int(e.get("count") or 1) for e in events
                                   if e.get("reason") == "Preempted"
                                   and str(e["involvedObject"].get("name", "")).startswith(
                                       "inference"))
            result.held = {k.split("/", 1)[1]: v for k, v in result.events.items()
                           if k.startswith("MoveBackHeld/")}
            result.pingpongs_avoided = result.held.get("kueue", 0)
            result.hot_replaced = result.events.get("ReplacedHotReplica", 0)
            ledgers = {name: await c.ledger() for name, c in clouds.items()}
            result.money = money(ledgers, cheapest=cheapest_price(inventories))
            result.leaks = sum(c["live"] for c in result.money["per_cloud"].values())
            return result
    finally:
        if sampler is not None:
            sampler.cancel()
        if lg is not None:
            with contextlib.suppress(Exception):
                await lg.stop()
        for proc in (companion, provider):
            if proc is not None:
                proc.stop()
        for cloud in clouds.values():
            cloud.stop()
        cluster.stop()
        sys.stderr.write(f"logs kept in {work}\n")


async def main(args: argparse.Namespace) -> int:
    logging.getLogger("vkprovider.testing.loadgen").setLevel(logging.WARNING)
    from vkprovider.testing.kueue import KueueError, find_kueue

    try:
        find_kueue()
    except KueueError as exc:
        sys.stderr.write(f"bench.day: {exc}\n")
        return 2
    result: DayResult | None = None
    error: str | None = None
    try:
        result = await run_day(args)
    except (TimeoutError, RuntimeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    info = machine()
    text = describe(info, args) + (render(result) if result else "") + (
        f"the day did not finish: {error}\n" if error else "")
    sys.stdout.write(text)
    for path in save(out=args.out, data=payload(info=info, args=args, result=result,
                                                error=error), text=text):
        sys.stdout.write(f"wrote {path}\n")
    return 0 if result is not None and result.ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))

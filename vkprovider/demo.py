"""``vkprovider demo``: the whole story on a laptop, narrated as it happens.

Why it exists: a platform engineer should see the system work before reading a line of docs. On
a real local control plane with two simulated internal GPU nodes, two mock clouds, the virtual
kubelet and the companion (each with the RBAC from manifests/):

1. inference serves inside; an OverflowPolicy lets it (and only it) burst to the clouds;
2. a training gang with a higher PriorityClass preempts it; the companion admits the evicted
   replicas to the virtual node; cloud-a runs out of H100s and the rest fail over to cloud-b;
3. training ends; the companion brings every replica home make-before-break; the instances stop;
4. a closing table: pods out and back, the fewest ready replicas seen, instances created and
   deleted, money spent, leaks (must be 0); and the site measured in requests, per chapter.

Traffic is real: the lab network (``LocalCluster.address_map_dir``) routes the virtual addresses
of internal pods (the fake kubelet's listeners) and cloud instances (the mock clouds' listeners)
to loopback; the provider probes through it; the inference server loads for ``load_seconds``
(503 until then, so its replicas are Running but not Ready meanwhile) behind a Service, and a
:class:`~vkprovider.testing.loadgen.LoadGenerator` sends ``rate`` requests per second through the
Service's EndpointSlices for the whole story, one chapter per step. Every chapter must fail no
request except the way out (preemption: the scheduler evicts the replicas before their cloud
replacements are ready), which is measured and reported as the baseline a pre-warm removes.

``bench/moveback.py`` runs the same story unnarrated to measure it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.node.spend import SPEND_ANNOTATION, decode, spend_lease_path
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
from vkprovider.testing.loadgen import LoadGenerator, LoadReport, ready_endpoints

NS = "serving"
NODE = "vk-gpu-burst"
INTENT = "vkprovider.io/move-back"
SERVICE = "inference"
PORT = "web"  # the Service port's name (targetPort: the container port named "http")
#: The story's chapters, as the load generator counts them; the way out may fail requests (the
#: baseline a pre-warm removes), every other chapter must fail none.
INSIDE, WAY_OUT, ON_CLOUD, WAY_BACK, HOME = ("inside", "way out", "on the clouds", "way back",
                                             "home")
MAY_FAIL = frozenset({WAY_OUT})


class Narrator:
    def __init__(self, *, quiet: bool = False) -> None:
        self.t0 = time.monotonic()
        self.step = 0
        self.quiet = quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            sys.stdout.write(f"[{time.monotonic() - self.t0:6.1f}s] {text}\n")
            sys.stdout.flush()

    def chapter(self, text: str) -> None:
        self.step += 1
        if not self.quiet:
            sys.stdout.write(f"\n== {self.step}. {text}\n")
            sys.stdout.flush()

    async def until(self, what: str, probe: Callable[[], Awaitable[tuple[bool, str]]],
                    timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            done, progress = await probe()
            if progress != last:
                self.say(f"   {what}: {progress}")
                last = progress
            if done:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done after {timeout:.0f}s ({progress})")
            await asyncio.sleep(0.25)


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("   " + line for line in lines)


@dataclass(frozen=True, kw_only=True)
class RequestChapter:
    """One chapter of the story in requests (from the load generator's report)."""

    label: str
    sent: int
    failed: int
    longest_no_endpoint: float  # seconds with no ready endpoint at all, the longest stretch
    failures_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def may_fail(self) -> bool:
        return self.label in MAY_FAIL


def request_chapters(report: LoadReport) -> list[RequestChapter]:
    return [RequestChapter(label=c.label, sent=c.sent, failed=c.failed,
                           longest_no_endpoint=round(c.longest_no_endpoint, 2),
                           failures_by_kind=dict(c.failures_by_kind))
            for c in report.chapters]


def requests_table(chapters: Sequence[RequestChapter]) -> str:
    rows: list[tuple[str, ...]] = [("CHAPTER", "REQUESTS SENT", "FAILED",
                                    "LONGEST NO-ENDPOINT WINDOW")]
    for c in chapters:
        rows.append((c.label, str(c.sent),
                     f"{c.failed}" if not c.may_fail else f"{c.failed} (measured: the baseline)",
                     f"{c.longest_no_endpoint:.1f} s"))
    return table(rows)


@dataclass
class StoryResult:
    replicas: int
    moved_out: int = 0
    moved_back: int = 0
    min_ready_during_moves: int | None = None
    seconds_gpus_freed_to_all_home: float = 0.0
    per_move_seconds: list[float] = field(default_factory=list)
    instances_created: int = 0
    instances_deleted: int = 0
    leaks: int = 0
    dollars: float = 0.0
    counted_dollars: float | None = None  # the provider's own count (a lower bound)
    per_cloud: dict[str, dict[str, Any]] = field(default_factory=dict)
    rate: float = 0.0  # requests per second offered through the whole story
    requests: list[RequestChapter] = field(default_factory=list)

    @property
    def failed_where_none_may(self) -> int:
        """Failed requests in the chapters that must fail none (all but the way out)."""
        return sum(c.failed for c in self.requests if not c.may_fail)

    @property
    def ok(self) -> bool:
        """No leak, no dip on the way home, no failed request where none may fail."""
        return (self.leaks == 0 and (self.min_ready_during_moves or 0) >= self.replicas
                and self.failed_where_none_may == 0)


async def _pods(kube: KubeClient, app: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": f"app={app}"})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


async def _counted_spend(kube: KubeClient, *, timeout: float = 15.0) -> float | None:
    """The provider's spend record (its Lease) once nothing is billing (None if it never is)."""
    deadline = time.monotonic() + timeout
    path = spend_lease_path(namespace="vkprovider-system", node=NODE)
    while time.monotonic() < deadline:
        try:
            lease = await kube.get(path)
        except NotFoundError:
            lease = {"metadata": {}}
        value = (lease["metadata"].get("annotations") or {}).get(SPEND_ANNOTATION)
        record = decode(value) if value else {}
        if record and all(c.open == 0 for c in record.values()):
            return round(sum(c.dollars for c in record.values()), 4)
        await asyncio.sleep(0.5)
    return None


def _running(ps: list[dict[str, Any]], where: Callable[[str], bool]) -> int:
    return sum(1 for p in ps if p.get("status", {}).get("phase") == "Running"
               and where(p["spec"].get("nodeName") or ""))


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _serving(ps: list[dict[str, Any]], where: Callable[[str], bool]) -> int:
    """Running and Ready (by its readiness probe) where ``where(nodeName)``."""
    return sum(1 for p in ps if p.get("status", {}).get("phase") == "Running" and _ready(p)
               and where(p["spec"].get("nodeName") or ""))


def inference_deployment(*, replicas: int, load_seconds: float) -> dict[str, Any]:
    """A model server: port 8000 named ``http``, loading its weights for ``load_seconds``
    (``MOCK_LOAD_SECONDS``: the lab's servers answer 503 until then), Ready by its probe."""
    server = {"name": "server", "image": "vllm:0.6",
              "ports": [{"name": "http", "containerPort": 8000}],
              "env": [{"name": "MOCK_LOAD_SECONDS", "value": f"{load_seconds:g}"}],
              "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
                                 "periodSeconds": 1, "failureThreshold": 1},
              "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "inference"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "inference"}},
                     "template": {"metadata": {"labels": {"app": "inference"},
                                               "annotations": {"vkprovider.io/gpu-type": "H100"}},
                                  "spec": {"priorityClassName": "inference",
                                           "terminationGracePeriodSeconds": 2,
                                           "containers": [server]}}}}


def inference_service() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE},
            "spec": {"selector": {"app": "inference"},
                     "ports": [{"name": PORT, "port": 80, "targetPort": "http"}]}}


def _traffic(lg: LoadGenerator, where: str) -> str:
    """``inference serving 50 req/s from WHERE, 0 failed`` (in the current chapter)."""
    return (f"inference serving {lg.rate:g} req/s from {where}, "
            f"{lg.report().chapters[-1].failed} failed")


def _chapter_line(lg: LoadGenerator) -> str:
    c = lg.report().chapters[-1]
    return (f"{c.label}: {c.sent} requests sent, {c.failed} failed, longest window with no "
            f"ready endpoint {c.longest_no_endpoint:.1f} s")


async def _load_for(lg: LoadGenerator, seconds: float) -> None:
    """Let ``seconds`` of load run in the current chapter."""
    target = lg.report().sent + int(lg.rate * seconds)
    while lg.report().sent < target:
        await asyncio.sleep(0.1)


async def run_story(*, replicas: int = 8, narrate: bool = True, keep: bool = False,
                    training_seconds: float = 25.0, rate: float = 50.0,
                    load_seconds: float = 3.0) -> StoryResult:
    """The story, ``rate`` requests per second through it; inference loads for
    ``load_seconds`` (Running, not Ready, meanwhile) wherever a replica starts."""
    n = Narrator(quiet=not narrate)
    result = StoryResult(replicas=replicas, rate=rate)
    work = Path(tempfile.mkdtemp(prefix="vkp-demo-"))
    cluster = LocalCluster(log_dir=work / "logs")
    network = cluster.address_map_dir  # the lab network: one address map for every listener
    half = max(1, replicas // 2)
    clouds = [
        MockCloudProcess(work_dir=work, name="cloud-a", boot_delay=1.0,
                         inventory=f"H100:us-east:{half}:2.49",
                         address_map_dir=network, public_block=0),
        MockCloudProcess(work_dir=work, name="cloud-b", boot_delay=1.5,
                         inventory=f"H100:eu-west:{replicas * 2}:2.19",
                         address_map_dir=network, public_block=1),
    ]
    provider: ProviderProcess | None = None
    companion: CompanionProcess | None = None
    lg: LoadGenerator | None = None
    try:
        n.chapter("A real control plane: etcd, kube-apiserver, controller-manager, scheduler")
        await cluster.start()
        cluster.start_fake_kubelet(start_delay=1, address_map_dir=network)
        n.say(f"API server at {cluster.server}; logs in {cluster.log_dir}")
        n.say(f"lab network: pod and instance addresses are virtual (10.244.x.y inside, "
              f"198.18.x.y on the clouds), routed to real listeners on loopback by the address "
              f"map in {network}")
        async with cluster.client() as kube:
            per_node = max(1, replicas // 2)
            await create_gpu_nodes(kube=kube, names=["gpu-node-0", "gpu-node-1"], gpus=per_node)
            n.say(f"2 internal GPU nodes x {per_node} nvidia.com/gpu (simulated kubelets)")
            await install_crds(kube)
            vk_config = await install_provider_rbac(kube=kube, cluster=cluster,
                                                    path=work / "provider.kubeconfig")
            companion_config = await service_account_kubeconfig(
                kube=kube, cluster=cluster, namespace="vkprovider-system",
                name="vkprovider-companion", path=work / "companion.kubeconfig")

            n.chapter("Two mock GPU clouds, the virtual kubelet and the companion")
            for cloud in clouds:
                await cloud.start()
                n.say(f"{cloud.name} at {cloud.url}")
            provider = ProviderProcess(work_dir=work, kubeconfig=vk_config, node_name=NODE,
                                       clouds=clouds, client_ca_file=cluster.ca_path,
                                       pods={"spend_record_seconds": 1,
                                             "probe_address_map": str(network)})
            provider.start()
            companion = CompanionProcess(work_dir=work, kubeconfig=companion_config,
                                         node_name=NODE, interval=0.5, move_back_interval=1.0)
            companion.start()

            async def node_ready() -> tuple[bool, str]:
                try:
                    node = await kube.get(f"/api/v1/nodes/{NODE}")
                except Exception:
                    return False, "registering"
                gpus = node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "?")
                ready = any(c["type"] == "Ready" and c["status"] == "True"
                            for c in node.get("status", {}).get("conditions") or [])
                return ready and gpus not in ("?", "0"), f"Ready={ready}, nvidia.com/gpu={gpus}"

            await n.until(f"virtual node {NODE}", node_ready)
            await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": NS}})
            for name, value in (("inference", 100), ("training", 1000)):
                with contextlib.suppress(Exception):
                    await kube.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
                        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": name}, "value": value})
            await kube.create("/apis/vkprovider.io/v1alpha1/overflowpolicies", {
                "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
                "metadata": {"name": "inference-burst"},
                "spec": {"selector": {"namespaces": [NS],
                                      "podSelector": {"matchLabels": {"app": "inference"}}},
                         "providers": ["cloud-a", "cloud-b"],
                         "limits": {"maxGPUs": replicas * 2, "maxPricePerHour": 100},
                         "moveBack": {"enabled": True, "stableFor": "5s",
                                      "maxConcurrent": 2, "cooldown": "30s"}}})
            n.say("OverflowPolicy inference-burst: app=inference in namespace serving may burst "
                  "to cloud-a then cloud-b, up to $100/h; move back after 5 s of fit")

            n.chapter(f"Inference serves inside: {replicas} replicas on the internal GPUs")
            await kube.create(f"/apis/apps/v1/namespaces/{NS}/deployments",
                              inference_deployment(replicas=replicas, load_seconds=load_seconds))
            await kube.create(f"/api/v1/namespaces/{NS}/services", inference_service())
            n.say(f"Deployment inference: a model server on port 8000 (http) that loads for "
                  f"{load_seconds:g} s, Ready by its readinessProbe (GET /ready every 1 s); "
                  f"Service {SERVICE} port 80 ({PORT})")

            async def inside() -> tuple[bool, str]:
                ps = await _pods(kube, "inference")
                k = _running(ps, lambda node: node.startswith("gpu-node"))
                r = _serving(ps, lambda node: node.startswith("gpu-node"))
                slices = await kube.get(
                    f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices",
                    params={"labelSelector": f"kubernetes.io/service-name={SERVICE}"})
                eps = len(ready_endpoints(slices["items"], port_name=PORT))
                return r == replicas and eps == replicas, (
                    f"{k}/{replicas} Running inside, {r} Ready; Service {SERVICE}: {eps} ready "
                    f"endpoints")

            await n.until("inference", inside)
            lg = LoadGenerator(kube=kube, namespace=NS, service=SERVICE, rate=rate, port=PORT,
                               address_map=network, chapter=INSIDE)
            await lg.start()
            await _load_for(lg, 2.0)
            n.say(_traffic(lg, f"{replicas} replicas inside") + " (a load generator follows "
                  "the Service's EndpointSlices, as kube-proxy does)")

            n.chapter(f"A training gang ({replicas} x 1 GPU, higher priority) preempts inference")
            n.say(_chapter_line(lg))
            lg.mark(WAY_OUT)
            await kube.create(f"/apis/batch/v1/namespaces/{NS}/jobs", {
                "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "training"},
                "spec": {"parallelism": replicas, "completions": replicas, "backoffLimit": 0,
                         "template": {"metadata": {"labels": {"app": "training"}, "annotations": {
                             "vkprovider.io/fake-run-seconds": str(training_seconds)}},
                                      "spec": {"restartPolicy": "Never",
                                               "priorityClassName": "training",
                                               "containers": [{
                                                   "name": "train", "image": "trainer:1",
                                                   "resources": {"limits": {
                                                       "nvidia.com/gpu": "1"}}}]}}}})
            clouds_used: dict[str, int] = {}

            async def overflowed() -> tuple[bool, str]:
                ps = await _pods(kube, "inference")
                out = _running(ps, lambda node: node == NODE)
                ready = _serving(ps, lambda node: node == NODE)
                tr = _running(await _pods(kube, "training"), lambda node: True)
                clouds_used.clear()
                for p in ps:
                    if p["spec"].get("nodeName") == NODE:
                        name = (p["metadata"].get("annotations") or {}).get(
                            "vkprovider.io/provider", "placing")
                        clouds_used[name] = clouds_used.get(name, 0) + 1
                where = ", ".join(f"{k} {v}" for k, v in sorted(clouds_used.items())) or "-"
                return ready == replicas and tr == replicas, (
                    f"training {tr}/{replicas} inside; inference {out}/{replicas} Running on "
                    f"the clouds ({where}), {ready} Ready")

            await n.until("overflow", overflowed)
            result.moved_out = replicas
            n.say(_chapter_line(lg) + " (measured, not yet zero: the scheduler evicts before "
                  "the cloud replicas are ready; a pre-warm removes this)")
            lg.mark(ON_CLOUD)
            rows: list[tuple[str, ...]] = [("POD", "NODE", "CLOUD", "REGION", "$/H")]
            for p in sorted(await _pods(kube, "inference"), key=lambda p: p["metadata"]["name"]):
                a = p["metadata"].get("annotations") or {}
                rows.append((p["metadata"]["name"], p["spec"].get("nodeName") or "",
                             a.get("vkprovider.io/provider", ""),
                             a.get("vkprovider.io/region", ""),
                             a.get("vkprovider.io/price-per-hour", "")))
            n.say("kubectl get pods -o wide, in short:\n" + table(rows))

            n.chapter("Training ends; inference comes home make-before-break")
            dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/inference"
            moves: dict[str, float] = {}
            min_ready: list[int] = []
            serving_from = f"{len(clouds_used)} cloud{'s' if len(clouds_used) != 1 else ''}"

            async def training_done() -> tuple[bool, str]:
                ps = await _pods(kube, "training")
                done = sum(1 for p in ps if p.get("status", {}).get("phase") == "Succeeded")
                return done == replicas, (f"{done}/{replicas} training pods Succeeded; "
                                          + _traffic(lg, serving_from))

            await n.until("training", training_done, timeout=training_seconds + 120)
            n.say(_chapter_line(lg))
            lg.mark(WAY_BACK)
            freed = time.monotonic()

            async def sampler() -> None:
                while True:
                    dep = await kube.get(dep_path)
                    min_ready.append(int(dep.get("status", {}).get("readyReplicas") or 0))
                    raw = (dep["metadata"].get("annotations") or {}).get(INTENT)
                    if raw and raw not in moves:
                        moves[raw] = time.monotonic()
                    for key in [k for k in moves if k != raw and k not in done_moves]:
                        done_moves[key] = time.monotonic() - moves[key]
                    await asyncio.sleep(0.2)

            done_moves: dict[str, float] = {}
            sampling = asyncio.get_running_loop().create_task(sampler())

            async def home() -> tuple[bool, str]:
                ps = await _pods(kube, "inference")
                k = _serving(ps, lambda node: node.startswith("gpu-node"))
                out = sum(1 for p in ps if p["spec"].get("nodeName") == NODE)
                live = 0
                for cloud in clouds:
                    live += sum(1 for e in await cloud.ledger() if e["state"] != "deleted")
                ok = k == replicas and out == 0 and live == 0
                return ok, (f"{k}/{replicas} inside and Ready, {out} on the clouds, {live} live "
                            f"cloud instances, fewest ready so far "
                            f"{min(min_ready, default=replicas)}; "
                            + _traffic(lg, "inside and the clouds"))

            try:
                await n.until("move-back", home)
            finally:
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
            result.seconds_gpus_freed_to_all_home = round(time.monotonic() - freed, 1)
            result.moved_back = replicas
            result.min_ready_during_moves = min(min_ready, default=replicas)
            result.per_move_seconds = sorted(round(v, 1) for v in done_moves.values())
            n.say(_chapter_line(lg))
            lg.mark(HOME)
            await _load_for(lg, 2.0)
            n.say(_traffic(lg, f"{replicas} replicas inside again"))
            report = await lg.stop()
            result.requests = request_chapters(report)

            n.chapter("Summary")
            for cloud in clouds:
                ledger = await cloud.ledger()
                live = sum(1 for e in ledger if e["state"] != "deleted")
                spent = sum(e["cost"] for e in ledger)
                result.per_cloud[cloud.name] = {"created": len(ledger), "live": live,
                                                "dollars": round(spent, 4)}
                result.instances_created += len(ledger)
                result.instances_deleted += len(ledger) - live
                result.leaks += live
                result.dollars += spent
            result.dollars = round(result.dollars, 4)
            result.counted_dollars = await _counted_spend(kube)
            summary: list[tuple[str, ...]] = [("", "VALUE")]
            summary += [("inference replicas moved out / back",
                      f"{result.moved_out} / {result.moved_back}"),
                     ("fewest ready replicas during the moves",
                      f"{result.min_ready_during_moves} of {replicas}"),
                     ("training done -> all home (s)", str(result.seconds_gpus_freed_to_all_home)),
                     ("cloud instances created / deleted",
                      f"{result.instances_created} / {result.instances_deleted}"),
                     *[(f"  {k}", f"{v['created']} created, ${v['dollars']:.4f}")
                       for k, v in result.per_cloud.items()],
                     ("money spent ($), the clouds' bill", f"{result.dollars:.4f}"),
                     ("  as the provider counted it", "not recorded"
                      if result.counted_dollars is None else f"{result.counted_dollars:.4f}"),
                     ("leaks (live instances)", str(result.leaks)),
                     ("failed requests outside the way out", str(result.failed_where_none_may))]
            n.say("\n" + table(summary))
            n.say(f"the site in requests ({rate:g} req/s through Service {SERVICE}, a chapter "
                  f"per step; every chapter but the way out must fail none):\n"
                  + requests_table(result.requests))
            if keep:
                n.say(f"still running; export KUBECONFIG={cluster.kubeconfig}; Ctrl-C stops")
                await asyncio.Event().wait()
            return result
    finally:
        if lg is not None:
            with contextlib.suppress(Exception):
                await lg.stop()
        for proc in (companion, provider):
            if proc is not None:
                proc.stop()
        for cloud in clouds:
            cloud.stop()
        cluster.stop()
        if narrate:
            with contextlib.suppress(OSError):
                sys.stdout.write(f"\nstopped everything; logs kept in {work}\n")


async def run_demo(*, keep: bool = False) -> int:
    """Exit status: 0 when :attr:`StoryResult.ok` (no leak, no dip, no failed request outside
    the way out), else 1. The way out's failed requests are reported, not judged: they are the
    baseline the Kueue pre-warm removes."""
    logging.getLogger("vkprovider.testing.loadgen").setLevel(logging.WARNING)
    result = await run_story(narrate=True, keep=keep)
    return 0 if result.ok else 1

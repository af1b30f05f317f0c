"""``vkprovider demo --real-node``: the burst story on a real node, its traffic over kube-proxy.

Why it exists: ``vkprovider demo`` plays the story on simulated nodes with an address table in
place of kube-proxy; this plays it where a platform team would first meet it, with the parts a
cluster really has (issue 37). A real worker node (:class:`~vkprovider.testing.realnode.RealNode`:
kubelet, containerd, kube-proxy in iptables mode, in a network namespace with no route off the
machine) advertises two GPUs (an extended resource: nothing here has a GPU) and runs two
inference replicas (busybox httpd). A training Job of higher priority takes the GPUs: the
scheduler preempts inference, the companion overflows the replacements to the mock cloud. Each
running instance's public address (198.18.x.y) lives in a namespace beside the node with a real
model server on its published port (:class:`~vkprovider.testing.netspace.InstanceSpaces`), gone
when the instance stops. Training ends; the companion moves the replicas back make-before-break
and the instances are deleted. A client pod on the node sends requests to the Service's
ClusterIP the whole time, one after another; kube-proxy's own rules deliver them; the client
writes one line per request and the table counts them per chapter. No address table anywhere:
the mock cloud and the provider get none, the replicas have no probe (Ready when running).

:func:`play_real_story` is the story (the e2e test ``tests/e2e/test_real_story.py`` judges it),
with the provider, companion and mock cloud as local processes, or (:class:`InstalledChart`) the
pods of a ``helm install`` of the chart on the node, from the project's image, and optionally a
chapter of the caller's (:class:`CloudChapter`: the installed chart's ``helm upgrade``) played
while the cloud replicas serve; :func:`run_real_demo` brings up the cluster and the node around
it, as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkprovider.errors import one_line
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import ConflictError, NotFoundError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import (
    CompanionProcess,
    MockCloudAPI,
    MockCloudProcess,
    ProviderProcess,
    grant_provider_node,
    install_crds,
    install_provider_rbac,
    service_account_kubeconfig,
)
from vkprovider.testing.netspace import InstanceSpaces
from vkprovider.testing.realnode import (
    BUSYBOX_IMAGE,
    TOLERATION,
    RealNode,
    RealNodeError,
    find_kubectl,
    preflight,
)
from vkprovider.testing.waiting import eventually

GPU = "nvidia.com/gpu"
PRODUCT = "NVIDIA-H100-80GB-HBM3"
POOL_LABEL = "vkprovider.io/pool"
REPLICAS = 2
PORT = 8000
TRAINING_SECONDS = 15
#: the replicas' grace period, which bounds the provider's drain (``pods.drain_seconds``, 5)
GRACE_SECONDS = 5
#: requests each chapter waits for before the story goes on
CHAPTER_REQUESTS = 50
#: the chapter whose failed requests are reported, not judged (see RealStory.problems)
MEASURED = "way out"
POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"/apis/{KUEUE_GROUP}/v1beta2"
PRIORITY = "/apis/scheduling.k8s.io/v1/priorityclasses"

#: the client's load: requests one after another, forever, one line each ("ok <body>" or
#: "fail <what nc said>"); busybox wget crashes on this kernel, so HTTP/1.0 by hand with nc
CLIENT = """\
while true; do
  reply=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 80 2>&1)
  case "$reply" in
    "HTTP/1."?" 200 "*) echo "ok $(printf '%s\\n' "$reply" | tail -n 1)" ;;
    *) echo "fail $(printf '%s\\n' "$reply" | head -n 1)" ;;
  esac
done
"""


def httpd_container(*, verbose: bool = False) -> dict[str, Any]:
    """A one-GPU busybox httpd on :data:`PORT` answering ``{"replica": <pod name>}``;
    ``verbose`` logs each request (``httpd -vv``), so the pod's log counts what it served."""
    flags = "-f -vv" if verbose else "-f"
    return {"name": "server", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c",
                        "mkdir -p /www && printf '{\"replica\":\"%s\"}\\n' "
                        "\"$(hostname)\" > /www/index.html && "
                        f"exec httpd {flags} -p {PORT} -h /www"],
            "ports": [{"name": "http", "containerPort": PORT}],
            "resources": {"limits": {GPU: "1"}}}


def inference_deployment(*, pool: str, priority_class: str) -> dict[str, Any]:
    """Two one-GPU replicas of busybox httpd answering ``{"replica": <pod name>}``."""
    labels = {"app": "inference"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "inference"},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels, "annotations": {"vkprovider.io/gpu-type": "H100"}},
            "spec": {
                "nodeSelector": {POOL_LABEL: pool},
                "tolerations": [TOLERATION],
                "priorityClassName": priority_class,
                # a deleted cloud replica keeps its instance min(drain_seconds, this) after
                # its endpoint turns not-ready: time for kube-proxy to drop it first (with 1 s
                # the client saw a request or two time out on the way back)
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                "automountServiceAccountToken": False,
                "containers": [httpd_container()]}}}}


def training_job(*, node: str, priority_class: str, queue: str | None = None,
                 seconds: int = TRAINING_SECONDS) -> dict[str, Any]:
    """A gang as wide as the node's GPUs, running ``seconds`` there. With ``queue``, a Kueue
    batch Job: created suspended in that LocalQueue, unsuspended when Kueue admits it."""
    meta: dict[str, Any] = {"name": "training"}
    if queue is not None:
        meta["labels"] = {f"{KUEUE_GROUP}/queue-name": queue}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
        "spec": {"parallelism": REPLICAS, "completions": REPLICAS, "backoffLimit": 0,
                 **({"suspend": True} if queue is not None else {}),
                 "template": {"metadata": {"labels": {"app": "training"}}, "spec": {
                     "restartPolicy": "Never", "priorityClassName": priority_class,
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [TOLERATION],
                     "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "t", "image": BUSYBOX_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["sleep", str(seconds)],
                                     "resources": {"limits": {GPU: "1"}}}]}}}}


def kueue_objects(*, tag: str, pool: str, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body), in order: a ResourceFlavor on the pool's nodes, the pre-warm
    AdmissionCheck, a ClusterQueue with the node's GPUs as quota carrying it, a LocalQueue."""
    v = f"{KUEUE_GROUP}/v1beta2"
    name = f"real-{tag}"
    return [
        (f"{KUEUE_API}/resourceflavors", {
            "apiVersion": v, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": {POOL_LABEL: pool}}}),
        (f"{KUEUE_API}/admissionchecks", {
            "apiVersion": v, "kind": "AdmissionCheck", "metadata": {"name": name},
            "spec": {"controllerName": "vkprovider.io/prewarm"}}),
        (f"{KUEUE_API}/clusterqueues", {
            "apiVersion": v, "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {},
                     "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                         {"name": name, "resources": [{"name": GPU,
                                                       "nominalQuota": str(REPLICAS)}]}]}],
                     "admissionChecksStrategy": {"admissionChecks": [{"name": name}]}}}),
        (f"{KUEUE_API}/namespaces/{namespace}/localqueues", {
            "apiVersion": v, "kind": "LocalQueue", "metadata": {"name": "training"},
            "spec": {"clusterQueue": name}}),
    ]


def client_pod(*, node: str, name: str, cluster_ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "tolerations": [TOLERATION], "terminationGracePeriodSeconds": 1,
                 "automountServiceAccountToken": False,
                 "containers": [{"name": "client", "image": BUSYBOX_IMAGE,
                                 "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", CLIENT.format(ip=cluster_ip)]}]}}


@dataclass(frozen=True)
class InstalledChart:
    """A release of the chart already installed (``helm install``) on the cluster, whose
    provider, companion and mock cloud the story uses instead of starting its own processes.

    The release's virtual node must carry the pool label ``vkprovider.io/pool=<namespace>``
    (the chart's ``node.labels``), and its provider must list the mock cloud as ``provider``
    (the chart names it ``mock``). ``cloud`` is the mock cloud pod's API as this process reaches
    it (the host routes the real node's pod range; see ``RealNode``)."""

    virtual_node: str
    cloud: MockCloudAPI
    provider: str = "mock"


@dataclass(frozen=True)
class CloudChapter:
    """A chapter of its own, played while inference serves from the cloud under the client's
    load (e.g. ``helm upgrade`` of the installed chart), its row judged like every other.

    ``run`` is awaited after the chapter "on the cloud"; then the client sends
    :data:`CHAPTER_REQUESTS` more before the chapter ends. Training holds the node's GPUs until
    ``run`` returns, and the story ends it then (deletes the Job): the way back cannot begin
    during the chapter, however long ``run`` takes."""

    name: str
    run: Callable[[], Awaitable[None]]


#: with a CloudChapter, training sleeps this long: until the story ends it, in effect
TRAINING_HELD_SECONDS = 3600


@dataclass
class ChapterRow:
    chapter: str
    seconds: float
    requests: int
    failed: int
    failures: dict[str, int]
    by_replica: dict[str, int]


@dataclass
class RealStory:
    """What the client counted per chapter, what each cloud server counted, and timings."""

    #: the way out through Kueue with the pre-warm check (judged), else plain preemption
    prewarm: bool = False
    #: with ``prewarm``: the gang's Workload's pre-warm check state after the way out
    check_state: str = ""
    rows: list[ChapterRow] = field(default_factory=list)
    #: requests each cloud replica's model server answered (traffic, not probes), by pod
    served: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def row(self, chapter: str) -> ChapterRow:
        return next(r for r in self.rows if r.chapter == chapter)

    @property
    def problems(self) -> list[str]:
        """Why the story is not a success (empty: it is). The way out's failed requests are
        measured, not judged: by plain preemption the replicas may go before their cloud
        replacements serve (the baseline a pre-warm removes, as in ``vkprovider demo``)."""
        out = [f"{r.chapter}: {r.failed} failed requests {r.failures}" for r in self.rows
               if r.failed and (self.prewarm or r.chapter != MEASURED)]
        if len(self.served) != REPLICAS or not all(self.served.values()):
            out.append(f"cloud replicas served {self.served}, not {REPLICAS} with traffic")
        for name, count in self.served.items():
            seen = sum(r.by_replica.get(name, 0) for r in self.rows)
            if seen != count:
                out.append(f"{name}: its server answered {count}, the client saw {seen}")
        if self.prewarm and self.check_state != "Ready":
            out.append(f"the gang's pre-warm check is {self.check_state or 'missing'}, "
                       "not Ready")
        home = [r for r in self.rows if r.chapter == "home"]
        if home and any(name in self.served for name in home[0].by_replica):
            out.append(f"a cloud replica still answered at home: {home[0].by_replica}")
        return out

    def table(self) -> str:
        lines = [f"{'chapter':<13} {'seconds':>7} {'requests':>8} {'failed':>6}  by replica"]
        for r in self.rows:
            where = ", ".join(f"{name}{' (cloud)' if name in self.served else ''}: {count}"
                              for name, count in sorted(r.by_replica.items()))
            lines.append(f"{r.chapter:<13} {r.seconds:>7.1f} {r.requests:>8} {r.failed:>6}  "
                         f"{where}{'  failures: ' + str(r.failures) if r.failures else ''}")
        lines.append(f"cloud model servers counted: {self.served}")
        return "\n".join(lines)


class ClientLog:
    """The client pod's lines, read with kubectl logs; a chapter is the lines between marks."""

    def __init__(self, *, cluster: LocalCluster, namespace: str, pod: str) -> None:
        self.cluster, self.namespace, self.pod = cluster, namespace, pod
        self.marks: list[tuple[str, int, float]] = []
        self.lines: list[str] = []

    def _read(self) -> list[str]:
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        done = subprocess.run([str(find_kubectl()), "-n", self.namespace, "logs", self.pod],
                              capture_output=True, text=True, env=env, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl logs {self.pod}: {done.stderr.strip()[-500:]}")
        return [line for line in done.stdout.splitlines() if line.startswith(("ok ", "fail "))]

    async def read(self) -> int:
        self.lines = await asyncio.to_thread(self._read)
        return len(self.lines)

    async def mark(self, label: str) -> None:
        self.marks.append((label, await self.read(), time.monotonic()))

    async def wait_requests(self, count: int, *, what: str) -> None:
        start = self.marks[-1][1]
        await eventually(self.read, until=lambda n: n >= start + count, timeout=90,
                         what=what)

    def rows(self) -> list[ChapterRow]:
        rows = []
        for (label, start, t0), (_, end, t1) in zip(self.marks, self.marks[1:], strict=False):
            by: Counter[str] = Counter()
            failed: Counter[str] = Counter()
            for line in self.lines[start:end]:
                verdict, _, rest = line.partition(" ")
                if verdict == "ok":
                    try:
                        by[str(json.loads(rest)["replica"])] += 1
                    except (ValueError, KeyError, TypeError):
                        failed[f"unexpected body {rest[:80]}"] += 1
                else:
                    failed[rest] += 1
            rows.append(ChapterRow(chapter=label, seconds=t1 - t0, requests=end - start,
                                   failed=sum(failed.values()), failures=dict(failed),
                                   by_replica=dict(by)))
        return rows


async def _inference(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{namespace}/pods",
                          params={"labelSelector": "app=inference"})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def _all_ready_on(pods: list[dict[str, Any]], node: str) -> bool:
    return len(pods) == REPLICAS and all(
        p["spec"].get("nodeName") == node and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []) for p in pods)


async def _check_state(kube: KubeClient, namespace: str, check: str) -> str:
    """The pre-warm check's state on the training Job's Workload ("" before there is one)."""
    body = await kube.get(f"{KUEUE_API}/namespaces/{namespace}/workloads")
    for wl in body.get("items") or []:
        if any(o.get("kind") == "Job" and o.get("name") == "training"
               for o in wl["metadata"].get("ownerReferences") or []):
            for entry in (wl.get("status") or {}).get("admissionChecks") or []:
                if entry.get("name") == check:
                    return str(entry.get("state") or "Pending")
    return ""


async def _policy_seen(kube: KubeClient, path: str) -> None:
    """Until the companion judged the policy's current generation (its ``Valid`` condition)."""
    def judged(obj: dict[str, Any]) -> bool:
        gen = obj["metadata"].get("generation")
        return any(c.get("type") == "Valid" and c.get("status") == "True"
                   and c.get("observedGeneration") == gen
                   for c in (obj.get("status") or {}).get("conditions") or [])

    await eventually(lambda: kube.get(path), until=judged, timeout=60,
                     what=f"the companion's verdict on {path.rsplit('/', 1)[-1]}")


def _nat_rules(netns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "iptables-save", "-t", "nat"],
                          capture_output=True, text=True, check=True, timeout=30).stdout


async def _live_instances(cloud: MockCloudAPI) -> int:
    return sum(1 for e in await cloud.ledger() if e["state"] != "deleted")


async def play_real_story(*, kube: KubeClient, cluster: LocalCluster, node: RealNode,
                          namespace: str, work_dir: Path,
                          provider_kubeconfig: Path | None = None,
                          companion_kubeconfig: Path | None = None,
                          installed: InstalledChart | None = None,
                          say: Callable[[str], None] = lambda _: None,
                          prewarm: bool = False,
                          on_the_cloud: CloudChapter | None = None) -> RealStory:
    """The story in ``namespace`` (which exists), with the node, a mock cloud, the provider
    and the companion: started here as local processes (with their kubeconfigs), or, with
    ``installed``, the pods of a release of the chart. Everything it starts or changes is
    undone before it returns. With ``prewarm`` the gang goes through Kueue (running beside
    ``cluster``) and the pre-warm AdmissionCheck: inference surges onto the cloud before the
    gang is admitted. With ``on_the_cloud``, its chapter follows "on the cloud" (see
    :class:`CloudChapter`)."""
    if installed is None and (provider_kubeconfig is None or companion_kubeconfig is None):
        raise ValueError("without an installed chart the story needs the provider's and the "
                         "companion's kubeconfigs")
    story = RealStory(prewarm=prewarm)
    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    virtual = installed.virtual_node if installed is not None else f"vk-{tag}"
    node_path = f"/api/v1/nodes/{node.name}"
    low, high = f"inf-{tag}", f"train-{tag}"
    process: MockCloudProcess | None = None
    cloud: MockCloudAPI
    if installed is None:
        cloud = process = MockCloudProcess(work_dir=work_dir, name="cloud0", boot_delay=0.3)
    else:
        cloud = installed.cloud
    provider: ProviderProcess | None = None
    companion: CompanionProcess | None = None
    spaces: InstanceSpaces | None = None
    made: list[str] = []
    try:
        if installed is None:
            await grant_provider_node(kube=kube, node=virtual)
        say(f"the real node {node.name} offers {REPLICAS} H100s to the pool {namespace}")
        await kube.patch(node_path, {"metadata": {"labels": {
            POOL_LABEL: namespace, "nvidia.com/gpu.product": PRODUCT,
            "nvidia.com/gpu.count": str(REPLICAS)}}})
        await kube.patch(f"{node_path}/status", {"status": {"capacity": {GPU: str(REPLICAS)}}})
        await eventually(lambda: kube.get(node_path), timeout=30,
                         until=lambda n: n["status"].get("allocatable", {}).get(GPU)
                         == str(REPLICAS), what="the real node's GPUs allocatable")
        if process is not None and provider_kubeconfig is not None:
            await process.start()
            provider = ProviderProcess(work_dir=work_dir, kubeconfig=provider_kubeconfig,
                                       node_name=virtual, clouds=[process],
                                       node={"labels": {POOL_LABEL: namespace}},
                                       client_ca_file=cluster.ca_path)
            provider.start()

        async def virtual_node() -> dict[str, Any] | None:
            with contextlib.suppress(NotFoundError):
                return await kube.get(f"/api/v1/nodes/{virtual}")
            return None

        await eventually(virtual_node, timeout=60,
                         until=lambda n: n is not None and any(
                             c["type"] == "Ready" and c["status"] == "True"
                             for c in n["status"].get("conditions") or []),
                         what=f"virtual node {virtual} Ready")
        story.timings["virtual node Ready"] = time.monotonic() - t0
        if installed is None and companion_kubeconfig is not None:
            companion = CompanionProcess(work_dir=work_dir, kubeconfig=companion_kubeconfig,
                                         node_name=virtual, interval=0.5,
                                         move_back_interval=1.0)
            companion.start()
        for name, value in ((low, 100), (high, 1000)):
            await kube.create(PRIORITY, {"apiVersion": "scheduling.k8s.io/v1",
                                         "kind": "PriorityClass", "metadata": {"name": name},
                                         "value": value})
            made.append(f"{PRIORITY}/{name}")
        if prewarm:
            for path, body in kueue_objects(tag=tag, pool=namespace, namespace=namespace):
                await kube.create(path, body)
                made.append(f"{path}/{body['metadata']['name']}")
            check = f"{KUEUE_API}/admissionchecks/real-{tag}"
            await eventually(lambda: kube.get(check), timeout=60,
                             until=lambda ac: any(
                                 c.get("type") == "Active" and c.get("status") == "True"
                                 for c in (ac.get("status") or {}).get("conditions") or []),
                             what="the pre-warm AdmissionCheck Active")
        svc = await kube.create(f"/api/v1/namespaces/{namespace}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "inference"},
            "spec": {"selector": {"app": "inference"},
                     "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}})
        cluster_ip = str(svc["spec"]["clusterIP"])
        await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                          inference_deployment(pool=namespace, priority_class=low))
        inside = await eventually(lambda: _inference(kube, namespace), timeout=90,
                                  until=lambda ps: _all_ready_on(ps, node.name),
                                  what="inference Ready on the real node")
        inside_endpoints = [f"{p['status']['podIP']}:{PORT}" for p in inside]
        story.timings["inference Ready inside"] = time.monotonic() - t0
        # the policy comes once inference serves inside: with overflowAfter 0s a replica the
        # scheduler could not place at once (its cache a moment behind the GPUs just offered,
        # or an earlier story's pods still terminating there) would otherwise overflow and be
        # moved back before the story begins, a cloud instance that serves nobody
        await kube.create(POLICIES, {
            "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
            "metadata": {"name": f"inference-{tag}"},
            "spec": {"selector": {"namespaces": [namespace],
                                  "podSelector": {"matchLabels": {"app": "inference"}}},
                     "providers": [installed.provider if installed else "cloud0"],
                     "overflowAfter": "0s",
                     "moveBack": {"enabled": True, "stableFor": "2s", "maxConcurrent": 2,
                                  "cooldown": "5s", "timeout": "60s"},
                     **({"prewarm": {"enabled": True, "timeout": "120s"}} if prewarm else {})}})
        made.append(f"{POLICIES}/inference-{tag}")
        await _policy_seen(kube, f"{POLICIES}/inference-{tag}")
        spaces = InstanceSpaces(node=node, instances=cloud.instances, container_port=PORT)
        await spaces.start()
        client = f"client-{tag}"
        await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                          client_pod(node=node.name, name=client, cluster_ip=cluster_ip))
        await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{client}"),
                         until=lambda p: (p.get("status") or {}).get("phase") == "Running",
                         timeout=90, what="the client pod Running")
        log = ClientLog(cluster=cluster, namespace=namespace, pod=client)
        await eventually(log.read, until=lambda n: n >= 20, timeout=90,
                         what="the client's first requests")
        say(f"inference serves inside; a client pod sends requests to {cluster_ip}:80")
        await log.mark("inside")
        await log.wait_requests(CHAPTER_REQUESTS, what="load inside")

        say("the way out: a training Job of higher priority takes the node's GPUs"
            + (" once Kueue admits it, after inference pre-warmed on the cloud"
               if prewarm else ""))
        await log.mark("way out")
        await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs",
                          training_job(node=node.name, priority_class=high,
                                       queue="training" if prewarm else None,
                                       seconds=TRAINING_HELD_SECONDS if on_the_cloud
                                       else TRAINING_SECONDS))
        await eventually(lambda: _inference(kube, namespace), timeout=120,
                         until=lambda ps: _all_ready_on(ps, virtual),
                         what="inference Ready on the cloud")
        await eventually(lambda: asyncio.sleep(0, spaces.open_count() if spaces else 0),
                         until=lambda n: n == REPLICAS, timeout=60,
                         what="the instances' addresses served")
        # the chapter starts when kube-proxy's rules send to every instance and no longer to
        # the replicas that were inside (gone with their pods, after their grace period)
        await eventually(lambda: asyncio.to_thread(_nat_rules, node.netns), timeout=60,
                         until=lambda rules: spaces is not None and all(
                             f"--to-destination {e}" in rules for e in spaces.endpoints())
                         and not any(f"--to-destination {e}" in rules
                                     for e in inside_endpoints),
                         what="kube-proxy's rules for the cloud replicas only")
        story.timings["inference Ready on the cloud"] = time.monotonic() - t0
        if prewarm:
            story.check_state = await _check_state(kube, namespace, f"real-{tag}")
        say("inference serves from the cloud, through kube-proxy's rules")
        await log.mark("on the cloud")
        await log.wait_requests(CHAPTER_REQUESTS, what="load on the cloud")

        if on_the_cloud is not None:
            say(f"{on_the_cloud.name}, while inference serves from the cloud")
            await log.mark(on_the_cloud.name)
            t1 = time.monotonic()
            await on_the_cloud.run()
            story.timings[on_the_cloud.name] = time.monotonic() - t1
            await log.wait_requests(CHAPTER_REQUESTS, what=f"load after {on_the_cloud.name}")
            say("the way back: training ends (its Job deleted), the companion brings "
                "inference home make-before-break")
            await log.mark("way back")
            await kube.delete(f"/apis/batch/v1/namespaces/{namespace}/jobs/training",
                              propagation="Background")
        else:
            say(f"the way back: training ends after {TRAINING_SECONDS}s, the companion brings "
                "inference home make-before-break")
            await log.mark("way back")
        await eventually(lambda: _inference(kube, namespace), timeout=180, interval=0.5,
                         until=lambda ps: _all_ready_on(ps, node.name),
                         what="every replica back on the real node and Ready")
        await eventually(lambda: _live_instances(cloud), until=lambda n: n == 0, timeout=60,
                         what="every cloud instance deleted")
        story.timings["home, no instance left"] = time.monotonic() - t0
        say("home: every replica inside, no instance left")
        await log.mark("home")
        await log.wait_requests(CHAPTER_REQUESTS, what="load at home")
        await log.mark("end")
        story.rows = log.rows()
        story.served = {name: s.counters.traffic for name, s in spaces.servers.items()}
        return story
    finally:
        if spaces is not None:
            await spaces.stop()
        for proc in (provider, companion, process):
            if proc is not None:
                proc.stop()
        # an installed release's virtual node is the release's (its uninstall removes it)
        for path in (f"/apis/apps/v1/namespaces/{namespace}/deployments/inference",
                     f"/apis/batch/v1/namespaces/{namespace}/jobs/training",
                     *([] if installed else [f"/api/v1/nodes/{virtual}"]), *reversed(made)):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)
        with contextlib.suppress(Exception):
            await kube.patch(f"{node_path}/status", {"status": {
                "capacity": {GPU: None}, "allocatable": {GPU: None}}})
            await kube.patch(node_path, {"metadata": {"labels": {
                POOL_LABEL: None, "nvidia.com/gpu.product": None,
                "nvidia.com/gpu.count": None}}})


async def run_real_demo(*, keep: bool = False, kueue: bool | None = None) -> int:
    """A local control plane and a real node (root), the story, its table; 0 on success.
    ``kueue``: the way out through real Kueue with the pre-warm check (True), by plain
    preemption (False), or (None) through Kueue when ``VKP_KUEUE_BIN`` names a build."""
    from vkprovider.testing.kueue import KueueError, KueueManager, find_kueue

    home: Path | None = None
    if kueue is not False:
        try:
            home = find_kueue()
        except KueueError as exc:
            if kueue:
                sys.stderr.write(f"vkprovider demo --real-node: error: --kueue: {exc}\n")
                return 1
            sys.stdout.write(f"Kueue not found ({exc}): the way out by plain preemption\n")
    try:
        bins = await asyncio.to_thread(preflight)
    except RealNodeError as exc:
        sys.stderr.write(f"vkprovider demo --real-node: error: {one_line(str(exc))}\n")
        return 1

    def say(text: str) -> None:
        sys.stdout.write(f"[{time.monotonic() - t0:6.1f}s] {text}\n")
        sys.stdout.flush()

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="vkp-real-demo-"))
    cluster = LocalCluster(log_dir=work / "logs")
    node: RealNode | None = None
    try:
        await cluster.start()
        say("control plane up; starting a real node (kubelet, containerd, kube-proxy)")
        node = RealNode(cluster=cluster, bin_dir=bins)
        await node.start()
        say(f"real node {node.name} Ready in {node.timings['ready']:.1f}s")
        if home is not None:
            say("starting Kueue (its CRDs, manager and webhooks; 20-30 s) ...")
            await KueueManager(cluster=cluster, home=home).start()  # cluster.stop() ends it
        async with cluster.client() as kube:
            await install_crds(kube)
            provider_kc = await install_provider_rbac(kube=kube, cluster=cluster,
                                                      path=work / "provider.kubeconfig")
            companion_kc = await service_account_kubeconfig(
                kube=kube, cluster=cluster, namespace="vkprovider-system",
                name="vkprovider-companion", path=work / "companion.kubeconfig")
            namespace = "real-demo"
            with contextlib.suppress(ConflictError):
                await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": namespace}})
            story = await play_real_story(kube=kube, cluster=cluster, node=node,
                                          namespace=namespace,
                                          provider_kubeconfig=provider_kc,
                                          companion_kubeconfig=companion_kc, work_dir=work,
                                          say=say, prewarm=home is not None)
        sys.stdout.write("\nthe story over kube-proxy, counted by the client pod:\n"
                         f"{story.table()}\n")
        problems = story.problems
        for problem in problems:
            sys.stdout.write(f"PROBLEM: {problem}\n")
        if keep:
            sys.stdout.write(f"kept running: KUBECONFIG={cluster.kubeconfig}; Ctrl-C ends it\n")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
        return 1 if problems else 0
    finally:
        if node is not None:
            node.stop()
        cluster.stop()

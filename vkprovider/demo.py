"""``vkprovider demo``: the whole story on a laptop, narrated as it happens.

Why it exists: a platform engineer should see the system work before reading a line of docs. On
a real local control plane with two simulated internal GPU nodes, two mock clouds, the virtual
kubelet and the companion (each with the RBAC from manifests/), and real Kueue when it is built:

1. inference serves inside; an OverflowPolicy lets it (and only it) burst to the clouds;
2. the way out: a training gang with a higher PriorityClass takes the internal GPUs. Through
   Kueue with the pre-warm check (:data:`PREWARM`, the default when Kueue is built), the gang is
   a Kueue batch Job in a LocalQueue whose ClusterQueue carries the ``vkprovider.io/prewarm``
   AdmissionCheck: Kueue reserves its quota and holds it while the companion surges inference
   onto the clouds; once the surge is Ready by its probes the check turns Ready, Kueue admits
   the gang, the scheduler preempts the internal replicas and the companion scales the surge
   back. Without Kueue (:data:`PREEMPTION`, ``--no-kueue``) the gang preempts inference at once
   and the evicted replicas are admitted to the virtual node afterwards (break-before-make, the
   measured baseline); :data:`KUEUE` is Kueue without the check (``bench/wayout.py``). Either
   way cloud-a runs out of H100s and the rest go to cloud-b;
3. training ends; the companion brings every replica home make-before-break; the instances stop;
4. a closing table: pods out and back, the fewest ready replicas seen, the way out (fewest ready,
   seconds below the desired count, the gang's admission and start delays), instances created and
   deleted, money spent, leaks (must be 0); and the site measured in requests, per chapter.

Traffic is real: the lab network (``LocalCluster.address_map_dir``) routes the virtual addresses
of internal pods (the fake kubelet's listeners) and cloud instances (the mock clouds' listeners)
to loopback; the provider probes through it; the inference server loads for ``load_seconds``
(503 until then, so its replicas are Running but not Ready meanwhile) behind a Service, and a
:class:`~vkprovider.testing.loadgen.LoadGenerator` sends ``rate`` requests per second through the
Service's EndpointSlices for the whole story, one chapter per step. Every chapter must fail no
request. The one exception is the way out without the pre-warm check: the scheduler evicts the
replicas before their cloud replacements are ready, so it is measured and reported as the
baseline a pre-warm removes; with the check it is judged like every other chapter.

``bench/moveback.py`` runs the same story unnarrated to measure the way back, ``bench/wayout.py``
to measure the way out in each mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.node.spend import SPEND_ANNOTATION, decode, spend_lease_path
from vkprovider.probing.dialing import Route, publish_routes
from vkprovider.storyobjects import (
    CHECK,
    FLAVOR,
    GANG,
    INTENT,
    KUEUE_API,
    NODE,
    NS,
    POOL_LABEL,
    PORT,
    QUEUE,
    SERVICE,
    WayOutWatch,
    app_pods,
    check_state,
    condition_status,
    gang_workload,
    inference_deployment,
    inference_service,
    kueue_objects,
    running_on,
    serving_on,
    training_job,
)
from vkprovider.storyreport import (
    HOME,
    INSIDE,
    KUEUE,
    MODE_TITLES,
    MODES,
    ON_CLOUD,
    PREEMPTION,
    PREWARM,
    WAY_BACK,
    WAY_OUT,
    Narrator,
    StoryResult,
    WayOut,
    request_chapters,
    requests_table,
    summary_rows,
    table,
)
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.fakekubelet import create_gpu_nodes
from vkprovider.testing.haproxy import HAProxyProcess
from vkprovider.testing.harness import (
    CompanionProcess,
    MockCloudProcess,
    ProviderProcess,
    install_crds,
    install_provider_rbac,
    service_account_kubeconfig,
)
from vkprovider.testing.loadgen import LoadGenerator, ready_endpoints
from vkprovider.testing.pki import CertificateAuthority

#: The hostname-only cloud's edge (``hostname_only_cloud``): its domain, the header its API key
#: goes in (SaladCloud's), the variable the key is passed in, and the gateway pod's address
#: (virtual: the address map routes its ports to the HAProxy process on loopback).
EDGE_DOMAIN = "edge.cloud-b.test"
EDGE_AUTH_HEADER = "Salad-Api-Key"
EDGE_KEY_ENV = "VKP_STORY_CLOUD_B_KEY"
GATEWAY_POD_IP = "100.64.250.1"


class _GatewayLab:
    """``hostname_only_cloud``: a test CA and wildcard certificate for cloud-b's edge, an edge
    API key (random per story), and a real HAProxy standing as the gateway pod."""

    def __init__(self, *, work: Path, network: Path, ports: int) -> None:
        (work / "edge-ca").mkdir()
        self.ca = CertificateAuthority(directory=work / "edge-ca", name="story-edge-ca")
        self.cert = self.ca.issue(stem="edge", common_name=f"*.{EDGE_DOMAIN}", server=True,
                                  hosts=(f"*.{EDGE_DOMAIN}",))
        self.key = secrets.token_hex(16)
        self.network = network
        self.haproxy = HAProxyProcess(work_dir=work / "gateway", ca_file=self.ca.cert_path,
                                      count=ports, auth_headers=(EDGE_AUTH_HEADER,))

    def edge_args(self) -> list[str]:
        return ["--api-key-env", EDGE_KEY_ENV, "--edge-domain", EDGE_DOMAIN,
                "--edge-cert", str(self.cert.cert), "--edge-key", str(self.cert.key),
                "--edge-auth-header", EDGE_AUTH_HEADER]

    async def start(self) -> None:
        await self.haproxy.start()
        layout = self.haproxy.layout
        # kube-proxy's DNAT, in the lab: the gateway pod's ports are HAProxy's listeners
        publish_routes(directory=self.network, owner="gateway", routes=[
            Route(host=GATEWAY_POD_IP, port=p, to_host="127.0.0.1", to_port=p)
            for p in range(layout.first_port, layout.first_port + layout.count)])

    def settings(self) -> dict[str, Any]:
        """The provider's ``gateway:`` settings: this HAProxy at the gateway pod's address."""
        layout = self.haproxy.layout
        return {"instances": [{"address": GATEWAY_POD_IP, "runtime": str(layout.socket)}],
                "first_port": layout.first_port, "port_count": layout.count,
                "ca_file": str(layout.ca_file), "map_dir": str(layout.map_dir),
                "auth_headers": [EDGE_AUTH_HEADER], "reconcile_seconds": 0.5}


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
                    load_seconds: float = 3.0, mode: str = PREEMPTION, fast_path: bool = True,
                    overflow_after: str | None = None,
                    kueue_home: Path | None = None,
                    hostname_only_cloud: bool = False,
                    max_price_per_hour: float | None = 100.0) -> StoryResult:
    """The story, ``rate`` requests per second through it; inference loads for
    ``load_seconds`` (Running, not Ready, meanwhile) wherever a replica starts. ``mode`` says how
    the way out plays (:data:`MODES`; the Kueue ones need ``VKP_KUEUE_BIN`` or ``kueue_home``);
    ``fast_path=False`` runs the companion with ``--no-preemption-fast-path``;
    ``overflow_after`` sets the policy's ``overflowAfter``; ``max_price_per_hour`` its
    ``limits.maxPricePerHour`` (None: no price cap). ``hostname_only_cloud`` makes
    cloud-b publish its replicas by hostname only (an HTTPS edge per replica port with a test
    CA's certificate, wanting the cloud's API key in ``Salad-Api-Key``, as SaladCloud) and runs
    a real HAProxy as the traffic gateway the provider programs; the Service reaches cloud-b's
    replicas through it (HAProxy from Debian's package: ``tools/setup.sh system``)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    with_kueue = mode in (PREWARM, KUEUE)
    n = Narrator(quiet=not narrate)
    result = StoryResult(replicas=replicas, rate=rate, mode=mode,
                         way_out=WayOut(mode=mode, fast_path=fast_path))
    work = Path(tempfile.mkdtemp(prefix="vkp-demo-"))
    cluster = LocalCluster(log_dir=work / "logs")
    network = cluster.address_map_dir  # the lab network: one address map for every listener
    half = max(1, replicas // 2)
    # a gateway port per cloud-b replica port: the surge and the replacements at most
    lab = (_GatewayLab(work=work, network=network, ports=replicas * 2 + 4)
           if hostname_only_cloud else None)
    clouds = [
        MockCloudProcess(work_dir=work, name="cloud-a", boot_delay=1.0,
                         inventory=f"H100:us-east:{half}:2.49",
                         address_map_dir=network, public_block=0),
        MockCloudProcess(work_dir=work, name="cloud-b", boot_delay=1.5,
                         inventory=f"H100:eu-west:{replicas * 2}:2.19",
                         address_map_dir=network, public_block=1,
                         edge_args=lab.edge_args() if lab is not None else (),
                         api_key=lab.key if lab is not None else None,
                         env={**os.environ, EDGE_KEY_ENV: lab.key} if lab is not None
                         else None),
    ]
    provider: ProviderProcess | None = None
    companion: CompanionProcess | None = None
    lg: LoadGenerator | None = None
    watch: WayOutWatch | None = None
    try:
        n.chapter("A real control plane: etcd, kube-apiserver, controller-manager, scheduler"
                  + (", and Kueue" if with_kueue else ""))
        n.say("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler on "
              "loopback (a few seconds) ...")
        await cluster.start()
        cluster.start_fake_kubelet(start_delay=1, address_map_dir=network)
        n.say(f"API server at {cluster.server}; logs in {cluster.log_dir}")
        n.say(f"lab network: pod and instance addresses are virtual (10.244.x.y inside, "
              f"198.18.x.y on the clouds), routed to real listeners on loopback by the address "
              f"map in {network}")
        async with cluster.client() as kube:
            per_node = max(1, replicas // 2)
            await create_gpu_nodes(kube=kube, names=["gpu-node-0", "gpu-node-1"], gpus=per_node,
                                   labels={POOL_LABEL[0]: POOL_LABEL[1]})
            n.say(f"2 internal GPU nodes x {per_node} nvidia.com/gpu (simulated kubelets)")
            await install_crds(kube)
            vk_config = await install_provider_rbac(kube=kube, cluster=cluster,
                                                    path=work / "provider.kubeconfig")
            companion_config = await service_account_kubeconfig(
                kube=kube, cluster=cluster, namespace="vkprovider-system",
                name="vkprovider-companion", path=work / "companion.kubeconfig")
            if with_kueue:  # imported here: vkprovider.testing.kueue also holds a pytest fixture
                from vkprovider.testing.kueue import KUEUE_VERSION, KueueManager

                kueue = KueueManager(cluster=cluster, home=kueue_home)  # cluster.stop() ends it
                # the longest quiet step of the story: say what it waits for
                n.say(f"starting Kueue {KUEUE_VERSION}: installing its CRDs, starting its "
                      f"manager, then waiting until its webhooks admit and convert objects "
                      f"(about 20-30 s on 2 cores) ...")
                began = time.monotonic()
                await kueue.start()
                n.say(f"Kueue {KUEUE_VERSION} ready in {time.monotonic() - began:.0f}s: its "
                      f"CRDs, the manager, its webhooks at {kueue.url} (signed by the cluster "
                      f"CA)")

            n.chapter("Two mock GPU clouds, the virtual kubelet and the companion"
                      + (", and the traffic gateway" if lab is not None else ""))
            for cloud in clouds:
                await cloud.start()
                n.say(f"{cloud.name} at {cloud.url}"
                      + (f": hostname-only (each replica port only at https://<instance>-"
                         f"<port>.{EDGE_DOMAIN}, its edge wants the cloud's API key in "
                         f"{EDGE_AUTH_HEADER})" if lab is not None and cloud.name == "cloud-b"
                         else ""))
            extra: dict[str, Any] = {}
            if lab is not None:
                await lab.start()
                layout = lab.haproxy.layout
                n.say(f"traffic gateway: a real HAProxy standing as the gateway pod "
                      f"{GATEWAY_POD_IP}, ports {layout.first_port}-"
                      f"{layout.first_port + layout.count - 1}, programmed by the provider "
                      f"over its Runtime API")
                extra = {"providers": [
                    {"name": "cloud-a", "type": "mock", "url": clouds[0].url},
                    {"name": "cloud-b", "type": "mock", "url": clouds[1].url,
                     "api_key_env": EDGE_KEY_ENV}],
                    "gateway": lab.settings()}
            provider = ProviderProcess(work_dir=work, kubeconfig=vk_config, node_name=NODE,
                                       clouds=clouds, client_ca_file=cluster.ca_path,
                                       pods={"spend_record_seconds": 1,
                                             "probe_address_map": str(network)},
                                       config_providers=lab is None, extra=extra,
                                       env={EDGE_KEY_ENV: lab.key} if lab is not None else None)
            provider.start()
            companion = CompanionProcess(
                work_dir=work, kubeconfig=companion_config, node_name=NODE, interval=0.5,
                move_back_interval=1.0,
                extra_args=() if fast_path else ("--no-preemption-fast-path",))
            companion.start()

            async def node_ready() -> tuple[bool, str]:
                assert provider is not None
                if not provider.alive():  # say why now, not after the wait's timeout
                    raise RuntimeError(f"the provider exited:\n{provider.component.tail()}")
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
            spec: dict[str, Any] = {
                "selector": {"namespaces": [NS],
                             "podSelector": {"matchLabels": {"app": "inference"}}},
                "providers": ["cloud-a", "cloud-b"],
                "limits": {"maxGPUs": replicas * 2, **(
                    {} if max_price_per_hour is None
                    else {"maxPricePerHour": max_price_per_hour})},
                "moveBack": {"enabled": True, "stableFor": "5s", "maxConcurrent": 2,
                             "cooldown": "30s"},
                "prewarm": {"enabled": True, "timeout": "120s"}}
            if overflow_after is not None:
                spec["overflowAfter"] = overflow_after
            await kube.create("/apis/vkprovider.io/v1alpha1/overflowpolicies", {
                "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
                "metadata": {"name": "inference-burst"}, "spec": spec})
            cap = ("no price cap" if max_price_per_hour is None
                   else f"up to ${max_price_per_hour:g}/h")
            n.say("OverflowPolicy inference-burst: app=inference in namespace serving may burst "
                  f"to cloud-a then cloud-b, {cap}; move back after 5 s of fit"
                  + ("; pre-warm before a Kueue gang displaces it (timeout 120 s)"
                     if mode == PREWARM else "")
                  + (f"; overflow after {overflow_after}" if overflow_after else ""))
            if with_kueue:
                for path, body in kueue_objects(gpus=per_node * 2, with_check=mode == PREWARM):
                    await kube.create(path, body)
                if mode == PREWARM:
                    n.say(f"Kueue: ResourceFlavor {FLAVOR} (the internal GPU nodes), "
                          f"ClusterQueue {QUEUE} ({per_node * 2} nvidia.com/gpu of quota) "
                          f"carrying the AdmissionCheck {CHECK} (controllerName "
                          f"vkprovider.io/prewarm: the companion), LocalQueue {NS}/{QUEUE}")

                    async def check_active() -> tuple[bool, str]:
                        ac = await kube.get(f"{KUEUE_API}/admissionchecks/{CHECK}")
                        active = condition_status(ac, "Active")
                        return active == "True", f"Active={active}"

                    await n.until(f"AdmissionCheck {CHECK}", check_active)
                else:
                    n.say(f"Kueue: ResourceFlavor {FLAVOR}, ClusterQueue {QUEUE} "
                          f"({per_node * 2} nvidia.com/gpu of quota, no admission check), "
                          f"LocalQueue {NS}/{QUEUE}")

            n.chapter(f"Inference serves inside: {replicas} replicas on the internal GPUs")
            await kube.create(f"/apis/apps/v1/namespaces/{NS}/deployments",
                              inference_deployment(replicas=replicas, load_seconds=load_seconds))
            await kube.create(f"/api/v1/namespaces/{NS}/services", inference_service())
            n.say(f"Deployment inference: a model server on port 8000 (http) that loads for "
                  f"{load_seconds:g} s, Ready by its readinessProbe (GET /ready every 1 s); "
                  f"Service {SERVICE} port 80 ({PORT})")

            async def inside() -> tuple[bool, str]:
                ps = await app_pods(kube, "inference")
                k = running_on(ps, lambda node: node.startswith("gpu-node"))
                r = serving_on(ps, lambda node: node.startswith("gpu-node"))
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

            n.chapter(f"The way out, {MODE_TITLES[mode]}: a training gang ({replicas} x 1 GPU, "
                      f"higher priority) takes the internal GPUs")
            n.say(_chapter_line(lg))
            lg.mark(WAY_OUT)
            dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/inference"
            await kube.create(f"/apis/batch/v1/namespaces/{NS}/jobs", training_job(
                pods=replicas, run_seconds=training_seconds,
                queue=QUEUE if with_kueue else None))
            watch = WayOutWatch(kube, result=result.way_out, desired=replicas,
                                gang_pods=replicas, kueue=with_kueue)
            watch.start()
            if with_kueue:
                n.say(f"Job {GANG} created suspended in LocalQueue {NS}/{QUEUE}: Kueue decides "
                      "when it runs")
                await _kueue_way_out(n=n, kube=kube, lg=lg, mode=mode, replicas=replicas,
                                     dep_path=dep_path)
            else:
                n.say(f"Job {GANG} created: the scheduler preempts inference for its pods")
            clouds_used: dict[str, int] = {}

            async def overflowed() -> tuple[bool, str]:
                ps = await app_pods(kube, "inference")
                out = running_on(ps, lambda node: node == NODE)
                ready = serving_on(ps, lambda node: node == NODE)
                still = sum(1 for p in ps if (p["spec"].get("nodeName") or "").startswith(
                    "gpu-node"))
                # started: Running, or already done (a gang shorter than the way out)
                tr = sum(1 for p in await app_pods(kube, "training")
                         if p.get("status", {}).get("phase") in ("Running", "Succeeded"))
                desired = int((await kube.get(dep_path))["spec"].get("replicas") or 0)
                clouds_used.clear()
                for p in ps:
                    if p["spec"].get("nodeName") == NODE:
                        name = (p["metadata"].get("annotations") or {}).get(
                            "vkprovider.io/provider", "placing")
                        clouds_used[name] = clouds_used.get(name, 0) + 1
                where = ", ".join(f"{k} {v}" for k, v in sorted(clouds_used.items())) or "-"
                done = (ready == replicas and tr == replicas and still == 0
                        and desired == replicas)
                return done, (
                    f"training {tr}/{replicas} inside; inference {out}/{replicas} Running on "
                    f"the clouds ({where}), {ready} Ready, {still} still inside; "
                    f"Deployment at {desired} replicas; "
                    + _traffic(lg, "inside and the clouds"))

            await n.until("overflow", overflowed)
            await watch.stop()
            result.moved_out = replicas
            w = result.way_out
            if mode == PREWARM:
                n.say(_chapter_line(lg) + f"; fewest ready replicas {w.min_ready} of {replicas} "
                      f"(pre-warmed: the way out must fail none)")
            else:
                n.say(_chapter_line(lg) + f"; fewest ready replicas {w.min_ready} of {replicas}, "
                      f"{w.seconds_below_desired:.1f} s below {replicas} (measured, not yet "
                      "zero: the scheduler evicts before the cloud replicas are ready; "
                      + ("the Kueue pre-warm check removes this)" if mode == KUEUE else
                         "`vkprovider demo` with Kueue pre-warms and removes this)"))
            lg.mark(ON_CLOUD)
            if lab is not None:  # the Service's ready endpoints that are the gateway pod's
                items = (await kube.get(
                    f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices",
                    params={"labelSelector": f"kubernetes.io/service-name={SERVICE}"}))["items"]
                result.gateway_endpoints = sum(
                    1 for a, _ in ready_endpoints(items, port_name=PORT) if a == GATEWAY_POD_IP)
                n.say(f"Service {SERVICE}: {result.gateway_endpoints} of its ready endpoints are "
                      f"the gateway pod's ({GATEWAY_POD_IP}:<port>), one per cloud-b replica: "
                      "HAProxy originates verified TLS to each edge and adds the edge key")
            rows: list[tuple[str, ...]] = [("POD", "NODE", "CLOUD", "REGION", "$/H")]
            for p in sorted(await app_pods(kube, "inference"), key=lambda p: p["metadata"]["name"]):
                a = p["metadata"].get("annotations") or {}
                rows.append((p["metadata"]["name"], p["spec"].get("nodeName") or "",
                             a.get("vkprovider.io/provider", ""),
                             a.get("vkprovider.io/region", ""),
                             a.get("vkprovider.io/price-per-hour", "")))
            n.say("kubectl get pods -o wide, in short:\n" + table(rows))

            n.chapter("Training ends; inference comes home make-before-break")
            moves: dict[str, float] = {}
            min_ready: list[int] = []
            serving_from = f"{len(clouds_used)} cloud{'s' if len(clouds_used) != 1 else ''}"

            # each gang pod runs training_seconds: a quiet wait unless the narration says so
            n.say(f"the gang trains for {training_seconds:g} s while inference serves from the "
                  f"clouds (progress every 5 s) ...")
            training_began = time.monotonic()

            async def training_done() -> tuple[bool, str]:
                ps = await app_pods(kube, "training")
                done = sum(1 for p in ps if p.get("status", {}).get("phase") == "Succeeded")
                so_far = int(time.monotonic() - training_began) // 5 * 5
                return done == replicas, (f"{done}/{replicas} training pods Succeeded after "
                                          f"{so_far} s; " + _traffic(lg, serving_from))

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
                ps = await app_pods(kube, "inference")
                k = serving_on(ps, lambda node: node.startswith("gpu-node"))
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
            result.requests = request_chapters(report, mode=mode)
            for c in result.requests:
                if c.label == WAY_OUT:
                    w.sent, w.failed = c.sent, c.failed
                    w.longest_no_endpoint = c.longest_no_endpoint

            n.chapter("Summary")
            for cloud in clouds:
                ledger = await cloud.ledger()
                live = sum(1 for e in ledger if e["state"] != "deleted")
                spent = sum(e["cost"] for e in ledger)
                # requests its model servers counted (probes apart), over the whole story
                served = await cloud.admin("GET", "/admin/traffic")
                result.per_cloud[cloud.name] = {
                    "created": len(ledger), "live": live, "dollars": round(spent, 4),
                    "requests": sum(int(v.get("traffic", 0)) for v in served.values()),
                    "path": "gateway" if lab is not None and cloud.name == "cloud-b"
                    else "direct"}
                result.instances_created += len(ledger)
                result.instances_deleted += len(ledger) - live
                result.leaks += live
                result.dollars += spent
            result.dollars = round(result.dollars, 4)
            n.say("reading the provider's own count of the spend (its Lease), once every "
                  "instance is closed in it (up to 15 s) ...")
            result.counted_dollars = await _counted_spend(kube)
            n.say("\n" + table(summary_rows(result)))
            judged = ("every chapter must fail none, the way out included (pre-warmed)"
                      if mode == PREWARM else "every chapter but the way out must fail none")
            n.say(f"the site in requests ({rate:g} req/s through Service {SERVICE}, a chapter "
                  f"per step; {judged}):\n" + requests_table(result.requests))
            if keep:
                n.say(f"still running; export KUBECONFIG={cluster.kubeconfig}; Ctrl-C stops")
                await asyncio.Event().wait()
            return result
    finally:
        if watch is not None:
            with contextlib.suppress(Exception):
                await watch.stop()
        if lg is not None:
            with contextlib.suppress(Exception):
                await lg.stop()
        for proc in (companion, provider):
            if proc is not None:
                proc.stop()
        for cloud in clouds:
            cloud.stop()
        if lab is not None:
            lab.haproxy.stop()
        cluster.stop()
        if narrate:
            with contextlib.suppress(OSError):
                sys.stdout.write(f"\nstopped everything; logs kept in {work}\n")


async def _kueue_way_out(*, n: Narrator, kube: KubeClient, lg: LoadGenerator, mode: str,
                         replicas: int, dep_path: str) -> None:
    """Narrate Kueue's side of the way out: quota reserved, the pre-warm check Pending ->
    Ready (with its messages) while the surge boots on the clouds, the gang admitted."""
    names: list[str] = []

    async def reserved() -> tuple[bool, str]:
        wl = await gang_workload(kube)
        if wl is None:
            return False, "Kueue is making the Job's Workload"
        names[:] = [wl["metadata"]["name"]]
        quota = condition_status(wl, "QuotaReserved") == "True"
        admitted = condition_status(wl, "Admitted") == "True"
        return quota or admitted, (f"Workload {wl['metadata']['name']}: quota "
                                   + (f"reserved in ClusterQueue {QUEUE}" if quota else "pending"))

    await n.until("Kueue", reserved)
    if mode == PREWARM:
        told: list[str] = []

        async def prewarmed() -> tuple[bool, str]:
            wl = await gang_workload(kube)
            state, message = check_state(wl)
            if message and f"{state}: {message}" not in told:  # the check's own words, once
                told.append(f"{state}: {message}")
                n.say(f"   AdmissionCheck {CHECK} on the Workload: {state}, \"{message}\"")
            ps = await app_pods(kube, "inference")
            out = sum(1 for p in ps if p["spec"].get("nodeName") == NODE)
            ready_out = serving_on(ps, lambda node: node == NODE)
            dep = await kube.get(dep_path)
            surge = int(dep["spec"].get("replicas") or 0) - replicas
            if state == "Ready":
                return True, f"check {state}: {ready_out} ready: admitting the gang"
            if surge <= 0:
                return False, f"check {state}"
            return False, (f"check {state}: pre-warming {surge} replicas on the clouds, {out} "
                           f"placed, {ready_out} Ready; "
                           + _traffic(lg, f"{replicas} replicas inside"))

        await n.until("pre-warm", prewarmed)

    async def admitted() -> tuple[bool, str]:
        wl = await gang_workload(kube)
        ok = condition_status(wl, "Admitted") == "True"
        name = names[0] if names else GANG
        return ok, (f"Workload {name} Admitted: Kueue unsuspends the Job, whose pods preempt "
                    f"the internal replicas" if ok else f"Workload {name} waiting for admission")

    await n.until("Kueue", admitted)
    if mode == PREWARM:
        n.say("   the companion scales inference back to its recorded count once the gang is "
              "bound: the Pending replacements go first, the cloud replicas keep serving")


def choose_mode(kueue: bool | None) -> tuple[str, str | None, Path | None]:
    """(mode, a line to say first, Kueue's folder) for ``--kueue`` (True), ``--no-kueue``
    (False) or neither (None: Kueue with pre-warm when ``VKP_KUEUE_BIN`` names a build, else
    plain preemption, saying how to get Kueue). ``--kueue`` without a build raises
    :class:`~vkprovider.testing.kueue.KueueError`."""
    if kueue is False:
        return PREEMPTION, None, None
    from vkprovider.testing.kueue import KueueError, find_kueue

    try:
        home = find_kueue()
    except KueueError as exc:
        if kueue:
            raise
        return PREEMPTION, (f"Kueue not found ({exc}); playing the way out by plain preemption "
                            "(as --no-kueue). With Kueue built, the demo plays it through Kueue "
                            "with the pre-warm check."), None
    return PREWARM, None, home


async def run_demo(*, keep: bool = False, kueue: bool | None = None) -> int:
    """Exit status: 0 when :attr:`StoryResult.ok` (no leak, no dip, no failed request outside
    a measured way out), else 1. Through Kueue with pre-warm the way out is judged too (no
    failed request, never fewer ready replicas than desired); without it its failed requests
    are reported, not judged: they are the baseline the pre-warm removes."""
    from vkprovider.testing.kueue import KueueError

    logging.getLogger("vkprovider.testing.loadgen").setLevel(logging.WARNING)
    try:
        mode, note, home = choose_mode(kueue)
    except KueueError as exc:
        sys.stderr.write(f"vkprovider demo: error: --kueue: {exc}\n")
        return 1
    if note:
        sys.stdout.write(note + "\n")
    try:
        result = await run_story(narrate=True, keep=keep, mode=mode, kueue_home=home)
    except KueueError as exc:
        sys.stderr.write(f"vkprovider demo: error: {exc}\n")
        return 1
    return 0 if result.ok else 1

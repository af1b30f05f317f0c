"""``vkprovider dev up``: the whole system on one machine, to try by hand with kubectl.

Why it exists: a platform engineer should get a working system in one command, point kubectl at
it, try a burst, and stop everything with Ctrl-C, leaving nothing behind. ``dev up`` starts, with
progress on stdout:

1. a real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) on
   loopback and a fake kubelet for ``--gpu-nodes`` simulated internal GPU nodes;
2. the CRDs (``manifests/crds``) and the RBAC from ``manifests/base``;
3. a mock GPU cloud, declared to the cluster as the GPUProvider ``mock``;
4. ``vkprovider run`` for the virtual node ``vk-gpu-burst`` (with its ServiceAccount's token; the
   kubelet API trusts the cluster CA, so ``kubectl logs`` works on cloud pods) and the companion
   (``vkprovider descheduler``, with its own ServiceAccount's token);

then prints what to export and what to try. ``--real-node`` (as root) also joins a real worker
node to the control plane, :class:`~vkprovider.testing.realnode.RealNode` (containerd, kubelet,
kube-proxy in a network namespace of their own, no route off the machine), so ``kubectl run``
starts a real container beside the virtual node; Ctrl-C removes it with everything else (no
process, mount, network namespace, route or iptables rule of it is left).
``--cluster-only`` stops after step 2, for running
the provider yourself. ``--kubeconfig-out PATH`` also writes the admin kubeconfig to ``PATH``, once
everything is ready, so a script (or another terminal) can wait for that file. Ctrl-C or SIGTERM
stops every process, removes the kubeconfig copy and the temporary files, and exits 0; a process
of the system that dies on its own stops everything, with its last log lines, and exits 1.

Traffic is real on the lab network: internal pods (the fake kubelet) and cloud instances (the
mock cloud) get virtual addresses (10.244.x.y, 198.18.x.y) that nothing on the machine routes,
each served by a real listener on loopback; one *address map* (``LocalCluster.address_map_dir``,
see :mod:`vkprovider.probing.dialing`) says where, as kube-proxy's DNAT would. The fake kubelet and
the mock cloud publish their routes there (each cloud with its own public address block), the
provider's probes dial through it (``pods.probe_address_map``), and so can users: ``vkprovider
dev curl NS/SERVICE/PATH`` (with ``VKP_ADDRESS_MAP``, whose value ``dev up`` prints).

The building blocks are :mod:`vkprovider.testing` (the cluster, the harness processes) and the
narrator of :mod:`vkprovider.demo`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vkprovider.errors import VKError, one_line
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.logs import kv
from vkprovider.storyreport import Narrator
from vkprovider.testing.cluster import REPO_ROOT, LocalCluster
from vkprovider.testing.fakekubelet import create_gpu_nodes
from vkprovider.testing.harness import (
    CompanionProcess,
    MockCloudProcess,
    ProviderProcess,
    install_crds,
    install_provider_rbac,
    service_account_kubeconfig,
)
from vkprovider.testing.realnode import BUSYBOX_IMAGE, TAINT, RealNode, RealNodeError, preflight

log = logging.getLogger(__name__)

NODE = "vk-gpu-burst"
CLOUD = "mock"  # the mock cloud's name and its GPUProvider's
NAMESPACE = "vkprovider-system"
REAL_NODE = "real-node"  # --real-node: the real worker node's name
DEFAULT_INVENTORY = "H100:us-east:8:2.49,H100:eu-west:8:2.19,A100:us-east:8:1.29"
EXAMPLE_POLICY = REPO_ROOT / "manifests" / "examples" / "overflowpolicy-dev-mock.yaml"
ADDRESS_MAP_EXT = "vkprovider.io/address-map"  # in --kubeconfig-out: where dev curl dials
READY_TIMEOUT = 120.0  # seconds for the virtual node and the GPUProvider to become Ready


class DevEnvError(VKError):
    """``dev up`` could not bring the system up, or a process of it stopped on its own."""


@dataclass(frozen=True, kw_only=True)
class DevOptions:
    """What ``vkprovider dev up`` was asked for (its flags)."""

    gpu_nodes: int = 2
    gpus_per_node: int = 4
    cluster_only: bool = False
    kubeconfig_out: Path | None = None
    inventory: str = DEFAULT_INVENTORY
    kueue: bool = False  # also real Kueue (vkprovider.testing.kueue; VKP_KUEUE_BIN)
    real_node: bool = False  # also a real worker node (vkprovider.testing.realnode; root)


def shown_path(path: Path, *, cwd: Path | None = None) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    base = (cwd or Path.cwd()).resolve()
    full = path.resolve()
    return str(full.relative_to(base)) if full.is_relative_to(base) else str(full)


def offers(inventory: str) -> str:
    """``TYPE:REGION:COUNT:PRICE[,...]`` (already checked) as the mock cloud says it."""
    out = []
    for entry in filter(None, (e.strip() for e in inventory.split(","))):
        gpu_type, region, count, price = entry.split(":")
        out.append(f"{count} {gpu_type} in {region} at ${float(price):g}/GPU-h")
    return ", ".join(out)


def example_deployment(*, replicas: int, namespace: str = "dev") -> str:
    """A Deployment of ``replicas`` one-GPU pods (YAML): more than the internal GPUs hold."""
    return f"""\
apiVersion: apps/v1
kind: Deployment
metadata: {{name: llm, namespace: {namespace}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: llm}}}}
  template:
    metadata:
      labels: {{app: llm}}
      annotations: {{vkprovider.io/gpu-type: H100}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: server
          image: vllm/vllm-openai:v0.6
          resources: {{limits: {{nvidia.com/gpu: 1}}}}
"""


def real_pod_command(*, name: str = "hello") -> str:
    """``kubectl run`` of a busybox pod on the real node: the image imported into its
    containerd (never pulled), placed by name (the node's taint keeps the scheduler's pods off
    it, and the fake kubelet's GPU nodes would take them)."""
    return (f"kubectl run {name} --image={BUSYBOX_IMAGE} --image-pull-policy=Never "
            f"""--overrides='{{"spec": {{"nodeName": "{REAL_NODE}"}}}}' --command -- sleep 3600""")


def try_it(*, kubeconfig: str, options: DevOptions, deployment: str, policy: str) -> str:
    """The closing text: what to export and what to try; every command runs as printed, in
    order (docs/quickstart.md walks through the same commands)."""
    internal = options.gpu_nodes * options.gpus_per_node
    lines = ["", "In another terminal:", "", f"    export KUBECONFIG={kubeconfig}",
             "    kubectl get nodes"]
    if options.real_node:
        lines += [f"    {real_pod_command()}   # a real container on {REAL_NODE}",
                  "    kubectl wait --for=condition=Ready pod/hello --timeout=60s",
                  "    kubectl exec hello -- uname -n",
                  "    kubectl delete pod hello --wait=false"]
    if options.cluster_only:
        lines += ["", "No cloud, provider or companion runs (--cluster-only): run "
                  "`vkprovider mock-cloud` and `vkprovider run` yourself (docs/quickstart.md)."]
    else:
        lines += [
            "    kubectl get gpup,ofp",
            "    kubectl create namespace dev",
            f"    kubectl apply -f {policy}",
            f"    kubectl apply -f {deployment}   # {internal + 2} x 1 GPU; {internal} fit inside",
            "    kubectl -n dev rollout status deployment/llm --timeout=120s",
            "    kubectl -n dev get pods -o wide",
            "    kubectl get gpup,ofp",
            "    kubectl -n dev get events --field-selector reason=OverflowAdmitted",
            "    kubectl -n dev logs $(kubectl -n dev get pods -o name --field-selector "
            f"spec.nodeName={NODE} | head -1)",
            "    kubectl patch ofp dev-mock --type=merge -p "
            """'{"spec": {"moveBack": {"stableFor": "10s"}}}'""",
            f"    kubectl -n dev scale deployment llm --replicas={internal}",
            "    kubectl wait --for=jsonpath='{.status.externalPods}'=0 ofp/dev-mock "
            "--timeout=180s",
            "    kubectl -n dev get events --field-selector reason=MovedBack",
            "    kubectl -n dev get pods -o wide",
        ]
    if options.kueue:
        lines += ["    kubectl get resourceflavors,clusterqueues,localqueues,workloads -A"]
    lines += ["", "Ctrl-C stops everything."]
    return "\n".join(lines) + "\n"


class DevEnv:
    """The processes and files of one ``dev up``: :meth:`start`, :meth:`check`, :meth:`stop`."""

    def __init__(self, *, options: DevOptions, narrator: Narrator) -> None:
        self.options = options
        self.n = narrator
        self.cluster = LocalCluster()
        self.work = self.cluster.work_dir  # everything lands here; removed by stop()
        self.cloud: MockCloudProcess | None = None
        self.provider: ProviderProcess | None = None
        self.companion: CompanionProcess | None = None
        self.node: RealNode | None = None
        self.deployment_file = self.work / "try" / "llm-deployment.yaml"
        self.wrote_kubeconfig = False

    # ---- start -------------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        except RuntimeError as exc:  # the harness's "did not start" / "not Established"
            raise DevEnvError(str(exc)) from exc

    async def _start(self) -> None:
        opts = self.options
        bins: Path | None = None
        if opts.real_node:  # root, the host tools, the node binaries: before anything starts
            try:
                bins = await asyncio.to_thread(preflight)
            except RealNodeError as exc:
                raise DevEnvError(f"--real-node: {one_line(str(exc))}") from exc
        if opts.kubeconfig_out is not None:  # it appears again only once everything is ready
            with contextlib.suppress(FileNotFoundError):
                opts.kubeconfig_out.unlink()
        self.n.say("starting the control plane: etcd, kube-apiserver, kube-controller-manager, "
                   "kube-scheduler ...")
        await self.cluster.start()
        self._start_fake_kubelet()
        self.n.say(f"control plane ready at {self.cluster.server}")
        self.n.say(f"lab network: pods and cloud instances get virtual addresses served on "
                   f"loopback through the address map {self.network} (export "
                   f"VKP_ADDRESS_MAP={self.network} for `vkprovider dev curl`)")
        async with self.cluster.client() as kube:
            names = [f"gpu-node-{i}" for i in range(opts.gpu_nodes)]
            await create_gpu_nodes(kube=kube, names=names, gpus=opts.gpus_per_node)
            self.n.say(f"{opts.gpu_nodes} simulated internal GPU nodes x {opts.gpus_per_node} "
                       f"nvidia.com/gpu{': ' + ', '.join(names) if names else ''}")
            if bins is not None:
                await self._start_real_node(bins)
            crds = await install_crds(kube)
            provider_config = await install_provider_rbac(
                kube=kube, cluster=self.cluster, path=self.work / "provider.kubeconfig")
            self.n.say(f"CRDs {', '.join(crds)}; namespace {NAMESPACE} and RBAC from "
                       "manifests/base")
            if opts.kueue:  # imported here: vkprovider.testing.kueue also holds a pytest fixture
                from vkprovider.testing.kueue import KUEUE_VERSION, KueueManager

                kueue = KueueManager(cluster=self.cluster)  # cluster.stop() ends it
                self.n.say(f"starting Kueue {KUEUE_VERSION}: its CRDs, its manager, then "
                           f"waiting until its webhooks answer (about 20-30 s on 2 cores) ...")
                await kueue.start()
                self.n.say(f"Kueue {KUEUE_VERSION}: its CRDs, the manager, its webhooks at "
                           f"{kueue.url} (signed by the cluster CA)")
            if not opts.cluster_only:
                await self._start_system(kube=kube, provider_config=provider_config)
        if opts.kubeconfig_out is not None:
            write_private(path=opts.kubeconfig_out,
                          text=with_address_map(self.cluster.kubeconfig.read_text(),
                                                address_map=self.network))
            self.wrote_kubeconfig = True

    async def _start_real_node(self, bins: Path) -> None:
        """A real worker node joined to the control plane (stopped by :meth:`stop`)."""
        self.n.say("starting a real worker node: containerd, kubelet and kube-proxy in a network "
                   "namespace of their own, with no route off the machine ...")
        node = self.node = RealNode(cluster=self.cluster, name=REAL_NODE, bin_dir=bins)
        await node.start()  # stops what it started if it fails
        self.n.say(f"real node {node.name} Ready in {node.timings['ready']:.1f}s: network "
                   f"namespace {node.netns} (link {node.host_if}, pods {node.pod_cidr}), "
                   f"cgroups under {node.cgroup_root}, its files in {node.work_dir}; images "
                   f"imported offline ({BUSYBOX_IMAGE}); "
                   f"tainted {TAINT['key']}={TAINT['value']}:{TAINT['effect']}, so a pod goes "
                   "there by name")

    # ---- the lab network: every process that serves or dials a replica shares one map -------

    @property
    def network(self) -> Path:
        """The address map of this lab network (a directory; see the module's docstring)."""
        return self.cluster.address_map_dir

    def _start_fake_kubelet(self) -> None:
        """Internal pods become real listeners behind their virtual addresses, Ready by probe."""
        self.cluster.start_fake_kubelet(address_map_dir=self.network)

    def cloud_process(self, *, index: int = 0) -> MockCloudProcess:
        """The mock cloud, its instances' listeners routed from public block ``index`` (every
        cloud on one lab network needs its own, so two never publish one address)."""
        return MockCloudProcess(work_dir=self.cluster.log_dir, name=CLOUD, boot_delay=1.0,
                                inventory=self.options.inventory, address_map_dir=self.network,
                                public_block=index)

    def provider_process(self, *, kubeconfig: Path) -> ProviderProcess:
        """``vkprovider run`` for the virtual node; its probes dial through the address map."""
        return ProviderProcess(
            work_dir=self.cluster.log_dir, kubeconfig=kubeconfig, node_name=NODE,
            clouds=[], config_providers=False, client_ca_file=self.cluster.ca_path,
            node={"internal_ip": "127.0.0.1"}, pods={"probe_address_map": str(self.network)},
            extra={"gpu_providers": {"status_interval_seconds": 1}})  # kubectl get gpup: fresh

    async def _start_system(self, *, kube: KubeClient, provider_config: Path) -> None:
        cloud = self.cloud = self.cloud_process(index=0)
        await cloud.start()
        await _create_or_replace_gpuprovider(kube=kube, name=CLOUD, spec={
            "type": "mock", "endpoint": cloud.url})
        self.n.say(f"mock cloud at {cloud.url}, selling {offers(self.options.inventory)}; "
                   f"declared as GPUProvider {CLOUD}")
        companion_config = await service_account_kubeconfig(
            kube=kube, cluster=self.cluster, namespace=NAMESPACE, name="vkprovider-companion",
            path=self.work / "companion.kubeconfig")
        provider = self.provider = self.provider_process(kubeconfig=provider_config)
        provider.start()
        self.n.say(f"vkprovider run: virtual node {NODE}, kubelet API on "
                   f"127.0.0.1:{provider.kubelet_port} (trusts the cluster CA: kubectl logs "
                   f"works), metrics on 127.0.0.1:{provider.metrics_port}")
        companion = self.companion = CompanionProcess(
            work_dir=self.cluster.log_dir, kubeconfig=companion_config, node_name=NODE,
            interval=1.0, move_back_interval=2.0)
        companion.start()
        self.n.say(f"vkprovider descheduler (the companion) for {NODE}")
        await self._wait_ready(kube)

    async def _wait_ready(self, kube: KubeClient) -> None:
        async def node_ready() -> tuple[bool, str]:
            self.check()
            try:
                node = await kube.get(f"/api/v1/nodes/{NODE}")
            except NotFoundError:
                return False, "registering"
            status = node.get("status") or {}
            gpus = (status.get("allocatable") or {}).get("nvidia.com/gpu", "0")
            ready = _condition(status, "Ready")
            return ready == "True" and gpus != "0", f"Ready={ready}, nvidia.com/gpu={gpus}"

        async def provider_ready() -> tuple[bool, str]:
            self.check()
            obj = await kube.get(f"/apis/vkprovider.io/v1alpha1/gpuproviders/{CLOUD}")
            status = obj.get("status") or {}
            ready = _condition(status, "Ready")
            return ready == "True", f"Ready={ready}, health={status.get('health', '-')}"

        try:
            await self.n.until(f"virtual node {NODE}", node_ready, timeout=READY_TIMEOUT)
            await self.n.until(f"GPUProvider {CLOUD}", provider_ready, timeout=READY_TIMEOUT)
        except TimeoutError as exc:
            raise DevEnvError(f"{exc}\n{self._tails()}") from exc

    # ---- while up ----------------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`DevEnvError` (with its last log lines) if a process stopped."""
        named = [(c.name, c) for c in self.cluster.components.values()]
        named += [(p.component.name, p.component)
                  for p in (self.cloud, self.provider, self.companion) if p is not None]
        if self.node is not None:
            named += [(f"{self.node.name}'s {c.name}", c) for c in self.node.components.values()]
        for name, comp in named:
            if comp.process is not None and not comp.alive():
                raise DevEnvError(f"{name} exited with status {comp.process.returncode}; its "
                                  f"last log lines:\n{comp.tail(20)}")

    def _tails(self) -> str:
        parts = [f"--- {p.component.name}\n{p.component.tail(15)}"
                 for p in (self.provider, self.companion) if p is not None]
        return "\n".join(parts)

    # ---- stop --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every process (in reverse order of start) and remove every file we wrote."""
        for proc in (self.companion, self.provider, self.cloud):
            if proc is not None:
                try:
                    proc.stop()
                except Exception as exc:  # keep stopping the rest
                    log.warning("stopping a process failed",
                                extra=kv(process=proc.component.name, error=str(exc)))
        if self.node is not None:  # before the control plane: it unpublishes its API slice
            self.node.stop()
        self.cluster.stop()
        if self.wrote_kubeconfig and self.options.kubeconfig_out is not None:
            with contextlib.suppress(FileNotFoundError):
                self.options.kubeconfig_out.unlink()


def with_address_map(kubeconfig: str, *, address_map: Path) -> str:
    """``kubeconfig`` with the lab network's address map recorded as an extension of each
    cluster (``vkprovider.io/address-map``; kubectl keeps extensions it does not know, as
    minikube's), so that ``vkprovider dev curl`` finds the map with this kubeconfig alone."""
    doc = yaml.safe_load(kubeconfig)
    for entry in doc.get("clusters") or []:
        cluster = entry.setdefault("cluster", {})
        kept = [e for e in cluster.get("extensions") or [] if e.get("name") != ADDRESS_MAP_EXT]
        cluster["extensions"] = [*kept, {"name": ADDRESS_MAP_EXT,
                                         "extension": {"path": str(address_map)}}]
    return str(yaml.safe_dump(doc, sort_keys=False))


def address_map_of(kubeconfig: Path) -> str | None:
    """The address map ``dev up`` recorded in ``kubeconfig`` (:func:`with_address_map`), if
    any. Nothing else of the file is used; an unreadable file is no answer, not an error (the
    kubeconfig's own loader reports what is wrong with it)."""
    try:
        doc = yaml.safe_load(kubeconfig.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None
    for entry in doc.get("clusters") or []:
        cluster = entry.get("cluster") if isinstance(entry, dict) else None
        for ext in (cluster or {}).get("extensions") or []:
            if isinstance(ext, dict) and ext.get("name") == ADDRESS_MAP_EXT:
                path = (ext.get("extension") or {}).get("path")
                if isinstance(path, str) and path:
                    return path
    return None


def write_private(*, path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) in one rename, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


async def _create_or_replace_gpuprovider(*, kube: KubeClient, name: str,
                                         spec: dict[str, Any]) -> None:
    path = "/apis/vkprovider.io/v1alpha1/gpuproviders"
    body = {"apiVersion": "vkprovider.io/v1alpha1", "kind": "GPUProvider",
            "metadata": {"name": name}, "spec": spec}
    try:
        await kube.create(path, body)
    except ConflictError:
        await kube.patch(f"{path}/{name}", {"spec": spec}, patch_type="merge")


def _condition(status: dict[str, Any], kind: str) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return "-"


async def _until_stopped(*, env: DevEnv, stop: asyncio.Event, interval: float = 1.0) -> None:
    """Return when ``stop`` is set; raise :class:`DevEnvError` when a process dies first."""
    while not stop.is_set():
        env.check()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


def _write(text: str) -> None:
    """Plain text on stdout; a closed pipe must not stop the shutdown."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(text)
        sys.stdout.flush()


async def run_dev_up(*, options: DevOptions,
                     signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM)) -> int:
    """Bring the system up, print what to try, run until a signal (0) or a failure (1)."""
    n = Narrator()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    env = DevEnv(options=options, narrator=n)
    code = 0
    try:
        starting = asyncio.create_task(env.start(), name="dev-up")
        stopping = asyncio.create_task(stop.wait(), name="dev-up-signal")
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():  # Ctrl-C while starting
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, VKError, APIError, OSError):
                await starting
            return 0
        starting.result()
        internal = options.gpu_nodes * options.gpus_per_node
        if not options.cluster_only:
            write_private(path=env.deployment_file,
                          text=example_deployment(replicas=internal + 2))
        kubeconfig = (options.kubeconfig_out or env.cluster.kubeconfig).resolve()
        n.say("ready")
        _write(try_it(kubeconfig=str(kubeconfig), options=options,
                      deployment=shown_path(env.deployment_file),
                      policy=shown_path(EXAMPLE_POLICY)))
        await _until_stopped(env=env, stop=stop)
    except VKError as exc:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"vkprovider dev up: error: {exc}\n")
            sys.stderr.flush()
        code = 1
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        _write("stopping ...\n")
        env.stop()
        _write("stopped; nothing left running.\n")
    return code

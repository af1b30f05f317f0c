"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler.

Why it exists: tests must exercise the real API server's semantics (field selectors, patches,
preemption, ReplicaSet behaviour, RBAC), which no fake reproduces. One ``LocalCluster`` serves a
whole test run; tests isolate by namespace.

The binaries come from ``tools/controlplane/build.sh`` (cached by a hash of its inputs) or from the
folder named by ``VKP_CONTROLPLANE_BIN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import yaml

from vkprovider.errors import VKError
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.logs import kv
from vkprovider.semantics.timefmt import format_time
from vkprovider.testing import workers
from vkprovider.testing.pki import CertificateAuthority, service_account_keys

log = logging.getLogger(__name__)

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
REPO_ROOT = Path(__file__).resolve().parents[2]


class ControlPlaneError(VKError):
    """The local control plane could not be built, started or made ready."""


def find_binaries() -> Path:
    """The folder holding the four binaries: ``VKP_CONTROLPLANE_BIN``, else build (cached)."""
    env = os.environ.get("VKP_CONTROLPLANE_BIN")
    if env:
        folder = Path(env)
    else:
        script = REPO_ROOT / "tools" / "controlplane" / "build.sh"
        if not script.exists():
            raise ControlPlaneError(
                "no control plane binaries: set VKP_CONTROLPLANE_BIN or run from a checkout "
                "that has tools/controlplane/build.sh"
            )
        done = subprocess.run(["bash", str(script)], check=False, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise ControlPlaneError(f"{script} failed with exit code {done.returncode}")
        folder = Path(done.stdout.strip().splitlines()[-1])
    missing = [c for c in COMPONENTS if not (folder / c).is_file()]
    if missing:
        raise ControlPlaneError(f"{folder} lacks {', '.join(missing)}")
    return folder


_HANDED_OUT: set[int] = set()


def _ephemeral_start() -> int:
    """Where the kernel starts picking source ports for outbound connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port free now, for a process started later to listen on.

    Picked below the kernel's ephemeral range: a port the kernel hands out itself (``bind(0)``)
    can be taken as the source port of any outbound connection before the process binds it, and
    the processes under test open many (a demo run lost its provider to "Address already in
    use" that way). Ports are not handed out twice by one process, nor by two pytest-xdist
    workers (each picks from its own slice: vkprovider.testing.workers).
    """
    high = min(_ephemeral_start(), 65536)
    low, high = workers.port_range(low=max(1024, high - 12000), high=high)
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise ControlPlaneError(f"no free loopback port in {low}-{high - 1}")


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, *, env: dict[str, str] | None = None) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() kills every child
            env=env,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, *, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            _kill_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL, as a crash would (for chaos tests)."""
        if self.process is not None and self.process.poll() is None:
            _kill_group(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _pid(comp: Component) -> int | None:
    if isinstance(comp, AdoptedComponent):
        return comp.pid
    return None if comp.process is None else comp.process.pid


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


@dataclass
class AdoptedComponent(Component):
    """A component another process of this run started: the pytest-xdist worker that started
    the run's shared cluster (vkprovider.testing.plugin). Known by its pid, which leads its own
    process group (``start_new_session``); not this process's child, so it is watched and
    stopped by signals, never waited for."""

    pid: int = 0

    def start(self, *, env: dict[str, str] | None = None) -> None:
        raise ControlPlaneError(f"{self.name} was started by another process; it is not "
                                "restarted from here")

    def alive(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")  # a zombie has ended; its parent just has not reaped it

    def stop(self, *, timeout: float = 10.0) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.alive():
                return
            _kill_group(self.pid, sig)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)

    def kill(self) -> None:
        if self.alive():
            _kill_group(self.pid, signal.SIGKILL)


class LocalCluster:
    """Start with ``await cluster.start()``; stop with ``cluster.stop()`` (always, in finally)."""

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        log_dir: Path | None = None,
        extra_components: tuple[tuple[str, list[str]], ...] = (),
    ) -> None:
        self.bin_dir = bin_dir
        self.work_dir = Path(tempfile.mkdtemp(prefix="vkp-cluster-"))
        self.log_dir = log_dir or self.work_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.pki_dir = self.work_dir / "pki"
        self.pki_dir.mkdir()
        self.kubeconfig = self.work_dir / "kubeconfig"
        #: The lab network's one address map (vkprovider.probing.dialing): every writer (fake
        #: kubelet, mock clouds) publishes its routes here; created by the first writer.
        self.address_map_dir = self.work_dir / "addressmap"
        self.api_port = 0
        self.server = ""
        self.components: dict[str, Component] = {}
        self._extra = extra_components

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, timeout: float = 120.0) -> None:
        try:
            bins = self.bin_dir or find_binaries()
            self._write_pki()
            self._define(bins)
            deadline = time.monotonic() + timeout
            self.components["etcd"].start()
            await self._wait(lambda: self._etcd_healthy(), "etcd /health", deadline)
            self.components["kube-apiserver"].start()
            await self._wait_api(deadline)
            for name, comp in self.components.items():
                if name not in ("etcd", "kube-apiserver"):
                    comp.start(env=self._child_env())
            await self._wait_settled(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self, *, keep_work_dir: bool = False) -> None:
        for name in reversed(list(self.components)):
            self.components[name].stop()
        if not keep_work_dir:  # logs survive only when log_dir was given (outside work_dir)
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def start_component(self, *, name: str, argv: list[str]) -> Component:
        """Start another process beside the control plane (fake kubelet, provider, ...).

        It gets ``KUBECONFIG`` for the admin user, its log lands in ``log_dir`` and ``stop()``
        ends it with the rest.
        """
        comp = Component(name=name, argv=argv, log_path=self.log_dir / f"{name}.log")
        self.components[name] = comp
        comp.start(env=self._child_env())
        return comp

    def start_fake_kubelet(self, *, start_delay: float = 0.5, max_grace: float = 2.0,
                           address_map_dir: Path | None = None) -> Component:
        """Start :mod:`vkprovider.testing.fakekubelet` for the simulated internal GPU nodes.

        With ``address_map_dir`` (e.g. :attr:`address_map_dir`), pods get real loopback
        listeners routed from their virtual addresses there, and readiness probes are run;
        per-pod counters: :func:`vkprovider.testing.fakekubelet.read_counters`."""
        argv = [sys.executable, "-m", "vkprovider.testing.fakekubelet",
                f"--kubeconfig={self.kubeconfig}", f"--start-delay={start_delay}",
                f"--max-grace={max_grace}"]
        if address_map_dir is not None:
            argv.append(f"--address-map-dir={address_map_dir}")
        return self.start_component(name="fake-kubelet", argv=argv)

    def pids(self) -> list[int]:
        return [pid for c in self.components.values() if (pid := _pid(c)) is not None]

    # ---- one cluster for several processes (pytest-xdist workers) -------------------------------

    def save(self, path: Path) -> None:
        """Write what another process needs to :meth:`adopt` this running cluster to ``path``."""
        state = {
            "work_dir": str(self.work_dir), "log_dir": str(self.log_dir),
            "api_port": self.api_port, "etcd_url": self.etcd_url,
            "components": {name: {"pid": pid, "argv": c.argv, "log": str(c.log_path)}
                           for name, c in self.components.items()
                           if (pid := _pid(c)) is not None},
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)

    @classmethod
    def adopt(cls, path: Path) -> LocalCluster:
        """The cluster :meth:`save` described, as this process's own: clients, certificates,
        component logs, and :meth:`stop`, which ends its processes by their process groups."""
        state = json.loads(path.read_text())
        cluster = cls.__new__(cls)
        cluster.bin_dir = None
        cluster.work_dir = Path(state["work_dir"])
        cluster.log_dir = Path(state["log_dir"])
        cluster.pki_dir = cluster.work_dir / "pki"
        cluster.kubeconfig = cluster.work_dir / "kubeconfig"
        cluster.address_map_dir = cluster.work_dir / "addressmap"
        cluster.api_port = int(state["api_port"])
        cluster.server = f"https://127.0.0.1:{cluster.api_port}"
        cluster.etcd_url = str(state["etcd_url"])
        cluster._extra = ()
        cluster.ca = CertificateAuthority.load(directory=cluster.pki_dir)
        cluster.ca_path = cluster.ca.cert_path
        cluster.ca_key_path = cluster.ca.key_path
        cluster.components = {
            name: AdoptedComponent(name=name, argv=list(c["argv"]), log_path=Path(c["log"]),
                                   pid=int(c["pid"]))
            for name, c in state["components"].items()}
        return cluster

    def client(self) -> KubeClient:
        """An admin (system:masters) client; the caller closes it."""
        return KubeClient.from_kubeconfig(kubeconfig=str(self.kubeconfig))

    def restart_apiserver(self) -> None:
        """Stop and start kube-apiserver (watches must recover). Synchronous; then wait_ready()."""
        api = self.components["kube-apiserver"]
        api.stop()
        api.start()

    async def wait_ready(self, *, timeout: float = 60.0) -> None:
        await self._wait_api(time.monotonic() + timeout)

    def write_token_kubeconfig(self, *, path: Path, token: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        self._write_kubeconfig(path=path, user={"token": token})
        return path

    # ---- internals ---------------------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def _write_pki(self) -> None:
        ca = CertificateAuthority(directory=self.pki_dir)
        self.ca_path = ca.cert_path
        self.ca_key_path = ca.key_path
        self.serving = ca.issue(
            stem="apiserver",
            common_name="kube-apiserver",
            server=True,
            hosts=(
                "127.0.0.1",
                "localhost",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        self.admin = ca.issue(
            stem="admin", common_name="admin", organization="system:masters", client=True
        )
        self.kubelet_client = ca.issue(
            stem="apiserver-kubelet-client",
            common_name="kube-apiserver-kubelet-client",
            organization="system:masters",
            client=True,
        )
        self.sa = service_account_keys(directory=self.pki_dir)
        self.ca = ca
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self._write_kubeconfig(
            path=self.kubeconfig,
            user={
                "client-certificate": str(self.admin.cert),
                "client-key": str(self.admin.key),
            },
        )

    def _write_kubeconfig(self, *, path: Path, user: dict[str, str]) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def _define(self, bins: Path) -> None:
        pki = self.pki_dir
        etcd_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        kc = str(self.kubeconfig)

        def comp(name: str, argv: list[str]) -> None:
            self.components[name] = Component(
                name=name, argv=argv, log_path=self.log_dir / f"{name}.log"
            )

        comp(
            "etcd",
            [
                str(bins / "etcd"),
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=4294967296",
            ],
        )
        comp(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={self.serving.cert}",
                f"--tls-private-key-file={self.serving.key}",
                f"--client-ca-file={self.ca_path}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.sa.cert}",
                f"--service-account-signing-key-file={self.sa.key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                f"--kubelet-client-certificate={self.kubelet_client.cert}",
                f"--kubelet-client-key={self.kubelet_client.key}",
                "--kubelet-preferred-address-types=InternalIP",
                # 1.37 refuses a loopback advertise address with the endpoint reconciler
            "--endpoint-reconciler-type=none",
            "--profiling=false",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                "--v=1",
            ],
        )
        comp(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kc}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--service-account-private-key-file={self.sa.key}",
                f"--root-ca-file={self.ca_path}",
                "--use-service-account-credentials=false",
                "--controllers=*",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )
        comp(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={kc}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )
        for name, argv in self._extra:
            comp(name, argv)

    async def _wait(self, probe: Callable[[], Awaitable[bool]], what: str, deadline: float) -> None:
        while True:
            self._check_alive()
            try:
                if await probe():
                    return
            except (APIError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {what}\n{self._tails()}")
            await asyncio.sleep(0.2)

    async def _etcd_healthy(self) -> bool:
        host, port = self.etcd_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /health HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        data = await reader.read()
        writer.close()
        return b'"health":"true"' in data

    async def _wait_api(self, deadline: float) -> None:
        async with self.client() as kube:

            async def ready() -> bool:
                try:
                    await kube.request("GET", "/readyz", retry=False)
                except APIError:
                    return False
                return True

            await self._wait(ready, "kube-apiserver /readyz", deadline)

    async def _wait_settled(self, deadline: float) -> None:
        """The controller-manager made the default ServiceAccount; the scheduler binds a pod."""
        async with self.client() as kube:

            async def has_default_sa() -> bool:
                try:
                    await kube.get("/api/v1/namespaces/default/serviceaccounts/default")
                except NotFoundError:
                    return False
                return True

            await self._wait(
                has_default_sa, "the default ServiceAccount (controller-manager)", deadline
            )
            await self._probe_scheduler(kube, deadline)

    async def _probe_scheduler(self, kube: KubeClient, deadline: float) -> None:
        node = "vkp-scheduler-probe"
        taint = {"key": "vkprovider.io/probe", "value": "true", "effect": "NoSchedule"}
        await kube.create(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {"vkprovider.io/probe": "true"}},
                "spec": {"taints": [taint]},
            },
        )
        await kube.patch(
            f"/api/v1/nodes/{node}/status",
            {
                "status": {
                    "capacity": {"cpu": "1", "memory": "1Gi", "pods": "1"},
                    "allocatable": {"cpu": "1", "memory": "1Gi", "pods": "1"},
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "Probe",
                            "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now(),
                        }
                    ],
                }
            },
        )
        await kube.create(
            "/api/v1/namespaces/default/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "vkp-scheduler-probe"},
                "spec": {
                    "containers": [{"name": "c", "image": "probe"}],
                    "nodeSelector": {"vkprovider.io/probe": "true"},
                    "tolerations": [{"key": "vkprovider.io/probe", "operator": "Exists"}],
                },
            },
        )

        async def bound() -> bool:
            pod = await kube.get("/api/v1/namespaces/default/pods/vkp-scheduler-probe")
            return bool(pod["spec"].get("nodeName"))

        await self._wait(bound, "the scheduler to bind a probe pod", deadline)
        await kube.delete(
            "/api/v1/namespaces/default/pods/vkp-scheduler-probe", grace_period_seconds=0
        )
        await kube.delete(f"/api/v1/nodes/{node}")

    def _check_alive(self) -> None:
        for comp in self.components.values():
            if comp.process is not None and not comp.alive():
                raise ControlPlaneError(
                    f"{comp.name} exited with {comp.process.returncode}\n{comp.tail()}"
                )

    def _tails(self) -> str:
        return "\n".join(f"--- {c.name}\n{c.tail(20)}" for c in self.components.values())


def _now() -> str:
    return format_time(datetime.now(UTC))


def main() -> None:  # pragma: no cover - manual helper: python -m vkprovider.testing.cluster
    logging.basicConfig(level=logging.INFO)
    cluster = LocalCluster()

    async def run() -> None:
        await cluster.start()
        sys.stdout.write(f"export KUBECONFIG={cluster.kubeconfig}\n")
        sys.stdout.flush()
        while True:
            await asyncio.sleep(3600)

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        log.info("stopped", extra=kv(work_dir=str(cluster.work_dir)))


if __name__ == "__main__":  # pragma: no cover
    main()

"""A real worker node beside a :class:`LocalCluster`: containerd, runc, CNI, kubelet, kube-proxy.

Why it exists: the fake kubelet and the virtual node prove what the API server sees, not that a
pod really runs. This starts the real node agents (kubelet and kube-proxy built from the control
plane's Go module by ``tools/node/build.sh``; containerd, runc and the CNI plugins from Debian's
packages, ``tools/node/install-deps.sh``) so a test can run a container, read its logs, exec into
it and send Service traffic over a real network path.

The network is private: the node lives in a network namespace created here with ``ip netns``,
joined to the host by one veth pair whose host side carries only a ``/30`` link. The namespace
has no default route, so nothing a pod sends can leave the machine, and it forwards no
connection a pod opens towards the host's side of the link (only replies to connections the
host opened); the Service range exists only inside it. The node's pod range is a ``/24`` of
:data:`POD_CIDR` free on the host, and the host routes it over the link: the API server reaches
a pod's own kubelet API (a virtual kubelet's, for ``kubectl logs``) as it reaches a node's.
The kubelet reaches the API server (loopback of the host) through :func:`relay`, a process that
listens in the namespace and connects out from the host's loopback; pods reach it the same way,
at the ``kubernetes`` Service (an EndpointSlice naming the node's address, as a cluster's API
server publishes its own), so a pod's in-cluster client works as in any cluster. :func:`dns`
answers the pods' lookups of ``<service>.<namespace>.svc.cluster.local`` from the API server's
Services (the cluster DNS of a real cluster); any other name is NXDOMAIN, nothing is forwarded.
The API server reaches the kubelet (logs, exec) over the veth link.

The kubelet, containerd and kube-proxy also share a mount namespace of their own (held by a
sleeping ``unshare`` process): the fixed host paths they write whatever their flags say
(/var/lib/kubelet, /run/containerd, /var/lib/cni, /var/log/containers) are this node's folders in
there, and the kernel tunables the kubelet would set for the whole machine (vm.overcommit_memory,
kernel.panic, kernel.panic_on_oops...) read as it wants them, so the shared host keeps its own.
Its other files (containerd's root, state and socket, the kubelet's root and pod logs, the CNI
config and IPAM state) live in one temporary folder, and the pods' cgroups under a cgroup root
of their own, so two nodes never share a path. :meth:`RealNode.stop` ends every process it
started by PID (containers by the PIDs in its cgroups, containerd shims by the socket they were
given), then the namespaces go, its cgroups and the folder are removed.

Images are built offline (``tools/node/oci_archive.py``) and imported with ``ctr``: the sandbox
("pause") image from ``tools/node/pause`` and :data:`BUSYBOX_IMAGE`, Debian's static busybox with
every applet linked into ``/bin``. No registry is ever contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import ctypes
import ipaddress
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml

from vkprovider.errors import VKError
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.logs import kv
from vkprovider.testing.cluster import REPO_ROOT, Component, LocalCluster

log = logging.getLogger(__name__)

PAUSE_IMAGE = "vkprovider.invalid/pause:1"
BUSYBOX_IMAGE = "vkprovider.invalid/busybox:1"
NODE_BINARIES = ("kubelet", "kube-proxy", "pause")
#: command or file -> what proves it is installed (tools/node/install-deps.sh installs them)
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "nsenter",
              "iptables", "conntrack")
CNI_BIN_DIR = Path("/usr/lib/cni")
BUSYBOX = Path("/bin/busybox")
#: every real node's pod range is a /24 of this, picked free on the host (which routes it to
#: the node); chosen apart from the harness's virtual ranges (100.64.0.0/10, 198.18.0.0/15),
#: the Service range (10.0.0.0/24) and link-local
POD_CIDR = "172.28.0.0/16"
#: the veth link between host and node is one /30 picked at random from here, unused on the host
LINK_POOL = ipaddress.IPv4Network("172.29.0.0/16")
#: where the kubelet and kube-proxy find the API server: the relay, on the namespace's loopback
RELAY_PORT = 6443
#: the cluster DNS on the node's address (kubelet clusterDNS)
DNS_PORT = 53
CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250
#: every real node registers with this taint: only pods that tolerate it (the real-node tests'
#: own) land there, never another test's pods on the shared cluster
TAINT = {"key": "vkprovider.io/real-node", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
              "effect": TAINT["effect"]}
_CLONE_NEWNET = 0x40000000


class RealNodeError(VKError):
    """The real node could not be prepared, started or made Ready."""


# ---- finding the pieces -----------------------------------------------------------------------


def _run(argv: list[str], *, what: str, timeout: float = 120.0) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if done.returncode != 0:
        raise RealNodeError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def _missing_host_tools() -> list[str]:
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    missing += [str(p) for p in (CNI_BIN_DIR / "bridge", CNI_BIN_DIR / "host-local", BUSYBOX)
                if not p.exists()]
    return missing


def ensure_host_tools() -> None:
    """containerd, runc, CNI plugins, iptables, busybox...: install-deps.sh installs the missing."""
    if not _missing_host_tools():
        return
    script = REPO_ROOT / "tools" / "node" / "install-deps.sh"
    if not script.exists():
        raise RealNodeError(f"missing {', '.join(_missing_host_tools())} and no {script}")
    done = subprocess.run(["bash", str(script)], check=False)
    if done.returncode != 0 or _missing_host_tools():
        raise RealNodeError(f"{script} left missing: {', '.join(_missing_host_tools())}")


def find_node_binaries() -> Path:
    """The folder holding kubelet, kube-proxy and pause: ``VKP_NODE_BIN``, else build (cached)."""
    env = os.environ.get("VKP_NODE_BIN")
    if env:
        folder = Path(env)
    else:
        script = REPO_ROOT / "tools" / "node" / "build.sh"
        if not script.exists():
            raise RealNodeError("no node binaries: set VKP_NODE_BIN or run from a checkout")
        done = subprocess.run(["bash", str(script)], check=False, stdout=subprocess.PIPE,
                              text=True)
        if done.returncode != 0:
            raise RealNodeError(f"{script} failed with exit code {done.returncode}")
        folder = Path(done.stdout.strip().splitlines()[-1])
    missing = [b for b in NODE_BINARIES if not (folder / b).is_file()]
    if missing:
        raise RealNodeError(f"{folder} lacks {', '.join(missing)}")
    return folder


def preflight(*, bin_dir: Path | None = None) -> Path:
    """Whether this process can start a real node, before anything starts: root (containerd,
    network namespaces, cgroups), the host tools (installed when missing) and the node
    binaries (``bin_dir``, else built or cached); returns the binaries' folder. A
    :class:`RealNodeError` of one line says what is missing."""
    if os.geteuid() != 0:
        raise RealNodeError("a real node needs root (containerd, network namespaces, cgroups): "
                            "run it with sudo")
    ensure_host_tools()
    folder = bin_dir or find_node_binaries()
    missing = [b for b in NODE_BINARIES if not (folder / b).is_file()]
    if missing:
        raise RealNodeError(f"{folder} lacks {', '.join(missing)}")
    return folder


def find_kubectl() -> Path:
    """kubectl of the control plane's version: ``VKP_KUBECTL_BIN``'s, else tools/kubectl's build."""
    folder = os.environ.get("VKP_KUBECTL_BIN")
    if not folder:
        script = REPO_ROOT / "tools" / "kubectl" / "build.sh"
        built = _run(["bash", str(script)], what=str(script), timeout=3600)
        folder = built.strip().splitlines()[-1]
    path = Path(folder) / "kubectl"
    if not path.is_file():
        raise RealNodeError(f"{folder} lacks kubectl")
    return path


def find_image_archive() -> Path:
    """The project's image as an OCI archive: ``VKP_IMAGE_ARCHIVE``, else tools/image/oci.sh's
    (cached; builds the root filesystem first if that is missing: root, mmdebstrap)."""
    return _archive("VKP_IMAGE_ARCHIVE", "oci.sh")


def find_gateway_image_archive() -> Path:
    """The traffic gateway's image (Debian's HAProxy) as an OCI archive:
    ``VKP_GATEWAY_IMAGE_ARCHIVE``, else tools/image/gateway.sh's (cached; root, mmdebstrap)."""
    return _archive("VKP_GATEWAY_IMAGE_ARCHIVE", "gateway.sh")


def _archive(variable: str, builder: str) -> Path:
    env = os.environ.get(variable)
    if env:
        path = Path(env)
    else:
        script = REPO_ROOT / "tools" / "image" / builder
        built = _run(["bash", str(script)], what=str(script), timeout=900)
        path = Path(built.strip().splitlines()[-1])
    if not path.is_file():
        raise RealNodeError(f"no image archive at {path} (tools/image/{builder} builds one)")
    return path


def image_name(archive: Path) -> str:
    """The reference an OCI archive's index names (``io.containerd.image.name``)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise RealNodeError(f"{archive} has no index.json")
        index = json.load(member)
    names = [m.get("annotations", {}).get("io.containerd.image.name")
             for m in index.get("manifests", [])]
    if len(names) != 1 or not names[0]:
        raise RealNodeError(f"{archive} names {names}, not one image")
    return str(names[0])


def read_tunables() -> dict[str, str]:
    """The host's values of the kernel tunables a kubelet sets (see KUBELET_TUNABLES)."""
    return {entry: (Path("/proc/sys") / entry).read_text().strip()
            for entry in KUBELET_TUNABLES}


def _busybox_applets() -> list[str]:
    out = _run([str(BUSYBOX), "--list"], what="busybox --list")
    return sorted({a for a in out.split() if a and "/" not in a and a != "busybox"})


# ---- the network ------------------------------------------------------------------------------


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address or a route in (to keep the link apart)."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _run(["ip", "-4", "-o", "addr", "show"], what="ip addr").splitlines():
        fields = line.split()
        if "inet" in fields:
            nets.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    for line in _run(["ip", "-4", "route", "show", "table", "all"], what="ip route").splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("default", "broadcast", "local", "unreachable", "multicast"):
            dest = line.split()[1] if len(line.split()) > 1 else ""
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dest, strict=False)
            if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                nets.append(net)
    return nets


def pick_link(pool: ipaddress.IPv4Network = LINK_POOL, prefix: int = 30) -> ipaddress.IPv4Network:
    """A /``prefix`` from ``pool`` (the veth link's /30 by default) that overlaps nothing on
    the host."""
    used = _host_networks()
    subnets = list(pool.subnets(new_prefix=prefix))
    for _ in range(100):
        link = random.choice(subnets)
        if not any(link.overlaps(net) for net in used):
            return link
    raise RealNodeError(f"no free /{prefix} in {pool} on this host")


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


async def relay(*, netns: str, listen_port: int, target_port: int,
                listen_host: str = "127.0.0.1") -> None:
    """Forward ``listen_host:listen_port`` inside ``netns`` to ``127.0.0.1:target_port`` here.

    The listening socket is opened after entering the namespace and the thread then returns to
    the host's, so connections accepted in there are forwarded from out here; bytes pass
    through untouched (TLS end to end between the node agents and the API server).
    """
    listener = in_netns(netns, lambda: socket.create_server((listen_host, listen_port)))

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, sock=listener)
    async with server:
        await server.serve_forever()


def in_netns(netns: str, make: Callable[[], socket.socket]) -> socket.socket:
    """A socket made inside ``netns``; the thread returns to its own namespace afterwards."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(netns)
        try:
            return make()
        finally:
            _setns(f"/proc/self/fd/{home}")
    finally:
        os.close(home)


def dns_answer(query: bytes, lookup: Callable[[str], str | None]) -> bytes | None:
    """The reply to one DNS query (RFC 1035): A records from ``lookup(name)`` (an IPv4 address
    or None); a name it does not know is NXDOMAIN, a known name asked for another type is an
    empty NOERROR (so resolvers asking A and AAAA together get the A). None: not a query."""
    if len(query) < 12:
        return None
    qid, flags, qdcount = int.from_bytes(query[0:2]), int.from_bytes(query[2:4]), \
        int.from_bytes(query[4:6])
    if flags & 0x8000 or qdcount != 1:
        return None
    labels, pos = [], 12
    while pos < len(query) and query[pos]:
        size = query[pos]
        if size & 0xC0 or pos + 1 + size > len(query):
            return None
        labels.append(query[pos + 1:pos + 1 + size].decode("ascii", "replace"))
        pos += 1 + size
    if pos + 5 > len(query):
        return None
    question = query[12:pos + 5]
    qtype = int.from_bytes(query[pos + 1:pos + 3])
    address = lookup(".".join(labels).lower())
    answers = b""
    rcode = 3 if address is None else 0
    if address is not None and qtype in (1, 255):  # A, ANY
        answers = (b"\xc0\x0c" + (1).to_bytes(2) + (1).to_bytes(2) + (5).to_bytes(4)
                   + (4).to_bytes(2) + ipaddress.IPv4Address(address).packed)
    reply_flags = 0x8000 | 0x0400 | (flags & 0x0100) | rcode  # QR, AA, RD echoed
    return (qid.to_bytes(2) + reply_flags.to_bytes(2) + (1).to_bytes(2)
            + (1 if answers else 0).to_bytes(2) + bytes(4) + question + answers)


def zone_lookup(zone: Path | None, name: str) -> str | None:
    """The address ``zone`` (lines ``NAME ADDRESS``; ``*.suffix`` matches every name under
    ``suffix``) gives ``name``, or None; read at each query (a test rewrites it as it goes)."""
    if zone is None:
        return None
    try:
        lines = zone.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        pattern, _, address = line.strip().partition(" ")
        pattern = pattern.lower()
        if pattern == name or (pattern.startswith("*.") and name.endswith(pattern[1:])
                               and len(name) > len(pattern) - 1):
            return address.strip() or None
    return None


async def dns(*, netns: str, host: str, port: int, kubeconfig: str,
              domain: str = CLUSTER_DOMAIN, zone: Path | None = None) -> None:
    """Answers ``<service>.<namespace>.svc.<domain>`` with the Service's ClusterIP, from a UDP
    socket on ``host`` in ``netns``; asks the API server (``kubeconfig``) at each query. Names
    in ``zone`` (:func:`zone_lookup`) get its addresses: the public names a test gives a cloud's
    edges (their addresses live in an address space beside the node), as public DNS would.

    Bound to the one address pods ask (not 0.0.0.0): a reply must come from the address the
    query went to, or resolvers drop it (from 0.0.0.0 it would leave from the pod bridge's).
    """
    from vkprovider.kube import KubeClient  # the relay needs none of it

    sock = in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sock.bind((host, port))
    suffix = f".svc.{domain}"
    loop = asyncio.get_running_loop()
    async with KubeClient.from_kubeconfig(kubeconfig=kubeconfig) as kube:

        async def cluster_ip(name: str) -> str | None:
            if not name.endswith(suffix):
                return None
            parts = name.removesuffix(suffix).split(".")
            if len(parts) != 2:
                return None
            try:
                svc = await kube.get(f"/api/v1/namespaces/{parts[1]}/services/{parts[0]}")
            except (NotFoundError, APIError):
                return None
            ip = svc.get("spec", {}).get("clusterIP")
            return ip if ip and ip != "None" else None

        async def answer(data: bytes, peer: tuple[str, int]) -> None:
            if len(data) < 13:
                return
            found: dict[str, str | None] = {}
            name = dns_name(data)
            if name is not None:
                found[name] = zone_lookup(zone, name) or await cluster_ip(name)
            reply = dns_answer(data, lambda n: found.get(n))
            if reply is not None:
                await loop.sock_sendto(sock, reply, peer)

        sock.setblocking(False)
        tasks: set[asyncio.Task[None]] = set()
        while True:
            data, peer = await loop.sock_recvfrom(sock, 4096)
            task = asyncio.create_task(answer(data, peer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


def dns_name(query: bytes) -> str | None:
    """The (lower-cased) name a DNS query asks about, or None."""
    labels, pos = [], 12
    while pos < len(query) and query[pos]:
        size = query[pos]
        if size & 0xC0 or pos + 1 + size > len(query):
            return None
        labels.append(query[pos + 1:pos + 1 + size].decode("ascii", "replace"))
        pos += 1 + size
    return ".".join(labels).lower() if pos < len(query) else None


# ---- the node ---------------------------------------------------------------------------------


class RealNode:
    """Start with ``await node.start()``; stop with ``node.stop()`` (always, in finally)."""

    def __init__(self, *, cluster: LocalCluster, name: str | None = None,
                 bin_dir: Path | None = None, kube_proxy: bool = True) -> None:
        self.cluster = cluster
        suffix = uuid.uuid4().hex[:8]
        self.name = name or f"vkp-real-{suffix}"
        self.bin_dir = bin_dir
        self.kube_proxy = kube_proxy
        self.work_dir = Path(tempfile.mkdtemp(prefix="vkp-node-"))
        #: public names the node's DNS answers (:meth:`publish_names`)
        self.dns_zone = self.work_dir / "dns-zone"
        self.log_dir = cluster.log_dir
        self.netns = f"vkpn-{suffix}"
        self.netns_path = f"/run/netns/{self.netns}"
        self.host_if = f"vkh{suffix[:8]}"
        self.cgroup_root = f"/vkp-node-{suffix}"
        self.link: ipaddress.IPv4Network | None = None
        self.node_ip = ""
        self.host_ip = ""
        #: this node's pod range (a /24 of POD_CIDR), routed from the host over the link
        self.pod_cidr = ""
        #: the EndpointSlice of the ``kubernetes`` Service that names this node's relay
        self.api_slice = f"kubernetes-{self.name}"
        self.socket = self.work_dir / "containerd" / "containerd.sock"
        #: the CNI network's name: libcni caches results under /var/lib/cni/results/<name>-*
        self.cni_network = f"vkp-{suffix}"
        self.components: dict[str, Component] = {}
        self.mount_ns = ""
        #: the host's values of the kernel tunables the kubelet wants, before start()
        self.host_tunables: dict[str, str] = {}
        #: seconds since start() began, per step: what a bring-up costs
        self.timings: dict[str, float] = {}
        self._netns_made = False
        self._cgroups_made: list[Path] = []
        self._mountpoints_made: list[Path] = []

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, timeout: float = 120.0) -> None:
        t0 = time.monotonic()
        self.host_tunables = read_tunables()
        try:
            ensure_host_tools()
            bins = self.bin_dir or find_node_binaries()
            self.timings["tools"] = time.monotonic() - t0
            self._make_network()
            self._make_cgroups()
            await self._make_mount_namespace(t0 + timeout)
            self._write_pki()
            self._write_configs()
            # on every address of the node: its agents (loopback) and its pods (node_ip)
            self._start("relay", [sys.executable, "-m", "vkprovider.testing.realnode", "relay",
                                  f"--netns={self.netns_path}", f"--listen-port={RELAY_PORT}",
                                  "--listen-host=0.0.0.0",
                                  f"--target-port={self.cluster.api_port}"], netns=False)
            self._start("dns", [sys.executable, "-m", "vkprovider.testing.realnode", "dns",
                                f"--netns={self.netns_path}", f"--host={self.node_ip}",
                                f"--port={DNS_PORT}", f"--zone={self.dns_zone}",
                                f"--kubeconfig={self.cluster.kubeconfig}"], netns=False)
            self._start("containerd",
                        ["containerd", f"--config={self.work_dir / 'containerd.toml'}"])
            await self._wait_socket(t0 + timeout)
            self._import_images(bins)
            self.timings["images"] = time.monotonic() - t0
            self._start("kubelet", [
                str(bins / "kubelet"),
                f"--config={self.work_dir / 'kubelet.yaml'}",
                f"--kubeconfig={self.work_dir / 'kubelet.kubeconfig'}",
                f"--root-dir={self.work_dir / 'kubelet'}",
                f"--cert-dir={self.work_dir / 'kubelet' / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.node_ip}",
                "--v=1",
            ])
            if self.kube_proxy:
                self._start("kube-proxy", [
                    str(bins / "kube-proxy"), f"--config={self.work_dir / 'kube-proxy.yaml'}",
                    "--v=1"])
            await self._wait_ready(t0 + timeout)
            await self._publish_api_server()
            self.timings["ready"] = time.monotonic() - t0
            log.info("real node ready", extra=kv(node=self.name, ip=self.node_ip,
                                                 seconds=round(self.timings["ready"], 1)))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End everything this node started, by PID; unmount and remove what it made.

        Every step runs even if one before it failed: a half-torn-down node must not leave
        processes, mounts, cgroups or a namespace behind on a shared machine.
        """
        steps: list[Callable[[], object]] = [
            *(self.components[n].stop for n in ("kube-proxy", "kubelet") if n in self.components),
            self._kill_containers, self._kill_shims,
            self._unpublish_api_server,
            *(self.components[n].stop for n in ("containerd", "relay", "dns")
              if n in self.components),
            *(self.components[n].stop for n in ("mount-namespace",) if n in self.components),
            self._unmount_all, self._remove_cgroups, self._remove_mountpoints,
            self._remove_netns,
            lambda: shutil.rmtree(self.work_dir, ignore_errors=True),
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:
                log.warning("real node teardown step failed",
                            extra=kv(node=self.name, step=getattr(step, "__name__", "?"),
                                     error=repr(exc)))

    def _remove_netns(self) -> None:
        if self._netns_made:
            subprocess.run(["ip", "netns", "delete", self.netns], check=False,
                           capture_output=True)
            self._netns_made = False

    def tails(self, lines: int = 30) -> str:
        return "\n".join(f"--- {c.name}\n{c.tail(lines)}" for c in self.components.values())

    # ---- preparing ---------------------------------------------------------------------------

    def _make_network(self) -> None:
        self.link = pick_link()
        self.pod_cidr = str(pick_link(ipaddress.IPv4Network(POD_CIDR), 24))
        host, node = list(self.link.hosts())
        self.host_ip, self.node_ip = str(host), str(node)
        plen = self.link.prefixlen
        _run(["ip", "netns", "add", self.netns], what="ip netns add")
        self._netns_made = True
        steps = [
            ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0",
             "netns", self.netns],
            ["ip", "addr", "add", f"{self.host_ip}/{plen}", "dev", self.host_if],
            ["ip", "link", "set", self.host_if, "up"],
            ["ip", "-n", self.netns, "link", "set", "lo", "up"],
            ["ip", "-n", self.netns, "addr", "add", f"{self.node_ip}/{plen}", "dev", "eth0"],
            ["ip", "-n", self.netns, "link", "set", "eth0", "up"],
            # pods talk to each other and to Services only: nothing they send is forwarded to
            # the host's side of the link (the node's own traffic is not forwarded, so the
            # kubelet's and the API server's connections are not concerned)
            ["nsenter", f"--net={self.netns_path}", "--", "iptables", "-w", "-A", "FORWARD",
             "-o", "eth0", "-j", "DROP"],
            # ...but replies to connections the host opened go back (the API server calling a
            # pod's kubelet API, as it calls a node's)
            ["nsenter", f"--net={self.netns_path}", "--", "iptables", "-w", "-I", "FORWARD",
             "1", "-o", "eth0", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
             "-j", "ACCEPT"],
            # the host reaches this node's pods over the link (gone with the link)
            ["ip", "route", "add", self.pod_cidr, "via", self.node_ip, "dev", self.host_if],
        ]
        for argv in steps:
            _run(argv, what=" ".join(argv))

    def _make_cgroups(self) -> None:
        """A cgroup root of this node's own in every hierarchy (the kubelet requires it)."""
        base = Path("/sys/fs/cgroup")
        if (base / "cgroup.controllers").exists():  # cgroup v2 only: one hierarchy, here
            hierarchies = [base]
        else:  # v1 (this project's machines: v1 controllers, cgroup2 at unified/)
            hierarchies = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink()
                                 and (p / "cgroup.procs").exists())
        for hierarchy in hierarchies:
            path = hierarchy / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            self._cgroups_made.append(path)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (path / knob).exists() and not (path / knob).read_text().strip():
                    (path / knob).write_text((hierarchy / knob).read_text())

    def _write_pki(self) -> None:
        ca = self.cluster.ca
        self.kubelet_client = ca.issue(stem=f"{self.name}-client",
                                    common_name=f"system:node:{self.name}",
                                    organization="system:nodes", client=True)
        self.kubelet_serving = ca.issue(stem=f"{self.name}-serving",
                                     common_name=f"system:node:{self.name}",
                                     organization="system:nodes", server=True,
                                     hosts=(self.node_ip, self.name))
        self.proxy_client = ca.issue(stem=f"{self.name}-kube-proxy",
                                  common_name="system:kube-proxy", client=True)

    def _kubeconfig(self, *, path: Path, cert: Path, key: Path) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": f"https://127.0.0.1:{RELAY_PORT}",
                "certificate-authority": str(self.cluster.ca_path)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(cert),
                                               "client-key": str(key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "node"}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def _write_configs(self) -> None:
        w = self.work_dir
        for sub in ("containerd/root", "containerd/state", "cni/net.d", "cni/ipam", "kubelet",
                    "pod-logs", "images"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        (w / "containerd.toml").write_text(_CONTAINERD_TOML.format(
            root=w / "containerd" / "root", state=w / "containerd" / "state", socket=self.socket,
            pause=PAUSE_IMAGE, cni_bin=CNI_BIN_DIR, cni_conf=w / "cni" / "net.d",
            runc_root=w / "containerd" / "runc"))
        cni = {
            "cniVersion": "0.4.0", "name": self.cni_network,
            "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_cidr}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(w / "cni" / "ipam")},
            }],
        }
        (w / "cni" / "net.d" / "10-vkp-bridge.conflist").write_text(json.dumps(cni, indent=1))
        # no nameserver: pods resolve nothing, so no DNS query goes anywhere
        (w / "resolv.conf").write_text("search invalid\noptions ndots:1\n")
        self._kubeconfig(path=w / "kubelet.kubeconfig", cert=self.kubelet_client.cert,
                         key=self.kubelet_client.key)
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "failSwapOn": False, "address": "0.0.0.0", "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "tlsCertFile": str(self.kubelet_serving.cert),
            "tlsPrivateKeyFile": str(self.kubelet_serving.key),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cluster.ca_path)}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(w / "pod-logs"),
            "resolvConf": str(w / "resolv.conf"),
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [self.node_ip],
            "maxPods": 30,
            "registerNode": True,
            "registerWithTaints": [TAINT],
            # a shared, busy disk must not make this node evict or collect its images
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
        }
        (w / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        self._kubeconfig(path=w / "kube-proxy.kubeconfig", cert=self.proxy_client.cert,
                         key=self.proxy_client.key)
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clusterCIDR": self.pod_cidr, "hostnameOverride": self.name,
            "bindAddress": "0.0.0.0",
            "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            "clientConnection": {"kubeconfig": str(w / "kube-proxy.kubeconfig")},
            # sysctls a network namespace may not set: leave the kernel's values
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
        }
        (w / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))

    async def _make_mount_namespace(self, deadline: float) -> None:
        """The node's own mount namespace, held by a sleeping process, prepared with nsenter.

        The kubelet and containerd write to fixed host paths whatever their flags say
        (/var/lib/kubelet/device-plugins, /run/containerd/s and runc's state, libcni's cache in
        /var/lib/cni, log links in /var/log/containers), and the kubelet sets kernel tunables for
        the whole machine (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops, ...). In
        here those paths are this node's own folders and those tunables read as the kubelet
        wants them (files bound over /proc/sys entries), so nothing of the host changes and
        everything vanishes with the namespace.
        """
        holder = self._start("mount-namespace", ["unshare", "--mount", "--propagation=private",
                                                 "--", "sleep", "infinity"], netns=False)
        assert holder.process is not None
        mine = os.readlink("/proc/self/ns/mnt")
        ns = f"/proc/{holder.process.pid}/ns/mnt"
        while True:  # unshare has entered its namespace once the link differs
            self._check_alive()
            with contextlib.suppress(OSError):
                if os.readlink(ns) != mine:
                    break
            if time.monotonic() > deadline:
                raise RealNodeError(f"no mount namespace\n{self.tails()}")
            await asyncio.sleep(0.05)
        self.mount_ns = ns
        self._bind_private_paths()

    def _bind_private_paths(self) -> None:
        binds: list[tuple[Path, Path]] = []
        for target in _PRIVATE_PATHS:
            source = self.work_dir / "host" / target.strip("/").replace("/", "-")
            source.mkdir(parents=True, exist_ok=True)
            target_path = Path(target)
            if not target_path.exists():  # a mount point is needed on the host's side
                target_path.mkdir(parents=True)
                self._mountpoints_made.append(target_path)
            binds.append((source, target_path))
        for entry, value in KUBELET_TUNABLES.items():
            source = self.work_dir / "host" / "sysctl" / entry.replace("/", "-")
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text(f"{value}\n")
            binds.append((source, Path("/proc/sys") / entry))
        for source, target_path in binds:
            _run(["nsenter", f"--mount={self.mount_ns}", "--", "mount", "--bind", str(source),
                  str(target_path)], what=f"bind {target_path} in the node's mount namespace")

    def _start(self, name: str, argv: list[str], *, netns: bool = True) -> Component:
        if netns:
            argv = ["nsenter", f"--mount={self.mount_ns}", f"--net={self.netns_path}", "--",
                    *argv]
        comp = Component(name=f"node-{name}", argv=argv,
                         log_path=self.log_dir / f"{self.name}-{name}.log")
        self.components[name] = comp
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        comp.start(env=env)
        return comp

    async def _wait_socket(self, deadline: float) -> None:
        while not self.socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RealNodeError(f"containerd did not open its socket\n{self.tails()}")
            await asyncio.sleep(0.1)

    def _ctr(self, *args: str) -> str:
        return _run(["ctr", f"--address={self.socket}", "-n", "k8s.io", *args],
                    what=f"ctr {' '.join(args[:2])}")

    def _import_images(self, bins: Path) -> None:
        images = self.work_dir / "images"
        packer = REPO_ROOT / "tools" / "node" / "oci_archive.py"
        pause = images / "pause.tar"
        _run([sys.executable, str(packer), f"--out={pause}", f"--name={PAUSE_IMAGE}",
              f"--file={bins / 'pause'}:pause:755", '--entrypoint=["/pause"]'],
             what="packing the pause image")
        busybox = images / "busybox.tar"
        argv = [sys.executable, str(packer), f"--out={busybox}", f"--name={BUSYBOX_IMAGE}",
                f"--file={BUSYBOX}:bin/busybox:755", "--dir=tmp:1777", "--dir=etc",
                "--dir=root:700", '--entrypoint=["/bin/sh"]']
        argv += [f"--link=bin/{a}:busybox" for a in _busybox_applets()]
        _run(argv, what="packing the busybox image")
        for tar in (pause, busybox):
            self._ctr("images", "import", "--no-unpack=false", str(tar))

    def publish_names(self, names: dict[str, str]) -> None:
        """The public names (``NAME`` or ``*.suffix`` -> an IPv4 address) the node's DNS
        answers from now on, instead of the previous ones (``{}``: none). Written whole and
        renamed, so a query never reads half a file."""
        lines = "".join(f"{name} {ipaddress.IPv4Address(addr)}\n" for name, addr in names.items())
        tmp = self.dns_zone.with_suffix(".tmp")
        tmp.write_text(lines)
        tmp.replace(self.dns_zone)

    def import_image(self, archive: Path) -> str:
        """Imports an OCI archive into this node's containerd (``ctr -n k8s.io images import``,
        unpacked for the kubelet's snapshotter) and returns the image's reference."""
        name = image_name(archive)
        _run(["ctr", f"--address={self.socket}", "-n", "k8s.io", "images", "import",
              "--no-unpack=false", str(archive)], what=f"ctr images import {archive}",
             timeout=600)
        return name

    async def _wait_ready(self, deadline: float) -> None:
        async with self.cluster.client() as kube:
            while True:
                self._check_alive()
                try:
                    node = await kube.get(f"/api/v1/nodes/{self.name}")
                    conds = node.get("status", {}).get("conditions") or []
                    if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                        return
                except (NotFoundError, APIError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise RealNodeError(f"node {self.name} not Ready in time\n{self.tails()}")
                await asyncio.sleep(0.3)

    async def _publish_api_server(self) -> None:
        """Pods reach the API server at the ``kubernetes`` Service: an EndpointSlice of it names
        the relay on this node's address (the local API server publishes none of its own:
        --endpoint-reconciler-type=none, it listens on loopback). One real node per cluster,
        as the suite runs: with two, each node's kube-proxy would also pick the other's
        address, which its pods cannot reach."""
        body = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": self.api_slice, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes",
                                    "endpointslice.kubernetes.io/managed-by":
                                        "vkprovider.testing.realnode"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.node_ip], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": RELAY_PORT, "protocol": "TCP"}],
        }
        async with self.cluster.client() as kube:
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/"
                                  f"{self.api_slice}")
            await kube.create("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                              body)

    def _unpublish_api_server(self) -> None:
        async def delete() -> None:
            async with self.cluster.client() as kube:
                with contextlib.suppress(NotFoundError):
                    await kube.delete(f"/apis/discovery.k8s.io/v1/namespaces/default/"
                                      f"endpointslices/{self.api_slice}")

        if self.components.get("kubelet") is None:
            return  # never published
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, delete()).result(timeout=30)

    def _check_alive(self) -> None:
        for comp in self.components.values():
            if comp.process is not None and not comp.alive():
                raise RealNodeError(
                    f"{comp.name} exited with {comp.process.returncode}\n{comp.tail()}")

    # ---- tearing down ------------------------------------------------------------------------

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for root in self._cgroups_made:
            for folder, _, _ in os.walk(root):  # folders vanish meanwhile: walk ignores that
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in Path(folder, "cgroup.procs").read_text().split())
        return pids

    def _kill_containers(self) -> None:
        for _ in range(50):
            pids = self._cgroup_pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        log.warning("container processes survived", extra=kv(pids=sorted(self._cgroup_pids())))

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes started for this node's containerd (by its socket)."""
        marker = str(self.socket).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and marker in argv:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def _remove_mountpoints(self) -> None:
        for path in self._mountpoints_made:
            with contextlib.suppress(OSError):
                path.rmdir()  # only if still empty: made here, for the namespace's binds
        self._mountpoints_made = []

    def _unmount_all(self) -> None:
        prefix = str(self.work_dir) + "/"
        for _ in range(3):
            points = []
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point.startswith(prefix):
                    points.append(point)
            if not points:
                return
            for point in sorted(points, key=len, reverse=True):
                subprocess.run(["umount", "-l", point], check=False, capture_output=True)

    def _remove_cgroups(self) -> None:
        for root in self._cgroups_made:
            if not root.exists():
                continue
            for folder, _, _ in os.walk(root, topdown=False):  # deepest first
                with contextlib.suppress(OSError):
                    Path(folder).rmdir()
        self._cgroups_made = [r for r in self._cgroups_made if r.exists()]


#: host paths the kubelet, containerd, runc and libcni use whatever their flags say; each is
#: this node's own folder inside its mount namespace
_PRIVATE_PATHS = ("/var/lib/kubelet", "/run/containerd", "/var/lib/cni", "/var/log/containers")
#: the kernel tunables the kubelet sets for the whole machine unless they read as these
#: (pkg/kubelet/cm setupKernelTunables); inside the node's mount namespace they do
KUBELET_TUNABLES = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10,
                     "kernel/panic_on_oops": 1, "kernel/keys/root_maxkeys": 1000000,
                     "kernel/keys/root_maxbytes": 25000000}

_CONTAINERD_TOML = """\
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.btrfs"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # root here lacks CAP_SYS_RESOURCE: without this every sandbox fails in runc
  restrict_oom_score_adj = true
  # pod network namespaces under state, not /var/run/netns: stop() finds and unmounts them
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"""


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - run as a child process
    """``python -m vkprovider.testing.realnode relay ...``: the node's way to the API server."""
    parser = argparse.ArgumentParser(prog="vkprovider.testing.realnode")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("relay", help="forward a port in a network namespace to loopback here")
    rel.add_argument("--netns", required=True)
    rel.add_argument("--listen-port", type=int, required=True)
    rel.add_argument("--target-port", type=int, required=True)
    rel.add_argument("--listen-host", default="127.0.0.1")
    dn = sub.add_parser("dns", help="the cluster DNS of a node's pods, in its namespace")
    dn.add_argument("--netns", required=True)
    dn.add_argument("--host", required=True)
    dn.add_argument("--port", type=int, default=DNS_PORT)
    dn.add_argument("--kubeconfig", required=True)
    dn.add_argument("--zone", type=Path, help="a file of 'NAME ADDRESS' lines (public names)")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        if args.command == "relay":
            asyncio.run(relay(netns=args.netns, listen_port=args.listen_port,
                              target_port=args.target_port, listen_host=args.listen_host))
        else:
            asyncio.run(dns(netns=args.netns, host=args.host, port=args.port,
                            kubeconfig=args.kubeconfig, zone=args.zone))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())



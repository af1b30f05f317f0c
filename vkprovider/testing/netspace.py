"""Addresses that live somewhere real: a network namespace beside a real node, and servers in it.

Why it exists: over the real path (a real node's kube-proxy, issue 37 item 4) a client pod sends
requests to a Service's ClusterIP and kube-proxy's iptables rules rewrite them to the replicas'
addresses, a cloud instance's public address (198.18.0.0/15) among them. Those packets must
arrive somewhere the test controls, and nowhere else. :class:`AddressSpace` makes a network
namespace (``vkpr-*``, with ``ip netns``) that holds the given addresses on its end of one veth
pair, whose other end lives in the real node's namespace (never the host's): the node routes
only those ``/32`` addresses to it, and it routes only the node's pod range and the ``/30`` link
back. No address table and no route on the host: the host's own namespace cannot reach these
addresses at all, and a packet kube-proxy fails to rewrite (to a ClusterIP) finds no route in
the node's namespace and goes nowhere.

:meth:`AddressSpace.serve` starts a real HTTP model server (:mod:`.modelserver`) listening on one
of those addresses, inside the namespace, in the caller's event loop: it counts what it answers
(:attr:`ModelServer.counters`). :meth:`AddressSpace.stop` closes the servers, then deletes the
node's end of the veth pair (both ends go) and the namespace, by name, every step even after a
failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from vkprovider.logs import kv
from vkprovider.testing.modelserver import ModelServer
from vkprovider.testing.realnode import LINK_POOL, RealNode, RealNodeError, in_netns, pick_link

__all__ = ["AddressSpace", "InstanceSpaces"]

log = logging.getLogger(__name__)

#: namespaces made here are named ``vkpr-<hex>`` (the real node's are ``vkpn-<hex>``)
NETNS_PREFIX = "vkpr-"


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False,
                          timeout=30)
    if done.returncode != 0:
        raise RealNodeError(f"ip {' '.join(argv)} failed ({done.returncode}): "
                            f"{done.stderr.strip()[-500:]}")


class AddressSpace:
    """A namespace holding ``addresses``, routed to ``node``'s namespace over one veth pair.

    ``await start()``; ``await serve(address=..., port=..., identity=...)`` for each listener;
    ``await stop()`` always (in ``finally``)."""

    def __init__(self, *, node: RealNode, addresses: Sequence[str]) -> None:
        if not node.netns or node.link is None or not node.pod_cidr:
            raise RealNodeError("the real node is not started")
        self.node = node
        self.addresses = [str(ipaddress.IPv4Address(a)) for a in addresses]
        if not self.addresses:
            raise RealNodeError("an address space needs at least one address")
        suffix = uuid.uuid4().hex[:8]
        self.netns = f"{NETNS_PREFIX}{suffix}"
        self.netns_path = f"/run/netns/{self.netns}"
        #: the veth end in the node's namespace (the space's own end is ``eth0``)
        self.node_if = f"vkr{suffix}"
        self.link: ipaddress.IPv4Network | None = None
        self.node_side = ""
        self.space_side = ""
        self.servers: list[ModelServer] = []
        self._made = False

    async def start(self) -> None:
        try:
            self._make()
        except BaseException:
            await self.stop()
            raise

    def _pick_link(self) -> ipaddress.IPv4Network:
        for _ in range(20):
            link = pick_link(LINK_POOL, 30)
            if self.node.link is not None and not link.overlaps(self.node.link):
                return link
        raise RealNodeError(f"no free /30 in {LINK_POOL} beside the node's link")

    def _make(self) -> None:
        self.link = self._pick_link()
        node_side, space_side = list(self.link.hosts())
        self.node_side, self.space_side = str(node_side), str(space_side)
        plen = self.link.prefixlen
        node_ns = self.node.netns
        _ip("netns", "add", self.netns)
        self._made = True
        _ip("-n", self.netns, "link", "add", "eth0", "type", "veth", "peer", "name",
            self.node_if, "netns", node_ns)
        _ip("-n", self.netns, "link", "set", "lo", "up")
        _ip("-n", self.netns, "addr", "add", f"{self.space_side}/{plen}", "dev", "eth0")
        for address in self.addresses:
            _ip("-n", self.netns, "addr", "add", f"{address}/32", "dev", "eth0")
        _ip("-n", self.netns, "link", "set", "eth0", "up")
        # back only to the node's pods (the link itself is connected): no default route
        _ip("-n", self.netns, "route", "add", self.node.pod_cidr, "via", self.node_side,
            "dev", "eth0")
        _ip("-n", node_ns, "addr", "add", f"{self.node_side}/{plen}", "dev", self.node_if)
        _ip("-n", node_ns, "link", "set", self.node_if, "up")
        for address in self.addresses:  # the node routes exactly these /32s here
            _ip("-n", node_ns, "route", "add", f"{address}/32", "via", self.space_side,
                "dev", self.node_if)
        log.info("address space ready", extra=kv(netns=self.netns, node=self.node.name,
                                                 addresses=",".join(self.addresses)))

    async def serve(self, *, address: str, port: int, identity: Mapping[str, Any],
                    load_seconds: float = 0.0, tls: ssl.SSLContext | None = None
                    ) -> ModelServer:
        """A model server on ``address:port`` inside this namespace (one of its addresses);
        with ``tls``, HTTPS (a cloud's TLS edge)."""
        if address not in self.addresses:
            raise RealNodeError(f"{address} is not an address of {self.netns}")
        sock = in_netns(self.netns_path,
                        lambda: socket.create_server((address, port), backlog=128))
        server = ModelServer(identity=identity, load_seconds=load_seconds, host=address,
                             port=port)
        try:
            await server.start(sock=sock, ssl=tls)
        except BaseException:
            sock.close()
            raise
        self.servers.append(server)
        return server

    def routes(self) -> str:
        """The node namespace's routes through this space's veth (what ``ip route`` says)."""
        return subprocess.run(["ip", "-n", self.node.netns, "-4", "route", "show", "dev",
                               self.node_if], capture_output=True, text=True,
                              check=False).stdout

    async def stop(self) -> None:
        """Close the servers (their sockets hold the namespace), then remove the veth pair and
        the namespace by name; every step runs even if one before it failed."""
        for server in self.servers:
            try:
                await server.close()
            except Exception as exc:
                log.warning("address space: closing a server failed",
                            extra=kv(netns=self.netns, error=repr(exc)))
        self.servers = []
        if self._made:
            with contextlib.suppress(RealNodeError):
                _ip("-n", self.node.netns, "link", "delete", self.node_if)
            with contextlib.suppress(RealNodeError):
                _ip("netns", "delete", self.netns)
            self._made = False


class InstanceSpaces:
    """An :class:`AddressSpace` with a model server for every running instance of a cloud.

    Polls ``instances()`` (a mock cloud's ``GET /instances``) every ``interval`` seconds: an
    instance that is ``running`` with a public address gets a space holding that address and a
    server on the public port of ``container_port``; one that stops running (terminating,
    deleted, gone) loses it, as its machine would. ``servers`` keeps every server ever made, by
    the instance's pod (``vkprovider.io/pod`` tag) or id, so its counts outlive it."""

    def __init__(self, *, node: RealNode,
                 instances: Callable[[], Awaitable[list[dict[str, Any]]]],
                 container_port: int, interval: float = 0.2) -> None:
        self.node = node
        self.instances = instances
        self.container_port = container_port
        self.interval = interval
        self.servers: dict[str, ModelServer] = {}
        self._spaces: dict[str, AddressSpace] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._sync()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._sync()
            except Exception as exc:  # the next poll tries again
                log.warning("instance spaces: sync failed", extra=kv(error=repr(exc)))

    async def _sync(self) -> None:
        running: dict[str, dict[str, Any]] = {}
        for inst in await self.instances():
            if inst.get("state") == "running" and inst.get("public_ip"):
                running[str(inst["id"])] = inst
        for instance_id in [i for i in self._spaces if i not in running]:
            await self._spaces.pop(instance_id).stop()
        for instance_id, inst in running.items():
            if instance_id in self._spaces:
                continue
            ports = [p for p in inst.get("ports") or []
                     if p.get("container_port") == self.container_port]
            if not ports:
                continue
            name = str((inst.get("tags") or {}).get("vkprovider.io/pod") or instance_id)
            space = AddressSpace(node=self.node, addresses=[str(inst["public_ip"])])
            try:
                await space.start()
                server = await space.serve(address=str(inst["public_ip"]),
                                           port=int(ports[0]["public_port"]),
                                           identity={"replica": name})
            except BaseException:
                await space.stop()
                raise
            self._spaces[instance_id] = space
            self.servers[name] = server

    def open_count(self) -> int:
        return len(self._spaces)

    def endpoints(self) -> list[str]:
        """``address:port`` of every server open now."""
        return [f"{server.host}:{server.port}" for space in self._spaces.values()
                for server in space.servers]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for space in list(self._spaces.values()):
            await space.stop()
        self._spaces.clear()

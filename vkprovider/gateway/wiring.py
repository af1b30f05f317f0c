"""Builds the provider's :class:`GatewayController` from its settings (``gateway:``).

Why it exists: the service module stays a list of parts; here are the choices that make a gateway
from settings: where HAProxy dials an edge (a lab's address map, or DNS screened by the cloud
address filter, because an edge's name is cloud input and could resolve inside the cluster), which
traffic mode a pod's OverflowPolicy asks for, and which key an edge gets (the provider's own API
key for that cloud: SaladCloud's edge authenticates with the account's key), and when a
policy's ``traffic`` change must re-route the replicas (:func:`traffic_watch`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from providers.addresses import AddressPolicy, refusal
from vkprovider.config import Settings
from vkprovider.gateway.controller import (
    DialResolver,
    GatewayController,
    GatewayInstance,
    GatewayMetrics,
)
from vkprovider.gateway.haproxycfg import GatewayLayout
from vkprovider.gateway.runtime import GatewayError, RuntimeClient
from vkprovider.probing.dialing import Dialer

__all__ = ["build_gateway", "dns_dial", "mapped_dial", "traffic_watch"]

_DNS_TTL = 30.0


def mapped_dial(dialer: Dialer) -> DialResolver:
    """A lab: the address map says where an edge's ``host:port`` really listens."""

    async def dial(host: str, port: int) -> tuple[str, int]:
        return dialer.resolve(host, port)

    return dial


def dns_dial(policy: AddressPolicy, *, ttl: float = _DNS_TTL) -> DialResolver:
    """Production: the edge's name resolved (cached ``ttl`` seconds), the first address the
    cloud address filter accepts; an edge that resolves only to refused addresses is not
    served (the gateway never dials the cluster's own or metadata addresses for a cloud)."""
    cache: dict[tuple[str, int], tuple[float, tuple[str, int]]] = {}

    async def dial(host: str, port: int) -> tuple[str, int]:
        hit = cache.get((host, port))
        now = time.monotonic()
        if hit is not None and now - hit[0] < ttl:
            return hit[1]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise GatewayError(f"edge {host}: cannot resolve: {exc}") from exc
        for info in infos:
            ip = str(info[4][0])
            if refusal(ip, kind="ip", policy=policy) is None:
                cache[(host, port)] = (now, (ip, port))
                return ip, port
        raise GatewayError(f"edge {host} resolves only to refused addresses")

    return dial


def build_gateway(*, settings: Settings, dialer: Dialer | None, policy: AddressPolicy,
                  api_keys: Mapping[str, Callable[[], str | None]],
                  metrics: GatewayMetrics | None = None) -> GatewayController | None:
    """The gateway controller ``settings.gateway`` describes, or None when it has no instance.

    ``dialer``: the lab's address map (None in production: DNS). ``api_keys``: per provider
    name, how to read its API key (read when programming, never stored here).
    """
    g = settings.gateway
    if not g.enabled:
        return None
    layout = GatewayLayout(bind_host="0.0.0.0", first_port=g.first_port, count=g.port_count,
                           socket=Path("/var/run/haproxy/runtime.sock"), ca_file=Path(g.ca_file),
                           map_dir=Path(g.map_dir), auth_headers=g.auth_headers)
    tls = None
    if g.runtime_tls is not None:  # mutual TLS to the gateway pods' Runtime API
        tls = ssl.create_default_context(cafile=g.runtime_tls.ca_file)
        tls.load_cert_chain(g.runtime_tls.cert_file, g.runtime_tls.key_file)
    server_name = g.runtime_tls.server_name if g.runtime_tls is not None else None
    resolve = dialer.resolve if dialer is not None else None

    def instance(address: str, runtime: str) -> GatewayInstance:
        return GatewayInstance(address=address, client=RuntimeClient(
            address=runtime, tls=tls, server_name=server_name, resolve=resolve,
            timeout=g.runtime_timeout_seconds))

    instances = [instance(i.address, i.runtime) for i in g.instances]

    def edge_key(provider: str) -> str | None:
        read = api_keys.get(provider)
        return read() if read is not None else None

    controller = GatewayController(
        layout=layout, instances=instances,
        dial=mapped_dial(dialer) if dialer is not None else dns_dial(policy),
        edge_key=edge_key, interval=g.reconcile_seconds, metrics=metrics)
    if g.pods is not None:
        port = g.pods.runtime_port
        static = list(instances)
        controller.discovered = lambda addresses: controller.set_instances(
            static + [instance(a, f"tls://{a}:{port}") for a in addresses])
    return controller


def traffic_watch(*, modes: Callable[[], Mapping[str, str]],
                  refresh: Callable[[], None]) -> Callable[[], None]:
    """A policy-watch handler: calls ``refresh`` (re-reconcile every Service with a cloud
    replica) when the ``traffic`` a policy name stands for changed (edited; deleted, so its
    pods fall back to ``auto``; re-created with another), so replicas are re-routed at once
    rather than at the next unrelated Service change. ``modes``: policy name -> ``traffic``
    now. The first call only records the baseline."""
    last: dict[str, str] | None = None

    def changed() -> None:
        nonlocal last
        now = dict(modes())
        before, last = last, now
        if before is None:
            return
        if any(before.get(name, "auto") != now.get(name, "auto")
               for name in before.keys() | now.keys()):
            refresh()

    return changed

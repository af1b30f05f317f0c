"""The dial step of port-forward: a cloud pod's declared port as a connected byte stream.

Why it exists: port-forward must reach a cloud pod's port the way its traffic does, and only
that way. :func:`declared_ports` reads what the pod author declared (only those ports are
forwarded; an undeclared one is refused naming the pod, the port and the declared ports), and
:class:`PublishedDial` connects to the address the cloud published for the port, after the same
screening every published address gets (:func:`providers.addresses.refusal`: never a metadata,
loopback, private or in-cluster address, whatever the cloud reported), through the
:class:`~vkprovider.probing.dialing.Dialer` the prober uses (the lab's address map, else
direct).

One function shape, ``dial(placement, port) -> (reader, writer)`` (:data:`Dial`).
:class:`GatewayDial` is the other one: a port a hostname-only cloud publishes only behind its
HTTPS edge (SaladCloud's access domain, RunPod's proxy) is reached through the traffic
gateway's listener for that replica, the route a Service would use (HAProxy in HTTP mode
originates verified TLS to the edge, with its name and the account's key), so such a forward
carries HTTP only. :class:`PortDial` picks: a raw published address when there is one, else the
gateway route, else a refusal naming why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from providers.addresses import DEFAULT_POLICY, AddressPolicy, describe, refusal
from providers.base import PublishedPort
from vkprovider.api.portforward.session import PortRefused
from vkprovider.api.view import Placement, is_running
from vkprovider.probing.dialing import DIRECT, Dialer, NoRoute

__all__ = ["DeclaredPort", "Dial", "GatewayDial", "GatewayRoutes", "PortDial", "PublishedDial",
           "declared_ports", "describe_ports"]

Body = dict[str, Any]
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
#: The dial step: the pod's placement and a container port -> a connected stream.
Dial = Callable[[Placement, int], Awaitable[Connection]]


@dataclass(frozen=True, kw_only=True)
class DeclaredPort:
    container: str
    port: int
    protocol: str
    name: str | None


def declared_ports(pod: Body) -> list[DeclaredPort]:
    """The container ports ``pod`` declares (``spec.containers[].ports[]``)."""
    found: list[DeclaredPort] = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            number = p.get("containerPort")
            if isinstance(number, int) and 0 < number < 65536:
                found.append(DeclaredPort(container=str(container.get("name", "")), port=number,
                                          protocol=str(p.get("protocol") or "TCP"),
                                          name=p.get("name")))
    return found


def describe_ports(ports: list[DeclaredPort]) -> str:
    if not ports:
        return "none"
    return ", ".join(f"{p.port}/{p.protocol}" + (f" ({p.name})" if p.name else "")
                     for p in ports)


class _CloudDial:
    """What both dials share: how to connect (``dialer``), which published addresses may be
    dialled (``policy``), how long a connection may take, and the running pod's entries."""

    def __init__(self, *, dialer: Dialer = DIRECT, policy: AddressPolicy = DEFAULT_POLICY,
                 timeout: float = 10.0) -> None:
        self._dialer = dialer
        self._policy = policy
        self._timeout = timeout

    @staticmethod
    def _published(placement: Placement, port: int) -> tuple[str, list[PublishedPort]]:
        """``namespace/pod`` and what the running pod publishes for ``port``."""
        _check_running(placement)
        return f"{placement.namespace}/{placement.pod}", _entries(placement, port)

    @staticmethod
    def _nothing(placement: Placement, port: int, where: str) -> PortRefused:
        return PortRefused(f"provider {placement.provider_name} publishes no address for "
                           f"port {port} of pod {where} (yet)")


class PublishedDial(_CloudDial):
    """Dials the address the cloud published for a container port (the IP:port clouds' path)."""

    async def __call__(self, placement: Placement, port: int) -> Connection:
        where, entries = self._published(placement, port)
        raw = [p for p in entries if p.scheme is None]
        if not raw:
            if entries:
                raise PortRefused(
                    f"provider {placement.provider_name} publishes port {port} of pod {where} "
                    f"only behind its TLS proxy ({_address(entries[0])}); forwarding to it "
                    "needs the traffic gateway (gateway: in the provider's settings, "
                    "docs/traffic.md), which is not set up")
            raise self._nothing(placement, port, where)
        problems: list[str] = []
        for entry in raw:
            reason = refusal(entry.host, kind=entry.kind, policy=self._policy)
            if reason is not None:
                problems.append(f"{_address(entry)} refused: {describe(reason)}")
                continue
            try:
                host, real_port = self._dialer.resolve(entry.host, entry.port)
                return await asyncio.wait_for(asyncio.open_connection(host, real_port),
                                              timeout=self._timeout)
            except NoRoute:
                problems.append(f"{_address(entry)}: no route")
            except TimeoutError:
                problems.append(f"{_address(entry)}: no answer in {self._timeout:g}s")
            except OSError as exc:
                problems.append(f"{_address(entry)}: {exc.strerror or exc}")
        raise PortRefused(f"cannot reach port {port} of pod {where}: " + "; ".join(problems))


class GatewayRoutes(Protocol):
    """The traffic gateway as port-forward sees it (:class:`vkprovider.gateway.controller.
    GatewayController`): the gateway pod ``(address, port)`` serving a hostname-only replica
    port, once programmed; None when it does not serve it."""

    async def serve(self, *, pod_uid: str, target: Any,
                    timeout: float) -> tuple[str, int] | None: ...


@dataclass(frozen=True, kw_only=True)
class _EdgeRequest:
    container_port: int
    host: str
    port: int
    provider: str
    edge_auth: str | None
    kind: Literal["ip", "hostname"] = "hostname"  # a port-forward asks only for edge routes


class GatewayDial(_CloudDial):
    """Dials the traffic gateway's listener for a hostname-only replica port.

    The edge's name passes the address filter first (as for an EndpointSlice); asking for the
    route allocates it when no Service has (it stays until the pod is gone) and waits until
    the gateway pod serving it is programmed. The gateway pod's address is the cluster's own
    (the operator's configuration or its Ready pods), so the cloud filter does not apply to it;
    the ``dialer`` (a lab's address map, else direct) connects as for a published address.
    """

    def __init__(self, *, gateway: GatewayRoutes, dialer: Dialer = DIRECT,
                 policy: AddressPolicy = DEFAULT_POLICY, timeout: float = 10.0) -> None:
        super().__init__(dialer=dialer, policy=policy, timeout=timeout)
        self._gateway = gateway

    async def __call__(self, placement: Placement, port: int) -> Connection:
        where, entries = self._published(placement, port)
        edges = [p for p in entries if p.kind == "hostname"]
        if not edges:
            raise self._nothing(placement, port, where)
        edge = edges[0]
        reason = refusal(edge.host, kind="hostname", policy=self._policy)
        if reason is not None:
            raise PortRefused(f"cannot reach port {port} of pod {where}: {_address(edge)} "
                              f"refused: {describe(reason)}")
        request = _EdgeRequest(container_port=port, host=edge.host, port=edge.port,
                               provider=placement.provider_name, edge_auth=edge.edge_auth)
        try:
            routed = await self._gateway.serve(pod_uid=placement.uid, target=request,
                                               timeout=self._timeout)
        except TimeoutError:
            raise PortRefused(f"the traffic gateway has not programmed a route to port {port} "
                              f"of pod {where} ({_address(edge)}) in {self._timeout:g}s") \
                from None
        if routed is None:
            raise PortRefused(f"the traffic gateway does not serve port {port} of pod {where} "
                              f"({_address(edge)}): the pod's policy says traffic: direct, "
                              "every gateway port is taken, or no gateway pod is healthy")
        address, gateway_port = routed
        via = f"gateway {address}:{gateway_port}"
        try:
            host, real_port = self._dialer.resolve(address, gateway_port)
            return await asyncio.wait_for(asyncio.open_connection(host, real_port),
                                          timeout=self._timeout)
        except NoRoute:
            problem = "no route"
        except TimeoutError:
            problem = f"no answer in {self._timeout:g}s"
        except OSError as exc:
            problem = str(exc.strerror or exc)
        raise PortRefused(f"cannot reach port {port} of pod {where} through {via}: {problem}")


class PortDial:
    """The kubelet API's dial: the raw address a cloud published for the port when there is
    one (:class:`PublishedDial`), else the traffic gateway's route to its HTTPS edge
    (:class:`GatewayDial`, when a gateway is set up), else :class:`PublishedDial`'s refusal."""

    def __init__(self, *, published: PublishedDial, gateway: GatewayDial | None) -> None:
        self._published = published
        self._gateway = gateway

    async def __call__(self, placement: Placement, port: int) -> Connection:
        entries = _entries(placement, port)
        if self._gateway is not None and entries \
                and not any(p.scheme is None for p in entries) and is_running(placement):
            return await self._gateway(placement, port)
        return await self._published(placement, port)


def _check_running(placement: Placement) -> None:
    if not is_running(placement):
        raise PortRefused(f"instance {placement.instance.id} on provider "
                          f"{placement.provider_name} is {placement.instance.state.value}, "
                          "not running")


def _entries(placement: Placement, port: int) -> list[PublishedPort]:
    return [p for p in placement.instance.published
            if p.container_port == port and p.protocol.upper() == "TCP"]


def _address(entry: PublishedPort) -> str:
    host = f"[{entry.host}]" if ":" in entry.host else entry.host
    return f"{host}:{entry.port}"

"""The dial step of port-forward: a cloud pod's declared port as a connected byte stream.

Why it exists: port-forward must reach a cloud pod's port the way its traffic does, and only
that way. :func:`declared_ports` reads what the pod author declared (only those ports are
forwarded; an undeclared one is refused naming the pod, the port and the declared ports), and
:class:`PublishedDial` connects to the address the cloud published for the port, after the same
screening every published address gets (:func:`providers.addresses.refusal`: never a metadata,
loopback, private or in-cluster address, whatever the cloud reported), through the
:class:`~vkprovider.probing.dialing.Dialer` the prober uses (the lab's address map, else
direct).

One function shape, ``dial(placement, port) -> (reader, writer)`` (:data:`Dial`), so a gateway
route (hostname-only clouds, whose ports are published only behind the cloud's TLS proxy) can
plug in beside the published-address one without the session knowing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from providers.addresses import DEFAULT_POLICY, AddressPolicy, describe, refusal
from providers.base import PublishedPort
from vkprovider.api.portforward.session import PortRefused
from vkprovider.api.view import Placement, is_running
from vkprovider.probing.dialing import DIRECT, Dialer, NoRoute

__all__ = ["DeclaredPort", "Dial", "PublishedDial", "declared_ports", "describe_ports"]

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


class PublishedDial:
    """Dials the address the cloud published for a container port (the IP:port clouds' path)."""

    def __init__(self, *, dialer: Dialer = DIRECT, policy: AddressPolicy = DEFAULT_POLICY,
                 timeout: float = 10.0) -> None:
        self._dialer = dialer
        self._policy = policy
        self._timeout = timeout

    async def __call__(self, placement: Placement, port: int) -> Connection:
        where = f"{placement.namespace}/{placement.pod}"
        if not is_running(placement):
            raise PortRefused(f"instance {placement.instance.id} on provider "
                              f"{placement.provider_name} is {placement.instance.state.value}, "
                              "not running")
        entries = [p for p in placement.instance.published
                   if p.container_port == port and p.protocol.upper() == "TCP"]
        raw = [p for p in entries if p.scheme is None]
        if not raw:
            if entries:
                raise PortRefused(
                    f"provider {placement.provider_name} publishes port {port} of pod {where} "
                    f"only behind its TLS proxy ({_address(entries[0])}); forwarding to it "
                    "needs the gateway route")
            raise PortRefused(f"provider {placement.provider_name} publishes no address for "
                              f"port {port} of pod {where} (yet)")
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


def _address(entry: PublishedPort) -> str:
    host = f"[{entry.host}]" if ":" in entry.host else entry.host
    return f"{host}:{entry.port}"

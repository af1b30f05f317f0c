"""``vkprovider dev curl NS/SERVICE[:PORT][/PATH]``: one request to a Service on the lab network.

Why it exists: under ``vkprovider dev up`` (and the demo) pods and cloud instances have virtual
addresses (10.244.x.y inside, 198.18.x.y on the mock cloud) that nothing on the machine routes;
the lab's *address map* (:mod:`vkprovider.probing.dialing`) says which loopback listener serves
each one, as kube-proxy's DNAT would. Plain ``curl`` cannot go through it; this command does what
kube-proxy and curl would together: read the Service, take a ready endpoint of its EndpointSlices
(the stock controller's and vkprovider's own; the port named like the Service port), dial it
through the map, send ``GET PATH`` and print the answer's body on stdout. Which endpoint answered,
the real listener and the status go to stderr. Exit status 0 on a 2xx answer, 1 on any other
answer, no ready endpoint, or no route.

The map is ``--address-map DIR``, else ``$VKP_ADDRESS_MAP`` (``dev up`` prints the value).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from vkprovider.errors import ConfigError, VKError
from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import AddressMap, NoRoute
from vkprovider.probing.transport import DialingTransport
from vkprovider.testing.loadgen import SERVICE_NAME_LABEL, ready_endpoints

__all__ = ["Answer", "DevCurlError", "Target", "curl_service", "parse_target"]

_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_TARGET = re.compile(rf"^(?P<ns>{_NAME})/(?P<svc>{_NAME})(:(?P<port>[A-Za-z0-9-]+))?"
                     r"(?P<path>/.*)?$")


class DevCurlError(VKError):
    """The Service could not be reached: no such Service or port, no ready endpoint, no route."""


@dataclass(frozen=True, kw_only=True)
class Target:
    namespace: str
    service: str
    port: str | None  # the Service port's name or number; None: its only port
    path: str


@dataclass(frozen=True, kw_only=True)
class Answer:
    endpoint: str  # the virtual address:port that answered, as the EndpointSlice has it
    via: str  # the real listener the address map routed it to
    status: int
    body: str


def parse_target(text: str) -> Target:
    """``NS/SERVICE[:PORT][/PATH]``; a :class:`ConfigError` naming the text otherwise."""
    match = _TARGET.match(text)
    if not match:
        raise ConfigError(f"{text!r} is not NS/SERVICE[:PORT][/PATH] (e.g. serving/inference/ or "
                          "dev/llm:web/healthz)")
    return Target(namespace=match["ns"], service=match["svc"], port=match["port"],
                  path=match["path"] or "/")


def address_map_dir(*, flag: str | None, env: str | None) -> Path:
    """The address map to dial through: the flag, else the environment variable's value."""
    given, named = (flag, "--address-map") if flag else (env, "VKP_ADDRESS_MAP")
    if not given:
        raise ConfigError("no address map: pass --address-map DIR or set VKP_ADDRESS_MAP "
                          "(vkprovider dev up prints it)")
    path = Path(given).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{named} {given}: not a directory (is dev up still running?)")
    return path


def _port_name(svc: dict[str, Any], target: Target) -> str:
    ports = (svc.get("spec") or {}).get("ports") or []
    name = f"{target.namespace}/{target.service}"
    if target.port is None:
        if len(ports) != 1:
            raise DevCurlError(f"service {name} has {len(ports)} ports; name one "
                               f"({', '.join(str(p.get('name')) for p in ports)})")
        return str(ports[0].get("name") or "")
    for p in ports:
        if target.port in (p.get("name"), str(p.get("port"))):
            return str(p.get("name") or "")
    raise DevCurlError(f"service {name} has no port {target.port!r}")


async def curl_service(*, kube: KubeClient, target: Target, address_map: Path,
                       timeout: float = 10.0, choose: Any = random.choice) -> Answer:
    """``GET target.path`` from one ready endpoint of the Service, through ``address_map``."""
    name = f"{target.namespace}/{target.service}"
    svc = await kube.get(f"/api/v1/namespaces/{target.namespace}/services/{target.service}")
    port_name = _port_name(svc, target)
    slices = await kube.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{target.namespace}/endpointslices",
        params={"labelSelector": f"{SERVICE_NAME_LABEL}={target.service}"})
    endpoints = ready_endpoints(slices.get("items") or [], port_name=port_name)
    if not endpoints:
        raise DevCurlError(f"service {name} has no ready endpoint (are its pods Ready?)")
    host, port = choose(endpoints)
    dialer = AddressMap(address_map)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        real_host, real_port = dialer.resolve(host, port)
    except NoRoute as exc:
        raise DevCurlError(f"{netloc}: {exc} in the address map {address_map}") from exc
    async with httpx.AsyncClient(transport=DialingTransport(dialer=dialer),
                                 timeout=httpx.Timeout(timeout),
                                 headers={"User-Agent": "vkprovider-dev-curl"}) as http:
        try:
            resp = await http.get(f"http://{netloc}{target.path}")
        except httpx.HTTPError as exc:
            raise DevCurlError(f"{netloc} (via {real_host}:{real_port}): "
                               f"{type(exc).__name__}: {exc}") from exc
    return Answer(endpoint=netloc, via=f"{real_host}:{real_port}", status=resp.status_code,
                  body=resp.text)

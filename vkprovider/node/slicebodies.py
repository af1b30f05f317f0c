"""What the provider's EndpointSlices should hold, computed from Services and told pods alone.

Why it exists apart from :mod:`vkprovider.node.endpointslices`: the desired slices (which
endpoint each cloud replica gets, at which published address and port, in which slice, and which
replicas get none and why) are a pure function of a Service, the pods told so far, the address
filter and the traffic gateway's answer. The controller there only watches, diffs and writes.
Keeping the rules here keeps them testable without a cluster, and the controller small.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from providers.addresses import DEFAULT_POLICY, AddressPolicy, refusal

Body = dict[str, Any]

MANAGED_BY = "vkprovider.io"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
NODE_LABEL = "vkprovider.io/node"
PORTS_ANNOTATION = "vkprovider.io/ports"
NOT_ROUTABLE_REASON = "EndpointNotRoutable"
MAX_ENDPOINTS = 100  # per slice, as the stock controller (--max-endpoints-per-slice default)
NAME_MAX = 63

SERVICES_PATH = "/api/v1/services"
SLICES_PATH = "/apis/discovery.k8s.io/v1/endpointslices"

#: (container name, port name or None, container port, protocol), as the pod declares them.
ContainerPort = tuple[str, str | None, int, str]
Family = Literal["IPv4", "IPv6"]
_V4_LINK_LOCAL_MULTICAST = ipaddress.ip_network("224.0.0.0/24")


def managed_selector(node: str) -> str:
    """The label selector of the slices one virtual node's controller manages."""
    return f"{MANAGED_BY_LABEL}={MANAGED_BY},{NODE_LABEL}={node}"


def slices_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
    return f"{base}/{name}" if name else base


# ---- what the integrator tells ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EndpointTarget:
    """How one container port of a cloud pod is reached now, and whether to send traffic there.

    ``host:port`` is what a client dials (``port`` may differ from ``container_port``); ``kind``
    says whether ``host`` is an IP address or a DNS name. Several targets may name one container
    port (the preferred first); the first ``"ip"`` one is published.
    """

    container_port: int
    protocol: str
    host: str
    port: int
    kind: Literal["ip", "hostname"]
    ready: bool
    serving: bool
    terminating: bool
    provider: str = ""  # the cloud (the gateway adds that cloud's edge key)
    edge_auth: str | None = None  # the header a hostname edge wants its API key in


class GatewayRouter(Protocol):
    """Where the traffic gateway serves a hostname-only replica port (vkprovider/gateway)."""

    #: set once the gateway's first pass is done (what its pods serve is known)
    first_pass: asyncio.Event

    def route(self, *, pod_uid: str, target: EndpointTarget) -> tuple[str, int] | None:
        """``(gateway address, gateway port)``, or None when the gateway does not serve it."""
        ...

    def wants(self, *, pod_uid: str, target: EndpointTarget) -> bool:
        """Whether the gateway is meant to serve it (by the pod's policy's ``traffic``)."""
        ...

    def is_programmed(self, *, pod_uid: str, container_port: int,
                      at: tuple[str, int]) -> bool:
        """Whether the gateway pod at ``at`` serves that route now (a pass programmed it)."""
        ...

    def forget(self, pod_uid: str) -> None: ...


@dataclass(frozen=True, kw_only=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...]  # sorted (hashable, comparable)
    container_ports: tuple[ContainerPort, ...]
    endpoints: tuple[EndpointTarget, ...]

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


# ---- pure parts: matching, target ports, grouping, naming, diffing ------------------------------


def selects(service: Body) -> Mapping[str, str] | None:
    """The Service's selector if this controller manages slices for it, else None.

    ExternalName Services and Services without a selector (their Endpoints are someone else's)
    get none, as with the stock controller.
    """
    spec = service.get("spec") or {}
    if spec.get("type") == "ExternalName":
        return None
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not selector:
        return None
    return {str(k): str(v) for k, v in selector.items()}


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def resolve_target_port(service_port: Mapping[str, Any],
                        container_ports: Iterable[ContainerPort]) -> int | None:
    """The container port a Service port sends to, as the stock controller's ``FindPort``.

    A numeric ``targetPort`` is that number (declared or not); a named one is the container port
    of that name and the Service port's protocol, or None (the pod gets no endpoint for that
    port). No ``targetPort`` means the Service's ``port``.
    """
    protocol = service_port.get("protocol") or "TCP"
    target = service_port.get("targetPort")
    if target is None or target == "":
        target = service_port.get("port")
    if isinstance(target, bool):
        return None
    if isinstance(target, int):
        return target
    if isinstance(target, str):
        for _container, name, number, proto in container_ports:
            if name == target and (proto or "TCP") == protocol:
                return number
    return None


@dataclass(frozen=True, order=True)
class SlicePort:
    name: str
    protocol: str
    port: int
    app_protocol: str | None = None

    def body(self) -> Body:
        out: Body = {"name": self.name, "protocol": self.protocol, "port": self.port}
        if self.app_protocol:
            out["appProtocol"] = self.app_protocol
        return out


@dataclass(frozen=True)
class DesiredEndpoint:
    address: str
    family: Family
    ports: tuple[SlicePort, ...]  # sorted
    ready: bool
    serving: bool
    terminating: bool
    pod_namespace: str
    pod_name: str
    pod_uid: str

    def body(self, node: str) -> Body:
        return {
            "addresses": [self.address],
            "conditions": {"ready": self.ready, "serving": self.serving,
                           "terminating": self.terminating},
            "targetRef": {"kind": "Pod", "namespace": self.pod_namespace,
                          "name": self.pod_name, "uid": self.pod_uid},
            "nodeName": node,
        }


@dataclass(frozen=True)
class Unroutable:
    """A Service port of a pod that cannot go into a slice: why, and where it is reached."""

    pod_uid: str
    pod_name: str
    port_name: str
    container_port: int
    host: str
    port: int
    why: Literal["hostname", "address"]  # a DNS name, or an address the API server refuses


def address_family(host: str) -> tuple[str, Family] | None:
    """The canonical form and family of an IP the API server accepts in a slice, else None.

    The API server refuses unspecified, loopback and link-local addresses in EndpointSlices.
    """
    try:
        ip = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return address_family(str(ip.ipv4_mapped))  # Go parses it as the IPv4 address
    if ip.is_unspecified or ip.is_loopback or ip.is_link_local:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_multicast and ip.packed[1] & 0x0F == 0x02:  # link-local multicast
            return None
        return str(ip), "IPv6"
    if ip in _V4_LINK_LOCAL_MULTICAST:
        return None
    return str(ip), "IPv4"


def _usable(target: EndpointTarget, policy: AddressPolicy) -> tuple[str, Family] | None:
    """The slice address of an IP target the filter and the API server both accept."""
    if target.kind != "ip" or refusal(target.host, kind="ip", policy=policy) is not None:
        return None
    return address_family(target.host)


def endpoints_for(service: Body, pod: PodRecord, *, policy: AddressPolicy = DEFAULT_POLICY,
                  gateway: GatewayRouter | None = None
                  ) -> tuple[list[DesiredEndpoint], list[Unroutable]]:
    """The slice endpoints one pod contributes to one Service, and its unroutable ports.

    An address ``policy`` refuses (``providers/addresses.py``) is never an endpoint. The pod
    controller screens instances before they get here; this is the last line, for any caller.
    A hostname-only port is the ``gateway``'s address and port when it serves it (the gateway's
    address is the cluster's own, so the cloud filter does not apply to it); until a pass has
    programmed that route into that gateway pod, the endpoint is neither ready nor serving
    (whatever ``publishNotReadyAddresses`` says: the address answers 503 until then).
    """
    spec = service.get("spec") or {}
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    by_address: dict[tuple[str, Family], list[tuple[SlicePort | None, EndpointTarget]]] = {}
    unprogrammed: set[tuple[str, Family]] = set()  # gateway routes no pass programmed yet
    unroutable: list[Unroutable] = []
    service_ports = spec.get("ports") or []
    for sp in service_ports:
        protocol = str(sp.get("protocol") or "TCP")
        port_name = str(sp.get("name") or "")
        number = resolve_target_port(sp, pod.container_ports)
        if number is None:
            continue
        targets = [t for t in pod.endpoints
                   if t.container_port == number and (t.protocol or "TCP") == protocol]
        chosen: tuple[EndpointTarget, tuple[str, Family]] | None = None
        for target in targets:  # preferred first; the first usable IP wins
            addr = _usable(target, policy)
            if addr is not None:
                chosen = (target, addr)
                break
        # what the gateway would front: that IP, else a hostname edge the filter accepts; and
        # where the IP goes through the gateway anyway (traffic: gateway), the cloud's TLS edge
        # for that port when it offers one (RunPod's proxy beside the public IP)
        edge = next((t for t in targets if t.kind == "hostname"
                     and refusal(t.host, kind="hostname", policy=policy) is None), None)
        via = chosen[0] if chosen is not None else (
            targets[0] if targets and targets[0] is edge else None)
        if gateway is not None and via is not None and via.kind == "ip" and edge is not None \
                and gateway.wants(pod_uid=pod.uid, target=via):
            via = edge
        pending = False  # the gateway is meant to serve it but has no route yet: no warning
        if gateway is not None and via is not None:
            routed = gateway.route(pod_uid=pod.uid, target=via)
            gw_addr = address_family(routed[0]) if routed is not None else None
            if routed is not None and gw_addr is not None:
                chosen = (replace(via, port=routed[1]), gw_addr)
                if not gateway.is_programmed(pod_uid=pod.uid, container_port=via.container_port,
                                             at=routed):
                    unprogrammed.add(gw_addr)
            elif gateway.wants(pod_uid=pod.uid, target=via):
                chosen, pending = None, True  # traffic: gateway is never a direct endpoint
        if chosen is None:
            if targets and not pending:
                first = targets[0]
                unroutable.append(Unroutable(
                    pod_uid=pod.uid, pod_name=pod.name, port_name=port_name,
                    container_port=number, host=first.host, port=first.port,
                    why="hostname" if first.kind == "hostname" else "address"))
            continue  # not published (yet): no endpoint for this port
        target, addr = chosen
        app_protocol = sp.get("appProtocol")
        by_address.setdefault(addr, []).append(
            (SlicePort(port_name, protocol, target.port,
                       str(app_protocol) if app_protocol else None), target))
    if not service_ports:  # a headless Service without ports: the addresses alone
        for target in pod.endpoints:
            addr = _usable(target, policy)
            if addr is not None:
                by_address.setdefault(addr, []).append((None, target))
    out: list[DesiredEndpoint] = []
    for (address, family), items in sorted(by_address.items()):
        ports = tuple(sorted({p for p, _ in items if p is not None}))
        terminating = any(t.terminating for _, t in items)
        ready = publish_not_ready or (all(t.ready for _, t in items) and not terminating)
        serving = all(t.serving for _, t in items)
        if (address, family) in unprogrammed:
            ready = serving = False
        out.append(DesiredEndpoint(
            address=address, family=family, ports=ports, ready=ready,
            serving=serving, terminating=terminating,
            pod_namespace=pod.namespace, pod_name=pod.name, pod_uid=pod.uid))
    return out, unroutable


def group_endpoints(endpoints: Iterable[DesiredEndpoint]
                    ) -> dict[tuple[Family, tuple[SlicePort, ...]], list[DesiredEndpoint]]:
    """Endpoints by (address family, port set), each group in a stable order."""
    groups: dict[tuple[Family, tuple[SlicePort, ...]], list[DesiredEndpoint]] = {}
    for ep in endpoints:
        groups.setdefault((ep.family, ep.ports), []).append(ep)
    for items in groups.values():
        items.sort(key=lambda e: (e.pod_uid, e.address))
    return groups


def slice_name(service: str, node: str, family: str, ports: Sequence[SlicePort],
               chunk: int = 0) -> str:
    """``<service>-<hash>[-<chunk>]``, at most 63 characters.

    The hash covers the node (two virtual nodes never write one slice), the address family, the
    port set, and the Service's full name (long names cut to the same prefix stay apart).
    """
    key = json.dumps([service, node, family, [[p.name, p.protocol, p.port, p.app_protocol]
                                     for p in sorted(ports)]], separators=(",", ":"))
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    suffix = f"-{digest}" + (f"-{chunk}" if chunk else "")
    prefix = service[: NAME_MAX - len(suffix)].rstrip("-.")
    return f"{prefix or 'svc'}{suffix}"


def owner_reference(service: Body) -> Body:
    meta = service.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Service", "name": meta.get("name"),
            "uid": meta.get("uid"), "controller": True, "blockOwnerDeletion": True}


def slice_labels(service_name: str, node: str) -> dict[str, str]:
    return {SERVICE_NAME_LABEL: service_name, MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: node}


def build_slices(*, service: Body, node: str, pods: Iterable[PodRecord],
                 policy: AddressPolicy = DEFAULT_POLICY, gateway: GatewayRouter | None = None
                 ) -> tuple[dict[str, Body], list[Unroutable]]:
    """Every slice this node should hold for ``service`` (name -> body), and what cannot be."""
    meta = service.get("metadata") or {}
    name = str(meta.get("name"))
    namespace = str(meta.get("namespace"))
    endpoints: list[DesiredEndpoint] = []
    unroutable: list[Unroutable] = []
    for pod in pods:
        eps, bad = endpoints_for(service, pod, policy=policy, gateway=gateway)
        endpoints.extend(eps)
        unroutable.extend(bad)
    out: dict[str, Body] = {}
    for (family, ports), items in sorted(group_endpoints(endpoints).items()):
        for chunk, start in enumerate(range(0, len(items), MAX_ENDPOINTS)):
            sname = slice_name(name, node, family, ports, chunk)
            out[sname] = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": sname, "namespace": namespace,
                             "labels": slice_labels(name, node),
                             "ownerReferences": [owner_reference(service)]},
                "addressType": family,
                "ports": [p.body() for p in ports],
                "endpoints": [e.body(node) for e in items[start:start + MAX_ENDPOINTS]],
            }
    return out, unroutable


def _projection(obj: Body) -> Any:
    """What this controller owns of a slice, in a comparable form."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    owners = sorted(
        (str(o.get("apiVersion")), str(o.get("kind")), str(o.get("name")), str(o.get("uid")),
         bool(o.get("controller")), bool(o.get("blockOwnerDeletion")))
        for o in meta.get("ownerReferences") or [])
    ports = sorted((str(p.get("name") or ""), str(p.get("protocol") or "TCP"), p.get("port"),
                    p.get("appProtocol")) for p in obj.get("ports") or [])
    endpoints = []
    for e in obj.get("endpoints") or []:
        cond = e.get("conditions") or {}
        ref = e.get("targetRef") or {}
        endpoints.append((tuple(e.get("addresses") or ()),
                          cond.get("ready"), cond.get("serving"), cond.get("terminating"),
                          ref.get("kind"), ref.get("namespace"), ref.get("name"), ref.get("uid"),
                          e.get("nodeName")))
    return (tuple(sorted((k, labels.get(k)) for k in (SERVICE_NAME_LABEL, MANAGED_BY_LABEL,
                                                         NODE_LABEL))),
            owners, obj.get("addressType"), ports, sorted(endpoints, key=repr))


def slice_differs(existing: Body, desired: Body) -> bool:
    """True when ``existing`` must be updated to be ``desired`` (foreign labels are ignored)."""
    return bool(_projection(existing) != _projection(desired))


def update_body(existing: Body, desired: Body) -> Body:
    """``desired`` as a full update of ``existing``: its resourceVersion, other labels kept."""
    meta = existing.get("metadata") or {}
    body = dict(desired)
    new_meta = dict(desired["metadata"])
    new_meta["labels"] = {**(meta.get("labels") or {}), **new_meta["labels"]}
    if meta.get("annotations"):
        new_meta["annotations"] = meta["annotations"]
    new_meta["resourceVersion"] = meta.get("resourceVersion")
    body["metadata"] = new_meta
    return body


def not_routable_message(service_name: str, items: Sequence[Unroutable], namespace: str) -> str:
    first = items[0]
    ports = ", ".join(
        f"{u.port_name or u.container_port} (container port {u.container_port}) at "
        f"{u.host}:{u.port}" for u in items)
    if first.why == "hostname":
        why = ("is reachable only by hostname; FQDN EndpointSlices are deprecated, so it is "
               "not published and kube-proxy will not send this Service's traffic there. "
               "Reach it through a gateway or mesh that reads the pod's annotation "
               f"{PORTS_ANNOTATION}")
    else:
        why = ("is published at an address EndpointSlices refuse (loopback, link-local or "
               f"unspecified), so it is not published; the pod's annotation {PORTS_ANNOTATION} "
               "shows it")
    return f"Pod {namespace}/{first.pod_name} (Service {service_name}): port {ports} {why}"


def slim_service(obj: Body) -> Body:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")
                     if k in meta},
        "spec": {k: spec[k] for k in ("type", "selector", "ports", "publishNotReadyAddresses")
                 if k in spec},
    }


def slim_slice(obj: Body) -> Body:
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj

"""Provider-managed EndpointSlices: Services reach cloud replicas where the cloud publishes them.

Why it exists: a cloud replica is reached at what its cloud publishes per container port (an IP
and a port that is often not the container port: RunPod and Vast.ai map ports), not at
``podIP:targetPort``. The stock EndpointSlice controller only publishes pods with a ``podIP``, and
the provider leaves ``status.podIP`` empty unless the cloud maps ports one-to-one, so nothing
would route to a burst replica. This controller writes, for every Service that selects a cloud pod
of this virtual node, EndpointSlices whose endpoints are the published addresses and whose ports
are the published ports, named as the Service's ports; kube-proxy (and anything else that reads
EndpointSlices by ``kubernetes.io/service-name``) then sends traffic there.

How it is driven:

* The pod side is told, not watched: the integrator calls :meth:`EndpointSliceController.set_pod`
  (labels, declared container ports, the cloud's published endpoints with probe-derived
  conditions) and :meth:`EndpointSliceController.remove_pod`. Both are synchronous and cheap: an
  unchanged record is ignored, a changed one marks the Services it could concern dirty. Writes
  are coalesced per Service (a keyed work queue plus a short batch delay), and a slice is only
  written when its content differs from what the API server holds, so a probe tick that changes
  nothing costs no API call.
* Services (all namespaces) and this node's own slices (label selector on the managed-by value
  and the node label) are watched with informers; any change of either re-reconciles the Service.
  A restarted provider lists its slices first and adopts them (names are deterministic), fixing
  or deleting what no longer matches: never a duplicate. Until the integrator says it has told
  every pod (:meth:`EndpointSliceController.mark_pods_synced`, or ``pods_sync_timeout``), nothing
  is reconciled, so a restart does not empty slices that are still right.

What a slice looks like (the stock controller's shape, our values): one slice per address family
and per set of published ports (ports are per slice, and published ports differ per instance on
RunPod and Vast.ai, exactly as the stock controller groups pods whose named ports differ), at
most ``MAX_ENDPOINTS`` endpoints; labels ``kubernetes.io/service-name``,
``endpointslice.kubernetes.io/managed-by: vkprovider.io`` and ``vkprovider.io/node``; endpoints
with ``targetRef`` to the Pod, ``nodeName`` the virtual node and ``conditions`` as told; an
ownerReference to the Service so the garbage collector removes slices with it (this controller
also deletes them itself at once, tolerating NotFound).

Hostname-only ports (SaladCloud's access domain, RunPod's HTTP proxy) are **not** written into
slices: FQDN EndpointSlices are deprecated (the API server warns on them) and kube-proxy ignores
them. Such a Service+pod pair is counted in ``vkprovider_endpointslice_hostname_only_endpoints``
and told once with a Warning Event ``EndpointNotRoutable`` on the Service, pointing to the pod's
``vkprovider.io/ports`` annotation (where a gateway or mesh can read the hostname), unless the
traffic gateway (``vkprovider/gateway``) serves them: then the endpoint is the gateway pod's
address and the port it allocated for that replica port (a :class:`GatewayRouter` says which;
``traffic: direct`` keeps the warning; a replica the gateway is meant to serve but has no route
for yet gets no endpoint and no warning: the gateway logs why). Under ``traffic: gateway`` an
IP:port replica is fronted by the gateway too and never published directly. Addresses the
API server refuses (loopback, link-local, unspecified) are skipped the same way, and so is any
address the filter of ``providers/addresses.py`` refuses (private, CGNAT, metadata, the cluster's
own ranges, ...): the pod controller screens instances before telling them here, and
:func:`endpoints_for` applies the same filter again, so a refused address never reaches a slice.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from providers.addresses import DEFAULT_POLICY, AddressPolicy, refusal
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer, object_key
from vkprovider.logs import kv
from vkprovider.metrics import Metrics
from vkprovider.node.slicehold import carry_held, held_uids
from vkprovider.node.workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)

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

    def route(self, *, pod_uid: str, target: EndpointTarget) -> tuple[str, int] | None:
        """``(gateway address, gateway port)``, or None when the gateway does not serve it."""
        ...

    def wants(self, *, pod_uid: str, target: EndpointTarget) -> bool:
        """Whether the gateway is meant to serve it (by the pod's policy's ``traffic``)."""
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
    address is the cluster's own, so the cloud filter does not apply to it).
    """
    spec = service.get("spec") or {}
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    by_address: dict[tuple[str, Family], list[tuple[SlicePort | None, EndpointTarget]]] = {}
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
        out.append(DesiredEndpoint(
            address=address, family=family, ports=ports, ready=ready,
            serving=all(t.serving for _, t in items), terminating=terminating,
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


def _slim_service(obj: Body) -> Body:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")
                     if k in meta},
        "spec": {k: spec[k] for k in ("type", "selector", "ports", "publishNotReadyAddresses")
                 if k in spec},
    }


def _slim_slice(obj: Body) -> Body:
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class _Retry(Exception):
    pass


# ---- the controller ------------------------------------------------------------------------------


class EndpointSliceController:
    def __init__(
        self,
        *,
        client: KubeClient,
        node: str,
        events: EventRecorder | None = None,
        metrics: Metrics | None = None,
        workers: int = 2,
        batch_seconds: float = 0.1,
        max_backoff: float = 30.0,
        pods_sync_timeout: float = 60.0,
        policy: AddressPolicy = DEFAULT_POLICY,
        gateway: GatewayRouter | None = None,
    ) -> None:
        self.client = client
        self.gateway = gateway  # serves hostname-only replica ports (None: they are warned of)
        self.node = node
        self.policy = policy  # the address filter, applied again to every endpoint
        self.events = events
        self.metrics = metrics
        self.workers = workers
        self.batch_seconds = batch_seconds
        self.pods_sync_timeout = pods_sync_timeout
        self.queue: WorkQueue[str] = WorkQueue(base_delay=0.2, max_delay=max_backoff)
        self.services = Informer(client=client, path=SERVICES_PATH, name="services",
                                 handler=self._on_service, transform=_slim_service)
        self.slices = Informer(client=client, path=SLICES_PATH, name="endpointslices",
                               params={"labelSelector": managed_selector(node)},
                               handler=self._on_slice, transform=_slim_slice)
        self.pods: dict[str, PodRecord] = {}  # uid -> what the integrator told
        self._pods_by_ns: dict[str, set[str]] = {}
        self._services_by_ns: dict[str, set[str]] = {}
        self._slice_service: dict[str, str] = {}  # slice key -> its Service's key
        self._slices_by_service: dict[str, set[str]] = {}
        self._hostname_only: dict[str, set[str]] = {}  # Service key -> pod uids
        self._told: set[tuple[str, str]] = set()  # (Service uid, pod uid) warned about
        self._pods_synced = asyncio.Event()
        # Pods whose state is unknown (their cloud not listed yet, node/slicehold.py): their
        # endpoints stay as the slices hold them. Until the pods are synced, every pod not told
        # is unknown.
        self._held: set[str] = set()
        self._timed_out = False  # started on pods_sync_timeout: every untold pod is held
        self.running = False
        self.started = asyncio.Event()  # informers synced, workers started
        self.writes = 0  # API writes made (tests and benches read it)

    # ---- what the integrator calls ---------------------------------------------------------

    def set_pod(self, *, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                container_ports: Sequence[ContainerPort],
                endpoints: Sequence[EndpointTarget]) -> None:
        """Tell what a cloud pod of this node looks like now. Cheap; a no-op when unchanged."""
        record = PodRecord(
            namespace=namespace, name=name, uid=uid,
            labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            container_ports=tuple((c, n, int(p), proto or "TCP")
                                  for c, n, p, proto in container_ports),
            endpoints=tuple(endpoints))
        self._release(uid)
        old = self.pods.get(uid)
        if old == record:
            return
        self.pods[uid] = record
        if old is not None and old.namespace != namespace:
            self._pods_by_ns.get(old.namespace, set()).discard(uid)
        self._pods_by_ns.setdefault(namespace, set()).add(uid)
        self._touch_services(old)
        self._touch_services(record)

    def remove_pod(self, *, uid: str) -> None:
        """The pod is gone from this node (deleted, or its endpoints should all go)."""
        self._release(uid)
        if self.gateway is not None:
            self.gateway.forget(uid)
        old = self.pods.pop(uid, None)
        if old is None:
            return
        uids = self._pods_by_ns.get(old.namespace)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._pods_by_ns[old.namespace]
        self._told = {t for t in self._told if t[1] != uid}
        self._touch_services(old)

    def refresh(self) -> None:
        """Re-reconcile every Service that selects a pod of this node (a gateway pod's health
        changed: its replicas are re-homed)."""
        for ns in self._pods_by_ns:
            for key in sorted(self._services_by_ns.get(ns, ())):
                self._enqueue(key)

    def mark_pods_synced(self) -> None:
        """Every pod of the node has been told once (or held): reconciling may start (and
        delete what no told or held pod backs)."""
        self._pods_synced.set()
        if self._timed_out:  # started after pods_sync_timeout: prune now
            self._timed_out = False
            for key in sorted(self._slices_by_service):
                self._enqueue(key)

    def hold_pod(self, *, uid: str) -> None:
        """The pod's state is unknown for now (its cloud not listed yet): keep its endpoints as
        the slices hold them until :meth:`set_pod` or :meth:`remove_pod` tells."""
        self._held.add(uid)

    def _release(self, uid: str) -> None:
        if uid not in self._held:
            return
        self._held.discard(uid)
        if self.running and uid not in self.pods:  # its kept endpoints may have to go
            for key, names in self._slices_by_service.items():
                if any(uid in held_uids({n: self.slices.store[n]}, held={uid}.__contains__)
                       for n in names if n in self.slices.store):
                    self._enqueue(key)

    def _is_held(self, uid: str) -> bool:
        return uid in self._held or (self._timed_out and uid not in self.pods)

    # ---- loops -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch, then reconcile until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.services.run(), name="services-informer")
            tg.create_task(self.slices.run(), name="endpointslices-informer")
            await self.services.synced.wait()
            await self.slices.synced.wait()
            if not self._pods_synced.is_set():
                try:
                    async with asyncio.timeout(self.pods_sync_timeout):
                        await self._pods_synced.wait()
                except TimeoutError:
                    self._timed_out = True
                    log.warning("pods not marked synced; reconciling EndpointSlices anyway, "
                                "keeping the endpoints of pods not told yet",
                                extra=kv(node=self.node, pods=len(self.pods)))
            self.running = True
            keys = set(self._slices_by_service)
            for ns in self._pods_by_ns:
                keys |= self._services_by_ns.get(ns, set())
            for key in sorted(keys):
                self.queue.add(key)
            log.info("endpointslices synced; starting workers",
                     extra=kv(node=self.node, services=len(self.services.store),
                              slices=len(self.slices.store), pods=len(self.pods)))
            self._set_slice_gauge()
            for i in range(self.workers):
                tg.create_task(self._worker(), name=f"endpointslice-worker-{i}")
            self.started.set()

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                await self.reconcile(key)
                self.queue.forget(key)
            except (APIError, _Retry) as exc:
                delay = self.queue.add_rate_limited(
                    key, at_least=getattr(exc, "retry_after", None) or 0.0)
                # a 409 now and then is the watch lagging our own write; a repeat is news
                level = logging.WARNING if self.queue.failures(key) > 3 else logging.INFO
                log.log(level, "endpointslice reconcile failed; retrying",
                        extra=kv(service=key, error=str(exc), delay=round(delay, 2),
                                 failures=self.queue.failures(key)))
            except Exception:  # a bug in one Service must not stop the others
                log.exception("endpointslice reconcile crashed", extra=kv(service=key))
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)

    # ---- events ----------------------------------------------------------------------------

    def _enqueue(self, key: str) -> None:
        if not self.running:
            return  # the first pass after sync covers everything
        if self.batch_seconds > 0:
            self.queue.add_after(key, self.batch_seconds)  # coalesce a burst of changes
        else:
            self.queue.add(key)

    def _touch_services(self, pod: PodRecord | None) -> None:
        if pod is None or not self.running:
            return
        labels = pod.label_map
        for key in self._services_by_ns.get(pod.namespace, ()):
            svc = self.services.store.get(key)
            selector = selects(svc) if svc is not None else None
            if selector is not None and selector_matches(selector, labels):
                self._enqueue(key)

    def _on_service(self, event: str, svc: Body) -> None:
        key = object_key(svc)
        ns = str((svc.get("metadata") or {}).get("namespace") or "")
        if event == "DELETED":
            keys = self._services_by_ns.get(ns)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._services_by_ns[ns]
            uid = str((svc.get("metadata") or {}).get("uid") or "")
            self._told = {t for t in self._told if t[0] != uid}
        else:
            self._services_by_ns.setdefault(ns, set()).add(key)
        if ns in self._pods_by_ns or key in self._slices_by_service:
            self._enqueue(key)

    def _on_slice(self, event: str, obj: Body) -> None:
        key = object_key(obj)
        self._index_slice(key, None if event == "DELETED" else obj)
        svc_key = self._slice_service.get(key) or _service_key_of(obj)
        if svc_key:
            self._enqueue(svc_key)
        self._set_slice_gauge()

    def _index_slice(self, key: str, obj: Body | None) -> None:
        old = self._slice_service.pop(key, None)
        if old is not None:
            keys = self._slices_by_service.get(old)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._slices_by_service[old]
        if obj is not None:
            svc_key = _service_key_of(obj)
            if svc_key:
                self._slice_service[key] = svc_key
                self._slices_by_service.setdefault(svc_key, set()).add(key)

    def _cache(self, key: str, obj: Body | None) -> None:
        """Our own write's result, before its watch event arrives (no 409 on a quick re-sync)."""
        if obj is None:
            self.slices.store.pop(key, None)
        else:
            self.slices.store[key] = _slim_slice(obj)
        self.slices.changes += 1
        self._index_slice(key, obj)
        self._set_slice_gauge()

    def _set_slice_gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.endpointslices.set(len(self.slices.store))

    # ---- reconcile -------------------------------------------------------------------------

    def desired(self, key: str) -> tuple[dict[str, Body], list[Unroutable]]:
        """The slices ``key``'s Service should have from this node, and what cannot be in them."""
        svc = self.services.store.get(key)
        selector = selects(svc) if svc is not None else None
        if svc is None or selector is None:
            return {}, []
        ns = key.split("/", 1)[0]
        pods = [self.pods[uid] for uid in sorted(self._pods_by_ns.get(ns, ()))
                if selector_matches(selector, self.pods[uid].label_map)]
        if not pods:
            return {}, []
        return build_slices(service=svc, node=self.node, pods=pods, policy=self.policy,
                            gateway=self.gateway)

    async def reconcile(self, key: str) -> None:
        ns = key.split("/", 1)[0]
        desired, unroutable = self.desired(key)
        self._note_unroutable(key, unroutable)
        existing = {self.slices.store[k]["metadata"]["name"]: self.slices.store[k]
                    for k in sorted(self._slices_by_service.get(key, ()))
                    if k in self.slices.store}
        svc = self.services.store.get(key)
        if (self._held or self._timed_out) and svc is not None \
                and selects(svc) is not None:
            carry_held(desired, existing, held=self._is_held)  # unknown: kept as they are
        failed: list[str] = []
        for name, body in desired.items():
            current = existing.get(name)
            try:
                if current is None:
                    await self._create(ns, name, body)
                elif slice_differs(current, body):
                    await self._update(ns, name, current, body)
            except (APIError, _Retry) as exc:
                failed.append(f"{name}: {exc}")
        for name, current in existing.items():
            if name in desired:
                continue
            try:
                await self._delete(ns, name, current)
            except (APIError, _Retry) as exc:
                failed.append(f"{name}: {exc}")
        if failed:
            raise _Retry("; ".join(failed))

    async def _create(self, ns: str, name: str, body: Body) -> None:
        try:
            created = await self.client.create(slices_path(ns), body)
        except ConflictError:
            # Ours by name (the node is in its hash) but not in our cache: labels stripped, or
            # the watch is behind. Read it and make it ours.
            self._count("create", "Conflict")
            try:
                current = await self.client.get(slices_path(ns, name))
            except NotFoundError as exc:  # deleted meanwhile (the GC?): create next time
                raise _Retry(f"{name} vanished after a create conflict") from exc
            await self._update(ns, name, current, body)
            return
        except APIError as exc:
            self._count("create", type(exc).__name__)
            raise
        self._count("create", "ok")
        self._cache(f"{ns}/{name}", created)
        log.info("endpointslice created",
                 extra=kv(slice=f"{ns}/{name}", endpoints=len(body["endpoints"])))

    async def _update(self, ns: str, name: str, current: Body, body: Body) -> None:
        try:
            updated = await self.client.request("PUT", slices_path(ns, name),
                                                body=update_body(current, body))
        except NotFoundError:
            self._count("update", "NotFound")
            self._cache(f"{ns}/{name}", None)
            raise
        except APIError as exc:  # 409: our copy is stale; the watch brings the new one
            self._count("update", type(exc).__name__)
            raise
        self._count("update", "ok")
        self._cache(f"{ns}/{name}", updated)

    async def _delete(self, ns: str, name: str, current: Body) -> None:
        uid = (current.get("metadata") or {}).get("uid")
        try:
            await self.client.delete(slices_path(ns, name), uid=str(uid) if uid else None)
        except NotFoundError:
            self._count("delete", "NotFound")  # the garbage collector was first
        except APIError as exc:
            self._count("delete", type(exc).__name__)
            raise
        else:
            self._count("delete", "ok")
            log.info("endpointslice deleted", extra=kv(slice=f"{ns}/{name}"))
        self._cache(f"{ns}/{name}", None)

    def _count(self, operation: str, result: str) -> None:
        self.writes += 1  # every write request sent, whatever its answer
        if self.metrics is not None:
            self.metrics.endpointslice_writes.labels(operation, result).inc()

    def _note_unroutable(self, key: str, items: list[Unroutable]) -> None:
        by_pod: dict[str, list[Unroutable]] = {}
        for u in items:
            by_pod.setdefault(u.pod_uid, []).append(u)
        if by_pod:
            self._hostname_only[key] = set(by_pod)
        else:
            self._hostname_only.pop(key, None)
        if self.metrics is not None:
            self.metrics.endpointslice_hostname_only.set(
                sum(len(v) for v in self._hostname_only.values()))
        if not by_pod:
            return
        svc = self.services.store.get(key) or {}
        meta = svc.get("metadata") or {}
        svc_uid = str(meta.get("uid") or "")
        for pod_uid, pod_items in sorted(by_pod.items()):
            if (svc_uid, pod_uid) in self._told:
                continue
            self._told.add((svc_uid, pod_uid))
            message = not_routable_message(str(meta.get("name")), pod_items,
                                           str(meta.get("namespace")))
            log.warning("cloud endpoint not routable by EndpointSlice",
                        extra=kv(service=key, pod=pod_items[0].pod_name, why=pod_items[0].why))
            if self.events is not None:
                ref = {"apiVersion": "v1", "kind": "Service",
                       "metadata": {k: meta.get(k) for k in
                                    ("name", "namespace", "uid", "resourceVersion")}}
                self.events.record(obj=ref, reason=NOT_ROUTABLE_REASON, message=message,
                                   type_="Warning")


def _service_key_of(obj: Body) -> str:
    meta = obj.get("metadata") or {}
    name = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    ns = meta.get("namespace")
    return f"{ns}/{name}" if name and ns else ""

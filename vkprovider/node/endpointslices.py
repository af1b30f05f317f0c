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
for yet gets no endpoint and no warning: the gateway logs why). Such an endpoint is ready only
once a gateway pass has programmed its route into that gateway pod; the gateway tells
:meth:`EndpointSliceController.resync` after each pass which replicas that changed for.
Under ``traffic: gateway`` an IP:port replica is fronted by the gateway too and never published
directly. Addresses the
API server refuses (loopback, link-local, unspecified) are skipped the same way, and so is any
address the filter of ``providers/addresses.py`` refuses (private, CGNAT, metadata, the cluster's
own ranges, ...): the pod controller screens instances before telling them here, and
:func:`endpoints_for` applies the same filter again, so a refused address never reaches a slice.

What the slices should hold is computed by pure functions in :mod:`vkprovider.node.slicebodies`;
this module watches, diffs and writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from providers.addresses import DEFAULT_POLICY, AddressPolicy
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer, object_key
from vkprovider.logs import kv
from vkprovider.metrics import Metrics
from vkprovider.node.slicebodies import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_ENDPOINTS,
    NODE_LABEL,
    NOT_ROUTABLE_REASON,
    SERVICE_NAME_LABEL,
    SERVICES_PATH,
    SLICES_PATH,
    ContainerPort,
    EndpointTarget,
    GatewayRouter,
    PodRecord,
    SlicePort,
    Unroutable,
    address_family,
    build_slices,
    endpoints_for,
    group_endpoints,
    managed_selector,
    not_routable_message,
    resolve_target_port,
    selector_matches,
    selects,
    slice_differs,
    slice_name,
    slices_path,
    slim_service,
    slim_slice,
    update_body,
)
from vkprovider.node.slicehold import carry_held, held_uids
from vkprovider.node.workqueue import ShutDown, WorkQueue

#: The desired-state rules live in slicebodies; these names are re-exported for the importers
#: of this module (the controller is the public face of both).
__all__ = [
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "MAX_ENDPOINTS",
    "NODE_LABEL",
    "NOT_ROUTABLE_REASON",
    "SERVICE_NAME_LABEL",
    "EndpointSliceController",
    "EndpointTarget",
    "GatewayRouter",
    "PodRecord",
    "SlicePort",
    "address_family",
    "build_slices",
    "endpoints_for",
    "group_endpoints",
    "managed_selector",
    "resolve_target_port",
    "selects",
    "slice_differs",
    "slice_name",
    "update_body",
]

log = logging.getLogger(__name__)

Body = dict[str, Any]

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
                                 handler=self._on_service, transform=slim_service)
        self.slices = Informer(client=client, path=SLICES_PATH, name="endpointslices",
                               params={"labelSelector": managed_selector(node)},
                               handler=self._on_slice, transform=slim_slice)
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

    def resync(self, uids: Iterable[str]) -> None:
        """Re-reconcile the Services that select these pods (a gateway pass programmed their
        routes, or a gateway pod lost them: their endpoints' readiness changed)."""
        for uid in sorted(set(uids)):
            self._touch_services(self.pods.get(uid))

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
            if self.gateway is not None and not self.gateway.first_pass.is_set():
                # what the gateway pods serve now decides which gateway endpoints are ready:
                # without it a restarted provider would turn every one not ready for a pass
                try:
                    async with asyncio.timeout(self.pods_sync_timeout):
                        await self.gateway.first_pass.wait()
                except TimeoutError:
                    log.warning("no gateway pass yet; reconciling EndpointSlices anyway",
                                extra=kv(node=self.node))
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
            self.slices.store[key] = slim_slice(obj)
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

"""A cloud pod as a replica that serves traffic: probes, published endpoints, graceful drain.

Why it exists: "the site never drops" is a promise about requests. A cloud pod is Ready when its
server answers its readiness probe (not when its instance boots), its Services reach it at what
the cloud publishes (not at podIP:targetPort), and a deleted pod stops receiving requests before
its instance goes. The pod controller owns the lifecycle; this module owns those three concerns,
so that the controller calls it at four points: the instance runs (:meth:`Replicas.running`), it
does not (:meth:`Replicas.stopped`), the pod is terminating (:meth:`Replicas.drain_left`), the
pod is gone (:meth:`Replicas.forget`).

* Probes run in a shared :class:`~vkprovider.probing.prober.Prober` against the instance's
  published address for the probed container port (the cloud's TLS edge for that port instead
  of its IP:port where the replica's ``traffic: gateway`` sends its traffic there:
  :attr:`Replicas.via_edge`); a restart (a new instance id or a higher restart count) starts
  them afresh. A change nudges the pod's reconcile.
* Endpoints go to an :class:`EndpointSink` (the provider-managed EndpointSlices): one target per
  published container port, ``ready``/``serving`` from the probes, ``terminating`` once the pod
  is being deleted.
* Drain: a terminating pod that was Ready keeps its instance for ``drain_seconds`` (never longer
  than the pod's grace period) after its endpoints turned not-ready, so load balancers that
  watch the slices stop sending before the server goes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from providers.base import Instance, PublishedPort
from vkprovider.node.endpointslices import EndpointTarget
from vkprovider.probing.prober import ContainerProbeState, Target
from vkprovider.probing.spec import ContainerProbes, ProbeSpecError, parse_probes

__all__ = ["EndpointSink", "EndpointTarget", "ProberLike", "Replicas"]

log = logging.getLogger(__name__)

Body = Mapping[str, Any]


class EndpointSink(Protocol):
    """Where replicas' endpoints are published (node/endpointslices.py)."""

    def set_pod(self, *, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                container_ports: Sequence[tuple[str, str | None, int, str]],
                endpoints: Sequence[EndpointTarget]) -> None: ...

    def remove_pod(self, *, uid: str) -> None: ...


class ProberLike(Protocol):
    def track(self, key: str, *, containers: Sequence[ContainerProbes],
              target: Target,
              running_since: float, assume_ready: bool = False) -> None: ...

    def forget(self, key: str) -> None: ...

    def state(self, key: str) -> tuple[ContainerProbeState, ...] | None: ...


@dataclass(kw_only=True, slots=True)
class _Tracked:
    instance: tuple[str, str, int]  # (provider, instance id, restart count)
    probes: tuple[ContainerProbes, ...]
    published: tuple[PublishedPort, ...]


def _preferred(published: Sequence[PublishedPort]) -> dict[int, PublishedPort]:
    """Per container port, the first (preferred) published entry."""
    out: dict[int, PublishedPort] = {}
    for p in published:
        out.setdefault(p.container_port, p)
    return out


def _of_kind(published: Sequence[PublishedPort], kind: str) -> dict[int, PublishedPort]:
    """Per container port, the first entry of ``kind``: an ``ip`` one (what a slice publishes
    directly) or a ``hostname`` edge (RunPod's HTTPS proxy beside a public IP)."""
    return _preferred([p for p in published if p.kind == kind])


def container_ports(pod: Body) -> list[tuple[str, str | None, int, str]]:
    """(container name, port name, container port, protocol) for every declared port."""
    out: list[tuple[str, str | None, int, str]] = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        if not isinstance(c, Mapping):
            continue
        for p in c.get("ports") or []:
            if isinstance(p, Mapping) and isinstance(p.get("containerPort"), int):
                out.append((str(c.get("name", "")), p.get("name"), int(p["containerPort"]),
                            str(p.get("protocol") or "TCP")))
    return out


def _was_ready_on(pod: Body, instance: Instance) -> bool:
    """The pod's status says this very instance (same id and restart count) is Ready: a
    previous process's probes passed, so a new process starts from Ready, not from zero."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get("vkprovider.io/instance-id") != instance.id:
        return False
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    first = statuses[0] if statuses and isinstance(statuses[0], Mapping) else {}
    return bool(first.get("ready")) and first.get("restartCount", 0) == instance.restart_count


class Replicas:
    """Probe state and endpoints of the cloud pods on one virtual node."""

    def __init__(self, *, prober: ProberLike | None, sink: EndpointSink | None,
                 clock: Callable[[], float], drain_seconds: float) -> None:
        self._prober = prober
        self._sink = sink
        self._clock = clock
        self._drain = drain_seconds
        self._tracked: dict[str, _Tracked] = {}
        self._draining: dict[str, float] = {}  # uid -> clock() when endpoints went terminating
        self._published: set[str] = set()  # uids the sink knows
        self._held: set[str] = set()  # uids whose endpoints the sink keeps as they are
        # Whether a replica's traffic goes through the gateway even where it has an IP:port
        # (its policy's ``traffic: gateway``): the gateway then dials the cloud's TLS edge for
        # that port where there is one, and so do its probes (asked at every probe, so a
        # policy edit moves them too). Set by the service when a gateway is configured.
        self.via_edge: Callable[[str], bool] = lambda _uid: False

    def hold(self, uid: str) -> None:
        """Its instance is unknown for now (its cloud not listed since a restart): the sink
        keeps whatever endpoints it has for it, until it runs, stops or is forgotten."""
        hold = getattr(self._sink, "hold_pod", None)
        if hold is None or uid in self._published:
            return
        hold(uid=uid)
        self._held.add(uid)
        self._published.add(uid)  # forget() tells the sink to drop them

    def held(self) -> list[str]:
        return sorted(self._held)

    def is_held(self, uid: str) -> bool:
        return uid in self._held

    def is_draining(self, uid: str) -> bool:
        """Its endpoints went terminating (:meth:`drain_left`) and it is not forgotten yet."""
        return uid in self._draining

    # ---- the instance runs -------------------------------------------------------------------

    def running(self, *, uid: str, pod: Body, provider: str, instance: Instance
                ) -> ContainerProbeState | None:
        """Probe the replica; the first container's probe state (None: it has no probes)."""
        ident = (provider, instance.id, instance.restart_count)
        tracked = self._tracked.get(uid)
        if tracked is None:
            try:
                # exec probes of a running pod were allowed by its policy (execProbes: Ignore)
                probes = parse_probes(pod, ignore_exec=True)
            except ProbeSpecError as e:  # translation refused these before create
                log.warning("probe cannot run", extra={"uid": uid, "field": e.field})
                probes = ()
            tracked = _Tracked(instance=ident, probes=probes, published=instance.published)
            self._tracked[uid] = tracked
            self._track(uid, tracked, assume_ready=_was_ready_on(pod, instance))
        elif tracked.instance != ident or tracked.published != instance.published:
            restarted = tracked.instance != ident
            tracked.instance = ident
            tracked.published = instance.published
            if restarted:
                self._track(uid, tracked)
        state = self._state(uid)
        self._publish(uid=uid, pod=pod, instance=instance, state=state, terminating=False)
        return state

    def _track(self, uid: str, tracked: _Tracked, *, assume_ready: bool = False) -> None:
        if self._prober is None or not any(c.any for c in tracked.probes):
            return
        by_port = _preferred(tracked.published)
        edges, ips = _of_kind(tracked.published, "hostname"), _of_kind(tracked.published, "ip")

        provider = tracked.instance[0]

        def target(port: int) -> (tuple[str, int, str | None]
                                  | tuple[str, int, str | None, tuple[str, str] | None] | None):
            p = by_port.get(port)
            if p is None:
                return None
            # probe where the traffic goes (node/slicebodies.py): the IP:port where there is
            # one, in whatever order the cloud lists it, unless the gateway fronts it through
            # the cloud's TLS edge
            if port in edges and port in ips:
                p = edges[port] if self.via_edge(uid) else ips[port]
            if p.edge_auth:  # an edge that wants the cloud's key (SaladCloud auth): the prober
                return (p.host, p.port, p.scheme, (p.edge_auth, provider))  # adds it
            return (p.host, p.port, p.scheme)

        self._prober.track(uid, containers=tracked.probes, target=target,
                           running_since=self._clock(), assume_ready=assume_ready)

    def _state(self, uid: str) -> ContainerProbeState | None:
        tracked = self._tracked.get(uid)
        if self._prober is None or tracked is None or not tracked.probes:
            return None
        if not tracked.probes[0].any:
            return None
        states = self._prober.state(uid)
        if states:
            return states[0]
        first = tracked.probes[0]  # probes declared but none run yet: not ready
        return ContainerProbeState(name=first.name, started=first.startup is None, ready=False,
                                   liveness_failed=False)

    def stopped(self, *, uid: str, pod: Body | None = None, instance: Instance | None = None
                ) -> None:
        """The instance is not running (booting, restarting, finished): stop probing it and
        publish it as not ready (or not at all when nothing is published)."""
        self._tracked.pop(uid, None)
        if self._prober is not None:
            self._prober.forget(uid)
        if pod is not None and instance is not None and uid in self._published:
            self._publish(uid=uid, pod=pod, instance=instance, state=None, terminating=False,
                          ready=False)

    def synced(self) -> None:
        """Every running pod has been published once (after the first sweep): the endpoint
        sink may now delete slices no pod backs."""
        mark = getattr(self._sink, "mark_pods_synced", None)
        if mark is not None:
            mark()

    # ---- the pod is being deleted ------------------------------------------------------------

    def drain_left(self, *, uid: str, pod: Body, instance: Instance | None,
                   was_ready: bool) -> float:
        """Seconds to keep the instance while load balancers stop sending it requests.

        The first call marks the endpoints terminating. 0 when nothing routes to the pod (it was
        not Ready) or its grace period is 0."""
        meta = pod.get("metadata") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        limit = min(self._drain, float(grace)) if isinstance(grace, int | float) else self._drain
        if not was_ready or limit <= 0:
            return 0.0
        start = self._draining.get(uid)
        if start is None:
            start = self._draining[uid] = self._clock()
            if instance is not None:
                self._publish(uid=uid, pod=pod, instance=instance, state=self._state(uid),
                              terminating=True)
        return max(0.0, start + limit - self._clock())

    def forget(self, uid: str) -> None:
        """The pod is gone (or its instance is): no probes, no endpoints."""
        self._tracked.pop(uid, None)
        self._draining.pop(uid, None)
        self._held.discard(uid)
        if self._prober is not None:
            self._prober.forget(uid)
        if uid in self._published:
            self._published.discard(uid)
            if self._sink is not None:
                self._sink.remove_pod(uid=uid)

    # ---- publishing --------------------------------------------------------------------------

    def _publish(self, *, uid: str, pod: Body, instance: Instance,
                 state: ContainerProbeState | None, terminating: bool,
                 ready: bool | None = None) -> None:
        if self._sink is None:
            return
        if ready is None:
            ready = state is None or (state.ready and state.started)
        serving = ready
        if terminating:
            ready = False
        meta = pod.get("metadata") or {}
        targets = [
            EndpointTarget(container_port=p.container_port, protocol=p.protocol, host=p.host,
                           port=p.port, kind=p.kind, ready=ready, serving=serving,
                           terminating=terminating, provider=instance.provider,
                           edge_auth=p.edge_auth)
            for p in instance.published  # every entry: the sink publishes the first IP one
        ]
        if not targets and uid not in self._published:
            return
        self._held.discard(uid)
        self._published.add(uid)
        self._sink.set_pod(namespace=str(meta.get("namespace", "")),
                           name=str(meta.get("name", "")), uid=uid,
                           labels=dict(meta.get("labels") or {}),
                           container_ports=container_ports(pod), endpoints=targets)

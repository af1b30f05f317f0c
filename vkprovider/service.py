"""``vkprovider run``: wire the virtual node, the pod controller and the providers together.

Why it exists: each part is testable alone; this module is the one place that builds them from
settings, runs them in one TaskGroup and shuts them down cleanly on SIGTERM.

With ``leader_election.enabled`` (two replicas for HA), a replica first waits for the Lease;
only the leader builds anything that acts (node registration, pod controller, cloud calls,
kubelet API): a standby runs nothing but the elector, and answers ``/healthz`` (200, "standby")
and ``/metrics`` (``vkprovider_leader`` 0 and the process's figures) on the metrics port, so
both replicas are Ready when healthy, ``kubectl rollout status`` completes (readiness must not
mean "is the leader") and a Prometheus scraping every replica sees no target down. The leader
takes the port over.

A leader that cannot renew in time exits at once with status 1, before another replica can take
over (renew deadline < lease duration), so two replicas never act together; the Deployment
restarts it as a standby. "At once": it makes no further request to the API server (no release,
no Event flush) over the link that just failed it, which would hold the process up to a deadline
of its own, past the standby's takeover. A clean SIGTERM releases the Lease, so the standby takes
over within one retry period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from providers.addresses import refusal
from providers.base import Provider
from vkprovider import __version__
from vkprovider.api import APIServers, listen_address
from vkprovider.api.server import bind, serve
from vkprovider.config import Settings
from vkprovider.edgekeys import EdgeKeys
from vkprovider.eventloop import loop_name
from vkprovider.gateway.controller import GatewayController, TrafficMode
from vkprovider.gateway.discovery import GatewayPods
from vkprovider.gateway.wiring import build_gateway, traffic_watch
from vkprovider.kube import KubeClient
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.leader import LeaderElector
from vkprovider.kube.refs import KubeRefSource
from vkprovider.logs import kv
from vkprovider.looplag import sample_lag
from vkprovider.metrics import Metrics, StandbyMetrics
from vkprovider.node.endpointslices import EndpointSliceController
from vkprovider.node.gpuhealth import GPUHealthWatch
from vkprovider.node.pods import PodController
from vkprovider.node.providerset import ProviderSource
from vkprovider.node.virtualnode import NodeAgent, decommission_marker_path
from vkprovider.placement.policy import effective_traffic
from vkprovider.probing.dialing import DIRECT, AddressMap, Dialer
from vkprovider.probing.prober import Prober
from vkprovider.registry import build_providers

log = logging.getLogger(__name__)

_RELEASE_TIMEOUT = 5.0  # seconds a shutdown may spend handing the Lease over


async def run_virtual_kubelet(*, settings: Settings) -> int:
    client = KubeClient.from_kubeconfig(kubeconfig=settings.kubeconfig,
                                        user_agent=f"vkprovider/{__version__}")
    providers = build_providers(settings=settings)  # a bad settings file fails now, even on
    # a standby; adapters make no call until the pod controller uses them
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if not settings.leader_election.enabled:
            return await _serve(settings=settings, client=client, providers=providers,
                                stop=stop, lost=None)
        return await _elect_and_serve(settings=settings, client=client, providers=providers,
                                      stop=stop)
    finally:
        for provider in providers.values():  # closed by the controller if it ran; idempotent
            with contextlib.suppress(Exception):
                await provider.aclose()
        with contextlib.suppress(Exception):
            await client.aclose()


async def _elect_and_serve(*, settings: Settings, client: KubeClient,
                           providers: dict[str, Provider], stop: asyncio.Event) -> int:
    election = settings.leader_election
    elector = LeaderElector(
        client=client, namespace=election.namespace,
        name=election.lease(node_name=settings.node.name), identity=election.holder(),
        lease_duration=election.lease_duration_seconds,
        renew_deadline=election.renew_deadline_seconds,
        retry_period=election.retry_period_seconds)
    log.info("waiting for leadership", extra=kv(node=settings.node.name, lease=elector.name,
                                                namespace=election.namespace,
                                                identity=elector.identity))
    served: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    standby = _serve_standby_health(settings)

    async def lead() -> None:
        async with elector.leading() as lost:
            if standby is not None:  # the leader's own servers take the port now
                standby.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await standby
            served.set_result(await _serve(settings=settings, client=client,
                                           providers=providers, stop=stop, lost=lost))
        # leaving leading() hands the Lease over (bounded below)

    leader = asyncio.create_task(lead(), name="leader")
    stopping = asyncio.create_task(stop.wait(), name="stop")
    try:
        first: set[asyncio.Future[Any]] = {leader, stopping, served}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not served.done() and not leader.done() and not elector.is_leader:
            leader.cancel()  # SIGTERM while standing by: nothing to hand over
            with contextlib.suppress(asyncio.CancelledError):
                await leader
            log.info("stopped while standing by")
            return 0
        if not served.done():  # stopping while leading: serving ends (0), or the leader failed
            either: set[asyncio.Future[Any]] = {leader, served}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not served.done():
            await leader  # it failed before serving ended: raise its error
            return 1
        code = served.result()
        if code != 0:  # leadership lost: exit at once, no hand-over over the failed link
            leader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leader
            return code
        # a clean stop: leaving leading() hands the Lease over (bounded)
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(leader, timeout=_RELEASE_TIMEOUT)
        return code
    finally:
        stopping.cancel()
        if not leader.done():
            leader.cancel()
        if standby is not None and not standby.done():
            standby.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await standby


ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def standby_app(*, metrics: StandbyMetrics) -> ASGIApp:
    """A standby's metrics port: ``/healthz`` says it is alive and waiting, ``/metrics`` says
    it is a standby (``vkprovider_leader`` 0) and what the process costs; 404 otherwise."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope.get("path")
        status, ctype = 200, b"text/plain; charset=utf-8"
        if path == "/healthz":
            body = b"ok: standby, waiting for the leader Lease\n"
        elif path == "/metrics":
            body, ctype = metrics.render(), CONTENT_TYPE_LATEST.encode()
        else:
            status, body = 404, b"not found\n"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": body})

    return app


def _serve_standby_health(settings: Settings) -> asyncio.Task[None] | None:
    """Serve ``/healthz`` and ``/metrics`` on the metrics port while this replica stands by
    (None: no port)."""
    if not settings.metrics_port:
        return None
    sock = bind(host=listen_address(bind_address=settings.kubelet_api.bind_address,
                                    internal_ip=settings.node.internal_ip),
                port=settings.metrics_port)
    app = standby_app(metrics=StandbyMetrics(node=settings.node.name))
    return asyncio.create_task(serve(app=app, sock=sock, name="standby-health"),
                               name="standby-health")


async def _gateway_synced(slices: EndpointSliceController, gateway: GatewayController,
                          *, limit: float = 60.0) -> None:
    """The gateway may remove routes once the slices' first pass is done (every Service
    reconciled once, so every route it needs was asked for), or after ``limit`` seconds."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit):
            await slices.started.wait()
            while len(slices.queue) or slices.queue.waiting:
                await asyncio.sleep(0.2)
    gateway.mark_synced()


def _traffic(controller: PodController, uid: str,
             source: ProviderSource | None = None) -> TrafficMode:
    """The ``traffic`` of the OverflowPolicy a cloud pod was created under, or where that is
    auto (or there is none) the one of the GPUProvider it runs on (auto without either)."""
    claim = controller.book.get(uid)
    policy = None
    if claim is not None and claim.policy is not None:
        parsed = controller.gate.parsed().get(claim.policy)
        policy = parsed.spec.traffic if parsed is not None else None
    placed = controller.placed.get(uid)
    provider = (source.traffic.get(placed.provider)
                if source is not None and placed is not None else None)
    return effective_traffic(policy=policy, provider=provider)


def _dialer(settings: Settings) -> Dialer:
    """Probes dial what clouds publish; a lab (the test harness) puts its address map between."""
    lab = settings.pods.probe_address_map
    return DIRECT if lab is None else AddressMap(Path(lab))


async def _serve(*, settings: Settings, client: KubeClient, providers: dict[str, Provider],
                 stop: asyncio.Event, lost: asyncio.Event | None) -> int:
    """Run the virtual node until ``stop`` (returns 0) or ``lost`` (returns 1) is set."""
    metrics = Metrics()
    metrics.leader.labels(settings.node.name).set(1)  # this replica acts from here on
    events = EventRecorder(client=client, component="vkprovider", host=settings.node.name,
                           qps=settings.node.event_qps, burst=settings.node.event_burst)
    metrics.events.source = events.counts
    # One address filter for everything a cloud publishes (providers/addresses.py): the pod
    # controller screens instances with it; the prober and the slices apply it once more.
    policy = settings.endpoints.policy()
    keys = {p.name: p.api_key for p in settings.providers}  # read when used, never kept
    edge_keys = EdgeKeys(settings_keys=keys)  # the adapters' keys: told below
    prober = Prober(dialer=_dialer(settings), max_concurrent=settings.pods.probe_concurrency,
                    refuse=lambda host: refusal(host, policy=policy), edge_key=edge_keys)
    prober.on_refused = metrics.probes_refused.inc
    # The traffic gateway (settings gateway:) serves hostname-only replicas; None: not set up
    gateway = build_gateway(
        settings=settings, policy=policy,
        dialer=None if settings.pods.probe_address_map is None else _dialer(settings),
        api_keys=keys, metrics=metrics)
    slices = EndpointSliceController(client=client, node=settings.node.name, events=events,
                                     metrics=metrics, policy=policy, gateway=gateway)
    controller = PodController(client=client, settings=settings, providers=providers,
                               events=events, refs=KubeRefSource(client=client), metrics=metrics,
                               prober=prober, endpoints=slices, policy=policy)
    edge_keys.adapters = controller.providers  # GPUProvider-built ones join it as served
    if gateway is not None:
        gateway.edge_key = edge_keys
        gateway.traffic_of = lambda uid: _traffic(controller, uid, source)
        gateway.on_change = slices.refresh
        gateway.on_programmed = slices.resync  # endpoints turn ready once served (no polling)
        # traffic: gateway sends an IP:port replica's traffic to its cloud's TLS edge where it
        # has one (node/slicebodies.py): its probes go there too
        controller.replicas.via_edge = lambda uid: gateway.traffic_of(uid) == "gateway"
        # a policy's traffic changed: its replicas are re-routed now (docs/traffic.md)
        controller.on_policy_change = traffic_watch(
            modes=lambda: {n: p.spec.traffic for n, p in controller.gate.parsed().items()},
            refresh=slices.refresh)
    prober.on_change = controller.queue.add  # a probe result changed: reconcile that pod
    agent = NodeAgent(client=client, settings=settings.node, capacity=controller.node_capacity,
                      version=f"v1.37.2-vkprovider-{__version__}",
                      decommission_marker=decommission_marker_path(
                          namespace=settings.leader_election.namespace,
                          node=settings.node.name))
    source = (ProviderSource(client=client, controller=controller, settings=settings,
                             on_change=agent.node.notify_changed)
              if settings.gpu_providers.enabled else None)
    try:  # binds the kubelet API and /metrics ports now: a bad port or cert fails at once
        servers = APIServers.build(settings=settings, controller=controller, client=client,
                                   metrics=metrics, gateway=gateway)
    except BaseException:
        await controller.aclose()
        raise
    log.info("starting", extra=kv(node=settings.node.name, providers=",".join(providers),
                                  gpu_providers=source is not None, version=__version__,
                                  event_loop=loop_name(asyncio.get_running_loop())))
    never = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:

            async def pods() -> None:
                if source is not None:
                    # GPUProvider-sourced providers must be served before the first sweep:
                    # it adopts existing instances before any worker may create.
                    await source.start()
                async with asyncio.TaskGroup() as inner:
                    if source is not None:
                        inner.create_task(source.run(), name="gpuproviders")
                    inner.create_task(controller.run(), name="pods")
                    inner.create_task(slices.run(), name="endpointslices")
                    if gateway is not None:
                        inner.create_task(gateway.run(), name="gateway")
                        if settings.gateway.pods is not None:
                            inner.create_task(GatewayPods(
                                client=client, namespace=settings.gateway.pods.namespace,
                                selector=settings.gateway.pods.selector,
                                on_change=gateway.discovered).run(), name="gateway-pods")
                        inner.create_task(_gateway_synced(slices, gateway),
                                          name="gateway-synced")

            tasks = [
                tg.create_task(agent.run(), name="node"),
                tg.create_task(pods()),
                tg.create_task(servers.run()),
                tg.create_task(GPUHealthWatch(  # policy gpuHealth: hot cloud GPUs
                    controller=controller, samples=lambda: servers.gpus.samples,
                    samples_version=lambda: servers.gpus.version,
                    tick=min(1.0, settings.kubelet_api.gpu_metrics_interval_seconds)).run(),
                    name="gpuhealth"),
                tg.create_task(sample_lag(histogram=metrics.event_loop_lag), name="looplag"),
            ]
            ended = [asyncio.create_task(stop.wait()),
                     asyncio.create_task((lost or never).wait())]
            await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
            for waiter in ended:
                waiter.cancel()
            if lost is not None and lost.is_set():
                log.error("leadership lost; stopping at once",
                          extra=kv(node=settings.node.name))
            else:
                log.info("stopping")
            for task in tasks:
                task.cancel()
    finally:
        servers.close()
        if source is not None:
            await source.aclose()
        await controller.aclose()
        await prober.aclose()
        if lost is not None and lost.is_set():
            events.abort()  # a replica that lost leadership writes nothing more
        else:
            await events.aclose()
    return 1 if lost is not None and lost.is_set() else 0

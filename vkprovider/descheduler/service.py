"""``vkprovider descheduler``: run the companion's loops (admission, move-back) until SIGTERM.

Why it exists: the companion is its own process (and Deployment) so it can be scaled, upgraded and
permission-scoped apart from the virtual kubelet; this wires its loops from a kubeconfig and the
names of the virtual nodes it serves (one or several: budgets and move-back count them all).

Its metrics port (``--metrics-port``) serves ``/metrics`` and ``/healthz`` from a small ASGI app
run by uvicorn inside the companion's own event loop (a wedged loop cannot answer, so a probe
notices it). ``/healthz`` is 200 when the replica is healthy: a standby under leader election is
healthy while it waits for the Lease (readiness must not mean "is the leader", or a standby could
never be Ready), the acting replica when every watch of its loops has synced and both loops
(admission, move-back) showed life recently; otherwise 503 with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, MutableMapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vkprovider import __version__
from vkprovider.asgiserve import bind, serve
from vkprovider.descheduler.admission import OverflowAdmission
from vkprovider.descheduler.fit import DEFAULT_HEALTH_TAINTS
from vkprovider.descheduler.hotswap import HotSwap
from vkprovider.descheduler.kueueapi import KueueAPI
from vkprovider.descheduler.kueueapi import discover as discover_kueue
from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.descheduler.moveback import MoveBack
from vkprovider.descheduler.preemption import PreemptionTracker
from vkprovider.descheduler.prewarm import Prewarm
from vkprovider.eventloop import loop_name
from vkprovider.kube import APIError, KubeClient
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.leader import LeaderElector
from vkprovider.logs import kv

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
HealthCheck = Callable[[], tuple[bool, str]]


class CompanionHealth:
    """What ``/healthz`` answers for this replica.

    ``standby`` (leader election on, the Lease held by another replica): healthy, since this
    replica's only job is to wait, and the answer comes from its event loop. ``acting``: healthy
    when both loops' watches have synced and each loop showed life within its bound: admission
    passes every ``interval`` seconds (bound: 10 intervals, at least 60 s); move-back every
    ``move_back_interval`` (bound: 4 intervals, at least 180 s, as finishing one move recorded
    before a restart may wait up to 2 minutes); pre-warm, the Kueue admission check, within the
    admission loop's bound (it looks at least every 10 s).
    """

    def __init__(self, *, admission: OverflowAdmission, moveback: MoveBack, standby: bool,
                 interval: float, move_back_interval: float,
                 clock: Callable[[], float] = time.monotonic,
                 prewarm: Prewarm | None = None) -> None:
        self.admission = admission
        self.moveback = moveback
        self.prewarm = prewarm
        self.standby = standby
        self.admission_stale_after = max(60.0, 10 * interval)
        self.moveback_stale_after = max(180.0, 4 * move_back_interval)
        self.clock = clock

    def check(self) -> tuple[bool, str]:
        if self.standby:
            return True, "ok: standby, waiting for the leader Lease"
        now = self.clock()
        problems = [p for p in (
            self.admission.problem(now=now, stale_after=self.admission_stale_after),
            self.moveback.problem(now=now, stale_after=self.moveback_stale_after),
            self.prewarm.problem(now=now, stale_after=self.admission_stale_after)
            if self.prewarm is not None else None) if p]
        if problems:
            return False, "; ".join(problems)
        return True, "ok"


def metrics_app(*, registry: CollectorRegistry, health: HealthCheck) -> ASGIApp:
    """``GET /metrics`` (Prometheus text of ``registry``) and ``GET /healthz`` (200 ``ok``, or 503
    and the reason); anything else is 404."""

    async def app(scope: Scope, _receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope.get("path")
        if path == "/metrics":
            status, body, ctype = 200, generate_latest(registry), CONTENT_TYPE_LATEST
        elif path == "/healthz":
            ok, text = health()
            status, body, ctype = (200 if ok else 503), f"{text}\n".encode(), "text/plain"
        else:
            status, body, ctype = 404, b"not found\n", "text/plain"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


async def _discover_kueue(client: KubeClient) -> KueueAPI:
    """Which Kueue API to use (kueueapi.py): logged at info when Kueue is not installed or
    supported, as an error when it is installed at a version this code does not speak."""
    try:
        kueue = await discover_kueue(client)
    except APIError as exc:
        log.warning("could not discover Kueue's API version; assuming the supported one",
                    extra=kv(error=str(exc), version=KueueAPI().version))
        return KueueAPI()
    if kueue.problem:
        log.error("unsupported Kueue: pre-warm and Kueue-aware move-back are off, and the "
                  "pre-warm AdmissionChecks are marked inactive",
                  extra=kv(served=",".join(kueue.served), problem=kueue.problem))
    elif kueue.served:
        log.info("Kueue found", extra=kv(version=kueue.version))
    else:
        log.info("Kueue not installed; its objects count as none until it is",
                 extra=kv(version=kueue.version))
    return kueue


async def act(*, loops: Sequence[Coroutine[Any, Any, None]], stop: asyncio.Event,
              lost: asyncio.Event) -> None:
    """Run the acting replica's ``loops`` until ``stop`` (SIGTERM) or ``lost`` (the leader Lease
    is gone), then cancel them and wait until they ended. Each loop cancels the tasks it started
    (moves, hot-swaps: :class:`~vkprovider.descheduler.scoped.TaskScope`), so when this returns
    after a loss nothing of this replica makes another request."""
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(loop) for loop in loops]
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in [*tasks, *waiters]:
                t.cancel()


def companion_lease_name(nodes: Sequence[str]) -> str:
    """The leader-election Lease of a companion serving ``nodes`` (one companion per node set)."""
    if len(nodes) == 1:
        return f"vkprovider-companion-{nodes[0]}"  # as before several nodes could be served
    digest = hashlib.sha256(",".join(sorted(nodes)).encode()).hexdigest()[:10]
    return f"vkprovider-companion-{digest}"


async def run_companion(
    *,
    kubeconfig: str | None,
    node_name: str | Sequence[str],
    interval: float,
    move_back_interval: float = 30.0,
    headroom_gpus: int = 0,
    metrics_port: int = 0,
    leader_elect: bool = False,
    leader_namespace: str = "vkprovider-system",
    preemption_fast_path: bool = True,
    gpu_health_taints: Sequence[str] = DEFAULT_HEALTH_TAINTS,
    policy_labels: Mapping[str, str] | None = None,
) -> int:
    nodes = [node_name] if isinstance(node_name, str) else list(node_name)
    client = KubeClient.from_kubeconfig(kubeconfig=kubeconfig,
                                        user_agent=f"vkprovider-companion/{__version__}")
    events = EventRecorder(client=client, component="vkprovider-companion")
    metrics = CompanionMetrics()
    preemptions = PreemptionTracker(client=client) if preemption_fast_path else None
    kueue = await _discover_kueue(client)
    admission = OverflowAdmission(
        client=client, events=events, node_names=nodes, interval=interval, metrics=metrics,
        preemptions=preemptions, policy_labels=policy_labels)
    moveback = MoveBack(client=client, events=events, node_names=nodes, admission=admission,
                        interval=move_back_interval, headroom_gpus=headroom_gpus,
                        metrics=metrics, health_taints=gpu_health_taints, kueue=kueue,
                        # the victims of preemptions, from the one watch of every pod
                        on_pod=preemptions.observe_pod if preemptions is not None else None)
    prewarm = Prewarm(client=client, events=events, node_names=nodes, admission=admission,
                      moveback=moveback, metrics=metrics, kueue=kueue)
    sock = (bind(host="0.0.0.0", port=metrics_port, what=f"--metrics-port {metrics_port}")
            if metrics_port else None)
    health = CompanionHealth(admission=admission, moveback=moveback, standby=leader_elect,
                             interval=interval, move_back_interval=move_back_interval,
                             prewarm=prewarm)
    server = None if sock is None else asyncio.ensure_future(serve(
        app=metrics_app(registry=metrics.registry, health=health.check), sock=sock,
        name="metrics", graceful_seconds=1))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("companion starting", extra=kv(nodes=",".join(nodes), version=__version__,
                                            event_loop=loop_name(loop)))
    elector = LeaderElector(client=client, namespace=leader_namespace,
                            name=companion_lease_name(nodes),
                            identity=f"{socket.gethostname()}-{os.getpid()}")
    lost = asyncio.Event()
    try:
        async with contextlib.AsyncExitStack() as stack:
            if leader_elect:
                # A standby waits for the Lease or SIGTERM, whichever comes first (it used to
                # ignore SIGTERM and be killed at the end of the grace period).
                leading = asyncio.ensure_future(stack.enter_async_context(elector.leading()))
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({leading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not leading.done():
                    leading.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await leading
                    log.info("stopped while standing by")
                    return 0
                lost = leading.result()
                health.standby = False  # now judged by its loops (informers synced, alive)
            metrics.leader.set(1)  # acting from here on (a standby's stays 0)
            await act(loops=[admission.run(), moveback.run(), prewarm.run(),
                             HotSwap(moveback=moveback,
                                     interval=min(5.0, move_back_interval)).run()],
                      stop=stop, lost=lost)
            if lost.is_set():  # leaving leading() now makes no request: the link just failed
                log.error("leadership lost; exiting so a fresh process can rejoin")
                return 1
    finally:
        if server is not None:
            server.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await server
        with contextlib.suppress(Exception):
            if lost.is_set():
                events.abort()  # a replica that lost the Lease writes nothing more
            else:
                await events.aclose()  # what was decided reaches `kubectl describe`
            await client.aclose()
    return 0

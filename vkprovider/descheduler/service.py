"""``vkprovider descheduler``: run the companion's loops (admission, move-back) until SIGTERM.

Why it exists: the companion is its own process (and Deployment) so it can be scaled, upgraded and
permission-scoped apart from the virtual kubelet; this wires its loops from a kubeconfig and the
names of the virtual nodes it serves (one or several: budgets and move-back count them all).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import socket
from collections.abc import Sequence

from prometheus_client import start_http_server

from vkprovider import __version__
from vkprovider.descheduler.admission import OverflowAdmission
from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.descheduler.moveback import MoveBack
from vkprovider.kube import KubeClient
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.leader import LeaderElector
from vkprovider.logs import kv

log = logging.getLogger(__name__)


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
) -> int:
    nodes = [node_name] if isinstance(node_name, str) else list(node_name)
    client = KubeClient.from_kubeconfig(kubeconfig=kubeconfig,
                                        user_agent=f"vkprovider-companion/{__version__}")
    events = EventRecorder(client=client, component="vkprovider-companion")
    metrics = CompanionMetrics()
    if metrics_port:
        start_http_server(metrics_port, registry=metrics.registry)
    admission = OverflowAdmission(client=client, events=events, node_names=nodes,
                                  interval=interval)
    moveback = MoveBack(client=client, events=events, node_names=nodes, admission=admission,
                        interval=move_back_interval, headroom_gpus=headroom_gpus,
                        metrics=metrics)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("companion starting", extra=kv(nodes=",".join(nodes), version=__version__))
    elector = LeaderElector(client=client, namespace=leader_namespace,
                            name=companion_lease_name(nodes),
                            identity=f"{socket.gethostname()}-{os.getpid()}")
    try:
        async with contextlib.AsyncExitStack() as stack:
            lost = asyncio.Event()
            if leader_elect:
                lost = await stack.enter_async_context(elector.leading())
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(admission.run()), tg.create_task(moveback.run())]
                waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for t in [*tasks, *waiters]:
                    t.cancel()
            if lost.is_set():
                log.error("leadership lost; exiting so a fresh process can rejoin")
                return 1
    finally:
        with contextlib.suppress(Exception):
            await events.aclose()  # what was decided reaches `kubectl describe`
            await client.aclose()
    return 0

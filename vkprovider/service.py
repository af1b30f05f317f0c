"""``vkprovider run``: wire the virtual node, the pod controller and the providers together.

Why it exists: each part is testable alone; this module is the one place that builds them from
settings, runs them in one TaskGroup and shuts them down cleanly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from vkprovider import __version__
from vkprovider.api import APIServers
from vkprovider.config import Settings
from vkprovider.kube import KubeClient
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.refs import KubeRefSource
from vkprovider.logs import kv
from vkprovider.metrics import Metrics
from vkprovider.node.pods import PodController
from vkprovider.node.virtualnode import run_node
from vkprovider.registry import build_providers

log = logging.getLogger(__name__)


async def run_virtual_kubelet(*, settings: Settings) -> int:
    metrics = Metrics()
    client = KubeClient.from_kubeconfig(kubeconfig=settings.kubeconfig,
                                        user_agent=f"vkprovider/{__version__}")
    providers = build_providers(settings=settings)
    events = EventRecorder(client=client, component="vkprovider", host=settings.node.name)
    controller = PodController(client=client, settings=settings, providers=providers,
                               events=events, refs=KubeRefSource(client=client), metrics=metrics)
    try:  # binds the kubelet API and /metrics ports now: a bad port or cert fails at once
        servers = APIServers.build(settings=settings, controller=controller, client=client,
                                   metrics=metrics)
    except BaseException:
        await controller.aclose()
        await client.aclose()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("starting", extra=kv(node=settings.node.name, providers=",".join(providers),
                                  version=__version__))
    try:
        async with asyncio.TaskGroup() as tg:
            node_task = tg.create_task(run_node(client=client, settings=settings.node,
                                                capacity=controller.node_capacity,
                                                version=f"v1.37.2-vkprovider-{__version__}"))
            pods_task = tg.create_task(controller.run())
            api_task = tg.create_task(servers.run())
            await stop.wait()
            log.info("stopping")
            node_task.cancel()
            pods_task.cancel()
            api_task.cancel()
    finally:
        servers.close()
        await controller.aclose()
        with contextlib.suppress(Exception):
            await client.aclose()
    return 0

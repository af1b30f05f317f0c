"""``vkprovider descheduler``: run the companion's loops until SIGTERM.

Why it exists: the companion is its own process (and Deployment) so it can be scaled, upgraded and
permission-scoped apart from the virtual kubelet; this wires its loops from a kubeconfig and the
virtual node's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from vkprovider import __version__
from vkprovider.descheduler.admission import OverflowAdmission
from vkprovider.kube import KubeClient
from vkprovider.kube.events import EventRecorder
from vkprovider.logs import kv

log = logging.getLogger(__name__)


async def run_companion(*, kubeconfig: str | None, node_name: str, interval: float) -> int:
    client = KubeClient.from_kubeconfig(kubeconfig=kubeconfig,
                                        user_agent=f"vkprovider-companion/{__version__}")
    events = EventRecorder(client=client, component="vkprovider-companion")
    admission = OverflowAdmission(client=client, events=events, node_name=node_name,
                                  interval=interval)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("companion starting", extra=kv(node=node_name, version=__version__))
    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(admission.run())
            await stop.wait()
            task.cancel()
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
    return 0

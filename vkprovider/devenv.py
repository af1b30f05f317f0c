"""``vkprovider dev up``: a local cluster to develop and demo against.

Why it exists: a platform engineer should get a working control plane with simulated GPU nodes in
one command, point kubectl at it, and stop everything with Ctrl-C, leaving nothing behind.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.fakekubelet import create_gpu_nodes


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def run_dev_up(*, gpu_nodes: int, gpus_per_node: int) -> int:
    cluster = LocalCluster()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler ...")
        await cluster.start()
        cluster.start_fake_kubelet()
        async with cluster.client() as kube:
            names = [f"gpu-node-{i}" for i in range(gpu_nodes)]
            await create_gpu_nodes(kube=kube, names=names, gpus=gpus_per_node)
        say(
            f"control plane ready at {cluster.server}; {gpu_nodes} simulated GPU nodes "
            f"x {gpus_per_node} nvidia.com/gpu"
        )
        say(f"component logs: {cluster.log_dir}")
        say(f"\n    export KUBECONFIG={cluster.kubeconfig}\n")
        say("Ctrl-C stops everything.")
        await stop.wait()
        return 0
    finally:
        say("stopping ...")
        cluster.stop()
        say("stopped; nothing left running.")

"""``vkprovider demo``: the story on a laptop, narrated as it happens.

Why it exists: a platform engineer should see the whole system work before reading a line of
docs: a real control plane, simulated internal GPU nodes, two mock clouds, the virtual kubelet,
pods bursting to the clouds and coming back down, with a closing table that says what it cost
and that nothing leaked. Everything runs on loopback and stops on exit or Ctrl-C.

Today the burst is opted into by the workload (it tolerates the virtual node's taint); the
companion controller that admits overflow by policy and moves pods back is on the roadmap
(see README's status table), and the demo grows with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.fakekubelet import create_gpu_nodes
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess

NS = "demo"
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vkprovider",
              "effect": "NoSchedule"}


class Narrator:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.step = 0

    def say(self, text: str) -> None:
        sys.stdout.write(f"[{time.monotonic() - self.t0:6.1f}s] {text}\n")
        sys.stdout.flush()

    def chapter(self, text: str) -> None:
        self.step += 1
        sys.stdout.write(f"\n== {self.step}. {text}\n")
        sys.stdout.flush()

    async def until(self, what: str, probe: Callable[[], Awaitable[tuple[bool, str]]],
                    timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            done, progress = await probe()
            if progress != last:
                self.say(f"   {what}: {progress}")
                last = progress
            if done:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done after {timeout:.0f}s ({progress})")
            await asyncio.sleep(0.5)


def deployment(name: str, *, replicas: int, burst: bool, gpu_type: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "server", "image": f"example.com/{name}:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "terminationGracePeriodSeconds": 2,
    }
    if burst:
        spec["tolerations"] = [TOLERATION]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name},
                                           "annotations": {"vkprovider.io/gpu-type": gpu_type}},
                              "spec": spec}},
    }


async def pods_by_node(kube: KubeClient, app: str) -> dict[str, list[dict[str, Any]]]:
    body = await kube.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": f"app={app}"})
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in body["items"]:
        out.setdefault(pod["spec"].get("nodeName") or "<pending>", []).append(pod)
    return out


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("   " + line for line in lines)


async def run_demo(*, keep: bool = False) -> int:
    n = Narrator()
    work = Path(tempfile.mkdtemp(prefix="vkp-demo-"))
    cluster = LocalCluster(log_dir=work / "logs")
    clouds = [
        MockCloudProcess(work_dir=work, name="cloud-a", boot_delay=1.0,
                         inventory="H100:us-east:4:2.49"),
        MockCloudProcess(work_dir=work, name="cloud-b", boot_delay=1.5,
                         inventory="H100:eu-west:16:2.19,A100:eu-west:16:1.29"),
    ]
    provider: ProviderProcess | None = None
    try:
        n.chapter("A real control plane: etcd, kube-apiserver, controller-manager, scheduler")
        await cluster.start()
        cluster.start_component(name="fake-kubelet", argv=[
            sys.executable, "-m", "vkprovider.testing.fakekubelet",
            f"--kubeconfig={cluster.kubeconfig}", "--start-delay=1"])
        n.say(f"API server at {cluster.server}; logs in {cluster.log_dir}")
        async with cluster.client() as kube:
            await create_gpu_nodes(kube=kube, names=["gpu-node-0", "gpu-node-1"], gpus=4)
            n.say("2 internal GPU nodes x 4 nvidia.com/gpu (simulated kubelets)")

            n.chapter("Two mock GPU clouds and the virtual kubelet")
            for cloud in clouds:
                await cloud.start()
                n.say(f"{cloud.name} at {cloud.url}")
            provider = ProviderProcess(work_dir=work, kubeconfig=cluster.kubeconfig,
                                       node_name="vk-gpu-burst", clouds=clouds)
            provider.start()

            async def node_ready() -> tuple[bool, str]:
                try:
                    node = await kube.get("/api/v1/nodes/vk-gpu-burst")
                except Exception:
                    return False, "registering"
                gpus = node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "?")
                ready = any(c["type"] == "Ready" and c["status"] == "True"
                            for c in node.get("status", {}).get("conditions") or [])
                return ready and gpus not in ("?", "0"), f"Ready={ready}, nvidia.com/gpu={gpus}"

            await n.until("virtual node vk-gpu-burst", node_ready)
            await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": NS}})

            n.chapter("Inference serves inside: 8 replicas fill the 8 internal GPUs")
            await kube.create(f"/apis/apps/v1/namespaces/{NS}/deployments",
                              deployment("inference", replicas=8, burst=False, gpu_type="H100"))

            async def inside() -> tuple[bool, str]:
                nodes = await pods_by_node(kube, "inference")
                running = sum(1 for ps in nodes.values() for p in ps
                              if p.get("status", {}).get("phase") == "Running")
                return running == 8, f"{running}/8 Running on internal nodes"

            await n.until("inference", inside)

            n.chapter("A burst workload (6 replicas) finds no free internal GPU: it bursts")
            await kube.create(f"/apis/apps/v1/namespaces/{NS}/deployments",
                              deployment("burst", replicas=6, burst=True, gpu_type="H100"))

            async def burst_running() -> tuple[bool, str]:
                nodes = await pods_by_node(kube, "burst")
                pods = [p for ps in nodes.values() for p in ps]
                running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
                clouds_used: dict[str, int] = {}
                for p in running:
                    name = (p["metadata"].get("annotations") or {}).get("vkprovider.io/provider")
                    clouds_used[name or "?"] = clouds_used.get(name or "?", 0) + 1
                where = ", ".join(f"{k}: {v}" for k, v in sorted(clouds_used.items())) or "-"
                return len(running) == 6, f"{len(running)}/6 Running ({where})"

            await n.until("burst", burst_running)
            rows = [("POD", "NODE", "CLOUD", "REGION", "$/H")]
            for node, pods in sorted((await pods_by_node(kube, "burst")).items()):
                for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
                    a = p["metadata"].get("annotations") or {}
                    rows.append((p["metadata"]["name"], node, a.get("vkprovider.io/provider", ""),
                                 a.get("vkprovider.io/region", ""),
                                 a.get("vkprovider.io/price-per-hour", "")))
            n.say("kubectl get pods -o wide, in short:\n" + table(rows))
            n.say("cloud-a sells only 4 H100: the rest failed over to cloud-b")

            n.chapter("The burst ends: scale to 0; instances are deleted, the spend stops")
            await kube.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/burst/scale",
                             {"spec": {"replicas": 0}})

            async def drained() -> tuple[bool, str]:
                nodes = await pods_by_node(kube, "burst")
                live = 0
                for cloud in clouds:
                    live += sum(1 for e in await cloud.ledger() if e["state"] != "deleted")
                left = sum(len(v) for v in nodes.values())
                return left == 0 and live == 0, f"{left} pods left, {live} live cloud instances"

            await n.until("scale-down", drained)

            n.chapter("Summary")
            rows = [("CLOUD", "CREATED", "DELETED", "LIVE (LEAKS)", "SPENT $")]
            total_live = 0
            for cloud in clouds:
                ledger = await cloud.ledger()
                live = sum(1 for e in ledger if e["state"] != "deleted")
                total_live += live
                rows.append((cloud.name, str(len(ledger)),
                             str(sum(1 for e in ledger if e["state"] == "deleted")), str(live),
                             f"{sum(e['cost'] for e in ledger):.4f}"))
            n.say("\n" + table(rows))
            n.say("leaks: 0" if total_live == 0 else f"LEAKS: {total_live}")
            if keep:
                n.say(f"still running; export KUBECONFIG={cluster.kubeconfig}; Ctrl-C stops")
                await asyncio.Event().wait()
            return 0 if total_live == 0 else 1
    finally:
        if provider is not None:
            provider.stop()
        for cloud in clouds:
            cloud.stop()
        cluster.stop()
        with contextlib.suppress(OSError):
            sys.stdout.write(f"\nstopped everything; logs kept in {work}\n")

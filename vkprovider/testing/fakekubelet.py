"""A small fake kubelet for simulated internal GPU nodes.

Why it exists: the real scheduler and controllers need nodes that behave: Ready with renewed
Leases, bound pods that start, deletions that complete. kwok does this too, but building it adds
a Go module and minutes of cold CI time, and we need knobs kwok's default stages lack (a per-pod
start delay, pods that finish after N seconds so a training Job can end). See docs/architecture.md.

It manages every node labelled ``vkprovider.io/fake-kubelet=true``:

* renews each node's Lease in ``kube-node-lease`` every 10 s and its Ready condition every 30 s;
* marks pods bound to those nodes Running and Ready after ``start_delay`` (or the annotation
  ``vkprovider.io/fake-start-delay`` in seconds, on the pod, else on its node);
* marks a pod Succeeded ``vkprovider.io/fake-run-seconds`` after it started, if annotated;
* completes deletions after the pod's grace period, capped at ``max_grace`` seconds.

Run it with ``python -m vkprovider.testing.fakekubelet --kubeconfig FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
from datetime import UTC, datetime
from typing import Any

from vkprovider import logs
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.semantics.timefmt import format_micro_time, format_time

log = logging.getLogger(__name__)

MANAGED_LABEL = "vkprovider.io/fake-kubelet"
START_DELAY_ANNOTATION = "vkprovider.io/fake-start-delay"
RUN_SECONDS_ANNOTATION = "vkprovider.io/fake-run-seconds"
GPU = "nvidia.com/gpu"
GPU_PRODUCT = "nvidia.com/gpu.product"


def now_rfc3339() -> str:
    return format_time(datetime.now(UTC))


def now_micro() -> str:
    return format_micro_time(datetime.now(UTC))


def gpu_node_body(
    *,
    name: str,
    gpus: int,
    product: str = "NVIDIA-H100-80GB-HBM3",
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node object for a simulated internal GPU node, managed by the fake kubelet."""
    all_labels = {
        MANAGED_LABEL: "true",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        GPU_PRODUCT: product,
        "nvidia.com/gpu.count": str(gpus),
    }
    all_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": taints or []},
    }


def gpu_node_status(
    *, gpus: int, cpu: str = "64", memory: str = "512Gi", pods: int = 110, ip: str = "10.1.0.1"
) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), GPU: str(gpus)}
    return {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": ip}],
        "conditions": [_ready_condition()],
        "nodeInfo": {
            "kubeletVersion": "v1.37.2-fake",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "fake://1",
            "kernelVersion": "",
            "osImage": "fake",
            "kubeProxyVersion": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def _ready_condition() -> dict[str, str]:
    now = now_rfc3339()
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "fake kubelet is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


async def create_gpu_nodes(
    *,
    kube: KubeClient,
    names: list[str],
    gpus: int,
    product: str = "NVIDIA-H100-80GB-HBM3",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> None:
    """Create (or re-create) simulated GPU nodes with Ready status."""
    for i, name in enumerate(names):
        body = gpu_node_body(name=name, gpus=gpus, product=product, labels=labels, taints=taints)
        try:
            await kube.create("/api/v1/nodes", body)
        except ConflictError:
            await kube.patch(
                f"/api/v1/nodes/{name}",
                {
                    "metadata": {"labels": body["metadata"]["labels"]},
                    "spec": {"taints": taints or []},
                },
            )
        await kube.patch(
            f"/api/v1/nodes/{name}/status",
            {"status": gpu_node_status(gpus=gpus, ip=f"10.1.{i // 250}.{i % 250 + 1}")},
            patch_type="strategic",
        )


class FakeKubelet:
    def __init__(
        self,
        *,
        kube: KubeClient,
        start_delay: float = 0.5,
        max_grace: float = 2.0,
        lease_seconds: int = 40,
    ) -> None:
        self.kube = kube
        self.start_delay = start_delay
        self.max_grace = max_grace
        self.lease_seconds = lease_seconds
        self.nodes = Informer(
            client=kube,
            path="/api/v1/nodes",
            params={"labelSelector": f"{MANAGED_LABEL}=true"},
            handler=self._on_node,
            name="fake-nodes",
        )
        self.pods = Informer(
            client=kube,
            path="/api/v1/pods",
            params={"fieldSelector": "spec.nodeName!="},
            handler=self._on_pod,
            name="fake-pods",
        )
        self._pending: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._ips = itertools.count(1)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.nodes.run())
            await self.nodes.synced.wait()  # pods are only ours once we know our nodes
            tg.create_task(self.pods.run())
            tg.create_task(self._heartbeat())

    def _on_node(self, event: str, node: dict[str, Any]) -> None:
        if event != "ADDED":
            return
        name = node["metadata"]["name"]
        for pod in list(self.pods.store.values()):
            if pod["spec"].get("nodeName") == name:
                self._on_pod("MODIFIED", pod)

    # ---- nodes -------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        await self.nodes.synced.wait()
        tick = 0
        while True:
            for node in list(self.nodes.store.values()):
                name = node["metadata"]["name"]
                try:
                    await self._renew_lease(name=name, uid=node["metadata"]["uid"])
                    if tick % 3 == 0:
                        await self.kube.patch(
                            f"/api/v1/nodes/{name}/status",
                            {"status": {"conditions": [_ready_condition()]}},
                            patch_type="strategic",
                        )
                except NotFoundError:
                    continue
                except APIError as exc:
                    log.warning("heartbeat failed", extra=kv(node=name, error=str(exc)))
            tick += 1
            await asyncio.sleep(10)

    async def _renew_lease(self, *, name: str, uid: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        try:
            await self.kube.patch(
                path,
                {
                    "spec": {
                        "renewTime": now_micro(),
                        "holderIdentity": name,
                        "leaseDurationSeconds": self.lease_seconds,
                    }
                },
            )
        except NotFoundError:
            await self.kube.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": name,
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
                        ],
                    },
                    "spec": {
                        "holderIdentity": name,
                        "leaseDurationSeconds": self.lease_seconds,
                        "renewTime": now_micro(),
                    },
                },
            )

    # ---- pods --------------------------------------------------------------------------------

    def _managed(self, node_name: str) -> bool:
        return node_name in self.nodes.store

    def _on_pod(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if event == "DELETED":
            pending = self._pending.pop(uid, None)
            if pending:
                pending[1].cancel()
            return
        node = pod["spec"].get("nodeName", "")
        if not self._managed(node):
            return
        pending = self._pending.get(uid)
        if pending is not None:
            if pending[0] == "delete" or not meta.get("deletionTimestamp"):
                return
            pending[1].cancel()  # a deletion overrides a start or a run timer
        phase = (pod.get("status") or {}).get("phase", "Pending")
        annotations = meta.get("annotations") or {}
        if meta.get("deletionTimestamp"):
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            self._spawn(uid, "delete", self._finish_deletion(pod, min(grace, self.max_grace)))
        elif phase == "Pending":
            node_annotations = (self.nodes.store.get(node, {}).get("metadata") or {}).get(
                "annotations") or {}
            delay = float(annotations.get(START_DELAY_ANNOTATION,
                                          node_annotations.get(START_DELAY_ANNOTATION,
                                                               self.start_delay)))
            self._spawn(uid, "start", self._start(pod, delay))
        elif phase == "Running" and RUN_SECONDS_ANNOTATION in annotations:
            run_for = float(annotations[RUN_SECONDS_ANNOTATION])
            self._spawn(uid, "run", self._complete(pod, run_for))

    def _spawn(self, uid: str, kind: str, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending[uid] = (kind, task)

        def done(t: asyncio.Task[None]) -> None:
            if self._pending.get(uid, (None, None))[1] is t:
                del self._pending[uid]

        task.add_done_callback(done)

    def _pod_path(self, pod: dict[str, Any]) -> str:
        meta = pod["metadata"]
        return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"

    async def _start(self, pod: dict[str, Any], delay: float) -> None:
        await asyncio.sleep(delay)
        n = next(self._ips)
        ip = f"10.244.{n // 250 % 250}.{n % 250 + 1}"
        now = now_rfc3339()
        node = self.nodes.store.get(pod["spec"]["nodeName"], {})
        host_ip = ((node.get("status") or {}).get("addresses") or [{"address": "10.1.0.1"}])[0][
            "address"
        ]
        containers = pod["spec"]["containers"]
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "ContainersReady",
                    "Ready",
                    "PodScheduled",
                )
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "containerID": f"fake://{pod['metadata']['uid']}-{c['name']}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
        }
        await self._patch_status(pod, status)
        run_for = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        if run_for is not None:
            await self._complete(pod, float(run_for))

    async def _complete(self, pod: dict[str, Any], seconds: float) -> None:
        await asyncio.sleep(seconds)
        now = now_rfc3339()
        status = {
            "phase": "Succeeded",
            "conditions": [
                {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
                for t in ("ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "finishedAt": now,
                            "startedAt": now,
                        }
                    },
                }
                for c in pod["spec"]["containers"]
            ],
        }
        await self._patch_status(pod, status)

    async def _patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        try:
            await self.kube.patch(
                f"{self._pod_path(pod)}/status", {"status": status}, patch_type="strategic"
            )
        except NotFoundError:
            return
        except APIError as exc:
            log.warning(
                "pod status patch failed", extra=kv(pod=self._pod_path(pod), error=str(exc))
            )

    async def _finish_deletion(self, pod: dict[str, Any], delay: float) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(NotFoundError, ConflictError):
            await self.kube.delete(
                self._pod_path(pod), grace_period_seconds=0, uid=pod["metadata"]["uid"]
            )


async def _main(args: argparse.Namespace) -> None:
    async with KubeClient.from_kubeconfig(kubeconfig=args.kubeconfig) as kube:
        await FakeKubelet(kube=kube, start_delay=args.start_delay, max_grace=args.max_grace).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--start-delay", type=float, default=0.5)
    parser.add_argument("--max-grace", type=float, default=2.0)
    args = parser.parse_args()
    logs.setup(level="INFO", fmt="text")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))


if __name__ == "__main__":
    main()

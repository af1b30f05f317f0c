"""The Kubernetes objects the demo story writes, and how it reads them back.

Why it exists apart from :mod:`vkprovider.demo`: the inference Deployment and Service, the
training gang, the Kueue objects and the way-out watch are the story's fixtures; ``bench/day.py``
and the tests build the same objects from here, and the narration stays in the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.storyreport import WayOut

NS = "serving"
NODE = "vk-gpu-burst"
INTENT = "vkprovider.io/move-back"
PREWARM_INTENT = "vkprovider.io/prewarm"
SERVICE = "inference"
PORT = "web"  # the Service port's name (targetPort: the container port named "http")
#: The Kueue objects the story writes (cluster-scoped but the LocalQueue, in namespace NS).
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"/apis/{KUEUE_GROUP}/v1beta2"
QUEUE = "training"  # the ClusterQueue and the LocalQueue
FLAVOR = "internal-gpus"
CHECK = "prewarm"
POOL_LABEL = ("gpu-pool", "internal")  # on the internal GPU nodes; the flavor's nodeLabels
GANG = "training"  # the Job


async def app_pods(kube: KubeClient, app: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": f"app={app}"})
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def running_on(ps: list[dict[str, Any]], where: Callable[[str], bool]) -> int:
    return sum(1 for p in ps if p.get("status", {}).get("phase") == "Running"
               and where(p["spec"].get("nodeName") or ""))


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def serving_on(ps: list[dict[str, Any]], where: Callable[[str], bool]) -> int:
    """Running and Ready (by its readiness probe) where ``where(nodeName)``."""
    return sum(1 for p in ps if p.get("status", {}).get("phase") == "Running" and _ready(p)
               and where(p["spec"].get("nodeName") or ""))


def inference_deployment(*, replicas: int, load_seconds: float) -> dict[str, Any]:
    """A model server: port 8000 named ``http``, loading its weights for ``load_seconds``
    (``MOCK_LOAD_SECONDS``: the lab's servers answer 503 until then), Ready by its probe."""
    server = {"name": "server", "image": "vllm:0.6",
              "ports": [{"name": "http", "containerPort": 8000}],
              "env": [{"name": "MOCK_LOAD_SECONDS", "value": f"{load_seconds:g}"}],
              "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
                                 "periodSeconds": 1, "failureThreshold": 1},
              "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "inference"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "inference"}},
                     "template": {"metadata": {"labels": {"app": "inference"},
                                               "annotations": {"vkprovider.io/gpu-type": "H100"}},
                                  "spec": {"priorityClassName": "inference",
                                           "terminationGracePeriodSeconds": 2,
                                           "containers": [server]}}}}


def inference_service() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE},
            "spec": {"selector": {"app": "inference"},
                     "ports": [{"name": PORT, "port": 80, "targetPort": "http"}]}}


def training_job(*, pods: int, run_seconds: float, queue: str | None) -> dict[str, Any]:
    """The gang: ``pods`` x 1 GPU at the training priority. With ``queue``, a Kueue batch Job:
    created suspended in that LocalQueue, Kueue unsuspends it when it admits the Workload."""
    job: dict[str, Any] = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": GANG},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                 "template": {"metadata": {"labels": {"app": "training"}, "annotations": {
                     "vkprovider.io/fake-run-seconds": str(run_seconds)}},
                              "spec": {"restartPolicy": "Never",
                                       "priorityClassName": "training",
                                       "containers": [{
                                           "name": "train", "image": "trainer:1",
                                           "resources": {"limits": {
                                               "nvidia.com/gpu": "1"}}}]}}}}
    if queue is not None:
        job["metadata"]["labels"] = {f"{KUEUE_GROUP}/queue-name": queue}
        job["spec"]["suspend"] = True
    return job


def kueue_objects(*, gpus: int, with_check: bool) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body) to create, in order: a ResourceFlavor on the internal GPU nodes,
    the pre-warm AdmissionCheck (``with_check``), a ClusterQueue whose quota is those ``gpus``
    (carrying the check), and a LocalQueue in namespace NS."""
    v = f"{KUEUE_GROUP}/v1beta2"
    out: list[tuple[str, dict[str, Any]]] = [(f"{KUEUE_API}/resourceflavors", {
        "apiVersion": v, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
        "spec": {"nodeLabels": {POOL_LABEL[0]: POOL_LABEL[1]}}})]
    cq: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": FLAVOR, "resources": [{"name": "nvidia.com/gpu",
                                            "nominalQuota": str(gpus)}]}]}]}
    if with_check:
        out.append((f"{KUEUE_API}/admissionchecks", {
            "apiVersion": v, "kind": "AdmissionCheck", "metadata": {"name": CHECK},
            "spec": {"controllerName": "vkprovider.io/prewarm"}}))
        cq["admissionChecksStrategy"] = {"admissionChecks": [{"name": CHECK}]}
    out.append((f"{KUEUE_API}/clusterqueues", {
        "apiVersion": v, "kind": "ClusterQueue", "metadata": {"name": QUEUE}, "spec": cq}))
    out.append((f"{KUEUE_API}/namespaces/{NS}/localqueues", {
        "apiVersion": v, "kind": "LocalQueue", "metadata": {"name": QUEUE},
        "spec": {"clusterQueue": QUEUE}}))
    return out


def condition_status(obj: dict[str, Any] | None, kind: str) -> str:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return "-"


def check_state(wl: dict[str, Any] | None, check: str = CHECK) -> tuple[str, str]:
    """(state, message) of ``check`` on a Workload; ("Pending", "") before Kueue lists it."""
    for entry in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == check:
            return str(entry.get("state") or "Pending"), str(entry.get("message") or "")
    return "Pending", ""


async def gang_workload(kube: KubeClient) -> dict[str, Any] | None:
    """The Workload Kueue made for the gang's Job (None before it exists)."""
    body = await kube.get(f"{KUEUE_API}/namespaces/{NS}/workloads")
    for wl in body.get("items") or []:
        if any(o.get("kind") == "Job" and o.get("name") == GANG
               for o in wl["metadata"].get("ownerReferences") or []):
            return dict(wl)
    return None


class WayOutWatch:
    """Every 200 ms through the way out: the Deployment (fewest ready, most spec.replicas, time
    with fewer ready than desired), the gang's Workload (seen, Admitted, the check's messages)
    and pods (all Running); the times are monotonic, from ``created`` (the Job's creation)."""

    def __init__(self, kube: KubeClient, *, result: WayOut, desired: int, gang_pods: int,
                 kueue: bool) -> None:
        self.kube, self.result, self.desired = kube, result, desired
        self.gang_pods, self.kueue = gang_pods, kueue
        self.created = time.monotonic()
        self.workload_seen: float | None = None
        self.quota_reserved: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def _sample(self, last: float) -> float:
        out = self.result
        dep = await self.kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/inference")
        now = time.monotonic()
        ready = int(dep.get("status", {}).get("readyReplicas") or 0)
        if ready < self.desired:
            out.seconds_below_desired += now - last
        out.min_ready = ready if out.min_ready is None else min(out.min_ready, ready)
        out.max_replicas = max(out.max_replicas, int(dep["spec"].get("replicas") or 0))
        if self.kueue and out.gang_admission_seconds is None:
            wl = await gang_workload(self.kube)
            if wl is not None and self.workload_seen is None:
                self.workload_seen = now
            state, message = check_state(wl)
            seen = f"{state}: {message}"
            if wl is not None and message and seen not in out.check_messages:
                out.check_messages.append(seen)
            if self.quota_reserved is None and condition_status(wl, "QuotaReserved") == "True":
                self.quota_reserved = now
            if self.workload_seen is not None and condition_status(wl, "Admitted") == "True":
                out.gang_admission_seconds = round(now - self.workload_seen, 2)
                if self.quota_reserved is not None:
                    out.gang_reserved_to_admitted_seconds = round(now - self.quota_reserved, 2)
        if out.gang_start_seconds is None:
            ps = await app_pods(self.kube, "training")
            if sum(1 for p in ps if p.get("status", {}).get("phase") in (
                    "Running", "Succeeded")) >= self.gang_pods:
                out.gang_start_seconds = round(now - self.created, 2)
        return now

    async def _loop(self) -> None:
        last = time.monotonic()
        while True:
            with contextlib.suppress(APIError, OSError):
                last = await self._sample(last)
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self.created = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            if self.result.gang_start_seconds is None:  # the story saw it first: a last look
                with contextlib.suppress(APIError, OSError):
                    await self._sample(time.monotonic())
        out = self.result
        out.seconds_below_desired = round(out.seconds_below_desired, 2)

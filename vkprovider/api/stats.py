"""The kubelet's resource reports of the virtual node: ``/stats/summary``, ``/metrics/resource``.

Why it exists: ``kubectl top``, metrics-server and dashboards read these two endpoints of every
node. For a virtual node the "containers" are cloud instances: the clouds report GPU figures but
not CPU or memory use, so those are left out rather than invented ("where known"), and the GPU
figures are added:

* ``/stats/summary`` (kubelet Summary API, ``stats/v1alpha1``): ``node`` and ``pods[]`` with
  ``podRef``; each pod's container carries ``accelerators`` (the Summary API's own
  ``AcceleratorStats`` fields ``make, model, id, memoryTotal, memoryUsed, dutyCycle``) extended
  with ``utilization``, ``tensorActive`` (0-1), ``temperatureCelsius``, ``powerWatts`` and
  ``time``. Go clients ignore the extra fields.
* ``/metrics/resource`` (Prometheus text, as the kubelet serves it):
  ``container_start_time_seconds``, ``resource_scrape_error`` and the per-GPU
  ``vkprovider_pod_gpu_*`` gauges with the same names and labels as on ``/metrics``.

Both read caches only (the watch cache and :class:`~vkprovider.api.gpu.GPUCollector`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vkprovider.api.view import NodeView
from vkprovider.gpureadings import GPUReading, PodGPUs
from vkprovider.metrics import add_pod_gpus, pod_gpu_families
from vkprovider.semantics.timefmt import format_time

Body = dict[str, Any]
_TERMINAL = ("Succeeded", "Failed")


def rfc3339(when: datetime | float) -> str:
    """:func:`~vkprovider.semantics.timefmt.format_time` of a datetime or epoch seconds."""
    if not isinstance(when, datetime):
        when = datetime.fromtimestamp(when, tz=UTC)
    return format_time(when)


def _make(model: str) -> str:
    low = model.lower()
    if low.startswith("mi") or "amd" in low or "radeon" in low:
        return "amd"
    return "nvidia"


def accelerator_stats(gpu: GPUReading, *, at: float) -> Body:
    out: Body = {"make": _make(gpu.model), "model": gpu.model, "id": gpu.uuid}
    if gpu.memory_total_bytes is not None:
        out["memoryTotal"] = gpu.memory_total_bytes
    if gpu.memory_used_bytes is not None:
        out["memoryUsed"] = gpu.memory_used_bytes
    if gpu.utilization is not None:
        out["dutyCycle"] = round(gpu.utilization * 100)
        out["utilization"] = gpu.utilization
    if gpu.tensor_active is not None:
        out["tensorActive"] = gpu.tensor_active
    if gpu.temperature_celsius is not None:
        out["temperatureCelsius"] = gpu.temperature_celsius
    if gpu.power_watts is not None:
        out["powerWatts"] = gpu.power_watts
    out["time"] = rfc3339(at)
    return out


def live_pods(view: NodeView) -> list[Body]:
    """Pods on the node that are neither finished nor being deleted, in a stable order."""
    pods = [p for p in view.pods()
            if (p.get("status") or {}).get("phase") not in _TERMINAL]
    return sorted(pods, key=lambda p: (p["metadata"].get("namespace", ""),
                                       p["metadata"].get("name", "")))


def count_pods(view: NodeView) -> dict[tuple[str, str], int]:
    """Pods on the node by (phase, provider); provider "" while a pod has no instance."""
    counts: dict[tuple[str, str], int] = {}
    for pod in view.pods():
        phase = str((pod.get("status") or {}).get("phase") or "Pending")
        placement = view.placement(str(pod["metadata"].get("uid", "")))
        key = (phase, placement.provider_name if placement else "")
        counts[key] = counts.get(key, 0) + 1
    return counts


def summary(*, view: NodeView, samples: Mapping[str, PodGPUs], node_start: float) -> Body:
    """The kubelet Summary API document for the virtual node."""
    pods: list[Body] = []
    for pod in live_pods(view):
        meta = pod["metadata"]
        uid = str(meta.get("uid", ""))
        placement = view.placement(uid)
        sample = samples.get(uid)
        entry: Body = {"podRef": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                                  "uid": uid}}
        start = (pod.get("status") or {}).get("startTime")
        if start:
            entry["startTime"] = start
        containers: list[Body] = []
        for i, container in enumerate((pod.get("spec") or {}).get("containers") or []):
            stats: Body = {"name": container.get("name")}
            if i == 0 and placement is not None and placement.instance.started_at is not None:
                stats["startTime"] = rfc3339(placement.instance.started_at)
            if i == 0 and sample is not None and sample.gpus:
                stats["accelerators"] = [accelerator_stats(g, at=sample.at)
                                         for g in sample.gpus]
            containers.append(stats)
        entry["containers"] = containers
        pods.append(entry)
    return {"node": {"nodeName": view.node_name, "startTime": rfc3339(node_start),
                     "systemContainers": []},
            "pods": pods}


class _ResourceCollector(Collector):
    def __init__(self, *, view: NodeView, samples: Mapping[str, PodGPUs], now: float) -> None:
        self.view = view
        self.samples = samples
        self.now = now

    def collect(self) -> Iterator[Metric]:
        starts = GaugeMetricFamily("container_start_time_seconds",
                                   "[STABLE] Start time of the container since unix epoch in "
                                   "seconds", labels=["container", "namespace", "pod"])
        gpu_families = pod_gpu_families()
        for pod in live_pods(self.view):
            meta = pod["metadata"]
            uid = str(meta.get("uid", ""))
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            placement = self.view.placement(uid)
            containers = (pod.get("spec") or {}).get("containers") or []
            if placement is not None and placement.instance.started_at is not None and containers:
                starts.add_metric([str(containers[0].get("name")), ns, name],
                                  placement.instance.started_at.timestamp(), timestamp=self.now)
            sample = self.samples.get(uid)
            if sample is not None:
                add_pod_gpus(gpu_families, namespace=ns, pod=name, provider=sample.provider,
                             gpus=sample.gpus, at=sample.at)
        yield starts
        yield from gpu_families.values()
        error = GaugeMetricFamily("resource_scrape_error",
                                  "[STABLE] 1 if there was an error while getting container "
                                  "metrics, 0 otherwise")
        error.add_metric([], 0.0)
        yield error


def resource_metrics(*, view: NodeView, samples: Mapping[str, PodGPUs], now: float) -> bytes:
    """``/metrics/resource`` in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ResourceCollector(view=view, samples=samples, now=now))
    return generate_latest(registry)

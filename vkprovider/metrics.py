"""Prometheus metrics of the virtual kubelet, in one registry object passed explicitly.

Why it exists: operators alert on queue depth, provider errors and spend, and benchmarks read the
latency histograms; a registry per process (not prometheus_client's global) keeps tests isolated.
Names follow Prometheus conventions with the ``vkprovider_`` prefix; see docs/operations.md.

Every replica is scraped, a standby too (the chart's ServiceMonitor selects them all, and a target
that answers 404 is a target down that pages by itself): a standby serves
:class:`StandbyMetrics`, ``vkprovider_leader`` at 0 plus the process's own figures, and the
acting replica :class:`Metrics`, everything with ``vkprovider_leader`` at 1. The per-node figures
come from the acting replica alone, so an alert's ``sum`` never counts a standby.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


#: (metric name, GPU reading attribute, help) of the per-pod GPU families
POD_GPU_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("vkprovider_pod_gpu_utilization_ratio", "utilization",
     "GPU busy fraction (0-1) of a pod's instance, per GPU, as the cloud reports it."),
    ("vkprovider_pod_gpu_tensor_active_ratio", "tensor_active",
     "Fraction of cycles the tensor cores were active (0-1), per GPU."),
    ("vkprovider_pod_gpu_memory_used_bytes", "memory_used_bytes", "GPU memory in use, per GPU."),
    ("vkprovider_pod_gpu_memory_total_bytes", "memory_total_bytes", "GPU memory size, per GPU."),
    ("vkprovider_pod_gpu_temperature_celsius", "temperature_celsius", "GPU temperature, per GPU."),
    ("vkprovider_pod_gpu_power_watts", "power_watts", "GPU power draw, per GPU."),
)
POD_GPU_LABELS = ("namespace", "pod", "provider", "gpu")


def pod_gpu_families() -> dict[str, GaugeMetricFamily]:
    """Reading attribute -> an empty family of :data:`POD_GPU_FAMILIES`."""
    return {attr: GaugeMetricFamily(name, doc, labels=list(POD_GPU_LABELS))
            for name, attr, doc in POD_GPU_FAMILIES}


def add_pod_gpus(families: dict[str, GaugeMetricFamily], *, namespace: str, pod: str,
                 provider: str, gpus: Iterable[Any], at: float | None = None) -> None:
    """One pod's GPU readings (api/gpu.py ``GPUReading``) into ``families``, stamped ``at``
    when given; figures a cloud did not report (None) are left out."""
    for gpu in gpus:
        labels = [namespace, pod, provider, str(gpu.index)]
        for attr, family in families.items():
            value = getattr(gpu, attr)
            if value is not None:
                family.add_metric(labels, float(value), timestamp=at)


class PodGPUFamilies(Collector):
    """``vkprovider_pod_gpu_*``, built when scraped from the GPU collector's latest readings
    (``source``: its ``PodGPUs`` samples). A Gauge child per pod, GPU and figure was six objects
    (each with its own lock) to create, set and remove per GPU: 9 MiB and a share of every burst's
    CPU at 5,000 pods (bench/steady.py), for values only a scrape reads."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[Any]] = tuple

    def collect(self) -> Iterator[Metric]:
        families = pod_gpu_families()
        for sample in self.source():
            add_pod_gpus(families, namespace=sample.namespace, pod=sample.pod,
                         provider=sample.provider, gpus=sample.gpus)
        yield from families.values()


class EventFamilies(Collector):
    """``vkprovider_events_*``, read when scraped from the Event recorder's own counts
    (``source``: queued, written, dropped). One sender writes them, so a backlog after a burst
    is expected and drains; a queue that only grows, or drops, is worth an alert."""

    def __init__(self) -> None:
        self.source: Callable[[], tuple[int, int, int]] | None = None

    def collect(self) -> Iterator[Metric]:
        queued, written, dropped = (0, 0, 0) if self.source is None else self.source()
        yield GaugeMetricFamily("vkprovider_events_queued",
                                "Events waiting for the sender.", value=queued)
        yield CounterMetricFamily("vkprovider_events_written",
                                  "Event creates and count updates sent to the API server.",
                                  value=written)
        yield CounterMetricFamily("vkprovider_events_dropped",
                                  "Events not written: the per-object spam filter, or a full "
                                  "queue.", value=dropped)


#: The gauge that tells the acting replica from a standby (1 and 0). Its ``virtual_node`` label
#: is set by the process itself, so ``VKProviderDown`` works whatever scrape configuration reads
#: it (docs/operations.md); the ServiceMonitors add the same label to every other series.
LEADER = "vkprovider_leader"
LEADER_HELP = ("1 on the replica of `vkprovider run` that acts for the virtual node (the leader, "
               "or the only replica without leader election), 0 on a standby.")


def leader_gauge(registry: CollectorRegistry) -> Gauge:
    """:data:`LEADER` in ``registry``: one child per node name (``.labels(node).set(...)``)."""
    return Gauge(LEADER, LEADER_HELP, ["virtual_node"], registry=registry)


def process_collector(registry: CollectorRegistry) -> None:
    """The ``process_*`` figures (CPU seconds, resident memory, open files, start time) read from
    /proc at each scrape: how a standby is seen to be alive and what each replica costs."""
    ProcessCollector(registry=registry)


class StandbyMetrics:
    """What a standby replica of ``vkprovider run`` exports: ``vkprovider_leader`` 0 and the
    ``process_*`` figures; nothing per node (only the acting replica knows those)."""

    def __init__(self, *, node: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        process_collector(self.registry)
        self.leader = leader_gauge(self.registry)
        self.leader.labels(node).set(0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        process_collector(r)
        # set by service.py: 1 while this replica acts for its node
        self.leader = leader_gauge(r)
        self.pods = Gauge("vkprovider_pods", "Pods on the virtual node by phase and provider.",
                          ["phase", "provider"], registry=r)
        self.create_latency = Histogram(
            "vkprovider_pod_create_latency_seconds",
            "From the pod being bound to the virtual node to the cloud's create call returning.",
            ["provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.status_latency = Histogram(
            "vkprovider_pod_status_propagation_seconds",
            "From the cloud reporting an instance running to the pod being patched Running.",
            ["provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.sweep_duration = Histogram(
            "vkprovider_sweep_duration_seconds",
            "One status sweep: a list per provider, every pod's instance matched, orphans "
            "collected, the spend book counted.", buckets=_LATENCY_BUCKETS, registry=r)
        self.event_loop_lag = Histogram(
            "vkprovider_event_loop_lag_seconds",
            "How much later than asked a fixed-interval sleep on the event loop woke up "
            "(vkprovider.looplag): the delay every timer, probe and request sees now.",
            buckets=_LAG_BUCKETS, registry=r)
        self.provider_requests = Counter(
            "vkprovider_provider_requests_total",
            "Calls to cloud providers by operation and result (ok or the error class).",
            ["provider", "operation", "result"], registry=r)
        self.instances = Gauge("vkprovider_instances", "Live cloud instances of this node.",
                               ["provider"], registry=r)
        self.cost = Gauge("vkprovider_cost_per_hour_dollars",
                          "Current spend rate of this node's live instances.", ["provider"],
                          registry=r)
        self.spend = Counter(
            "vkprovider_spend_dollars",
            "Dollars this node's instances have cost, counted from the clouds' listings and "
            "persisted in the Lease vkprovider-spend-<node> (continues across restarts and "
            "leader changes; a lower bound of the bill by at most one sweep interval per "
            "instance).",
            ["provider"], registry=r)
        self.queue_depth = Gauge("vkprovider_workqueue_depth", "Pod keys waiting for a worker.",
                                 registry=r)
        self.queue_retries = Counter("vkprovider_workqueue_retries_total",
                                     "Reconciles that failed and were requeued with backoff.",
                                     registry=r)
        self.kube_writes = Counter("vkprovider_kube_writes_total",
                                   "Writes to the API server by kind.", ["kind"], registry=r)
        self.probe_restarts = Counter(
            "vkprovider_probe_restarts_total",
            "Instances restarted because their liveness or startup probe failed.",
            ["provider"], registry=r)
        self.endpointslice_hostname_only = Gauge(
            "vkprovider_endpointslice_hostname_only_endpoints",
            "Service+pod pairs with a Service port the cloud publishes only by hostname (or at "
            "an address slices refuse): not in any EndpointSlice.", registry=r)
        self.gateway_routes = Gauge(
            "vkprovider_gateway_routes",
            "Replica ports served through the traffic gateway (a gateway port allocated).",
            registry=r)
        self.gateway_pods_healthy = Gauge(
            "vkprovider_gateway_pods_healthy",
            "Gateway pods whose Runtime API answered the last reconcile pass.", registry=r)
        self.gateway_passes = Counter(
            "vkprovider_gateway_passes",
            "Reconcile passes per gateway pod, by result (ok, error).", ["result"], registry=r)
        self.gateway_ports_exhausted = Gauge(
            "vkprovider_gateway_ports_exhausted",
            "Replica ports that wanted a gateway route but got none: every gateway port is "
            "taken (raise gateway.port_count).", registry=r)
        self.endpoints_refused = Counter(
            "vkprovider_endpoints_refused",
            "Addresses a cloud published for a pod that were refused (never probed, never in "
            "an EndpointSlice): once per pod and address, by provider and address class "
            "(private, cgnat, metadata, link-local, pod-cidr, in-cluster-name, ...).",
            ["provider", "reason"], registry=r)
        self.probes_refused = Counter(
            "vkprovider_probes_refused",
            "Probes not sent because their target address is refused (a backstop: refused "
            "addresses are screened out before probing, so this stays 0).", registry=r)
        self.endpointslice_writes = Counter(
            "vkprovider_endpointslice_writes",
            "Writes of provider-managed EndpointSlices by operation (create, update, delete) "
            "and result (ok or the error class).", ["operation", "result"], registry=r)
        self.endpointslices = Gauge("vkprovider_endpointslices",
                                    "Provider-managed EndpointSlices of this node.", registry=r)
        self.orphans_deleted = Counter("vkprovider_orphan_instances_deleted_total",
                                       "Instances with no pod deleted by the garbage collector.",
                                       ["provider"], registry=r)
        self.pods_rejected = Counter("vkprovider_pods_rejected_total",
                                     "Pods failed before any cloud call, by reason.", ["reason"],
                                     registry=r)
        # Kubelet API (issue 4): per-pod GPU figures read from the clouds, and API use.
        # Per-pod GPU figures: built at scrape time from the GPU collector's latest readings.
        self.pod_gpus = PodGPUFamilies()
        r.register(self.pod_gpus)
        self.events = EventFamilies()
        r.register(self.events)
        self.kubelet_api_requests = Counter(
            "vkprovider_kubelet_api_requests_total",
            "Requests to the kubelet API by endpoint and HTTP status code.",
            ["endpoint", "code"], registry=r)
        self.kubelet_api_auth = Counter(
            "vkprovider_kubelet_api_auth_total",
            "Kubelet API authentication/authorization outcomes by credential type "
            "(cert, token, none) and outcome (allowed, unauthenticated, forbidden, error).",
            ["method", "outcome"], registry=r)
        self.kubelet_api_reviews = Counter(
            "vkprovider_kubelet_api_reviews_total",
            "TokenReviews and SubjectAccessReviews sent to the API server (cache misses) by "
            "result.", ["kind", "result"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

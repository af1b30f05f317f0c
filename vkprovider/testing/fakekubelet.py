"""A small fake kubelet for simulated internal GPU nodes.

Why it exists: the real scheduler and controllers need nodes that behave: Ready with renewed
Leases, bound pods that start, deletions that complete. kwok does this too, but building it adds
a Go module and minutes of cold CI time, and we need knobs kwok's default stages lack (a per-pod
start delay, pods that finish after N seconds so a training Job can end). See docs/architecture.md.

It manages every node labelled ``vkprovider.io/fake-kubelet=true``:

* renews each node's Lease in ``kube-node-lease`` every 10 s and its Ready condition every 30 s;
* marks pods bound to those nodes Running and Ready after ``start_delay`` (or the annotation
  ``vkprovider.io/fake-start-delay`` in seconds, on the pod, else on its node);
* marks a pod Succeeded ``vkprovider.io/fake-run-seconds`` after it started, if annotated
  (read again while it runs: lowering it, e.g. to 0, ends the run sooner);
* completes deletions after the pod's grace period, capped at ``max_grace`` seconds.

With ``--address-map-dir DIR`` pods get real listeners behind their virtual addresses (issue 13):

* each running pod gets one :class:`~vkprovider.testing.modelserver.ModelServer` on 127.0.0.1
  per declared TCP container port (and per numeric probe port not declared: a real app listens
  whether or not the port is declared), answering like a model server: ``503`` while it loads
  for the container's ``MOCK_LOAD_SECONDS`` env (0 if absent), ``200`` after; ``/live`` always
  ``200``; JSON ``{"pod", "namespace", "node", "container_port"}``;
* the routes ``podIP:containerPort -> 127.0.0.1:listener`` are published to the address map
  (owner ``fakekubelet``) before the pod is reported Running;
* a pod with a ``readinessProbe`` is Ready when its probes say so: the shared
  :class:`~vkprovider.probing.prober.Prober` runs them through the address map (``started``
  follows the startup probe; a liveness or startup failure past its threshold restarts the
  container: its model loads again and ``restartCount`` counts it). Pods without a
  readinessProbe are Ready when running, as before;
* listeners keep serving through the grace period after deletion (the app drains) and close
  when the pod is finally gone (or Succeeded);
* per-pod counters (traffic vs probe requests per port, restarts) are written about four times
  a second, atomically, to :func:`counters_path` of the map (``<map>.fakekubelet-counters.json``
  beside the map directory); read them with :func:`read_counters`. Pods that are gone stay
  there (``"closed": true``), the last 1,000 of them.

Run it with ``python -m vkprovider.testing.fakekubelet --kubeconfig FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vkprovider import logs
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.probing.dialing import AddressMap, Route, publish_routes
from vkprovider.probing.prober import ContainerProbes, ContainerProbeState, Prober, parse_probes
from vkprovider.probing.spec import ProbeSpecError
from vkprovider.semantics.timefmt import format_micro_time, format_time
from vkprovider.testing.modelserver import ModelServer

log = logging.getLogger(__name__)

MANAGED_LABEL = "vkprovider.io/fake-kubelet"
START_DELAY_ANNOTATION = "vkprovider.io/fake-start-delay"
RUN_SECONDS_ANNOTATION = "vkprovider.io/fake-run-seconds"
GPU = "nvidia.com/gpu"
GPU_PRODUCT = "nvidia.com/gpu.product"
LOAD_SECONDS_ENV = "MOCK_LOAD_SECONDS"
ROUTES_OWNER = "fakekubelet"
_KEEP_CLOSED = 1000
_COUNTERS_EVERY = 0.25


def counters_path(address_map_dir: Path) -> Path:
    """Where a fake kubelet serving into ``address_map_dir`` writes its per-pod counters."""
    return address_map_dir.parent / f"{address_map_dir.name}.fakekubelet-counters.json"


def read_counters(address_map_dir: Path) -> dict[str, Any]:
    """The per-pod counters, keyed ``namespace/name`` ({} before the first write)::

        {"ns/web-0": {"uid": ..., "node": ..., "ip": ..., "closed": false,
                      "terminating": false, "traffic": 12, "probes": 30,
                      "restarts": {"server": 0},
                      "ports": {"8000": {"traffic": 12, "traffic_5xx": 0, "probes": 30,
                                         "probes_failed": 8}}}}
    """
    try:
        body = json.loads(counters_path(address_map_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    pods = body.get("pods") if isinstance(body, dict) else None
    return dict(pods) if isinstance(pods, dict) else {}


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


@dataclass(eq=False, kw_only=True)
class _Replica:
    """A running pod's listeners and what its status last said."""

    uid: str
    pod: dict[str, Any]
    ip: str
    started_at: str  # RFC 3339, the containers' state.running.startedAt
    running_since: float  # monotonic, for the prober
    servers: dict[int, ModelServer] = field(default_factory=dict)  # container port -> listener
    port_owner: dict[int, str] = field(default_factory=dict)  # container port -> container
    probes: tuple[ContainerProbes, ...] = ()  # non-empty: Ready follows the readiness probe
    restarts: dict[str, int] = field(default_factory=dict)
    reported: tuple[Any, ...] | None = None  # the last (ready, started, restarts) patched
    terminating: bool = False

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    def target(self, port: int) -> tuple[str, int] | None:
        return (self.ip, port) if port in self.servers else None


class FakeKubelet:
    def __init__(
        self,
        *,
        kube: KubeClient,
        start_delay: float = 0.5,
        max_grace: float = 2.0,
        lease_seconds: int = 40,
        address_map_dir: Path | None = None,
    ) -> None:
        self.kube = kube
        self.start_delay = start_delay
        self.max_grace = max_grace
        self.lease_seconds = lease_seconds
        self.address_map_dir = address_map_dir
        self.replicas: dict[str, _Replica] = {}  # pod uid -> listeners (address map only)
        self._closed: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._syncing: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.prober: Prober | None = None
        if address_map_dir is not None:
            self.prober = Prober(dialer=AddressMap(address_map_dir), on_change=self._probe_changed)
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
            if self.prober is not None and self.address_map_dir is not None:
                publish_routes(directory=self.address_map_dir, owner=ROUTES_OWNER, routes=())
                tg.create_task(self.prober.run())
                tg.create_task(self._write_counters())

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
            self._drop(uid)
            return
        node = pod["spec"].get("nodeName", "")
        if not self._managed(node):
            return
        replica = self.replicas.get(uid)
        if replica is not None and meta.get("deletionTimestamp"):
            replica.terminating = True  # still serving: the app drains through the grace period
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
        if (phase == "Running" and self.prober is not None and uid not in self.replicas
                and not meta.get("deletionTimestamp") and (pod.get("status") or {}).get("podIP")):
            self._adopt(pod)  # Running before this process started: listen again

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
        replica = await self._serve(pod, ip=ip, started_at=now)
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
        if replica is not None and replica.probes:
            status.update(self._probed_status(replica, None))
            replica.reported = self._report_key(replica, None)
        await self._patch_status(pod, status)
        if replica is not None and replica.probes and self.prober is not None:
            self.prober.track(replica.uid, containers=replica.probes, target=replica.target,
                              running_since=replica.running_since)
        run_for = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        if run_for is not None:
            await self._complete(pod, float(run_for))

    async def _complete(self, pod: dict[str, Any], seconds: float) -> None:
        """Succeeded ``seconds`` after now, or sooner: the annotation is read again while the pod
        runs, so a test can end a run when its story is ready for it (lower it, e.g. to 0)
        instead of guessing a duration."""
        began = time.monotonic()
        meta = pod["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        while (left := began + seconds - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.25))
            current = (self.pods.store.get(key) or pod)["metadata"]
            if current.get("uid") != meta["uid"]:
                continue  # gone from the store meanwhile: its deletion cancels this task
            with contextlib.suppress(TypeError, ValueError):
                seconds = min(seconds, float((current.get("annotations") or {}).get(
                    RUN_SECONDS_ANNOTATION, seconds)))
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
        self._drop(pod["metadata"]["uid"])  # the containers exited: nothing listens any more

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

    # ---- listeners (address map only) ---------------------------------------------------------

    async def _serve(self, pod: dict[str, Any], *, ip: str, started_at: str) -> _Replica | None:
        """Start the pod's listeners and publish their routes; None without an address map."""
        if self.address_map_dir is None:
            return None
        meta = pod["metadata"]
        try:
            probes = parse_probes(pod, ignore_exec=True)  # a real kubelet runs exec; we cannot
        except ProbeSpecError as exc:
            log.warning("pod probes cannot run; Ready when running",
                        extra=kv(pod=self._pod_path(pod), error=str(exc)))
            probes = ()
        has_readiness = any(c.readiness is not None for c in probes)
        replica = _Replica(uid=meta["uid"], pod=pod, ip=ip, started_at=started_at,
                           running_since=time.monotonic(),
                           probes=probes if has_readiness else (),
                           restarts={c["name"]: 0 for c in pod["spec"]["containers"]})
        self._drop(replica.uid)
        self.replicas[replica.uid] = replica
        for container, port in _listening_ports(pod, probes):
            server = ModelServer(
                identity={"pod": meta["name"], "namespace": meta["namespace"],
                          "node": pod["spec"].get("nodeName", ""), "container_port": port},
                load_seconds=_load_seconds(container))
            replica.servers[port] = server
            replica.port_owner[port] = str(container.get("name", ""))
            await server.start()
        self._publish()
        return replica

    def _adopt(self, pod: dict[str, Any]) -> None:
        """A pod already Running (this process restarted): listen again, probe again."""
        status = pod.get("status") or {}

        async def adopt() -> None:
            replica = await self._serve(pod, ip=status["podIP"],
                                        started_at=status.get("startTime") or now_rfc3339())
            if replica is not None and replica.probes and self.prober is not None:
                self.prober.track(replica.uid, containers=replica.probes,
                                  target=replica.target, running_since=replica.running_since)

        self._background_task(adopt())

    def _drop(self, uid: str) -> None:
        """The pod is gone (or its containers exited): close its listeners, withdraw routes."""
        replica = self.replicas.pop(uid, None)
        if replica is None:
            return
        if self.prober is not None:
            self.prober.forget(uid)
        task = self._syncing.pop(uid, None)
        if task is not None:
            task.cancel()
        self._dirty.discard(uid)
        self._closed[replica.key] = {**self._counters_of(replica), "closed": True}
        while len(self._closed) > _KEEP_CLOSED:
            self._closed.popitem(last=False)
        self._publish()
        servers = list(replica.servers.values())
        if servers:
            self._background_task(_close_all(servers))

    def _publish(self) -> None:
        if self.address_map_dir is None:
            return
        routes = [Route(host=r.ip, port=port, to_host=server.host, to_port=server.port)
                  for r in self.replicas.values() for port, server in r.servers.items()]
        publish_routes(directory=self.address_map_dir, owner=ROUTES_OWNER, routes=routes)

    def _background_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- readiness from the probes -----------------------------------------------------------

    def _probe_changed(self, uid: str) -> None:
        if uid not in self.replicas:
            return
        self._dirty.add(uid)
        if uid not in self._syncing:
            task = asyncio.get_running_loop().create_task(self._sync_status(uid))
            self._syncing[uid] = task
            task.add_done_callback(lambda t: self._syncing.pop(uid, None)
                                   if self._syncing.get(uid) is t else None)

    async def _sync_status(self, uid: str) -> None:
        """Patch the pod's readiness until it matches what the probes say."""
        while uid in self._dirty:
            self._dirty.discard(uid)
            replica = self.replicas.get(uid)
            if replica is None or self.prober is None:
                return
            states = self.prober.state(uid)
            if states is not None and any(s.liveness_failed for s in states):
                self._restart(replica, states)
                states = self.prober.state(uid)
            key = self._report_key(replica, states)
            if key == replica.reported:
                continue
            await self._patch_status(replica.pod, self._probed_status(replica, states))
            replica.reported = key

    def _restart(self, replica: _Replica, states: tuple[ContainerProbeState, ...]) -> None:
        """Liveness (or startup) failed past its threshold: the container restarts, its model
        loads again, and every probe of the pod starts afresh."""
        assert self.prober is not None
        failed = {s.name for s in states if s.liveness_failed}
        for name in failed:
            replica.restarts[name] = replica.restarts.get(name, 0) + 1
        for port, server in replica.servers.items():
            if replica.port_owner.get(port) in failed:
                server.restart()
        log.info("container restarted after failed probes",
                 extra=kv(pod=replica.key, containers=",".join(sorted(failed))))
        replica.running_since = time.monotonic()
        self.prober.track(replica.uid, containers=replica.probes, target=replica.target,
                          running_since=replica.running_since)

    def _states(self, replica: _Replica, states: tuple[ContainerProbeState, ...] | None
                ) -> dict[str, tuple[bool, bool]]:
        """Container name -> (ready, started); before any probe ran, the prober's initial."""
        if states is not None:
            return {s.name: (s.ready, s.started) for s in states}
        return {c.name: (c.startup is None and c.readiness is None, c.startup is None)
                for c in replica.probes}

    def _report_key(self, replica: _Replica, states: tuple[ContainerProbeState, ...] | None
                    ) -> tuple[Any, ...]:
        return (tuple(sorted(self._states(replica, states).items())),
                tuple(sorted(replica.restarts.items())))

    def _probed_status(self, replica: _Replica, states: tuple[ContainerProbeState, ...] | None
                       ) -> dict[str, Any]:
        by_name = self._states(replica, states)
        now = now_rfc3339()
        statuses = []
        for c in replica.pod["spec"]["containers"]:
            ready, started = by_name.get(c["name"], (True, True))
            statuses.append({
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"fake://{replica.uid}-{c['name']}",
                "ready": ready,
                "started": started,
                "restartCount": replica.restarts.get(c["name"], 0),
                "state": {"running": {"startedAt": replica.started_at}},
            })
        all_ready = all(s["ready"] for s in statuses)
        conditions = [
            {"type": t, "status": "True" if all_ready else "False",
             "lastTransitionTime": now,
             **({} if all_ready else {"reason": "ContainersNotReady",
                                      "message": "containers with unready status: ["
                                      + " ".join(s["name"] for s in statuses if not s["ready"])
                                      + "]"})}
            for t in ("ContainersReady", "Ready")
        ]
        return {"conditions": conditions, "containerStatuses": statuses}

    # ---- counters ----------------------------------------------------------------------------

    def _counters_of(self, replica: _Replica) -> dict[str, Any]:
        ports = {str(port): s.counters.as_dict() for port, s in replica.servers.items()}
        return {"uid": replica.uid, "node": replica.pod["spec"].get("nodeName", ""),
                "ip": replica.ip, "closed": False, "terminating": replica.terminating,
                "traffic": sum(p["traffic"] for p in ports.values()),
                "probes": sum(p["probes"] for p in ports.values()),
                "restarts": dict(replica.restarts), "ports": ports}

    async def _write_counters(self) -> None:
        assert self.address_map_dir is not None
        path = counters_path(self.address_map_dir)
        last: dict[str, Any] | None = None
        while True:
            pods = dict(self._closed)
            pods.update({r.key: self._counters_of(r) for r in self.replicas.values()})
            if pods != last:
                _write_json(path, {"pods": pods})
                last = pods
            await asyncio.sleep(_COUNTERS_EVERY)

    async def aclose(self) -> None:
        """Close every listener (the process is stopping)."""
        for uid in list(self.replicas):
            self._drop(uid)
        if self._background:
            await asyncio.wait(set(self._background), timeout=3.0)

    async def _finish_deletion(self, pod: dict[str, Any], delay: float) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(NotFoundError, ConflictError):
            await self.kube.delete(
                self._pod_path(pod), grace_period_seconds=0, uid=pod["metadata"]["uid"]
            )


def _listening_ports(pod: Mapping[str, Any], probes: tuple[ContainerProbes, ...]
                     ) -> list[tuple[Mapping[str, Any], int]]:
    """(container, port) for each declared TCP container port and each probe port not declared
    (named probe ports resolve to declared ones; ``parse_probes`` did that)."""
    out: list[tuple[Mapping[str, Any], int]] = []
    seen: set[int] = set()
    containers = pod["spec"]["containers"]
    for c in containers:
        for p in c.get("ports") or []:
            port = p.get("containerPort")
            if isinstance(port, int) and (p.get("protocol") or "TCP") == "TCP" and port not in seen:
                seen.add(port)
                out.append((c, port))
    by_name = {c.get("name"): c for c in containers}
    for cp in probes:
        for probe in (cp.startup, cp.readiness, cp.liveness):
            if probe is not None and probe.port not in seen and cp.name in by_name:
                seen.add(probe.port)
                out.append((by_name[cp.name], probe.port))
    return out


def _load_seconds(container: Mapping[str, Any]) -> float:
    for env in container.get("env") or []:
        if env.get("name") == LOAD_SECONDS_ENV:
            try:
                return max(0.0, float(env.get("value") or 0))
            except ValueError:
                return 0.0
    return 0.0


async def _close_all(servers: list[ModelServer]) -> None:
    await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)


def _write_json(path: Path, body: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def _main(args: argparse.Namespace) -> None:
    amap = Path(args.address_map_dir) if args.address_map_dir else None
    async with KubeClient.from_kubeconfig(kubeconfig=args.kubeconfig) as kube:
        kubelet = FakeKubelet(kube=kube, start_delay=args.start_delay, max_grace=args.max_grace,
                              address_map_dir=amap)
        try:
            await kubelet.run()
        finally:
            await kubelet.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--start-delay", type=float, default=0.5)
    parser.add_argument("--max-grace", type=float, default=2.0)
    parser.add_argument("--address-map-dir", default="",
                        help="serve pods on real loopback listeners, routed by this address map")
    args = parser.parse_args()
    logs.setup(level="INFO", fmt="text")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))


if __name__ == "__main__":
    main()

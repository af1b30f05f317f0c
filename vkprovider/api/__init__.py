"""The HTTP side of ``vkprovider run``: the kubelet API (TLS) and the Prometheus ``/metrics`` port.

Why it exists: the service wires one object: :meth:`APIServers.build` checks the configuration
and binds both ports before anything else starts (a taken port or an unreadable certificate is a
configuration error, reported at once), and :meth:`APIServers.run` serves them, with the GPU
metrics collector, until cancelled.

Modules: :mod:`.kubelet` (routes), :mod:`.auth` (401/403 as the kubelet decides them),
:mod:`.tls` (certificates), :mod:`.stats` (Summary API and ``/metrics/resource``), :mod:`.gpu`
(per-pod GPU figures), :mod:`.view` (what the routes read), :mod:`.server` (uvicorn in our loop),
:mod:`.portforward` (``kubectl port-forward`` over SPDY/3.1).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import time
from pathlib import Path
from typing import Any

from vkprovider.api.auth import KubeletAuth
from vkprovider.api.gpu import GPUCollector
from vkprovider.api.kubelet import create_kubelet_app, create_metrics_app
from vkprovider.api.portforward import GatewayDial, GatewayRoutes, PortDial, PublishedDial
from vkprovider.api.server import bind, serve
from vkprovider.api.stats import count_pods
from vkprovider.api.tls import server_context
from vkprovider.api.view import ControllerView, NodeView
from vkprovider.config import Settings
from vkprovider.kube import KubeClient
from vkprovider.kube.authn import KubeReviewer
from vkprovider.metrics import Metrics
from vkprovider.node.pods import PodController
from vkprovider.probing.dialing import DIRECT, AddressMap, Dialer

__all__ = ["APIServers", "listen_address"]

log = logging.getLogger(__name__)


def listen_address(*, bind_address: str, internal_ip: str) -> str:
    """Where the kubelet API and ``/metrics`` listen: ``kubelet_api.bind_address`` when set;
    else ``internal_ip`` when it is a loopback address (a local run: only the API server on this
    machine needs to reach the node, so nothing listens on the network), else every interface
    (``0.0.0.0``, or ``::`` for an IPv6 ``internal_ip``: in a pod it is the pod IP)."""
    if bind_address:
        return bind_address
    try:
        ip = ipaddress.ip_address(internal_ip)
    except ValueError:  # a host name: listen everywhere, as before
        return "0.0.0.0"
    if ip.is_loopback:
        return str(ip)
    return "::" if ip.version == 6 else "0.0.0.0"


def _dialer(settings: Settings) -> Dialer:
    """Port-forward dials what clouds publish, as probes do; a lab's address map stands between."""
    lab = settings.pods.probe_address_map
    return DIRECT if lab is None else AddressMap(Path(lab))


def _port_dial(settings: Settings, gateway: GatewayRoutes | None) -> PortDial:
    """Port-forward dials what clouds publish, screened, the way probes do; a port published
    only behind a cloud's HTTPS edge goes through the traffic gateway, as its Service does."""
    dialer, policy = _dialer(settings), settings.endpoints.policy()
    return PortDial(published=PublishedDial(dialer=dialer, policy=policy),
                    gateway=None if gateway is None else GatewayDial(
                        gateway=gateway, dialer=dialer, policy=policy))


class APIServers:
    """The kubelet API, ``/metrics`` and the GPU collector of one virtual node."""

    def __init__(self, *, kubelet_app: Any, kubelet_sock: socket.socket,
                 ssl_context: ssl.SSLContext, metrics_app: Any | None,
                 metrics_sock: socket.socket | None, gpus: GPUCollector, view: NodeView,
                 metrics: Metrics) -> None:
        self._kubelet_app = kubelet_app
        self._kubelet_sock = kubelet_sock
        self._ssl_context = ssl_context
        self._metrics_app = metrics_app
        self._metrics_sock = metrics_sock
        self.gpus = gpus
        self.view = view
        self.metrics = metrics

    @classmethod
    def build(cls, *, settings: Settings, controller: PodController, client: KubeClient,
              metrics: Metrics, gateway: GatewayRoutes | None = None) -> APIServers:
        """``gateway``: the traffic gateway, when set up (port-forward to hostname-only
        replicas goes through it)."""
        api = settings.kubelet_api
        node = settings.node
        ssl_context = server_context(
            cert_file=settings.tls_cert_file, key_file=settings.tls_key_file,
            client_ca_file=api.client_ca_file, common_name=node.name,
            hosts=(node.name, node.internal_ip, "localhost", "127.0.0.1"))
        view = ControllerView(controller=controller)
        gpus = GPUCollector(view=view, metrics=metrics,
                            interval=api.gpu_metrics_interval_seconds)
        auth = KubeletAuth(reviewer=KubeReviewer(client=client), node_name=node.name,
                           settings=api, metrics=metrics)
        host = listen_address(bind_address=api.bind_address, internal_ip=node.internal_ip)
        metrics_sock = (bind(host=host, port=settings.metrics_port)
                        if settings.metrics_port else None)
        try:
            kubelet_sock = bind(host=host, port=node.kubelet_port)
        except BaseException:
            if metrics_sock is not None:
                metrics_sock.close()
            raise
        return cls(
            kubelet_app=create_kubelet_app(
                view=view, auth=auth, metrics=metrics, gpus=gpus, started_at=time.time(),
                dial=_port_dial(settings, gateway)),
            kubelet_sock=kubelet_sock, ssl_context=ssl_context,
            metrics_app=create_metrics_app(metrics=metrics) if metrics_sock else None,
            metrics_sock=metrics_sock, gpus=gpus, view=view, metrics=metrics)

    async def run(self) -> None:
        """Serve until cancelled."""
        async with asyncio.TaskGroup() as tg:
            if self._metrics_app is not None and self._metrics_sock is not None:
                tg.create_task(serve(app=self._metrics_app, sock=self._metrics_sock,
                                     name="metrics"))
            tg.create_task(serve(app=self._kubelet_app, sock=self._kubelet_sock,
                                 name="kubelet-api", ssl_context=self._ssl_context,
                                 upgrades=getattr(self._kubelet_app, "upgrades", None)))
            tg.create_task(self.gpus.run(), name="gpu-metrics")
            tg.create_task(self._pod_gauges(), name="pod-gauges")

    async def _pod_gauges(self, *, interval: float = 5.0) -> None:
        """``vkprovider_pods{phase, provider}`` from the watch cache, every few seconds."""
        while True:
            try:
                counts = count_pods(self.view)
            except Exception:  # never let a malformed cached pod stop the service
                log.exception("counting pods failed")
            else:
                self.metrics.pods.clear()  # no await in between: a scrape never sees it empty
                for (phase, provider), n in counts.items():
                    self.metrics.pods.labels(phase, provider).set(n)
            await asyncio.sleep(interval)

    def close(self) -> None:
        """Release the ports if :meth:`run` never ran."""
        for sock in (self._kubelet_sock, self._metrics_sock):
            if sock is not None:
                sock.close()

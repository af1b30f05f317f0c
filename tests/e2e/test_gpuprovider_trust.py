"""A GPUProvider is not a way to read Secrets nor to reach inside the cluster (issue 34, item 3).

Real control plane; ``vkprovider run`` on its ServiceAccount's token (manifests/base/rbac.yaml),
serving only GPUProvider objects. Each untrusted object points its endpoint at a listener of
this test on 127.0.0.1 that records every connection, so "nothing was sent" is observed, not
assumed: the old code read the other namespace's Secret and sent it there as a bearer key, or
called the loopback/in-cluster endpoint of a real cloud type.

A trusted object served by the same process (a mock cloud, no key) shows the process was
examining objects all along, so the silence of the listener is not that of an idle process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_gpuproviders import FAST, Objects, cond, gpup

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide]  # GPUProviders, policies

STOLEN = "stolen-key-3f9c2e"  # a value the listener would see if the Secret were sent


class Listener:
    """A TCP listener on 127.0.0.1 that records what every connection sends (TLS or not)."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        data = b""
        with contextlib.suppress(Exception):
            data = await asyncio.wait_for(reader.read(65536), timeout=2)
        self.received.append(data or b"<connected>")
        writer.close()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest_asyncio.fixture
async def listener() -> AsyncIterator[Listener]:
    out = Listener()
    await out.start()
    try:
        yield out
    finally:
        await out.aclose()


@pytest_asyncio.fixture
async def objects(kube: KubeClient, crds: list[str]) -> AsyncIterator[Objects]:
    objs = Objects(kube)
    try:
        yield objs
    finally:
        for name in objs.names:
            with contextlib.suppress(Exception):
                await kube.delete(f"/apis/vkprovider.io/v1alpha1/gpuproviders/{name}")


async def start(system: System, local_cluster: LocalCluster, gpu: dict[str, Any]) -> str:
    """A mock cloud and the provider; returns the mock cloud's URL."""
    cloud = MockCloudProcess(work_dir=system.work_dir, name="trusted", boot_delay=0.3,
                             inventory="H100:us-east:8:2.50")
    await cloud.start()
    system.clouds.append(cloud)
    system.provider = ProviderProcess(
        work_dir=system.work_dir, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=[], config_providers=False, client_ca_file=local_cluster.ca_path,
        extra={"gpu_providers": {**FAST["gpu_providers"], **gpu}})
    system.provider.start()
    return cloud.url


async def refused(kube: KubeClient, name: str) -> dict[str, Any]:
    """The Valid condition of ``name`` once it is False."""
    obj = await eventually(functools.partial(gpup, kube, name), timeout=60,
                           until=lambda o: cond(o, "Valid").get("status") == "False",
                           what=f"{name}: Valid=False")
    assert cond(obj, "Ready")["status"] == "False" and cond(obj, "Ready")["reason"] == "Invalid"
    return cond(obj, "Valid")


async def served_and_idle(kube: KubeClient, name: str) -> None:
    """``name`` (trusted) is served, then a few more resyncs pass (0.5 s each)."""
    await eventually(functools.partial(gpup, kube, name), timeout=60,
                     until=lambda o: (o.get("status") or {}).get("health") == "Healthy",
                     what=f"{name}: served and Healthy")
    await asyncio.sleep(3)


async def test_a_secret_in_another_namespace_is_never_read_nor_sent(
    kube: KubeClient, namespace: str, system: System, objects: Objects,
    local_cluster: LocalCluster, listener: Listener,
) -> None:
    tag = uuid.uuid4().hex[:6]
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "team-key"},
        "data": {"apiKey": base64.b64encode(STOLEN.encode()).decode()}})
    # 127.0.0.1 is an allowed endpoint host here: only the Secret's namespace is at fault
    mock_url = await start(system, local_cluster, {"allowed_endpoint_hosts": ["127.0.0.1"]})
    thief, ok = f"gp-thief-{tag}", f"gp-ok-{tag}"
    await objects.gpu_provider(thief, {
        "type": "mock", "endpoint": f"http://127.0.0.1:{listener.port}",
        "credentialsSecret": {"namespace": namespace, "name": "team-key"}})
    await objects.gpu_provider(ok, {"type": "mock", "endpoint": mock_url})

    valid = await refused(kube, thief)
    assert valid["reason"] == "SecretNamespaceNotAllowed"
    assert valid["message"].startswith("spec.credentialsSecret.namespace: ")
    assert namespace in valid["message"] and "vkprovider-system" in valid["message"]
    await served_and_idle(kube, ok)
    assert listener.received == [], "nothing may be sent to an untrusted GPUProvider's endpoint"
    log = system.provider.log_text() if system.provider else ""
    assert STOLEN not in log


@pytest.mark.parametrize("endpoint", [
    "https://127.0.0.1:{port}",          # loopback
    "http://localhost:{port}",           # an in-cluster name, and plain http
    "https://2130706433:{port}",         # 127.0.0.1 spelled as the resolver reads it
])
async def test_a_real_cloud_type_never_calls_an_inside_endpoint(
    kube: KubeClient, namespace: str, system: System, objects: Objects,
    local_cluster: LocalCluster, listener: Listener, endpoint: str,
) -> None:
    tag = uuid.uuid4().hex[:6]
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "runpod-key"},
        "data": {"apiKey": base64.b64encode(STOLEN.encode()).decode()}})
    # the Secret's namespace is allowed here: only the endpoint is at fault
    mock_url = await start(system, local_cluster, {"secret_namespaces": [namespace]})
    ssrf, ok = f"gp-ssrf-{tag}", f"gp-ok-{tag}"
    await objects.gpu_provider(ssrf, {
        "type": "runpod", "endpoint": endpoint.format(port=listener.port),
        "credentialsSecret": {"namespace": namespace, "name": "runpod-key"}})
    await objects.gpu_provider(ok, {"type": "mock", "endpoint": mock_url})

    valid = await refused(kube, ssrf)
    assert valid["reason"] == "EndpointNotAllowed"
    assert valid["message"].startswith("spec.endpoint: ")
    assert "allowed_endpoint_hosts" in valid["message"]
    await served_and_idle(kube, ok)
    assert listener.received == [], "no request may leave for a refused endpoint"

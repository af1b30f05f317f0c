"""``kubectl port-forward`` to a hostname-only cloud pod, through the traffic gateway (issue 38).

The real kubectl through the real API server, as in test_port_forward.py, to a pod on the mock
cloud in hostname-only mode (its port 8000 published only at an HTTPS edge with a test CA's
certificate, 401 without the cloud's key in ``Salad-Api-Key``), with a real HAProxy process as
the gateway pod (test_gateway.py's lab). No Service selects the pod: the forward itself asks the
gateway for the replica's route; the model server's answer comes back through kubectl, the
kubelet API's SPDY session, the gateway's HTTP listener and its verified TLS to the edge, with
the key the gateway added and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.haproxy import HAProxyProcess
from vkprovider.testing.harness import ProviderProcess

from .conftest import System
from .test_gateway import (
    DOMAIN,
    GATEWAY_POD_IP,
    KEY,
    _edge_cloud,
    _layout_settings,
    _provider,
    _route_gateway_pod,
)
from .test_gpuproviders import GPUPROVIDERS, Objects, secret, trusting
from .test_pods import node_ready
from .test_port_forward import cloud_pod, port_forward

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide]  # GPUProviders, policies


async def test_kubectl_port_forward_reaches_a_hostname_only_pod_through_the_gateway(
        kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster,
        tmp_path: Path) -> None:
    assert system.network is not None
    cloud, ca = await _edge_cloud(system, tmp_path)
    gateway = HAProxyProcess(work_dir=tmp_path / "gateway", ca_file=ca.cert_path, count=8)
    await gateway.start()
    try:
        _route_gateway_pod(system, gateway)
        provider = _provider(system, tmp_path, cloud, {
            "instances": [{"address": GATEWAY_POD_IP, "runtime": str(gateway.layout.socket)}],
            **_layout_settings(gateway)})
        await node_ready(kube, system.node_name)
        pod = await cloud_pod(kube, system, namespace, "edge-only")  # Ready: probed at the edge
        ports_note = pod["metadata"]["annotations"]["vkprovider.io/ports"]
        assert f".{DOMAIN}:443" in ports_note, ports_note
        assert not re.search(r"198\.1[89]\.", ports_note), ports_note  # no IP:port published
        instance_id = pod["metadata"]["annotations"]["vkprovider.io/instance-id"]

        async with port_forward(local_cluster, namespace, "edge-only", 8000) as forward, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{forward.local_port}",
                                  timeout=30) as http:
            first = await http.get("/v1/models")
            second = await http.get("/v1/completions")  # the same connection, kept alive
            async with httpx.AsyncClient(timeout=30) as other:  # a new connection: a new dial
                third = await other.get(f"http://127.0.0.1:{forward.local_port}/again")
            for resp in (first, second, third):
                assert resp.status_code == 200, resp.text
                body = json.loads(resp.text)
                assert (body["pod"], body["namespace"], body["container_port"]) == (
                    "edge-only", namespace, 8000)
                assert body["instance"] == instance_id
            assert forward.proc.returncode is None, "kubectl port-forward stays up"

        # the edge wanted the key; the gateway added it; nobody wrote it down
        assert KEY not in provider.log_text()
        assert KEY not in gateway.log_path.read_text(errors="replace")
    finally:
        gateway.stop()
        (system.network / "gateway-test.json").unlink(missing_ok=True)


async def test_kubectl_port_forward_to_a_hostname_only_pod_without_a_gateway_is_refused_by_name(
        kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster,
        tmp_path: Path) -> None:
    cloud, _ = await _edge_cloud(system, tmp_path)
    _provider(system, tmp_path, cloud, {})  # no gateway instance: no gateway
    await node_ready(kube, system.node_name)
    await cloud_pod(kube, system, namespace, "edge-only")  # Ready: probed at the edge
    async with port_forward(local_cluster, namespace, "edge-only", 8000) as forward:
        reader, writer = await asyncio.open_connection("127.0.0.1", forward.local_port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=20)
        writer.close()
        assert answer == b"", "nothing answers without a gateway"
        output = await forward.read_rest(timeout=20)
    assert (f"publishes port 8000 of pod {namespace}/edge-only only behind its TLS proxy"
            in output and "needs the traffic gateway" in output), output


@contextlib.asynccontextmanager
async def gpuprovider_lab(kube: KubeClient, namespace: str, system: System, tmp_path: Path,
                          spec: dict[str, Any]) -> AsyncIterator[ProviderProcess]:
    """The hostname-only mock cloud (edge auth on) declared as a GPUProvider (``spec`` added),
    its key only in a Secret; the gateway's HAProxy; a provider with no ``providers:``."""
    assert system.network is not None
    cloud, ca = await _edge_cloud(system, tmp_path)
    gateway = HAProxyProcess(work_dir=tmp_path / "gateway", ca_file=ca.cert_path, count=8)
    await gateway.start()
    objects = Objects(kube)
    try:
        _route_gateway_pod(system, gateway)
        await secret(kube, namespace, "edge-cloud-key", KEY)
        provider = ProviderProcess(
            work_dir=tmp_path, kubeconfig=system.kubeconfig, node_name=system.node_name,
            clouds=[], config_providers=False, client_ca_file=system.client_ca,
            pods={"probe_address_map": str(system.network)},
            extra={**trusting(namespace), "gateway": {
                "auth_headers": ["Salad-Api-Key"], "reconcile_seconds": 0.5,
                "instances": [{"address": GATEWAY_POD_IP,
                               "runtime": str(gateway.layout.socket)}],
                **_layout_settings(gateway)}})
        system.provider = provider
        provider.start()
        await objects.gpu_provider(f"edge-{namespace}"[:60], {
            "type": "mock", "endpoint": cloud.url,
            "credentialsSecret": {"namespace": namespace, "name": "edge-cloud-key"}, **spec})
        await node_ready(kube, system.node_name)
        yield provider
        assert KEY not in provider.log_text()
        assert KEY not in gateway.log_path.read_text(errors="replace")
    finally:
        for name in objects.names:
            with contextlib.suppress(Exception):
                await kube.delete(f"{GPUPROVIDERS}/{name}")
        gateway.stop()
        (system.network / "gateway-test.json").unlink(missing_ok=True)


async def test_a_gpuprovider_account_with_edge_auth_is_probed_and_forwarded_with_its_own_key(
        kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster,
        crds: list[str], tmp_path: Path) -> None:
    """The account is declared as a GPUProvider (its key only in a Secret, no ``providers:``
    entry): the edge still gets that account's key, from the probes (the pod turns Ready) and
    from the gateway (the forward's request is answered, not refused with 401)."""
    async with gpuprovider_lab(kube, namespace, system, tmp_path, {}):
        pod = await cloud_pod(kube, system, namespace, "edge-only")  # Ready: probed with the key
        instance_id = pod["metadata"]["annotations"]["vkprovider.io/instance-id"]
        async with port_forward(local_cluster, namespace, "edge-only", 8000) as forward, \
                httpx.AsyncClient(timeout=30) as http:
            resp = await http.get(f"http://127.0.0.1:{forward.local_port}/v1/models")
        assert resp.status_code == 200, resp.text
        assert json.loads(resp.text)["instance"] == instance_id


async def test_a_gpuproviders_traffic_direct_keeps_its_replicas_off_the_gateway(
        kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster,
        crds: list[str], tmp_path: Path) -> None:
    """``spec.traffic: direct`` on the GPUProvider (the pod has no OverflowPolicy): the gateway
    serves none of its replicas, so a forward to a hostname-only one is refused by name."""
    async with gpuprovider_lab(kube, namespace, system, tmp_path, {"traffic": "direct"}):
        await cloud_pod(kube, system, namespace, "edge-only")
        async with port_forward(local_cluster, namespace, "edge-only", 8000) as forward:
            reader, writer = await asyncio.open_connection("127.0.0.1", forward.local_port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), timeout=20)
            writer.close()
            assert answer == b"", "the gateway does not serve a traffic: direct replica"
            output = await forward.read_rest(timeout=20)
        assert (f"the traffic gateway does not serve port 8000 of pod {namespace}/edge-only"
                in output), output

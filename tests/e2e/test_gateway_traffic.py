"""``traffic: gateway`` fronts IP:port replicas too, and a policy's ``traffic`` change re-routes.

Real control plane, real provider process, a mock cloud that publishes IP:port (behind virtual
198.18.x.y addresses the lab's address map routes to loopback), and a real HAProxy process
standing for the gateway pod (100.64.250.1, routed to its listeners on loopback as kube-proxy's
DNAT would). A replica created under an OverflowPolicy with ``traffic: gateway`` is never a
direct endpoint: the Service's slice holds the gateway pod's address and an allocated port, and
a request there reaches the replica's model server (plain HTTP from the gateway to the published
IP:port). Editing the policy's ``traffic`` re-routes the replica with no change to the Service or
the pod: ``auto`` publishes the cloud's IP:port, ``gateway`` again the gateway's.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.mock.records import is_public_address
from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import AddressMap
from vkprovider.testing.haproxy import HAProxyProcess
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.pki import CertificateAuthority
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_gateway import GATEWAY_POD_IP, _endpoints, _layout_settings, _route_gateway_pod
from .test_pods import TOLERATION, node_ready
from .test_traffic import server, service, slices

pytestmark = pytest.mark.cluster

POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"


def _addresses(items: list[dict[str, Any]]) -> list[tuple[str, int, bool]]:
    return [(a, p, bool(ep["conditions"].get("ready"))) for a, p, ep in _endpoints(items)]


async def test_traffic_gateway_fronts_an_ip_port_replica_and_a_policy_edit_reroutes_it(
        kube: KubeClient, namespace: str, system: System, cluster_objects: Cluster,
        tmp_path: Path) -> None:
    assert system.network is not None
    cloud = MockCloudProcess(work_dir=tmp_path, name="ipcloud", boot_delay=0.3,
                             address_map_dir=system.network, public_block=4,
                             inventory="H100:us-east:4:2.49")
    await cloud.start()
    system.clouds.append(cloud)  # stopped with the system
    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="unused-edge-ca")
    gateway = HAProxyProcess(work_dir=tmp_path / "gateway", ca_file=ca.cert_path, count=4)
    await gateway.start()
    policy = f"gw-{uuid.uuid4().hex[:6]}"
    policy_path = f"{POLICIES}/{policy}"
    try:
        _route_gateway_pod(system, gateway)
        await cluster_objects.create(POLICIES, {
            "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
            "metadata": {"name": policy},
            "spec": {"selector": {"namespaces": [namespace],
                                  "podSelector": {"matchLabels": {"app": "web"}}},
                     "providers": [cloud.name], "traffic": "gateway"}})
        layout = gateway.layout
        system.provider = ProviderProcess(
            work_dir=tmp_path, kubeconfig=system.kubeconfig, node_name=system.node_name,
            clouds=[cloud], client_ca_file=system.client_ca,
            pods={"probe_address_map": str(system.network)},
            extra={"gateway": {"instances": [{"address": GATEWAY_POD_IP,
                                              "runtime": str(layout.socket)}],
                               "reconcile_seconds": 0.5, **_layout_settings(gateway)}})
        system.provider.start()
        await node_ready(kube, system.node_name)
        await service(kube, namespace, "web", "web")
        container = {"name": "main", "image": "vllm/vllm-openai:v0.6",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}, **server()}
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "replica", "labels": {"app": "web"},
                         "annotations": {"vkprovider.io/overflow-policy": policy,
                                         "vkprovider.io/gpu-type": "H100"}},
            "spec": {"nodeName": system.node_name, "tolerations": [TOLERATION],
                     "terminationGracePeriodSeconds": 1, "containers": [container]}})

        # through the gateway: the slice holds the gateway pod's address, never the cloud's
        ours = await eventually(
            lambda: slices(kube, namespace, "web", ours=True),
            until=lambda items: any(r for _, _, r in _addresses(items)),
            timeout=90, what="a ready endpoint for the IP:port replica")
        [(address, port, _)] = _addresses(ours)
        assert address == GATEWAY_POD_IP
        assert layout.first_port <= port < layout.first_port + layout.count
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/replica")
        annotations = pod["metadata"]["annotations"]
        instance_id = annotations["vkprovider.io/instance-id"]
        published = re.findall(r"=([\d.]+):\d+", annotations["vkprovider.io/ports"])
        assert published and all(map(is_public_address, published)), annotations  # IP:port
        lab = AddressMap(system.network)
        before = (await cloud.admin("GET", "/admin/traffic")).get(instance_id, {})
        to_host, to_port = lab.resolve(address, port)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            answer = await eventually(
                lambda: http.get(f"http://{to_host}:{to_port}/v1/models"),
                until=lambda r: r.status_code == 200, timeout=30,
                what="the gateway serving the IP:port replica")
        assert answer.json()["instance"] == instance_id
        assert answer.json()["pod"] == "replica"
        after = (await cloud.admin("GET", "/admin/traffic")).get(instance_id, {})
        assert after.get("traffic", 0) >= before.get("traffic", 0) + 1

        # the policy says auto now: the cloud's published IP:port, with no Service change
        await kube.patch(policy_path, {"spec": {"traffic": "auto"}})
        direct = await eventually(
            lambda: slices(kube, namespace, "web", ours=True),
            until=lambda items: [a for a, _, r in _addresses(items) if r] not in (
                [], [GATEWAY_POD_IP]),
            timeout=30, what="the replica's endpoint re-routed to its published IP:port")
        [(d_address, d_port, _)] = _addresses(direct)
        assert is_public_address(d_address), d_address
        d_host, d_dial = lab.resolve(d_address, d_port)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            assert (await http.get(f"http://{d_host}:{d_dial}/v1/models")).json()[
                "instance"] == instance_id

        # and back: the gateway fronts it again
        await kube.patch(policy_path, {"spec": {"traffic": "gateway"}})
        back = await eventually(
            lambda: slices(kube, namespace, "web", ours=True),
            until=lambda items: [a for a, _, r in _addresses(items) if r] == [GATEWAY_POD_IP],
            timeout=30, what="the replica's endpoint back at the gateway")
        [(_, b_port, _)] = _addresses(back)
        b_host, b_dial = lab.resolve(GATEWAY_POD_IP, b_port)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            answer = await eventually(
                lambda: http.get(f"http://{b_host}:{b_dial}/v1/models"),
                until=lambda r: r.status_code == 200, timeout=30,
                what="the gateway serving the replica again")
        assert answer.json()["instance"] == instance_id
    finally:
        gateway.stop()
        (system.network / "gateway-test.json").unlink(missing_ok=True)

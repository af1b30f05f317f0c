"""A hostname-only cloud's replica serves through the traffic gateway (issue 38).

Real control plane, real provider process, a mock cloud in hostname-only mode (each container
port only at ``https://<instance>-8000.edge.mock.test:443``, a wildcard certificate signed by a
test CA, the edge answering 401 without the cloud's API key in ``Salad-Api-Key``), and a real
HAProxy process standing for the gateway pod: its pod address 100.64.250.1 is routed by the lab's
address map to its listeners on loopback, as kube-proxy's DNAT would. The provider programs it
through its Runtime API and probes the replica at its edge with the cloud's key. Nothing dials
a virtual address except through the address map.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from vkprovider.gateway.haproxycfg import RuntimeTLS
from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import AddressMap, Route, publish_routes
from vkprovider.testing.cluster import free_port
from vkprovider.testing.haproxy import HAProxyProcess
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.pki import CertificateAuthority
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_overflow import pods
from .test_pods import create_pod, list_pods, node_ready, pod_spec
from .test_traffic import ready, server, service, slices

GATEWAY_POD_IP = "100.64.250.1"
GATEWAY_CLOUD = "edgecloud"  # the hostname-only mock cloud
DOMAIN = "edge.mock.test"
KEY_ENV = "MOCK_GATEWAY_TEST_KEY"
KEY = "edge-key-7d1f0c"  # a test value: the mock cloud's API key, which its edge wants too
AUTH = {"Authorization": f"Bearer {KEY}"}


def _endpoints(items: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any]]]:
    """(address, port, endpoint) of every endpoint of our slices."""
    out = []
    for s in items:
        port = int((s.get("ports") or [{}])[0].get("port") or 0)
        for ep in s.get("endpoints") or []:
            out.append((ep["addresses"][0], port, ep))
    return out


async def _edge_cloud(system: System, tmp_path: Path
                      ) -> tuple[MockCloudProcess, CertificateAuthority]:
    """The hostname-only mock cloud (started, stopped with ``system``) and its edge's CA."""
    assert system.network is not None
    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="mock-edge-ca")
    wildcard = ca.issue(stem="edge", common_name=f"*.{DOMAIN}", server=True,
                        hosts=(f"*.{DOMAIN}",))
    cloud = MockCloudProcess(
        work_dir=tmp_path, name=GATEWAY_CLOUD, boot_delay=0.3, address_map_dir=system.network,
        public_block=3, inventory="H100:us-east:8:2.49",
        edge_args=["--api-key-env", KEY_ENV, "--edge-domain", DOMAIN,
                   "--edge-cert", str(wildcard.cert), "--edge-key", str(wildcard.key),
                   "--edge-auth-header", "Salad-Api-Key"],
        env={**os.environ, KEY_ENV: KEY})
    await cloud.start()
    system.clouds.append(cloud)  # stopped with the system
    return cloud, ca


def _route_gateway_pod(system: System, gateway: HAProxyProcess,
                       extra: tuple[tuple[int, int], ...] = ()) -> None:
    """The lab's network: the gateway pod's IP, its listener ports, to HAProxy on loopback."""
    assert system.network is not None
    layout = gateway.layout
    publish_routes(directory=system.network, owner="gateway-test", routes=[
        Route(host=GATEWAY_POD_IP, port=p, to_host="127.0.0.1", to_port=to)
        for p, to in [(p, p) for p in range(layout.first_port,
                                             layout.first_port + layout.count)] + list(extra)])


def _provider(system: System, tmp_path: Path, cloud: MockCloudProcess,
              gateway: dict[str, Any], pods: dict[str, Any] | None = None,
              node: dict[str, Any] | None = None) -> ProviderProcess:
    assert system.network is not None
    provider = ProviderProcess(
        work_dir=tmp_path, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=[cloud], config_providers=False, client_ca_file=system.client_ca,
        pods={"probe_address_map": str(system.network), **(pods or {})}, node=node,
        env={KEY_ENV: KEY},
        extra={"providers": [{"name": cloud.name, "type": "mock", "url": cloud.url,
                              "api_key_env": KEY_ENV}],
               "gateway": {"auth_headers": ["Salad-Api-Key"], "reconcile_seconds": 0.5,
                           **gateway}})
    system.provider = provider
    provider.start()
    return provider


def _layout_settings(gateway: HAProxyProcess) -> dict[str, Any]:
    layout = gateway.layout
    return {"first_port": layout.first_port, "port_count": layout.count,
            "ca_file": str(layout.ca_file), "map_dir": str(layout.map_dir)}


async def _served_replica(kube: KubeClient, namespace: str, system: System, *, what: str,
                          **spec: Any) -> tuple[str, int, dict[str, Any]]:
    """Once the virtual node is Ready: Service ``web`` and its one hostname-only replica pod;
    returns the (address, port, endpoint) its slice holds once the endpoint is ready."""
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "web", "web")
    await create_pod(kube, namespace, "replica",
                     pod_spec(system.node_name, container=server(), **spec),
                     labels={"app": "web"})
    ours = await eventually(
        lambda: slices(kube, namespace, "web", ours=True),
        until=lambda items: any(ep["conditions"].get("ready")
                                for _, _, ep in _endpoints(items)),
        timeout=90, what=what)
    [found] = _endpoints(ours)
    return found


@contextlib.asynccontextmanager
async def gateway_fronted_replica(
        kube: KubeClient, namespace: str, system: System, tmp_path: Path, *, what: str,
) -> AsyncIterator[tuple[MockCloudProcess, CertificateAuthority, HAProxyProcess,
                         ProviderProcess, int, dict[str, Any]]]:
    """A hostname-only mock cloud behind its TLS edge, a real HAProxy standing as the one
    gateway pod, and the provider programming it; yields once the replica's Service endpoint is
    the gateway pod's address and is ready: (cloud, edge CA, gateway, provider, port, endpoint).
    The gateway and its lab route go when the block ends."""
    assert system.network is not None
    cloud, ca = await _edge_cloud(system, tmp_path)
    gateway = HAProxyProcess(work_dir=tmp_path / "gateway", ca_file=ca.cert_path, count=8)
    await gateway.start()
    try:
        _route_gateway_pod(system, gateway)
        provider = _provider(system, tmp_path, cloud, {
            "instances": [{"address": GATEWAY_POD_IP, "runtime": str(gateway.layout.socket)}],
            **_layout_settings(gateway)})
        address, port, endpoint = await _served_replica(kube, namespace, system, what=what)
        assert address == GATEWAY_POD_IP
        yield cloud, ca, gateway, provider, port, endpoint
    finally:
        gateway.stop()
        (system.network / "gateway-test.json").unlink(missing_ok=True)


async def test_a_hostname_only_replica_serves_through_the_gateway_with_tls_and_the_edge_key(
        kube: KubeClient, namespace: str, system: System, tmp_path: Path) -> None:
    assert system.network is not None
    # Ready by its readinessProbe, which the provider sends to the edge with the cloud's key;
    # the Service's slice holds the gateway pod's address and an allocated port.
    async with gateway_fronted_replica(
            kube, namespace, system, tmp_path,
            what="a ready endpoint for the hostname-only replica") as fronted:
        cloud, ca, gateway, provider, port, endpoint = fronted
        address, layout = GATEWAY_POD_IP, gateway.layout
        assert layout.first_port <= port < layout.first_port + layout.count
        assert endpoint["targetRef"]["name"] == "replica"
        [pod] = await list_pods(kube, namespace)
        ports_note = pod["metadata"]["annotations"]["vkprovider.io/ports"]
        assert f".{DOMAIN}:443" in ports_note, ports_note  # the cloud published a name only
        events = (await kube.get(f"/api/v1/namespaces/{namespace}/events",
                                 params={"fieldSelector": "reason=EndpointNotRoutable"}))
        assert events["items"] == []

        lab = AddressMap(system.network)
        instance_id = pod["metadata"]["annotations"]["vkprovider.io/instance-id"]
        edge_host = f"{instance_id.lower()}-8000.{DOMAIN}"

        # Straight to the edge, verified TLS with its name, but no key: refused at the edge.
        edge_ip, edge_port = lab.resolve(edge_host, 443)
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        async with httpx.AsyncClient(verify=context, trust_env=False, timeout=10) as http:
            refused = await http.get(f"https://{edge_ip}:{edge_port}/v1/models",
                                     headers={"Host": edge_host},
                                     extensions={"sni_hostname": edge_host})
        assert refused.status_code == 401, refused.text

        # Through the gateway (as kube-proxy would send a Service's traffic): the model server
        # answers, over TLS the gateway verified, with the key the gateway added.
        before = (await cloud.admin("GET", "/admin/traffic", headers=AUTH)).get(instance_id, {})
        to_host, to_port = lab.resolve(address, port)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            answer = await eventually(
                lambda: http.get(f"http://{to_host}:{to_port}/v1/models"),
                until=lambda r: r.status_code == 200, timeout=30,
                what="the gateway serving the replica")
        body = answer.json()
        assert (body["pod"], body["namespace"], body["container_port"]) == (
            "replica", namespace, 8000)
        assert body["instance"] == instance_id
        after = (await cloud.admin("GET", "/admin/traffic", headers=AUTH)).get(instance_id, {})
        assert after.get("traffic", 0) >= before.get("traffic", 0) + 1

        # The key never reaches the provider's log or the gateway's.
        assert KEY not in provider.log_text()
        assert KEY not in gateway.log_path.read_text(errors="replace")

        # A restarted gateway (a new pod, empty memory) is re-programmed by the provider.
        await gateway.restart()
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            again = await eventually(
                lambda: http.get(f"http://{to_host}:{to_port}/v1/models"),
                until=lambda r: r.status_code == 200, timeout=30,
                what="the restarted gateway re-programmed")
        assert again.json()["instance"] == instance_id


async def test_gateway_pods_are_found_by_label_programmed_over_mutual_tls_and_left_when_unready(
        kube: KubeClient, namespace: str, system: System, tmp_path: Path) -> None:
    """The chart's shape: the provider finds the gateway Deployment's Ready pods by label and
    programs each through its Runtime API over mutual TLS (HAProxy terminates it); a gateway
    pod that turns unready is no longer any replica's endpoint, and is again once Ready."""
    assert system.network is not None
    cloud, ca = await _edge_cloud(system, tmp_path)
    (tmp_path / "runtime-pki").mkdir()
    runtime_ca = CertificateAuthority(directory=tmp_path / "runtime-pki", name="gw-runtime-ca")
    server_pair = runtime_ca.issue(stem="gateway", common_name="gateway", server=True,
                                   hosts=("gateway",))
    client_pair = runtime_ca.issue(stem="provider", common_name="vkprovider", client=True)
    pem = tmp_path / "runtime-pki" / "gateway.pem"
    pem.write_bytes(server_pair.cert.read_bytes() + server_pair.key.read_bytes())
    runtime_port = free_port()
    gateway = HAProxyProcess(
        work_dir=tmp_path / "gateway", ca_file=ca.cert_path, count=8,
        runtime_tls=RuntimeTLS(bind=f"127.0.0.1:{runtime_port}", server_pem=pem,
                               client_ca=runtime_ca.cert_path))
    await gateway.start()
    pod_path = f"/api/v1/namespaces/{namespace}/pods"
    try:
        _route_gateway_pod(system, gateway, extra=((9999, runtime_port),))
        # the gateway pod as the API server knows it (never scheduled: nothing runs it here;
        # the HAProxy process above plays it), Ready at GATEWAY_POD_IP
        await kube.create(pod_path, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "gateway-0",
                         "labels": {"app.kubernetes.io/component": "gateway"}},
            "spec": {"nodeSelector": {"vkprovider.io/no-such-node": "true"},
                     "containers": [{"name": "haproxy", "image": "haproxy:2.6"}]}})

        async def gateway_pod_ready(ready: bool) -> None:
            await kube.request("PATCH", f"{pod_path}/gateway-0/status", body={"status": {
                "podIP": GATEWAY_POD_IP, "podIPs": [{"ip": GATEWAY_POD_IP}],
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}},
                content_type="application/strategic-merge-patch+json")

        await gateway_pod_ready(True)
        _provider(system, tmp_path, cloud, {
            "pods": {"namespace": namespace,
                     "selector": "app.kubernetes.io/component=gateway",
                     "runtime_port": 9999},
            "runtime_tls": {"cert_file": str(client_pair.cert),
                            "key_file": str(client_pair.key),
                            "ca_file": str(runtime_ca.cert_path), "server_name": "gateway"},
            **_layout_settings(gateway)})
        address, port, _ = await _served_replica(
            kube, namespace, system, what="a ready endpoint at the discovered gateway pod")
        assert address == GATEWAY_POD_IP
        lab = AddressMap(system.network)
        to_host, to_port = lab.resolve(address, port)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            answer = await eventually(
                lambda: http.get(f"http://{to_host}:{to_port}/v1/models"),
                until=lambda r: r.status_code == 200, timeout=30,
                what="the discovered gateway serving the replica")
        assert answer.json()["pod"] == "replica"

        # unready: no gateway pod left to home the replica, so no endpoint points there
        await gateway_pod_ready(False)
        await eventually(lambda: slices(kube, namespace, "web", ours=True),
                         until=lambda items: not _endpoints(items), timeout=30,
                         what="the endpoint gone with the unready gateway pod")
        await gateway_pod_ready(True)
        back = await eventually(lambda: slices(kube, namespace, "web", ours=True),
                                until=lambda items: bool(_endpoints(items)), timeout=30,
                                what="the endpoint back with the Ready gateway pod")
        assert [(a, p) for a, p, _ in _endpoints(back)] == [(GATEWAY_POD_IP, port)]
    finally:
        gateway.stop()
        (system.network / "gateway-test.json").unlink(missing_ok=True)


class HeldRuntime:
    """``tcp://127.0.0.1:<port>`` in front of an HAProxy's Runtime API (its Unix socket): the
    gateway pod's control path, which the test can cut as a network partition would (a held
    connection is accepted and gets no answer and no reset) and restore. The data path (the
    listeners) is untouched."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.port = 0
        self.answered = 0  # commands relayed and answered
        self.waiting = 0  # commands held right now
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()  # non-interactive mode: one command per connection
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
            up_reader, up_writer = await asyncio.open_unix_connection(str(self.socket))
            up_writer.write(line)
            await up_writer.drain()
            answer = await up_reader.read()
            up_writer.close()
            writer.write(answer)
            await writer.drain()
            self.answered += 1
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def test_a_gateway_endpoint_is_not_ready_until_a_pass_has_programmed_its_route(
        kube: KubeClient, namespace: str, system: System, tmp_path: Path) -> None:
    """No request is sent to a route the gateway does not serve yet. The gateway pod's
    Runtime API stops answering (its data path keeps working) before the replica exists, so
    the pass that would program the replica's route is held. The replica turns Ready (its
    probe goes to its edge, not through the gateway) and the slice holds its gateway endpoint,
    but not ready: HAProxy answers 503 on that port. Once the Runtime API answers again, the
    pass programs the route, the provider re-syncs the slice, and the endpoint turns ready and
    serves. (Before the fix the slice published it ready at once.)"""
    assert system.network is not None
    cloud, ca = await _edge_cloud(system, tmp_path)
    gateway = HAProxyProcess(work_dir=tmp_path / "gateway", ca_file=ca.cert_path, count=4)
    await gateway.start()
    runtime = HeldRuntime(gateway.layout.socket)
    await runtime.start()
    try:
        _route_gateway_pod(system, gateway)
        provider = _provider(system, tmp_path, cloud, {
            "instances": [{"address": GATEWAY_POD_IP,
                           "runtime": f"tcp://127.0.0.1:{runtime.port}"}],
            # a held command keeps the gateway pod healthy (not timed out) for the whole test
            "runtime_timeout_seconds": 600, **_layout_settings(gateway)})
        await node_ready(kube, system.node_name)
        await eventually(provider.metrics, timeout=30, what="a whole gateway pass",
                         until=lambda text: 'vkprovider_gateway_passes_total{result="ok"}'
                         in text and 'vkprovider_gateway_passes_total{result="ok"} 0.0'
                         not in text)
        runtime.hold()
        await service(kube, namespace, "web", "web")
        await create_pod(kube, namespace, "replica", pod_spec(system.node_name,
                                                              container=server()),
                         labels={"app": "web"})
        await eventually(lambda: list_pods(kube, namespace),
                         until=lambda pods: len(pods) == 1 and ready(pods[0]), timeout=90,
                         what="the replica Ready by its probe at the edge")
        # a barrier: a Service change after the pod turned Ready makes the provider rewrite
        # the slice from what it knows now (the replica told Ready before its status said so)
        await kube.patch(f"/api/v1/namespaces/{namespace}/services/web", {"spec": {"ports": [
            {"name": "web", "port": 80, "targetPort": "http"},
            {"name": "alt", "port": 81, "targetPort": "http"}]}})
        held = await eventually(
            lambda: slices(kube, namespace, "web", ours=True),
            until=lambda items: any(len(s.get("ports") or []) == 2 for s in items),
            timeout=30, what="the slice rewritten after the Service change")
        assert runtime.waiting >= 1, "the pass that would program the route is still held"
        [(address, port, endpoint)] = _endpoints(
            [s for s in held if len(s.get("ports") or []) == 2])
        assert address == GATEWAY_POD_IP and endpoint["targetRef"]["name"] == "replica"
        assert (endpoint["conditions"]["ready"], endpoint["conditions"]["serving"]) == (
            False, False), endpoint
        to_host, to_port = AddressMap(system.network).resolve(address, port)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            assert (await http.get(f"http://{to_host}:{to_port}/v1/models")).status_code == 503

        runtime.release()
        served = await eventually(
            lambda: slices(kube, namespace, "web", ours=True),
            until=lambda items: any(ep["conditions"].get("ready")
                                    for _, _, ep in _endpoints(items)),
            timeout=30, what="the endpoint ready once its route is programmed")
        assert [(a, p) for a, p, _ in _endpoints(served)] == [(address, port)]
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            answer = await http.get(f"http://{to_host}:{to_port}/v1/models")
        assert answer.status_code == 200, answer.text
        assert answer.json()["pod"] == "replica"
    finally:
        runtime.release()
        runtime.close()
        gateway.stop()
        (system.network / "gateway-test.json").unlink(missing_ok=True)


STREAM_EVENTS, STREAM_EVERY = 30, 1.0  # a 30 s streamed response
DRAIN_SECONDS = 35  # the move-back's delete comes after the stream began: it outlasts it


async def test_a_30s_stream_through_the_gateway_finishes_during_a_move_back_drain(
        kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
        companion_kubeconfig: Path, cluster_objects: Cluster, tmp_path: Path) -> None:
    """Issue 38: a streamed response of 30 s passes through the gateway and finishes during a
    move-back's drain. The overflow story with one replica (test_moveback.py): training
    preempts inference onto a hostname-only cloud, served through the gateway; a 30 s stream
    starts through the replica's gateway endpoint; the training ends, the internal GPU is free
    again, and the companion moves the replica home make-before-break: the internal replica is
    Ready, then the cloud one is deleted. Its endpoint (the gateway pod's address and port)
    turns terminating, the gateway keeps the route in service, the stream runs to its last
    event while the replica drains, and only after the drain are the route and the pod gone.
    Ready replicas never dip below one."""
    from .test_moveback import overflow_then_free

    assert system.network is not None
    network = system.network
    held: dict[str, Any] = {}
    gateway_box: list[HAProxyProcess] = []

    async def start() -> None:
        cloud, ca = await _edge_cloud(system, tmp_path)
        gateway = HAProxyProcess(work_dir=tmp_path / "gateway", ca_file=ca.cert_path, count=4)
        await gateway.start()
        gateway_box.append(gateway)
        _route_gateway_pod(system, gateway)
        _provider(system, tmp_path, cloud, {
            "instances": [{"address": GATEWAY_POD_IP, "runtime": str(gateway.layout.socket)}],
            **_layout_settings(gateway)}, pods={"drain_seconds": DRAIN_SECONDS},
                  node={"labels": {"vkprovider.io/pool": namespace}})
        held["cloud"] = cloud.name

    async def before_preemption() -> None:
        await service(kube, namespace, "inference", "inference")

    events: list[str] = []

    async def start_stream() -> None:
        """The cloud replica serves through the gateway: a 30 s stream begins there."""
        ours = await eventually(
            lambda: slices(kube, namespace, "inference", ours=True),
            until=lambda items: any(ep["conditions"].get("ready")
                                    for _, _, ep in _endpoints(items)),
            timeout=60, what="the cloud replica's ready gateway endpoint")
        [(address, port, endpoint)] = _endpoints(ours)
        assert address == GATEWAY_POD_IP
        name = endpoint["targetRef"]["name"]
        cloud_pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        to_host, to_port = AddressMap(network).resolve(address, port)
        url = f"http://{to_host}:{to_port}"
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            await eventually(lambda: http.get(f"{url}/v1/models"),
                             until=lambda r: r.status_code == 200, timeout=30,
                             what="the gateway serving the cloud replica")
        first = asyncio.Event()

        async def stream() -> None:
            async with httpx.AsyncClient(trust_env=False, timeout=60) as http, \
                    http.stream("GET", f"{url}/stream?events={STREAM_EVENTS}"
                                       f"&every={STREAM_EVERY}") as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line)
                        first.set()

        held.update(address=address, port=port, url=url, pod=name,
                    instance=cloud_pod["metadata"]["annotations"]["vkprovider.io/instance-id"],
                    streaming=asyncio.create_task(stream()))
        await asyncio.wait_for(first.wait(), 15)

    try:
        internal, watcher = await overflow_then_free(
            kube=kube, namespace=namespace, gpu_nodes=gpu_nodes, system=system,
            companion_kubeconfig=companion_kubeconfig, objects=cluster_objects, replicas=1,
            container=server(), template={"terminationGracePeriodSeconds": DRAIN_SECONDS + 5},
            start=start, providers=[GATEWAY_CLOUD], before_preemption=before_preemption,
            before_freeing=start_stream)
        streaming: asyncio.Task[None] = held["streaming"]
        try:
            # the move-back: an internal replica Ready, then the cloud one deleted; its
            # endpoint turns terminating first (the same gateway address and port)
            draining = await eventually(
                lambda: slices(kube, namespace, "inference", ours=True),
                until=lambda items: any(ep["conditions"].get("terminating")
                                        for _, _, ep in _endpoints(items)),
                timeout=90, what="the cloud replica's gateway endpoint terminating")
            [(d_address, d_port, d_endpoint)] = _endpoints(draining)
            assert (d_address, d_port) == (held["address"], held["port"])
            assert d_endpoint["conditions"]["ready"] is False
            assert not streaming.done(), "the stream ended before the move-back's drain began"
            home = await pods(kube, namespace, "inference")
            assert len(home) == 1 and home[0]["spec"]["nodeName"] in internal, "moved home"

            await asyncio.wait_for(streaming, STREAM_EVENTS * STREAM_EVERY + 30)
            assert events == [f"data: {held['instance']} {i}" for i in range(STREAM_EVENTS)]
            # it finished during the drain: the cloud pod is still there, being deleted
            cloud_pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{held['pod']}")
            assert cloud_pod["metadata"].get("deletionTimestamp")
            await watcher.fresh()
        finally:
            await watcher.stop()
            if not streaming.done():
                streaming.cancel()
        assert watcher.minimum is not None and watcher.minimum >= 1, \
            f"ready replicas dipped to {watcher.minimum}"

        # after the drain: the pod is gone and the gateway no longer serves the route
        await eventually(lambda: list_pods(kube, namespace, "app=inference"),
                         until=lambda ps: held["pod"] not in {p["metadata"]["name"]
                                                             for p in ps},
                         timeout=90, what="the drained cloud replica deleted")
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            await eventually(lambda: http.get(f"{held['url']}/v1/models"),
                             until=lambda r: r.status_code == 503, timeout=30,
                             what="the route removed after the drain")
    finally:
        for gateway in gateway_box:
            gateway.stop()
        (system.network / "gateway-test.json").unlink(missing_ok=True)

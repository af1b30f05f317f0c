"""The chart's traffic gateway as pods: a hostname-only replica served over kube-proxy (issue 38).

``helm install`` of the chart on the real node (:mod:`.realinstall`) with ``gateway.enabled``:
the provider, the companion and the mock cloud run from the project's image, the gateway
Deployment (2 replicas) from the gateway's own image (Debian's HAProxy 2.6,
tools/image/gateway.sh), both built offline and imported into the node's containerd. The mock
cloud runs in hostname-only mode: a replica is published only as
``https://<instance>-8000.<domain>:443``. That edge is real: a TLS model server (a wildcard
certificate of a test CA) at a public address in a network namespace beside the node
(:class:`vkprovider.testing.netspace.AddressSpace`), and the node's DNS answers the domain's
names with that address, as public DNS would (:meth:`RealNode.publish_names`). The gateway pods
trust the test CA (mounted through ``gateway.extraVolumes``, named by ``gateway.edgeCAFile``);
their Runtime API is served over mutual TLS from a Secret this test makes.

Proved, in order:

* the gateway pods run the gateway image as uid 99 on a read-only root and become Ready (their
  ``/healthz`` probes pass);
* the provider finds and programs them: the Service's EndpointSlice holds one gateway pod's IP
  and a listener port for the replica, and a client pod's requests to the Service's ClusterIP,
  DNATed by kube-proxy, reach the edge through that gateway pod over verified TLS, with the
  edge's name as SNI and ``Host``;
* deleting that gateway pod fails no request: the provider moves the endpoint to the other
  gateway pod while the deleted one still serves (``gateway.drainSeconds``), and the Deployment's
  replacement becomes Ready.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import ssl
import time
import uuid
from pathlib import Path

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.realdemo import ClientLog, client_pod
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.netspace import AddressSpace
from vkprovider.testing.pki import CertificateAuthority
from vkprovider.testing.realnode import TOLERATION, RealNode, find_gateway_image_archive
from vkprovider.testing.waiting import eventually

from .bursts import burst_objects
from .realinstall import (
    CHART,
    Obj,
    component,
    helm,
    import_project_image,
    kubectl,
    node_ready,
    pods,
    print_release,
    ready,
    real_node_values,
)
from .test_traffic import slices

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
DOMAIN = "edge.gw-lab.test"
PORT = 8000
FIRST_PORT = 20000
#: requests the client must get answered in a chapter before the next step
CHAPTER = 40


def _secret(name: str, data: dict[str, bytes], kind: str = "Opaque") -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": kind,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def _gateway_endpoint(items: list[Obj]) -> tuple[str, int, bool] | None:
    """(address, port, ready) of the one endpoint of the provider's slices, or None."""
    found = [(ep["addresses"][0], int((s.get("ports") or [{}])[0].get("port") or 0),
              bool((ep.get("conditions") or {}).get("ready")))
             for s in items for ep in s.get("endpoints") or []]
    return found[0] if len(found) == 1 else None


async def test_the_charts_gateway_pods_serve_a_hostname_only_replica_over_kube_proxy(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str,
        tmp_path: Path) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    image = await import_project_image(real_node, timings)
    archive = await asyncio.to_thread(find_gateway_image_archive)
    gateway_image = await asyncio.to_thread(real_node.import_image, archive)
    timings["images"] = time.monotonic() - t0

    # the PKI: the Runtime API's mutual TLS (server and client: one certificate, as the chart
    # mounts one Secret in both), and the edge's wildcard certificate from another CA
    (tmp_path / "runtime-ca").mkdir()
    (tmp_path / "edge-ca").mkdir()
    runtime_ca = CertificateAuthority(directory=tmp_path / "runtime-ca", name="gw-runtime-ca")
    runtime = runtime_ca.issue(stem="runtime", common_name="vkprovider-gateway", server=True,
                               client=True, hosts=("vkprovider-gateway",))
    edge_ca = CertificateAuthority(directory=tmp_path / "edge-ca", name="gw-edge-ca")
    edge = edge_ca.issue(stem="edge", common_name=f"*.{DOMAIN}", server=True,
                         hosts=(f"*.{DOMAIN}",))
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    # as docs/install.md says to make it
    made = await kubectl(local_cluster, "-n", namespace, "create", "secret", "generic",
                         "gw-runtime-tls", "--type=kubernetes.io/tls",
                         f"--from-file=tls.crt={runtime.cert}",
                         f"--from-file=tls.key={runtime.key}",
                         f"--from-file=ca.crt={runtime_ca.cert_path}")
    assert made.returncode == 0, made.stderr
    await kube.create(secrets, _secret("gw-edge-ca", {"ca.crt": edge_ca.cert_path.read_bytes()}))
    await kube.create(secrets, _secret("mock-edge-tls", {
        "tls.crt": edge.cert.read_bytes(), "tls.key": edge.key.read_bytes()},
        "kubernetes.io/tls"))

    # the edge: one public address beside the node for every name of the domain (as a cloud's
    # proxy), HTTPS with the wildcard certificate; it records the SNI each handshake asked for
    edge_ip = f"198.19.{random.randint(1, 254)}.{random.randint(1, 254)}"
    sni: list[str | None] = []
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(edge.cert, edge.key)
    tls.sni_callback = lambda _sock, name, _ctx: sni.append(name)
    space = AddressSpace(node=real_node, addresses=[edge_ip])

    suffix = uuid.uuid4().hex[:6]
    release, vnode = f"rg{suffix}", f"vk-gw-{suffix}"
    on_the_real_node = {"nodeSelector": {"kubernetes.io/hostname": real_node.name},
                        "tolerations": [TOLERATION]}
    repository, tag = gateway_image.rsplit(":", 1)
    values = real_node_values(
        real_node=real_node, image=image, virtual_node=vnode, pool=namespace,
        mock_cloud_args=["--inventory=H100:us-east:8:2.49", "--boot-delay=0.3",
                         f"--edge-domain={DOMAIN}", "--edge-cert=/etc/mock-edge/tls.crt",
                         "--edge-key=/etc/mock-edge/tls.key"],
        tmp_path=tmp_path,
        extra={
            "mockCloud": {
                "extraVolumes": [{"name": "edge", "secret": {"secretName": "mock-edge-tls"}}],
                "extraVolumeMounts": [{"name": "edge", "mountPath": "/etc/mock-edge",
                                       "readOnly": True}]},
            "gateway": {
                "enabled": True, "runtimeTLSSecret": "gw-runtime-tls",
                "image": {"repository": repository, "tag": tag},
                "edgeCAFile": "/etc/vkprovider/edge-ca/ca.crt",
                "extraVolumes": [{"name": "edge-ca", "secret": {"secretName": "gw-edge-ca"}}],
                "extraVolumeMounts": [{"name": "edge-ca", "mountPath": "/etc/vkprovider/edge-ca",
                                       "readOnly": True}],
                **on_the_real_node}})
    installed = False
    policy = f"gw-{suffix}"
    try:
        await space.start()
        server = await space.serve(address=edge_ip, port=443, identity={"replica": "edge"},
                                   tls=tls)
        real_node.publish_names({f"*.{DOMAIN}": edge_ip})

        t1 = time.monotonic()
        done = await helm(local_cluster, "install", release, str(CHART), "--namespace",
                          namespace, "--values", str(values), "--wait", "--timeout", "6m")
        installed = done.returncode == 0
        assert done.returncode == 0, done.stdout + done.stderr
        timings["helm install --wait"] = time.monotonic() - t1

        # the gateway pods: the gateway image, uid 99, read-only root, Ready by their probes
        gateways = await pods(kube, namespace, component("gateway"))
        assert len(gateways) == 2, [p["metadata"]["name"] for p in gateways]
        for pod in gateways:
            assert pod["spec"]["nodeName"] == real_node.name and ready(pod), pod["status"]
            (status,) = pod["status"]["containerStatuses"]
            assert status["image"].endswith(gateway_image) and status["ready"], status
            (container,) = pod["spec"]["containers"]
            security = container["securityContext"]
            assert security["runAsUser"] == 99 and security["readOnlyRootFilesystem"] is True
            assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
        await eventually(lambda: node_ready(kube, vnode), timeout=120, interval=0.5,
                         what=f"virtual node {vnode} Ready")

        # a Service and its one replica, which overflows to the hostname-only mock cloud
        overflow, deployment = burst_objects(namespace=namespace, policy=policy)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        container["ports"] = [{"name": "http", "containerPort": PORT}]
        await kube.create(POLICIES, overflow)
        svc = await kube.create(f"/api/v1/namespaces/{namespace}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "burst"},
            "spec": {"selector": {"app": "burst"},
                     "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}})
        await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
        (burst,) = await eventually(
            lambda: pods(kube, namespace, "app=burst"),
            until=lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName") == vnode
            and ps[0]["status"].get("phase") == "Running", timeout=180,
            what=f"the replica Running on {vnode}")
        published = burst["metadata"]["annotations"]["vkprovider.io/ports"]
        assert f".{DOMAIN}:443" in published and "198.19." not in published, published

        # the provider programs the gateway pods: the slice names one of them and a listener
        gateway_ips = {p["status"]["podIP"]: p["metadata"]["name"] for p in gateways}
        first = _gateway_endpoint(await eventually(
            lambda: slices(kube, namespace, "burst", ours=True),
            until=lambda items: (e := _gateway_endpoint(items)) is not None and e[2]
            and e[0] in gateway_ips, timeout=120,
            what="the replica's endpoint at a gateway pod, ready"))
        assert first is not None
        address, port, _ = first
        assert address in gateway_ips and FIRST_PORT <= port < FIRST_PORT + 256, (address, port)

        # a client pod on the real node: ClusterIP -> kube-proxy -> gateway pod -> TLS -> edge
        client = f"client-{suffix}"
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", client_pod(
            node=real_node.name, name=client, cluster_ip=str(svc["spec"]["clusterIP"])))
        await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{client}"),
                         until=lambda p: (p.get("status") or {}).get("phase") == "Running",
                         timeout=90, what="the client pod Running")
        log = ClientLog(cluster=local_cluster, namespace=namespace, pod=client)
        # (kube-proxy may write its rule a moment after the client starts: the chapter starts
        # with the first answer)
        await eventually(log.read, until=lambda _: any(line.startswith("ok ")
                                                       for line in log.lines),
                         timeout=120, what="the client's first answer")
        await log.mark("through the gateway")
        await log.wait_requests(CHAPTER, what="requests through the gateway")

        # the gateway pod that serves the replica is deleted: the endpoint moves to the other
        home = gateway_ips[address]
        await log.mark("its gateway pod deleted")
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{home}")
        moved = await eventually(
            lambda: slices(kube, namespace, "burst", ours=True),
            until=lambda items: (e := _gateway_endpoint(items)) is not None and e[2]
            and e[0] != address, timeout=120, what="the endpoint re-homed")
        new_address = _gateway_endpoint(moved)
        await eventually(lambda: pods(kube, namespace, component("gateway")),
                         until=lambda ps: len(ps) == 2 and all(ready(p) for p in ps)
                         and home not in {p["metadata"]["name"] for p in ps}, timeout=180,
                         what="two gateway pods Ready again, the deleted one replaced")
        await log.wait_requests(CHAPTER, what="requests after the gateway pod's deletion")
        await log.mark("end")
        rows = log.rows()
        print("\nthe client pod's requests through the chart's gateway pods:")
        for row in rows:
            print(f"  {row.chapter}: {row.requests} requests, {row.failed} failed "
                  f"{row.failures or ''} in {row.seconds:.1f} s, by {row.by_replica}")
        print(f"  endpoint {address}:{port} -> {new_address}; edge {edge_ip} saw hosts "
              f"{dict(server.hosts)} SNI {sorted(set(map(str, sni)))}")
        assert [r.failed for r in rows] == [0, 0], rows
        assert all(r.by_replica == {"edge": r.requests} for r in rows), rows

        # what the edge saw: every request by the replica's name, over TLS with that name as SNI
        (host,) = {h for h in server.hosts if h}
        name = host.removesuffix(":443")
        assert name.endswith(f"-{PORT}.{DOMAIN}") and f"{name}:443" in published, (host, published)
        assert server.counters.traffic >= 2 * CHAPTER and server.counters.traffic_5xx == 0
        assert set(sni) == {name}, sni
    except BaseException:
        await print_release(kube, local_cluster, namespace)
        for pod in await pods(kube, namespace, component("gateway")):
            got = await kubectl(local_cluster, "-n", namespace, "logs", "--all-containers",
                                "--tail=40", pod["metadata"]["name"])
            print(f"--- {pod['metadata']['name']} log (tail)\n{got.stdout}{got.stderr}")
        raise
    finally:
        real_node.publish_names({})
        if installed:
            await helm(local_cluster, "uninstall", release, "--namespace", namespace,
                       "--no-hooks", "--timeout", "2m")
        for path in (f"{POLICIES}/{policy}", f"/api/v1/nodes/{vnode}"):
            with contextlib.suppress(APIError):
                await kube.delete(path)
        await space.stop()
        timings["whole test"] = time.monotonic() - t0
        print("\nreal gateway timings (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in timings.items()))


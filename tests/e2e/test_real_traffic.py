"""Service traffic over the real path: a client pod, kube-proxy's rules, inside and cloud replicas.

The real node (:class:`vkprovider.testing.realnode.RealNode`) runs the real kube-proxy (iptables
mode) in a network namespace with no route off the machine. A Deployment has two replicas: one
on the real node (busybox httpd, a real container) and one that overflowed onto the virtual node,
whose instance the mock cloud runs at a public address (198.18.x.y). That address lives in a
network namespace the test creates beside the node (:class:`vkprovider.testing.netspace.
AddressSpace`, a veth pair into the node's namespace, routes for that ``/32`` only), where a real
model server listens on the instance's public port. A client pod on the real node sends requests
to the Service's ClusterIP; kube-proxy's own rules, from the stock EndpointSlice and the one the
provider writes, deliver them to both. No address table: the mock cloud and the provider get
none, the cloud replica has no probe, nothing on the host dials 198.18.x.y (the host has no route
there), and the client counts its own failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.realdemo import PORT, httpd_container
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import grant_provider_node
from vkprovider.testing.netspace import AddressSpace
from vkprovider.testing.realnode import TOLERATION, RealNode, find_kubectl
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import TOLERATION as VIRTUAL_TOLERATION
from .test_pods import node_ready
from .test_real_node import busybox_pod, kubectl, nat_rules, running

pytestmark = pytest.mark.cluster

GPU = "nvidia.com/gpu"
REQUESTS = 100

#: the client: REQUESTS HTTP/1.0 GETs to the ClusterIP, one line per request ("ok <body>" or
#: "fail <status line>"), then its own totals (busybox wget crashes on this kernel: nc by hand)
CLIENT = """\
n=0; ok=0; failed=0
while [ $n -lt {requests} ]; do
  n=$((n+1))
  reply=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 80 2>&1)
  case "$reply" in
    "HTTP/1."?" 200 "*) ok=$((ok+1)); echo "ok $(printf '%s\\n' "$reply" | tail -n 1)" ;;
    *) failed=$((failed+1)); echo "fail $(printf '%s\\n' "$reply" | head -n 1)" ;;
  esac
done
echo "total $n ok $ok failed $failed"
"""


def deployment(*, name: str, real_node: str, virtual_node: str) -> dict[str, Any]:
    """Two replicas, one per node (required anti-affinity), each asking one GPU: the real
    node's (it advertises one for this test) and a cloud instance's."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels,
                             "annotations": {"vkprovider.io/gpu-type": "H100"}},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{
                                "key": "kubernetes.io/hostname", "operator": "In",
                                "values": [real_node, virtual_node]}]}]}},
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": {"matchLabels": labels},
                             "topologyKey": "kubernetes.io/hostname"}]},
                    },
                    "tolerations": [TOLERATION, VIRTUAL_TOLERATION],
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False,
                    "containers": [httpd_container(verbose=True)],
                },
            },
        },
    }


async def pods_by_node(kube: KubeClient, ns: str, app: str) -> dict[str, dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"app={app}"})
    return {p["spec"].get("nodeName", ""): p for p in body["items"]
            if not p["metadata"].get("deletionTimestamp")}


def phase_running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def run_client(cluster: LocalCluster, ns: str, pod: str, ip: str) -> tuple[dict[str, int],
                                                                           Counter[str]]:
    """The client's own totals and the replicas that answered (from the bodies)."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    # a request that finds no server waits out nc's 2 s: the exec may take that long for each
    done = subprocess.run([str(find_kubectl()), "-n", ns, "exec", pod, "--", "sh", "-c",
                           CLIENT.format(requests=REQUESTS, ip=ip)], capture_output=True,
                          text=True, env=env, timeout=60 + 3 * REQUESTS, check=False)
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    *answers, last = lines
    words = last.split()
    assert words[0::2] == ["total", "ok", "failed"], last
    totals = dict(zip(words[0::2], (int(w) for w in words[1::2]), strict=True))
    by_replica: Counter[str] = Counter()
    for line in answers:
        verdict, _, rest = line.partition(" ")
        by_replica[json.loads(rest)["replica"] if verdict == "ok" else f"failed: {rest}"] += 1
    return totals, by_replica


def httpd_requests(cluster: LocalCluster, ns: str, pod: str) -> int:
    """Requests the internal replica's busybox httpd logged (``-vv``: one ``url:`` per request)."""
    done = kubectl(cluster, "-n", ns, "logs", pod)
    assert done.returncode == 0, done
    return sum(1 for line in done.stdout.splitlines() if "url:/" in line)


async def rules_with(netns: str, *targets: str, present: bool = True) -> str:
    """kube-proxy's nat rules in the node's namespace once every ``--to-destination`` of
    ``targets`` is there (or, ``present=False``, none is)."""

    def check(rules: str) -> bool:
        found = [f"--to-destination {t}" in rules for t in targets]
        return all(found) if present else not any(found)

    return await eventually(lambda: asyncio.to_thread(nat_rules, netns), until=check,
                            timeout=60, interval=0.5,
                            what=f"kube-proxy rules {'with' if present else 'without'} "
                                 f"{', '.join(targets)}")


async def test_a_client_pod_reaches_internal_and_cloud_replicas_through_kube_proxy(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str,
        provider_kubeconfig: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    # no address map for the cloud, the provider or anyone: the network is the only path
    system = System(work_dir=tmp_path, kubeconfig=provider_kubeconfig, kube=kube,
                    client_ca=local_cluster.ca_path, network=None)
    await grant_provider_node(kube=kube, node=system.node_name)
    space: AddressSpace | None = None
    status = f"/api/v1/nodes/{real_node.name}/status"
    app = f"web-{uuid.uuid4().hex[:6]}"
    try:
        provider = await system.start(boot_delay=0.3)
        await node_ready(kube, system.node_name)
        timings["virtual node Ready"] = time.monotonic() - t0
        # the real node offers one GPU: an extended resource the scheduler counts (no device
        # plugin: the kubelet admits it as it would any advertised extended resource)
        await kube.patch(status, {"status": {"capacity": {GPU: "1"}}})
        await eventually(lambda: kube.get(f"/api/v1/nodes/{real_node.name}"),
                         until=lambda n: n["status"].get("allocatable", {}).get(GPU) == "1",
                         timeout=30, what="the real node's GPU allocatable")
        await kube.create(f"/api/v1/namespaces/{namespace}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": app},
            "spec": {"selector": {"app": app},
                     "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}})
        svc = await kube.get(f"/api/v1/namespaces/{namespace}/services/{app}")
        cluster_ip = svc["spec"]["clusterIP"]
        await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                          deployment(name=app, real_node=real_node.name,
                                     virtual_node=system.node_name))
        pods = await eventually(
            lambda: pods_by_node(kube, namespace, app),
            until=lambda ps: set(ps) == {real_node.name, system.node_name}
            and all(phase_running(p) for p in ps.values()),
            timeout=120, what="one replica Running on each node")
        timings["both replicas Running"] = time.monotonic() - t0
        internal = pods[real_node.name]
        cloud = pods[system.node_name]
        internal_ip = internal["status"]["podIP"]

        # the cloud's instance, as the cloud reports it: its public address lives in a
        # namespace beside the node, with a model server on the published port
        [instance] = [i for i in await system.clouds[0].instances()
                      if i.get("state") == "running"]
        public_ip = instance["public_ip"]
        [published] = [p for p in instance["ports"] if p["container_port"] == PORT]
        public_port = int(published["public_port"])
        space = AddressSpace(node=real_node, addresses=[public_ip])
        await space.start()
        cloud_server = await space.serve(address=public_ip, port=public_port,
                                         identity={"replica": cloud["metadata"]["name"]})
        timings["cloud address space serving"] = time.monotonic() - t0
        # routed inside the node's namespace only: the host's own has no route of its own
        assert f"{public_ip} via {space.space_side}" in space.routes()
        host_routes = await asyncio.to_thread(subprocess.run, ["ip", "-4", "route", "show",
                                                              "table", "all"],
                                              capture_output=True, text=True, check=True)
        assert public_ip not in host_routes.stdout

        client = f"client-{uuid.uuid4().hex[:6]}"
        await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                          busybox_pod(real_node, client, "exec sleep 3600"))
        await running(kube, namespace, client)
        rules = await rules_with(real_node.netns, f"{internal_ip}:{PORT}",
                                 f"{public_ip}:{public_port}")
        assert cluster_ip in rules
        timings["kube-proxy rules for both"] = time.monotonic() - t0

        totals, by_replica = await asyncio.to_thread(run_client, local_cluster, namespace,
                                                     client, cluster_ip)
        timings["requests done"] = time.monotonic() - t0
        served_inside = await asyncio.to_thread(httpd_requests, local_cluster, namespace,
                                                internal["metadata"]["name"])
        table = {"client": totals, "answered by": dict(by_replica),
                 "cloud model server": cloud_server.counters.as_dict(),
                 "internal httpd": served_inside, "timings": timings,
                 "real node bring-up": real_node.timings}
        print(f"request table: {json.dumps(table, indent=1)}")
        assert totals == {"total": REQUESTS, "ok": REQUESTS, "failed": 0}, table
        cloud_name, internal_name = cloud["metadata"]["name"], internal["metadata"]["name"]
        assert set(by_replica) == {cloud_name, internal_name}, table
        # each server counted its own share, and it is what the client saw
        assert cloud_server.counters.traffic == by_replica[cloud_name] > 0, table
        assert served_inside == by_replica[internal_name] > 0, table

        # without the provider's endpoint the cloud replica gets nothing: the provider is
        # stopped and its slice deleted; kube-proxy drops the rule, the client reaches only
        # the internal replica (and still fails nothing)
        provider.stop()
        slices = await kube.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            params={"labelSelector": f"kubernetes.io/service-name={app},"
                                     "endpointslice.kubernetes.io/managed-by=vkprovider.io"})
        assert slices["items"], "the provider wrote the cloud replica's slice"
        for item in slices["items"]:
            await kube.delete(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/"
                              f"endpointslices/{item['metadata']['name']}")
        await rules_with(real_node.netns, f"{public_ip}:{public_port}", present=False)
        before = cloud_server.counters.traffic
        totals, by_replica = await asyncio.to_thread(run_client, local_cluster, namespace,
                                                     client, cluster_ip)
        assert totals["failed"] == 0 and dict(by_replica) == {internal_name: REQUESTS}, (
            totals, by_replica)
        assert cloud_server.counters.traffic == before
    finally:
        if space is not None:
            await space.stop()
        system.stop()
        for path in (f"/apis/apps/v1/namespaces/{namespace}/deployments/{app}",
                     f"/api/v1/nodes/{system.node_name}"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)
        await kube.patch(status, {"status": {"capacity": {GPU: None},
                                             "allocatable": {GPU: None}}})


"""A real node: a container really runs, ``kubectl logs``/``exec`` reach it, a Service routes to it.

The node (:class:`vkprovider.testing.realnode.RealNode`) is the real kubelet and kube-proxy of
the control plane's version over containerd, runc and the bridge CNI plugin, in a network
namespace with no route off the machine. Images are built offline from Debian's static busybox;
the kubectl is the real one of the control plane's version. Nothing here is faked: a missing
piece is installed (tools/node/install-deps.sh, build.sh) or the test fails.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import uuid
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.realnode import (
    BUSYBOX_IMAGE,
    KUBELET_TUNABLES,
    POD_CIDR,
    TOLERATION,
    RealNode,
    find_kubectl,
    read_tunables,
)
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster


def busybox_pod(node: RealNode, name: str, script: str, *,
                labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", script]}],
        },
    }


async def running(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    def up(pod: dict[str, Any]) -> bool:
        status = pod.get("status") or {}
        return status.get("phase") == "Running" and bool(status.get("podIP"))

    return await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}"),
                            until=up, timeout=90, what=f"pod {name} Running with an IP")


def kubectl(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.run([str(find_kubectl()), *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def nat_rules(netns: str | None) -> str:
    """iptables-save of the nat table, in ``netns`` or (None) the host's."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, "iptables-save", "-t", "nat"], capture_output=True,
                          text=True, check=True).stdout


async def test_a_pod_runs_on_the_real_node_and_kubectl_reads_its_logs_and_execs_into_it(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    name = f"hello-{uuid.uuid4().hex[:6]}"
    await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                      busybox_pod(real_node, name,
                                  'echo "hello from $(hostname) as $(id -u)"; exec sleep 3600'))
    pod = await running(kube, namespace, name)
    assert pod["spec"]["nodeName"] == real_node.name
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(POD_CIDR)

    async def logs() -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(kubectl, local_cluster, "-n", namespace, "logs", name)

    out = await eventually(logs, until=lambda r: r.returncode == 0 and "hello" in r.stdout,
                           timeout=30, what="kubectl logs")
    assert out.stdout.strip() == f"hello from {name} as 0", out

    ran = await asyncio.to_thread(kubectl, local_cluster, "-n", namespace, "exec", name, "--",
                                  "sh", "-c", "echo $((6 * 7)) > /tmp/answer; cat /tmp/answer")
    assert ran.returncode == 0 and ran.stdout.strip() == "42", ran
    # the container's own filesystem and process tree, not the host's
    ps = await asyncio.to_thread(kubectl, local_cluster, "-n", namespace, "exec", name, "--",
                                 "ps", "-o", "pid,args")
    assert ps.returncode == 0 and "sleep 3600" in ps.stdout, ps
    assert "kubelet" not in ps.stdout and "containerd" not in ps.stdout, ps.stdout


async def test_a_service_routes_a_pods_request_to_another_pod_through_kube_proxy(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    app = f"web-{uuid.uuid4().hex[:6]}"
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", busybox_pod(
        real_node, app,
        'mkdir -p /www && echo "served by $(hostname)" > /www/index.html && '
        "exec httpd -f -p 8080 -h /www", labels={"app": app}))
    await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                      busybox_pod(real_node, "client", "exec sleep 3600"))
    service = await kube.create(f"/api/v1/namespaces/{namespace}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": app},
        "spec": {"selector": {"app": app},
                 "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
    cluster_ip = service["spec"]["clusterIP"]
    await running(kube, namespace, app)
    await running(kube, namespace, "client")

    async def fetch() -> subprocess.CompletedProcess[str]:
        # an HTTP/1.0 GET by hand: Debian's static busybox wget crashes on this kernel
        return await asyncio.to_thread(
            kubectl, local_cluster, "-n", namespace, "exec", "client", "--", "sh", "-c",
            f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {cluster_ip} 80")

    got = await eventually(fetch, until=lambda r: "200 OK" in r.stdout, timeout=60,
                           interval=1, what=f"GET http://{cluster_ip}/ from the client pod")
    assert got.stdout.splitlines()[-1].strip() == f"served by {app}", got
    # the ClusterIP exists only as kube-proxy's rules inside the node's namespace
    rules = await asyncio.to_thread(nat_rules, real_node.netns)
    assert cluster_ip in rules
    assert cluster_ip not in await asyncio.to_thread(nat_rules, None)


def test_the_node_network_has_no_route_off_the_machine(real_node: RealNode) -> None:
    """Only the pod bridge and the /30 link to the host are routed in the node's namespace."""
    routes = subprocess.run(["ip", "-n", real_node.netns, "-4", "route", "show", "table", "all"],
                            capture_output=True, text=True, check=True).stdout
    assert routes.strip(), "the namespace has routes (its link and the pod bridge)"
    assert "default" not in routes, routes
    for line in routes.splitlines():
        dest = line.split()[0]
        if dest in ("local", "broadcast"):
            continue
        net = ipaddress.ip_network(dest, strict=False)
        assert net.subnet_of(ipaddress.ip_network(POD_CIDR)) or (
            real_node.link is not None and net.subnet_of(real_node.link)), line
    # and what pods send towards the host's side of the link is dropped, not forwarded
    forward = subprocess.run(["ip", "netns", "exec", real_node.netns, "iptables", "-S", "FORWARD"],
                             capture_output=True, text=True, check=True).stdout
    assert "-A FORWARD -o eth0 -j DROP" in forward.splitlines(), forward


def test_the_node_leaves_the_hosts_kernel_tunables_alone(real_node: RealNode) -> None:
    """The kubelet sets vm.overcommit_memory, kernel.panic, kernel.panic_on_oops... for the whole
    machine unless they already read as it wants; in the node's mount namespace they do, so the
    shared host keeps its own."""
    assert real_node.host_tunables, "read before the kubelet started"
    assert read_tunables() == real_node.host_tunables
    for entry in real_node.host_tunables:  # inside, what the kubelet wants
        inside = subprocess.run(["nsenter", f"--mount={real_node.mount_ns}", "--", "cat",
                                 f"/proc/sys/{entry}"], capture_output=True, text=True,
                                check=True).stdout.strip()
        assert inside == str(KUBELET_TUNABLES[entry]), entry

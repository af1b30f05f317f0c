"""``kubectl port-forward`` to a cloud pod, with the real kubectl through the real API server.

kubectl (v1.37, built from its module) speaks WebSocket to the API server, which translates to
SPDY/3.1 towards the virtual node's kubelet API (the node does not declare
``ExtendWebSocketsToKubelet``); the provider dials the port the mock cloud published for the
pod's declared container port, through the lab's address map, to the mock's model server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import RECHECK_SECONDS, Route, publish_routes
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.realnode import find_kubectl
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, node_ready, pod_spec

pytestmark = pytest.mark.cluster

_FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")


class PortForward:
    """One ``kubectl port-forward`` process: its local port and everything it printed."""

    def __init__(self, proc: asyncio.subprocess.Process, local_port: int) -> None:
        self.proc = proc
        self.local_port = local_port
        self.output: list[str] = []

    async def read_rest(self, *, timeout: float) -> str:
        """What kubectl prints until it exits or ``timeout`` passes (then it is stopped)."""
        assert self.proc.stdout is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                async for raw in self.proc.stdout:
                    self.output.append(raw.decode(errors="replace"))
        return "".join(self.output)


@contextlib.asynccontextmanager
async def port_forward(cluster: LocalCluster, ns: str, pod: str, remote: int
                       ) -> AsyncIterator[PortForward]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    proc = await asyncio.create_subprocess_exec(
        str(find_kubectl()), "port-forward", "-n", ns, f"pod/{pod}", f":{remote}",
        "--address", "127.0.0.1", "-v", "4",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(30):
            while True:
                raw = await proc.stdout.readline()
                if not raw:
                    raise AssertionError("kubectl port-forward ended: " + "".join(lines))
                lines.append(raw.decode(errors="replace"))
                found = _FORWARDING.search(lines[-1])
                if found:
                    assert int(found.group(2)) == remote
                    break
        forward = PortForward(proc, int(found.group(1)))
        forward.output.extend(lines)
        yield forward
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def cloud_pod(kube: KubeClient, system: System, ns: str, name: str) -> dict[str, Any]:
    spec = pod_spec(system.node_name, container={
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1}})
    await create_pod(kube, ns, name, spec)

    def ready(pod: dict[str, Any]) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (pod.get("status") or {}).get("conditions") or [])

    return await eventually(lambda: kube.get(f"/api/v1/namespaces/{ns}/pods/{name}"),
                            until=ready, timeout=90, what=f"pod {name} Ready")


@contextlib.asynccontextmanager
async def big_answer_server(cluster: LocalCluster, pod: dict[str, Any], size: int
                            ) -> AsyncIterator[bytes]:
    """Routes the pod's published port 8000 to a loopback server answering ``size`` bytes (an
    address-map file of its own, read after the mock cloud's: the lab's DNAT, redirected)."""
    ports = pod["metadata"]["annotations"]["vkprovider.io/ports"]
    address = next(entry.split("=", 1)[1] for entry in ports.split(",")
                   if entry.startswith("8000/TCP="))
    host, _, port = address.rpartition(":")
    body = bytes(range(256)) * (size // 256)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                     % len(body) + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    real = server.sockets[0].getsockname()[1]
    owner = "zz-port-forward-e2e"
    publish_routes(directory=cluster.address_map_dir, owner=owner,
                   routes=[Route(host=host, port=int(port), to_host="127.0.0.1", to_port=real)])
    # the provider's map is seen by its first dial RECHECK_SECONDS after the change: a dial
    # sooner (the request just before) may still go to the mock cloud's server
    await asyncio.sleep(4 * RECHECK_SECONDS)
    try:
        yield body
    finally:
        (cluster.address_map_dir / f"{owner}.json").unlink(missing_ok=True)
        server.close()


def _first_difference(got: bytes, want: bytes) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
              min(len(got), len(want)))
    return (f"{len(got)} bytes, not {len(want)}; first difference at byte {at}: "
            f"{got[max(0, at - 16):at + 48]!r}; the start: {got[:200]!r}")


async def test_kubectl_port_forward_reaches_the_model_server_of_a_cloud_pod(
    kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    pod = await cloud_pod(kube, system, namespace, "served")

    async with port_forward(local_cluster, namespace, "served", 8000) as forward, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{forward.local_port}",
                              timeout=20) as http:
        # two requests on one connection, then one on a fresh connection (a new stream pair)
        first = await http.get("/v1/models")
        second = await http.get("/v1/completions")
        async with httpx.AsyncClient(timeout=20) as other:
            third = await other.get(f"http://127.0.0.1:{forward.local_port}/again")
        for resp in (first, second, third):
            assert resp.status_code == 200, resp.text
            body = json.loads(resp.text)
            assert body["pod"] == "served" and body["namespace"] == namespace
            assert body["container_port"] == 8000
            assert body["name"] == f"{system.node_name}-{pod['metadata']['uid']}"
        # the model server closes first ("Connection: close"): the forward ends cleanly, the
        # local connection sees the whole answer then EOF, and kubectl carries on
        reader, writer = await asyncio.open_connection("127.0.0.1", forward.local_port)
        writer.write(b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), timeout=20)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 ") and b'"pod":"served"' in \
            answer.replace(b" ", b""), answer
        again = await http.get("/after")
        assert again.status_code == 200

        # an answer of many SPDY windows (kubectl's SPDY library sends no WINDOW_UPDATE): the
        # lab network now leads the pod's published port to a server with a 3 MiB answer
        async with big_answer_server(local_cluster, pod, 3 * 2**20) as body, \
                httpx.AsyncClient(timeout=60) as fresh:  # a new connection: a new dial
            big = await fresh.get(f"http://127.0.0.1:{forward.local_port}/big")
        assert big.status_code == 200, big.text[:500]
        assert len(big.content) == len(body) and big.content == body, _first_difference(
            big.content, body)
        assert forward.proc.returncode is None, "kubectl port-forward stays up"

    assert system.provider is not None
    metrics = await system.provider.metrics()
    counted = [line for line in metrics.splitlines()
               if line.startswith("vkprovider_kubelet_api_requests_total")]
    assert any('endpoint="portForward"' in line and 'code="101"' in line
               for line in counted), counted


async def test_kubectl_port_forward_to_an_undeclared_port_is_refused_by_name(
    kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    await cloud_pod(kube, system, namespace, "narrow")

    async with port_forward(local_cluster, namespace, "narrow", 9999) as forward:
        reader, writer = await asyncio.open_connection("127.0.0.1", forward.local_port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        # kubectl closes the local connection once the kubelet refuses the stream: with a FIN
        # (EOF) or, when the request bytes are still unread on its side, a RST; either way
        # nothing answers
        try:
            answer = await asyncio.wait_for(reader.read(), timeout=20)
        except ConnectionResetError:
            answer = b""
        writer.close()
        assert answer == b"", "nothing answers on an undeclared port"
        output = await forward.read_rest(timeout=20)
    assert (f"port 9999 is not a declared TCP container port of pod {namespace}/narrow "
            "(declared: 8000/TCP (http))") in output, output

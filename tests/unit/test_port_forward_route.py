"""``/portForward`` over the kubelet API's real TLS server: the upgrade's refusals (401, 403, 404,
400, 403 on the protocol), then the SPDY session reaching a pod's published port through an
address map, as the API server drives it. No control plane: a CA from vkprovider.testing.pki
plays the cluster CA, as in test_kubelet_api_tls."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_kubelet_api_fakes import FakeCloud, FakeReviewer, FakeView, make_pod
from test_kubelet_api_tls import _issue, _wait_listening
from test_port_forward_session import Client, data_of, echo_until_eof, fin, tcp

from providers.base import InstanceState, PublishedPort
from vkprovider.api.auth import KubeletAuth
from vkprovider.api.gpu import GPUCollector
from vkprovider.api.kubelet import create_kubelet_app
from vkprovider.api.portforward import PortRefused, PublishedDial, spdy
from vkprovider.api.server import bind, serve
from vkprovider.api.tls import server_context
from vkprovider.config import KubeletAPISettings
from vkprovider.metrics import Metrics
from vkprovider.probing.dialing import AddressMap, Route, publish_routes
from vkprovider.testing.pki import CertificateAuthority

UPGRADE = ("Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
           "X-Stream-Protocol-Version: portforward.k8s.io\r\n")


@dataclasses.dataclass
class Node:
    port: int
    ca: CertificateAuthority
    view: FakeView
    metrics: Metrics
    network: Path

    async def connect(self, *, cert: tuple[Path, Path] | None
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the serving certificate is self-signed
        if cert is not None:
            ctx.load_cert_chain(cert[0], cert[1])
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=ctx)

    async def request(self, path: str, *, cert: tuple[Path, Path] | None,
                      headers: str = UPGRADE, method: str = "POST"
                      ) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self.connect(cert=cert)
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: vk-test\r\n{headers}\r\n".encode())
        async with asyncio.timeout(10):
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        return head, reader, writer

    def apiserver(self) -> tuple[Path, Path]:
        return _issue(self.ca, "kubelet-client", "kube-apiserver-kubelet-client",
                      "system:masters")


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    ca = CertificateAuthority(directory=tmp_path)
    view, cloud, reviewer, metrics = FakeView(), FakeCloud(), FakeReviewer(), Metrics()
    pod = make_pod("a")
    pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    view.add(pod, cloud)
    placed = view.placed["uid-a"]
    view.placed["uid-a"] = dataclasses.replace(placed, instance=dataclasses.replace(
        placed.instance, published=(PublishedPort(container_port=8000, host="198.18.7.7",
                                                  port=30001, kind="ip"),)))
    view.add(make_pod("waiting"))  # bound to the node, no instance yet
    reviewer.allowed.add(("system:masters", "create", "proxy"))
    auth = KubeletAuth(reviewer=reviewer, node_name="vk-test", settings=KubeletAPISettings(),
                       metrics=metrics)
    network = tmp_path / "network"
    app = create_kubelet_app(view=view, auth=auth, metrics=metrics,
                             gpus=GPUCollector(view=view, metrics=metrics),
                             dial=PublishedDial(dialer=AddressMap(network)))
    ctx = server_context(cert_file=None, key_file=None, client_ca_file=str(ca.cert_path),
                         common_name="vk-test", hosts=("vk-test", "127.0.0.1"))
    sock = bind(host="127.0.0.1", port=0)
    port = sock.getsockname()[1]
    task = asyncio.create_task(serve(app=app, sock=sock, name="test", ssl_context=ctx,
                                     upgrades=app.upgrades))
    await _wait_listening(port)
    try:
        yield Node(port=port, ca=ca, view=view, metrics=metrics, network=network)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await app.upgrades.aclose()


async def test_port_forward_is_authorized_like_every_kubelet_path(node: Node) -> None:
    head, _, _ = await node.request("/portForward/team/a", cert=None)
    assert head.startswith("HTTP/1.1 401 ")
    nobody = _issue(node.ca, "nobody", "nobody", None)
    head, reader, _ = await node.request("/portForward/team/a", cert=nobody)
    assert head.startswith("HTTP/1.1 403 ")
    assert "subresource=proxy" in (await reader.read()).decode()


@pytest.mark.parametrize(("path", "headers", "status", "text"), [
    ("/portForward/team/nope", UPGRADE, 404, 'pod "team/nope" does not exist on node vk-test'),
    ("/portForward/team/a/other-uid", UPGRADE, 404, 'pod "team/a" does not exist'),
    ("/portForward/team/waiting", UPGRADE, 400, 'pod "team/waiting" has no cloud instance yet'),
    ("/portForward/team/a", "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n", 400,
     "header X-Stream-Protocol-Version does not exist"),
    ("/portForward/team/a", "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
     "X-Stream-Protocol-Version: channel.k8s.io\r\n", 403, "unable to negotiate protocol"),
])
async def test_bad_upgrades_get_the_kubelets_answers(node: Node, path: str, headers: str,
                                                     status: int, text: str) -> None:
    head, reader, _ = await node.request(path, cert=node.apiserver(), headers=headers)
    assert head.startswith(f"HTTP/1.1 {status} "), head
    assert text in (await reader.read()).decode()
    if status == 403:
        assert "X-Accepted-Stream-Protocol-Versions: portforward.k8s.io" in head


async def test_a_request_that_does_not_upgrade_is_a_400(node: Node) -> None:
    head, reader, _ = await node.request("/portForward/team/a", cert=node.apiserver(),
                                         headers="Content-Length: 0\r\n")
    assert head.startswith("HTTP/1.1 400 ")
    assert b"must upgrade the connection to SPDY/3.1" in await reader.readexactly(70)


async def test_the_upgraded_connection_forwards_to_the_published_address(node: Node) -> None:
    async with tcp(echo_until_eof) as real:
        publish_routes(directory=node.network, owner="cloud", routes=[
            Route(host="198.18.7.7", port=30001, to_host="127.0.0.1", to_port=real)])
        head, reader, writer = await node.request("/portForward/team/a/uid-a",
                                                  cert=node.apiserver())
        assert head.startswith("HTTP/1.1 101 Switching Protocols\r\n")
        assert "Upgrade: SPDY/3.1" in head and "X-Stream-Protocol-Version: portforward.k8s.io" \
            in head
        client = Client(reader, writer)
        client.open_pair(error_id=1, port=8000, request="0")
        client.send(spdy.Data(stream_id=3, data=b"get /", flags=spdy.FLAG_FIN))
        frames = await client.until(fin(1))
        assert data_of(frames, 3) == b"GET /"
        assert data_of(frames, 1) == b""
        client.open_pair(error_id=5, port=8001, request="1")
        frames = await client.until(fin(5))
        assert data_of(frames, 5).decode() == (
            "error forwarding port 8001 to pod team/a: port 8001 is not a declared TCP "
            "container port of pod team/a (declared: 8000/TCP (http))")
        writer.close()
    sample = node.metrics.kubelet_api_requests.labels("portForward", "101")._value.get()
    assert sample == 1


async def test_a_screened_published_address_is_never_dialled(node: Node) -> None:
    placed = node.view.placed["uid-a"]
    node.view.placed["uid-a"] = dataclasses.replace(placed, instance=dataclasses.replace(
        placed.instance, published=(PublishedPort(container_port=8000, host="169.254.169.254",
                                                  port=80, kind="ip"),)))
    head, reader, writer = await node.request("/portForward/team/a", cert=node.apiserver())
    assert head.startswith("HTTP/1.1 101 ")
    client = Client(reader, writer)
    client.open_pair(error_id=1, port=8000, request="0")
    frames = await client.until(fin(1))
    assert data_of(frames, 1).decode() == (
        "error forwarding port 8000 to pod team/a: cannot reach port 8000 of pod team/a: "
        "169.254.169.254:80 refused: a cloud metadata service address")
    writer.close()


@pytest.mark.parametrize(("published", "state", "reason"), [
    ((PublishedPort(container_port=8000, host="abc-8000.proxy.example.com", port=443,
                    kind="hostname", scheme="https"),), InstanceState.RUNNING,
     "provider mock publishes port 8000 of pod team/a only behind its TLS proxy "
     "(abc-8000.proxy.example.com:443); forwarding to it needs the traffic gateway (gateway: "
     "in the provider's settings, docs/traffic.md), which is not set up"),
    ((PublishedPort(container_port=9000, host="198.18.7.7", port=30001, kind="ip"),),
     InstanceState.RUNNING, "provider mock publishes no address for port 8000 of pod team/a"),
    ((PublishedPort(container_port=8000, host="198.18.7.7", port=30001, kind="ip"),),
     InstanceState.PENDING, "instance i-uid-a on provider mock is pending, not running"),
    ((PublishedPort(container_port=8000, host="198.18.7.7", port=30001, kind="ip"),),
     InstanceState.RUNNING, "cannot reach port 8000 of pod team/a: 198.18.7.7:30001: no route"),
])
async def test_the_published_dial_says_why_it_cannot_connect(
        tmp_path: Path, published: tuple[PublishedPort, ...], state: InstanceState,
        reason: str) -> None:
    view = FakeView()
    view.add(make_pod("a"), FakeCloud(), state=state)
    placed = view.placed["uid-a"]
    placement = dataclasses.replace(placed, instance=dataclasses.replace(
        placed.instance, published=published))
    with pytest.raises(PortRefused) as refused:
        await PublishedDial(dialer=AddressMap(tmp_path))(placement, 8000)  # an empty map
    assert str(refused.value).startswith(reason), str(refused.value)

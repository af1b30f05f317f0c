"""The kubelet API over a real TLS socket: client certificates, streaming, exec refusals.

No control plane: uvicorn serves the app on loopback with the service's own TLS setup, and a CA
from vkprovider.testing.pki plays the cluster CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from test_kubelet_api_fakes import FakeCloud, FakeReviewer, FakeView, make_pod

from vkprovider.api.auth import KubeletAuth
from vkprovider.api.gpu import GPUCollector
from vkprovider.api.kubelet import create_kubelet_app
from vkprovider.api.server import bind, serve
from vkprovider.api.tls import self_signed_certificate, server_context
from vkprovider.config import KubeletAPISettings
from vkprovider.errors import ConfigError
from vkprovider.metrics import Metrics
from vkprovider.testing.pki import CertificateAuthority


class Served:
    def __init__(self, *, port: int, view: FakeView, reviewer: FakeReviewer, cloud: FakeCloud,
                 ca: CertificateAuthority, tmp: Path) -> None:
        self.url = f"https://127.0.0.1:{port}"
        self.view = view
        self.reviewer = reviewer
        self.cloud = cloud
        self.ca = ca
        self.tmp = tmp

    def client(self, *, cert: tuple[Path, Path] | None = None, **kwargs: Any
               ) -> httpx.AsyncClient:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the serving cert is self-signed
        if cert is not None:
            ctx.load_cert_chain(cert[0], cert[1])
        return httpx.AsyncClient(base_url=self.url, verify=ctx, timeout=10, **kwargs)


async def _wait_listening(port: int) -> None:
    for _ in range(100):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise AssertionError("server did not listen")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    ca = CertificateAuthority(directory=tmp_path)
    view, cloud, reviewer, metrics = FakeView(), FakeCloud(), FakeReviewer(), Metrics()
    view.add(make_pod("a"), cloud)
    reviewer.allowed.add(("system:masters", "get", "proxy"))
    reviewer.allowed.add(("system:masters", "create", "proxy"))
    auth = KubeletAuth(reviewer=reviewer, node_name="vk-test", settings=KubeletAPISettings(),
                       metrics=metrics)
    app = create_kubelet_app(view=view, auth=auth, metrics=metrics,
                             gpus=GPUCollector(view=view, metrics=metrics))
    ctx = server_context(cert_file=None, key_file=None, client_ca_file=str(ca.cert_path),
                         common_name="vk-test", hosts=("vk-test", "127.0.0.1"))
    sock = bind(host="127.0.0.1", port=0)
    port = sock.getsockname()[1]
    task = asyncio.create_task(serve(app=app, sock=sock, name="test", ssl_context=ctx))
    await _wait_listening(port)
    try:
        yield Served(port=port, view=view, reviewer=reviewer, cloud=cloud, ca=ca, tmp=tmp_path)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _issue(ca: CertificateAuthority, stem: str, cn: str, org: str | None, *,
           client: bool = True, server: bool = False) -> tuple[Path, Path]:
    pair = ca.issue(stem=stem, common_name=cn, organization=org, client=client, server=server)
    return pair.cert, pair.key


async def test_ca_signed_client_cert_authenticates_as_cn_and_o(served: Served) -> None:
    cert = _issue(served.ca, "kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
    async with served.client(cert=cert) as http:
        resp = await http.get("/containerLogs/team/a/main", params={"tailLines": "1"})
    assert resp.status_code == 200
    assert resp.text == "line 4\n"
    (user, attrs), = served.reviewer.access_calls
    assert user.name == "kube-apiserver-kubelet-client"
    assert user.groups == ("system:masters",)
    assert (attrs.verb, attrs.subresource, attrs.name) == ("get", "proxy", "vk-test")
    assert served.reviewer.token_calls == 0


async def test_no_credentials_is_401_and_cert_without_rbac_is_403(served: Served) -> None:
    async with served.client() as http:
        assert (await http.get("/pods")).status_code == 401
        assert (await http.get("/healthz")).status_code == 200
    cert = _issue(served.ca, "nobody", "nobody", None)
    async with served.client(cert=cert) as http:
        resp = await http.get("/pods")
    assert resp.status_code == 403
    assert "user=nobody" in resp.text


async def test_cert_of_another_ca_never_gets_in(served: Served, tmp_path: Path) -> None:
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = CertificateAuthority(directory=other_dir, name="someone-else")
    cert = _issue(other, "forged", "kube-apiserver-kubelet-client", "system:masters")
    async with served.client(cert=cert) as http:
        with pytest.raises(httpx.TransportError):
            await http.get("/pods")
    assert served.reviewer.access_calls == []


async def test_follow_streams_lines_and_closing_ends_the_cloud_stream(served: Served) -> None:
    cert = _issue(served.ca, "kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
    lines: list[str] = []
    async with served.client(cert=cert) as http, http.stream(
        "GET", "/containerLogs/team/a/main", params={"follow": "true"}
    ) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            lines.append(line)
            if len(lines) >= 7:
                break
    assert lines[:5] == [f"line {i}" for i in range(5)]
    assert lines[5:] == ["heartbeat", "heartbeat"]
    for _ in range(100):
        if served.cloud.closed:
            break
        await asyncio.sleep(0.05)
    assert served.cloud.closed == 1


async def test_exec_upgrade_requests_get_501_not_a_hang(served: Served) -> None:
    cert = _issue(served.ca, "kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
    async with served.client(cert=cert) as http:
        for headers in ({"Connection": "Upgrade", "Upgrade": "SPDY/3.1"},
                        {"Connection": "Upgrade", "Upgrade": "websocket",
                         "Sec-WebSocket-Version": "13",
                         "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}):
            resp = await asyncio.wait_for(
                http.post("/exec/team/a/main", params={"command": "sh"}, headers=headers), 5)
            assert resp.status_code == 501
            assert resp.text.startswith("exec is not supported by provider mock")


def test_configured_serving_cert_is_used(tmp_path: Path) -> None:
    ca = CertificateAuthority(directory=tmp_path)
    cert, key = _issue(ca, "serving", "vk-served", None, client=False, server=True)
    ctx = server_context(cert_file=str(cert), key_file=str(key), client_ca_file=None,
                         common_name="ignored", hosts=())
    assert ctx.verify_mode == ssl.CERT_NONE
    with pytest.raises(ConfigError, match="must be given together"):
        server_context(cert_file=str(cert), key_file=None, client_ca_file=None,
                       common_name="x", hosts=())
    with pytest.raises(ConfigError, match="client_ca_file"):
        server_context(cert_file=None, key_file=None, client_ca_file=str(tmp_path / "none"),
                       common_name="x", hosts=())


def test_self_signed_cert_names_the_node_and_its_ip() -> None:
    cert_pem, key_pem = self_signed_certificate(common_name="vk-gpu-burst",
                                                hosts=("vk-gpu-burst", "10.1.2.3", "10.1.2.3"))
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "vk-gpu-burst"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["vk-gpu-burst"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    assert b"PRIVATE KEY" in key_pem


def test_a_taken_port_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind(host="127.0.0.1", port=port)

"""The mock cloud's hostname-only mode (providers/mock/edge.py): an HTTPS edge per port, by name.

Why it exists: the traffic gateway is tested against this mode, so it must behave as SaladCloud's
access domain or RunPod's proxy does: the adapter sees only a hostname on 443 (no IP mapping),
the edge's certificate verifies for that name against the test CA, and with edge auth a request
without the cloud's key is refused (401) before the container counts it. Real sockets on
loopback, reached through the address map.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.base import InstanceSpec, Port
from providers.mock.edge import EdgeSettings
from vkprovider.probing.dialing import AddressMap
from vkprovider.testing.mockcloud import start_mock_cloud
from vkprovider.testing.pki import CertificateAuthority
from vkprovider.testing.waiting import eventually

KEY = "mock-edge-unit-key"


async def test_an_instance_is_published_only_as_an_https_edge_that_wants_the_key(
        tmp_path: Path) -> None:
    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="unit-edge-ca")
    pair = ca.issue(stem="edge", common_name="*.edge.unit.test", server=True,
                    hosts=("*.edge.unit.test",))
    edge = EdgeSettings(domain="edge.unit.test", cert_file=pair.cert, key_file=pair.key,
                        auth_header="Salad-Api-Key", api_key=KEY)
    async with start_mock_cloud(boot_delay=0.0, api_key=KEY, edge=edge, name="e1",
                                address_map_dir=tmp_path / "map") as cloud:
        provider = cloud.provider(api_key=KEY)
        created = await provider.create(InstanceSpec(
            name="vk-e", image="vllm/vllm-openai", gpu_count=1, gpu_type="L4",
            ports=(Port(container_port=8000),)))
        inst = await eventually(lambda: provider.get(created.id),
                                until=lambda i: bool(i.published), timeout=10,
                                what="the instance published")
        [published] = inst.published
        host = f"{created.id.lower()}-8000.edge.unit.test"
        assert (published.host, published.port, published.kind, published.scheme,
                published.edge_auth) == (host, 443, "hostname", "https", "Salad-Api-Key")

        lab = AddressMap(tmp_path / "map")
        to_host, to_port = await eventually(
            lambda: _resolve(lab, host), until=lambda r: r is not None, timeout=10,
            what="the edge's route in the address map")
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        async with httpx.AsyncClient(verify=context, trust_env=False, timeout=5) as http:
            async def ask(**headers: str) -> httpx.Response:
                return await http.get(f"https://{to_host}:{to_port}/v1/models",
                                      headers={"Host": host, **headers},
                                      extensions={"sni_hostname": host})
            assert (await ask()).status_code == 401
            assert (await ask(**{"Salad-Api-Key": "wrong"})).status_code == 401
            answer = await ask(**{"Salad-Api-Key": KEY})
            assert answer.status_code == 200, answer.text
            assert answer.json()["instance"] == created.id
        async with httpx.AsyncClient(base_url=cloud.url, trust_env=False) as admin:
            traffic = (await admin.get("/admin/traffic",
                                       headers={"Authorization": f"Bearer {KEY}"})).json()
        assert traffic[created.id]["traffic"] == 1, "the 401s never reached the container"
        # a name the certificate does not carry fails verification (a fresh connection)
        async with httpx.AsyncClient(verify=context, trust_env=False, timeout=5) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"https://{to_host}:{to_port}/v1/models",
                               extensions={"sni_hostname": "other.example.org"})


async def _resolve(lab: AddressMap, host: str) -> tuple[str, int] | None:
    try:
        return lab.resolve(host, 443)
    except Exception:
        return None


def test_edge_settings_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="domain"):
        EdgeSettings(domain="not a domain", cert_file=Path("c"), key_file=Path("k"))
    with pytest.raises(ValueError, match="API key"):
        EdgeSettings(domain="edge.test", cert_file=Path("c"), key_file=Path("k"),
                     auth_header="Salad-Api-Key")
    assert KEY not in repr(EdgeSettings(domain="edge.test", cert_file=Path("c"),
                                        key_file=Path("k"), auth_header="X-Key", api_key=KEY))


async def test_probes_of_an_authenticated_edge_carry_the_clouds_key(tmp_path: Path) -> None:
    import time

    from vkprovider.probing.prober import Prober
    from vkprovider.probing.spec import ContainerProbes, Probe

    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="unit-edge-ca")
    pair = ca.issue(stem="edge", common_name="*.edge.unit.test", server=True,
                    hosts=("*.edge.unit.test",))
    edge = EdgeSettings(domain="edge.unit.test", cert_file=pair.cert, key_file=pair.key,
                        auth_header="Salad-Api-Key", api_key=KEY)
    async with start_mock_cloud(boot_delay=0.0, api_key=KEY, edge=edge, name="e2",
                                address_map_dir=tmp_path / "map") as cloud:
        provider = cloud.provider(api_key=KEY)
        created = await provider.create(InstanceSpec(
            name="vk-p", image="vllm/vllm-openai", gpu_count=1, gpu_type="L4",
            ports=(Port(container_port=8000),)))
        host = f"{created.id.lower()}-8000.edge.unit.test"
        lab = AddressMap(tmp_path / "map")
        await eventually(lambda: _resolve(lab, host), until=lambda r: r is not None,
                         timeout=10, what="the edge's route")
        prober = Prober(dialer=lab, edge_key=lambda name: KEY if name == "e2" else None)
        probe = Probe(action="http", port=8000, path="/ready", period=0.05,  # type: ignore[arg-type]
                      timeout=2.0, failure_threshold=1)
        containers = [ContainerProbes(name="c", readiness=probe)]
        prober.track("with-key", containers=containers, running_since=time.monotonic(),
                     target=lambda _p: (host, 443, "https", ("Salad-Api-Key", "e2")))
        prober.track("no-key", containers=containers, running_since=time.monotonic(),
                     target=lambda _p: (host, 443, "https", None))
        try:
            await eventually(lambda: _ready(prober, "with-key"), until=bool, timeout=10,
                             what="the probe with the key passing")
            await eventually(lambda: _message(prober, "no-key"), until=lambda m: "401" in m,
                             timeout=10, what="the probe without the key refused")
            assert not await _ready(prober, "no-key")
            assert KEY not in await _message(prober, "no-key")
        finally:
            await prober.aclose()


async def _ready(prober: Any, key: str) -> bool:
    state = prober.state(key)
    return bool(state and state[0].ready)


async def _message(prober: Any, key: str) -> str:
    state = prober.state(key)
    return str((state[0].message if state else None) or "")


async def test_the_edge_answers_524_when_the_container_has_not_answered_in_time(
        tmp_path: Path) -> None:
    """RunPod's proxy cuts a request that gets no response within its timeout (~100 s) with a
    524: the mock edge does the same at ``timeout_seconds`` (here 0.3 s). An answer that starts
    in time passes; the connection stays usable after the 524; a stream whose headers came at
    once is not cut by the timeout."""
    (tmp_path / "ca").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "ca", name="unit-edge-ca")
    pair = ca.issue(stem="edge", common_name="*.edge.unit.test", server=True,
                    hosts=("*.edge.unit.test",))
    edge = EdgeSettings(domain="edge.unit.test", cert_file=pair.cert, key_file=pair.key,
                        timeout_seconds=0.3)
    async with start_mock_cloud(boot_delay=0.0, api_key=KEY, edge=edge, name="e3",
                                address_map_dir=tmp_path / "map") as cloud:
        provider = cloud.provider(api_key=KEY)
        created = await provider.create(InstanceSpec(
            name="vk-t", image="vllm/vllm-openai", gpu_count=1, gpu_type="L4",
            ports=(Port(container_port=8000),)))
        host = f"{created.id.lower()}-8000.edge.unit.test"
        lab = AddressMap(tmp_path / "map")
        to_host, to_port = await eventually(
            lambda: _resolve(lab, host), until=lambda r: r is not None, timeout=10,
            what="the edge's route in the address map")
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        async with httpx.AsyncClient(verify=context, trust_env=False, timeout=10) as http:
            async def ask(path: str) -> httpx.Response:
                return await http.get(f"https://{to_host}:{to_port}{path}",
                                      headers={"Host": host}, extensions={"sni_hostname": host})
            await eventually(lambda: ask("/ready"), until=lambda r: r.status_code == 200,
                             timeout=10, what="the container ready")
            late = await ask("/slow?seconds=5")
            assert late.status_code == 524, late.text
            assert late.json()["timeout_seconds"] == 0.3
            in_time = await ask("/slow?seconds=0.05")  # same connection, after the 524
            assert in_time.status_code == 200, in_time.text
            assert in_time.json()["instance"] == created.id
            stream = await ask("/stream?events=3&every=0.2")  # 0.4 s in all, headers at once
            assert stream.status_code == 200
            assert stream.text.count("data: ") == 3
            assert (await ask("/slow?seconds=nan")).status_code == 400


def test_edge_settings_refuse_a_bad_timeout() -> None:
    assert EdgeSettings(domain="edge.test", cert_file=Path("c"),
                        key_file=Path("k")).timeout_seconds == 100.0  # RunPod's proxy's
    for bad in (0, -1, float("nan"), float("inf"), 3601):
        with pytest.raises(ValueError, match="timeout"):
            EdgeSettings(domain="edge.test", cert_file=Path("c"), key_file=Path("k"),
                         timeout_seconds=bad)


def test_the_mock_clouds_edge_timeout_flag(tmp_path: Path) -> None:
    from vkprovider.cli import _mock_edge, build_parser
    from vkprovider.errors import ConfigError

    def edge(*flags: str) -> Any:
        args = build_parser().parse_args(["mock-cloud", *flags])
        return _mock_edge(args, None)

    pem = ["--edge-cert", str(tmp_path / "c.pem"), "--edge-key", str(tmp_path / "k.pem")]
    assert edge("--edge-domain", "edge.test", *pem).timeout_seconds == 100.0
    assert edge("--edge-domain", "edge.test", *pem, "--edge-timeout", "2.5").timeout_seconds == 2.5
    with pytest.raises(ConfigError, match="--edge-domain"):
        edge("--edge-timeout", "5")
    with pytest.raises(ConfigError, match="timeout"):
        edge("--edge-domain", "edge.test", *pem, "--edge-timeout", "0")


async def _edge_instance(tmp_path: Path, name: str, **settings: Any
                         ) -> tuple[Any, CertificateAuthority, EdgeSettings]:
    (tmp_path / "ca").mkdir(exist_ok=True)
    ca = CertificateAuthority(directory=tmp_path / "ca", name="unit-edge-ca")
    pair = ca.issue(stem="edge", common_name="*.edge.unit.test", server=True,
                    hosts=("*.edge.unit.test",))
    edge = EdgeSettings(domain="edge.unit.test", cert_file=pair.cert, key_file=pair.key,
                        auth_header="Salad-Api-Key", api_key=KEY, **settings)
    return start_mock_cloud(boot_delay=0.0, api_key=KEY, edge=edge, name=name,
                            address_map_dir=tmp_path / "map"), ca, edge


async def _one_replica(cloud: Any, tmp_path: Path, name: str) -> tuple[str, str, int]:
    """(instance id, edge host, loopback port) of a new one-port instance, once it serves."""
    provider = cloud.provider(api_key=KEY)
    created = await provider.create(InstanceSpec(
        name=name, image="vllm/vllm-openai", gpu_count=1, gpu_type="L4",
        ports=(Port(container_port=8000),)))
    host = f"{created.id.lower()}-8000.edge.unit.test"
    to_host, to_port = await eventually(
        lambda: _resolve(AddressMap(tmp_path / "map"), host), until=lambda r: r is not None,
        timeout=10, what="the edge's route in the address map")
    assert to_host == "127.0.0.1"
    return created.id, host, to_port


async def _ready_at_edge(ca: CertificateAuthority, host: str, port: int) -> None:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    async with httpx.AsyncClient(verify=context, trust_env=False, timeout=10) as http:
        await eventually(
            lambda: http.get(f"https://127.0.0.1:{port}/ready",
                             headers={"Host": host, "Salad-Api-Key": KEY},
                             extensions={"sni_hostname": host}),
            until=lambda r: r.status_code == 200, timeout=10, what="the container ready")


async def _traffic(cloud: Any, instance: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=cloud.url, trust_env=False) as admin:
        counts = (await admin.get("/admin/traffic",
                                  headers={"Authorization": f"Bearer {KEY}"})).json()
    return dict(counts[instance])


async def test_the_edge_speaks_http2_by_alpn_with_the_same_answers_and_exact_counts(
        tmp_path: Path) -> None:
    """A real edge offers h2 by ALPN, and so the gateway's traffic to it is HTTP/2: the same
    JSON answers, the 401 without the key (never counted), SSE streams, the 524 at the edge's
    timeout; and every request counted once, as traffic or probe, on one multiplexed
    connection."""
    started, ca, _ = await _edge_instance(tmp_path, "h2e", timeout_seconds=0.3)
    async with started as cloud:
        instance, host, port = await _one_replica(cloud, tmp_path, "vk-h2")
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        key = {"Salad-Api-Key": KEY}
        async with httpx.AsyncClient(verify=context, trust_env=False, timeout=10,
                                     http1=False, http2=True) as http:
            async def ask(path: str, **headers: str) -> httpx.Response:
                return await http.get(f"https://127.0.0.1:{port}{path}",
                                      headers={"Host": host, **headers},
                                      extensions={"sni_hostname": host})
            await eventually(lambda: ask("/ready", **key), until=lambda r: r.status_code == 200,
                             timeout=10, what="the container ready")
            before = await _traffic(cloud, instance)
            refused = await ask("/v1/models")
            assert (refused.http_version, refused.status_code) == ("HTTP/2", 401)
            answers = await asyncio.gather(*(ask("/v1/models", **key) for _ in range(5)))
            assert {(r.http_version, r.status_code) for r in answers} == {("HTTP/2", 200)}
            assert {r.json()["instance"] for r in answers} == {instance}
            stream = await ask("/stream?events=3&every=0.2", **key)  # 0.4 s, past the timeout
            assert stream.headers["content-type"] == "text/event-stream"
            assert stream.text.count(f"data: {instance} ") == 3
            late = await ask("/slow?seconds=5", **key)
            assert late.status_code == 524, late.text
            assert (await ask("/slow?seconds=0.05", **key)).status_code == 200
            head = await http.head(f"https://127.0.0.1:{port}/v1/models",
                                   headers={"Host": host, **key},
                                   extensions={"sni_hostname": host})
            assert head.status_code == 200 and head.content == b""
            assert (await ask("/healthz", **key)).status_code == 200
        after = await _traffic(cloud, instance)
        # 5 answers, the stream, two slow ones, the HEAD: 9 requests; /healthz a probe;
        # the 401 reached no container
        assert after["traffic"] - before["traffic"] == 9
        assert after["probes"] - before["probes"] == 1


async def test_the_edge_echoes_a_websocket_after_an_http11_upgrade(tmp_path: Path) -> None:
    """WebSocket through a real client library (websocket-client): text and binary echoed,
    a ping answered, a clean close; without the key the upgrade is refused with 401."""
    import websocket

    started, ca, _ = await _edge_instance(tmp_path, "wse")
    async with started as cloud:
        instance, host, port = await _one_replica(cloud, tmp_path, "vk-ws")
        await _ready_at_edge(ca, host, port)
        before = await _traffic(cloud, instance)
        ssl_options = {"ca_certs": str(ca.cert_path), "server_hostname": host}

        def talk() -> tuple[Any, ...]:
            ws = websocket.create_connection(
                f"wss://127.0.0.1:{port}/ws", host=host, sslopt=ssl_options, timeout=10,
                header=[f"Salad-Api-Key: {KEY}"])
            try:
                ws.send("hello")
                text = ws.recv()
                ws.send_binary(b"\x00\x01\xff")
                data = ws.recv()
                ws.ping(b"p1")
                pong = ws.recv_data_frame(control_frame=True)
                ws.send_close(websocket.STATUS_NORMAL, b"bye")
                closing = ws.recv_data_frame(control_frame=True)
            finally:
                ws.shutdown()
            return text, data, pong[0], pong[1].data, ws.status, closing[0], closing[1].data[:2]

        def refused() -> int:
            with pytest.raises(websocket.WebSocketBadStatusException) as exc:
                websocket.create_connection(f"wss://127.0.0.1:{port}/ws", host=host,
                                            sslopt=ssl_options, timeout=10)
            return int(exc.value.status_code)

        text, data, opcode, pong, status, closing, code = await asyncio.to_thread(talk)
        assert (closing, code) == (websocket.ABNF.OPCODE_CLOSE, b"\x03\xe8")  # clean, 1000
        assert (text, data) == ("hello", b"\x00\x01\xff")
        assert (opcode, pong) == (websocket.ABNF.OPCODE_PONG, b"p1")
        assert status == 101
        assert await asyncio.to_thread(refused) == 401
        after = await _traffic(cloud, instance)
        assert after["traffic"] - before["traffic"] == 1  # one upgraded request; the 401 none


async def test_the_edge_answers_a_grpc_unary_call_over_http2(tmp_path: Path) -> None:
    """A gRPC unary call (real grpcio, TLS, h2 by ALPN) is echoed with grpc-status 0; without
    the key the edge answers HTTP 401, which gRPC reads as UNAUTHENTICATED."""
    import grpc

    started, ca, _ = await _edge_instance(tmp_path, "grpce")
    async with started as cloud:
        instance, host, port = await _one_replica(cloud, tmp_path, "vk-grpc")
        credentials = grpc.ssl_channel_credentials(ca.cert_path.read_bytes())
        options = (("grpc.ssl_target_name_override", host), ("grpc.default_authority", host))
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                           options=options) as channel:
            call = channel.unary_unary("/lab.Echo/Say")
            await _ready_at_edge(ca, host, port)
            echo = await call(b"hello", metadata=(("salad-api-key", KEY),), timeout=10)
            assert echo == b"hello"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(b"hello", timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert (await _traffic(cloud, instance))["traffic"] >= 1


def test_the_mock_clouds_edge_offers_h2_unless_told_http1_only(tmp_path: Path) -> None:
    from vkprovider.cli import _mock_edge, build_parser
    from vkprovider.errors import ConfigError

    def edge(*flags: str) -> Any:
        return _mock_edge(build_parser().parse_args(["mock-cloud", *flags]), None)

    pem = ["--edge-cert", str(tmp_path / "c.pem"), "--edge-key", str(tmp_path / "k.pem")]
    assert edge("--edge-domain", "edge.test", *pem).http2 is True
    assert edge("--edge-domain", "edge.test", *pem, "--edge-http1-only").http2 is False
    with pytest.raises(ConfigError, match="--edge-domain"):
        edge("--edge-http1-only")

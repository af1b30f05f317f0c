"""``vkprovider dev curl``: a Service on the lab network, reached through the address map.

A fake API (the Service and its EndpointSlices) and a real listener on loopback behind a virtual
address: what kube-proxy and curl would do together, without a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from vkprovider import cli
from vkprovider.devcurl import DevCurlError, Target, address_map_dir, curl_service, parse_target
from vkprovider.errors import ConfigError
from vkprovider.kube.errors import ConnectionFailed, ForbiddenError, NotFoundError
from vkprovider.probing.dialing import Route, publish_routes


class FakeKube:
    def __init__(self, objects: Mapping[str, Any]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, Mapping[str, Any] | None]] = []

    async def get(self, path: str, *, params: Mapping[str, Any] | None = None) -> Any:
        self.calls.append((path, params))
        return self.objects[path]


SERVICE = {"spec": {"ports": [{"name": "web", "port": 80, "targetPort": "http"}]}}


def api(endpoints: list[tuple[str, bool]]) -> FakeKube:
    return FakeKube({
        "/api/v1/namespaces/serving/services/inference": SERVICE,
        "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices": {"items": [{
            "addressType": "IPv4", "ports": [{"name": "web", "port": 8000}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": r}}
                          for a, r in endpoints]}]}})


@contextlib.asynccontextmanager
async def listener() -> AsyncIterator[tuple[int, list[bytes]]]:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        body = b'{"pod": "inference-0"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1]), seen
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("text", "target"), [
    ("serving/inference", Target(namespace="serving", service="inference", port=None, path="/")),
    ("serving/inference/", Target(namespace="serving", service="inference", port=None, path="/")),
    ("dev/llm:web/healthz?x=1", Target(namespace="dev", service="llm", port="web",
                                       path="/healthz?x=1")),
    ("dev/llm:80", Target(namespace="dev", service="llm", port="80", path="/")),
])
def test_targets_parse(text: str, target: Target) -> None:
    assert parse_target(text) == target


@pytest.mark.parametrize("text", ["inference", "Serving/x", "a/b:", "/b/c", "a//b"])
def test_a_bad_target_names_itself(text: str) -> None:
    with pytest.raises(ConfigError, match=r"is not NS/SERVICE\[:PORT\]\[/PATH\]"):
        parse_target(text)


async def test_a_ready_endpoint_answers_through_the_address_map(tmp_path: Path) -> None:
    async with listener() as (port, seen):
        publish_routes(directory=tmp_path, owner="fakekubelet", routes=[
            Route(host="100.64.0.7", port=8000, to_host="127.0.0.1", to_port=port)])
        kube = api([("100.64.0.9", False), ("100.64.0.7", True)])  # the not-ready one: never
        answer = await curl_service(kube=kube,  # type: ignore[arg-type]
                                    target=parse_target("serving/inference/v1/models"),
                                    address_map=tmp_path, choose=lambda eps: eps[0])
    assert (answer.status, answer.endpoint, answer.via) == (200, "100.64.0.7:8000",
                                                            f"127.0.0.1:{port}")
    assert answer.body == '{"pod": "inference-0"}'
    (request,) = seen
    assert request.startswith(b"GET /v1/models HTTP/1.1\r\n")
    assert b"host: 100.64.0.7:8000" in request.lower(), "the Host is the virtual address (DNAT)"
    assert kube.calls[1][1] == {"labelSelector": "kubernetes.io/service-name=inference"}


async def test_no_ready_endpoint_no_route_and_no_such_port_say_so(tmp_path: Path) -> None:
    target = parse_target("serving/inference/")
    with pytest.raises(DevCurlError, match="serving/inference has no ready endpoint"):
        await curl_service(kube=api([("100.64.0.9", False)]),  # type: ignore[arg-type]
                           target=target, address_map=tmp_path)
    with pytest.raises(DevCurlError, match=rf"100.64.0.7:8000: no route .* map {tmp_path}"):
        await curl_service(kube=api([("100.64.0.7", True)]),  # type: ignore[arg-type]
                           target=target, address_map=tmp_path)
    with pytest.raises(DevCurlError, match="has no port 'grpc'"):
        await curl_service(kube=api([("100.64.0.7", True)]),  # type: ignore[arg-type]
                           target=parse_target("serving/inference:grpc/"), address_map=tmp_path)


def test_the_address_map_comes_from_the_flag_else_the_environment(tmp_path: Path) -> None:
    assert address_map_dir(flag=str(tmp_path), env="/nowhere") == tmp_path
    assert address_map_dir(flag=None, env=str(tmp_path)) == tmp_path
    with pytest.raises(ConfigError, match="no address map: pass --address-map DIR or set "
                                          "VKP_ADDRESS_MAP"):
        address_map_dir(flag=None, env=None)
    with pytest.raises(ConfigError, match=r"VKP_ADDRESS_MAP /nowhere: not a directory"):
        address_map_dir(flag=None, env="/nowhere")


@pytest.mark.parametrize(("argv", "words"), [
    (["dev", "curl", "nope"], ["'nope' is not NS/SERVICE"]),
    (["dev", "curl", "a/b"], ["no address map"]),
    (["dev", "curl", "a/b", "--timeout", "0"], ["--timeout", "positive"]),
])
def test_bad_dev_curl_input_is_one_line_exit_2(
        argv: list[str], words: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VKP_ADDRESS_MAP", raising=False)
    with contextlib.suppress(SystemExit):
        assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_an_unreachable_api_server_is_one_line_exit_1(tmp_path: Path) -> None:
    """The real command against a closed port: one line naming the API server, no traceback."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', "
        "insecure-skip-tls-verify: true}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: sekrit-token-value}}]\n")
    (tmp_path / "map").mkdir()
    done = subprocess.run([sys.executable, "-m", "vkprovider", "dev", "curl", "dev/web/",
                           "--kubeconfig", str(kubeconfig), "--address-map",
                           str(tmp_path / "map")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"the API server at https://127.0.0.1:{port} did not answer" in lines[0], lines[0]
    assert "sekrit" not in done.stderr


@pytest.mark.parametrize(("error", "words"), [
    (NotFoundError("GET /api/v1/namespaces/dev/services/wbe: services \"wbe\" not found",
                   status=404), ["no Service wbe in namespace dev"]),
    (ForbiddenError("GET /api/v1/namespaces/dev/services/wbe: forbidden", status=403),
     ["403 Forbidden", "dev/wbe"]),
    (ConnectionFailed("GET /api/v1/namespaces/dev/services/wbe: refused"),
     ["did not answer", "dev up"]),
])
def test_api_errors_read_as_what_went_wrong(error: Exception, words: list[str]) -> None:
    said = cli._api_problem(error, host="https://127.0.0.1:6443", namespace="dev",
                            service="wbe")
    assert "\n" not in said
    for word in words:
        assert word in said, said


def test_dev_up_records_the_address_map_in_its_kubeconfig_for_dev_curl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``dev up --kubeconfig-out``, ``export KUBECONFIG=...`` is all dev curl needs."""
    from vkprovider.devenv import address_map_of, with_address_map

    admin = ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
             "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
             "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
             "users: [{name: u, user: {token: t}}]\n")
    network = tmp_path / "addressmap"
    network.mkdir()
    kubeconfig = tmp_path / "dev.kubeconfig"
    kubeconfig.write_text(with_address_map(admin, address_map=network))
    assert address_map_of(kubeconfig) == str(network)
    assert address_map_of(tmp_path / "missing") is None
    monkeypatch.delenv("VKP_ADDRESS_MAP", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert cli._recorded_address_map(None) == str(network)
    assert cli._recorded_address_map(str(tmp_path / "missing")) is None

"""The fake kubelet's listeners without a cluster: which ports listen, routes published and
withdrawn, readiness patched from the probes, counters written (a stub records the patches)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.probing.dialing import AddressMap, NoRoute
from vkprovider.probing.prober import parse_probes
from vkprovider.probing.transport import DialingTransport
from vkprovider.testing.fakekubelet import (
    FakeKubelet,
    _listening_ports,
    _load_seconds,
    counters_path,
    read_counters,
)


class RecordingKube:
    def __init__(self) -> None:
        self.patches: list[tuple[float, str, dict[str, Any]]] = []

    async def patch(self, path: str, body: Any, *, patch_type: str = "merge") -> dict[str, Any]:
        self.patches.append((time.monotonic(), path, body))
        return {}


def pod(*, readiness: bool = True, load: float = 0.4) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "server", "image": "m:1",
        "ports": [{"name": "http", "containerPort": 8000},
                  {"name": "dns", "containerPort": 53, "protocol": "UDP"}],
        "env": [{"name": "MOCK_LOAD_SECONDS", "value": str(load)}],
        "livenessProbe": {"tcpSocket": {"port": 9000}},
    }
    if readiness:
        container["readinessProbe"] = {"httpGet": {"path": "/ready", "port": "http"},
                                       "periodSeconds": 1}
    return {"metadata": {"name": "web-0", "namespace": "ns", "uid": "u-1"},
            "spec": {"nodeName": "gpu-0", "containers": [container]}}


def test_listening_ports_are_declared_tcp_and_undeclared_probe_ports() -> None:
    p = pod()
    ports = [port for _, port in _listening_ports(p, parse_probes(p))]
    assert ports == [8000, 9000]  # UDP 53 does not listen; the liveness port 9000 does


def test_load_seconds_from_env() -> None:
    assert _load_seconds({"env": [{"name": "MOCK_LOAD_SECONDS", "value": "2.5"}]}) == 2.5
    assert _load_seconds({"env": [{"name": "MOCK_LOAD_SECONDS", "value": "soon"}]}) == 0
    assert _load_seconds({}) == 0


async def test_listeners_routes_readiness_and_counters(tmp_path: Path) -> None:
    amap = tmp_path / "addressmap"
    kube = RecordingKube()
    kubelet = FakeKubelet(kube=cast(KubeClient, kube), address_map_dir=amap)
    assert kubelet.prober is not None
    p = pod()
    replica = await kubelet._serve(p, ip="10.244.0.9", started_at="2026-01-01T00:00:00Z")
    assert replica is not None and sorted(replica.servers) == [8000, 9000]
    writer = asyncio.get_running_loop().create_task(kubelet._write_counters())
    try:
        resolved = AddressMap(amap).resolve("10.244.0.9", 8000)
        assert resolved == ("127.0.0.1", replica.servers[8000].port)
        kubelet.prober.track(replica.uid, containers=replica.probes, target=replica.target,
                             running_since=replica.running_since)
        status = kubelet._probed_status(replica, kubelet.prober.state(replica.uid))
        assert [c["status"] for c in status["conditions"]] == ["False", "False"]
        assert status["containerStatuses"][0]["ready"] is False
        async with httpx.AsyncClient(transport=DialingTransport(dialer=AddressMap(amap))) as h:
            assert (await h.get("http://10.244.0.9:8000/")).status_code == 503
            for _ in range(60):
                await asyncio.sleep(0.05)
                if any(b["status"]["conditions"][0]["status"] == "True"
                       for _, _, b in kube.patches):
                    break
            answer = await h.get("http://10.244.0.9:8000/x")
        assert answer.json()["pod"] == "web-0" and answer.json()["container_port"] == 8000
        became = next(t for t, _, b in kube.patches
                      if b["status"]["conditions"][0]["status"] == "True")
        assert 0.4 <= became - replica.running_since <= 2.5  # not before the model loaded
        assert kube.patches[-1][1] == "/api/v1/namespaces/ns/pods/web-0/status"
        await asyncio.sleep(0.4)
        counters = read_counters(amap)["ns/web-0"]
        assert counters["traffic"] == 2 and counters["probes"] >= 2
        assert counters["closed"] is False
        kubelet._drop(replica.uid)
        with pytest.raises(NoRoute):
            AddressMap(amap, recheck_seconds=0).resolve("10.244.0.9", 8000)
        await asyncio.sleep(0.4)
        assert read_counters(amap)["ns/web-0"]["closed"] is True
        assert counters_path(amap).parent == tmp_path
    finally:
        writer.cancel()
        await kubelet.aclose()
        await kubelet.prober.aclose()


async def test_no_readiness_probe_keeps_ready_when_running(tmp_path: Path) -> None:
    kubelet = FakeKubelet(kube=cast(KubeClient, RecordingKube()), address_map_dir=tmp_path / "m")
    replica = await kubelet._serve(pod(readiness=False), ip="10.244.0.10", started_at="t")
    try:
        assert replica is not None and replica.probes == ()  # not probed: Ready as before
        assert sorted(replica.servers) == [8000, 9000]
    finally:
        await kubelet.aclose()
        assert kubelet.prober is not None
        await kubelet.prober.aclose()

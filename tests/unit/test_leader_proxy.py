"""The black-hole proxy the leader-election e2e test partitions a replica with, and the real
KubeClient behind it: a request over a black-holed link is cut by the elector's deadline.

No cluster: an echo server stands for the API server's TCP side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from vkprovider.kube import KubeClient
from vkprovider.kube.leader import LeaderElector
from vkprovider.testing.proxy import BlackHoleProxy

GUARD = 10.0  # seconds: only so that a broken proxy fails the test instead of hanging it
QUIET = 0.3  # seconds to watch a black-holed link for bytes that must not come


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, host="127.0.0.1", port=0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


@pytest_asyncio.fixture
async def proxy(echo: int) -> AsyncIterator[BlackHoleProxy]:
    async with BlackHoleProxy(target_host="127.0.0.1", target_port=echo) as running:
        yield running


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    return await reader.readexactly(len(data))


async def test_forwards_then_holds_then_delivers(proxy: BlackHoleProxy) -> None:
    async with asyncio.timeout(GUARD):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await _roundtrip(reader, writer, b"ping") == b"ping"

        proxy.black_hole()
        writer.write(b"held")
        await writer.drain()
        with pytest.raises(TimeoutError):  # open, nothing answers, no error either
            async with asyncio.timeout(QUIET):
                await reader.readexactly(4)
        assert not reader.at_eof()

        late_reader, late_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        late_writer.write(b"late")  # accepted, then ignored
        await late_writer.drain()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(QUIET):
                await late_reader.readexactly(4)

        proxy.restore()  # the partition heals: what was held arrives, in order
        assert await reader.readexactly(4) == b"held"
        assert await late_reader.readexactly(4) == b"late"
        assert await _roundtrip(reader, writer, b"pong") == b"pong"
        assert proxy.accepted == 2

        await proxy.stop()
        assert await reader.read() == b""  # stop closes what it held
        for w in (writer, late_writer):
            w.close()


async def test_a_kube_request_over_a_black_hole_is_cut_by_the_deadline(
    proxy: BlackHoleProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The real client (httpx, its retries) hangs on the link; the elector's deadline ends each
    attempt, so the election keeps trying instead of waiting on the first call."""
    caplog.set_level(logging.WARNING, logger="vkprovider.kube.leader")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{proxy.port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    proxy.black_hole()

    def cut_attempts() -> int:
        return sum(1 for r in caplog.records if r.getMessage() == "leader election attempt failed"
                   and "no answer from the API server" in str(getattr(r, "vk_kv", {})))

    async with KubeClient.from_kubeconfig(kubeconfig=str(kubeconfig)) as client:
        elector = LeaderElector(client=client, namespace="ns", name="lease", identity="a",
                                lease_duration=0.6, renew_deadline=0.3, retry_period=0.05)

        async def lead() -> None:
            async with elector.leading():
                pass

        election = asyncio.create_task(lead())
        try:
            async with asyncio.timeout(GUARD):
                while cut_attempts() < 2:
                    await asyncio.sleep(0.05)
        finally:
            election.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await election
    assert proxy.accepted >= 1
    assert not elector.is_leader

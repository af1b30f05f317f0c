"""Streams from the real API server through KubeClient.stream (providers/transport/h1stream.py
under it): a watch's events in order, its failures as our own errors, and an informer that keeps
its store in step through them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vkprovider.kube import KubeClient, codec
from vkprovider.kube.errors import InactivityTimeout, NotFoundError, UnauthorizedError
from vkprovider.kube.watching import Informer, Lines
from vkprovider.testing.cluster import LocalCluster

pytestmark = pytest.mark.cluster

GUARD = 60.0


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"a": "b"}},
            "spec": {"nodeName": "nobody-serves-this", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox:1.36"}]}}


async def test_a_watch_streams_each_change_in_order(kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    listed = await kube.get(path)
    seen: list[tuple[str, str, str]] = []
    names = [f"w{i}" for i in range(20)]

    async def changes() -> None:
        for name in names:
            await kube.create(path, pod(name))
        await kube.patch(f"{path}/w3/status", {"status": {"phase": "Running"}},
                         patch_type="strategic")
        await kube.delete(f"{path}/w5", grace_period_seconds=0)

    # from the list's resourceVersion: the changes made meanwhile all come (the API server
    # sends the answer's head with the first event)
    writer = asyncio.create_task(changes())
    async with asyncio.timeout(GUARD), kube.stream(
        path, params={"watch": True, "resourceVersion": listed["metadata"]["resourceVersion"]},
        read_timeout=30,
    ) as resp:
        assert resp.status_code == 200
        lines = Lines()
        async for chunk in resp.aiter_bytes():
            for line in lines.feed(chunk):
                event = codec.loads(line)
                obj = event["object"]
                seen.append((event["type"], obj["metadata"]["name"],
                             obj.get("status", {}).get("phase", "")))
            if ("DELETED", "w5", "Pending") in seen:
                break
    await writer
    assert [s[:2] for s in seen[:20]] == [("ADDED", n) for n in names]
    assert seen[20][:2] == ("MODIFIED", "w3") and seen[20][2] == "Running"
    assert seen[-1][:2] == ("DELETED", "w5")


async def test_stream_failures_are_our_errors(kube: KubeClient, namespace: str,
                                              local_cluster: LocalCluster) -> None:
    with pytest.raises(NotFoundError, match=r"nope\.example\.com"):
        async with asyncio.timeout(GUARD), kube.stream(
                "/apis/nope.example.com/v1/things", params={"watch": True}):
            pass

    # an empty namespace's watch without bookmarks says nothing: the read deadline passes
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(InactivityTimeout, match=r"no data for 1s"):
        async with asyncio.timeout(GUARD), kube.stream(
            f"/api/v1/namespaces/{namespace}/configmaps",
            params={"watch": True, "fieldSelector": "metadata.name=never-made"}, read_timeout=1,
        ) as resp:
            async for _ in resp.aiter_bytes():
                pass
    assert loop.time() - start >= 1

    # a token nobody issued: 401, the server's reason and what was asked in the error
    path = local_cluster.work_dir / "nobody.kubeconfig"
    local_cluster.write_token_kubeconfig(path=path, token="not-a-token-anyone-issued")
    async with KubeClient.from_kubeconfig(kubeconfig=str(path)) as stranger:
        with pytest.raises(UnauthorizedError, match=f"GET /api/v1/namespaces/{namespace}/pods"):
            async with asyncio.timeout(GUARD), stranger.stream(
                    f"/api/v1/namespaces/{namespace}/pods", params={"watch": True}):
                pass


async def test_an_informer_keeps_its_store_in_step(kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    await kube.create(path, pod("before"))
    events: list[tuple[str, str]] = []
    informer = Informer(client=kube, path=path, name="e2e",
                        handler=lambda kind, obj: events.append(
                            (kind, obj["metadata"]["name"])))
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(GUARD):
            await informer.synced.wait()
            assert set(informer.store) == {f"{namespace}/before"}
            for i in range(50):
                await kube.create(path, pod(f"p{i}"))
            await kube.delete(f"{path}/before", grace_period_seconds=0)
            while len(informer.store) != 50 or ("DELETED", "before") not in events:
                await asyncio.sleep(0.05)
        assert set(informer.store) == {f"{namespace}/p{i}" for i in range(50)}
        assert informer.relists == 1
    finally:
        task.cancel()

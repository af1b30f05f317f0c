"""Smoke test of ``providers.mock.server.serve``: the mock cloud over real HTTP with uvicorn.

Why it exists: everything else talks to the app in process; this proves the served app, the
real httpx transport and the API key work together, and that followed logs really stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from providers.base import InstanceSpec, InstanceState, LogOptions
from providers.mock import MockCloudState, MockProvider, serve


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_serve_answers_over_http() -> None:
    port = _free_port()
    state = MockCloudState(api_key="sk-serve", follow_poll_interval=0.01)
    server = asyncio.create_task(serve(host="127.0.0.1", port=port, state=state))
    provider = MockProvider(
        name="served",
        base_url=f"http://127.0.0.1:{port}",
        owner="vk-node",
        api_key="sk-serve",
        timeout=2.0,
        max_attempts=40,
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    try:
        offers = await provider.capacity()  # retries connection errors while uvicorn starts
        assert {o.gpu_type for o in offers} >= {"H100", "L4"}
        inst = await provider.create(
            InstanceSpec(name="vk-node-u1", image="img", gpu_count=1, gpu_type="L4")
        )
        assert inst.state is InstanceState.RUNNING

        chunks = provider.logs(inst.id, LogOptions(follow=True))
        first = await anext(chunks)
        await chunks.aclose()  # the stream is open-ended; closing it must not hang
        assert first.startswith(b"[mock] pulling image img\n")
        assert state.stats()["logs_calls"] == 1
    finally:
        await provider.aclose()
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server

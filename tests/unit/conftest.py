"""Fixtures shared by unit tests that need a real socket (still no cluster)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import pytest_asyncio


class _Handler(Protocol):
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    """``await serve(handler, tls=None)``: a loopback server running ``handler.serve`` per
    connection; returns its port. Closed after the test."""
    servers: list[asyncio.Server] = []

    async def start(server: _Handler, *, tls: ssl.SSLContext | None = None) -> int:
        running = await asyncio.start_server(server.serve, host="127.0.0.1", port=0, ssl=tls)
        servers.append(running)
        return int(running.sockets[0].getsockname()[1])

    yield start
    for running in servers:
        running.close()

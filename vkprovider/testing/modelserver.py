"""A tiny HTTP server that behaves like a model server loading its weights, for lab replicas.

Why it exists: tests measure the site in requests, so every simulated replica (a pod on a fake
kubelet's node) needs a real listener that answers like an inference server would: ``503`` on
every path but the liveness path while the model loads, ``200`` after. Thousands of them may run
in one process, so this is a few dozen lines of asyncio streams (HTTP/1.1 with keep-alive), not
an ASGI stack. ``providers/`` may not import vkprovider, so the mock cloud keeps its own copy.

Answers:

* ``GET /live`` (``live_path``): ``200`` always (the process is up);
* any other path while loading (``load_seconds`` since start or :meth:`ModelServer.restart`):
  ``503`` with a JSON body ``{"status": "loading", ...identity}``;
* after loading: ``200`` with ``{"status": "ok", "path": ..., ...identity}``.

Counters (:attr:`ModelServer.counters`): a request whose ``User-Agent`` starts with
``kube-probe/`` (what the kubelet and vkprovider's prober send) is a probe; a connection that
closes without any request (a ``tcpSocket`` probe) is a probe too; everything else is traffic.
:attr:`ModelServer.hosts` counts the ``Host`` header of each traffic request: behind a TLS edge
(``start(ssl=...)``, a cloud's HTTPS edge by name), which name the client asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl as _ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelServer", "ServerCounters"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}
_MAX_HEADER_LINES = 100


@dataclass
class ServerCounters:
    """What one listener has answered. ``traffic_5xx`` counts traffic answered with a 5xx."""

    traffic: int = 0
    traffic_5xx: int = 0
    probes: int = 0
    probes_failed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"traffic": self.traffic, "traffic_5xx": self.traffic_5xx,
                "probes": self.probes, "probes_failed": self.probes_failed}


class ModelServer:
    """One container port's app. ``await start()``; ``await close()`` drops open connections."""

    def __init__(self, *, identity: Mapping[str, Any], load_seconds: float = 0.0,
                 host: str = "127.0.0.1", port: int = 0, live_path: str = "/live",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.identity = dict(identity)
        self.load_seconds = max(0.0, load_seconds)
        self.host = host
        self.live_path = live_path
        self.counters = ServerCounters()
        self.hosts: Counter[str] = Counter()  # the Host header of each traffic request
        self._want_port = port
        self._clock = clock
        self._started = clock()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def loaded(self) -> bool:
        return self._clock() - self._started >= self.load_seconds

    def restart(self) -> None:
        """The container restarted: the model loads again from now."""
        self._started = self._clock()

    async def start(self, *, sock: socket.socket | None = None,
                    ssl: _ssl.SSLContext | None = None) -> int:
        """Listen on ``host:port``, or on ``sock`` (bound already: one made inside a network
        namespace, see vkprovider.testing.netspace); with ``ssl``, HTTPS. Returns the port."""
        self._started = self._clock()
        if sock is not None:
            self._server = await asyncio.start_server(self._serve, sock=sock, ssl=ssl)
        else:
            self._server = await asyncio.start_server(self._serve, self.host, self._want_port,
                                                      ssl=ssl)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), timeout=2.0)

    # ---- HTTP --------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        requests = 0
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                requests += 1
                method, path, headers, keep_alive = request
                status, body = self._answer(path)
                probe = headers.get("user-agent", "").startswith("kube-probe/")
                self._count(probe=probe, status=status)
                if not probe:
                    self.hosts[headers.get("host", "")] += 1
                head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
                writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else body))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError):
            pass
        finally:
            if requests == 0:
                self.counters.probes += 1  # a connect and nothing else: a tcpSocket probe
            self._writers.discard(writer)
            writer.close()

    def _count(self, *, probe: bool, status: int) -> None:
        c = self.counters
        if probe:
            c.probes += 1
            c.probes_failed += status >= 400
        else:
            c.traffic += 1
            c.traffic_5xx += status >= 500

    def _answer(self, path: str) -> tuple[int, bytes]:
        bare = path.split("?", 1)[0]
        if bare == self.live_path:
            return 200, _json({"status": "alive", **self.identity})
        if not self.loaded:
            return 503, _json({"status": "loading", **self.identity})
        return 200, _json({"status": "ok", "path": bare, **self.identity})


def _json(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


async def _read_request(reader: asyncio.StreamReader
                        ) -> tuple[str, str, dict[str, str], bool] | None:
    """One request (method, path, lower-cased headers, keep-alive); None at a clean EOF."""
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        raise ValueError("bad request line")
    method, path, version = parts
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADER_LINES):
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length:
        await reader.readexactly(length)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise ValueError("chunked request bodies are not supported")
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
    return method, path, headers, keep_alive

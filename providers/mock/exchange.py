"""What one request to a mock container port gets, whatever protocol carried it.

Why it exists: a container port of the mock cloud is reached over plain HTTP/1.1 (IP mode) or,
behind the hostname-only edge (providers/mock/edge.py), over HTTP/1.1 with WebSocket upgrades or
HTTP/2 by ALPN, as a real edge offers. The answer (the model server's JSON, a long SSE stream, a
late answer or the edge's ``524``, the edge's ``401`` without its key, a WebSocket echo, a gRPC
unary echo) and the counting of probes and traffic must be the same on every protocol, so they
are decided here once, as an :data:`Outcome`, and each protocol's connection only carries it
out: :mod:`providers.mock.listeners` for HTTP/1.1, :mod:`providers.mock.edgeproto` for HTTP/2
and WebSocket.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from providers.base import TAG_NAMESPACE, TAG_POD
from providers.mock.edge import EdgeSettings
from providers.mock.records import Record

__all__ = ["PROBE_PATHS", "WS_PATH", "Gone", "GrpcEcho", "Later", "Outcome", "Reply", "Stream",
           "Upgrade", "answer", "decide"]

#: The paths a probe asks; the rest is traffic.
PROBE_PATHS = frozenset({"/live", "/ready", "/healthz", "/startup"})
#: The WebSocket echo endpoint (HTTP/1.1 upgrade only; the edge speaks no RFC 8441).
WS_PATH = "/ws"
_PROBE_AGENT = b"kube-probe/"
_STREAM_MAX_EVENTS = 600
_SLOW_MAX_SECONDS = 600.0
#: gRPC status codes (grpc/doc/statuscodes.md) the echo may answer with
GRPC_OK, GRPC_INTERNAL = 0, 13
_UNAUTHORIZED = b'{"error": "unauthorized: the edge wants its API key"}'


@dataclass(frozen=True, slots=True)
class Gone:
    """The container is gone: no answer, the connection is cut, as from a dead process."""


@dataclass(frozen=True, slots=True)
class Reply:
    """A JSON answer; ``head``: send its headers (and length) without the body."""

    status: int
    payload: bytes
    head: bool = False


@dataclass(frozen=True, slots=True)
class Stream:
    """Server-Sent Events, ``data: <instance> <i>`` every ``every`` seconds, ``events`` of them."""

    instance: str
    events: int
    every: float


@dataclass(frozen=True, slots=True)
class Later:
    """``reply`` after ``seconds`` (a slow generation, or the edge's 524 at its timeout)."""

    seconds: float
    reply: Reply


@dataclass(frozen=True, slots=True)
class Upgrade:
    """Accept the WebSocket upgrade and echo every message (:data:`WS_PATH`)."""


@dataclass(frozen=True, slots=True)
class GrpcEcho:
    """A gRPC unary echo: the length-prefixed ``body`` back, then ``grpc-status`` trailers."""

    body: bytes
    grpc_status: int = GRPC_OK
    grpc_message: str = ""


Outcome = Gone | Reply | Stream | Later | Upgrade | GrpcEcho


class Port(Protocol):
    """The listener a request came to (providers.mock.listeners.Listener)."""

    record: Record
    run: int
    container_port: int
    closed: bool

    def count(self, *, probe: bool) -> None: ...


def answer(record: Record, *, container_port: int, path: str, now: float) -> tuple[int, Any]:
    """The model server's status and JSON body for ``path`` at ``now``."""
    identity = {
        "instance": record.id,
        "name": record.name,
        "namespace": record.tags.get(TAG_NAMESPACE),
        "pod": record.tags.get(TAG_POD),
        "container_port": container_port,
    }
    if path == "/live":
        return (200 if record.live_ok else 500), {"live": record.live_ok, **identity}
    loaded_at = record.loaded_at()
    if loaded_at is None or now < loaded_at:
        left = 0.0 if loaded_at is None else round(loaded_at - now, 3)
        return 503, {"loading": True, "ready_in_seconds": left, **identity}
    if path == "/startup":
        return 200, {"started": True, **identity}
    if path in ("/ready", "/healthz"):
        return (200 if record.ready_ok else 503), {"ready": record.ready_ok, **identity}
    if not record.ready_ok:
        return 503, {"ready": False, **identity}
    return 200, identity


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes:
    return next((v for k, v in headers if k == name), b"")


def wants_websocket(headers: list[tuple[bytes, bytes]]) -> bool:
    """An HTTP/1.1 request asking to upgrade to WebSocket (RFC 6455 section 4.1)."""
    upgrade = _header(headers, b"upgrade").lower()
    connection = [t.strip() for t in _header(headers, b"connection").lower().split(b",")]
    return upgrade == b"websocket" and b"upgrade" in connection


def grpc_frames_ok(body: bytes) -> bool:
    """True when ``body`` is whole gRPC length-prefixed messages, uncompressed."""
    at = 0
    while at < len(body):
        if len(body) - at < 5 or body[at] != 0:
            return False
        (length,) = struct.unpack_from(">I", body, at + 1)
        at += 5 + length
    return at == len(body) and at > 0


def decide(port: Port, *, now: float, edge: EdgeSettings | None, method: bytes, target: bytes,
           headers: list[tuple[bytes, bytes]], body: bytes = b"", http2: bool = False
           ) -> Outcome:
    """The outcome of one whole request to ``port``; counts it (a probe or traffic) unless the
    container is gone or the edge refused it (it never reached the container)."""
    record = port.record
    record.advance(now=now)
    if port.closed or not record.serving or record.restart_count != port.run:
        return Gone()
    head = method == b"HEAD"
    path_b, _, query = target.partition(b"?")
    path = path_b.decode("ascii", "replace")
    if edge is not None and not edge.allows(headers):
        # refused at the edge, as SaladCloud's gateway does: HTTP 401, for gRPC too (an HTTP
        # proxy, it knows no gRPC; a gRPC client reads 401 as UNAUTHENTICATED)
        return Reply(401, _UNAUTHORIZED, head=head)
    agent = _header(headers, b"user-agent")
    port.count(probe=path in PROBE_PATHS or agent.startswith(_PROBE_AGENT))
    status, identity = answer(record, container_port=port.container_port, path=path, now=now)
    if status == 200 and http2 and method == b"POST" and _header(
            headers, b"content-type").startswith(b"application/grpc"):
        if grpc_frames_ok(body):
            return GrpcEcho(body)
        return GrpcEcho(b"", GRPC_INTERNAL, "the echo wants whole uncompressed messages")
    if status == 200 and path == WS_PATH and method == b"GET" and not http2 and (
            wants_websocket(headers)):
        return Upgrade()
    params = dict(kv.partition(b"=")[::2] for kv in query.split(b"&") if kv)
    if path == "/stream" and status == 200 and method == b"GET":
        try:
            events = max(1, min(_STREAM_MAX_EVENTS, int(params.get(b"events", b"10"))))
            every = max(0.05, min(5.0, float(params.get(b"every", b"1"))))
        except ValueError:
            return Reply(400, b'{"error": "bad stream parameters"}')
        return Stream(record.id, events, every)
    if path == "/slow" and status == 200:
        try:
            seconds = float(params.get(b"seconds", b"1"))
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or not 0 <= seconds <= _SLOW_MAX_SECONDS:
            return Reply(400, b'{"error": "bad slow parameters"}')
        if edge is not None and seconds > edge.timeout_seconds:
            # the edge gives up first (RunPod's proxy, Cloudflare): the container's answer is lost
            late = {"error": "a timeout occurred: the container sent no response in time",
                    "timeout_seconds": edge.timeout_seconds}
            return Later(edge.timeout_seconds, Reply(524, json.dumps(late).encode(), head=head))
        out = {**identity, "waited_seconds": seconds}
        return Later(seconds, Reply(200, json.dumps(out).encode(), head=head))
    return Reply(status, json.dumps(identity).encode(), head=head)

"""Real listeners for the mock cloud's containers: a tiny "model server" per container port.

Why it exists: cloud pods are Ready by their readiness probes, which the provider runs over the
network against the address the cloud publishes for each container port (``public_ip``,
``public_port``), and load tests send traffic there. So while an instance's container runs, each
declared TCP container port has one real HTTP/1.1 server on ``127.0.0.1`` (an ephemeral port).
Nothing ever dials a virtual address (198.18.x.y): the test harness's *address map* plays DNAT,
and this module publishes ``public_ip:public_port -> 127.0.0.1:port`` there when the cloud was
given a map directory (see ``vkprovider.probing.dialing``; ``providers/`` may not import
``vkprovider``, so the same file format is written here by :func:`write_routes`).

Thousands of instances may run in one process, so a listener is a plain asyncio server with an
:mod:`h11` protocol (keep-alive, pipelining), no task per connection and no ASGI stack; behind
the hostname-only edge a connection that negotiated ``h2`` by ALPN is HTTP/2 instead, and a
WebSocket upgrade to ``/ws`` is echoed (:mod:`providers.mock.edgeproto`). Answers are computed
from the instance's record when a request arrives (:mod:`providers.mock.exchange`, the same on
every protocol):

* ``/live``: 200 (500 when the admin ``live`` knob is off), also while loading;
* while loading (``load_seconds`` after this run started): every other path 503
  ``{"loading": true, ...identity}``;
* then ``/ready`` and ``/healthz``: 200 (503 when the admin ``ready`` knob is off);
  ``/startup``: 200; any other path: 200 ``{instance, name, namespace, pod, container_port}``
  (503 when not ready);
* ``/stream?events=N&every=S`` (when ready): a long streamed response as inference servers send
  tokens, Server-Sent Events over chunked encoding, ``data: <instance> <i>`` every ``S``
  seconds (0.05 to 5; ``N`` up to 600), then the end. It ends early only when the container
  goes (the instance deleted: the connection is cut), which is what drain tests look for.
* ``/slow?seconds=S`` (when ready): the identity answer, started only after ``S`` seconds (0 to
  600), as a long non-streamed generation. Behind the hostname-only edge, a request whose answer
  would start later than the edge's timeout gets ``524`` from the edge at the timeout instead
  (:class:`~providers.mock.edge.EdgeSettings`, like RunPod's proxy); the container's late
  answer is dropped.

A request to ``/live``, ``/ready``, ``/healthz`` or ``/startup``, or one whose ``User-Agent``
starts with ``kube-probe/``, or a connection closed without a request (a TCP probe), counts as a
probe; every other request as traffic (:attr:`Record.served <providers.mock.records.Record>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import h11

from providers.mock.edge import EDGE_PORT, EdgeSettings
from providers.mock.edgeproto import H2Session, WebSocketEcho
from providers.mock.exchange import (
    PROBE_PATHS,
    Gone,
    GrpcEcho,
    Later,
    Outcome,
    Reply,
    Stream,
    Upgrade,
    answer,
    decide,
)
from providers.mock.records import Record

__all__ = ["LISTEN_HOST", "PROBE_PATHS", "Listener", "ListenerSet", "answer", "write_routes"]

log = logging.getLogger(__name__)

#: Where the listeners bind: loopback only, always.
LISTEN_HOST = "127.0.0.1"
#: Route files are rewritten at most this often; a burst of changes is written once.
_ROUTES_MIN_INTERVAL = 0.05
#: The ticker checks every listener (not only changed records) once in this many ticks.
_FULL_SYNC_EVERY = 10
_MAX_BODY = 1 << 20
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized",
            500: b"Internal Server Error", 503: b"Service Unavailable",
            524: b"A Timeout Occurred"}


def write_routes(*, directory: Path, owner: str, routes: Iterable[tuple[str, int, str, int]]
                 ) -> None:
    """Replace ``owner``'s routes ``(host, port, to_host, to_port)`` in the address map at
    ``directory``: ``<owner>.json``, written to a temporary file in the same directory and
    renamed over the old one, so that a reader never sees half a file."""
    if not owner or "/" in owner or owner.startswith("."):
        raise ValueError(f"address map owner must be a plain file name, got {owner!r}")
    directory.mkdir(parents=True, exist_ok=True)
    body = {"routes": [{"host": h, "port": p, "to_host": th, "to_port": tp}
                       for h, p, th, tp in routes]}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, directory / f"{owner}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(eq=False, kw_only=True)
class Listener:
    """One real server for one container port of one run of an instance."""

    record: Record
    run: int  # the record's restart_count when it opened
    container_port: int
    public_host: str
    public_port: int
    sock: socket.socket
    port: int
    server: asyncio.AbstractServer | None = None
    closed: bool = False
    connections: set[_Connection] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {
            "instance": self.record.id,
            "public_host": self.public_host,
            "public_port": self.public_port,
            "container_port": self.container_port,
            "host": LISTEN_HOST,
            "port": self.port,
        }

    def close(self) -> None:
        """Stop listening and drop every connection now (the container is gone)."""
        if self.closed:
            return
        self.closed = True
        if self.server is not None:
            self.server.close()
        else:
            self.sock.close()  # never served: the opening task sees ``closed`` and stops
        for conn in list(self.connections):
            conn.abort()

    def count(self, *, probe: bool) -> None:
        served = self.record.served.setdefault(self.container_port, [0, 0])
        served[1 if probe else 0] += 1


class _Connection(asyncio.Protocol):
    """One connection to a listener: HTTP/1.1 (h11, keep-alive, WebSocket upgrades) or, when
    the edge negotiated it by ALPN, HTTP/2 (:class:`~providers.mock.edgeproto.H2Session`);
    every request's answer is :func:`~providers.mock.exchange.decide`'s."""

    def __init__(self, listener: Listener, owner: ListenerSet) -> None:
        self._listener = listener
        self._owner = owner
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self._transport: asyncio.Transport | None = None
        self._request: h11.Request | None = None
        self._body = 0
        self._requests = 0
        self._aborted = False
        self._h2: H2Session | None = None
        self._ws: WebSocketEcho | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; uvloop's TLS transport is not an asyncio.Transport subclass
        self._transport = cast(asyncio.Transport, transport)
        if self._listener.closed:
            self._transport.abort()
            return
        self._listener.connections.add(self)
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() == "h2":
            self._h2 = H2Session(transport=self._transport, decide=self._decide_h2,
                                 gone=self._gone)

    def connection_lost(self, exc: Exception | None) -> None:
        self._listener.connections.discard(self)
        if self._requests == 0 and not self._aborted and not self._listener.closed:
            self._listener.count(probe=True)  # opened and closed: a TCP probe

    def abort(self) -> None:
        self._aborted = True
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._h2 is not None:
            self._h2.data_received(data)
            return
        if self._ws is not None:
            self._ws.data_received(data)
            return
        self._h11.receive_data(data)
        self._process()

    def eof_received(self) -> bool | None:
        if self._ws is not None:
            self._ws.data_received(None)
            return None
        if self._h2 is None:
            self._h11.receive_data(b"")
            self._process()
        return None  # close our side too

    def _decide(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                body: bytes, *, http2: bool) -> Outcome:
        self._requests += 1
        return decide(self._listener, now=self._owner.clock(), edge=self._owner.edge,
                      method=method, target=target, headers=headers, body=body, http2=http2)

    def _decide_h2(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                   body: bytes) -> Outcome:
        return self._decide(method, target, headers, body, http2=True)

    def _gone(self) -> None:
        """The container is gone: no answer, as from a dead process."""
        self.abort()
        self._owner.sync_one(self._listener.record)

    def _process(self) -> None:
        transport = self._transport
        while (transport is not None and not transport.is_closing() and self._ws is None):
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError:
                self._bad_request()
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:
                if (self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE):
                    self._h11.start_next_cycle()
                    continue
                return
            if isinstance(event, h11.Request):
                self._request, self._body = event, 0
            elif isinstance(event, h11.Data):
                self._body += len(event.data)
                if self._body > _MAX_BODY:
                    self._bad_request()
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._respond()
            elif isinstance(event, h11.ConnectionClosed):
                transport.close()
                return

    def _respond(self) -> None:
        request, self._request = self._request, None
        transport = self._transport
        if request is None or transport is None:
            return
        headers = list(request.headers)
        outcome = self._decide(request.method, request.target, headers, b"", http2=False)
        if isinstance(outcome, Gone):
            self._gone()
        elif isinstance(outcome, Reply):
            self._reply(outcome)
        elif isinstance(outcome, Stream):
            self._stream(outcome)
        elif isinstance(outcome, Later):
            self._later(outcome)
        elif isinstance(outcome, Upgrade):
            pending, _ = self._h11.trailing_data  # bytes the client sent after its request
            self._ws = WebSocketEcho(transport=transport, headers=headers,
                                     target=request.target, pending=pending)
        elif isinstance(outcome, GrpcEcho):  # pragma: no cover - decide() says so on h2 only
            self._reply(Reply(400, b'{"error": "gRPC needs HTTP/2"}'))

    def _reply(self, reply: Reply) -> None:
        self._send(reply.status, b"" if reply.head else reply.payload,
                   length=len(reply.payload))

    def _send(self, status: int, payload: bytes, *, length: int) -> None:
        transport = self._transport
        assert transport is not None
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(length).encode())]
        try:
            data = self._h11.send(h11.Response(status_code=status, headers=headers,
                                               reason=_REASONS.get(status, b"")))
            out = [data or b""]
            if payload:
                out.append(self._h11.send(h11.Data(data=payload)) or b"")
            out.append(self._h11.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            transport.abort()
            return
        transport.write(b"".join(out))
        if self._h11.our_state is h11.MUST_CLOSE:
            transport.close()

    def _stream(self, stream: Stream) -> None:
        """SSE over chunked encoding, one event every ``every`` seconds, from the loop's timers
        (no task per stream); stops when the connection goes."""
        transport = self._transport
        assert transport is not None
        try:
            transport.write(self._h11.send(h11.Response(
                status_code=200, reason=b"OK",
                headers=[(b"content-type", b"text/event-stream"),
                         (b"cache-control", b"no-cache")])) or b"")
        except h11.LocalProtocolError:
            transport.abort()
            return
        loop = asyncio.get_running_loop()

        def send(i: int) -> None:
            if transport.is_closing():
                return
            try:
                transport.write(self._h11.send(h11.Data(
                    data=f"data: {stream.instance} {i}\n\n".encode())) or b"")
                if i + 1 < stream.events:
                    loop.call_later(stream.every, send, i + 1)
                    return
                transport.write(self._h11.send(h11.EndOfMessage()) or b"")
            except h11.LocalProtocolError:
                transport.abort()
                return
            if self._h11.our_state is h11.MUST_CLOSE:
                transport.close()
            else:
                self._process()  # a request pipelined behind the stream

        send(0)

    def _later(self, later: Later) -> None:
        """Answer after ``seconds``, from one loop timer (a slow generation, or the edge's 524
        at its timeout: the container's answer is lost)."""
        transport = self._transport

        def send() -> None:
            if transport is None or transport.is_closing():
                return  # the client or the container went meanwhile
            self._reply(later.reply)
            if not transport.is_closing():
                self._process()  # a request pipelined behind this one

        asyncio.get_running_loop().call_later(later.seconds, send)

    def _bad_request(self) -> None:
        transport = self._transport
        assert transport is not None
        self._requests += 1  # it spoke (badly): not a TCP probe, not served either
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            with contextlib.suppress(h11.LocalProtocolError):
                body = b'{"error": "bad request"}'
                transport.write(
                    self._h11.send(h11.Response(
                        status_code=400, reason=b"Bad Request",
                        headers=[(b"content-type", b"application/json"),
                                 (b"content-length", str(len(body)).encode()),
                                 (b"connection", b"close")])) or b"")
                transport.write(self._h11.send(h11.Data(data=body)) or b"")
                transport.write(self._h11.send(h11.EndOfMessage()) or b"")
        transport.close()


class ListenerSet:
    """The listeners of one mock cloud, kept in step with its records by :meth:`sync`.

    Inactive until :meth:`start` (inside a running event loop): a state driven only through
    ``httpx.ASGITransport`` and a manual clock never opens a socket. Once started, a ticker
    calls ``tick(full=...)`` every ``interval`` seconds (the state advances its records and
    calls :meth:`sync_changed` for those that changed, and :meth:`sync` for all when ``full``),
    so boots, crashes and timed exits open and close listeners without anyone asking. With
    ``address_map_dir`` the routes are written to ``<owner>.json`` there.
    """

    def __init__(self, *, clock: Callable[[], float], address_map_dir: Path | None = None,
                 owner: str = "mock") -> None:
        if not owner or "/" in owner or owner.startswith("."):
            raise ValueError(f"address map owner must be a plain file name, got {owner!r}")
        self.clock = clock
        self.address_map_dir = address_map_dir
        self.owner = owner
        self._open: dict[tuple[str, int], Listener] = {}  # (instance id, container port)
        # instance id -> (the run they serve, its listeners; empty when none could open)
        self._by_record: dict[str, tuple[int, list[Listener]]] = {}
        self._opening: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._tick: Callable[..., object] | None = None
        self._routes_dirty = False
        self._routes_written = -1e18
        self._routes_timer: asyncio.TimerHandle | None = None
        # hostname-only mode (providers/mock/edge.py): TLS listeners reached by edge name
        self.edge: EdgeSettings | None = None
        self._tls: ssl.SSLContext | None = None

    def __repr__(self) -> str:
        return f"ListenerSet(open={len(self._open)}, active={self.active})"

    @property
    def active(self) -> bool:
        return self._loop is not None

    # -- life -------------------------------------------------------------------------------

    def start(self, *, tick: Callable[..., object], interval: float = 0.1) -> None:
        """Open listeners from now on (in the running loop) and tick every ``interval``."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._tick = tick
        self._ticker = self._loop.create_task(self._tick_forever(interval))
        if self.address_map_dir is not None:
            self._routes_dirty = True
            self._flush_routes()

    async def aclose(self) -> None:
        """Stop ticking, close every listener and connection, and remove our routes."""
        self._loop = None  # inactive from here: sync() opens nothing any more
        self._tick = None
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        for instance_id in list(self._by_record):
            self._close_record(instance_id)
        while self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)
        if self._routes_timer is not None:
            self._routes_timer.cancel()
            self._routes_timer = None
        self._routes_dirty = False
        # aborted transports close their sockets on the next loop iteration
        for _ in range(3):
            await asyncio.sleep(0)
        if self.address_map_dir is not None:
            (self.address_map_dir / f"{self.owner}.json").unlink(missing_ok=True)

    async def _tick_forever(self, interval: float) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(interval)
            ticks += 1
            try:
                assert self._tick is not None
                # changed records each tick; every listener against its record now and then
                self._tick(full=ticks % _FULL_SYNC_EVERY == 0)
            except Exception:  # one bad tick (a full disk) must not stop the next ones
                log.exception("mock cloud: listener tick failed")

    # -- keeping in step with the records ---------------------------------------------------

    def sync(self, records: Iterable[Record]) -> None:
        """Listeners for exactly the serving records (their current run), no others."""
        if self._loop is None:
            return
        serving: dict[str, Record] = {r.id: r for r in records if r.serving}
        for instance_id, (run, _) in list(self._by_record.items()):
            record = serving.get(instance_id)
            if record is None or record.restart_count != run:
                self._close_record(instance_id)
        for instance_id, record in serving.items():
            if instance_id not in self._by_record:
                self._open_record(record)
        self._flush_routes()

    def sync_one(self, record: Record) -> None:
        """:meth:`sync` for one record (after the state changed it)."""
        if self._loop is None:
            return
        self._sync_record(record)
        self._flush_routes()

    def sync_changed(self, records: Iterable[Record]) -> None:
        """:meth:`sync` for the records whose state changed (cheaper than all of them)."""
        if self._loop is None:
            return
        for record in records:
            self._sync_record(record)
        self._flush_routes()

    def _sync_record(self, record: Record) -> None:
        entry = self._by_record.get(record.id)
        if entry is not None and (not record.serving or record.restart_count != entry[0]):
            self._close_record(record.id)
        if record.serving and record.id not in self._by_record:
            self._open_record(record)

    def close_all(self) -> None:
        for instance_id in list(self._by_record):
            self._close_record(instance_id)
        self._flush_routes()

    def _open_record(self, record: Record) -> None:
        assert self._loop is not None
        opened: list[Listener] = []
        for container_port, protocol, public_port in record.published:
            if protocol != "TCP":
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((LISTEN_HOST, 0))
                sock.listen(128)
                sock.setblocking(False)
            except OSError:
                sock.close()
                log.exception("mock cloud: cannot listen for %s:%d", record.id, container_port)
                continue
            public_host, published_port = record.reported_ip, public_port
            if self.edge is not None:
                public_host = self.edge.host(record.id, container_port)
                published_port = EDGE_PORT
            listener = Listener(record=record, run=record.restart_count,
                                container_port=container_port, public_host=public_host,
                                public_port=published_port, sock=sock,
                                port=sock.getsockname()[1])
            record.served.setdefault(container_port, [0, 0])
            opened.append(listener)
            self._open[(record.id, container_port)] = listener
            task = self._loop.create_task(self._serve(listener))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)
        self._by_record[record.id] = (record.restart_count, opened)  # not retried every tick
        if opened:
            self._routes_dirty = True

    def _close_record(self, instance_id: str) -> None:
        _, listeners = self._by_record.pop(instance_id, (0, []))
        for listener in listeners:
            self._open.pop((instance_id, listener.container_port), None)
            listener.close()
            self._routes_dirty = True

    async def _serve(self, listener: Listener) -> None:
        if listener.closed:
            return
        loop = asyncio.get_running_loop()
        try:
            # without start_serving this does not suspend, so ``closed`` cannot change meanwhile
            server = await loop.create_server(lambda: _Connection(listener, self),
                                                    sock=listener.sock, start_serving=False,
                                                    ssl=self._tls_context())
        except OSError:
            listener.sock.close()
            log.exception("mock cloud: cannot serve %s", listener.to_json())
            return
        listener.server = server
        if listener.closed:
            server.close()
            return
        await server.start_serving()

    def _tls_context(self) -> ssl.SSLContext | None:
        if self.edge is None:
            return None
        if self._tls is None:
            self._tls = self.edge.context()
        return self._tls

    # -- what is open -----------------------------------------------------------------------

    def listeners(self) -> list[Listener]:
        return list(self._open.values())

    def to_json(self) -> list[dict[str, Any]]:
        return [listener.to_json() for listener in self._open.values()]

    def routes(self) -> list[tuple[str, int, str, int]]:
        return [(lst.public_host, lst.public_port, LISTEN_HOST, lst.port)
                for lst in self._open.values()]

    def _flush_routes(self) -> None:
        """Write the routes if they changed: at once, or (when the last write was very
        recent) once a short moment later, so a burst of changes costs one write."""
        if self.address_map_dir is None or not self._routes_dirty or self._loop is None:
            return
        wait = self._routes_written + _ROUTES_MIN_INTERVAL - time.monotonic()
        if wait > 0:
            if self._routes_timer is None:
                self._routes_timer = self._loop.call_later(wait, self._timer_flush)
            return
        self._routes_dirty = False
        self._routes_written = time.monotonic()
        write_routes(directory=self.address_map_dir, owner=self.owner, routes=self.routes())

    def _timer_flush(self) -> None:
        self._routes_timer = None
        try:
            self._flush_routes()
        except OSError:
            log.exception("mock cloud: cannot write the address map")

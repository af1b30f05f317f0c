"""``/portForward/{namespace}/{pod}[/{uid}]``: the upgrade request, then the SPDY session.

Why it exists: a port-forward request is an HTTP/1.1 Upgrade (``Upgrade: SPDY/3.1``), which an
ASGI app cannot accept (ASGI has no 101 for non-WebSocket upgrades). The kubelet API's h11
protocol (:mod:`vkprovider.api.server`) hands such a request here with the raw connection, after
uvicorn parsed its head; everything else stays on the ASGI path. This route then does what the
kubelet does before upgrading, in the same order:

1. authentication and authorization exactly as for every other kubelet API path
   (``authorize``: the middleware's check, ``nodes/proxy`` with the verb of the method; 401/403
   otherwise): the API server's own authz of ``pods/portforward`` was the caller's gate;
2. the pod must be one of this node's pods (404), with the uid asked for, if any (404), and have
   a cloud instance (400);
3. the protocol handshake: ``X-Stream-Protocol-Version`` must offer ``portforward.k8s.io``
   (400 when absent, 403 naming the accepted versions otherwise);
4. ``101 Switching Protocols``, then :class:`~.session.PortForwardSession` until either side
   closes. At most ``max_sessions`` sessions run at once (503 beyond).

Every answer is counted in ``vkprovider_kubelet_api_requests_total{endpoint="portForward"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from vkprovider.api.auth import AuthFailure
from vkprovider.api.portforward.dial import Dial, declared_ports, describe_ports
from vkprovider.api.portforward.session import Limits, PortForwardSession, PortRefused
from vkprovider.api.view import NodeView
from vkprovider.logs import kv
from vkprovider.metrics import Metrics

__all__ = ["PROTOCOL", "PortForwardRoute"]

log = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"
PREFIX = "/portForward/"

Scope = dict[str, Any]
Authorize = Callable[[Scope], Awaitable[None]]


class _Answer(Exception):
    def __init__(self, status: int, message: str, *, extra: tuple[tuple[str, str], ...] = ()
                 ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


class _PodTarget:
    """One pod's declared ports, dialled through the route's :data:`~.dial.Dial`."""

    def __init__(self, *, view: NodeView, pod: dict[str, Any], dial: Dial) -> None:
        meta = pod.get("metadata") or {}
        self._view = view
        self._uid = str(meta.get("uid", ""))
        self._where = f"{meta.get('namespace')}/{meta.get('name')}"
        self._ports = declared_ports(pod)
        self._dial = dial

    def check(self, port: int) -> None:
        if not any(p.port == port and p.protocol.upper() == "TCP" for p in self._ports):
            raise PortRefused(f"port {port} is not a declared TCP container port of pod "
                              f"{self._where} (declared: {describe_ports(self._ports)})")

    async def dial(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        placement = self._view.placement(self._uid)  # now: the instance may have changed
        if placement is None:
            raise PortRefused(f"pod {self._where} has no cloud instance")
        return await self._dial(placement, port)


class PortForwardRoute:
    """Accepts upgraded ``/portForward`` connections (see the module docstring)."""

    def __init__(self, *, view: NodeView, dial: Dial, authorize: Authorize | None,
                 metrics: Metrics, limits: Limits | None = None, max_sessions: int = 256
                 ) -> None:
        self._view = view
        self._dial = dial
        self._authorize = authorize
        self._metrics = metrics
        self._limits = limits or Limits()
        self._max_sessions = max_sessions
        self._tasks: set[asyncio.Task[None]] = set()

    def wants(self, *, path: str, upgrade: bytes) -> bool:
        """Whether the request ``path`` with this ``Upgrade`` header value is served here."""
        return path.startswith(PREFIX) and upgrade.strip().lower() == b"spdy/3.1"

    def start(self, *, scope: Scope, reader: asyncio.StreamReader,
              writer: asyncio.StreamWriter) -> None:
        """Serve one connection in the background (called from the protocol's callback)."""
        task = asyncio.get_running_loop().create_task(self.serve(scope, reader, writer),
                                                      name="port-forward")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """End every session (the server is stopping)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def serve(self, scope: Scope, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        try:
            try:
                session = await self._accept(scope, reader, writer)
            except _Answer as answer:
                self._count(answer.status)
                writer.write(_response(answer.status, answer.message, answer.extra))
                with contextlib.suppress(Exception):
                    await writer.drain()
                writer.close()
                return
            self._count(101)
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                         b"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: "
                         + PROTOCOL.encode() + b"\r\n\r\n")
            await session.run()
        except Exception:  # one connection's failure never reaches the server
            log.exception("port-forward session failed")
            writer.close()

    async def _accept(self, scope: Scope, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> PortForwardSession:
        path = str(scope.get("path", ""))
        log.debug("port-forward upgrade request",
                  extra=kv(method=scope.get("method"), path=path, headers={
                      k.decode("latin-1"): v.decode("latin-1")
                      for k, v in scope.get("headers") or []
                      if k not in (b"authorization", b"cookie")}))  # never a credential
        if self._authorize is not None:
            try:
                await self._authorize(scope)
            except AuthFailure as exc:
                raise _Answer(exc.status, exc.message) from None
        parts = [p for p in path[len(PREFIX):].split("/") if p]
        if len(parts) not in (2, 3):
            raise _Answer(400, "portForward: expected /portForward/<namespace>/<pod>[/<uid>]")
        namespace, name = parts[0], parts[1]
        pod = self._view.pod(namespace=namespace, name=name)
        uid = str(((pod or {}).get("metadata") or {}).get("uid", ""))
        if pod is None or (len(parts) == 3 and parts[2] != uid):
            raise _Answer(404, f'pod "{namespace}/{name}" does not exist on node '
                               f"{self._view.node_name}")
        if self._view.placement(uid) is None:
            raise _Answer(400, f'pod "{namespace}/{name}" has no cloud instance yet')
        offered = [v.strip() for key, value in scope.get("headers") or []
                   if key == b"x-stream-protocol-version"
                   for v in value.decode("latin-1").split(",") if v.strip()]
        if not offered:
            raise _Answer(400, "unable to upgrade: header X-Stream-Protocol-Version does not "
                               "exist in the request")
        if PROTOCOL not in offered:
            raise _Answer(403, f"unable to upgrade: unable to negotiate protocol: client "
                               f"supports {offered}, server accepts [{PROTOCOL}]",
                          extra=(("X-Accepted-Stream-Protocol-Versions", PROTOCOL),))
        if len(self._tasks) > self._max_sessions:
            raise _Answer(503, f"too many port-forward sessions on node "
                               f"{self._view.node_name} (at most {self._max_sessions})")
        log.info("port-forward session", extra=kv(pod=f"{namespace}/{name}",
                                                  user=(scope.get("state") or {}).get("user")))
        return PortForwardSession(reader=reader, writer=writer,
                                  target=_PodTarget(view=self._view, pod=pod, dial=self._dial),
                                  pod=f"{namespace}/{name}", limits=self._limits)

    def _count(self, status: int) -> None:
        self._metrics.kubelet_api_requests.labels("portForward", str(status)).inc()


def _response(status: int, message: str, extra: tuple[tuple[str, str], ...]) -> bytes:
    body = message.encode("utf-8")
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}",
            "Connection: close", *(f"{k}: {v}" for k, v in extra)]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

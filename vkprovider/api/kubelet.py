"""The kubelet API of the virtual node (FastAPI), served over TLS on ``node.kubelet_port``.

Why it exists: the API server sends ``kubectl logs``, ``exec``, ``attach`` and ``port-forward`` to
the kubelet of the pod's node, and metrics-server reads ``/metrics/resource`` there. Without this
API ``kubectl logs`` on a burst pod answers "NotFound pods/log" (virtual-kubelet#177, #906).

Endpoints (kubelet paths):

* ``GET /containerLogs/{namespace}/{pod}/{container}``: the cloud's container output, with
  ``follow`` (streamed until the container stops or the caller goes), ``tailLines``,
  ``timestamps``, ``sinceSeconds``/``sinceTime`` and ``limitBytes``. ``previous=true`` is a 400:
  clouds keep no logs of previous containers.
* ``GET /pods``, ``GET /runningpods/``: PodLists of the node's pods.
* ``GET /stats/summary``, ``GET /metrics/resource``: see :mod:`vkprovider.api.stats`.
* ``/portForward/{namespace}/{pod}[/{uid}]``: ``kubectl port-forward`` to the pod's declared
  ports, an upgrade to SPDY/3.1 served by :mod:`vkprovider.api.portforward` (the middleware's
  ``upgrades``, handed the raw connection by :mod:`vkprovider.api.server`); a request that does
  not upgrade is a 400.
* ``/exec``, ``/attach``: an immediate 501 naming the cloud that cannot do it.
* ``GET /healthz``: ``ok``, without authentication (for probes; it reveals nothing).

Everything else requires authentication and authorization (:mod:`vkprovider.api.auth`): 401 for
anonymous callers, 403 for callers RBAC denies. Errors are plain text, as the kubelet writes them;
the API server passes them on to ``kubectl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from providers.base import LogOptions, NotFound, ProviderError, Unsupported
from vkprovider.api.auth import AuthFailure, KubeletAuth
from vkprovider.api.gpu import GPUCollector
from vkprovider.api.portforward import Dial, PortForwardRoute, PublishedDial
from vkprovider.api.stats import resource_metrics, summary
from vkprovider.api.view import NodeView, Placement, is_running
from vkprovider.logs import kv
from vkprovider.metrics import Metrics
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

log = logging.getLogger(__name__)

Body = dict[str, Any]

OPEN_PATHS = frozenset({"/healthz"})
_ENDPOINTS = frozenset({"containerLogs", "pods", "runningpods", "stats", "metrics", "exec",
                        "attach", "portForward", "healthz", "logs"})
_FIRST_CHUNK_WAIT = 2.0  # seconds to wait for a provider error before committing to a 200


class HTTPProblem(Exception):
    """Answer ``status`` with ``message`` as plain text (the kubelet's error style)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def endpoint_label(path: str) -> str:
    first = path.strip("/").split("/", 1)[0]
    return first if first in _ENDPOINTS else "other"


class KubeletMiddleware:
    """Counts every request, and authenticates and authorizes all but ``OPEN_PATHS``.

    A pure ASGI middleware, so streamed responses (``logs -f``) pass through untouched.
    ``upgrades`` serves upgraded ``/portForward`` connections outside ASGI, authorized by
    :meth:`authorize` (the same check).
    """

    def __init__(self, app: ASGIApp, *, auth: KubeletAuth | None, metrics: Metrics) -> None:
        self.app = app
        self.auth = auth
        self.metrics = metrics
        self.upgrades: PortForwardRoute | None = None

    async def authorize(self, scope: dict[str, Any]) -> None:
        """Authenticate and authorize a request by its scope; :class:`AuthFailure` if not."""
        if self.auth is not None:
            await self._check(scope, str(scope.get("path", "")))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        endpoint = endpoint_label(path)
        status = {"code": 0}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            if self.auth is not None and path not in OPEN_PATHS:
                try:
                    await self._check(scope, path)
                except AuthFailure as exc:
                    await PlainTextResponse(exc.message, status_code=exc.status)(
                        scope, receive, counting_send)
                    return
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.kubelet_api_requests.labels(endpoint, str(status["code"] or 500)).inc()

    async def _check(self, scope: Scope, path: str) -> None:
        assert self.auth is not None
        tls = (scope.get("extensions") or {}).get("tls") or {}
        subject = tls.get("client_cert_subject") or None
        authorization = None
        for key, value in scope.get("headers") or []:
            if key == b"authorization":
                authorization = value.decode("latin-1")
                break
        caller = await self.auth.authenticate(client_subject=subject,
                                              authorization=authorization)
        await self.auth.authorize(caller=caller, http_method=str(scope.get("method", "GET")),
                                  path=path)
        scope.setdefault("state", {})["user"] = caller.user.name


class _ClosingStream(StreamingResponse):
    """A streamed response that always closes its source, even when the caller hangs up."""

    def __init__(self, content: AsyncIterator[bytes], *, close: Callable[[], Awaitable[None]],
                 media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name)
    if value is None:
        return False
    if value.lower() in ("", "1", "true", "yes", "t"):
        return True
    if value.lower() in ("0", "false", "no", "f"):
        return False
    raise HTTPProblem(400, f"{name}: {value!r} is not a boolean")


def _count(request: Request, name: str, *, minimum: int) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise HTTPProblem(400, f"{name}: {value!r} is not an integer") from None
    if number < minimum:
        raise HTTPProblem(400, f"{name}: must be at least {minimum}, got {number}")
    return number


def log_options(request: Request, *, now: datetime | None = None) -> LogOptions:
    """The kubelet's log query parameters as :class:`LogOptions` (400 when malformed)."""
    since_seconds = _count(request, "sinceSeconds", minimum=1)
    since_time = request.query_params.get("sinceTime")
    if since_time:
        if since_seconds is not None:
            raise HTTPProblem(400, "at most one of sinceTime or sinceSeconds may be specified")
        try:
            when = parse_time(since_time)
        except TimeFormatError:
            raise HTTPProblem(400, f"sinceTime: {since_time!r} is not an RFC 3339 time"
                              ) from None
        elapsed = ((now or datetime.now(UTC)) - when).total_seconds()
        since_seconds = max(1, math.ceil(elapsed))
    return LogOptions(
        follow=_flag(request, "follow"),
        tail_lines=_count(request, "tailLines", minimum=0),
        since_seconds=since_seconds,
        timestamps=_flag(request, "timestamps"),
        limit_bytes=_count(request, "limitBytes", minimum=1),
    )


def _pod_list(items: list[Body]) -> Body:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


def _provider_problem(exc: ProviderError, *, placement: Placement, what: str) -> HTTPProblem:
    name = placement.provider_name
    if isinstance(exc, NotFound):
        return HTTPProblem(404, f"instance {placement.instance.id} of pod "
                                f"{placement.namespace}/{placement.pod} is gone from provider "
                                f"{name}")
    if isinstance(exc, Unsupported):
        return HTTPProblem(501, f"{what} is not supported by provider {name}: {exc}")
    return HTTPProblem(502, f"{what} from provider {name} failed: {exc}")


def create_kubelet_app(
    *,
    view: NodeView,
    auth: KubeletAuth | None,
    metrics: Metrics,
    gpus: GPUCollector,
    started_at: float | None = None,
    clock: Callable[[], float] = time.time,
    dial: Dial | None = None,
) -> Any:
    """The kubelet API as an ASGI app. ``auth=None`` turns authentication off (tests only).
    ``dial`` is port-forward's dial step (default: the published address, dialled directly)."""
    app = FastAPI(title="vkprovider kubelet API", docs_url=None, redoc_url=None,
                  openapi_url=None)
    node_start = started_at if started_at is not None else clock()

    @app.exception_handler(HTTPProblem)
    async def on_problem(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPProblem)
        return PlainTextResponse(exc.message, status_code=exc.status)

    def find_pod(namespace: str, name: str) -> Body:
        pod = view.pod(namespace=namespace, name=name)
        if pod is None:
            raise HTTPProblem(404, f'pod "{namespace}/{name}" does not exist')
        return pod

    @app.get("/healthz")
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    @app.get("/pods")
    async def pods() -> Response:
        return JSONResponse(_pod_list(view.pods()))

    @app.get("/runningpods")
    @app.get("/runningpods/")
    async def running_pods() -> Response:
        items = []
        for pod in view.pods():
            meta = pod["metadata"]
            placement = view.placement(str(meta.get("uid", "")))
            if placement is None or not is_running(placement):
                continue
            items.append({
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                             "uid": meta.get("uid")},
                "spec": {"containers": [{"name": c.get("name"), "image": c.get("image")}
                                        for c in (pod.get("spec") or {}).get("containers") or []]},
                "status": {},
            })
        return JSONResponse(_pod_list(items))

    @app.get("/stats/summary")
    @app.get("/stats/summary/")
    async def stats_summary() -> Response:
        return JSONResponse(summary(view=view, samples=gpus.samples, node_start=node_start))

    @app.get("/metrics/resource")
    async def metrics_resource() -> Response:
        body = resource_metrics(view=view, samples=gpus.samples, now=clock())
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/containerLogs/{namespace}/{pod_name}/{container}")
    async def container_logs(request: Request, namespace: str, pod_name: str,
                             container: str) -> Response:
        pod = find_pod(namespace, pod_name)
        spec = pod.get("spec") or {}
        names = [c.get("name") for key in ("containers", "initContainers", "ephemeralContainers")
                 for c in spec.get(key) or []]
        if container not in names:
            raise HTTPProblem(404, f'container "{container}" not found in pod '
                                   f'"{namespace}/{pod_name}"')
        opts = log_options(request)
        uid = str(pod["metadata"].get("uid", ""))
        placement = view.placement(uid)
        if _flag(request, "previous"):
            where = placement.provider_name if placement else "the cloud"
            raise HTTPProblem(400, f'previous terminated container "{container}" in pod '
                                   f'"{pod_name}" not found: {where} keeps no logs of previous '
                                   f'containers')
        if placement is None:
            raise HTTPProblem(400, f'container "{container}" in pod "{pod_name}" is waiting to '
                                   f'start: no cloud instance yet')
        return await _stream_logs(placement, opts)

    async def _stream_logs(placement: Placement, opts: LogOptions) -> Response:
        source = placement.provider.logs(placement.instance.id, opts)
        chunks = aiter(source)
        first: asyncio.Future[bytes] = asyncio.ensure_future(anext(chunks))
        done, _ = await asyncio.wait({first}, timeout=_FIRST_CHUNK_WAIT)

        async def close() -> None:
            if not first.done():
                first.cancel()
                with contextlib.suppress(BaseException):
                    await first
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

        if done and first.exception() is not None:
            exc = first.exception()
            await close()
            if isinstance(exc, StopAsyncIteration):
                return PlainTextResponse("")
            if isinstance(exc, ProviderError):
                raise _provider_problem(exc, placement=placement, what="logs") from None
            assert exc is not None
            raise exc

        budget = opts.limit_bytes

        async def body() -> AsyncIterator[bytes]:
            nonlocal budget
            pending: Awaitable[bytes] = first
            while True:
                try:
                    chunk = await pending
                except StopAsyncIteration:
                    return
                except ProviderError as exc:  # mid-stream: the status line is sent already
                    log.info("log stream ended by provider error",
                             extra=kv(provider=placement.provider_name,
                                      instance=placement.instance.id, error=str(exc)))
                    return
                if budget is not None:
                    chunk = chunk[:budget]
                    budget -= len(chunk)
                if chunk:
                    yield chunk
                if budget == 0:
                    return
                pending = anext(chunks)

        return _ClosingStream(body(), close=close, media_type="text/plain; charset=utf-8")

    def refuse(kind: str) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            parts = [p for p in request.path_params.get("rest", "").split("/") if p]
            if len(parts) < 2:
                raise HTTPProblem(400, f"{kind}: expected /{kind}/<namespace>/<pod>/...")
            pod = find_pod(parts[0], parts[1])
            placement = view.placement(str(pod["metadata"].get("uid", "")))
            where = (f"provider {placement.provider_name}" if placement
                     else "the cloud this pod runs on")
            raise HTTPProblem(501, f"{kind} is not supported by {where}: cloud GPU instances "
                                   f"offer no {kind} stream to the kubelet; use kubectl logs, "
                                   f"or the instance's own endpoints")
        return handler

    for kind in ("exec", "attach"):
        app.add_api_route(f"/{kind}/{{rest:path}}", refuse(kind), methods=["GET", "POST"],
                          include_in_schema=False)

    async def port_forward_without_upgrade(request: Request) -> Response:
        raise HTTPProblem(400, "portForward: the request must upgrade the connection to "
                               "SPDY/3.1 (Connection: Upgrade, Upgrade: SPDY/3.1, "
                               "X-Stream-Protocol-Version: portforward.k8s.io)")

    app.add_api_route("/portForward/{rest:path}", port_forward_without_upgrade,
                      methods=["GET", "POST"], include_in_schema=False)

    middleware = KubeletMiddleware(app, auth=auth, metrics=metrics)
    middleware.upgrades = PortForwardRoute(view=view, dial=dial or PublishedDial(),
                                           authorize=middleware.authorize, metrics=metrics)
    return middleware


def create_metrics_app(*, metrics: Metrics) -> Any:
    """``/metrics`` (Prometheus text) and ``/healthz`` for the metrics port."""
    app = FastAPI(title="vkprovider metrics", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    return app

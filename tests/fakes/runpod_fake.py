"""A local fake of RunPod's REST API v2 that checks itself against RunPod's published spec.

Why it exists: the RunPod adapter (:mod:`providers.runpod`) must be tested without a RunPod
account, and a hand-written fake is only as good as its author's reading of the API. So every
request this fake receives and every response it sends is validated with ``openapi-core``
against RunPod's own OpenAPI 3.1 document (``runpod/openapi-v2.json``, vendored in
``tests/specs``). A request the spec does not allow (unknown body field, bad
query value, undeclared query parameter, missing bearer token, an operation the fake does not
implement) and a response the fake would send that the spec does not allow are both recorded in
:attr:`FakeRunPod.violations` and answered with status 599, so the adapter fails loudly and the
test asserts ``fake.violations == []``.

What it models: pods in memory (``GET/POST /v2/pods``, ``GET/DELETE /v2/pods/{id}``; a RUNNING
pod's ``runtime`` carries one ``PodGpuUtilization`` per GPU, set with
:meth:`FakeRunPod.set_gpu_utilization`, and one ``PodRuntimePort`` per declared port: ``tcp``
ports mapped to a public port on ``203.0.113.7``, ``http`` ports unmapped, replaceable with
:meth:`FakeRunPod.set_runtime_ports`), SSE logs
(``GET /v2/pods/{id}/logs``) and the GPU catalog with stock per data center
(``GET /v2/catalog/gpus``). Creates take GPUs from stock and fail like RunPod does (400 problem
details) when none is left; deletes give them back. Names are not unique, as on RunPod.

Container registry credentials (``GET/POST /v2/registries``, ``GET/DELETE /v2/registries/{id}``)
are kept in :attr:`FakeRunPod.registries` with their username and password (write-only: never in
an answer). A pod create whose ``registry`` names no credential answers 404 (the spec's "unknown
referenced object"); deleting a credential a pod uses answers 400, as the spec says.

Faults, in RunPod's error format (RFC 9457 ``application/problem+json``):
:meth:`FakeRunPod.fail_next` (any status, optional ``Retry-After``), :meth:`no_capacity`,
:meth:`rate_limit` and :meth:`server_error`. Every request, valid or not, is in
:attr:`FakeRunPod.requests` with its operation id, query, headers and JSON body.
"""

from __future__ import annotations

import asyncio
import functools
import http
import json
import random
import re
import string
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from openapi_core import Config, OpenAPI
from openapi_core.testing import MockRequest, MockResponse

from tests.fakes.common import specs_dir as common_specs_dir

__all__ = [
    "NO_CAPACITY_DETAIL",
    "FakeGpu",
    "FakeRunPod",
    "Recorded",
    "Violation",
    "create_app",
    "runpod_spec_path",
]

SPEC_RELATIVE = Path("runpod") / "openapi-v2.json"
VIOLATION_STATUS = 599
HOST_URL = "https://api.runpod.io"
#: RunPod's human-readable capacity message (there is no machine-readable code for it).
NO_CAPACITY_DETAIL = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
#: The operations this fake implements; any other operation of the spec is a violation.
IMPLEMENTED = frozenset({"listPods", "createPod", "getPod", "deletePod", "getPodLogs",
                         "listGpuTypes", "listRegistries", "createRegistry", "getRegistry",
                         "deleteRegistry"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def runpod_spec_path(specs_dir: str | Path | None = None) -> Path:
    """The spec file under ``specs_dir``, else :func:`tests.fakes.common.specs_dir`."""
    return Path(specs_dir if specs_dir is not None else common_specs_dir()) / SPEC_RELATIVE


def _json_bytes(data: bytes, **_: Any) -> Any:
    return json.loads(data)


def _text(data: bytes | str, **_: Any) -> str:
    return data.decode() if isinstance(data, bytes) else data


@dataclass(frozen=True)
class _Operation:
    operation_id: str
    template: str
    query_params: frozenset[str]


class _Spec:
    """The parsed spec: an openapi-core validator plus an operation lookup by method and path."""

    def __init__(self, path: Path) -> None:
        self.document: dict[str, Any] = json.loads(path.read_text())
        config = Config(
            extra_media_type_deserializers={
                "application/problem+json": _json_bytes,
                "text/event-stream": _text,
            }
        )
        self.openapi = OpenAPI.from_dict(self.document, config=config)
        routes: list[tuple[int, re.Pattern[str], str, dict[str, _Operation]]] = []
        for template, item in self.document["paths"].items():
            shared = item.get("parameters", [])
            ops: dict[str, _Operation] = {}
            for method, op in item.items():
                if method not in ("get", "put", "post", "patch", "delete"):
                    continue
                params = [self._resolve(p) for p in [*shared, *op.get("parameters", [])]]
                ops[method] = _Operation(
                    operation_id=op["operationId"],
                    template=template,
                    query_params=frozenset(p["name"] for p in params if p["in"] == "query"),
                )
            pattern = re.compile(
                "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
            )
            # Literal paths win over templated ones (/v2/registries/delegations vs /{id}).
            routes.append((template.count("{"), pattern, template, ops))
        self.routes = sorted(routes, key=lambda r: r[0])

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            target: Any = self.document
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return node

    def operation(self, method: str, path: str) -> _Operation | None:
        for _, pattern, _, ops in self.routes:
            if pattern.match(path):
                return ops.get(method.lower())
        return None


@functools.lru_cache(maxsize=4)
def _load_spec(path: str) -> _Spec:
    return _Spec(Path(path))


@dataclass
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str
    operation: str | None
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    status: int = 0  # what the fake answered (599 for a violation)


@dataclass(frozen=True)
class Violation:
    """A request or a response the spec does not allow."""

    kind: str  # "request" or "response"
    method: str
    path: str
    status: int
    error: str


@dataclass
class FakeGpu:
    """One GPU type of the catalog, with free GPUs per data center."""

    id: str
    name: str
    memory: int
    price_secure: float
    price_community: float
    max_secure: int = 8
    max_community: int = 4
    stock: dict[str, int] = field(default_factory=dict)  # data center -> free GPUs

    def offered(self, cloud: str) -> bool:
        return (self.max_secure if cloud == "SECURE" else self.max_community) > 0


@dataclass
class _Fault:
    operation: str  # an operation id or "*"
    status: int
    detail: str
    retry_after: int | None
    times: int
    title: str | None = None
    errors: list[str] | None = None
    headers: dict[str, str] | None = None


DATA_CENTER_NAMES = {
    "US-TX-3": "US Texas 3",
    "US-KS-2": "US Kansas 2",
    "EU-RO-1": "EU Romania 1",
}


def default_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(id="NVIDIA H100 80GB HBM3", name="H100 SXM", memory=80, price_secure=2.99,
                price_community=2.69, max_secure=8, max_community=2,
                stock={"US-TX-3": 8, "EU-RO-1": 2}),
        FakeGpu(id="NVIDIA GeForce RTX 4090", name="RTX 4090", memory=24, price_secure=0.69,
                price_community=0.34, max_secure=8, max_community=4, stock={"US-KS-2": 4}),
        FakeGpu(id="NVIDIA A100 80GB PCIe", name="A100 PCIe", memory=80, price_secure=1.64,
                price_community=1.19, max_secure=8, max_community=8, stock={}),
    ]


def _level(free: int, count: int) -> str:
    if free < count or free <= 0:
        return "NONE"
    if free <= 2:
        return "LOW"
    if free <= 7:
        return "MEDIUM"
    return "HIGH"


def _now_rfc3339(now: datetime) -> str:
    return now.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class FakeRunPod:
    """The fake's state: pods, logs, GPU stock, armed faults, and what it saw."""

    def __init__(
        self,
        *,
        api_key: str = "rp-test-key",
        gpus: list[FakeGpu] | None = None,
        start_running: bool = False,
        clock: Callable[[], datetime] | None = None,
        seed: int = 7,
    ) -> None:
        self.api_key = api_key
        self.gpus = {g.id: g for g in (gpus if gpus is not None else default_gpus())}
        self.start_running = start_running
        self.clock = clock or (lambda: datetime.now(UTC))
        self.pods: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, list[dict[str, str]]] = {}
        self.requests: list[Recorded] = []
        self.violations: list[Violation] = []
        self._faults: list[_Fault] = []
        self._random = random.Random(seed)
        self._holds: dict[str, tuple[str, str, int]] = {}  # pod id -> (gpu id, dc, count)
        #: registry credential id -> {id, name, username, password}
        self.registries: dict[str, dict[str, str]] = {}

    # -- faults -------------------------------------------------------------------------

    def fail_next(
        self,
        operation: str,
        *,
        status: int,
        detail: str = "upstream failure",
        retry_after: int | None = None,
        times: int = 1,
        title: str | None = None,
        errors: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next ``times`` calls of ``operation`` (an operationId or ``*``) answer ``status``.

        The answer is a problem document (``title``, ``detail``, ``errors``) with ``headers``
        and, when ``retry_after`` is set, a ``Retry-After`` header.
        """
        self._faults.append(_Fault(operation, status, detail, retry_after, times, title, errors,
                                   headers))

    def no_capacity(self, *, times: int = 1) -> None:
        self.fail_next("createPod", status=400, detail=NO_CAPACITY_DETAIL, times=times)

    def rate_limit(self, operation: str = "*", *, retry_after: int = 12, times: int = 1) -> None:
        self.fail_next(operation, status=429, retry_after=retry_after, times=times,
                       detail="rate limit exceeded for the minute window")

    def server_error(self, operation: str = "*", *, status: int = 503, times: int = 1) -> None:
        self.fail_next(operation, status=status, detail="upstream temporarily unavailable",
                       times=times)

    def take_fault(self, operation: str) -> _Fault | None:
        for fault in self._faults:
            if fault.operation in (operation, "*"):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    # -- test helpers -------------------------------------------------------------------

    def calls(self, operation: str) -> list[Recorded]:
        return [r for r in self.requests if r.operation == operation]

    def add_pod(self, *, name: str, env: dict[str, str] | None = None,
                status: str = "RUNNING", gpu_id: str = "NVIDIA GeForce RTX 4090",
                data_center: str = "US-KS-2") -> dict[str, Any]:
        """A pod made outside the adapter (by hand, or by another node)."""
        pod = self._pod(name=name, body={"image": "busybox", "env": env or {}},
                        gpu={"id": gpu_id, "count": 1}, cpu=None, data_center=data_center,
                        cloud="SECURE", cost=self.gpus[gpu_id].price_secure)
        self.pods[pod["id"]] = pod
        self.set_status(pod["id"], status)
        return pod

    def set_status(self, pod_id: str, status: str) -> None:
        pod = self.pods[pod_id]
        pod["status"] = status
        pod["actions"] = {
            "PROVISIONING": ["terminate"], "STARTING": ["stop", "terminate"],
            "RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
            "ERROR": ["terminate"], "TERMINATED": [],
        }[status]
        if status == "RUNNING":
            pod["startedAt"] = pod["startedAt"] or _now_rfc3339(self.clock())
            ports = []
            for entry in pod["ports"]:
                port, _, kind = entry.partition("/")
                if kind == "tcp":
                    ports.append({"private": int(port), "public": 40000 + int(port) % 20000,
                                  "type": "tcp", "ip": "203.0.113.7"})
                else:
                    ports.append({"private": int(port), "public": None, "type": "http",
                                  "ip": None})
            # One idle PodGpuUtilization per GPU, as RunPod lists a freshly started pod.
            gpus = [{"util": 0, "memoryUtil": 0}
                    for _ in range(int((pod.get("gpu") or {}).get("count") or 0))]
            pod["runtime"] = {"uptime": 0, "gpus": gpus, "ports": ports}
        else:
            pod["runtime"] = None
        if status in ("EXITED", "TERMINATED"):
            pod["cost"] = 0.0

    def set_gpu_utilization(self, pod_id: str, gpus: list[dict[str, Any]] | None) -> None:
        """Replace a RUNNING pod's ``runtime.gpus`` (``PodGpuUtilization`` objects, e.g.
        ``{"util": 94, "memoryUtil": 78}``); None removes the key, as a pod not sampled yet."""
        runtime = self.pods[pod_id]["runtime"]
        if runtime is None:
            raise ValueError("runtime is null unless the pod is RUNNING (the spec)")
        if gpus is None:
            runtime.pop("gpus", None)
        else:
            runtime["gpus"] = [dict(g) for g in gpus]

    def set_runtime_ports(self, pod_id: str, ports: list[dict[str, Any]] | None) -> None:
        """Replace a RUNNING pod's ``runtime.ports`` (``PodRuntimePort`` objects, e.g.
        ``{"private": 8888, "public": 43210, "type": "http", "ip": "45.23.12.1"}``); None
        removes the key, as a pod RunPod has not mapped yet."""
        runtime = self.pods[pod_id]["runtime"]
        if runtime is None:
            raise ValueError("runtime is null unless the pod is RUNNING (the spec)")
        if ports is None:
            runtime.pop("ports", None)
        else:
            runtime["ports"] = [dict(p) for p in ports]

    def add_registry(self, *, name: str, username: str = "user", password: str = "pass",
                     registry_id: str | None = None) -> dict[str, str]:
        """A container registry credential made outside the adapter."""
        registry_id = registry_id or self._new_registry_id()
        entry = {"id": registry_id, "name": name, "username": username, "password": password}
        self.registries[registry_id] = entry
        return entry

    def registry_public(self, registry_id: str) -> dict[str, str]:
        """What the API shows of a credential (``Registry``: id and name only)."""
        entry = self.registries[registry_id]
        return {"id": entry["id"], "name": entry["name"]}

    def delete_registry(self, registry_id: str) -> int:
        """204 when deleted, 404 when unknown, 400 when a pod uses it (as the spec says)."""
        if registry_id not in self.registries:
            return 404
        if any(p.get("registry") == registry_id for p in self.pods.values()):
            return 400
        del self.registries[registry_id]
        return 204

    def _new_registry_id(self) -> str:
        alphabet = string.ascii_lowercase + string.digits
        while True:
            registry_id = "".join(self._random.choice(alphabet) for _ in range(8))
            if registry_id not in self.registries:
                return registry_id

    def add_log(self, pod_id: str, line: str, *, source: str = "container",
                ts: str | None = None) -> None:
        stamp = ts or _now_rfc3339(self.clock())
        self.logs.setdefault(pod_id, []).append({"ts": stamp, "source": source, "line": line})

    # -- behaviour ----------------------------------------------------------------------

    def _new_id(self) -> str:
        alphabet = string.ascii_lowercase + string.digits
        while True:
            pod_id = "".join(self._random.choice(alphabet) for _ in range(14))
            if pod_id not in self.pods:
                return pod_id

    def _pod(self, *, name: str, body: dict[str, Any], gpu: dict[str, Any] | None,
             cpu: dict[str, Any] | None, data_center: str, cloud: str,
             cost: float) -> dict[str, Any]:
        pod_id = self._new_id()
        pod: dict[str, Any] = {
            "id": pod_id,
            "name": name,
            "image": body.get("image", ""),
            "args": body.get("args", ""),
            "disk": body.get("disk", 20),
            "ports": list(body.get("ports", [])),
            "env": dict(body.get("env", {})),
            "registry": body.get("registry"),
            "status": "PROVISIONING",
            "actions": ["terminate"],
            "mounts": body.get("mounts", {}),
            "cloud": cloud,
            "dataCenterId": data_center,
            "cudaVersion": "12.8" if gpu else None,
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22,
                              "username": f"{pod_id}-64411eb2",
                              "command": f"ssh {pod_id}-64411eb2@ssh.runpod.io"},
                    "direct": None},
            "template": None,
            "cost": round(cost, 4),
            "locked": False,
            "globalNetworking": {"enabled": False},
            "runtime": None,
            "createdAt": _now_rfc3339(self.clock()),
            "startedAt": None,
        }
        if gpu is not None:
            pod["gpu"] = {"id": gpu["id"], "count": gpu.get("count", 1)}
        if cpu is not None:
            pod["cpu"] = {**cpu, "memory": 2 * int(cpu["vcpuCount"])}
        return pod

    def create(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        gpu, cpu = body.get("gpu"), body.get("cpu")
        if (gpu is None) == (cpu is None):
            return 400, {"detail": "exactly one of gpu or cpu must be set"}
        if body.get("registry") is not None and body["registry"] not in self.registries:
            return 404, {"detail": "container registry credential not found"}
        mounts = body.get("mounts") or {}
        if "persistent" in mounts and "network" in mounts:
            return 400, {"detail": "mounts.persistent and mounts.network are mutually exclusive"}
        cloud = body.get("cloud", "SECURE")
        if cpu is not None:
            pod = self._pod(name=body["name"], body=body, gpu=None, cpu=cpu,
                            data_center="EU-RO-1", cloud=cloud, cost=0.06 * cpu["vcpuCount"])
        else:
            assert gpu is not None
            spec = self.gpus.get(gpu["id"])
            if spec is None or not spec.offered(cloud):
                return 400, {"detail": f"GPU type is not available in the {cloud} cloud"}
            count = int(gpu.get("count", 1))
            ceiling = spec.max_secure if cloud == "SECURE" else spec.max_community
            if count > ceiling:
                return 400, {"detail": f"at most {ceiling} GPUs of this type fit on one pod"}
            if gpu.get("allowedCudaVersions") and gpu.get("minCudaVersion"):
                return 400, {"detail": "allowedCudaVersions and minCudaVersion are exclusive"}
            wanted = body.get("dataCenterIds") or list(spec.stock)
            place = next((dc for dc in wanted if spec.stock.get(dc, 0) >= count), None)
            if place is None:
                return 400, {"detail": NO_CAPACITY_DETAIL}
            spec.stock[place] -= count
            price = spec.price_secure if cloud == "SECURE" else spec.price_community
            pod = self._pod(name=body["name"], body=body, gpu=gpu, cpu=None, data_center=place,
                            cloud=cloud, cost=price * count)
            self._holds[pod["id"]] = (spec.id, place, count)
        self.pods[pod["id"]] = pod
        if self.start_running:
            self.set_status(pod["id"], "RUNNING")
        return 201, pod

    def delete(self, pod_id: str) -> bool:
        if self.pods.pop(pod_id, None) is None:
            return False
        hold = self._holds.pop(pod_id, None)
        if hold is not None:
            gpu_id, dc, count = hold
            self.gpus[gpu_id].stock[dc] = self.gpus[gpu_id].stock.get(dc, 0) + count
        return True

    def catalog(self, *, availability: bool, cloud: str, count: int) -> dict[str, Any]:
        gpus = []
        for spec in self.gpus.values():
            item: dict[str, Any] = {
                "id": spec.id, "name": spec.name, "pool": None, "manufacturer": "NVIDIA",
                "memory": spec.memory, "secure": spec.max_secure > 0,
                "community": spec.max_community > 0,
                "price": {"secure": spec.price_secure, "community": spec.price_community},
                "maxCount": {"secure": spec.max_secure, "community": spec.max_community},
            }
            if availability:
                offered = spec.offered(cloud)
                dcs = [
                    {"id": dc, "name": DATA_CENTER_NAMES.get(dc, dc),
                     "availability": _level(free, count)}
                    for dc, free in spec.stock.items()
                    if offered and _level(free, count) != "NONE"
                ]
                item["availability"] = max(
                    (d["availability"] for d in dcs),
                    key=["NONE", "LOW", "MEDIUM", "HIGH"].index, default="NONE",
                )
                if dcs:
                    item["dataCenters"] = dcs
            gpus.append(item)
        return {"gpus": gpus}

    def log_events(self, pod_id: str, *, source: str | None, tail: int,
                   since: str | None) -> Iterator[str]:
        lines = [e for e in self.logs.get(pod_id, []) if source is None or e["source"] == source]
        if since is not None:
            cutoff = datetime.fromisoformat(since)
            lines = [e for e in lines if datetime.fromisoformat(e["ts"]) >= cutoff]
        else:
            lines = lines[-tail:] if tail else []
        for seq, event in enumerate(lines, start=1):
            payload = json.dumps(event, separators=(",", ":"))
            yield f"id: {event['ts']}/{seq:012d}\ndata: {payload}\n\n"


def _problem(status: int, detail: str, *, title: str | None = None,
             errors: list[str] | None = None, headers: dict[str, str] | None = None) -> Response:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Spec Violation"
    body: dict[str, Any] = {"title": title or phrase, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type="application/problem+json",
                        headers=headers)


class _SpecValidation:
    """ASGI middleware: record, check the request, run the app, check the response, send."""

    def __init__(self, app: ASGIApp, *, fake: FakeRunPod, spec: _Spec) -> None:
        self.app = app
        self.fake = fake
        self.spec = spec

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method = scope["method"]
        # Match and validate the path as sent (still percent-encoded), as a real server routes it.
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").split("?")[0]
        query = parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        op = self.spec.operation(method, path)
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode(errors="replace")
        record = Recorded(method=method, path=path, operation=op.operation_id if op else None,
                          query=query, headers=headers, body=parsed)
        self.fake.requests.append(record)

        error = self._check_request(method, path, query, headers, body, op)
        if error is not None:
            await self._violation(record, "request", 0, error, send)
            return

        assert op is not None
        status, out_headers, chunks = await self._respond(scope, body, op, headers)
        data = b"".join(chunks)
        content_type = next((v.decode() for k, v in out_headers if k.lower() == b"content-type"),
                            None)
        mimetype = content_type.split(";")[0].strip() if content_type else None
        response = MockResponse(
            data, status_code=status,
            headers={k.decode(): v.decode() for k, v in out_headers},
            content_type=mimetype,  # type: ignore[arg-type]
        )
        try:
            self.spec.openapi.validate_response(self._openapi_request(
                method, path, query, headers, body), response)
        except Exception as exc:  # openapi-core raises many kinds; all are violations
            await self._violation(record, "response", status, _describe(exc), send)
            return
        record.status = status
        await send({"type": "http.response.start", "status": status, "headers": out_headers})
        await send({"type": "http.response.body", "body": data, "more_body": False})

    def _openapi_request(self, method: str, path: str, query: list[tuple[str, str]],
                         headers: dict[str, str], body: bytes) -> MockRequest:
        content_type = headers.get("content-type", "application/json").split(";")[0].strip()
        # A list of pairs keeps repeated query parameters (MockRequest hands it to a MultiDict).
        return MockRequest(HOST_URL, method, path, args=query,  # type: ignore[arg-type]
                           headers=headers, data=body or None, content_type=content_type)

    def _check_request(self, method: str, path: str, query: list[tuple[str, str]],
                       headers: dict[str, str], body: bytes, op: _Operation | None) -> str | None:
        if op is None:
            return f"{method} {path} is not an operation of the RunPod v2 spec"
        try:
            self.spec.openapi.validate_request(
                self._openapi_request(method, path, query, headers, body))
        except Exception as exc:  # openapi-core raises many kinds; all are violations
            return _describe(exc)
        undeclared = sorted({k for k, _ in query} - op.query_params)
        if undeclared:
            return f"{op.operation_id}: undeclared query parameter(s) {', '.join(undeclared)}"
        if op.operation_id not in IMPLEMENTED:
            return f"{op.operation_id} is in the spec but this fake does not implement it"
        return None

    async def _respond(self, scope: Scope, body: bytes, op: _Operation,
                       headers: dict[str, str]) -> tuple[int, list[tuple[bytes, bytes]],
                                                         list[bytes]]:
        if headers.get("authorization") != f"Bearer {self.fake.api_key}":
            return await self._run(_problem(401, "invalid bearer token"), scope, body)
        fault = self.fake.take_fault(op.operation_id)
        if fault is not None:
            extra = dict(fault.headers or {})
            if fault.retry_after is not None:
                extra["Retry-After"] = str(fault.retry_after)
            problem = _problem(fault.status, fault.detail, title=fault.title,
                               errors=fault.errors, headers=extra)
            return await self._run(problem, scope, body)
        return await self._run(self.app, scope, body)

    async def _run(self, app: ASGIApp, scope: Scope,
                   body: bytes) -> tuple[int, list[tuple[bytes, bytes]], list[bytes]]:
        sent = False
        finished = asyncio.Event()

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()  # the client stays connected until the response is whole
            return {"type": "http.disconnect"}

        status = 500
        out_headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal status, out_headers
            if message["type"] == "http.response.start":
                status = message["status"]
                out_headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    finished.set()

        try:
            await app(scope, replay, capture)
        except Exception as exc:  # the fake itself broke: that is a violation too
            finished.set()
            return VIOLATION_STATUS, [(b"content-type", b"text/plain")], [
                f"fake crashed: {type(exc).__name__}: {exc}".encode()]
        finished.set()
        return status, out_headers, chunks

    async def _violation(self, record: Recorded, kind: str, status: int, error: str,
                         send: Send) -> None:
        self.fake.violations.append(Violation(kind=kind, method=record.method, path=record.path,
                                              status=status, error=error))
        record.status = VIOLATION_STATUS
        response = _problem(VIOLATION_STATUS, f"spec violation ({kind}): {error}")

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await response({"type": "http"}, nothing, send)


def _describe(exc: Exception) -> str:
    parts = [f"{type(exc).__name__}: {exc}"]
    cause = exc.__cause__
    while cause is not None:
        errors = getattr(cause, "schema_errors", None)
        if errors:
            parts.extend(getattr(e, "message", str(e)) for e in errors)
        else:
            parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return " | ".join(p[:500] for p in parts)


def create_app(fake: FakeRunPod | None = None, *, specs_dir: str | Path | None = None) -> FastAPI:
    """A FastAPI app serving ``fake`` (a new one when None), validated against RunPod's spec.

    The state is at ``app.state.fake``.
    """
    fake = fake if fake is not None else FakeRunPod()
    spec = _load_spec(str(runpod_spec_path(specs_dir)))
    app = FastAPI(title="fake RunPod REST v2", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.fake = fake

    async def not_found(request: Request, exc: Exception) -> Response:
        return _problem(404, "resource not found")

    app.add_exception_handler(404, not_found)

    def ok(data: Any, status: int = 200) -> Response:
        return JSONResponse(data, status_code=status)

    @app.get("/v2/pods")
    async def list_pods(request: Request) -> Response:
        include_cluster = request.query_params.get("includeClusterPods") == "true"
        pods = [p for p in fake.pods.values() if include_cluster or "cluster" not in p]
        return ok({"pods": pods})

    @app.post("/v2/pods")
    async def create_pod(request: Request) -> Response:
        status, data = fake.create(await request.json())
        if status != 201:
            return _problem(status, data["detail"])
        return ok(data, status)

    @app.get("/v2/pods/{pod_id}")
    async def get_pod(pod_id: str) -> Response:
        pod = fake.pods.get(pod_id)
        if pod is None:
            return _problem(404, "pod not found")
        return ok(pod)

    @app.delete("/v2/pods/{pod_id}")
    async def delete_pod(pod_id: str) -> Response:
        if not fake.delete(pod_id):
            return _problem(404, "pod not found")
        return Response(status_code=204)

    @app.get("/v2/pods/{pod_id}/logs")
    async def pod_logs(pod_id: str, request: Request) -> Response:
        if pod_id not in fake.pods:
            return _problem(404, "pod not found")
        params = request.query_params
        since = request.headers.get("last-event-id", "").split("/")[0] or params.get("since")
        events = fake.log_events(pod_id, source=params.get("source"),
                                 tail=int(params.get("tail", "100")), since=since)
        return Response(
            "".join(events), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/v2/registries")
    async def list_registries() -> Response:
        return ok({"registries": [fake.registry_public(r) for r in fake.registries]})

    @app.post("/v2/registries")
    async def create_registry(request: Request) -> Response:
        body = await request.json()
        entry = fake.add_registry(name=body["name"], username=body["username"],
                                  password=body["password"])
        return ok(fake.registry_public(entry["id"]), 201)

    @app.get("/v2/registries/{registry_id}")
    async def get_registry(registry_id: str) -> Response:
        if registry_id not in fake.registries:
            return _problem(404, "container registry credential not found")
        return ok(fake.registry_public(registry_id))

    @app.delete("/v2/registries/{registry_id}")
    async def delete_registry(registry_id: str) -> Response:
        status = fake.delete_registry(registry_id)
        if status == 404:
            return _problem(404, "container registry credential not found")
        if status == 400:
            return _problem(400, "Registry credential is in use by a pod and cannot be deleted")
        return Response(status_code=204)

    @app.get("/v2/catalog/gpus")
    async def list_gpu_types(request: Request) -> Response:
        params = request.query_params
        include = [v for v in params.get("include", "").split(",") if v]
        products = [v for v in params.get("product", "").split(",") if v]
        if bool(include) != bool(products):
            return _problem(400, "product is required with include=AVAILABILITY, and only then")
        return ok(fake.catalog(availability=bool(include), cloud=params.get("cloud", "SECURE"),
                               count=int(params.get("count", "1"))))

    app.add_middleware(_SpecValidation, fake=fake, spec=spec)
    return app

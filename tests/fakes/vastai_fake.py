"""A fake Vast.ai API that checks every request and response against Vast.ai's published spec.

Why it exists: the Vast.ai adapter must speak the real API, and a contract test is only as good
as its fake. This fake serves the operations the adapter uses (search offers, rent an offer, list
instances, destroy, request logs) with in-memory state, and an ASGI middleware
(:class:`SpecValidation`, shared with the SaladCloud fake) validates EVERY request it receives
and EVERY response it sends against ``vastai/openapi.yaml`` with ``openapi-core``. A request or
response that does not validate is answered with status 599 and recorded in
:attr:`FakeVastAI.violations`; tests assert that list stays empty. The middleware is stricter
than the spec where a cloud would silently ignore a mistake: undeclared query parameters and
undeclared top-level body fields are violations too (Vast.ai's filter objects declare only some
of the operators the spec's description lists, so nested filter objects are not made strict).

The spec folder is :func:`tests.fakes.common.specs_dir` (the vendored ``tests/specs``).

Errata applied to the spec before validating (each a documented disagreement, not a shortcut):

* ``createInstance`` ``env``: the spec says a Docker-flag string; Vast.ai's guide and CLI send a
  dict (``{"K": "V", "-p 8000:8000": "1"}``). The fake accepts both (string or string-valued
  object), as the research notes ask.

Faults, in Vast.ai's own error format: :meth:`FakeVastAI.fail` queues an error for an operation
(``{"success": false, "error", "msg"}``, or ``{"detail"}`` where the spec documents that shape for
the status; optional headers such as ``Retry-After``). Statuses the spec does not document for an
operation (5xx anywhere, 429 on search) cannot be validated; they are allowed only when injected
(or for auth failures where the spec names no status) and are listed in
:attr:`FakeVastAI.unvalidated`. An empty offer list is "no capacity"; :meth:`FakeVastAI.take_offer`
simulates an offer rented by someone else between search and rent.

The log file Vast.ai uploads to S3 is served at ``/_s3/...`` (outside the spec, so not validated);
a request there that carries an ``Authorization`` header is a violation (the key must not leak).
"""

from __future__ import annotations

import base64
import copy
import functools
import itertools
import json
import os
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from jsonschema import Draft202012Validator
from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_core.exceptions import OpenAPIError
from openapi_core.templating.responses.exceptions import ResponseNotFound
from werkzeug.datastructures import Headers, ImmutableMultiDict

from tests.fakes.common import specs_dir

__all__ = [
    "API_KEY",
    "FAULT_HEADER",
    "VIOLATION_STATUS",
    "FakeVastAI",
    "Recorded",
    "SpecValidation",
    "ValidatedFake",
    "create_app",
    "find_operation",
    "load_spec",
    "specs_dir",
    "strict_schema",
]

API_KEY = "vast-test-key-0123456789abcdef"
SERVER = "https://console.vast.ai"  # the spec's server; requests are validated as if sent there
VIOLATION_STATUS = 599
#: A handler marks an injected fault (allowed to be undocumented) with this response header.
FAULT_HEADER = "x-fake-fault"
_S3_PREFIX = "/_s3/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@functools.lru_cache(maxsize=4)
def load_spec(path: str) -> tuple[dict[str, Any], OpenAPI]:
    """The spec as a dict (with the errata above) and its openapi-core validator (cached)."""
    with open(path, encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    spec = copy.deepcopy(spec)
    props = spec["paths"]["/api/v0/asks/{id}"]["put"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["properties"]
    env = props["env"]
    props["env"] = {
        "description": env.get("description", ""),
        "anyOf": [
            {"type": "string"},
            {"type": "object", "additionalProperties": {"type": "string"}},
        ],
    }
    # The spec itself was checked when it was saved; re-checking 10k lines costs seconds.
    return spec, OpenAPI.from_dict(spec, config=Config(spec_validator_cls=None))


@dataclass
class _ORequest:
    """An openapi-core Request built from the raw ASGI request."""

    host_url: str
    path: str
    method: str
    body: bytes | None
    content_type: str
    parameters: RequestParameters


@dataclass(frozen=True)
class _OResponse:
    """An openapi-core Response built from what the app sent."""

    status_code: int
    content_type: str
    headers: Headers
    data: bytes | None


@dataclass
class Recorded:
    """One request the fake received (the API key is reduced to whether it was present)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    authorized: bool
    status: int = 0


@dataclass
class _Fault:
    status: int
    error: str
    msg: str
    headers: dict[str, str] = field(default_factory=dict)


class ValidatedFake(Protocol):
    """What :class:`SpecValidation` needs from a fake (the Vast.ai and SaladCloud fakes)."""

    spec: dict[str, Any]
    openapi: OpenAPI
    server: str  # the spec's server URL scheme+host: requests are validated as if sent there
    base_path: str  # the path part of the spec's server URL ("" when none)
    exempt_prefix: str  # paths outside the API (not validated, not recorded); "" for none
    strict_depth: int | None  # see strict_schema
    implemented: set[tuple[str, str]]  # (method, spec path template)
    requests: list[Recorded]
    violations: list[str]
    unvalidated: list[str]

    def violation_body(self, text: str) -> dict[str, Any]: ...


class SpecValidation:
    """ASGI middleware: validate request and response against the spec; 599 on a violation.

    Beyond openapi-core's checks it rejects what the spec does not declare but a cloud would
    silently ignore: query parameters the operation does not list, and JSON body properties its
    schema does not name (see :func:`strict_schema`). Operations the fake does not implement are
    violations too. A response whose status the spec does not document for the operation is
    allowed only when the handler marked it as an injected fault (header :data:`FAULT_HEADER`,
    removed before sending); it is then listed in ``fake.unvalidated``. Shared by the SaladCloud
    fake.
    """

    def __init__(self, app: ASGIApp, fake: ValidatedFake) -> None:
        self.app = app
        self.fake = fake

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        method: str = scope["method"]
        path: str = scope["path"]
        headers = Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]])
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        record = Recorded(method=method, path=path, query=dict(query), body=_json_or_raw(body),
                          authorized="authorization" in headers)
        exempt = self.fake.exempt_prefix
        is_api = not (exempt and path.startswith(exempt))
        request = _ORequest(
            host_url=self.fake.server,
            path=path,
            method=method.lower(),
            body=body or None,
            content_type=headers.get("content-type", "").lower(),
            parameters=RequestParameters(query=ImmutableMultiDict(query), header=headers),
        )
        if is_api:
            self.fake.requests.append(record)
            problem = self._check_request(request, record)
            if problem is not None:
                await self._violation(send, record, f"request {method} {path}: {problem}")
                return

        sent: list[Message] = []
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def capture(message: Message) -> None:
            sent.append(message)

        await self.app(scope, replay, capture)
        start = next(m for m in sent if m["type"] == "http.response.start")
        out_body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        all_headers = list(start.get("headers", []))
        raw_headers = [(k, v) for k, v in all_headers if k.lower() != FAULT_HEADER.encode()]
        injected = len(raw_headers) != len(all_headers)
        status = int(start["status"])
        record.status = status
        if is_api:
            out_headers = Headers(
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers]
            )
            response = _OResponse(
                status_code=status,
                content_type=out_headers.get("content-type", "").lower(),
                headers=out_headers,
                data=out_body or None,
            )
            try:
                self.fake.openapi.validate_response(request, response)
            except ResponseNotFound:
                if not injected:
                    await self._violation(send, record, f"response {status} to {method} {path} "
                                          "is not in the spec and was not an injected fault")
                    return
                self.fake.unvalidated.append(f"{method} {path} -> {status}")
            except OpenAPIError as exc:
                await self._violation(send, record, f"response {status} to {method} {path}: {exc}")
                return
        await send({**start, "headers": raw_headers})
        await send({"type": "http.response.body", "body": out_body, "more_body": False})

    def _check_request(self, request: _ORequest, record: Recorded) -> str | None:
        base = self.fake.base_path
        if not request.path.startswith(base + "/"):
            return f"outside the spec's server path {base!r}"
        found = find_operation(self.fake.spec, request.method, request.path[len(base):])
        if found is None:
            return "no such operation in the spec"
        template, operation = found
        if (request.method, template) not in self.fake.implemented:
            return f"operation {operation.get('operationId')} is not implemented by the fake"
        try:
            self.fake.openapi.validate_request(request)
        except OpenAPIError as exc:
            return str(exc)
        declared = {p["name"] for p in _parameters(self.fake.spec, template, request.method)
                    if p.get("in") == "query"}
        extra = sorted(set(record.query) - declared)
        if extra:
            return f"query parameter(s) the spec does not declare: {', '.join(extra)}"
        strict = _strict_body_schema(self.fake.spec, template, request.method,
                                     self.fake.strict_depth)
        if strict is not None and record.body is not None:
            errors = sorted(Draft202012Validator(strict).iter_errors(record.body), key=str)
            if errors:
                return f"body field the spec does not declare: {errors[0].message}"
        return None

    async def _violation(self, send: Send, record: Recorded, text: str) -> None:
        self.fake.violations.append(text)
        record.status = VIOLATION_STATUS
        data = json.dumps(self.fake.violation_body(text)).encode()
        await send({
            "type": "http.response.start",
            "status": VIOLATION_STATUS,
            "headers": [(b"content-type", b"application/json")],
        })
        await send({"type": "http.response.body", "body": data, "more_body": False})


def find_operation(spec: Mapping[str, Any], method: str,
                   path: str) -> tuple[str, Mapping[str, Any]] | None:
    """``(path template, operation)`` for a concrete request path; literal segments win."""
    candidates = []
    for template, item in spec["paths"].items():
        if method.lower() not in item:
            continue
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            candidates.append((template.count("{"), template, item[method.lower()]))
    if not candidates:
        return None
    _, template, operation = min(candidates, key=lambda c: c[0])
    return template, operation


def _resolve(spec: Mapping[str, Any], node: Any) -> Any:
    while isinstance(node, Mapping) and "$ref" in node:
        target: Any = spec
        for part in str(node["$ref"]).lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def _parameters(spec: Mapping[str, Any], template: str, method: str) -> list[Mapping[str, Any]]:
    item = spec["paths"][template]
    params = list(item.get("parameters", [])) + list(item[method].get("parameters", []))
    return [_resolve(spec, p) for p in params]


def strict_schema(spec: Mapping[str, Any], schema: Any, *, depth: int | None = None) -> Any:
    """``schema`` with local $refs inlined and undeclared object properties forbidden.

    ``depth`` limits how many object levels are made strict (None: all). Vast.ai's search
    filters declare only some of the operators its description lists (``{"in": ...}`` but not
    ``eq``/``gte``...), so for Vast.ai only the top level of a body is strict.
    """
    schema = _resolve(spec, schema)
    if isinstance(schema, list):
        return [strict_schema(spec, s, depth=depth) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    if depth is not None and depth <= 0:
        return dict(schema)
    deeper = None if depth is None else depth - (1 if "properties" in schema else 0)
    out = {k: strict_schema(spec, v, depth=deeper)
           if k not in ("example", "examples", "default", "enum") else v
           for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and "allOf" not in out:
        out["additionalProperties"] = False
    return out


def _strict_body_schema(spec: Mapping[str, Any], template: str, method: str,
                        depth: int | None) -> Any | None:
    body = _resolve(spec, spec["paths"][template][method].get("requestBody"))
    if not isinstance(body, Mapping):
        return None
    schema = body.get("content", {}).get("application/json", {}).get("schema")
    return None if schema is None else strict_schema(spec, schema, depth=depth)


def _sort_key(key: str, item: Mapping[str, Any]) -> float:
    value = item.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _json_or_raw(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def _norm_gpu(name: str) -> str:
    return re.sub(r"[\s_]+", "_", name.strip()).lower()


def _country(geolocation: str) -> str:
    return geolocation.rsplit(",", 1)[-1].strip().upper()


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "gt": lambda a, b: a is not None and a > b,
    "gte": lambda a, b: a is not None and a >= b,
    "lt": lambda a, b: a is not None and a < b,
    "lte": lambda a, b: a is not None and a <= b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}

#: Columns the v1 list may filter on, per the spec ("stored directly on the contract record").
_FILTERABLE = {"actual_status", "gpu_name", "verification", "id", "label", "intended_status",
               "cur_state", "machine_id", "image_uuid"}
_COMPUTED = {"dph_total", "num_gpus", "dlperf", "dlperf_per_dphtotal", "flops_per_dphtotal"}
_SEARCH_NON_FILTERS = {"limit", "type", "order", "allocated_storage"}
_GPU_FIGURES = {"gpu_util", "gpu_temp", "gpu_ram", "gpu_totalram"}


class FakeVastAI:
    """The fake's state and knobs. ``app`` is the ASGI app to serve (or to wrap in a transport).

    * ``offers``: what search returns (add with :meth:`add_offer`; empty = no capacity)
    * ``instances``: rented instances by contract id (shape of a v1 list item; GPU figures
      with :meth:`set_gpu_figures`; ``ports``, Docker's map of the rent's ``-p`` entries to
      host ports counting up from 41000, is set while ``actual_status`` is ``running`` and
      null otherwise, as the spec says)
    * ``logs``: container log text per instance id
    * ``requests`` / ``violations`` / ``unvalidated``: what happened
    """

    def __init__(self, *, api_key: str = API_KEY, spec_path: Path | None = None) -> None:
        path = spec_path or specs_dir() / "vastai" / "openapi.yaml"
        self.spec, self.openapi = load_spec(str(path))
        self.api_key = api_key
        self.server = SERVER
        self.base_path = ""
        self.exempt_prefix = _S3_PREFIX
        self.strict_depth: int | None = 1  # filter objects list only some operators: see above
        self.offers: list[dict[str, Any]] = []
        self.instances: dict[int, dict[str, Any]] = {}
        self.logs: dict[int, str] = {}
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self.unvalidated: list[str] = []
        self.blob_polls_before_ready = 0
        self.unstartable: set[int] = set()  # offers whose rent answers 410 (cancel_unavail)
        self._faults: dict[str, deque[_Fault]] = {}
        self._ids = itertools.count(1000)
        self._offer_ids = itertools.count(50_000)
        self._machine_ids = itertools.count(700)
        self._host_ports = itertools.count(41000)
        self._blobs: dict[str, tuple[bytes, int]] = {}
        self.implemented = {
            ("post", "/api/v0/bundles"),
            ("put", "/api/v0/asks/{id}"),
            ("get", "/api/v1/instances"),
            ("delete", "/api/v0/instances/{id}"),
            ("put", "/api/v0/instances/request_logs/{id}"),
        }
        self.app = self._build()

    # -- knobs --------------------------------------------------------------------------------

    def add_offer(self, **fields: Any) -> dict[str, Any]:
        """Add an offer; unspecified fields get plausible values (one RTX 4090 in the US)."""
        offer = self._offer(**fields)
        self.offers.append(offer)
        return offer

    def _offer(self, **fields: Any) -> dict[str, Any]:
        offer: dict[str, Any] = {
            "id": next(self._offer_ids),
            "machine_id": next(self._machine_ids),
            "gpu_name": "RTX 4090",
            "num_gpus": 1,
            "dph_total": 0.5,
            "min_bid": 0.2,
            "geolocation": "California, US",
            "reliability": 0.99,
            "verified": True,
            "verification": "verified",
            "rentable": True,
            "rented": False,
            "direct_port_count": 20,
            "disk_space": 500.0,
            "cpu_cores_effective": 16.0,
            "cpu_ram": 65536,
            "public_ipaddr": "203.0.113.7",
        }
        offer.update(fields)
        offer.setdefault("ask_contract_id", offer["id"])
        return offer

    def take_offer(self, offer_id: int) -> None:
        """Someone else rented this offer: renting it now answers 404 ``no_such_ask``."""
        self.offers = [o for o in self.offers if o["id"] != offer_id]

    def add_instance(self, *, label: str | None, actual_status: str | None = "running",
                     **fields: Any) -> dict[str, Any]:
        """An instance made outside the adapter (another node's, a human's, or ours earlier)."""
        contract = next(self._ids)
        item = self._instance_item(contract, label=label, offer=self._offer(), body={})
        item["actual_status"] = actual_status
        item.update(fields)
        self.instances[contract] = item
        return item

    def set_status(self, contract: int, actual_status: str | None, *,
                   intended_status: str = "running", status_msg: str | None = None) -> None:
        item = self.instances[contract]
        item["actual_status"] = actual_status
        item["intended_status"] = intended_status
        item["status_msg"] = status_msg
        # "Port mappings. Only present on running instances."
        item["ports"] = self._port_map(item) if actual_status == "running" else None

    def _port_map(self, item: Mapping[str, Any]) -> dict[str, list[dict[str, str]]]:
        """Docker's map for the ``-p P:P[/udp]`` entries of the rent's env: each container port
        on a new host port, bound on IPv4 and IPv6 like Docker does."""
        mapped = dict(item.get("ports") or {})
        for key, _value in item.get("extra_env") or ():
            flag, _, publish = str(key).partition(" ")
            if flag != "-p" or ":" not in publish:
                continue
            container = publish.rsplit(":", 1)[1]
            container = container if "/" in container else f"{container}/tcp"
            if container not in mapped:
                host_port = str(next(self._host_ports))
                mapped[container] = [{"HostIp": "0.0.0.0", "HostPort": host_port},
                                     {"HostIp": "::", "HostPort": host_port}]
        return mapped

    def set_gpu_figures(self, contract: int, **figures: Any) -> None:
        """Set an instance's GPU figures as the list reports them: ``gpu_util`` (a fraction),
        ``gpu_temp`` (Celsius), ``gpu_ram``/``gpu_totalram`` (MB); None where not reported."""
        unknown = set(figures) - _GPU_FIGURES
        if unknown:
            raise ValueError(f"not a GPU figure of the instance list: {sorted(unknown)}")
        self.instances[contract].update(figures)

    def fail(self, operation: str, status: int, *, times: int = 1, error: str = "",
             msg: str = "", headers: Mapping[str, str] | None = None) -> None:
        """Answer the next ``times`` calls of ``operation`` (a spec operationId) with an error."""
        queue = self._faults.setdefault(operation, deque())
        for _ in range(times):
            queue.append(_Fault(status, error or _default_error(status),
                                msg or f"fake fault {status}", dict(headers or {})))

    def violation_body(self, text: str) -> dict[str, Any]:
        return {"success": False, "error": "spec_violation", "msg": text}

    def calls(self, method: str, path_prefix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    # -- the app ------------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI(title="fake Vast.ai")
        app.state.fake = self
        app.add_middleware(SpecValidation, fake=self)

        @app.post("/api/v0/bundles")
        async def search_offers(request: Request) -> Response:
            denied = self._gate(request, "searchOffers", "/api/v0/bundles", "post",
                                auth_status=404)
            if denied is not None:
                return denied
            query = await request.json()
            return JSONResponse({"offers": self._search(query)})

        @app.put("/api/v0/asks/{offer_id}")
        async def create_instance(offer_id: int, request: Request) -> Response:
            denied = self._gate(request, "createInstance", "/api/v0/asks/{id}", "put")
            if denied is not None:
                return denied
            body = await request.json()
            login = body.get("image_login")
            if login is not None and not _IMAGE_LOGIN.fullmatch(login):
                # the documented form (docker login flags, split on spaces); never echo it
                text = "createInstance: image_login is not '-u <user> -p <password> <registry>'"
                self.violations.append(text)
                return JSONResponse(status_code=VIOLATION_STATUS,
                                    content=self.violation_body(text))
            offer = next((o for o in self.offers if o["id"] == offer_id), None)
            if offer is None or not offer.get("rentable", True):
                return JSONResponse(status_code=404, content={
                    "success": False, "error": "invalid_args", "ask_id": offer_id,
                    "msg": f"error 404/3603: no_such_ask Instance type by id {offer_id} is not "
                    "available.",
                })
            if offer_id in self.unstartable and body.get("cancel_unavail"):
                return JSONResponse(status_code=410, content={
                    "success": False, "error": "no_such_ask", "ask_id": offer_id,
                    "msg": f"error 410/3907: no_such_ask Instance type {offer_id} is no longer "
                    "available.",
                })
            contract = next(self._ids)
            self.instances[contract] = self._instance_item(contract, label=body.get("label"),
                                                           offer=offer, body=body)
            self.take_offer(offer_id)
            return JSONResponse({"success": True, "new_contract": contract})

        @app.get("/api/v1/instances")
        async def show_instances(request: Request) -> Response:
            denied = self._gate(request, "showInstances", "/api/v1/instances", "get")
            if denied is not None:
                return denied
            return self._show_instances(request)

        @app.delete("/api/v0/instances/{contract}")
        async def destroy_instance(contract: int, request: Request) -> Response:
            denied = self._gate(request, "destroyInstance", "/api/v0/instances/{id}", "delete")
            if denied is not None:
                return denied
            if self.instances.pop(contract, None) is None:
                return JSONResponse(status_code=404, content={
                    "success": False, "error": "not_found", "msg": "Instance not found"})
            return JSONResponse({"success": True, "msg": "Instance destroyed successfully"})

        @app.put("/api/v0/instances/request_logs/{contract}")
        async def show_logs(contract: int, request: Request) -> Response:
            denied = self._gate(request, "showLogs", "/api/v0/instances/request_logs/{id}",
                                "put", auth_status=403)
            if denied is not None:
                return denied
            if contract not in self.instances:
                return JSONResponse(status_code=404, content={
                    "error": "invalid_id", "msg": "Invalid instance id."})
            raw = await request.body()
            body = json.loads(raw) if raw else {}
            lines = self.logs.get(contract, "").splitlines(keepends=True)
            if "tail" in body:
                tail = int(body["tail"])
                lines = lines[-tail:] if tail > 0 else []
            token = base64.urlsafe_b64encode(os.urandom(9)).decode()
            self._blobs[token] = ("".join(lines).encode(), self.blob_polls_before_ready)
            url = f"{str(request.base_url).rstrip('/')}{_S3_PREFIX}instance_logs/{token}.log"
            return JSONResponse({"success": True, "result_url": url,
                                 "msg": "logs will be uploaded shortly"})

        @app.get(_S3_PREFIX + "instance_logs/{token}.log")
        async def s3_blob(token: str, request: Request) -> Response:
            if "authorization" in request.headers:
                self.violations.append("the log file request carried an Authorization header")
            blob = self._blobs.get(token)
            if blob is None:
                return PlainTextResponse("NoSuchKey", status_code=404)
            data, polls_left = blob
            if polls_left > 0:
                self._blobs[token] = (data, polls_left - 1)
                return PlainTextResponse("NoSuchKey", status_code=404)
            return Response(content=data, media_type="text/plain")

        return app

    def _gate(self, request: Request, operation: str, path: str, method: str, *,
              auth_status: int = 401) -> Response | None:
        """Auth, then any queued fault; None lets the handler run."""
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return self._error(path, method, _Fault(auth_status, "auth_error", "Invalid user key"),
                               injected=str(auth_status) not in self._responses(path, method))
        queue = self._faults.get(operation)
        if queue:
            return self._error(path, method, queue.popleft(), injected=True)
        return None

    def _responses(self, path: str, method: str) -> Mapping[str, Any]:
        responses: Mapping[str, Any] = self.spec["paths"][path][method]["responses"]
        return responses

    def _error(self, path: str, method: str, fault: _Fault, *, injected: bool) -> Response:
        documented = self._responses(path, method).get(str(fault.status), {})
        schema = documented.get("content", {}).get("application/json", {}).get("schema", {})
        props = schema.get("properties", {})
        if "detail" in props and "success" not in props:
            content: dict[str, Any] = {"detail": fault.msg}
        elif props and "success" not in props:
            content = {"error": fault.error, "msg": fault.msg}
        else:
            content = {"success": False, "error": fault.error, "msg": fault.msg}
        headers = dict(fault.headers)
        if injected:
            headers[FAULT_HEADER] = "1"
        return JSONResponse(status_code=fault.status, content=content, headers=headers)

    # -- behaviour ----------------------------------------------------------------------------

    def _search(self, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        found = []
        for offer in self.offers:
            if all(self._matches(offer, key, cond) for key, cond in query.items()
                   if key not in _SEARCH_NON_FILTERS):
                found.append(offer)
        for key, direction in reversed(query.get("order") or []):
            found.sort(key=functools.partial(_sort_key, str(key)), reverse=direction == "desc")
        return [dict(o) for o in found[: int(query.get("limit") or 64)]]

    @staticmethod
    def _matches(offer: Mapping[str, Any], key: str, cond: Any) -> bool:
        if not isinstance(cond, Mapping):
            return True
        value = offer.get(key)
        for op, operand in cond.items():
            if key == "geolocation":
                value = _country(str(offer.get("geolocation", "")))
                operand = [o.upper() for o in operand] if isinstance(operand, list) else operand
            elif key == "gpu_name":
                value = _norm_gpu(str(value))
                operand = ([_norm_gpu(o) for o in operand] if isinstance(operand, list)
                           else _norm_gpu(str(operand)))
            if op not in _OPS or not _OPS[op](value, operand):
                return False
        return True

    def _instance_item(self, contract: int, *, label: str | None, offer: Mapping[str, Any],
                       body: Mapping[str, Any]) -> dict[str, Any]:
        env = body.get("env") or {}
        pairs = list(env.items()) if isinstance(env, Mapping) else _parse_env_string(str(env))
        return {
            "id": contract,
            "actual_status": "loading",
            "intended_status": "running",
            "cur_state": "running",
            "next_state": "running",
            "label": label,
            "image_uuid": body.get("image", "vastai/base-image"),
            "image_args": list(body.get("args") or []),
            "image_runtype": body.get("runtype", "ssh"),
            "extra_env": [[str(k), str(v)] for k, v in pairs],
            "onstart": body.get("onstart") or "",
            "status_msg": None,
            "public_ipaddr": offer.get("public_ipaddr", "203.0.113.7"),
            "machine_id": offer["machine_id"],
            "gpu_name": offer["gpu_name"],
            "num_gpus": offer["num_gpus"],
            # GPU figures: gpu_ram is the offer's per-GPU RAM (MB); gpu_totalram is modelled as
            # all GPUs' RAM, like an offer's gpu_total_ram (the spec does not say which). The
            # live figures are null until a test reports some (set_gpu_figures).
            "gpu_ram": int(offer.get("gpu_ram", 24576)),
            "gpu_totalram": int(offer.get("gpu_ram", 24576)) * int(offer["num_gpus"]),
            "gpu_util": None,
            "gpu_temp": None,
            "geolocation": offer["geolocation"],
            "dph_total": offer["dph_total"],
            "disk_space": float(body.get("disk") or 8.0),
            "start_date": time.time(),
            "ports": None,
            "verification": offer.get("verification", "verified"),
            "is_bid": "price" in body,
            "min_bid": offer.get("min_bid", 0.1),
        }

    def _show_instances(self, request: Request) -> Response:
        params = request.query_params
        limit = int(params.get("limit", "25"))
        limit = 5 if limit <= 0 else min(limit, 25)
        try:
            filters = json.loads(params.get("select_filters", "{}"))
            cols = json.loads(params.get("select_cols", '["*"]'))
            after = params.get("after_token")
            after_id = json.loads(base64.b64decode(after))["id"] if after else None
        except (ValueError, KeyError, TypeError):
            return JSONResponse(status_code=400, content={
                "error": "invalid_token", "msg": "Error in query parameters"})
        for column in filters:
            if column in _COMPUTED or column not in _FILTERABLE:
                return JSONResponse(status_code=400, content={
                    "error": "invalid_request",
                    "msg": f"Error in query parameters: {column} is not a valid search key"})
        matching = [item for _, item in sorted(self.instances.items())
                    if all(self._matches(item, c, cond) for c, cond in filters.items())]
        remaining = [i for i in matching if after_id is None or i["id"] > after_id]
        page = remaining[:limit]
        more = len(remaining) > limit
        token = (base64.b64encode(json.dumps({"id": page[-1]["id"]}).encode()).decode()
                 if more and page else None)
        if cols != ["*"]:
            page = [{c: item.get(c) for c in cols} for item in page]
        labels: dict[str, int] = {}
        for item in matching:
            labels[item.get("label") or ""] = labels.get(item.get("label") or "", 0) + 1
        return JSONResponse({
            "success": True,
            "instances_found": len(page),
            "total_instances": len(matching),
            "label_counts": labels,
            "next_token": token,
            "instances": page,
        })


def _parse_env_string(env: str) -> Iterable[tuple[str, str]]:
    """``-e K=V -p 8000:8000`` -> ``[("K", "V"), ("-p 8000:8000", "1")]`` (the CLI's reading)."""
    tokens = env.split()
    pairs: list[tuple[str, str]] = []
    for flag, value in itertools.pairwise(tokens):
        if flag == "-e" and "=" in value:
            key, _, val = value.partition("=")
            pairs.append((key, val))
        elif flag == "-p":
            pairs.append((f"-p {value}", "1"))
    return pairs


#: ``image_login`` as Vast.ai documents it: ``"-u username -p password docker.io"``.
_IMAGE_LOGIN = re.compile(r"-u \S+ -p \S+ \S+")


def _default_error(status: int) -> str:
    return {400: "invalid_args", 401: "auth_error", 403: "not_authorized", 404: "not_found",
            429: "rate_limit_exceeded"}.get(status, "server_error")


def create_app(*, api_key: str = API_KEY, spec_path: Path | None = None) -> FastAPI:
    """The fake as a FastAPI app; its state is ``app.state.fake`` (a :class:`FakeVastAI`)."""
    return FakeVastAI(api_key=api_key, spec_path=spec_path).app

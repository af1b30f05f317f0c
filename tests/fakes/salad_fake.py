"""A fake SaladCloud API that checks every request and response against Salad's published spec.

Why it exists: the SaladCloud adapter must speak the real API, and a contract test is only as
good as its fake. This fake serves the operations the adapter uses (container groups: list,
create, get, delete, start; GPU classes; GPU availability; log entries) under the spec's server
path ``/api/public``, with in-memory state. Every request it receives and every response it sends
is validated against ``salad/salad-cloud.yaml`` with ``openapi-core`` by the middleware shared
with the Vast.ai fake (:class:`tests.fakes.vastai_fake.SpecValidation`): a violation is answered
with status 599 and recorded in :attr:`FakeSalad.violations`; tests assert that list stays empty.
Request bodies are also checked for properties the spec does not declare, at every depth.

The spec folder is :func:`tests.fakes.common.specs_dir` (the vendored ``tests/specs``).

Errata applied to the spec before validating:

* ``CountryCode``: YAML 1.1 loaders read the enum entry ``no`` (Norway) as the boolean
  ``false``; the fake restores the string ``"no"``.

Faults, in SaladCloud's own error format (RFC 7807 ProblemDetails): :meth:`FakeSalad.fail` queues
an error for an operation (any status, optional headers such as ``Retry-After``, which Salad does
not document). No capacity is :attr:`FakeSalad.availability` at zero; a name that is taken
answers 409. Every operation documents a ``default`` response, so every fault validates.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from openapi_core import Config, OpenAPI

from tests.fakes.vastai_fake import FAULT_HEADER, Recorded, SpecValidation, specs_dir

__all__ = [
    "API_KEY",
    "BASE_PATH",
    "FakeSalad",
    "create_app",
    "default_gpu_classes",
    "dumps_meta",
    "load_spec",
]

API_KEY = "salad-test-key-0123456789abcdef"
SERVER = "https://api.salad.com"
BASE_PATH = "/api/public"  # the path part of the spec's server URL

_CLAUSE = re.compile(r'^\s*([a-z_.]+)\s*=\s*"([^"]*)"\s*$')


@functools.lru_cache(maxsize=4)
def load_spec(path: str) -> tuple[dict[str, Any], OpenAPI]:
    """The spec as a dict (with the errata above) and its openapi-core validator (cached)."""
    with open(path, encoding="utf-8") as fh:
        spec = copy.deepcopy(yaml.safe_load(fh))
    codes = spec["components"]["schemas"]["CountryCode"]["enum"]
    spec["components"]["schemas"]["CountryCode"]["enum"] = [
        "no" if code is False else code for code in codes
    ]
    return spec, OpenAPI.from_dict(spec, config=Config(spec_validator_cls=None))


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass
class _Fault:
    status: int
    title: str
    detail: str
    headers: dict[str, str] = field(default_factory=dict)


def default_gpu_classes() -> list[dict[str, Any]]:
    """Three GPU classes with prices for every priority (fixed ids, so tests can name them)."""

    def prices(high: float) -> list[dict[str, str]]:
        return [
            {"priority": "high", "price": f"{high:.3f}"},
            {"priority": "medium", "price": f"{high * 0.8:.3f}"},
            {"priority": "low", "price": f"{high * 0.6:.3f}"},
            {"priority": "batch", "price": f"{high * 0.4:.3f}"},
        ]

    return [
        {"id": "ed563892-aacd-40f5-80b7-90c9be6c759b", "name": "RTX 4090 (24 GB)",
         "gpu_class_type": "community", "prices": prices(0.30), "is_high_demand": True},
        {"id": "a5db5c50-cbcb-4596-ae80-6a0c8090d80f", "name": "RTX 3090 (24 GB)",
         "gpu_class_type": "community", "prices": prices(0.18), "is_high_demand": False},
        {"id": "0b7fd5aa-38e1-4c2b-8d3c-6fd0aa2b0f11", "name": "A100 (80 GB)",
         "gpu_class_type": "secure", "prices": prices(1.20), "is_high_demand": False},
    ]


class FakeSalad:
    """The fake's state and knobs. ``app`` is the FastAPI app to serve.

    * ``groups``: container groups by name (the ContainerGroup shape)
    * ``gpu_classes``: what ``/gpu-classes`` lists
    * ``availability``: free nodes per GPU class id and priority (default 5 each)
    * ``logs``: log entries of the organization (add with :meth:`add_log`)
    * ``created_status``: the status a new group starts in (``"pending"``; ``"stopped"`` models
      a group that did not start on its own)
    * ``requests`` / ``violations`` / ``unvalidated``: what happened
    """

    def __init__(self, *, organization: str = "acme", project: str = "gpu",
                 api_key: str = API_KEY, spec_path: Path | None = None) -> None:
        path = spec_path or specs_dir() / "salad" / "salad-cloud.yaml"
        self.spec, self.openapi = load_spec(str(path))
        self.organization = organization
        self.project = project
        self.api_key = api_key
        self.server = SERVER
        self.base_path = BASE_PATH
        self.exempt_prefix = ""
        self.strict_depth: int | None = None
        self.groups: dict[str, dict[str, Any]] = {}
        self.gpu_classes = default_gpu_classes()
        self.availability: dict[str, dict[str, int]] = {
            c["id"]: dict.fromkeys(("high", "medium", "low", "batch"), 5)
            for c in self.gpu_classes
        }
        self.logs: list[dict[str, Any]] = []
        self.created_status = "pending"
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self.unvalidated: list[str] = []
        self.implemented = {
            ("get", "/organizations/{organization_name}/projects/{project_name}/containers"),
            ("post", "/organizations/{organization_name}/projects/{project_name}/containers"),
            ("get", "/organizations/{organization_name}/projects/{project_name}/containers/"
                    "{container_group_name}"),
            ("delete", "/organizations/{organization_name}/projects/{project_name}/containers/"
                       "{container_group_name}"),
            ("post", "/organizations/{organization_name}/projects/{project_name}/containers/"
                     "{container_group_name}/start"),
            ("get", "/organizations/{organization_name}/gpu-classes"),
            ("post", "/organizations/{organization_name}/availability/sce-gpu-availability"),
            ("post", "/organizations/{organization_name}/log-entries"),
        }
        self._faults: dict[str, deque[_Fault]] = {}
        self._last_log = datetime.min.replace(tzinfo=UTC)
        self.app = self._build()

    # -- knobs --------------------------------------------------------------------------------

    def fail(self, operation: str, status: int, *, times: int = 1, title: str = "",
             detail: str = "", headers: Mapping[str, str] | None = None) -> None:
        """Answer the next ``times`` calls of ``operation`` (a spec operationId) with an error."""
        queue = self._faults.setdefault(operation, deque())
        for _ in range(times):
            queue.append(_Fault(status, title or _TITLES.get(status, "Error"),
                                detail or f"fake fault {status}", dict(headers or {})))

    def add_group(self, *, name: str, env: Mapping[str, str] | None = None,
                  status: str = "running", gpu_classes: list[str] | None = None,
                  running_count: int = 1) -> dict[str, Any]:
        """A container group made outside the adapter (another node's, a human's, ours earlier)."""
        group = self._group({
            "name": name,
            "autostart_policy": True,
            "replicas": 1,
            "restart_policy": "never",
            "container": {
                "image": "busybox:latest",
                "resources": {"cpu": 1, "memory": 1024, "gpu_classes": gpu_classes or []},
                "environment_variables": dict(env or {}),
            },
        })
        self.groups[name] = group
        self.set_state(name, status, running_count=running_count if status == "running" else 0)
        return group

    def set_state(self, name: str, status: str, *, running_count: int = 0,
                  allocating_count: int = 0, creating_count: int = 0,
                  description: str | None = None) -> None:
        state = self.groups[name]["current_state"]
        state["status"] = status
        state["instance_status_counts"] = {
            "allocating_count": allocating_count,
            "creating_count": creating_count,
            "running_count": running_count,
            "stopping_count": 0,
        }
        if description is None:
            state.pop("description", None)
        else:
            state["description"] = description
        if status in ("succeeded", "failed", "stopped"):
            state["finish_time"] = _iso(_now())

    def add_log(self, group: str, text: str | None = None, *,
                json_log: Mapping[str, Any] | None = None, at: datetime | None = None,
                project: str | None = None) -> dict[str, Any]:
        """One container log entry of ``group`` (default time: now, strictly after the last)."""
        when = at or max(_now(), self._last_log + timedelta(microseconds=1))
        self._last_log = max(self._last_log, when)
        entry: dict[str, Any] = {
            "time": _iso(when),
            "receive_time": _iso(when + timedelta(milliseconds=50)),
            "severity": "info",
            "resource": {"type": "container", "labels": {
                "organization_name": self.organization,
                "project_name": project or self.project,
                "container_group_name": group,
                "instance_id": "db3a4591-efc3-46c0-b06a-3d820c0ec100",
            }},
        }
        if json_log is not None:
            entry["json_log"] = dict(json_log)
        else:
            entry["text_log"] = text or ""
        self.logs.append(entry)
        return entry

    def calls(self, method: str, path_suffix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.endswith(path_suffix)]

    def violation_body(self, text: str) -> dict[str, Any]:
        return {"type": "about:blank", "title": "Spec Violation", "status": 599,
                "detail": text[:2000]}

    # -- the app ------------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI(title="fake SaladCloud")
        app.state.fake = self
        app.add_middleware(SpecValidation, fake=self)
        org = BASE_PATH + "/organizations/{org}"
        groups = org + "/projects/{project}/containers"

        @app.get(groups)
        async def list_container_groups(org: str, project: str, request: Request) -> Response:
            denied = self._gate(request, "list_container_groups", org, project)
            if denied is not None:
                return denied
            return JSONResponse({"items": [copy.deepcopy(g) for g in self.groups.values()]})

        @app.post(groups)
        async def create_container_group(org: str, project: str, request: Request) -> Response:
            denied = self._gate(request, "create_container_group", org, project)
            if denied is not None:
                return denied
            body = await request.json()
            if body["name"] in self.groups:
                return _problem(409, "Conflict", f"container group {body['name']} exists")
            known = {c["id"] for c in self.gpu_classes}
            unknown = set(body["container"]["resources"].get("gpu_classes") or ()) - known
            if unknown:
                return _problem(400, "Bad Request", f"unknown GPU classes {sorted(unknown)}")
            group = self._group(body)
            self.groups[group["name"]] = group
            return JSONResponse(
                copy.deepcopy(group), status_code=201,
                headers={"Location": f"/organizations/{org}/projects/{project}/containers/"
                                     f"{group['name']}"},
            )

        @app.get(groups + "/{name}")
        async def get_container_group(org: str, project: str, name: str,
                                      request: Request) -> Response:
            denied = self._gate(request, "get_container_group", org, project)
            if denied is not None:
                return denied
            group = self.groups.get(name)
            if group is None:
                return _problem(404, "Not Found", "The container group could not be found.")
            return JSONResponse(copy.deepcopy(group))

        @app.delete(groups + "/{name}")
        async def delete_container_group(org: str, project: str, name: str,
                                         request: Request) -> Response:
            denied = self._gate(request, "delete_container_group", org, project)
            if denied is not None:
                return denied
            if self.groups.pop(name, None) is None:
                return _problem(404, "Not Found", "The container group could not be found.")
            return Response(status_code=202)

        @app.post(groups + "/{name}/start")
        async def start_container_group(org: str, project: str, name: str,
                                        request: Request) -> Response:
            denied = self._gate(request, "start_container_group", org, project)
            if denied is not None:
                return denied
            group = self.groups.get(name)
            if group is None:
                return _problem(404, "Not Found", "The container group could not be found.")
            if group["current_state"]["status"] != "stopped":
                return _problem(400, "Bad Request", "The container group is not stopped.")
            group["current_state"]["status"] = "pending"
            return Response(status_code=202)

        @app.get(org + "/gpu-classes")
        async def list_gpu_classes(org: str, request: Request) -> Response:
            denied = self._gate(request, "list_gpu_classes", org, None)
            if denied is not None:
                return denied
            return JSONResponse({"items": copy.deepcopy(self.gpu_classes)})

        @app.post(org + "/availability/sce-gpu-availability")
        async def get_gpu_availability(org: str, request: Request) -> Response:
            denied = self._gate(request, "get_gpu_availability", org, None)
            if denied is not None:
                return denied
            body = await request.json()
            totals = dict.fromkeys(("high", "medium", "low", "batch"), 0)
            for class_id in body["gpu_classes"]:
                for priority, count in self.availability.get(class_id, {}).items():
                    totals[priority] += count
            return JSONResponse({f"available_gpu_{p}": n for p, n in totals.items()})

        @app.post(org + "/log-entries")
        async def query_log_entries(org: str, request: Request) -> Response:
            denied = self._gate(request, "query_log_entries", org, None)
            if denied is not None:
                return denied
            return self._query_logs(await request.json())

        return app

    def _gate(self, request: Request, operation: str, org: str,
              project: str | None) -> Response | None:
        """Auth, organization/project, then any queued fault; None lets the handler run."""
        if request.headers.get("salad-api-key") != self.api_key:
            return _problem(401, "Unauthorized", "The API key is not valid.")
        if org != self.organization or (project is not None and project != self.project):
            return _problem(404, "Not Found", "The organization or project could not be found.")
        queue = self._faults.get(operation)
        if queue:
            fault = queue.popleft()
            response = _problem(fault.status, fault.title, fault.detail)
            response.headers.update(fault.headers)
            response.headers[FAULT_HEADER] = "1"
            return response
        return None

    # -- behaviour ----------------------------------------------------------------------------

    def _group(self, body: Mapping[str, Any]) -> dict[str, Any]:
        now = _iso(_now())
        container = body["container"]
        resources = dict(container["resources"])
        resources.setdefault("gpu_classes", [])
        out_container: dict[str, Any] = {
            "image": container["image"],
            "command": container.get("command"),
            "resources": resources,
            "environment_variables": dict(container.get("environment_variables") or {}),
        }
        name = str(body["name"])
        group: dict[str, Any] = {
            "id": str(uuid.uuid4()),
            "name": name,
            "display_name": body.get("display_name") or name,
            "organization_name": self.organization,
            "project_name": self.project,
            "autostart_policy": body["autostart_policy"],
            "container": out_container,
            "country_codes": list(body.get("country_codes") or []),
            "create_time": now,
            "update_time": now,
            "current_state": {
                "status": self.created_status,
                "start_time": now,
                "finish_time": now,
                "instance_status_counts": {"allocating_count": 0, "creating_count": 0,
                                           "running_count": 0, "stopping_count": 0},
            },
            "pending_change": False,
            "priority": container.get("priority") or "high",
            "replicas": body["replicas"],
            "restart_policy": body["restart_policy"],
            "version": 1,
            "scheduled-scaling-enabled": False,
            "scaling-actions": [],
        }
        networking = body.get("networking")
        if networking:
            group["networking"] = {
                "protocol": networking["protocol"],
                "port": networking["port"],
                "auth": networking["auth"],
                "load_balancer": networking.get("load_balancer", "round_robin"),
                "dns": f"{name[:50]}-{uuid.uuid4().hex[:6]}.salad.cloud",
            }
        return group

    def _query_logs(self, body: Mapping[str, Any]) -> Response:
        clauses: dict[str, str] = {}
        for part in str(body["query"]).split(" AND "):
            match = _CLAUSE.match(part)
            if match is None:
                return _problem(400, "Bad Request", f"the fake cannot parse the query {part!r}")
            clauses[match.group(1)] = match.group(2)
        start, end = _parse(body["start_time"]), _parse(body["end_time"])

        def matches(entry: Mapping[str, Any]) -> bool:
            for key, value in clauses.items():
                if key == "resource.type":
                    actual = entry["resource"]["type"]
                elif key.startswith("resource.labels."):
                    actual = entry["resource"]["labels"].get(key.removeprefix("resource.labels."))
                else:
                    actual = entry.get(key)
                if actual != value:
                    return False
            return start <= _parse(entry["time"]) <= end

        found = sorted((e for e in self.logs if matches(e)), key=lambda e: _parse(e["time"]),
                       reverse=body.get("sort_order", "desc") == "desc")
        page = found[: int(body.get("page_size") or 100)]
        times = [e["time"] for e in page] or [body["start_time"], body["end_time"]]
        return JSONResponse({
            "items": copy.deepcopy(page),
            "organization_name": self.organization,
            "page_min_time": min(times, key=_parse),
            "page_max_time": max(times, key=_parse),
        })


_TITLES = {400: "Bad Request", 401: "Unauthorized", 402: "Payment Required", 403: "Forbidden",
           404: "Not Found", 409: "Conflict", 429: "Too Many Requests",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


def _problem(status: int, title: str, detail: str) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status,
        media_type="application/json",
    )


def create_app(*, organization: str = "acme", project: str = "gpu", api_key: str = API_KEY,
               spec_path: Path | None = None) -> FastAPI:
    """The fake as a FastAPI app; its state is ``app.state.fake`` (a :class:`FakeSalad`)."""
    return FakeSalad(organization=organization, project=project, api_key=api_key,
                     spec_path=spec_path).app


def dumps_meta(meta: Mapping[str, Any]) -> str:
    """The ``VKPROVIDER_INSTANCE`` value a group made by the adapter would carry."""
    return json.dumps(dict(meta), separators=(",", ":"), sort_keys=True)

"""The mock cloud's HTTP API: a FastAPI app over a :class:`~providers.mock.state.MockCloudState`.

Why it exists: adapters talk to clouds over HTTP, so the mock must too; this module is only the
HTTP face (routes, admission as a dependency, bodies parsed after admission, errors as
``{"error": {"code", "message"}}``); what the cloud does lives in the state. The endpoints are
listed in :mod:`providers.mock.server`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import orjson
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse as _StdJSONResponse
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from providers.mock.bodies import (
    ConfigBody,
    CreateBody,
    ExitBody,
    FailBody,
    FaultBody,
    HealthBody,
    InterruptionBody,
    InventoryBody,
    LoadBody,
    RegistryBody,
    TemperatureBody,
)
from providers.mock.errors import LostResponse, MockCloudError, describe_errors
from providers.mock.scenario import ScenarioError, parse_scenario
from providers.mock.state import InventoryOffer, MockCloudState


class JSONResponse(_StdJSONResponse):
    """Starlette's JSON response, encoded with orjson: a 5,000-instance list (the provider's
    sweep asks for one every 5 s) took the stdlib encoder ~6% of the mock's CPU in a burst.
    Keys that are not strings (ports, in the admin API's counts) become strings, as there."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)

__all__ = ["create_app"]

_Body = TypeVar("_Body", bound=BaseModel)


async def _json_body(request: Request) -> Any:
    """The request's JSON body; a 422 naming ``body`` when it is not JSON."""
    try:
        return await request.json()
    except ValueError:
        raise MockCloudError(
            status=422, code="invalid_spec", message="body: not valid JSON"
        ) from None


async def _parse_body(request: Request, model: type[_Body]) -> _Body:
    """The request's JSON body as ``model``; parsed after admission so auth is checked first."""
    raw = await _json_body(request)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise MockCloudError(
            status=422, code="invalid_spec", message=describe_errors(exc.errors())
        ) from None


def _error_response(error: MockCloudError) -> JSONResponse:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = format(error.retry_after, "g")
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(
        {"error": {"code": error.code, "message": error.message}},
        status_code=error.status,
        headers=headers,
    )


class _Disconnect(Response):
    """Starts a 201 answer, sends half of it and stops: the server drops the connection.

    Over real HTTP (uvicorn) the client sees the connection closed mid-response; through
    ``httpx.ASGITransport`` it sees a truncated body. Uvicorn logs the incomplete response.
    """

    def __init__(self) -> None:
        super().__init__(status_code=201)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"id": ', "more_body": True})


def _parse_tag_filters(raw: list[str]) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MockCloudError(
                status=400, code="invalid_request", message="a tag filter is key=value"
            )
        tags[key] = value
    return tags


def create_app(*, state: MockCloudState) -> FastAPI:
    """The mock cloud's HTTP API over ``state`` (see the module docstring)."""
    # FastAPI's native OpenTelemetry hook asks on every request whether a global provider is
    # set; the mock cloud never exports telemetry, so it is off (2.7% of its CPU in a burst).
    app = FastAPI(
        title="vkprovider mock GPU cloud", docs_url=None, redoc_url=None, openapi_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )

    async def on_cloud_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MockCloudError)
        if isinstance(exc, LostResponse) and exc.mode == "disconnect":
            return _Disconnect()
        return _error_response(exc)

    async def on_validation_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _error_response(
            MockCloudError(status=422, code="invalid_spec", message=describe_errors(exc.errors()))
        )

    async def on_http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = "not_found" if exc.status_code == 404 else "http_error"
        return _error_response(
            MockCloudError(status=exc.status_code, code=code, message=str(exc.detail))
        )

    app.add_exception_handler(MockCloudError, on_cloud_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)

    # Admission (count, auth, faults) comes before query and body validation, so an
    # unauthenticated request gets 401 whatever it sends: a route dependency where FastAPI
    # validates parameters, a call at the top of the handler on the two per-pod routes (create,
    # delete), whose handlers read their input themselves; resolving a dependency was a tenth
    # of the mock cloud's CPU in a 3,000-pod burst (bench/burst.py --profile).
    async def admit(request: Request, endpoint: str) -> None:
        hang = state.admit(endpoint=endpoint, authorization=request.headers.get("authorization"))
        if hang > 0:
            await state.sleep(hang)

    def admitted(endpoint: str) -> Any:
        async def admit_first(request: Request) -> None:
            await admit(request, endpoint)

        return Depends(admit_first)

    async def admin(request: Request) -> None:
        if not state.authorized(request.headers.get("authorization")):
            raise MockCloudError(
                status=401, code="unauthorized", message="missing or invalid API key"
            )

    admin_only = [Depends(admin)]

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.get("/capacity", dependencies=[admitted("capacity")])
    async def capacity() -> JSONResponse:
        return JSONResponse({"offers": state.capacity()})

    @app.post("/instances")
    async def create_instance(request: Request) -> JSONResponse:
        await admit(request, "create")
        body = await _parse_body(request, CreateBody)
        instance, created = state.create(body)
        return JSONResponse(instance, status_code=201 if created else 200)

    @app.get("/instances", dependencies=[admitted("list")])
    async def list_instances(
        tag: list[str] = Query(default_factory=list),  # noqa: B008
        name: str | None = None,
    ) -> JSONResponse:
        instances = state.list_instances(tags=_parse_tag_filters(tag), name=name)
        return JSONResponse({"instances": instances})

    @app.get("/instances/{instance_id}", dependencies=[admitted("get")])
    async def get_instance(instance_id: str) -> JSONResponse:
        return JSONResponse(state.get(instance_id))

    @app.delete("/instances/{instance_id}")
    async def delete_instance(request: Request, instance_id: str) -> Response:
        await admit(request, "delete")
        instance = state.delete(instance_id)
        if instance is None:
            return Response(status_code=204)
        return JSONResponse(instance, status_code=202)

    @app.post("/instances/{instance_id}/restart", dependencies=[admitted("restart")])
    async def restart_instance(instance_id: str) -> JSONResponse:
        return JSONResponse(state.restart(instance_id))

    @app.get("/instances/{instance_id}/logs", dependencies=[admitted("logs")])
    async def logs(
        request: Request,
        instance_id: str,
        tail_lines: int | None = Query(default=None, ge=0),
        since_seconds: int | None = Query(default=None, ge=0),
        timestamps: bool = False,
        limit_bytes: int | None = Query(default=None, ge=1),
        follow: bool = False,
    ) -> StreamingResponse:
        view, done = state.log_view(instance_id)  # 404 before the stream starts
        start = 0
        if since_seconds is not None:
            start = view.first_at_or_after(state.now() - since_seconds)
        if tail_lines is not None:
            start = max(start, len(view) - tail_lines)

        async def stream() -> AsyncIterator[bytes]:
            budget = limit_bytes
            current, finished, index = view, done, start
            deadline = state.now() + state.follow_max_seconds
            while True:
                chunk = b"".join(
                    state.format_line(current[i], timestamps=timestamps)
                    for i in range(index, len(current))
                )
                index = len(current)
                if budget is not None:
                    chunk = chunk[:budget]
                    budget -= len(chunk)
                if chunk:
                    yield chunk
                if not follow or finished or budget == 0 or state.now() >= deadline:
                    return
                await state.sleep(state.follow_poll_interval)
                if await request.is_disconnected():
                    return
                try:
                    current, finished = state.log_view(instance_id)
                except MockCloudError:
                    return  # deleted while following

        return StreamingResponse(stream(), media_type="text/plain; charset=utf-8")

    @app.get("/instances/{instance_id}/metrics", dependencies=[admitted("metrics")])
    async def metrics(instance_id: str) -> JSONResponse:
        return JSONResponse(state.metrics(instance_id))

    @app.get("/gpu-metrics", dependencies=[admitted("metrics")])
    async def metrics_all(
        tag: list[str] = Query(default_factory=list),  # noqa: B008
    ) -> JSONResponse:
        return JSONResponse({"instances": state.metrics_all(tags=_parse_tag_filters(tag))})

    # -- admin ------------------------------------------------------------------------------

    @app.post("/admin/instances/{instance_id}/fail", dependencies=admin_only)
    async def admin_fail(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, FailBody)
        state.fail(instance_id, message=body.message, exit_code=body.exit_code)
        return JSONResponse(state.get(instance_id))

    @app.post("/admin/instances/{instance_id}/exit", dependencies=admin_only)
    async def admin_exit(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, ExitBody)
        state.exit(instance_id, exit_code=body.exit_code)
        return JSONResponse(state.get(instance_id))

    @app.post("/admin/instances/{instance_id}/load", dependencies=admin_only)
    async def admin_load(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, LoadBody)
        state.set_load(instance_id, gpu_utilization=body.gpu_utilization)
        return JSONResponse(state.get(instance_id))

    @app.post("/admin/instances/{instance_id}/temperature", dependencies=admin_only)
    async def admin_temperature(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, TemperatureBody)
        state.set_temperature(instance_id, celsius=body.celsius)
        return JSONResponse(state.get(instance_id))

    @app.post("/admin/instances/{instance_id}/health", dependencies=admin_only)
    async def admin_health(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, HealthBody)
        return JSONResponse(state.set_health(instance_id, live=body.live, ready=body.ready))

    @app.post("/admin/instances/{instance_id}/interruption", dependencies=admin_only)
    async def admin_interruption(request: Request, instance_id: str) -> JSONResponse:
        body = await _parse_body(request, InterruptionBody)
        return JSONResponse(state.announce_interruption(instance_id, in_seconds=body.in_seconds))

    @app.post("/admin/instances/{instance_id}/interrupt", dependencies=admin_only)
    async def admin_interrupt(instance_id: str) -> JSONResponse:
        return JSONResponse(state.interrupt(instance_id))

    @app.get("/admin/traffic", dependencies=admin_only)
    async def admin_traffic() -> JSONResponse:
        return JSONResponse(state.traffic())

    @app.get("/admin/listeners", dependencies=admin_only)
    async def admin_listeners() -> JSONResponse:
        return JSONResponse(state.listener_json())

    def inventory_json() -> dict[str, Any]:
        return {
            "offers": [
                {
                    "gpu_type": o.gpu_type,
                    "region": o.region,
                    "count": o.count,
                    "price_per_gpu_hour": o.price_per_gpu_hour,
                    "spot_price_per_gpu_hour": o.spot_price_per_gpu_hour,
                }
                for o in state.inventory()
            ]
        }

    @app.get("/admin/inventory", dependencies=admin_only)
    async def admin_get_inventory() -> JSONResponse:
        return JSONResponse(inventory_json())

    @app.put("/admin/inventory", dependencies=admin_only)
    async def admin_put_inventory(request: Request) -> JSONResponse:
        body = await _parse_body(request, InventoryBody)
        try:
            state.set_inventory(InventoryOffer(**o.model_dump()) for o in body.offers)
        except ValueError as exc:
            raise MockCloudError(status=400, code="invalid_request", message=str(exc)) from None
        return JSONResponse(inventory_json())

    @app.get("/admin/registries", dependencies=admin_only)
    async def admin_get_registries() -> JSONResponse:
        return JSONResponse({"private": state.private_registries()})

    @app.put("/admin/registries/{host}", dependencies=admin_only)
    async def admin_put_registry(request: Request, host: str) -> JSONResponse:
        body = await _parse_body(request, RegistryBody)
        state.set_private_registry(host, username=body.username,
                                   password=body.password.get_secret_value())
        return JSONResponse({"private": state.private_registries()})

    @app.delete("/admin/registries/{host}", dependencies=admin_only)
    async def admin_delete_registry(host: str) -> JSONResponse:
        state.remove_private_registry(host)
        return JSONResponse({"private": state.private_registries()})

    @app.get("/admin/config", dependencies=admin_only)
    async def admin_get_config() -> JSONResponse:
        return JSONResponse(state.config())

    @app.patch("/admin/config", dependencies=admin_only)
    async def admin_patch_config(request: Request) -> JSONResponse:
        body = await _parse_body(request, ConfigBody)
        fields = body.model_fields_set
        if "boot_delay" in fields:
            state.boot_delay = body.boot_delay or 0.0
        if "delete_delay" in fields:
            state.delete_delay = body.delete_delay or 0.0
        if "quota_gpus" in fields:
            state.quota_gpus = body.quota_gpus
        if "max_gpus_per_instance" in fields and body.max_gpus_per_instance is not None:
            state.max_gpus_per_instance = body.max_gpus_per_instance
        if "load_seconds" in fields:
            state.load_seconds = body.load_seconds or 0.0
        return JSONResponse(state.config())

    @app.get("/admin/faults", dependencies=admin_only)
    async def admin_get_faults() -> JSONResponse:
        return JSONResponse({"faults": [f.to_json() for f in state.faults.pending()]})

    @app.post("/admin/faults", dependencies=admin_only)
    async def admin_add_fault(request: Request) -> JSONResponse:
        body = await _parse_body(request, FaultBody)
        try:
            state.faults.add(
                endpoint=body.endpoint,
                status=body.status,
                count=body.count,
                retry_after=body.retry_after,
            )
        except ValueError as exc:
            raise MockCloudError(status=400, code="invalid_request", message=str(exc)) from None
        return JSONResponse(
            {"faults": [f.to_json() for f in state.faults.pending()]}, status_code=201
        )

    @app.delete("/admin/faults", dependencies=admin_only)
    async def admin_clear_faults() -> Response:
        state.faults.clear()
        return Response(status_code=204)

    @app.get("/admin/scenario", dependencies=admin_only)
    async def admin_get_scenario() -> JSONResponse:
        return JSONResponse(state.scenario())

    @app.put("/admin/scenario", dependencies=admin_only)
    async def admin_put_scenario(request: Request) -> JSONResponse:
        raw = await _json_body(request)
        try:
            state.apply_scenario(parse_scenario(raw, source="body"))
        except ScenarioError as exc:
            raise MockCloudError(status=422, code="invalid_spec", message=str(exc)) from None
        except ValueError as exc:
            raise MockCloudError(status=400, code="invalid_request", message=str(exc)) from None
        return JSONResponse(state.scenario())

    @app.delete("/admin/scenario", dependencies=admin_only)
    async def admin_clear_scenario() -> Response:
        state.clear_faults()
        return Response(status_code=204)

    @app.get("/admin/stats", dependencies=admin_only)
    async def admin_stats() -> JSONResponse:
        return JSONResponse(state.stats())

    @app.get("/admin/ledger", dependencies=admin_only)
    async def admin_ledger() -> JSONResponse:
        return JSONResponse(state.ledger())

    @app.post("/admin/reset", dependencies=admin_only)
    async def admin_reset() -> Response:
        state.reset()
        return Response(status_code=204)

    return app


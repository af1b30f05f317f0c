"""The mock GPU cloud: an in-memory GPU cloud with a small JSON HTTP API.

Why it exists: the service, its placement policies and its garbage collection must be testable
end to end without a real cloud account. This module is that cloud. It behaves like the clouds the
adapters talk to (capacity per GPU type and region, idempotent create by name, slow boots, slow
deletes, failures, rate limits, per-second billing) and it tells the truth about what happened
(a ledger of every instance ever created, call counters), so a test can assert "the pod ran once,
in the cheapest region, and cost 0.50" or "the cloud was never called".

Everything lives in one :class:`MockCloudState` (no module-level singletons; several clouds can
run in one process). Time comes from an injectable monotonic clock: lifecycle transitions are
computed lazily from timestamps, and unit tests advance a :class:`ManualClock` instead of
sleeping. The state's methods never ``await`` while mutating, so they are atomic under asyncio
without locks. The one background task is the listeners' ticker (:func:`serve` and the
``mock_cloud`` fixture start it): every 0.1 s it applies due transitions so that each running
container's TCP ports have real listeners (:mod:`providers.mock.listeners`), opened after boot
and closed at once when the container exits, fails, restarts or is asked to delete.

The package is split by concern: :mod:`~providers.mock.state` (the cloud: inventory,
instances, billing, stats), :mod:`~providers.mock.records` (one instance and its lifecycle),
:mod:`~providers.mock.faults` (scripted faults), :mod:`~providers.mock.logs`,
:mod:`~providers.mock.gpumetrics`, :mod:`~providers.mock.listeners` (the real listeners and
the address map), :mod:`~providers.mock.bodies` and :mod:`~providers.mock.app` (the HTTP API);
this module serves it and re-exports the public names.

HTTP API (all JSON; an error is ``{"error": {"code": str, "message": str}}``)
------------------------------------------------------------------------------

Every non-admin endpoint needs ``Authorization: Bearer <key>`` when the state has an ``api_key``
(otherwise 401 ``unauthorized``). Admin endpoints need the same key. The key is never echoed.
A request is counted first, then authenticated, then given its armed fault (if any: a scripted
one from ``/admin/faults``, else the scenario's 429 bursts, random errors and hangs), and only
then are its query and body validated, so a stranger gets 401 whatever they send.

Scenario faults (:mod:`providers.mock.scenario`) also act inside the endpoints: capacity
outages shrink offers, a crash rate fails running instances, deletes can be slow or come to
nothing, a create can lose its answer after making the instance (the duplicate trap), and
``GET /instances`` can lag behind creates (``GET /instances/{id}`` and create-by-name do not).

``GET /healthz``
    ``{"ok": true}``; no auth, not counted.
``GET /capacity``
    ``{"offers": [{gpu_type, region, total, available, price_per_gpu_hour, interruptible}]}``;
    ``available`` is ``total`` minus the GPUs held by live instances (every instance not yet
    deleted holds its GPUs, including exited and failed ones, until it is deleted). An inventory
    entry with a spot price appears twice: on demand and ``interruptible`` (the same GPUs).
``POST /instances``
    Body: ``name, image, gpu_count`` (required); ``gpu_type, region, regions, command, args,
    env, ports ([{container_port, protocol, name}]), cpu_millis, memory_bytes,
    max_price_per_hour, tags, interruptible`` (rent as spot, only where a spot price is set;
    the instance is priced at it).
    Idempotent by ``name``: if a live instance (any state, terminating included) has that name it
    is returned with 200; otherwise a new one is created and returned with 201. Without
    ``region`` the cheapest region with enough capacity is chosen, among ``regions`` if given
    (without ``gpu_type``, the cheapest offer of any type). Errors: 400/422 ``invalid_spec``
    (unknown gpu_type, gpu_count < 1 or above ``max_gpus_per_instance``, empty image, bad tag
    value; messages name the field, never its value), 409 ``capacity_unavailable`` (no offer in
    that region, not enough free GPUs, or over ``max_price_per_hour``), 402 ``quota_exceeded``
    (account GPU quota).
``GET /instances?tag=key=value&tag=...&name=...``
    ``{"instances": [...]}``: live instances matching every filter.
``GET /instances/{id}``
    One instance. Instance JSON: ``id, name, state, tags, image, gpu_type, gpu_count, region,
    price_per_hour (whole instance), ip (100.64.x.y, the pod's address), endpoints,
    public_ip, ports, created_at, started_at, finished_at, exit_code, message,
    restart_count, interruptible, interruption_at, interrupted``. ``public_ip`` (198.18.x.y,
    in the benchmarking range 198.18.0.0/15) and
    ``ports`` (``[{container_port, protocol, public_port}]``, one per declared container port
    and protocol) say how the instance is reached from outside: ``public_ip:public_port``. Public
    ports count up from 30000 per instance, skipping the instance's own container ports, so a
    public port never equals a container port. Both are assigned at create, in every state.
    While the container runs, each TCP port is served for real on ``127.0.0.1`` (an ephemeral
    port; ``GET /admin/listeners``), and with ``--address-map-dir`` the route ``public_ip:
    public_port -> 127.0.0.1:port`` is published there for the test harness's address map;
    nothing ever listens on, or dials, the virtual addresses. ``state`` is one of ``pending``,
    ``running``, ``exited`` (see ``exit_code``), ``failed`` (see ``message``), ``terminating``.
    ``restart_count`` counts restarts. Timestamps are ISO 8601 UTC or null. Env values are
    never returned (``MOCK_LOAD_SECONDS`` alone is read: the instance's load time).
``DELETE /instances/{id}``
    202 with the instance in ``terminating`` (gone after ``delete_delay``), or 204 when
    ``delete_delay`` is 0. 404 ``not_found`` for unknown or already gone instances.
``POST /instances/{id}/restart``
    The container restarts: its listeners close, it is ``pending`` for ``boot_delay``, then
    ``running`` (its model server loads again), and ``restart_count`` goes up. Answers the
    instance. 404 ``not_found`` when gone, 409 ``invalid_state`` once it exited, failed or is
    terminating. Counted as ``restart`` (faults apply).
``GET /instances/{id}/logs?tail_lines&since_seconds&timestamps&limit_bytes&follow``
    ``text/plain``. The fake container prints a ``pulling image`` line at creation, a start line
    naming image and instance, one ``heartbeat`` line per second of running time, and a final
    line when it exits, fails or is deleted. ``timestamps`` prefixes RFC 3339 timestamps like the
    kubelet. ``follow`` streams new lines until the instance stops, is deleted, the client goes
    away, ``limit_bytes`` is reached or ``follow_max_seconds`` pass.
``GET /instances/{id}/metrics``
    ``{instance_id, state, at, gpus: [{index, uuid, gpu_type, gpu_utilization (percent, 0-100),
    tensor_active (fraction, 0-1), memory_used_bytes, memory_total_bytes, temperature_c,
    power_w}]}``, deterministic from the state's ``seed``, the instance and a 10 s time bucket.
    GPUs are idle unless the instance is running.
``GET /gpu-metrics?tag=k=v``
    ``{instances: [...]}``: the same object for every live instance with those tags, in one call
    (as RunPod's and Vast.ai's instance listings carry GPU figures). Counted as ``metrics``.

Admin endpoints (for tests and for people trying policies):

``POST /admin/instances/{id}/fail`` ``{message, exit_code?}``
    The container fails (state ``failed``); 409 ``invalid_state`` if it already stopped.
``POST /admin/instances/{id}/exit`` ``{exit_code}``
    The container exits (state ``exited``).
``POST /admin/instances/{id}/health`` ``{live?: bool, ready?: bool}``
    Steers the instance's model server: ``live`` false makes ``/live`` answer 500, ``ready``
    false makes ``/ready``, ``/healthz`` and traffic answer 503, until set back. Answers
    ``{instance, live, ready}``.
``GET /admin/listeners``
    ``[{instance, public_host, public_port, container_port, host: "127.0.0.1", port}]``: the
    real listeners open now (empty unless the listeners were started).
``GET /admin/traffic``
    ``{"<instance id>": {traffic, probes, ports: {"<container port>": {traffic, probes}}}}``:
    requests the listeners served, for every instance that ever had one. A request to
    ``/live``, ``/ready``, ``/healthz``, ``/startup``, one from a ``kube-probe/`` user agent, or
    a connection closed without a request, is a probe; the rest is traffic.
``POST /admin/instances/{id}/load`` ``{gpu_utilization: 0..1 | null}``
    Pins the instance's GPU load (e.g. 0.02 to look idle); null restores the default.
``GET|PUT /admin/inventory`` ``{"offers": [{gpu_type, region, count, price_per_gpu_hour,
spot_price_per_gpu_hour?}]}``
    Reads or replaces the inventory. Running instances are kept even if they no longer fit. An
    offer with ``spot_price_per_gpu_hour`` also sells its GPUs as interruptible (spot)
    instances at that price: ``GET /capacity`` lists it twice (``interruptible`` false and
    true, one pool of GPUs), and a create with ``interruptible: true`` rents only such offers.
``POST /admin/instances/{id}/interruption`` ``{in_seconds}``
    Announces that an interruptible instance is reclaimed ``in_seconds`` from now: the instance
    reports ``interruption_at`` until then; at that time it stops (state ``failed``,
    ``interrupted`` true, message ``interrupted: ...``), billing ends when it is deleted. 409
    ``invalid_state`` for an on-demand instance or one already stopped.
``POST /admin/instances/{id}/interrupt``
    Reclaims an interruptible instance now, without notice (same end state).
``GET|PATCH /admin/config`` ``{boot_delay, delete_delay, quota_gpus, max_gpus_per_instance,
load_seconds}``
    ``load_seconds``: how long each container's model server answers 503 after it starts
    (default 0; the container env ``MOCK_LOAD_SECONDS`` overrides it per instance).
``GET|POST|DELETE /admin/faults``
    POST ``{endpoint, status, count, retry_after}``: the next ``count`` requests to ``endpoint``
    (``create, list, get, delete, logs, metrics, capacity, restart`` or ``*``) answer
    ``status`` (with a ``Retry-After`` header when ``retry_after`` is set) without doing
    anything.
``GET|PUT|DELETE /admin/scenario``
    PUT takes a scenario (:mod:`providers.mock.scenario`, as JSON) and applies it now: what it
    sets (inventory, delays, seed) and its fault profile, replacing the previous profile; 422
    ``invalid_spec`` names the bad field. GET returns the scenario in force; DELETE turns the
    random faults off (the scripted ``/admin/faults`` stay).
``GET /admin/stats``
    ``{create_calls, list_calls, get_calls, delete_calls, logs_calls, metrics_calls,
    capacity_calls, restart_calls, injected_<kind> (errors, hangs, rate_limited, lost_creates,
    capacity_refusals, crashes, slow_deletes, failed_deletes), unauthorized_calls,
    faults_injected (scripted and scenario), instances_created, live_instances}``.
    Calls are counted when received, including idempotent repeats, rejected and faulted ones.
``GET /admin/ledger``
    ``{create_calls, total_cost, instances: [{id, name, uid, gpu_type, gpu_count, region,
    price_per_hour, state, exit_code, created_at, started_at, stopped_at, cost}]}`` for every
    instance ever created. Billing runs from ``started_at`` (boot finished) to ``stopped_at``
    (the GPUs were released, i.e. the delete finished); a finished but undeleted instance keeps
    costing money, as on a real cloud. Live instances are priced at read time.
``POST /admin/reset``
    Forgets instances, ledger, counters and faults, and restores the constructor's inventory and
    configuration. Instance ids stay unique across resets.

Tags understood by the mock (optional, for scripted workloads):
``mock.vkprovider.io/run-seconds`` (the container exits after that many seconds of running),
``mock.vkprovider.io/exit-code`` (its exit code then, default 0) and
``mock.vkprovider.io/gpu-utilization`` (0..1, like the admin ``load`` endpoint).

The model server on each listener (:mod:`providers.mock.listeners`): ``/live`` answers 200
(500 with the ``live`` knob off); while loading every other path answers 503 ``{"loading":
true, ...}``; then ``/ready``, ``/healthz``, ``/startup`` answer 200 and every other path 200
``{instance, name, namespace, pod, container_port}`` (namespace and pod from the
``vkprovider.io/namespace`` and ``vkprovider.io/pod`` tags).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import uvicorn

from providers.mock.app import create_app
from providers.mock.bodies import CreateBody, PortBody
from providers.mock.errors import LostResponse, MockCloudError
from providers.mock.faults import ENDPOINTS, Fault, FaultPlan
from providers.mock.records import (
    PUBLIC_PORT_BASE,
    TAG_EXIT_CODE,
    TAG_GPU_UTILIZATION,
    TAG_RUN_SECONDS,
    Record,
    publish_ports,
)
from providers.mock.state import DEFAULT_INVENTORY, InventoryOffer, ManualClock, MockCloudState

__all__ = [
    "DEFAULT_INVENTORY",
    "ENDPOINTS",
    "PUBLIC_PORT_BASE",
    "TAG_EXIT_CODE",
    "TAG_GPU_UTILIZATION",
    "TAG_RUN_SECONDS",
    "CreateBody",
    "Fault",
    "FaultPlan",
    "InventoryOffer",
    "LostResponse",
    "ManualClock",
    "MockCloudError",
    "MockCloudState",
    "PortBody",
    "create_app",
    "serve",
    "startup_line",
]

#: Kept under their old names: tests import them from here.
_Record = Record
_publish = publish_ports


def startup_line(*, url: str, state: MockCloudState) -> str:
    """The one line ``vkprovider mock-cloud`` prints once it listens: where, and what it sells."""
    offers = ", ".join(
        f"{o.count} {o.gpu_type} in {o.region} at ${o.price_per_gpu_hour:g}/GPU-h"
        + (f" (spot ${o.spot_price_per_gpu_hour:g})" if o.spot_price_per_gpu_hour is not None
           else "")
        for o in state.inventory()
    )
    key = "an API key is required" if state._api_key else "no API key needed"
    return f"mock cloud listening on {url}, selling {offers or 'nothing'}; {key}"


async def serve(
    *,
    host: str,
    port: int,
    state: MockCloudState,
    log_level: str = "warning",
    announce: Callable[[str], None] | None = None,
    address_map_dir: Path | str | None = None,
) -> None:
    """Run the mock cloud with uvicorn until cancelled or signalled (await it).

    ``announce`` is called once with :func:`startup_line` when the port is listening. The
    containers' listeners run meanwhile and are all closed on the way out; with
    ``address_map_dir`` (else the state's) their routes are published there.
    """
    if address_map_dir is not None:
        state.listeners.address_map_dir = Path(address_map_dir)
    config = uvicorn.Config(
        create_app(state=state),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
    )
    server = _Server(config, state=state)
    watcher = (
        asyncio.ensure_future(_announce_once_listening(server, state=state, announce=announce))
        if announce is not None
        else None
    )
    state.start_listeners()
    try:
        await server.serve()  # a port it cannot bind exits as uvicorn decides (status 3)
    finally:
        await state.aclose_listeners()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


class _Server(uvicorn.Server):
    """Closes the containers' listeners (and drops their routes) as it shuts down: after a
    SIGTERM uvicorn re-raises the signal once it has stopped, so nothing after it would run."""

    def __init__(self, config: uvicorn.Config, *, state: MockCloudState) -> None:
        super().__init__(config)
        self._state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._state.aclose_listeners()
        await super().shutdown(sockets=sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, except that a SIGTERM is not re-raised once the server has stopped: the
        mock cloud was asked to stop and did, so its process exits 0 (a re-raised SIGTERM
        kills it: status 143, which a supervisor or ``wait`` reports as a failure). Ctrl-C
        (SIGINT) is still re-raised: the command exits 130, as an interrupted one should."""
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals[:] = [
                    sig for sig in self._captured_signals if sig != signal.SIGTERM]


async def _announce_once_listening(
    server: uvicorn.Server, *, state: MockCloudState, announce: Callable[[str], None]
) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    address = f"[{host}]" if ":" in host else host
    announce(startup_line(url=f"http://{address}:{port}", state=state))

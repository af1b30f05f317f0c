"""Scenario files for the mock GPU cloud: inventory, delays, a seed and a fault profile in YAML.

Why it exists: platform teams test their placement policies, retries and alerting against the
mock cloud before they spend money on a real one, and a test of "what happens when the cloud is
flaky" is only worth something if the flakiness is written down, reviewable and repeatable. A
scenario is that written-down cloud: ``vkprovider mock-cloud --scenario FILE`` serves it,
``PUT /admin/scenario`` swaps it in while running, and :func:`load_scenario` reads it in a test.

This module only describes and validates (pydantic, ``extra="forbid"`` so a typo is an error,
not a silently ignored fault); :class:`providers.mock.server.MockCloudState` does the faults.
Every error names the field that is wrong (``faults.endpoints.create.error_rate: ...``) and
never echoes the value, as the rest of the mock cloud does.

Times in a scenario (``start``, ``duration``, ``every``) are seconds on the cloud's clock since
the scenario was applied (at start-up, on ``PUT /admin/scenario`` and on ``POST /admin/reset``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "FAULT_ENDPOINTS",
    "MAX_DELAY_SECONDS",
    "CapacityOutage",
    "CrashFaults",
    "DeleteFaults",
    "EndpointFaults",
    "Faults",
    "LostCreateResponses",
    "OfferSpec",
    "PublishedHost",
    "RateLimitBurst",
    "Scenario",
    "ScenarioError",
    "ScriptedAnswer",
    "VanishingInstances",
    "load_scenario",
    "parse_scenario",
]

#: The endpoints a scenario can give faults (the counted endpoints of the server), and ``*``.
FAULT_ENDPOINTS: tuple[str, ...] = (
    "create",
    "list",
    "get",
    "delete",
    "logs",
    "metrics",
    "capacity",
)
#: The longest hang or extra delay a scenario may ask for: a hang is a fault, not a deadlock.
MAX_DELAY_SECONDS = 300.0

_Endpoint = Literal["create", "list", "get", "delete", "logs", "metrics", "capacity", "*"]
_ALL: tuple[_Endpoint, ...] = ("*",)
_Probability = Field(default=0.0, ge=0.0, le=1.0)


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the file (if any) and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OfferSpec(_Strict):
    """``count`` GPUs of ``gpu_type`` in ``region`` at ``price_per_gpu_hour`` dollars (and also
    as interruptible spot instances at ``spot_price_per_gpu_hour``, when set)."""

    gpu_type: str = Field(min_length=1)
    region: str = Field(min_length=1)
    count: int = Field(ge=0)
    price_per_gpu_hour: float = Field(ge=0.0, allow_inf_nan=False)
    #: Also sold as interruptible (spot) instances at this price; null: on demand only.
    spot_price_per_gpu_hour: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)


class EndpointFaults(_Strict):
    """Random faults of one endpoint, drawn per request from the seeded generator.

    ``error_rate`` of the requests answer ``error_status`` without doing anything;
    ``hang_rate`` of them wait ``hang_seconds`` before being handled (a client with a shorter
    timeout sees a timeout; the request is still handled after the wait).
    """

    error_rate: float = _Probability
    error_status: int = Field(default=503, ge=500, le=599)
    hang_rate: float = _Probability
    hang_seconds: float = Field(default=0.0, ge=0.0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)


class RateLimitBurst(_Strict):
    """From ``start`` for ``duration`` seconds (again every ``every`` seconds when set), every
    request to ``endpoints`` answers 429 with ``Retry-After: retry_after``."""

    endpoints: list[_Endpoint] = Field(default_factory=lambda: list(_ALL), min_length=1)
    start: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    duration: float = Field(gt=0.0, allow_inf_nan=False)
    every: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    retry_after: float = Field(default=1.0, ge=0.0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)

    @model_validator(mode="after")
    def _burst_fits_its_period(self) -> RateLimitBurst:
        if self.every is not None and self.every <= self.duration:
            raise ValueError("every must be longer than duration (or the burst never ends)")
        return self

    def active(self, *, elapsed: float) -> bool:
        """Whether the burst is on ``elapsed`` seconds after the scenario was applied."""
        if elapsed < self.start:
            return False
        offset = elapsed - self.start
        if self.every is not None:
            offset %= self.every
        return offset < self.duration


class CapacityOutage(_Strict):
    """From ``start`` for ``duration`` seconds (null: until replaced), the offers of
    ``gpu_type`` in ``region`` (null: every region) shrink to ``count`` GPUs: creates that do
    not fit next to the live instances get 409 ``capacity_unavailable`` and ``GET /capacity``
    shows what is left. Instances already running keep their GPUs."""

    gpu_type: str = Field(min_length=1)
    region: str | None = Field(default=None, min_length=1)
    start: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    duration: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    count: int = Field(default=0, ge=0)

    def active(self, *, elapsed: float) -> bool:
        if elapsed < self.start:
            return False
        return self.duration is None or elapsed < self.start + self.duration

    def covers(self, *, gpu_type: str, region: str) -> bool:
        return self.gpu_type == gpu_type and self.region in (None, region)


class CrashFaults(_Strict):
    """Each running instance fails with ``message`` at a random moment: the chance per second
    of running is ``rate_per_second`` (an exponential draw per instance, from the seed)."""

    rate_per_second: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    message: str = Field(default="instance preempted by the cloud", min_length=1)
    exit_code: int | None = Field(default=None, ge=0, le=255)


class DeleteFaults(_Strict):
    """Slow and failing deletes.

    ``slow_rate`` of the deletes take ``slow_seconds`` longer than ``delete_delay``;
    ``fail_rate`` of them are accepted (202, ``terminating``) but fail on the cloud: once the
    delete delay has passed the instance is back in its previous state, still billed, and must
    be deleted again.
    """

    slow_rate: float = _Probability
    slow_seconds: float = Field(default=0.0, ge=0.0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)
    fail_rate: float = _Probability


class ScriptedAnswer(_Strict):
    """``count`` requests in a row answer ``status`` (an error; nothing is done)."""

    status: int = Field(ge=400, le=599)
    count: int = Field(default=1, ge=1, le=10_000)


class LostCreateResponses(_Strict):
    """The duplicate trap: ``rate`` of the creates that make a new instance lose their answer.

    The instance exists on the cloud (and is billed), but the client gets ``504`` (``mode:
    "504"``) or the connection is closed mid-response (``mode: "disconnect"``; over real HTTP
    only). A client that retries by name finds it; one that retries blindly makes a second.
    """

    rate: float = _Probability
    mode: Literal["504", "disconnect"] = "504"
    #: What the creates after each lost answer get (a retry by name too), in order, nothing
    #: made: a cloud that dropped a create under load and then fails or turns requests away
    #: (``[{status: 503, count: 3}, {status: 409, count: 20}]``; 409 is ``capacity_unavailable``).
    then: list[ScriptedAnswer] = Field(default_factory=list)


class PublishedHost(_Strict):
    """A lying cloud: an instance created with every one of ``tags`` reports ``host`` as its
    public address (``public_ip``) instead of its own 198.18.x.y, as a third-party host or a
    compromised account could (``10.0.0.5``, ``169.254.169.254``, a name). The address map
    routes ``host``'s ports to the instance's own listeners, so a test sees (in
    ``GET /admin/traffic``) anything that dials it; nothing dials the address for real."""

    tags: dict[str, str] = Field(min_length=1)
    host: str = Field(min_length=1, max_length=253)


class VanishingInstances(_Strict):
    """Instances that vanish: a host that died, or one deleted in the cloud's console.

    An instance created with every one of ``tags`` is gone ``after`` seconds after it started
    running: released (billing ends, its ports close) without anyone asking for a delete, and
    absent from every list and get from then on. At most ``count`` instances vanish per entry
    (an instance made again under the same name, by a retry, is left alone once it is used
    up), counted since the fault profile was applied.
    """

    tags: dict[str, str] = Field(min_length=1)
    after: float = Field(default=0.0, ge=0.0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)
    count: int = Field(default=1, ge=1)


class Faults(_Strict):
    """The fault profile; every fault is off by default."""

    endpoints: dict[_Endpoint, EndpointFaults] = Field(default_factory=dict)
    rate_limits: list[RateLimitBurst] = Field(default_factory=list)
    capacity_outages: list[CapacityOutage] = Field(default_factory=list)
    crash: CrashFaults = Field(default_factory=CrashFaults)
    deletes: DeleteFaults = Field(default_factory=DeleteFaults)
    lost_create_responses: LostCreateResponses = Field(default_factory=LostCreateResponses)
    list_lag_seconds: float = Field(default=0.0, ge=0.0, le=MAX_DELAY_SECONDS,
                                    allow_inf_nan=False)
    #: Instances created while this is in force report the first matching entry's host.
    published_hosts: list[PublishedHost] = Field(default_factory=list)
    #: Running instances that disappear without a delete (see :class:`VanishingInstances`).
    vanish: list[VanishingInstances] = Field(default_factory=list)

    def for_endpoint(self, endpoint: str) -> EndpointFaults | None:
        """The endpoint's own faults, else the ``*`` entry, else None."""
        by_name: dict[str, EndpointFaults] = {str(k): v for k, v in self.endpoints.items()}
        return by_name.get(endpoint, by_name.get("*"))


class Scenario(_Strict):
    """A whole mock cloud: unset fields (null) keep what the cloud has."""

    name: str | None = None
    description: str | None = None
    seed: int | None = None
    boot_delay: float | None = Field(default=None, ge=0.0, le=MAX_DELAY_SECONDS,
                                     allow_inf_nan=False)
    delete_delay: float | None = Field(default=None, ge=0.0, le=MAX_DELAY_SECONDS,
                                       allow_inf_nan=False)
    load_seconds: float | None = Field(default=None, ge=0.0, le=MAX_DELAY_SECONDS,
                                       allow_inf_nan=False)
    inventory: list[OfferSpec] | None = None
    faults: Faults = Field(default_factory=Faults)

    @model_validator(mode="after")
    def _inventory_lists_each_offer_once(self) -> Scenario:
        keys = [(o.gpu_type, o.region) for o in self.inventory or ()]
        if len(set(keys)) != len(keys):
            raise ValueError("inventory lists a (gpu_type, region) twice")
        return self


def describe_errors(errors: Iterable[Mapping[str, Any]]) -> str:
    """``field.path: problem; ...`` without the input values (they may be secrets)."""
    problems = []
    for err in errors:
        loc = ".".join(str(part) for part in err.get("loc", ()) if part != "[key]")
        msg = str(err.get("msg", "invalid"))
        problems.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(problems) or "invalid scenario"


def parse_scenario(data: Any, *, source: str = "scenario") -> Scenario:
    """A scenario from already-parsed YAML or JSON; :class:`ScenarioError` names the field."""
    if data is None:
        data = {}
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {describe_errors(exc.errors())}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{file}: cannot read ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{file}: not valid YAML{where}") from None
    return parse_scenario(data, source=str(file))

"""GPUProvider and OverflowPolicy objects as typed values, and the rules that need no I/O.

Why it exists: the virtual kubelet (which cloud may run a pod) and the companion (which pod may
burst, which may come back) must read the two CRDs the same way. This module is the one reading:
frozen pydantic models mirroring ``manifests/crds/*.yaml`` (same defaults, same bounds, so an
object that bypassed the API server, from a file or a unit test, is held to the same rules),
label-selector matching with exactly Kubernetes' semantics, the reasons a policy says no, and the
semantic checks the OpenAPI schema cannot express (a policy naming a provider that does not
exist, a GPU type no provider maps, a missing credentials Secret).

It does no I/O and keeps no state: callers pass in what they listed. Budgets (how much of a
policy's limits is used) are computed elsewhere; :class:`Limits` is the shared vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from vkprovider.errors import VKError
from vkprovider.semantics import selectors

GROUP = "vkprovider.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND_PROVIDER = "GPUProvider"
KIND_POLICY = "OverflowPolicy"
#: Collection paths on the API server (both kinds are cluster-scoped).
PROVIDERS_PATH = f"/apis/{API_VERSION}/gpuproviders"
POLICIES_PATH = f"/apis/{API_VERSION}/overflowpolicies"

ProviderType = Literal["mock", "runpod", "vastai", "salad"]
PROVIDER_TYPES: tuple[ProviderType, ...] = ("mock", "runpod", "vastai", "salad")

#: ``status.health`` of a GPUProvider.
HEALTH_VALUES = ("Healthy", "Degraded", "Unreachable", "AuthFailed")

#: Condition types written to ``status.conditions`` (docs/policies.md says what each means).
CONDITION_VALID = "Valid"  # both kinds: the semantic checks below pass
CONDITION_READY = "Ready"  # provider: Valid and reachable; policy: Valid and a provider is Ready
CONDITION_BUDGET_EXHAUSTED = "BudgetExhausted"  # policy: a limit is reached, nothing more bursts

#: Problem reasons (also the reason of a ``Valid=False`` condition).
REASON_UNKNOWN_PROVIDER = "UnknownProvider"
REASON_UNMAPPED_GPU_TYPE = "UnmappedGPUType"
REASON_SECRET_NOT_FOUND = "SecretNotFound"

#: Well-known ``status.lastDecisions[].decision`` values (the CRD accepts any CamelCase word).
DECISIONS = ("Admitted", "Refused", "WouldAdmit", "MovedBack", "MoveBackFailed", "WouldMoveBack",
             "Prewarmed", "PrewarmTimedOut", "WouldPrewarm")

#: Kept in ``status.lastDecisions`` at most (the CRD's maxItems).
MAX_DECISIONS = 20

# The CRDs' patterns, repeated here so that parsing outside the API server agrees with it.
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_GPU_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


class PolicyError(VKError):
    """A GPUProvider or OverflowPolicy object is malformed.

    ``field`` is the path of the first problem, in the API server's notation
    (``spec.limits.maxExternalFraction``, ``spec.providers[0]``); ``problems`` holds all of them.
    """

    def __init__(
        self, *, field: str, message: str, problems: tuple[Problem, ...] | None = None
    ) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.problems = problems or (Problem(field=field, message=message),)


class _Frozen(BaseModel):
    # extra="ignore": the API server prunes unknown fields anyway, and a controller older than
    # the CRD must keep working when a newer CRD adds a field.
    # Aliases are the YAML names (camelCase); a name to_camel gets wrong (maxGPUs) is set with
    # validation_alias/serialization_alias, not alias, so that type checkers still see the
    # python name in constructors: Limits(max_gpus=8).
    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class Problem(_Frozen):
    """One thing wrong with an object: the field at fault and why (``reason`` is CamelCase)."""

    field: str
    message: str
    reason: str = "Invalid"


class _SubfieldError(ValueError):
    """A cross-field check failed on ``subfield`` of the model being validated."""

    def __init__(self, subfield: str, message: str) -> None:
        super().__init__(message)
        self.subfield = subfield


# ---- durations -------------------------------------------------------------------------------


def parse_duration(text: str, *, field: str = "duration") -> float:
    """Seconds in a duration like ``"1h30m"``, ``"90s"`` or ``"500ms"`` (units ms, s, m, h).

    The grammar is the CRDs' pattern ``^([0-9]+(ms|s|m|h))+$``; parts add up (``"1m30s"`` is
    90.0). Raises :class:`PolicyError` naming ``field``.
    """
    if not isinstance(text, str) or not re.fullmatch(DURATION_PATTERN, text):
        raise PolicyError(
            field=field,
            message=f"{text!r} is not a duration like 1h30m, 90s or 500ms (units ms, s, m, h)",
        )
    return sum(int(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))


def _duration_str(value: str) -> str:
    try:
        parse_duration(value)
    except PolicyError as exc:
        raise ValueError(exc.message) from None
    return value


Duration = Annotated[StrictStr, AfterValidator(_duration_str)]
NonNegInt = Annotated[StrictInt, Field(ge=0)]
NonNegFloat = Annotated[StrictFloat, Field(ge=0)]
DNSLabel = Annotated[StrictStr, Field(max_length=63, pattern=_DNS_LABEL)]
DNSSubdomain = Annotated[StrictStr, Field(max_length=253, pattern=_DNS_SUBDOMAIN)]
GPUName = Annotated[StrictStr, Field(max_length=128, pattern=_GPU_NAME)]
LabelValue = Annotated[StrictStr, Field(max_length=63, pattern=_LABEL_VALUE)]


# ---- GPUProvider -----------------------------------------------------------------------------


class SecretRef(_Frozen):
    """``spec.credentialsSecret``: where the cloud API key is."""

    namespace: DNSLabel
    name: DNSSubdomain
    key: Annotated[StrictStr, Field(max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = "apiKey"


class GPUProviderSpec(_Frozen):
    """``spec`` of a GPUProvider."""

    type: ProviderType
    endpoint: Annotated[
        StrictStr, Field(max_length=2048, pattern=r"^https?://[^\s/?#]+[^\s]*$")
    ] | None = None
    credentials_secret: SecretRef | None = None
    gpu_types: dict[GPUName, Annotated[StrictStr, Field(min_length=1, max_length=256)]] = Field(
        default_factory=dict, max_length=64
    )
    regions: tuple[
        Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=_GPU_NAME)], ...
    ] = Field(default=(), max_length=64)
    max_gpus: Annotated[StrictInt, Field(ge=0, le=1_000_000)] | None = Field(
        default=None, validation_alias="maxGPUs", serialization_alias="maxGPUs"
    )
    max_price_per_hour: NonNegFloat | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    # How Services reach this account's cloud replicas when the pod's OverflowPolicy leaves
    # its own ``traffic`` at auto (see :func:`effective_traffic`; docs/traffic.md)
    traffic: Literal["direct", "gateway", "auto"] = "auto"

    @model_validator(mode="after")
    def _required_by_type(self) -> GPUProviderSpec:
        if self.type == "mock" and self.endpoint is None:
            raise _SubfieldError("endpoint", "endpoint is required when type is mock")
        if self.type != "mock" and self.credentials_secret is None:
            raise _SubfieldError(
                "credentialsSecret", "credentialsSecret is required for runpod, vastai and salad"
            )
        for i, region in enumerate(self.regions):
            if region in self.regions[:i]:
                raise _SubfieldError(f"regions[{i}]", f"{region!r} is listed twice")
        return self

    def cloud_gpu_id(self, gpu_type: str) -> str | None:
        """This cloud's id for a cluster GPU name; with no ``gpuTypes`` map the name itself."""
        if not self.gpu_types:
            return gpu_type
        return self.gpu_types.get(gpu_type)


def effective_traffic(*, policy: str | None, provider: str | None
                      ) -> Literal["direct", "gateway", "auto"]:
    """The traffic path of one cloud pod: its OverflowPolicy's ``traffic`` unless that is
    ``auto`` (or the pod has no policy), else its GPUProvider's, else ``auto``. The narrower
    scope wins: a policy names a workload, a GPUProvider a whole account; ``auto`` on either
    is "no opinion" (both default to it)."""
    for choice in (policy, provider):
        if choice == "direct":
            return "direct"
        if choice == "gateway":
            return "gateway"
    return "auto"


class GPUProvider(_Frozen):
    """A GPUProvider object: its name, generation and spec (status is written, not read)."""

    name: str
    generation: int = 0
    spec: GPUProviderSpec


# ---- OverflowPolicy --------------------------------------------------------------------------


class LabelSelectorRequirement(_Frozen):
    key: Annotated[StrictStr, Field(max_length=317, pattern=_LABEL_KEY.pattern)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[LabelValue, ...] = Field(default=(), max_length=64)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise _SubfieldError("values", f"values must be non-empty for {self.operator}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise _SubfieldError("values", f"values must be empty for {self.operator}")
        return self


class LabelSelector(_Frozen):
    """A standard ``metav1.LabelSelector``; empty selects everything."""

    match_labels: dict[
        Annotated[StrictStr, Field(max_length=317, pattern=_LABEL_KEY.pattern)], LabelValue
    ] = Field(default_factory=dict, max_length=64)
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(default=(), max_length=32)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return label_selector_matches(self, labels)


class PolicySelector(_Frozen):
    """``spec.selector``: which pods a policy is about. Every part that is set must match."""

    namespaces: tuple[DNSLabel, ...] = Field(default=(), max_length=256)
    namespace_selector: LabelSelector | None = None
    pod_selector: LabelSelector | None = None
    min_priority: Annotated[StrictInt, Field(ge=-(2**31), le=2**31 - 1)] | None = None


class Limits(_Frozen):
    """Caps on what one policy has outside at once; ``None`` means no cap.

    ``max_external_fraction`` applies per workload (owner): at most that fraction of its replicas
    may run outside. The companion and the virtual kubelet compute the usage against these.
    """

    max_pods: NonNegInt | None = None
    max_gpus: NonNegInt | None = Field(
        default=None, validation_alias="maxGPUs", serialization_alias="maxGPUs"
    )
    max_price_per_hour: NonNegFloat | None = None
    max_external_fraction: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None


class MoveBack(_Frozen):
    """``spec.moveBack``: bringing pods back inside, make-before-break."""

    enabled: StrictBool = True
    stable_for: Duration = "2m"
    max_concurrent: Annotated[StrictInt, Field(ge=1, le=100)] = 1
    cooldown: Duration = "5m"
    timeout: Duration = "10m"
    # Hysteresis: GPUs that must stay free inside besides the pod's (on top of the companion's
    # headroom_gpus); and whether GPUs Kueue will place next (a queued gang) count as taken.
    headroom_gpus: Annotated[StrictInt, Field(ge=0, le=1024)] = Field(
        default=0, validation_alias="headroomGPUs", serialization_alias="headroomGPUs")
    hold_while_queued: StrictBool = True

    @model_validator(mode="after")
    def _positive_timeout(self) -> MoveBack:
        if parse_duration(self.timeout) <= 0:
            raise _SubfieldError("timeout", "must be longer than 0s")
        return self

    @property
    def stable_for_seconds(self) -> float:
        return parse_duration(self.stable_for, field="spec.moveBack.stableFor")

    @property
    def cooldown_seconds(self) -> float:
        return parse_duration(self.cooldown, field="spec.moveBack.cooldown")

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout, field="spec.moveBack.timeout")


class Prewarm(_Frozen):
    """``spec.prewarm``: surge these pods onto the cloud before a Kueue gang displaces them.

    Used by the ``vkprovider.io/prewarm`` AdmissionCheck (descheduler/prewarm.py): when a gang
    has quota reserved, the replicas it will preempt are first surged onto the virtual node and
    the check turns Ready once they are Ready. ``timeout`` bounds that wait; then ``onTimeout``
    decides: ``Proceed`` (the check goes Ready anyway, training is never blocked by inference)
    or ``Retry`` (the check goes Retry: Kueue releases the quota and tries again later).
    """

    enabled: StrictBool = True
    timeout: Duration = "5m"
    on_timeout: Literal["Proceed", "Retry"] = "Proceed"

    @model_validator(mode="after")
    def _bounded_timeout(self) -> Prewarm:
        seconds = parse_duration(self.timeout)
        if seconds <= 0:
            raise _SubfieldError("timeout", "must be longer than 0s")
        if seconds > PREWARM_MAX_TIMEOUT_SECONDS:
            raise _SubfieldError("timeout", "must be at most 1h: a gang must not wait longer "
                                            "on inference")
        return self

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout, field="spec.prewarm.timeout")


#: ``spec.prewarm.timeout`` at most (the CRD says the same).
PREWARM_MAX_TIMEOUT_SECONDS = 3600.0


class GPUHealth(_Frozen):
    """``spec.gpuHealth``: a cloud replica whose hottest GPU stays above the limit is replaced.

    The provider sets the pod condition ``vkprovider.io/GPUHealthy=False`` once the hottest GPU
    has read above ``maxTemperatureCelsius`` for ``sustainedFor``; the companion then replaces
    the replica make-before-break (descheduler/hotswap.py). Absent: nothing is watched.
    """

    max_temperature_celsius: Annotated[StrictInt, Field(ge=50, le=120)]
    sustained_for: Duration = "2m"

    @property
    def sustained_for_seconds(self) -> float:
        return parse_duration(self.sustained_for, field="spec.gpuHealth.sustainedFor")


class OverflowPolicySpec(_Frozen):
    """``spec`` of an OverflowPolicy."""

    selector: PolicySelector = Field(default_factory=PolicySelector)
    providers: tuple[DNSSubdomain, ...] = Field(min_length=1, max_length=16)
    nodes: tuple[DNSSubdomain, ...] = Field(default=(), max_length=64)
    gpu_types: tuple[GPUName, ...] = Field(default=(), max_length=64)
    limits: Limits = Field(default_factory=Limits)
    overflow_after: Duration = "0s"
    move_back: MoveBack = Field(default_factory=MoveBack)
    prewarm: Prewarm = Field(default_factory=Prewarm)
    exec_probes: Literal["Refuse", "Ignore"] = "Refuse"
    # How Services reach this policy's cloud replicas (docs/traffic.md): direct (the published
    # IP:port only; a hostname-only replica gets the EndpointNotRoutable warning), gateway
    # (through the traffic gateway), auto (direct where routable, the gateway otherwise)
    traffic: Literal["direct", "gateway", "auto"] = "auto"
    placement: Literal["Ordered", "Cheapest"] = "Ordered"
    # Spot/bid offers: Never (not used, never asked for), Allow (they compete on price),
    # Prefer (tried first). See vkprovider/placement/spot.py.
    interruptible: Literal["Never", "Allow", "Prefer"] = "Never"
    gpu_health: GPUHealth | None = Field(
        default=None, validation_alias="gpuHealth", serialization_alias="gpuHealth")
    dry_run: StrictBool = False

    @model_validator(mode="after")
    def _unique_lists(self) -> OverflowPolicySpec:
        for name, items in (("providers", self.providers), ("nodes", self.nodes),
                            ("gpuTypes", self.gpu_types)):
            seen: set[str] = set()
            for i, item in enumerate(items):
                if item in seen:
                    raise _SubfieldError(f"{name}[{i}]", f"{item!r} is listed twice")
                seen.add(item)
        return self

    @property
    def overflow_after_seconds(self) -> float:
        return parse_duration(self.overflow_after, field="spec.overflowAfter")


class OverflowPolicy(_Frozen):
    """An OverflowPolicy object: its name, generation and spec (status is written, not read)."""

    name: str
    generation: int = 0
    spec: OverflowPolicySpec


# ---- parsing ---------------------------------------------------------------------------------


def parse_gpu_provider(obj: Mapping[str, Any]) -> GPUProvider:
    """A GPUProvider from its API object (a dict as the API server returns it, or from YAML)."""
    name, generation = _metadata(obj, kind=KIND_PROVIDER)
    spec = _validate(GPUProviderSpec, obj.get("spec"))
    return GPUProvider(name=name, generation=generation, spec=spec)


def parse_overflow_policy(obj: Mapping[str, Any]) -> OverflowPolicy:
    """An OverflowPolicy from its API object (a dict as the API server returns it, or from YAML)."""
    name, generation = _metadata(obj, kind=KIND_POLICY)
    spec = _validate(OverflowPolicySpec, obj.get("spec"))
    return OverflowPolicy(name=name, generation=generation, spec=spec)


def _metadata(obj: Mapping[str, Any], *, kind: str) -> tuple[str, int]:
    if not isinstance(obj, Mapping):
        raise PolicyError(field="<root>", message=f"a {kind} must be a mapping")
    if obj.get("kind") not in (None, kind):
        raise PolicyError(field="kind", message=f"expected {kind}, got {obj.get('kind')!r}")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not re.fullmatch(_DNS_SUBDOMAIN, name) or len(name) > 253:
        raise PolicyError(field="metadata.name", message=f"{name!r} is not a valid object name")
    generation = meta.get("generation", 0) if isinstance(meta, Mapping) else 0
    return name, generation if isinstance(generation, int) else 0


_M = TypeVar("_M", bound=_Frozen)


def _validate(model: type[_M], spec: object) -> _M:
    if spec is None:
        raise PolicyError(field="spec", message="Required value")
    if not isinstance(spec, Mapping):
        raise PolicyError(field="spec", message="must be a mapping")
    try:
        return model.model_validate(spec)
    except ValidationError as exc:
        problems = tuple(_problem(err, prefix="spec") for err in exc.errors())
        raise PolicyError(
            field=problems[0].field, message=problems[0].message, problems=problems
        ) from None


def _problem(err: Any, *, prefix: str) -> Problem:
    loc: list[str | int] = [*_split_path(prefix), *err["loc"]]
    cause = (err.get("ctx") or {}).get("error")
    message = str(err["msg"])
    if isinstance(cause, _SubfieldError):
        loc.extend(_split_path(cause.subfield))
        message = str(cause)
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return Problem(field=_path(loc), message=message)


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        parts.append(int(index) if index else name)
    return parts


def _path(loc: Sequence[str | int]) -> str:
    """``spec.providers[0]``, ``spec.gpuTypes.H100``: the API server's notation."""
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for "the key itself was invalid"
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


# ---- selectors -------------------------------------------------------------------------------


def label_selector_matches(
    selector: Mapping[str, Any] | LabelSelector, labels: Mapping[str, str]
) -> bool:
    """Whether ``labels`` satisfy a ``metav1.LabelSelector``, exactly as Kubernetes decides.

    ``matchLabels`` and every ``matchExpressions`` entry are ANDed; an empty selector matches
    everything. ``In``: the key is present with one of the values. ``NotIn``: the key is absent
    or its value is none of the values. ``Exists``/``DoesNotExist``: the key is present/absent.
    A malformed selector (unknown operator, ``In`` without values, ``Exists`` with values)
    raises :class:`PolicyError`, as ``metav1.LabelSelectorAsSelector`` returns an error.

    The matching is :func:`vkprovider.semantics.selectors.label_selector_matches`; this adds the
    CRD's own checks (label key and value syntax) and reports problems as :class:`PolicyError`.
    """
    if isinstance(selector, LabelSelector):
        sel = selector
    else:
        try:
            sel = LabelSelector.model_validate(selector)
        except ValidationError as exc:
            err = _problem(exc.errors()[0], prefix="")
            raise PolicyError(field=err.field, message=err.message) from None
    try:
        return selectors.label_selector_matches(sel.model_dump(), labels=labels)
    except selectors.SelectorError as exc:
        # The model already enforces these rules; should the two ever drift, still a PolicyError.
        raise PolicyError(field=exc.field, message=exc.message) from None


def policy_selects(
    policy: OverflowPolicy,
    *,
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str] | None = None,
) -> tuple[bool, str]:
    """Whether the policy's ``spec.selector`` selects the pod; when not, a reason for humans.

    Checked in this order (the first failure is the reason): ``namespaces``,
    ``namespaceSelector`` (needs ``namespace_labels``), ``podSelector``, ``minPriority``. A pod
    without ``spec.priority`` has priority 0, as when no PriorityClass applies.
    """
    return _selects(policy, pod=pod, namespace_labels=namespace_labels)[1:]


# Stages of policy_selects, in the order they are checked; used by closest_refusal.
_STAGE_NAMESPACE, _STAGE_LABELS, _STAGE_PRIORITY, _STAGE_BUDGET, _STAGE_ADMITTED = range(5)


def _selects(
    policy: OverflowPolicy,
    *,
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str] | None,
) -> tuple[int, bool, str]:
    sel = policy.spec.selector
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    if sel.namespaces and namespace not in sel.namespaces:
        return (_STAGE_NAMESPACE, False,
                f"namespace {namespace} is not in [{', '.join(sel.namespaces)}]")
    if sel.namespace_selector is not None:
        if namespace_labels is None:
            return (_STAGE_NAMESPACE, False,
                    f"the labels of namespace {namespace} are unknown, and "
                    "spec.selector.namespaceSelector needs them")
        if not label_selector_matches(sel.namespace_selector, namespace_labels):
            return (_STAGE_NAMESPACE, False,
                    f"the labels of namespace {namespace} do not match "
                    "spec.selector.namespaceSelector")
    if sel.pod_selector is not None and not label_selector_matches(
        sel.pod_selector, meta.get("labels") or {}
    ):
        return _STAGE_LABELS, False, "labels do not match spec.selector.podSelector"
    if sel.min_priority is not None:
        priority = (pod.get("spec") or {}).get("priority")
        priority = priority if isinstance(priority, int) else 0
        if priority < sel.min_priority:
            return (_STAGE_PRIORITY, False,
                    f"priority {priority} is below minPriority {sel.min_priority}")
    return _STAGE_BUDGET, True, ""


def closest_refusal(
    policies: Iterable[OverflowPolicy],
    pod: Mapping[str, Any],
    *,
    namespace_labels: Mapping[str, str] | None = None,
    budget_refusals: Mapping[str, str] | None = None,
) -> tuple[str, str] | None:
    """Which policy came closest to admitting the pod, and why it said no; ``None`` if one admits.

    Each policy is checked in stages: namespace (``namespaces``, ``namespaceSelector``), then
    pod labels, then priority, then budget. The policy that got furthest is the closest, because
    its refusal is the most useful to a human: "budget exhausted" says the pod is of the right
    kind, while "namespace not in [...]" only says this policy is about other pods. Ties go to
    the first policy in the order given (pass them sorted by name for stable messages).

    Budgets are not computed here: ``budget_refusals`` maps the name of a policy whose limits
    refuse this pod to the reason (e.g. ``"maxGPUs 8 reached"``). A policy that selects the pod
    and has no entry there admits it, and the result is ``None``. No policies: ``None`` too; the
    caller says "no OverflowPolicy exists".
    """
    refusals = budget_refusals or {}
    best: tuple[int, str, str] | None = None
    for policy in policies:
        stage, selected, reason = _selects(policy, pod=pod, namespace_labels=namespace_labels)
        if selected:
            if policy.name not in refusals:
                return None
            reason = refusals[policy.name]
        if best is None or stage > best[0]:
            best = (stage, policy.name, reason)
    return None if best is None else (best[1], best[2])


# ---- semantic checks -------------------------------------------------------------------------

SecretsPresent = Callable[[str, str, str], bool] | AbstractSet[tuple[str, str]]


def semantic_problems(
    *,
    policies: Iterable[OverflowPolicy],
    providers: Iterable[GPUProvider],
    secrets_present: SecretsPresent,
) -> dict[tuple[str, str], list[Problem]]:
    """What is wrong across objects, which no schema can see; keyed by ``(kind, name)``.

    Every object given gets an entry (an empty list when it is fine), so the caller can set
    ``Valid`` on each. Keys carry the kind because a policy and a provider may share a name.

    * a policy naming a GPUProvider that does not exist: ``spec.providers[i]``
      (``UnknownProvider``);
    * a policy ``gpuTypes`` entry that none of its existing providers maps:
      ``spec.gpuTypes[i]`` (``UnmappedGPUType``). A provider with an empty ``gpuTypes`` map
      passes names through to its adapter, so it counts as mapping every name;
    * a provider whose credentials Secret (or key) is missing: ``spec.credentialsSecret``
      (``SecretNotFound``). ``secrets_present`` is either a function ``(namespace, name, key)
      -> bool`` or a set of the ``(namespace, name)`` pairs that exist (keys not checked).
    """
    by_name = {p.name: p for p in providers}
    out: dict[tuple[str, str], list[Problem]] = {}
    for provider in by_name.values():
        problems: list[Problem] = []
        ref = provider.spec.credentials_secret
        if ref is not None and not _secret_exists(secrets_present, ref):
            problems.append(Problem(
                field="spec.credentialsSecret",
                message=f"Secret {ref.namespace}/{ref.name} (key {ref.key}) does not exist",
                reason=REASON_SECRET_NOT_FOUND,
            ))
        out[(KIND_PROVIDER, provider.name)] = problems
    for policy in policies:
        problems = []
        known = []
        for i, name in enumerate(policy.spec.providers):
            if name in by_name:
                known.append(by_name[name])
            else:
                problems.append(Problem(
                    field=f"spec.providers[{i}]",
                    message=f"GPUProvider {name} does not exist",
                    reason=REASON_UNKNOWN_PROVIDER,
                ))
        if known:  # with no known provider, the providers problem says it all
            for i, gpu in enumerate(policy.spec.gpu_types):
                if all(p.spec.cloud_gpu_id(gpu) is None for p in known):
                    problems.append(Problem(
                        field=f"spec.gpuTypes[{i}]",
                        message=f"no provider of this policy maps GPU type {gpu} "
                                f"(checked: {', '.join(p.name for p in known)})",
                        reason=REASON_UNMAPPED_GPU_TYPE,
                    ))
        out[(KIND_POLICY, policy.name)] = problems
    return out


def _secret_exists(present: SecretsPresent, ref: SecretRef) -> bool:
    if callable(present):
        return present(ref.namespace, ref.name, ref.key)
    return (ref.namespace, ref.name) in present


def valid_condition(problems: Sequence[Problem], *, observed_generation: int) -> dict[str, Any]:
    """The ``Valid`` condition for an object's problems, without ``lastTransitionTime``.

    The writer adds ``lastTransitionTime`` (kept when ``status`` did not change).
    """
    if not problems:
        return {"type": CONDITION_VALID, "status": "True", "reason": "Valid",
                "message": "", "observedGeneration": observed_generation}
    return {
        "type": CONDITION_VALID,
        "status": "False",
        "reason": problems[0].reason,
        "message": "; ".join(f"{p.field}: {p.message}" for p in problems),
        "observedGeneration": observed_generation,
    }

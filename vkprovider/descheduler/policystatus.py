"""An OverflowPolicy's status: its recent decisions and its three conditions, as pure functions.

Why it exists apart from :mod:`vkprovider.descheduler.admission`: admission and move-back both
record decisions, and the conditions (``Valid``, ``Ready``, ``BudgetExhausted``) are computed from
the policy, its GPUProviders and its usage alone, so unit tests and the docs can pin them without
a loop or a cluster. Transition times and decisions are read back from the stored object, so a
restarted companion (or a new leader) continues the story instead of starting an empty one.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vkprovider.placement import policy as pol
from vkprovider.placement.budget import Usage
from vkprovider.semantics.timefmt import format_time

Body = dict[str, Any]


@dataclass
class Decision:
    pod: str  # namespace/name
    decision: str  # one of pol.DECISIONS: Admitted | Refused | WouldAdmit | MovedBack | ...
    reason: str
    policy: str | None
    time: str = field(default_factory=lambda: format_time(datetime.now(UTC)))

    def as_status(self) -> Body:
        """The ``status.lastDecisions[]`` entry (the CRD caps ``reason`` at 1024 characters)."""
        return {"time": self.time, "pod": self.pod, "decision": self.decision,
                "reason": self.reason[:1024]}


def stored_decisions(obj: Mapping[str, Any]) -> list[Decision]:
    """The ``status.lastDecisions`` an OverflowPolicy object holds (malformed entries skipped)."""
    name = (obj.get("metadata") or {}).get("name")
    out = []
    for entry in (obj.get("status") or {}).get("lastDecisions") or []:
        if not isinstance(entry, Mapping):
            continue
        pod, decision, stamp = entry.get("pod"), entry.get("decision"), entry.get("time")
        if not (isinstance(pod, str) and isinstance(decision, str) and isinstance(stamp, str)):
            continue
        out.append(Decision(pod=pod, decision=decision, reason=str(entry.get("reason") or ""),
                            policy=name, time=stamp))
    return out[-pol.MAX_DECISIONS:]


# ---- policy conditions: pure, so unit tests and docs can pin them ----------------------------

#: ``Valid=False`` of a policy naming a GPUProvider that exists but is not valid itself.
REASON_INVALID_PROVIDER = "InvalidProvider"
#: ``Ready`` reasons of a policy (``Invalid`` when it is not Valid).
REASON_PROVIDER_READY = "ProviderReady"
REASON_NO_READY_PROVIDER = "NoReadyProvider"
REASON_PROVIDER_HEALTH_UNKNOWN = "ProviderHealthUnknown"
#: ``BudgetExhausted`` reasons: ``WithinLimits`` (False), else the first limit reached (True):
#: ``MaxPods``, ``MaxGPUs`` or ``MaxPricePerHour``.
REASON_WITHIN_LIMITS = "WithinLimits"

_PROVIDER_INDEX = re.compile(r"^spec\.providers\[(\d+)\]$")


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _observed(obj: Mapping[str, Any], cond: Mapping[str, Any]) -> bool:
    """Whether ``cond`` was computed from the object's current generation."""
    generation = (obj.get("metadata") or {}).get("generation")
    seen = cond.get("observedGeneration", (obj.get("status") or {}).get("observedGeneration"))
    return generation is None or seen is None or seen == generation


def broken_providers(providers: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """GPUProvider objects that cannot serve, by name: why (a schema problem, or their own
    ``Valid=False`` as the virtual kubelet wrote it for the current generation)."""
    out: dict[str, str] = {}
    for name, obj in providers.items():
        try:
            pol.parse_gpu_provider(obj)
        except pol.PolicyError as exc:
            out[name] = f"{exc.field}: {exc.message}"
            continue
        valid = _condition(obj, pol.CONDITION_VALID)
        if valid is not None and valid.get("status") == "False" and _observed(obj, valid):
            out[name] = str(valid.get("message") or valid.get("reason") or "Valid=False")
    return out


def policy_problems(*, policies: Sequence[pol.OverflowPolicy],
                    providers: Mapping[str, Mapping[str, Any]]) -> dict[str, list[pol.Problem]]:
    """What is wrong with each policy given the GPUProvider objects (by name) that exist.

    With no GPUProvider object at all, the providers come from the virtual nodes' settings files,
    which the companion cannot see: nothing is flagged (``Ready`` says the health is unknown).
    Otherwise, besides :func:`pol.semantic_problems` (a name with no object, a GPU type no
    provider maps), an entry naming an object that is not valid (a schema problem, or its own
    ``Valid=False``) is ``InvalidProvider`` at ``spec.providers[i]``: a policy whose providers
    are all missing or invalid can burst nothing, and is never ``Valid=True``.
    """
    if not providers:
        return {p.name: [] for p in policies}
    broken = broken_providers(providers)
    parsed = []
    for obj in providers.values():
        with contextlib.suppress(pol.PolicyError):  # unparsable: in ``broken`` already
            parsed.append(pol.parse_gpu_provider(obj))
    found = pol.semantic_problems(policies=policies, providers=parsed,
                                  secrets_present=lambda _ns, _name, _key: True)
    out: dict[str, list[pol.Problem]] = {}
    for policy in policies:
        problems = []
        for problem in found.get((pol.KIND_POLICY, policy.name), []):
            match = _PROVIDER_INDEX.match(problem.field)
            name = policy.spec.providers[int(match.group(1))] if match else None
            if name is not None and name in broken:  # it exists: say what is wrong with it
                problem = pol.Problem(field=problem.field, reason=REASON_INVALID_PROVIDER,
                                      message=f"GPUProvider {name} is not valid: {broken[name]}")
            problems.append(problem)
        for i, name in enumerate(policy.spec.providers):
            field_ = f"spec.providers[{i}]"
            if name in broken and not any(p.field == field_ for p in problems):
                problems.append(pol.Problem(
                    field=field_, reason=REASON_INVALID_PROVIDER,
                    message=f"GPUProvider {name} is not valid: {broken[name]}"))
        out[policy.name] = sorted(problems, key=_problem_order)
    return out


def _problem_order(problem: pol.Problem) -> tuple[int, int, str]:
    match = re.match(r"^spec\.(providers|gpuTypes)\[(\d+)\]$", problem.field)
    if match is None:
        return (2, 0, problem.field)
    return (0 if match.group(1) == "providers" else 1, int(match.group(2)), problem.field)


def ready_condition(*, policy: pol.OverflowPolicy, valid: bool,
                    providers: Mapping[str, Mapping[str, Any]]) -> Body:
    """``Ready``: Valid, and at least one of the policy's providers is Ready.

    A provider's readiness is its GPUProvider's own ``Ready`` condition (written by the virtual
    kubelet from the outcome of its cloud calls: Healthy or Degraded is Ready). ``Unknown``
    (``ProviderHealthUnknown``) when none is Ready and at least one has not been judged yet, or
    when the providers come from settings files (no GPUProvider objects), whose health the
    companion cannot see.
    """
    names = policy.spec.providers
    if not valid:
        status, reason, message = "False", "Invalid", "the policy is not valid (see Valid)"
    elif not providers:
        status, reason = "Unknown", REASON_PROVIDER_HEALTH_UNKNOWN
        message = (f"no GPUProvider objects: {', '.join(names)} come from the virtual nodes' "
                   f"settings files, whose health the companion cannot see")
    else:
        ready: list[str] = []
        pending: list[str] = []
        down: list[str] = []
        for name in names:
            obj = providers.get(name) or {}
            cond = _condition(obj, pol.CONDITION_READY)
            if cond is None or not _observed(obj, cond) or cond.get("status") == "Unknown":
                why = cond.get("reason") if cond is not None else None
                pending.append(f"{name}: {why or 'no status yet'}")
            elif cond.get("status") == "True":
                ready.append(f"{name} ({cond.get('reason') or 'Ready'})")
            else:
                down.append(f"{name}: {cond.get('reason') or 'not Ready'}")
        if ready:
            status, reason = "True", REASON_PROVIDER_READY
            message = f"ready: {', '.join(ready)}"
        elif pending:
            status, reason = "Unknown", REASON_PROVIDER_HEALTH_UNKNOWN
            message = f"no provider is Ready yet; {'; '.join([*pending, *down])}"
        else:
            status, reason = "False", REASON_NO_READY_PROVIDER
            message = f"no provider is Ready; {'; '.join(down)}"
    return {"type": pol.CONDITION_READY, "status": status, "reason": reason,
            "message": message, "observedGeneration": policy.generation}


def budget_condition(*, policy: pol.OverflowPolicy, usage: Usage,
                     price_per_gpu: float = 0.0) -> Body:
    """``BudgetExhausted``: True while a limit is reached (no further pod bursts until usage
    drops), naming every limit reached; the reason is the first of them.

    A $/h limit is reached when what runs outside costs it already, or when one more GPU at the
    price admission counts an unpriced pod at (``price_per_gpu``: the dearest offer the policy
    could take, or what its pods pay if higher) would exceed it.
    """
    limits = policy.spec.limits
    reached: list[tuple[str, str]] = []
    room: list[str] = []
    for reason, field_name, limit, used, unit in (
            ("MaxPods", "maxPods", limits.max_pods, usage.pods, "pods"),
            ("MaxGPUs", "maxGPUs", limits.max_gpus, usage.gpus, "GPUs")):
        if limit is None:
            continue
        if used >= limit:
            reached.append((reason, f"{field_name} {limit} reached ({used} {unit} outside)"))
        else:
            room.append(f"{used} of {field_name} {limit}")
    if limits.max_price_per_hour is not None:
        if (usage.price_per_hour >= limits.max_price_per_hour
                or usage.price_per_hour + price_per_gpu > limits.max_price_per_hour):
            more = (f"; one more GPU costs about ${price_per_gpu:.2f}/h" if price_per_gpu
                    and usage.price_per_hour < limits.max_price_per_hour else "")
            reached.append(("MaxPricePerHour",
                            f"maxPricePerHour ${limits.max_price_per_hour:.2f} reached "
                            f"(${usage.price_per_hour:.2f}/h outside{more})"))
        else:
            room.append(f"${usage.price_per_hour:.2f}/h of maxPricePerHour "
                        f"${limits.max_price_per_hour:.2f}")
    if reached:
        status, reason = "True", reached[0][0]
        message = "; ".join(m for _r, m in reached)
    else:
        status, reason = "False", REASON_WITHIN_LIMITS
        message = f"room left: {', '.join(room)}" if room else "the policy sets no limit"
    return {"type": pol.CONDITION_BUDGET_EXHAUSTED, "status": status, "reason": reason,
            "message": message, "observedGeneration": policy.generation}


def with_transition_times(conditions: Sequence[Body], old: Sequence[Mapping[str, Any]], *,
                          now: datetime) -> list[Body]:
    """Add ``lastTransitionTime``: kept from ``old`` while a condition's status is unchanged."""
    before = {c.get("type"): c for c in old if isinstance(c, Mapping)}
    out = []
    for cond in conditions:
        prev = before.get(cond["type"])
        since = (prev.get("lastTransitionTime") if prev is not None
                 and prev.get("status") == cond["status"] else None)
        out.append({**cond, "lastTransitionTime": since or format_time(now)})
    return out


def policy_conditions(*, policy: pol.OverflowPolicy, problems: Sequence[pol.Problem],
                      usage: Usage, providers: Mapping[str, Mapping[str, Any]],
                      old: Sequence[Mapping[str, Any]], now: datetime,
                      price_per_gpu: float = 0.0) -> list[Body]:
    """``Valid``, ``Ready`` and ``BudgetExhausted`` of one policy, as ``status.conditions``.

    ``providers`` are the GPUProvider objects by name (as listed, status included); ``old`` the
    conditions stored now, whose ``lastTransitionTime`` is kept while the status is unchanged;
    ``price_per_gpu`` what one GPU of this policy costs outside now (0: not known).
    """
    valid = pol.valid_condition(problems, observed_generation=policy.generation)
    conditions = [valid,
                  ready_condition(policy=policy, valid=not problems, providers=providers),
                  budget_condition(policy=policy, usage=usage, price_per_gpu=price_per_gpu)]
    return with_transition_times(conditions, old, now=now)

"""Pre-warm, the parts that need no I/O: what a gang displaces, which replicas go first, and
what the controller does next from what it sees.

Why it exists: the pre-warm admission check (:mod:`vkprovider.descheduler.prewarm`) is a small
state machine over objects it does not own (a Kueue Workload, Deployments, pods). Keeping the
decisions pure means unit tests pin them, and a restarted companion takes the same decision from
the same objects: everything it needs is in the API (the Workload's check state, the intent
annotation on each surged Deployment), nothing only in memory.

* :func:`gang_of`: the gang's pods from the Workload's ``spec.podSets`` (count x the template's
  requests), each template constrained to the nodes of the flavor Kueue assigned
  (``status.admission.podSetAssignments[].flavors`` -> the ResourceFlavor's ``spec.nodeLabels``,
  which Kueue injects as a nodeSelector at admission).
* :func:`displacement`: whole pods against free internal GPUs per node, with the node checks of
  :mod:`vkprovider.descheduler.fit` (taints, cordons, readiness, nodeSelector, required
  affinity). A gang pod that fits in free GPUs displaces nothing; otherwise, as the scheduler's
  preemption does, the node needing the least (lowest highest-victim priority, then fewest
  victims) gives up its lowest-priority pods below the gang's priority until the pod fits. An
  unhealthy node (a health taint, a withdrawn GPU) has no free GPUs here, but when its taints
  let the gang's pods in (``PreferNoSchedule``, a toleration) its pods are victims like any
  other: the scheduler does not know about health and preempts there too.
* :class:`Intent` and :func:`next_action`: the intent recorded on each surged Deployment
  (annotation ``vkprovider.io/prewarm``, JSON) and the transition function.
* :func:`replanning` and :func:`grow`: the displacement is not planned once. Between the plan
  and the check turning Ready, replicas can land on the GPUs that were free when it was planned
  (the surge's own pods first: the scheduler puts them inside while there is room), and the gang
  then preempts more than was surged. While every intent is Surging and the check is Pending,
  the plan is made again each pass and the surge grows to match; it never shrinks while pending
  (a surge replica already serving is kept: the whole surge is undone at the scale-back anyway,
  and a plan that shrank and grew back would churn cloud instances for nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from vkprovider.descheduler.fit import GPU, node_problem, requests_of

Body = dict[str, Any]

#: ``spec.controllerName`` of the AdmissionChecks this controller serves.
CONTROLLER_NAME = "vkprovider.io/prewarm"
#: Annotation on a surged Deployment: the :class:`Intent`, JSON.
INTENT = "vkprovider.io/prewarm"
#: Label on a surged Deployment (value ``"true"``): admission watches only these.
LABEL = "vkprovider.io/prewarm"

Phase = Literal["Surging", "Ready", "Restoring"]
SURGING: Phase = "Surging"
READY: Phase = "Ready"
RESTORING: Phase = "Restoring"


# ---- the intent on a Deployment ----------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    """What a pre-warm did to one Deployment, recorded on it before it is scaled.

    ``replicas`` is N before the surge; the surge target is always the absolute ``replicas +
    surge`` (never "one more than now"), so a restarted companion that repeats a step can never
    surge twice. ``outcome`` is set with phase ``Restoring``: the check state to write once the
    Deployment is back at N (``Ready``, ``Retry``, or ``""`` for none) and its message.
    """

    workload: str  # namespace/name
    workload_uid: str
    check: str  # the AdmissionCheck's name
    replicas: int
    surge: int
    phase: Phase
    started: float  # epoch seconds the surge was recorded
    policy: str
    victims: tuple[str, ...] = ()  # names of the internal pods expected to be preempted
    hpa: str | None = None
    hpa_min: int | None = None
    ready_at: float | None = None
    outcome: str = ""  # with Restoring: Ready | Retry | "" (no check to write)
    message: str = ""
    scaled_back: int | None = None  # set in the write that took the surge back: to this count

    @property
    def target(self) -> int:
        return self.replicas + self.surge

    def dumps(self) -> str:
        body = asdict(self)
        body["victims"] = list(self.victims)
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> Intent:
        """Raises ValueError for anything that is not an intent this code wrote."""
        try:
            body = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        try:
            intent = cls(**{**body, "victims": tuple(body.get("victims") or ())})
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if intent.phase not in (SURGING, READY, RESTORING):
            raise ValueError(f"unknown phase {intent.phase!r}")
        if not (isinstance(intent.replicas, int) and isinstance(intent.surge, int)
                and intent.replicas >= 0 and intent.surge >= 1):
            raise ValueError("replicas and surge must be whole numbers (surge >= 1)")
        if intent.scaled_back is not None and not isinstance(intent.scaled_back, int):
            raise ValueError("scaled_back must be a whole number")
        return intent

    def moved(self, **changes: Any) -> Intent:
        return replace(self, **changes)


def intent_of(dep: Mapping[str, Any]) -> Intent | None:
    """The intent recorded on a Deployment, None if there is none; ValueError if unreadable."""
    raw = ((dep.get("metadata") or {}).get("annotations") or {}).get(INTENT)
    return None if not raw else Intent.loads(str(raw))


def deployment_of_pod(pod: Mapping[str, Any]) -> str | None:
    """``namespace/name`` of the Deployment owning a pod through its ReplicaSet, from the pod
    alone: the ReplicaSet of a Deployment is named ``<deployment>-<pod-template-hash>``."""
    meta = pod.get("metadata") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller", True)),
                 None)
    template_hash = (meta.get("labels") or {}).get("pod-template-hash")
    if owner is None or owner.get("kind") != "ReplicaSet" or not template_hash:
        return None
    name = str(owner.get("name") or "")
    if not name.endswith(f"-{template_hash}"):
        return None
    return f"{meta.get('namespace')}/{name.removesuffix(f'-{template_hash}')}"


def admission_role(pod: Mapping[str, Any], intents: Mapping[str, Intent]) -> str | None:
    """What overflow admission does with an unschedulable pod of a pre-warmed Deployment.

    ``"now"``: the Deployment is Surging, the pod is a surge replica: admit it without waiting
    ``overflowAfter``. ``"hold"``: the surge is Ready or being undone: a Pending pod of it is a
    replacement of a preempted replica that the scale-back will remove, so it is not admitted
    (no instance is started for nothing). None: not pre-warmed, admission as usual.
    """
    key = deployment_of_pod(pod)
    intent = intents.get(key) if key else None
    if intent is None:
        return None
    return "now" if intent.phase == SURGING else "hold"


# ---- the gang ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GangPod:
    podset: str
    gpus: int
    spec: Mapping[str, Any]  # the pod template's spec, the flavor's node labels merged in


def gang_of(workload: Mapping[str, Any], flavor_labels: Mapping[str, Mapping[str, str]]
            ) -> list[GangPod]:
    """One entry per pod of the gang (``podSets[].count``), the biggest first."""
    assigned = {a.get("name", "main"): a for a in
                ((workload.get("status") or {}).get("admission") or {}).get(
                    "podSetAssignments") or []}
    out: list[GangPod] = []
    for podset in (workload.get("spec") or {}).get("podSets") or []:
        name = str(podset.get("name") or "main")
        spec = dict(((podset.get("template") or {}).get("spec")) or {})
        assignment = assigned.get(name) or {}
        labels: dict[str, str] = {}
        for flavor in (assignment.get("flavors") or {}).values():
            labels.update(flavor_labels.get(flavor) or {})
        if labels:
            spec["nodeSelector"] = {**labels, **(spec.get("nodeSelector") or {})}
        count = int(assignment.get("count") or podset.get("count") or 0)
        gpus = requests_of(spec).get(GPU, 0)
        out.extend(GangPod(podset=name, gpus=gpus, spec=spec) for _ in range(count))
    return sorted(out, key=lambda p: -p.gpus)


def workload_priority(workload: Mapping[str, Any]) -> int:
    value = (workload.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0


# ---- displacement --------------------------------------------------------------------------------


@dataclass
class Displacement:
    """What a gang will displace: pods the plan can pre-warm, and the rest."""

    victims: list[Body] = field(default_factory=list)  # pre-warmable (a policy admits them)
    others: list[Body] = field(default_factory=list)  # lower priority, displaced, not pre-warmed
    free_pods: int = 0  # gang pods that fit in free GPUs
    displacing_pods: int = 0  # gang pods that need preemption
    unplaced: list[str] = field(default_factory=list)  # gang pods that fit nowhere, and why

    def summary(self) -> str:
        parts = [f"{self.free_pods} gang pod(s) fit in free GPUs",
                 f"{self.displacing_pods} displace {len(self.victims) + len(self.others)} "
                 f"replica(s)"]
        if self.others:
            parts.append(f"{len(self.others)} of them no OverflowPolicy pre-warms")
        if self.unplaced:
            parts.append(f"{len(self.unplaced)} fit on no internal node ({self.unplaced[0]})")
        return "; ".join(parts)


def _priority(pod: Mapping[str, Any]) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0


def displacement(*, gang: Sequence[GangPod], priority: int, nodes: Iterable[Body],
                 pods: Iterable[Body], exclude_nodes: AbstractSet[str],
                 prewarmable: Callable[[Body], bool],
                 claimed: AbstractSet[str] = frozenset()) -> Displacement:
    """Place the gang, whole pods, on internal nodes; return the pods it displaces.

    ``nodes`` and ``pods`` are the slim projections of :mod:`vkprovider.descheduler.fit`
    (pods with ``spec.priority``). ``prewarmable(pod)`` says whether an OverflowPolicy would
    pre-warm a victim. ``claimed`` are pods (``namespace/name``) another pre-warm already counts
    as displaced:
    their GPUs go to that gang, so they are neither free nor victims here.
    """
    nodes_by_name = {n["metadata"]["name"]: n for n in nodes
                     if n["metadata"]["name"] not in exclude_nodes}
    used: dict[str, dict[str, int]] = {name: {} for name in nodes_by_name}
    on_node: dict[str, list[Body]] = {name: [] for name in nodes_by_name}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if (node not in nodes_by_name or pod["status"].get("phase") in ("Succeeded", "Failed")):
            continue
        acc = used[node]
        for k, v in pod["spec"]["requests"].items():
            acc[k] = acc.get(k, 0) + v
        if _key(pod) in claimed or pod["metadata"].get("deletionTimestamp"):
            continue  # going anyway: not a victim of this gang
        on_node[node].append(pod)
    for name, obj in nodes_by_name.items():
        if obj["status"].get("unhealthy"):
            # Its free GPUs never count as free (the gang is not assumed to fit there), but the
            # scheduler still places gang pods there when the taint allows (PreferNoSchedule, a
            # toleration) and preempts what runs there: its pods stay candidate victims.
            used[name][GPU] = obj["status"]["allocatable"].get(GPU, 0)
    out = Displacement()
    for member in gang:
        eligible = [name for name in sorted(nodes_by_name)
                    if node_problem(pod_spec=member.spec, node=nodes_by_name[name], used={},
                                    need={}, ignore_health=True) is None]
        if not eligible:
            out.unplaced.append(f"{member.podset}: no internal node matches its "
                                f"selectors, taints or affinity")
            continue

        def free(name: str) -> int:
            alloc: int = nodes_by_name[name]["status"]["allocatable"].get(GPU, 0)
            return alloc - used[name].get(GPU, 0)

        fitting = [n for n in eligible if free(n) >= member.gpus]
        if fitting:
            best = min(fitting, key=lambda n: (free(n), n))  # best fit: the tightest node
            used[best][GPU] = used[best].get(GPU, 0) + member.gpus
            out.free_pods += 1
            continue
        options: list[tuple[tuple[int, int, str], str, list[Body]]] = []
        for name in eligible:
            lower = sorted((p for p in on_node[name] if _priority(p) < priority),
                           key=lambda p: (_priority(p), -_gpus(p),
                                          p["metadata"].get("creationTimestamp") or ""))
            room, chosen = free(name), []
            for pod in lower:
                if room >= member.gpus:
                    break
                if not _gpus(pod):
                    continue
                chosen.append(pod)
                room += _gpus(pod)
            if room >= member.gpus:
                top = max(_priority(p) for p in chosen) if chosen else -(2**31)
                options.append(((top, len(chosen), name), name, chosen))
        if not options:
            out.unplaced.append(f"{member.podset}: needs {member.gpus} GPU(s); no internal node "
                                f"frees that many from lower-priority pods")
            continue
        _rank, node, chosen = min(options, key=lambda o: o[0])
        out.displacing_pods += 1
        for pod in chosen:
            on_node[node].remove(pod)
            used[node][GPU] = used[node].get(GPU, 0) - _gpus(pod)
            (out.victims if prewarmable(pod) else out.others).append(pod)
        used[node][GPU] = used[node].get(GPU, 0) + member.gpus
    return out


def _key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"


def _gpus(pod: Mapping[str, Any]) -> int:
    return int((pod.get("spec") or {}).get("requests", {}).get(GPU, 0))


def group_by_deployment(victims: Iterable[Body]) -> dict[str, list[Body]]:
    """Victims by ``namespace/deployment`` (pods not owned by a Deployment are left out)."""
    out: dict[str, list[Body]] = {}
    for pod in victims:
        key = deployment_of_pod(pod)
        if key is not None:
            out.setdefault(key, []).append(pod)
    return out


# ---- the AdmissionCheck's parameters ------------------------------------------------------------


def check_problem(check: Mapping[str, Any], policies: Mapping[str, object]
                  ) -> tuple[str, str] | None:
    """Why an AdmissionCheck of this controller cannot work: ``(field, message)``, or None.

    ``spec.parameters`` is optional; when given it must name an OverflowPolicy
    (``apiGroup: vkprovider.io``, ``kind: OverflowPolicy``) that exists, is valid and has
    ``spec.prewarm.enabled``: only the replicas that policy selects are pre-warmed, under its
    ``prewarm`` settings. ``policies`` maps each OverflowPolicy name to its parsed policy, or to
    the :class:`~vkprovider.placement.policy.PolicyError` it failed with.
    """
    params = (check.get("spec") or {}).get("parameters")
    if params is None:
        return None
    if not isinstance(params, Mapping):
        return "spec.parameters", "must be a reference to an OverflowPolicy"
    group, kind, name = params.get("apiGroup"), params.get("kind"), params.get("name")
    if group != "vkprovider.io":
        return ("spec.parameters.apiGroup",
                f"must be vkprovider.io (parameters name an OverflowPolicy), not {group!r}")
    if kind != "OverflowPolicy":
        return "spec.parameters.kind", f"must be OverflowPolicy, not {kind!r}"
    if not isinstance(name, str) or name not in policies:
        return "spec.parameters.name", f"OverflowPolicy {name} does not exist"
    policy = policies[name]
    enabled = getattr(getattr(getattr(policy, "spec", None), "prewarm", None), "enabled", None)
    if enabled is None:
        return "spec.parameters.name", f"OverflowPolicy {name} is not valid: {policy}"
    if not enabled:
        return ("spec.parameters.name",
                f"OverflowPolicy {name} has spec.prewarm.enabled false: it pre-warms nothing")
    return None


#: ``Active=False`` reasons of an AdmissionCheck this controller cannot serve.
REASON_INVALID_PARAMETERS = "InvalidParameters"
REASON_UNSUPPORTED_KUEUE = "UnsupportedKueueVersion"
ACTIVE_MESSAGE = "vkprovider pre-warms inference displaced by admitted gangs"


def check_active(check: Mapping[str, Any], policies: Mapping[str, object], *,
                 kueue_problem: str = "") -> tuple[str, str, str]:
    """The ``Active`` condition (status, reason, message) of an AdmissionCheck of this
    controller: ``False`` with ``UnsupportedKueueVersion`` when the Kueue installed is one this
    code does not speak (``kueue_problem`` says why), ``False`` with ``InvalidParameters`` when
    its parameters make no sense (:func:`check_problem`), else ``True``."""
    if kueue_problem:
        return "False", REASON_UNSUPPORTED_KUEUE, kueue_problem
    problem = check_problem(check, policies)
    if problem is not None:
        return "False", REASON_INVALID_PARAMETERS, f"{problem[0]}: {problem[1]}"
    return "True", "Active", ACTIVE_MESSAGE


# ---- the transition function -------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadView:
    """What the controller sees of one Workload and its gang."""

    exists: bool = True
    quota_reserved: bool = False
    admitted: bool = False
    finished: bool = False
    check_state: str | None = None  # Pending | Ready | Retry | Rejected; None: not listed
    gang_bound: bool = False  # every pod of the gang is bound to a node
    victims_gone: bool = False  # every recorded victim is gone or terminating
    evicted: bool = False  # Kueue evicted it (condition Evicted=True): it acted on a Retry


@dataclass(frozen=True)
class Surged:
    """One recorded intent and its Deployment's ready replicas now."""

    intent: Intent
    ready: int


ActionKind = Literal["idle", "plan", "surge", "ready", "restore"]


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str = ""
    check: str = ""  # with restore: the check state to write afterwards (Ready, Retry) or ""


def next_action(view: WorkloadView, surged: Sequence[Surged], *, now: float, timeout: float,
                on_timeout: str = "Proceed") -> Action:
    """What to do next for one Workload, from what is in the API only (restart-safe).

    * no intent: ``plan`` when the check is Pending on a Workload with quota reserved and not
      admitted yet; else ``idle``;
    * an intent ``Restoring``: finish it (``restore``, then write the recorded outcome);
    * the Workload gone, finished, without quota, or its check Retry/Rejected: ``restore``;
    * all ``Surging``: ``ready`` once every Deployment has ``replicas + surge`` Ready, else
      after ``timeout`` since the surge was recorded ``restore`` and then the check ``Ready``
      (``Proceed``) or ``Retry``; else ``surge`` (make sure the scale is set, and wait);
    * ``Ready`` (some still ``Surging``: a restart while marking): ``ready`` again while the check
      is not Ready yet; once Kueue admitted the gang and it is bound (or every expected victim
      is gone), ``restore``; ``timeout`` after Ready without that: ``restore`` too.
    """
    if not surged:
        if (view.exists and view.quota_reserved and not view.admitted and not view.finished
                and view.check_state == "Pending"):
            return Action("plan")
        return Action("idle")
    intents = [s.intent for s in surged]
    restoring = next((i for i in intents if i.phase == RESTORING), None)
    if restoring is not None:
        return Action("restore", reason=restoring.message or "finishing a scale-back",
                      check=restoring.outcome)
    if not view.exists:
        return Action("restore", reason="the Workload is gone")
    if view.finished:
        return Action("restore", reason="the Workload finished")
    if not view.quota_reserved and not view.admitted:
        return Action("restore", reason="the Workload no longer holds quota")
    if view.check_state in ("Retry", "Rejected"):
        return Action("restore", reason=f"the check is {view.check_state}")
    started = min(i.started for i in intents)
    if all(i.phase == SURGING for i in intents):
        if all(s.ready >= s.intent.target for s in surged):
            return Action("ready")
        if now - started > timeout:
            short = sum(max(0, s.intent.target - s.ready) for s in surged)
            check = "Retry" if on_timeout == "Retry" else "Ready"
            return Action("restore", check=check,
                          reason=f"timed out after {timeout:.0f}s with {short} surge "
                                 f"replica(s) not Ready")
        return Action("surge")
    if view.check_state != "Ready":
        return Action("ready")
    if view.admitted and (view.gang_bound or view.victims_gone):
        return Action("restore", reason="the gang runs: the surge replaced the preempted "
                                        "replicas")
    ready_at = min((i.ready_at or i.started) for i in intents)
    if now - ready_at > timeout:
        return Action("restore", reason=f"the gang did not displace the replicas within "
                                        f"{timeout:.0f}s of Ready")
    return Action("idle")


# ---- re-planning while the check is Pending ----------------------------------------------------


def replanning(view: WorkloadView, surged: Sequence[Surged]) -> bool:
    """Whether the displacement is planned again before the next step: a surge is recorded,
    every intent is still ``Surging`` (nothing marked Ready, nothing being undone) and the check
    is ``Pending`` on a Workload holding quota that Kueue has not admitted."""
    return (bool(surged) and all(s.intent.phase == SURGING for s in surged)
            and view.exists and view.quota_reserved and not view.admitted
            and not view.finished and view.check_state == "Pending")


@dataclass(frozen=True)
class Growth:
    """What a new plan adds to the recorded surge."""

    grown: dict[str, tuple[Intent, Intent]] = field(default_factory=dict)  # key -> (was, now)
    new: dict[str, list[Body]] = field(default_factory=dict)  # Deployments not surged yet

    def __bool__(self) -> bool:
        return bool(self.grown or self.new)


def grow(*, intents: Mapping[str, Intent], victims: Mapping[str, Sequence[Body]]) -> Growth:
    """Compare a new plan (victims by ``namespace/deployment``) with the recorded intents (by
    the same key): a Deployment that now loses more replicas than it surged gets the bigger
    surge (and the new plan's victims); one that loses replicas and was not surged is new. A
    smaller count changes nothing (never shrink while pending)."""
    out = Growth()
    for key, pods in sorted(victims.items()):
        intent = intents.get(key)
        if intent is None:
            out.new[key] = list(pods)
        elif len(pods) > intent.surge:
            out.grown[key] = (intent, intent.moved(
                surge=len(pods), victims=tuple(p["metadata"]["name"] for p in pods)))
    return out


# ---- applying a recorded outcome, and how long a Workload has waited ---------------------------


def outcome_to_write(*, outcome: str, view: WorkloadView) -> str | None:
    """The check state to write for the ``outcome`` recorded on a Restoring intent, or None.

    The outcome is recorded first and the check written after it; a restart in between must
    still write it (else the gang waits a second full timeout and Kueue never sees ``Retry``).
    So it is written whenever the check is still ``Pending`` on a Workload that holds quota and
    was not evicted; not once Kueue acted on it (a ``Retry`` evicts the Workload, releases its
    quota and puts the check back to ``Pending``: writing it again would retry twice)."""
    if not outcome or not view.exists:
        return None
    if view.check_state != "Pending" or not view.quota_reserved or view.evicted:
        return None
    return "Retry" if outcome == "Retry" else "Ready"


def waiting_since(workload: Mapping[str, Any], check: str) -> str | None:
    """When the pre-warm of ``workload`` started waiting (RFC 3339), for its timeout: when Kueue
    reserved quota (condition ``QuotaReserved=True``'s transition), which is when the check has
    work to do; a gang that queued an hour for quota has not waited an hour for its pre-warm.
    Falls back to the check's own transition time (None when neither is there)."""
    status = workload.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "QuotaReserved" and cond.get("status") == "True" and cond.get(
                "lastTransitionTime"):
            return str(cond["lastTransitionTime"])
    for entry in status.get("admissionChecks") or []:
        if entry.get("name") == check and entry.get("lastTransitionTime"):
            return str(entry["lastTransitionTime"])
    return None

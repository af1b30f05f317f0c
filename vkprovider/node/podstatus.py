"""Derive a pod's ``status`` (and its cloud annotations) from what the cloud reports.

Why it exists: the pod controller is level-triggered. Every sweep it holds the pod as the API
server has it and the ``Instance`` the cloud reports, and needs the status the pod *should* have,
plus a cheap "did anything change" test so that it patches ``pods/status`` only on change. Keeping
this pure (the clock is passed in) makes the rules testable without a cluster:

* Phase never goes backwards. Order: Pending/Unknown < Running < Succeeded/Failed. A terminal
  phase is final: the current status is returned unchanged. If the pod is Running and the cloud
  says PENDING (a cloud-side restart) or reports no instance, the pod stays Running but its
  container is shown waiting and not ready, as the kubelet shows a restarting container. Whether a
  vanished instance should fail the pod is the controller's decision (``failed_status``).
* Instance TERMINATING keeps the current phase and marks the pod not ready.
* ``lastTransitionTime`` of a condition is kept while its ``status`` does not change; the running
  container's ``startedAt`` and the pod's ``startTime`` and IPs are kept once set, so a sweep with
  no news produces an identical status.
* Pods rejected before any cloud call get ``failed_status``: phase Failed, pod ``reason`` and
  ``message`` (what ``kubectl get pods`` shows) and the container ``terminated`` with that reason
  and exit code 1 (the container never ran, but Kubernetes expects the containers of a terminal
  pod to be terminated).
* A missing Secret/ConfigMap gets ``config_pending_status``: phase Pending, container waiting with
  ``CreateContainerConfigError``, exactly as the kubelet reports it.
* Conditions of types this module does not own (readiness gates, DisruptionTarget, ...) are carried
  over untouched; Ready also requires every readiness gate's condition to be True. Carried over
  from a copy that may be stale: a write that meets a conflict sends only what changed relative
  to the copy (kube/podstatus_write.py), so a carried value never overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from providers.base import Instance, InstanceState
from vkprovider.kube.sharing import copy_dict
from vkprovider.node.interruption import CONDITION_PLANNED, planned_condition
from vkprovider.semantics.timefmt import format_time

__all__ = [
    "ANNOTATION_PREFIX",
    "CONTAINER_ID_SCHEME",
    "compute_status",
    "config_pending_status",
    "crash_loop_status",
    "failed_status",
    "image_pull_status",
    "instance_annotations",
    "status_changed",
]

ANNOTATION_PREFIX = "vkprovider.io/"
CONTAINER_ID_SCHEME = "vkprovider://"

PENDING = "Pending"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
_TERMINAL = frozenset({SUCCEEDED, FAILED})
_RANK = {"Pending": 0, "Unknown": 0, RUNNING: 1, SUCCEEDED: 2, FAILED: 2}

_OWNED_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")
#: Keys whose value may change without the status changing in substance.
_FLAPPING_KEYS = frozenset({"lastProbeTime", "lastTransitionTime", "lastHeartbeatTime"})


def _map(obj: Any, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _list(obj: Any, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, list) else []


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = _list(_map(pod, "spec"), "containers")
    first = containers[0] if containers else None
    return first if isinstance(first, Mapping) else {}


def _current_container_status(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for status in _list(_map(pod, "status"), "containerStatuses"):
        if isinstance(status, Mapping) and status.get("name") == name:
            return status
    return {}


# --------------------------------------------------------------------------------------------
# Building blocks


def _conditions(
    *,
    pod: Mapping[str, Any],
    phase: str,
    ready: bool,
    container_name: str,
    now: datetime,
) -> list[dict[str, Any]]:
    current = [c for c in _list(_map(pod, "status"), "conditions") if isinstance(c, Mapping)]
    by_type = {c.get("type"): c for c in current}
    stamp = format_time(now)

    def condition(ctype: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
        status = "True" if ok else "False"
        previous = by_type.get(ctype, {})
        since = previous.get("lastTransitionTime") if previous.get("status") == status else None
        out: dict[str, Any] = {
            "type": ctype,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": since or stamp,
        }
        if not ok and reason:
            out["reason"] = reason
        if not ok and message:
            out["message"] = message
        return out

    if phase == SUCCEEDED:
        not_ready_reason, not_ready_message = "PodCompleted", ""
    elif phase == FAILED:
        not_ready_reason, not_ready_message = "PodFailed", ""
    else:
        not_ready_reason = "ContainersNotReady"
        not_ready_message = f"containers with unready status: [{container_name}]"

    gates = [
        g.get("conditionType")
        for g in _list(_map(pod, "spec"), "readinessGates")
        if isinstance(g, Mapping) and g.get("conditionType")
    ]
    missing = [g for g in gates if _map_get(by_type.get(g), "status") != "True"]
    if ready and missing:
        ready_cond = condition(
            "Ready",
            False,
            "ReadinessGatesNotReady",
            "corresponding condition of pod readiness gate "
            + ", ".join(f'"{g}"' for g in missing)
            + " does not exist or is not True",
        )
    else:
        ready_cond = condition("Ready", ready, not_ready_reason, not_ready_message)

    owned = [
        condition("PodScheduled", True),
        condition("Initialized", True),
        condition("ContainersReady", ready, not_ready_reason, not_ready_message),
        ready_cond,
    ]
    foreign = [dict(c) for c in current if c.get("type") not in _OWNED_CONDITIONS]
    return owned + foreign


def _map_get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _container_status(
    *,
    pod: Mapping[str, Any],
    instance: Instance | None,
    state: dict[str, Any],
    ready: bool,
) -> dict[str, Any]:
    container = _container(pod)
    name = container.get("name", "")
    current = _current_container_status(pod, name)
    restarts = instance.restart_count if instance is not None else 0
    current_restarts = current.get("restartCount")
    if isinstance(current_restarts, int):
        restarts = max(restarts, current_restarts)
    out: dict[str, Any] = {
        "name": name,
        "image": container.get("image", ""),
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": restarts,
        "state": state,
        "lastState": {},
    }
    if instance is not None:
        out["containerID"] = f"{CONTAINER_ID_SCHEME}{instance.id}"
    elif current.get("containerID"):
        out["containerID"] = current["containerID"]
    return out


def _previous_started_at(pod: Mapping[str, Any]) -> str | None:
    current = _current_container_status(pod, _container(pod).get("name", ""))
    for kind in ("running", "terminated"):
        started = _map(_map(current, "state"), kind).get("startedAt")
        if isinstance(started, str) and started:
            return started
    return None


def _base_status(pod: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    status = copy_dict(_map(pod, "status"))
    status.pop("reason", None)
    status.pop("message", None)
    if "startTime" not in status:
        status["startTime"] = format_time(now)
    return status


# --------------------------------------------------------------------------------------------
# Public API


def compute_status(
    *, pod: Mapping[str, Any], instance: Instance | None, node_name: str, now: datetime,
    probe_started: bool | None = None, probe_ready: bool | None = None,
) -> dict[str, Any]:
    """The ``status`` the pod should have, given the instance the cloud reports (or None).

    ``node_name`` is this virtual node: a pod bound to another node is returned unchanged (this node
    never writes another node's pod status). ``probe_started``/``probe_ready``: what the first
    container's startup and readiness probes say (None: it has no probes, so a running instance
    is started and ready). The rules are in the module docstring.
    """
    current = _map(pod, "status")
    current_phase = current.get("phase") or PENDING
    if current_phase in _TERMINAL:
        return copy_dict(current)
    bound_to = _map(pod, "spec").get("nodeName")
    if bound_to and bound_to != node_name:
        return copy_dict(current)

    status = _base_status(pod, now)
    state_of = instance.state if instance is not None else None
    message = (instance.message or "") if instance is not None else ""

    phase: str
    state: dict[str, Any]
    ready = False
    if state_of == InstanceState.RUNNING:
        phase = RUNNING
        started = _started_at(instance, pod, now)
        state = {"running": {"startedAt": started}}
        ready = (probe_ready is not False) and (probe_started is not False)
    elif state_of in (InstanceState.SUCCEEDED, InstanceState.FAILED):
        assert instance is not None
        succeeded = state_of == InstanceState.SUCCEEDED
        phase = SUCCEEDED if succeeded else FAILED
        exit_code = (
            instance.exit_code if instance.exit_code is not None else (0 if succeeded else 1)
        )
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": "Completed" if succeeded else "Error",
            "finishedAt": format_time(instance.finished_at or now),
        }
        started_at = (
            format_time(instance.started_at) if instance.started_at else _previous_started_at(pod)
        )
        if started_at:
            terminated["startedAt"] = started_at
        if message:
            terminated["message"] = message
        state = {"terminated": terminated}
    elif state_of == InstanceState.TERMINATING:
        phase = current_phase if current_phase in _RANK else PENDING
        if phase == RUNNING:
            state = {"running": {"startedAt": _started_at(instance, pod, now)}}
        else:
            state = _waiting("ContainerCreating", message)
    else:  # PENDING or no instance yet; the invariant below keeps a Running pod Running
        phase = PENDING
        state = _waiting("ContainerCreating", message)

    # Phase never goes backwards.
    if _RANK.get(phase, 0) < _RANK.get(current_phase, 0):
        phase = current_phase
    status["phase"] = phase
    status["conditions"] = _conditions(
        pod=pod, phase=phase, ready=ready, container_name=_container(pod).get("name", ""), now=now
    )
    if instance is not None and instance.interruption_at is not None:  # a cloud's notice
        _set_condition(status["conditions"], planned_condition(
            instance, previous=next((c for c in status["conditions"]
                                     if c.get("type") == CONDITION_PLANNED), None), now=now))
    container_status = _container_status(pod=pod, instance=instance, state=state, ready=ready)
    if "running" in state and probe_started is False:
        container_status["started"] = False
    status["containerStatuses"] = [container_status]
    host_ip = instance.ip if instance is not None and instance.ip else None
    if host_ip:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    pod_ip = reachable_pod_ip(pod, instance) if instance is not None else None
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


def _set_condition(conditions: list[dict[str, Any]], condition: dict[str, Any] | None) -> None:
    if condition is None:
        return
    conditions[:] = [c for c in conditions if c.get("type") != condition["type"]]
    conditions.append(condition)


def reachable_pod_ip(pod: Mapping[str, Any], instance: Instance) -> str | None:
    """The pod IP to report: an address at which EVERY declared container port is reached on
    its own number (a one-to-one mapping), else None.

    The stock EndpointSlice controller publishes ``podIP:targetPort`` for every Service that
    selects the pod; an IP whose ports the cloud remaps (RunPod, Vast.ai, the mock) or a
    hostname-only cloud (SaladCloud) would be published unreachable. Without a pod IP the stock
    controller leaves the pod out, and the provider's own EndpointSlices say how it is reached.
    A pod that declares no ports gets no IP: nothing says what of it is reachable.
    """
    declared = {(p.get("containerPort"), str(p.get("protocol") or "TCP"))
                for p in _list(_container(pod), "ports") if isinstance(p, Mapping)}
    if not declared or instance.state != InstanceState.RUNNING:
        return None
    hosts = set()
    for port, protocol in declared:
        direct = [p for p in instance.published
                  if p.container_port == port and p.protocol == protocol and p.kind == "ip"
                  and p.port == port and p.scheme is None]
        if not direct:
            return None
        hosts.add(direct[0].host)
    return hosts.pop() if len(hosts) == 1 else None


def _started_at(instance: Instance | None, pod: Mapping[str, Any], now: datetime) -> str:
    if instance is not None and instance.started_at is not None:
        return format_time(instance.started_at)
    return _previous_started_at(pod) or format_time(now)


def _waiting(reason: str, message: str) -> dict[str, Any]:
    waiting: dict[str, Any] = {"reason": reason}
    if message:
        waiting["message"] = message
    return {"waiting": waiting}


def instance_annotations(instance: Instance) -> dict[str, str]:
    """The pod annotations that show where and at what price the pod runs.

    Every key is always present (empty when the cloud does not say), so a merge patch with this
    dict never leaves a stale value from an earlier instance.
    """
    return {
        f"{ANNOTATION_PREFIX}provider": instance.provider,
        f"{ANNOTATION_PREFIX}instance-id": instance.id,
        f"{ANNOTATION_PREFIX}region": instance.region or "",
        f"{ANNOTATION_PREFIX}gpu-type": instance.gpu_type or "",
        f"{ANNOTATION_PREFIX}price-per-hour": _decimal_string(instance.price_per_hour),
        f"{ANNOTATION_PREFIX}endpoints": ",".join(instance.endpoints),
        f"{ANNOTATION_PREFIX}ports": published_ports(instance),
    }


def published_ports(instance: Instance) -> str:
    """How each container port of a running instance is reached, for people and tools:
    ``8000/TCP=198.18.0.7:30000,8080/TCP=https://abc-8080.proxy.example:443`` (empty while the
    instance is not running, when clouds report no mapping)."""
    if instance.state != InstanceState.RUNNING:
        return ""
    out = []
    for p in instance.published:
        host = f"[{p.host}]" if ":" in p.host else p.host  # an IPv6 address
        target = f"{p.scheme}://{host}:{p.port}" if p.scheme else f"{host}:{p.port}"
        out.append(f"{p.container_port}/{p.protocol}={target}")
    return ",".join(out)


def _decimal_string(value: float) -> str:
    """A plain decimal (never exponent notation): 0.44 -> "0.44", 1e-05 -> "0.00001", 2 -> "2"."""
    text = format(Decimal(repr(float(value))).normalize(), "f")
    return "0" if text in ("-0", "") else text


def failed_status(
    *, pod: Mapping[str, Any], reason: str, message: str, now: datetime
) -> dict[str, Any]:
    """Status for a pod failed before any cloud call (``PodRejected``): phase Failed.

    A pod already in a terminal phase keeps its status.
    """
    current = _map(pod, "status")
    if current.get("phase") in _TERMINAL:
        return copy_dict(current)
    status = _base_status(pod, now)
    stamp = format_time(now)
    state: dict[str, Any] = {
        "terminated": {
            "exitCode": 1,
            "reason": reason,
            "message": message,
            "finishedAt": stamp,
        }
    }
    status["phase"] = FAILED
    status["reason"] = reason
    status["message"] = message
    status["conditions"] = _conditions(
        pod=pod, phase=FAILED, ready=False, container_name=_container(pod).get("name", ""), now=now
    )
    status["containerStatuses"] = [
        _container_status(pod=pod, instance=None, state=state, ready=False)
    ]
    return status


def config_pending_status(*, pod: Mapping[str, Any], message: str, now: datetime,
                          reason: str = "CreateContainerConfigError") -> dict[str, Any]:
    """Status for a pod waiting on a missing Secret/ConfigMap (``PodConfigPending``).

    Phase Pending with the container waiting in ``reason`` (``CreateContainerConfigError``); a
    pod already past Pending keeps its phase (phase never goes backwards) and a terminal pod keeps
    its status.
    """
    current = _map(pod, "status")
    current_phase = current.get("phase") or PENDING
    if current_phase in _TERMINAL:
        return copy_dict(current)
    status = _base_status(pod, now)
    status["phase"] = current_phase if current_phase in _RANK else PENDING
    status["conditions"] = _conditions(
        pod=pod,
        phase=status["phase"],
        ready=False,
        container_name=_container(pod).get("name", ""),
        now=now,
    )
    status["containerStatuses"] = [
        _container_status(
            pod=pod,
            instance=None,
            state=_waiting(reason, message),
            ready=False,
        )
    ]
    return status


def crash_loop_status(*, pod: Mapping[str, Any], instance: Instance, delay: float,
                      now: datetime) -> dict[str, Any]:
    """Status while an exited container waits to be restarted: phase Running (a restart is
    coming), the container waiting in ``CrashLoopBackOff`` with the exit in ``lastState``."""
    status = _base_status(pod, now)
    current_phase = _map(pod, "status").get("phase") or PENDING
    status["phase"] = RUNNING if current_phase in (PENDING, RUNNING, "Unknown") else current_phase
    name = _container(pod).get("name", "")
    status["conditions"] = _conditions(pod=pod, phase=status["phase"], ready=False,
                                       container_name=name, now=now)
    container = _container_status(
        pod=pod, instance=instance, ready=False,
        state=_waiting("CrashLoopBackOff",
                       f"back-off {delay:g}s restarting failed container={name}"))
    succeeded = instance.state == InstanceState.SUCCEEDED
    terminated: dict[str, Any] = {
        "exitCode": instance.exit_code if instance.exit_code is not None else (
            0 if succeeded else 1),
        "reason": "Completed" if succeeded else "Error",
        "finishedAt": format_time(instance.finished_at or now),
    }
    if instance.started_at is not None:
        terminated["startedAt"] = format_time(instance.started_at)
    if instance.message:
        terminated["message"] = instance.message
    container["lastState"] = {"terminated": terminated}
    container["started"] = False
    status["containerStatuses"] = [container]
    return status


def image_pull_status(*, pod: Mapping[str, Any], message: str, now: datetime) -> dict[str, Any]:
    """Status for a pod whose image no cloud could pull with its credentials: waiting in
    ``ErrImagePull``, as the kubelet shows it (and retries it)."""
    return config_pending_status(pod=pod, message=message, now=now, reason="ErrImagePull")


def _normalise(value: Any) -> Any:
    """Drop flapping timestamps and nulls; key lists of conditions by type."""
    if isinstance(value, Mapping):
        return {
            k: _normalise(v) for k, v in value.items() if k not in _FLAPPING_KEYS and v is not None
        }
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def _conditions_by_type(status: Mapping[str, Any]) -> dict[Any, Any]:
    return {
        c.get("type"): _normalise(c) for c in _list(status, "conditions") if isinstance(c, Mapping)
    }


def _covered(new: Any, old: Any) -> bool:
    """True when ``old`` already holds everything ``new`` says (extra keys in ``old`` are fine)."""
    if isinstance(new, dict):
        if not isinstance(old, dict):
            return False
        return all(_covered(v, old.get(k)) for k, v in new.items())
    if isinstance(new, list):
        if not isinstance(old, list) or len(new) != len(old):
            return False
        return all(_covered(a, b) for a, b in zip(new, old, strict=True))
    return bool(new == old)


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether patching ``new`` over ``old`` would change the pod's status in substance.

    Ignores ``lastProbeTime``/``lastTransitionTime`` (they only move with a status they belong
    to), null versus absent, the order of conditions, and fields the API server or others added to
    ``old`` that ``new`` does not set (e.g. ``qosClass``).
    """
    old_n = _normalise(old)
    new_n = _normalise(new)
    old_conditions = _conditions_by_type(old)
    new_conditions = _conditions_by_type(new)
    old_n.pop("conditions", None)
    new_n.pop("conditions", None)
    if not _covered(new_n, old_n):
        return True
    return any(_covered(c, old_conditions.get(t)) is False for t, c in new_conditions.items())

"""A pod's probes, parsed once into values the prober runs, with Kubernetes' defaults.

Why it exists: the prober runs thousands of probes a minute and must not re-read pod JSON each
time; translation must refuse what cannot be probed with the field named. Both use this parser,
so a probe the provider accepted is one it can run. Pure: no I/O.

Semantics follow the kubelet (``k8s.io/api/core/v1`` defaults): ``periodSeconds`` 10,
``timeoutSeconds`` 1, ``successThreshold`` 1, ``failureThreshold`` 3, ``initialDelaySeconds``
0; an ``httpGet`` succeeds on a status in [200, 400); ``tcpSocket`` on a completed connect. A
``grpc`` probe is run as a TCP connect to its port (this prober has no gRPC client): the pod
controller warns about that once per pod. ``exec`` cannot run over the network and is either
refused at translation or, when the OverflowPolicy says ``execProbes: Ignore``, left out here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vkprovider.errors import VKError

__all__ = [
    "ContainerProbes",
    "Probe",
    "ProbeSpecError",
    "parse_probes",
    "resolve_port",
]

PROBE_KINDS = ("startupProbe", "readinessProbe", "livenessProbe")


class ProbeSpecError(VKError):
    """A probe names something the prober cannot run; ``field`` is the pod field at fault."""

    def __init__(self, *, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    """One probe of one container, ready to run."""

    action: Literal["http", "tcp", "grpc"]
    port: int  # the container port (named ports resolved)
    path: str = "/"
    scheme: Literal["HTTP", "HTTPS"] = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    host_header: str | None = None  # httpGet.host: sent as Host (the address is the cloud's)
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerProbes:
    """The three probes of one container; None where the pod has none (or an ignored exec)."""

    name: str
    startup: Probe | None = None
    readiness: Probe | None = None
    liveness: Probe | None = None

    @property
    def any(self) -> bool:
        return self.startup is not None or self.readiness is not None or self.liveness is not None


def _map(obj: Any, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def resolve_port(value: Any, *, container: Mapping[str, Any], field: str) -> int:
    """A probe's ``port`` (a number, or the name of one of the container's ports) as a number."""
    if isinstance(value, bool):
        raise ProbeSpecError(field=field, message="port must be a number or a port name")
    if isinstance(value, int):
        if not 1 <= value <= 65535:
            raise ProbeSpecError(field=field, message=f"port {value} is out of range 1-65535")
        return value
    if isinstance(value, str):
        if value.isdigit():
            return resolve_port(int(value), container=container, field=field)
        for p in container.get("ports") or []:
            if isinstance(p, Mapping) and p.get("name") == value:
                number = p.get("containerPort")
                if isinstance(number, int) and not isinstance(number, bool):
                    return number
        raise ProbeSpecError(field=field, message=f"the container declares no port named {value!r}")
    raise ProbeSpecError(field=field, message="port is missing")


def _number(probe: Mapping[str, Any], key: str, default: float, *, field: str,
            minimum: float) -> float:
    raw = probe.get(key)
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ProbeSpecError(field=f"{field}.{key}", message="must be a number")
    return max(float(raw), minimum)


def _parse(probe: Mapping[str, Any], *, container: Mapping[str, Any], field: str,
           kind: str, ignore_exec: bool) -> Probe | None:
    timing = {
        "initial_delay": _number(probe, "initialDelaySeconds", 0.0, field=field, minimum=0.0),
        "period": _number(probe, "periodSeconds", 10.0, field=field, minimum=1.0),
        "timeout": _number(probe, "timeoutSeconds", 1.0, field=field, minimum=1.0),
        "success_threshold": int(_number(probe, "successThreshold", 1, field=field, minimum=1)),
        "failure_threshold": int(_number(probe, "failureThreshold", 3, field=field, minimum=1)),
    }
    if kind != "readinessProbe":
        timing["success_threshold"] = 1  # the API server enforces it; be safe on old objects
    if (http := _map(probe, "httpGet")) or "httpGet" in probe:
        scheme = str(http.get("scheme") or "HTTP").upper()
        if scheme not in ("HTTP", "HTTPS"):
            raise ProbeSpecError(field=f"{field}.httpGet.scheme",
                                 message=f"scheme {scheme!r} is not HTTP or HTTPS")
        path = str(http.get("path") or "/")
        headers = tuple(
            (str(h.get("name")), str(h.get("value", "")))
            for h in http.get("httpHeaders") or [] if isinstance(h, Mapping) and h.get("name")
        )
        host = http.get("host")
        return Probe(action="http",
                     port=resolve_port(http.get("port"), container=container,
                                       field=f"{field}.httpGet.port"),
                     path=path if path.startswith("/") else "/" + path,
                     scheme="HTTPS" if scheme == "HTTPS" else "HTTP", headers=headers,
                     host_header=str(host) if host else None, **timing)  # type: ignore[arg-type]
    if (tcp := _map(probe, "tcpSocket")) or "tcpSocket" in probe:
        return Probe(action="tcp",
                     port=resolve_port(tcp.get("port"), container=container,
                                       field=f"{field}.tcpSocket.port"),
                     **timing)  # type: ignore[arg-type]
    if (grpc := _map(probe, "grpc")) or "grpc" in probe:
        return Probe(action="grpc",
                     port=resolve_port(grpc.get("port"), container=container,
                                       field=f"{field}.grpc.port"),
                     **timing)  # type: ignore[arg-type]
    if "exec" in probe:
        if ignore_exec:
            return None
        raise ProbeSpecError(field=f"{field}.exec",
                             message="an exec probe cannot run on a cloud instance")
    raise ProbeSpecError(field=field, message="the probe has no handler "
                         "(httpGet, tcpSocket or grpc)")


def parse_probes(pod: Mapping[str, Any], *, ignore_exec: bool = False
                 ) -> tuple[ContainerProbes, ...]:
    """Every container's probes (in ``spec.containers`` order), defaults applied.

    Raises :class:`ProbeSpecError` naming the field for a probe that cannot run."""
    out: list[ContainerProbes] = []
    containers: Sequence[Any] = _map(pod, "spec").get("containers") or []
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping):
            continue
        parsed: dict[str, Probe | None] = {}
        for kind in PROBE_KINDS:
            probe = container.get(kind)
            parsed[kind] = (
                _parse(probe, container=container, field=f"spec.containers[{i}].{kind}",
                       kind=kind, ignore_exec=ignore_exec)
                if isinstance(probe, Mapping) else None
            )
        out.append(ContainerProbes(name=str(container.get("name", "")),
                                   startup=parsed["startupProbe"],
                                   readiness=parsed["readinessProbe"],
                                   liveness=parsed["livenessProbe"]))
    return tuple(out)

"""Validation of a pod before any cloud call: what no cloud can run is refused by field.

Why it exists apart from :mod:`vkprovider.node.translate`: refusing is a decision made once per
pod from the pod alone (and the fidelity table), before translation reads a Secret or the cloud
is chosen. Every refusal is a ``PodRejected`` naming the exact field (reasons
``UnsupportedPodSpec``, ``InvalidImageName``, ``InvalidResources``); sanity caps on GPUs, cpu and
memory turn a typo or an attack into a refusal instead of a cloud bill.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from vkprovider.errors import PodRejected
from vkprovider.node import fieldcheck
from vkprovider.node.fidelity import REASON_INVALID_IMAGE, REASON_INVALID_RESOURCES
from vkprovider.node.podjson import (
    C0,
    LABEL_FIELD_RE,
    list_at,
    map_at,
    str_at,
    unsupported,
    value_at,
)
from vkprovider.semantics.gpus import GPU_RESOURCE
from vkprovider.semantics.quantity import QuantityError, memory_bytes, parse_quantity, whole_count

__all__ = ["CPU_CAP", "GPU_CAP", "MEMORY_CAP", "SHM_PATH", "shm_bytes", "validate"]

#: Sanity caps: anything above is a typo or an attack, not a workload.
GPU_CAP = Decimal(1024)
CPU_CAP = Decimal(4096)  # cores
MEMORY_CAP = Decimal(64 * 2**40)  # 64Ti bytes
#: Where a memory-backed emptyDir is the container's shared memory (see InstanceSpec.shm_bytes).
SHM_PATH = "/dev/shm"

_TOKEN_VOLUME_SOURCES = frozenset({"serviceAccountToken", "configMap", "downwardAPI"})
_SIMPLE_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.podIP",
        "status.podIPs",
        "status.hostIP",
        "status.hostIPs",
    }
)
_RESOURCE_FIELDS = frozenset({"limits.cpu", "limits.memory", "requests.cpu", "requests.memory"})
_ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
_ENV_FROM_SOURCES = ("secretRef", "configMapRef")
_RESOURCE_CAPS = {"cpu": CPU_CAP, "memory": MEMORY_CAP, GPU_RESOURCE: GPU_CAP}


def _is_token_volume(volume: Mapping[str, Any]) -> bool:
    """The projected service-account token volume (``kube-api-access-*``) that admission adds."""
    projected = volume.get("projected")
    if not isinstance(projected, Mapping):
        return False
    kinds: set[str] = set()
    for source in list_at(projected, "sources"):
        if isinstance(source, Mapping):
            kinds.update(k for k, v in source.items() if v is not None)
    return "serviceAccountToken" in kinds and kinds <= _TOKEN_VOLUME_SOURCES


def _is_shm_volume(volume: Mapping[str, Any], container: Mapping[str, Any]) -> bool:
    """A memory-backed emptyDir that the container mounts at ``/dev/shm`` and nowhere else (no
    subPath): the container's shared memory, whose size a cloud may set."""
    empty_dir = volume.get("emptyDir")
    if not isinstance(empty_dir, Mapping) or empty_dir.get("medium") != "Memory":
        return False
    if _volume_type(volume) != "emptyDir" or len([k for k, v in volume.items()
                                                   if k != "name" and v is not None]) != 1:
        return False
    name = str_at(volume, "name")
    mounts = [m for m in list_at(container, "volumeMounts")
              if isinstance(m, Mapping) and str_at(m, "name") == name]
    return bool(mounts) and all(
        str_at(m, "mountPath").rstrip("/") == SHM_PATH and not str_at(m, "subPath")
        and not str_at(m, "subPathExpr") for m in mounts)


def _validate_shm_size(volume: Mapping[str, Any], field: str) -> None:
    raw = map_at(volume, "emptyDir").get("sizeLimit")
    if raw is None:
        return
    try:
        value = parse_quantity(raw)
    except QuantityError as err:
        raise PodRejected(reason=REASON_INVALID_RESOURCES, field=field, message=str(err)) from None
    if value <= 0 or value > MEMORY_CAP:
        raise PodRejected(reason=REASON_INVALID_RESOURCES, field=field,
                          message=f"{raw!r} is not a positive size of at most "
                                  f"{_format_cap('memory', MEMORY_CAP)}")


def shm_bytes(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int | None:
    """The size of ``/dev/shm`` the pod asks for (see ``InstanceSpec.shm_bytes``): as the
    kubelet sizes a memory-backed emptyDir, the smaller of its sizeLimit and the container's
    memory limit; 0 when neither is set (as large as the instance's memory); None without one."""
    for volume in list_at(map_at(pod, "spec"), "volumes"):
        if not isinstance(volume, Mapping) or not _is_shm_volume(volume, container):
            continue
        sizes: list[Decimal] = []
        raw = map_at(volume, "emptyDir").get("sizeLimit")
        if raw is not None:
            sizes.append(parse_quantity(raw))
        limit = map_at(map_at(container, "resources"), "limits").get("memory")
        if limit is not None:
            sizes.append(parse_quantity(limit))
        return memory_bytes(min(sizes)) if sizes else 0
    return None


def _volume_type(volume: Mapping[str, Any]) -> str:
    types = sorted(k for k, v in volume.items() if k != "name" and v is not None)
    return types[0] if types else "unknown"


def validate(pod: Mapping[str, Any], *, ignore_exec_probes: bool = False) -> None:
    """Raise ``PodRejected`` (reason and exact field path) for what no cloud can run.

    ``ignore_exec_probes``: the pod's OverflowPolicy says ``execProbes: Ignore`` (run the pod
    without its exec probes rather than refuse it).
    """
    meta = map_at(pod, "metadata")
    for key in ("name", "namespace", "uid"):
        if not str_at(meta, key):
            raise unsupported(f"metadata.{key}", f"the pod has no metadata.{key}")
    spec = map_at(pod, "spec")
    _table_refusals(pod, container=False)  # hostNetwork/PID/IPC, init and ephemeral containers

    containers = list_at(spec, "containers")
    if len(containers) != 1:
        names = ", ".join(str_at(c, "name") or "?" for c in containers)
        raise unsupported(
            "spec.containers",
            f"exactly one container is supported, the pod has {len(containers)}"
            + (f" ({names})" if names else ""),
        )

    container = containers[0] if isinstance(containers[0], Mapping) else {}
    for i, volume in enumerate(list_at(spec, "volumes")):
        if not isinstance(volume, Mapping) or _is_token_volume(volume):
            continue
        if _is_shm_volume(volume, container):
            _validate_shm_size(volume, f"spec.volumes[{i}].emptyDir.sizeLimit")
            continue
        vtype = _volume_type(volume)
        raise unsupported(
            f"spec.volumes[{i}].{vtype}",
            f"volume {str_at(volume, 'name')!r} of type {vtype} is not supported "
            "(only the service-account token volume is, and a memory-backed emptyDir mounted "
            f"at {SHM_PATH} only)",
        )

    _validate_container(pod, container)
    _validate_probes(container, ignore_exec=ignore_exec_probes)


def _table_refusals(pod: Mapping[str, Any], *, container: bool) -> None:
    """The simple refusals of the fidelity table: the pod's own fields, or its container's."""
    found = fieldcheck.table_refusal(pod, container=container)
    if found is not None:
        entry, field = found
        raise PodRejected(reason=entry.reason, field=field, message=entry.refusal)


def _validate_container(pod: Mapping[str, Any], container: Mapping[str, Any]) -> None:
    image = container.get("image")
    if not isinstance(image, str) or not image.strip():
        raise PodRejected(
            reason=REASON_INVALID_IMAGE, field=f"{C0}.image", message="the image is missing"
        )
    if image != image.strip() or any(ch.isspace() for ch in image):
        raise PodRejected(
            reason=REASON_INVALID_IMAGE,
            field=f"{C0}.image",
            message=f"the image reference {image!r} contains whitespace",
        )

    _table_refusals(pod, container=True)  # securityContext.privileged, volumeDevices

    for i, port in enumerate(list_at(container, "ports")):
        number = value_at(port, "containerPort")
        if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 65536:
            raise unsupported(
                f"{C0}.ports[{i}].containerPort", f"{number!r} is not a valid port number"
            )

    _validate_resources(map_at(container, "resources"))
    _validate_env(container)


_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _validate_probes(container: Mapping[str, Any], *, ignore_exec: bool) -> None:
    """Probes run over the network against what the cloud publishes: an exec probe cannot run,
    and a probe must name a port the container declares (by number or by name)."""
    ports = [p for p in list_at(container, "ports") if isinstance(p, Mapping)]
    numbers = {p.get("containerPort") for p in ports}
    names = {p.get("name") for p in ports if p.get("name")}
    for kind in _PROBES:
        probe = map_at(container, kind)
        if not probe:
            continue
        if value_at(probe, "exec") is not None and not ignore_exec:
            raise unsupported(
                f"{C0}.{kind}.exec",
                "an exec probe cannot run on a cloud instance (probes go over the network: use "
                "httpGet, tcpSocket or grpc, or set the OverflowPolicy's spec.execProbes: "
                "Ignore to run the pod without it)")
        for handler in ("httpGet", "tcpSocket", "grpc"):
            action = map_at(probe, handler)
            if not action:
                continue
            port = action.get("port")
            field = f"{C0}.{kind}.{handler}.port"
            if isinstance(port, str) and not port.isdigit():
                if port not in names:
                    raise unsupported(field, f"named port {port!r} does not exist in "
                                              f"{C0}.ports")
            elif not isinstance(port, int | str) or int(port) not in numbers:
                raise unsupported(field, f"port {port} is not declared in {C0}.ports: a "
                                          "cloud publishes only declared ports, so the probe "
                                          "could never reach it")




def _validate_resources(resources: Mapping[str, Any]) -> None:
    parsed: dict[str, dict[str, Decimal]] = {}
    for kind in ("limits", "requests"):
        parsed[kind] = {}
        for name, raw in map_at(resources, kind).items():
            field = f"{C0}.resources.{kind}[{name}]"
            try:
                value = parse_quantity(raw)
            except QuantityError as err:
                raise PodRejected(
                    reason=REASON_INVALID_RESOURCES, field=field, message=str(err)
                ) from None
            if value < 0:
                raise PodRejected(
                    reason=REASON_INVALID_RESOURCES, field=field, message=f"{raw!r} is negative"
                )
            cap = _RESOURCE_CAPS.get(name)
            if cap is not None and value > cap:
                raise PodRejected(
                    reason=REASON_INVALID_RESOURCES,
                    field=field,
                    message=f"{raw!r} is more than the sane maximum of {_format_cap(name, cap)}",
                )
            if name == GPU_RESOURCE:
                try:
                    whole_count(value)  # negative was refused above: only a fraction fails
                except QuantityError:
                    raise PodRejected(
                        reason=REASON_INVALID_RESOURCES,
                        field=field,
                        message=f"{raw!r} is not a whole number of GPUs",
                    ) from None
            parsed[kind][name] = value
    limit = parsed["limits"].get(GPU_RESOURCE)
    request = parsed["requests"].get(GPU_RESOURCE)
    if limit is not None and request is not None and limit != request:
        raise PodRejected(
            reason=REASON_INVALID_RESOURCES,
            field=f"{C0}.resources.requests[{GPU_RESOURCE}]",
            message=f"the GPU request ({request}) must equal the GPU limit ({limit})",
        )


def _format_cap(name: str, cap: Decimal) -> str:
    if name == "memory":
        return f"{int(cap) // 2**40}Ti"
    return str(int(cap))


def _validate_env(container: Mapping[str, Any]) -> None:
    container_name = str_at(container, "name")
    for i, entry in enumerate(list_at(container, "env")):
        base = f"{C0}.env[{i}]"
        if not str_at(entry, "name"):
            raise unsupported(f"{base}.name", "an environment variable has no name")
        value_from = value_at(entry, "valueFrom")
        if value_from is None:
            continue
        sources = [k for k in _ENV_SOURCES if value_at(value_from, k) is not None]
        if len(sources) != 1:
            raise unsupported(
                f"{base}.valueFrom",
                "valueFrom must have exactly one of " + ", ".join(_ENV_SOURCES),
            )
        source = sources[0]
        ref = map_at(value_from, source)
        if source in ("secretKeyRef", "configMapKeyRef"):
            for key in ("name", "key"):
                if not str_at(ref, key):
                    raise unsupported(f"{base}.valueFrom.{source}.{key}", f"{key} is required")
        elif source == "fieldRef":
            path = str_at(ref, "fieldPath")
            if path not in _SIMPLE_FIELDS and LABEL_FIELD_RE.fullmatch(path) is None:
                raise unsupported(
                    f"{base}.valueFrom.fieldRef.fieldPath",
                    f"downward API field {path!r} is not supported",
                )
        else:
            resource = str_at(ref, "resource")
            if resource not in _RESOURCE_FIELDS:
                raise unsupported(
                    f"{base}.valueFrom.resourceFieldRef.resource",
                    f"resource {resource!r} is not supported (use one of "
                    + ", ".join(sorted(_RESOURCE_FIELDS))
                    + ")",
                )
            other = str_at(ref, "containerName")
            if other and other != container_name:
                raise unsupported(
                    f"{base}.valueFrom.resourceFieldRef.containerName",
                    f"container {other!r} does not exist in this pod",
                )
            divisor = ref.get("divisor")
            if divisor is not None:
                try:
                    ok = parse_quantity(divisor) > 0
                except QuantityError:
                    ok = False
                if not ok:
                    raise PodRejected(
                        reason=REASON_INVALID_RESOURCES,
                        field=f"{base}.valueFrom.resourceFieldRef.divisor",
                        message=f"{divisor!r} is not a positive quantity",
                    )
    for i, entry in enumerate(list_at(container, "envFrom")):
        sources = [k for k in _ENV_FROM_SOURCES if value_at(entry, k) is not None]
        if len(sources) != 1:
            raise unsupported(
                f"{C0}.envFrom[{i}]", "envFrom must have exactly one of secretRef, configMapRef"
            )
        if not str_at(map_at(entry, sources[0]), "name"):
            raise unsupported(f"{C0}.envFrom[{i}].{sources[0]}.name", "name is required")

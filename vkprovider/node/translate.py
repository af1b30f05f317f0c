"""Turn a pod (a plain dict from the API server) into the InstanceSpec a cloud adapter runs.

Why it exists: this is the one place that decides what of a pod a GPU cloud can honour. Anything no
cloud can do is refused here, before any cloud call, with a ``PodRejected`` that names the exact
pod field (so the pod is failed with a clear reason and a Warning event); a missing Secret or
ConfigMap raises ``PodConfigPending`` so the pod waits like the kubelet's
``CreateContainerConfigError``. Everything else is mapped: image, command/args (with ``$(VAR)``
expansion), env (plain, Secret/ConfigMap refs, downward API, resource fields, ``envFrom``), ports,
GPU count and type, cpu and memory, the size of ``/dev/shm`` (a memory-backed emptyDir mounted
there, the only volume besides the service-account token), the user and group
(``runAsUser``/``runAsGroup``), and the tags that let a restart adopt the instance.

What is refused and what is dropped with a warning is decided in one table,
:mod:`vkprovider.node.fidelity`: the simple refusals (a flag that is true, a list that is not
empty) are checked straight from it, the others here, each under an entry of that table. The
fields the pod sets that the cloud will not honour are handed to ``on_dropped`` (the pod
controller turns them into one ``FieldsDropped`` Warning event).

The only I/O is reading Secrets and ConfigMaps through the injected ``RefSource``; each object is
read at most once per translation. Secret values end up in ``InstanceSpec.env`` (whose repr hides
them) and never in an error message.

Decisions worth knowing:

* GPU type: the annotation ``vkprovider.io/gpu-type`` wins over the nodeSelector
  ``nvidia.com/gpu.product``: the annotation is the provider-specific, explicit choice, while the
  nodeSelector is usually written for internal nodes.
* GPU count, cpu and memory come from limits, else requests. If both set ``nvidia.com/gpu`` they
  must be equal (an extended resource cannot be overcommitted).
* A missing or blank image is rejected with reason ``InvalidImageName`` (the kubelet's own reason
  for a bad image reference); other unsupported features use ``UnsupportedPodSpec``; bad
  quantities use ``InvalidResources``.
* ``resourceFieldRef`` on ``limits.*`` falls back to the request (the kubelet would use the node's
  allocatable, which a cloud instance does not have); when neither is set the variable is left
  unset. ``requests.*`` falls back to the limit, then to 0, as Kubernetes defaults requests.
* ``status.podIP``/``status.hostIP`` (and the plural forms) are empty: the cloud assigns the
  address only after the instance exists.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

from providers.base import (
    TAG_NAMESPACE,
    TAG_NODE,
    TAG_POD,
    TAG_UID,
    InstanceSpec,
    Port,
    RegistryAuth,
)
from vkprovider.errors import PodConfigPending, PodRejected
from vkprovider.logs import kv
from vkprovider.node import fieldcheck
from vkprovider.node.fidelity import (
    REASON_INVALID_IMAGE,
    REASON_INVALID_RESOURCES,
    REASON_UNSUPPORTED,
)
from vkprovider.node.fieldcheck import FieldsDropped
from vkprovider.node.pullsecrets import (
    PullSecret,
    PullSecretError,
    pull_secret_names,
    registry_auth_for_image,
)
from vkprovider.semantics.gpus import GPU_RESOURCE, container_gpus
from vkprovider.semantics.quantity import (
    QuantityError,
    cpu_millis,
    memory_bytes,
    parse_quantity,
    whole_count,
)

__all__ = [
    "ANNOTATION_GPU_TYPE",
    "CPU_CAP",
    "GPU_CAP",
    "GPU_RESOURCE",
    "MEMORY_CAP",
    "NODE_SELECTOR_GPU_PRODUCT",
    "REASON_INVALID_IMAGE",
    "REASON_INVALID_RESOURCES",
    "REASON_UNSUPPORTED",
    "SHM_PATH",
    "FieldsDropped",
    "RefSource",
    "fields_dropped",
    "instance_name",
    "translate",
    "validate",
]

ANNOTATION_GPU_TYPE = "vkprovider.io/gpu-type"
NODE_SELECTOR_GPU_PRODUCT = "nvidia.com/gpu.product"

log = logging.getLogger(__name__)

#: Sanity caps: anything above is a typo or an attack, not a workload.
GPU_CAP = Decimal(1024)
CPU_CAP = Decimal(4096)  # cores
MEMORY_CAP = Decimal(64 * 2**40)  # 64Ti bytes

_C0 = "spec.containers[0]"
#: Where a memory-backed emptyDir is the container's shared memory (see InstanceSpec.shm_bytes).
SHM_PATH = "/dev/shm"


class RefSource(Protocol):
    """Reads the Secrets and ConfigMaps a pod refers to. ``None`` means it does not exist."""

    async def secret(self, *, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, values already base64-decoded."""
        ...

    async def config_map(self, *, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's ``data``."""
        ...


# --------------------------------------------------------------------------------------------
# Small helpers over untyped JSON


#: dict first: an exact type check before Mapping's slower ABC check (pods are plain dicts)
_MAPS = (dict, Mapping)


def _map(obj: Any, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, _MAPS) else None
    return value if isinstance(value, _MAPS) else {}


def _list(obj: Any, key: str) -> Sequence[Any]:
    value = obj.get(key) if isinstance(obj, _MAPS) else None
    return value if isinstance(value, list) else []


def _str(obj: Any, key: str) -> str:
    value = obj.get(key) if isinstance(obj, _MAPS) else None
    return value if isinstance(value, str) else ""


def _unsupported(field: str, message: str) -> PodRejected:
    return PodRejected(reason=REASON_UNSUPPORTED, field=field, message=message)


def instance_name(*, node_name: str, pod_uid: str) -> str:
    """The deterministic instance name ``<node>-<pod uid>``: the cloud-side idempotency key."""
    if not node_name or not pod_uid:
        raise ValueError("node_name and pod_uid must not be empty")
    return f"{node_name}-{pod_uid}"


# --------------------------------------------------------------------------------------------
# Validation

_TOKEN_VOLUME_SOURCES = frozenset({"serviceAccountToken", "configMap", "downwardAPI"})
_LABEL_FIELD_RE = re.compile(r"metadata\.(?P<kind>labels|annotations)\['(?P<key>[^']+)'\]")
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
    for source in _list(projected, "sources"):
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
    name = _str(volume, "name")
    mounts = [m for m in _list(container, "volumeMounts")
              if isinstance(m, Mapping) and _str(m, "name") == name]
    return bool(mounts) and all(
        _str(m, "mountPath").rstrip("/") == SHM_PATH and not _str(m, "subPath")
        and not _str(m, "subPathExpr") for m in mounts)


def _validate_shm_size(volume: Mapping[str, Any], field: str) -> None:
    raw = _map(volume, "emptyDir").get("sizeLimit")
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


def _shm_bytes(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int | None:
    """The size of ``/dev/shm`` the pod asks for (see ``InstanceSpec.shm_bytes``): as the
    kubelet sizes a memory-backed emptyDir, the smaller of its sizeLimit and the container's
    memory limit; 0 when neither is set (as large as the instance's memory); None without one."""
    for volume in _list(_map(pod, "spec"), "volumes"):
        if not isinstance(volume, Mapping) or not _is_shm_volume(volume, container):
            continue
        sizes: list[Decimal] = []
        raw = _map(volume, "emptyDir").get("sizeLimit")
        if raw is not None:
            sizes.append(parse_quantity(raw))
        limit = _map(_map(container, "resources"), "limits").get("memory")
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
    meta = _map(pod, "metadata")
    for key in ("name", "namespace", "uid"):
        if not _str(meta, key):
            raise _unsupported(f"metadata.{key}", f"the pod has no metadata.{key}")
    spec = _map(pod, "spec")
    _table_refusals(pod, container=False)  # hostNetwork/PID/IPC, init and ephemeral containers

    containers = _list(spec, "containers")
    if len(containers) != 1:
        names = ", ".join(_str(c, "name") or "?" for c in containers)
        raise _unsupported(
            "spec.containers",
            f"exactly one container is supported, the pod has {len(containers)}"
            + (f" ({names})" if names else ""),
        )

    container = containers[0] if isinstance(containers[0], Mapping) else {}
    for i, volume in enumerate(_list(spec, "volumes")):
        if not isinstance(volume, Mapping) or _is_token_volume(volume):
            continue
        if _is_shm_volume(volume, container):
            _validate_shm_size(volume, f"spec.volumes[{i}].emptyDir.sizeLimit")
            continue
        vtype = _volume_type(volume)
        raise _unsupported(
            f"spec.volumes[{i}].{vtype}",
            f"volume {_str(volume, 'name')!r} of type {vtype} is not supported "
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
            reason=REASON_INVALID_IMAGE, field=f"{_C0}.image", message="the image is missing"
        )
    if image != image.strip() or any(ch.isspace() for ch in image):
        raise PodRejected(
            reason=REASON_INVALID_IMAGE,
            field=f"{_C0}.image",
            message=f"the image reference {image!r} contains whitespace",
        )

    _table_refusals(pod, container=True)  # securityContext.privileged, volumeDevices

    for i, port in enumerate(_list(container, "ports")):
        number = _map_value(port, "containerPort")
        if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 65536:
            raise _unsupported(
                f"{_C0}.ports[{i}].containerPort", f"{number!r} is not a valid port number"
            )

    _validate_resources(_map(container, "resources"))
    _validate_env(container)


_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _validate_probes(container: Mapping[str, Any], *, ignore_exec: bool) -> None:
    """Probes run over the network against what the cloud publishes: an exec probe cannot run,
    and a probe must name a port the container declares (by number or by name)."""
    ports = [p for p in _list(container, "ports") if isinstance(p, Mapping)]
    numbers = {p.get("containerPort") for p in ports}
    names = {p.get("name") for p in ports if p.get("name")}
    for kind in _PROBES:
        probe = _map(container, kind)
        if not probe:
            continue
        if _map_value(probe, "exec") is not None and not ignore_exec:
            raise _unsupported(
                f"{_C0}.{kind}.exec",
                "an exec probe cannot run on a cloud instance (probes go over the network: use "
                "httpGet, tcpSocket or grpc, or set the OverflowPolicy's spec.execProbes: "
                "Ignore to run the pod without it)")
        for handler in ("httpGet", "tcpSocket", "grpc"):
            action = _map(probe, handler)
            if not action:
                continue
            port = action.get("port")
            field = f"{_C0}.{kind}.{handler}.port"
            if isinstance(port, str) and not port.isdigit():
                if port not in names:
                    raise _unsupported(field, f"named port {port!r} does not exist in "
                                              f"{_C0}.ports")
            elif not isinstance(port, int | str) or int(port) not in numbers:
                raise _unsupported(field, f"port {port} is not declared in {_C0}.ports: a "
                                          "cloud publishes only declared ports, so the probe "
                                          "could never reach it")


def _map_value(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _validate_resources(resources: Mapping[str, Any]) -> None:
    parsed: dict[str, dict[str, Decimal]] = {}
    for kind in ("limits", "requests"):
        parsed[kind] = {}
        for name, raw in _map(resources, kind).items():
            field = f"{_C0}.resources.{kind}[{name}]"
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
            field=f"{_C0}.resources.requests[{GPU_RESOURCE}]",
            message=f"the GPU request ({request}) must equal the GPU limit ({limit})",
        )


def _format_cap(name: str, cap: Decimal) -> str:
    if name == "memory":
        return f"{int(cap) // 2**40}Ti"
    return str(int(cap))


def _validate_env(container: Mapping[str, Any]) -> None:
    container_name = _str(container, "name")
    for i, entry in enumerate(_list(container, "env")):
        base = f"{_C0}.env[{i}]"
        if not _str(entry, "name"):
            raise _unsupported(f"{base}.name", "an environment variable has no name")
        value_from = _map_value(entry, "valueFrom")
        if value_from is None:
            continue
        sources = [k for k in _ENV_SOURCES if _map_value(value_from, k) is not None]
        if len(sources) != 1:
            raise _unsupported(
                f"{base}.valueFrom",
                "valueFrom must have exactly one of " + ", ".join(_ENV_SOURCES),
            )
        source = sources[0]
        ref = _map(value_from, source)
        if source in ("secretKeyRef", "configMapKeyRef"):
            for key in ("name", "key"):
                if not _str(ref, key):
                    raise _unsupported(f"{base}.valueFrom.{source}.{key}", f"{key} is required")
        elif source == "fieldRef":
            path = _str(ref, "fieldPath")
            if path not in _SIMPLE_FIELDS and _LABEL_FIELD_RE.fullmatch(path) is None:
                raise _unsupported(
                    f"{base}.valueFrom.fieldRef.fieldPath",
                    f"downward API field {path!r} is not supported",
                )
        else:
            resource = _str(ref, "resource")
            if resource not in _RESOURCE_FIELDS:
                raise _unsupported(
                    f"{base}.valueFrom.resourceFieldRef.resource",
                    f"resource {resource!r} is not supported (use one of "
                    + ", ".join(sorted(_RESOURCE_FIELDS))
                    + ")",
                )
            other = _str(ref, "containerName")
            if other and other != container_name:
                raise _unsupported(
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
    for i, entry in enumerate(_list(container, "envFrom")):
        sources = [k for k in _ENV_FROM_SOURCES if _map_value(entry, k) is not None]
        if len(sources) != 1:
            raise _unsupported(
                f"{_C0}.envFrom[{i}]", "envFrom must have exactly one of secretRef, configMapRef"
            )
        if not _str(_map(entry, sources[0]), "name"):
            raise _unsupported(f"{_C0}.envFrom[{i}].{sources[0]}.name", "name is required")


# --------------------------------------------------------------------------------------------
# Translation


class _Refs:
    """Reads each Secret/ConfigMap at most once per translation."""

    def __init__(self, source: RefSource, namespace: str) -> None:
        self._source = source
        self._namespace = namespace
        self._cache: dict[tuple[str, str], dict[str, str] | None] = {}

    async def get(self, kind: str, name: str) -> dict[str, str] | None:
        key = (kind, name)
        if key not in self._cache:
            if kind == "secret":
                self._cache[key] = await self._source.secret(namespace=self._namespace, name=name)
            else:
                self._cache[key] = await self._source.config_map(
                    namespace=self._namespace, name=name
                )
        return self._cache[key]


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: ``$$`` escapes, undefined references stay as written."""
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end == -1:
                out.append("$(")
                i += 2
            else:
                name = text[i + 2 : end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


def _valid_env_name(name: str) -> bool:
    # Kubernetes (relaxed validation) allows any printable ASCII except "=".
    return bool(name) and "=" not in name and all(" " <= ch <= "~" for ch in name)


def _field_value(pod: Mapping[str, Any], path: str) -> str:
    meta = _map(pod, "metadata")
    spec = _map(pod, "spec")
    match = _LABEL_FIELD_RE.fullmatch(path)
    if match is not None:
        value = _map(meta, match["kind"]).get(match["key"])
        return value if isinstance(value, str) else ""
    if path.startswith("metadata."):
        return _str(meta, path.removeprefix("metadata."))
    if path.startswith("spec."):
        return _str(spec, path.removeprefix("spec."))
    return ""  # status.podIP(s)/hostIP(s): the cloud assigns an address only after create


def _resource_value(resources: Mapping[str, Any], resource: str, divisor_raw: object) -> str | None:
    kind, name = resource.split(".", 1)
    other = "requests" if kind == "limits" else "limits"
    raw = _map(resources, kind).get(name)
    if raw is None:
        raw = _map(resources, other).get(name)
    if raw is None:
        if kind == "limits":
            return None
        raw = "0"
    value = parse_quantity(raw)
    divisor = parse_quantity(divisor_raw) if divisor_raw is not None else Decimal(1)
    if name == "cpu":
        # Like the kubelet: whole millicores first, then divide and round up.
        return str(math.ceil(Decimal(cpu_millis(value)) / (divisor * 1000)))
    return str(math.ceil(value / divisor))


async def _build_env(
    *, pod: Mapping[str, Any], container: Mapping[str, Any], refs: _Refs, namespace: str
) -> dict[str, str]:
    env: dict[str, str] = {}

    for i, entry in enumerate(_list(container, "envFrom")):
        kind, source = (
            ("secret", "secretRef")
            if _map_value(entry, "secretRef") is not None
            else ("configMap", "configMapRef")
        )
        ref = _map(entry, source)
        name = _str(ref, "name")
        data = await refs.get(kind, name)
        if data is None:
            if ref.get("optional") is True:
                continue
            raise PodConfigPending(
                field=f"{_C0}.envFrom[{i}].{source}",
                message=f'{kind} "{namespace}/{name}" not found',
            )
        prefix = _str(entry, "prefix")
        for key, value in data.items():
            full = prefix + key
            if _valid_env_name(full):
                env[full] = value

    resources = _map(container, "resources")
    for i, entry in enumerate(_list(container, "env")):
        name = _str(entry, "name")
        value_from = _map_value(entry, "valueFrom")
        if value_from is None:
            env[name] = _expand(_str(entry, "value"), env)
            continue
        base = f"{_C0}.env[{i}].valueFrom"
        if _map_value(value_from, "fieldRef") is not None:
            env[name] = _field_value(pod, _str(_map(value_from, "fieldRef"), "fieldPath"))
            continue
        if _map_value(value_from, "resourceFieldRef") is not None:
            ref = _map(value_from, "resourceFieldRef")
            amount = _resource_value(resources, _str(ref, "resource"), ref.get("divisor"))
            if amount is not None:
                env[name] = amount
            continue
        kind, source = (
            ("secret", "secretKeyRef")
            if _map_value(value_from, "secretKeyRef") is not None
            else ("configMap", "configMapKeyRef")
        )
        ref = _map(value_from, source)
        obj_name = _str(ref, "name")
        key = _str(ref, "key")
        optional = ref.get("optional") is True
        data = await refs.get(kind, obj_name)
        if data is None:
            if optional:
                continue
            raise PodConfigPending(
                field=f"{base}.{source}", message=f'{kind} "{namespace}/{obj_name}" not found'
            )
        if key not in data:
            if optional:
                continue
            raise PodConfigPending(
                field=f"{base}.{source}",
                message=f'key "{key}" not found in {kind} "{namespace}/{obj_name}"',
            )
        env[name] = data[key]
    return env


def _strings(container: Mapping[str, Any], key: str, env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(_expand(s, env) for s in _list(container, key) if isinstance(s, str))


def _gpu_type(pod: Mapping[str, Any]) -> str | None:
    annotated = _str(_map(pod, "metadata").get("annotations"), ANNOTATION_GPU_TYPE).strip()
    if annotated:
        return annotated
    selected = _str(_map(pod, "spec").get("nodeSelector"), NODE_SELECTOR_GPU_PRODUCT).strip()
    return selected or None


def _quantity(resources: Mapping[str, Any], name: str) -> Decimal | None:
    for kind in ("limits", "requests"):
        raw = _map(resources, kind).get(name)
        if raw is not None:
            return parse_quantity(raw)
    return None


def fields_dropped(pod: Mapping[str, Any], *,
                   adapters: Iterable[object] | None = None) -> FieldsDropped:
    """The fields the pod sets that a cloud of ``adapters`` would not honour (every cloud type
    when None, or when none of them is a known adapter): the fidelity table's WARNED entries."""
    clouds = fieldcheck.cloud_types(adapters)
    return FieldsDropped(entries=fieldcheck.dropped_fields(pod, clouds=clouds))


async def translate(*, pod: Mapping[str, Any], node_name: str, refs: RefSource,
                    ignore_exec_probes: bool = False,
                    adapters: Iterable[object] | None = None,
                    on_dropped: Callable[[FieldsDropped], None] | None = None) -> InstanceSpec:
    """Validate the pod and build the InstanceSpec for it.

    Raises ``PodRejected`` for what no cloud can run and ``PodConfigPending`` when a non-optional
    Secret/ConfigMap (or key) is missing. Any error of ``refs`` propagates unchanged.

    ``on_dropped`` is called once, after a successful translation and only when the pod sets
    fields that a cloud of ``adapters`` (the ones the pod may go to) would not honour.
    """
    validate(pod, ignore_exec_probes=ignore_exec_probes)
    meta = _map(pod, "metadata")
    namespace = _str(meta, "namespace")
    pod_name = _str(meta, "name")
    uid = _str(meta, "uid")
    container = _map(pod, "spec")["containers"][0]

    cached = _Refs(refs, namespace)
    env = await _build_env(pod=pod, container=container, refs=cached, namespace=namespace)
    command = _strings(container, "command", env)
    args = _strings(container, "args", env)
    ports = tuple(
        Port(
            container_port=int(p["containerPort"]),
            protocol=_str(p, "protocol") or "TCP",
            name=_str(p, "name") or None,
        )
        for p in _list(container, "ports")
    )
    resources = _map(container, "resources")
    cpu = _quantity(resources, "cpu")
    memory = _quantity(resources, "memory")
    registry_auth = await _registry_auth(pod=pod, image=str(container["image"]), refs=cached)

    if on_dropped is not None:
        dropped = fields_dropped(pod, adapters=adapters)
        if dropped.entries:
            log.debug("pod fields not honoured", extra=kv(pod=f"{namespace}/{pod_name}",
                                                          fields=",".join(dropped.fields)))
            on_dropped(dropped)
    return InstanceSpec(
        name=instance_name(node_name=node_name, pod_uid=uid),
        image=container["image"],
        gpu_count=container_gpus(container),
        gpu_type=_gpu_type(pod),
        command=command or None,
        args=args or None,
        env=env,
        ports=ports,
        cpu_millis=cpu_millis(cpu) if cpu is not None else 0,
        memory_bytes=memory_bytes(memory) if memory is not None else 0,
        tags={TAG_NODE: node_name, TAG_NAMESPACE: namespace, TAG_POD: pod_name, TAG_UID: uid},
        registry_auth=registry_auth,
        shm_bytes=_shm_bytes(pod, container),
        run_as_user=_security(pod, container, "runAsUser"),
        run_as_group=_security(pod, container, "runAsGroup"),
        hostname=(_str(_map(pod, "spec"), "hostnameOverride")
                  or _str(_map(pod, "spec"), "hostname") or None),
    )


def _security(pod: Mapping[str, Any], container: Mapping[str, Any], key: str) -> int | None:
    """A user or group id of the container's securityContext, else of the pod's (as Kubernetes
    does: the container's wins)."""
    for context in (_map(container, "securityContext"),
                    _map(_map(pod, "spec"), "securityContext")):
        value = context.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


async def _registry_auth(*, pod: Mapping[str, Any], image: str, refs: _Refs
                         ) -> RegistryAuth | None:
    """The credential the cloud pulls ``image`` with, from the pod's ``imagePullSecrets``.

    As the kubelet does: only the pod's list is read (the ServiceAccount admission plugin has
    already copied the ServiceAccount's into a pod that had none); a Secret that does not exist
    is skipped (the pull may still work anonymously, or the cloud refuses it by name); one that
    cannot be parsed keeps the pod waiting, as a failing pull does, with the Secret named."""
    secrets: list[PullSecret] = []
    for name in pull_secret_names(pod):
        data = await refs.get("secret", name)
        if data is not None:
            secrets.append(PullSecret(name=name, data=data))
    try:
        return registry_auth_for_image(image, secrets)
    except PullSecretError as e:
        raise PodConfigPending(field="spec.imagePullSecrets", message=str(e)) from e

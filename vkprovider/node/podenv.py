"""A cloud container's environment, resolved here as the kubelet would resolve it.

Why it exists apart from :mod:`vkprovider.node.translate`: a cloud cannot read the cluster's
Secrets, ConfigMaps or the downward API, so the provider resolves them before the create call:
plain values, ``secretKeyRef``/``configMapKeyRef``, ``fieldRef``, ``resourceFieldRef``,
``envFrom``, and ``$(VAR)`` expansion. Each Secret or ConfigMap is read at most once per
translation (:class:`CachedRefs`); a missing non-optional one keeps the pod waiting
(``PodConfigPending``), and no Secret value ever reaches an error message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Protocol

from vkprovider.errors import PodConfigPending
from vkprovider.node.podjson import C0, LABEL_FIELD_RE, list_at, map_at, str_at, value_at
from vkprovider.semantics.quantity import cpu_millis, parse_quantity

__all__ = ["CachedRefs", "RefSource", "build_env", "expand"]


class RefSource(Protocol):
    """Reads the Secrets and ConfigMaps a pod refers to. ``None`` means it does not exist."""

    async def secret(self, *, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, values already base64-decoded."""
        ...

    async def config_map(self, *, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's ``data``."""
        ...


class CachedRefs:
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


def expand(text: str, env: Mapping[str, str]) -> str:
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
    meta = map_at(pod, "metadata")
    spec = map_at(pod, "spec")
    match = LABEL_FIELD_RE.fullmatch(path)
    if match is not None:
        value = map_at(meta, match["kind"]).get(match["key"])
        return value if isinstance(value, str) else ""
    if path.startswith("metadata."):
        return str_at(meta, path.removeprefix("metadata."))
    if path.startswith("spec."):
        return str_at(spec, path.removeprefix("spec."))
    return ""  # status.podIP(s)/hostIP(s): the cloud assigns an address only after create


def _resource_value(resources: Mapping[str, Any], resource: str, divisor_raw: object) -> str | None:
    kind, name = resource.split(".", 1)
    other = "requests" if kind == "limits" else "limits"
    raw = map_at(resources, kind).get(name)
    if raw is None:
        raw = map_at(resources, other).get(name)
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


async def build_env(
    *, pod: Mapping[str, Any], container: Mapping[str, Any], refs: CachedRefs, namespace: str
) -> dict[str, str]:
    env: dict[str, str] = {}

    for i, entry in enumerate(list_at(container, "envFrom")):
        kind, source = (
            ("secret", "secretRef")
            if value_at(entry, "secretRef") is not None
            else ("configMap", "configMapRef")
        )
        ref = map_at(entry, source)
        name = str_at(ref, "name")
        data = await refs.get(kind, name)
        if data is None:
            if ref.get("optional") is True:
                continue
            raise PodConfigPending(
                field=f"{C0}.envFrom[{i}].{source}",
                message=f'{kind} "{namespace}/{name}" not found',
            )
        prefix = str_at(entry, "prefix")
        for key, value in data.items():
            full = prefix + key
            if _valid_env_name(full):
                env[full] = value

    resources = map_at(container, "resources")
    for i, entry in enumerate(list_at(container, "env")):
        name = str_at(entry, "name")
        value_from = value_at(entry, "valueFrom")
        if value_from is None:
            env[name] = expand(str_at(entry, "value"), env)
            continue
        base = f"{C0}.env[{i}].valueFrom"
        if value_at(value_from, "fieldRef") is not None:
            env[name] = _field_value(pod, str_at(map_at(value_from, "fieldRef"), "fieldPath"))
            continue
        if value_at(value_from, "resourceFieldRef") is not None:
            ref = map_at(value_from, "resourceFieldRef")
            amount = _resource_value(resources, str_at(ref, "resource"), ref.get("divisor"))
            if amount is not None:
                env[name] = amount
            continue
        kind, source = (
            ("secret", "secretKeyRef")
            if value_at(value_from, "secretKeyRef") is not None
            else ("configMap", "configMapKeyRef")
        )
        ref = map_at(value_from, source)
        obj_name = str_at(ref, "name")
        key = str_at(ref, "key")
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

"""One pod against the fidelity table: the refusals it trips and the fields it loses.

Why it exists apart from :mod:`vkprovider.node.fidelity`: the table says what every field does on
every cloud; this applies it to a pod at create time, on the hot path, so its indexes (built once
per table and cloud set) and its warning text live here. :mod:`vkprovider.node.translate` refuses
with :func:`table_refusal` and warns with :func:`dropped_fields` / :func:`event_message`.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vkprovider.node.fidelity import (
    CLOUD_TYPES,
    ENTRIES,
    EVENT_MESSAGE_LIMIT,
    SIMPLE_REFUSALS,
    CloudType,
    Decision,
    Entry,
    Rule,
)
from vkprovider.node.fieldpaths import MAPS as _MAPS
from vkprovider.node.fieldpaths import segments as _segments
from vkprovider.node.fieldpaths import values_at

__all__ = [
    "Dropped",
    "FieldsDropped",
    "cloud_type",
    "cloud_types",
    "dropped_fields",
    "event_message",
    "table_refusal",
]


_ADAPTER_MODULES: Mapping[str, CloudType] = {
    "providers.mock.client": "mock",
    "providers.runpod": "runpod",
    "providers.vastai": "vastai",
    "providers.salad": "salad",
}


def cloud_type(adapter: object) -> CloudType | None:
    """The cloud type of an adapter object (by the module of its class), None if unknown."""
    for cls in type(adapter).__mro__:
        found = _ADAPTER_MODULES.get(cls.__module__)
        if found is not None:
            return found
    return None


def cloud_types(adapters: Iterable[object] | None) -> tuple[CloudType, ...]:
    """The cloud types of ``adapters``; every type when None or when none is known."""
    if adapters is None:
        return CLOUD_TYPES
    found = {t for a in adapters if (t := cloud_type(a)) is not None}
    return tuple(c for c in CLOUD_TYPES if c in found) or CLOUD_TYPES


@dataclass(frozen=True, kw_only=True)
class Dropped:
    """One field of a pod that the cloud will not honour, and why."""

    field: str
    message: str


@dataclass(frozen=True, kw_only=True)
class FieldsDropped:
    """The dropped fields of one pod: what its ``FieldsDropped`` Warning event says."""

    entries: tuple[Dropped, ...] = field(default=())

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(d.field for d in self.entries)

    @property
    def message(self) -> str:
        return event_message(self.entries)


def _warning(entry: Entry, warned: Sequence[CloudType], clouds: Sequence[CloudType]) -> str:
    by_text: dict[str, list[str]] = {}
    for cloud in warned:
        by_text.setdefault(entry.rules[cloud].text, []).append(cloud)
    if len(by_text) == 1 and len(warned) == len(clouds):
        return next(iter(by_text))
    return "; ".join(f"on {', '.join(cs)}: {text}" for text, cs in by_text.items())


def _honoured_here(rule: Rule, pod: Mapping[str, Any]) -> bool:
    """A WARNED rule that honours the field after all in this pod (see Rule.honoured_if)."""
    return rule.honoured_if is not None and rule.honoured_if(pod)


@dataclass(frozen=True)
class _Warned:
    """An entry WARNED on some of a set of clouds (see :func:`_warned_entries`)."""

    entry: Entry
    clouds: tuple[CloudType, ...]  # those of the set it is WARNED on
    conditional: bool  # a rule of them may honour the field after all (honoured_if)
    steps: tuple[str, ...] | None  # a path of plain names and indexes: looked up directly


def _plain_steps(path: str) -> tuple[tuple[str, ...], bool]:
    """The steps of the longest prefix of ``path`` made of plain names, indexes and keys
    (``"spec"``, ``"containers"``, ``"[0]"``), and whether that is the whole path."""
    steps: list[str] = []
    for names, brackets in _segments(path):
        if len(names) != 1:
            return tuple(steps), False
        steps.append(names[0])
        for bracket in brackets:
            if bracket == "*":
                return tuple(steps), False
            steps.append(f"[{bracket}]")
    return tuple(steps), True


@functools.cache
def _warned_entries(ordered: tuple[CloudType, ...]) -> tuple[tuple[_Warned, ...], _Index]:
    """The entries WARNED on at least one of ``ordered``, worked out once per set of clouds
    (every pod a node translates asks for the same few). Only an entry with an ``honoured_if``
    rule needs the pod to tell which clouds drop it, and a path of plain names, indexes and
    keys (``spec.securityContext.fsGroup``, ``spec.containers[0].workingDir``,
    ``spec.containers[0].resources.limits[cpu]``: most of them) is looked up directly instead
    of matched."""
    out = []
    for entry in ENTRIES:
        clouds = tuple(c for c in ordered if entry.rules[c].decision is Decision.WARNED)
        if clouds:
            steps, whole = _plain_steps(entry.path)
            out.append(_Warned(entry=entry, clouds=clouds, steps=steps if whole else None,
                               conditional=any(entry.rules[c].honoured_if is not None
                                               for c in clouds)))
    return tuple(out), _Index([w.entry.path for w in out])


def _plain_value(pod: Mapping[str, Any], steps: tuple[str, ...]) -> Any:
    """The value at a path of names, list indexes (``"[0]"``) and map keys (``"[cpu]"``), None
    when unset (as :func:`values_at` leaves out; an index of a map is unset there too)."""
    current: Any = pod
    for step in steps:
        if step[0] == "[":
            key = step[1:-1]
            if key.isdigit():
                i = int(key)
                current = current[i] if isinstance(current, list) and i < len(current) else None
            else:
                current = current.get(key) if isinstance(current, _MAPS) else None
        elif isinstance(current, _MAPS):
            current = current.get(step)
        else:
            return None
        if current is None:
            return None
    return current


class _Index:
    """Which of a list of entries a pod may set, from the keys its spec and its container set.

    Most of the table's ~70 paths are unset in any one pod, and a path under ``spec.X`` (or
    ``spec.containers[0].X``) is unset when the pod has no key ``X`` there: a pass over the
    pod's own keys (a dozen or two) leaves the few entries worth a look, instead of a lookup
    per entry."""

    __slots__ = ("always", "container_keys", "pod_keys")

    def __init__(self, paths: Sequence[str]) -> None:
        self.pod_keys: dict[str, list[int]] = {}
        self.container_keys: dict[str, list[int]] = {}
        self.always: list[int] = []
        for i, path in enumerate(paths):
            segments = _segments(path)
            if segments[0] != (("spec",), ()) or len(segments) < 2:
                self.always.append(i)
            elif segments[1] == (("containers",), ("0",)) and len(segments) > 2:
                for name in segments[2][0]:
                    self.container_keys.setdefault(name, []).append(i)
            else:
                for name in segments[1][0]:
                    self.pod_keys.setdefault(name, []).append(i)

    def candidates(self, pod: Mapping[str, Any]) -> list[int]:
        """The positions of the entries the pod may set, in order."""
        found = set(self.always)
        spec = pod.get("spec")
        if not isinstance(spec, _MAPS):
            return sorted(found)
        for key in spec:
            found.update(self.pod_keys.get(key, ()))
        containers = spec.get("containers")
        if isinstance(containers, list) and containers and isinstance(containers[0], _MAPS):
            for key in containers[0]:
                found.update(self.container_keys.get(key, ()))
        return sorted(found)


@dataclass(frozen=True)
class _Refusals:
    """The simple refusals of the pod's own fields or of its container's, indexed."""

    entries: tuple[Entry, ...]
    index: _Index


@functools.cache
def _refusals(container: bool) -> _Refusals:
    entries = tuple(e for e in SIMPLE_REFUSALS
                    if e.path.startswith("spec.containers[0].") == container)
    return _Refusals(entries=entries, index=_Index([e.path for e in entries]))


def table_refusal(pod: Mapping[str, Any], *, container: bool) -> tuple[Entry, str] | None:
    """The first simple refusal of the table (:data:`SIMPLE_REFUSALS`) the pod trips, with the
    concrete field: of the pod's own fields, or of its container's (``container``)."""
    refusals = _refusals(container)
    for i in refusals.index.candidates(pod):
        entry = refusals.entries[i]
        for field_, value in values_at(pod, pattern=entry.path):
            if entry.refuses(value):
                return entry, field_
    return None


def dropped_fields(pod: Mapping[str, Any], *,
                   clouds: Collection[CloudType] = CLOUD_TYPES) -> tuple[Dropped, ...]:
    """Every WARNED field the pod sets (to a value worth a warning) on any of ``clouds``."""
    ordered = tuple(c for c in CLOUD_TYPES if c in clouds)
    out: list[Dropped] = []
    table, index = _warned_entries(ordered)
    for i in index.candidates(pod):
        w = table[i]
        entry = w.entry
        if w.steps is not None:
            value = _plain_value(pod, w.steps)
            if value is None:  # unset: nothing to warn about, whatever the clouds
                continue
            values = [(entry.path, value)]
        else:
            values = values_at(pod, pattern=entry.path)
        warned = [c for c in w.clouds if not _honoured_here(entry.rules[c], pod)] \
            if w.conditional else w.clouds
        if not warned:
            continue
        found = [f for f, v in values if entry.warns(field=f, value=v)]
        if found:
            message = _warning(entry, warned, ordered)
            out.extend(Dropped(field=f, message=message) for f in found)
    return tuple(out)


def event_message(dropped: Sequence[Dropped], *, limit: int = EVENT_MESSAGE_LIMIT) -> str:
    """One line for the Warning event, at most ``limit`` bytes; fields with the same reason share
    it. What does not fit is named without its reason, then counted."""
    groups: dict[str, list[str]] = {}
    for d in dropped:
        groups.setdefault(d.message, []).append(d.field)
    parts = [f"{', '.join(fields)} ({message})" for message, fields in groups.items()]
    names = [d.field for d in dropped]
    out = "Accepted, but not honoured on the cloud (see docs/pod-spec.md): "

    def fits(text: str, left: int) -> bool:
        more = f"; and {left} more" if left else ""
        return len((text + more).encode()) <= limit

    shown_groups = 0
    for i, part in enumerate(parts):
        candidate = out + ("; " if i else "") + part
        left = sum(len(f) for f in list(groups.values())[i + 1:])
        if not fits(candidate, left):
            break
        out = candidate
        shown_groups += 1
    rest = [n for fields in list(groups.values())[shown_groups:] for n in fields]
    shown = len(names) - len(rest)
    for j, name in enumerate(rest):
        candidate = out + ("; " if shown or j else "") + name
        if not fits(candidate, len(rest) - j - 1):
            return out + f"; and {len(rest) - j} more"
        out = candidate
    return out

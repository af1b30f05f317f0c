"""Field-path patterns over a pod: the small language the fidelity table names fields in.

Why it exists apart from :mod:`vkprovider.node.fidelity`: the table is data and decisions; this is
the parser and matcher those decisions are written in, used by the table's checks, the warnings
and the refusals alike, and tested on its own.

A pattern is dot-separated: ``[0]`` an index, ``[*]`` every index or key, ``[key]`` one key,
``{a,b}`` alternatives (``spec.containers[*].{command,args}``). A concrete field is written the
same way with the wildcards filled in (``spec.containers[0].resources.limits[cpu]``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from vkprovider.errors import VKError

__all__ = ["MAPS", "FieldPatternError", "matches", "segments", "values_at"]


class FieldPatternError(VKError):
    """A field pattern that does not parse (a bug in a table, never a pod's doing)."""


_SEGMENT = re.compile(
    r"(?P<names>\{[A-Za-z0-9,]+\}|[A-Za-z][A-Za-z0-9]*)(?P<brackets>(?:\[[^\]]+\])*)"
)


def _split(pattern: str) -> list[str]:
    """Split on the dots outside brackets and braces."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(pattern):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "." and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
    parts.append(pattern[start:])
    return parts


@functools.cache
def segments(pattern: str) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """``a.{b,c}[0][*]`` -> ``((("a",), ()), (("b", "c"), ("0", "*")))`` (parsed once)."""
    out: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for part in _split(pattern):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise FieldPatternError(f"bad field pattern {pattern!r} (at {part!r})")
        names = match["names"].strip("{}").split(",")
        brackets = re.findall(r"\[([^\]]+)\]", match["brackets"])
        out.append((tuple(names), tuple(brackets)))
    return tuple(out)


#: dict first: an exact type check, before Mapping's slower ABC check (pods are plain dicts)
MAPS = (dict, Mapping)


def _index(items: list[tuple[str, Any]], bracket: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for where, value in items:
        if bracket == "*":
            if isinstance(value, list):
                out.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
            elif isinstance(value, MAPS):
                out.extend((f"{where}[{k}]", v) for k, v in value.items())
        elif bracket.isdigit():
            i = int(bracket)
            if isinstance(value, list) and i < len(value):
                out.append((f"{where}[{i}]", value[i]))
        elif isinstance(value, MAPS) and bracket in value:
            out.append((f"{where}[{bracket}]", value[bracket]))
    return [(w, v) for w, v in out if v is not None]


def values_at(obj: Any, *, pattern: str) -> list[tuple[str, Any]]:
    """Every (concrete field, value) of ``obj`` the pattern names; unset values are left out."""
    found: list[tuple[str, Any]] = [("", obj)]
    for names, brackets in segments(pattern):
        step: list[tuple[str, Any]] = []
        for where, current in found:
            if not isinstance(current, MAPS):
                continue
            for name in names:
                value = current.get(name)
                if value is None:
                    continue
                items = [(f"{where}.{name}" if where else name, value)]
                for bracket in brackets:
                    items = _index(items, bracket)
                step.extend(items)
        found = step
    return found


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    for names, brackets in segments(pattern):
        alt = "|".join(re.escape(n) for n in names)
        text = f"(?:{alt})" if len(names) > 1 else alt
        for bracket in brackets:
            text += r"\[[^\]]+\]" if bracket == "*" else re.escape(f"[{bracket}]")
        parts.append(text)
    return re.compile(r"\.".join(parts) + r"(?=$|[.\[])")


def matches(pattern: str, *, field: str) -> bool:
    """Whether the concrete ``field`` is the one ``pattern`` names, or a field inside it."""
    return _regex(pattern).match(field) is not None

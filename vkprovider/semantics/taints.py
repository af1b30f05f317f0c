"""Whether a pod's toleration tolerates a node's taint: the Kubernetes rule, once.

Why it exists: the companion asks it twice, with different consequences: move-back must know
whether the scheduler would let a pod onto an internal node (a wrong "yes" surges a replica that
stays Pending), and admission must know whether a pod already tolerates the virtual node's taint.
Both follow ``v1.Toleration.ToleratesTaint``:

* a toleration with an ``effect`` matches only taints with that effect; an empty effect matches
  every effect;
* a toleration with a ``key`` matches only taints with that key; an empty key matches every key
  (the API server only allows it together with ``Exists``: "tolerate everything");
* operator ``Exists`` then matches whatever the taint's value; operator ``Equal``, which is also
  what an empty or absent operator means, needs the values to be equal (absent is ``""``);
* any other operator tolerates nothing.

A missing field and an empty string are the same thing, as they are for the Go structs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "NO_EXECUTE",
    "NO_SCHEDULE",
    "PREFER_NO_SCHEDULE",
    "SCHEDULING_EFFECTS",
    "tolerated",
    "tolerates",
    "untolerated_taint",
]

NO_SCHEDULE = "NoSchedule"
PREFER_NO_SCHEDULE = "PreferNoSchedule"
NO_EXECUTE = "NoExecute"
#: The effects the scheduler's TaintToleration filter enforces (PreferNoSchedule only scores).
SCHEDULING_EFFECTS = frozenset({NO_SCHEDULE, NO_EXECUTE})


def _text(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def tolerates(toleration: Mapping[str, Any], *, taint: Mapping[str, Any]) -> bool:
    """Whether ``toleration`` tolerates ``taint`` (both as API dicts)."""
    effect = _text(toleration, "effect")
    if effect and effect != _text(taint, "effect"):
        return False
    key = _text(toleration, "key")
    if key and key != _text(taint, "key"):
        return False
    operator = _text(toleration, "operator")
    if operator in ("", "Equal"):
        return _text(toleration, "value") == _text(taint, "value")
    return operator == "Exists"


def tolerated(taint: Mapping[str, Any], *, tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any of ``tolerations`` tolerates ``taint``."""
    return any(tolerates(tol, taint=taint) for tol in tolerations)


def untolerated_taint(
    taints: Iterable[Mapping[str, Any]],
    *,
    tolerations: Iterable[Mapping[str, Any]],
    effects: Iterable[str] = SCHEDULING_EFFECTS,
) -> Mapping[str, Any] | None:
    """The first taint with one of ``effects`` that no toleration tolerates, or ``None``.

    With the default ``effects`` this is the scheduler's TaintToleration filter: a node with such
    a taint is not feasible for the pod.
    """
    wanted = frozenset(effects)
    tols = list(tolerations)
    for taint in taints:
        if _text(taint, "effect") in wanted and not tolerated(taint, tolerations=tols):
            return taint
    return None

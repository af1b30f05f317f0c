"""Label selectors and node selector terms, matched exactly as Kubernetes matches them.

Why it exists: an OverflowPolicy selects pods with a ``metav1.LabelSelector`` (the companion
decides with it which pod may burst, the virtual kubelet which cloud may run it), and move-back
must predict whether the scheduler would place a pod on an internal node, which needs the
scheduler's reading of ``nodeSelectorTerms``. Both readings are here, once.

Label selectors (``matchLabels`` plus ``matchExpressions`` with ``In``, ``NotIn``, ``Exists``,
``DoesNotExist``) follow ``metav1.LabelSelectorAsSelector``: every part is ANDed, an empty
selector matches everything, and a malformed selector (an unknown operator, ``In`` or ``NotIn``
without values, ``Exists`` or ``DoesNotExist`` with values) is an error, :class:`SelectorError`.

Node selectors follow the scheduler (``component-helpers/scheduling/corev1/nodeaffinity``): the
terms are ORed; within a term ``matchExpressions`` (which also allow ``Gt`` and ``Lt``) and
``matchFields`` are ANDed; a term with neither selects no node, and so does a malformed term
(the scheduler drops terms it cannot parse rather than failing the pod). ``Gt``/``Lt`` need
exactly one value, a non-negative integer; the node's label must parse as a 64-bit integer or
the requirement does not match.

Not checked when matching: the syntax of label keys and values. The API server validated every
stored pod, node and policy; a key no object can carry simply matches no label. Labels that are
sent to the API server as a ``labelSelector`` (a setting's) are checked first:
:func:`label_problem`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LABEL_OPERATORS",
    "NODE_OPERATORS",
    "SelectorError",
    "label_problem",
    "label_selector_matches",
    "labels_params",
    "labels_selector",
    "node_selector_matches",
    "node_selector_term_matches",
]

#: Operators of a ``metav1.LabelSelectorRequirement``.
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: Operators of a ``NodeSelectorRequirement`` in ``matchExpressions``.
NODE_OPERATORS = (*LABEL_OPERATORS, "Gt", "Lt")
#: Operators of a ``NodeSelectorRequirement`` in ``matchFields``.
_FIELD_OPERATORS = ("In", "NotIn")

# strconv.ParseInt(s, 10, 64): an optional sign, then ASCII digits only.
_INT = re.compile(r"[+-]?[0-9]+")
# A Gt/Lt value must also be a valid label value, so no sign.
_REQUIREMENT_INT = re.compile(r"[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# apimachinery's IsQualifiedName (an optional DNS-subdomain prefix, then a name) and label value
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def label_problem(*, key: str, value: str) -> str | None:
    """What makes ``key=value`` no valid Kubernetes label, or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.fullmatch(prefix)):
        return f"{key!r}: the prefix is not a DNS subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return f"{key!r} is not a label key (a name of at most 63 of [A-Za-z0-9-_.])"
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        return f"{key}={value!r}: not a label value (at most 63 of [A-Za-z0-9-_.])"
    return None


def labels_selector(labels: Mapping[str, str]) -> str:
    """``labels`` as the ``labelSelector`` query that selects objects carrying all of them."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def labels_params(labels: Mapping[str, str] | None) -> dict[str, str] | None:
    """The list/watch query of the objects carrying all ``labels`` (None: no labels, every
    object)."""
    return {"labelSelector": labels_selector(labels)} if labels else None


class SelectorError(ValueError):
    """A malformed selector. ``field`` is the path inside the selector, e.g.
    ``matchExpressions[0].values``."""

    def __init__(self, *, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    operator: str
    values: frozenset[str]
    bound: int = 0  # the parsed value of Gt/Lt

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if not present:  # Gt, Lt
            return False
        value = _parse_int64(labels[self.key])
        if value is None:
            return False
        return value > self.bound if self.operator == "Gt" else value < self.bound


def label_selector_matches(selector: Mapping[str, Any], *, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy a ``metav1.LabelSelector`` (as a dict, the API's field names).

    ``{}`` matches everything. ``In``: the key is present with one of the values. ``NotIn``: the
    key is absent or its value is none of the values. ``Exists``/``DoesNotExist``: the key is
    present/absent. ``matchLabels`` entries must be present with exactly that value (``""`` is a
    value, not "absent"). Raises :class:`SelectorError` for a malformed selector.
    """
    if not isinstance(selector, Mapping):
        raise SelectorError(field="<selector>", message="a label selector must be a mapping")
    requirements: list[_Requirement] = []
    match_labels = selector.get("matchLabels")
    if match_labels is not None:
        if not isinstance(match_labels, Mapping):
            raise SelectorError(field="matchLabels", message="must be a mapping")
        for key, value in match_labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise SelectorError(field=f"matchLabels.{key}", message="must be a string")
            requirements.append(_Requirement(key=key, operator="In", values=frozenset({value})))
    for i, expr in enumerate(_sequence(selector, "matchExpressions")):
        requirements.append(
            _requirement(expr, field=f"matchExpressions[{i}]", operators=LABEL_OPERATORS)
        )
    return all(req.matches(labels) for req in requirements)


def node_selector_term_matches(
    term: Mapping[str, Any],
    *,
    labels: Mapping[str, str],
    fields: Mapping[str, str] | None = None,
) -> bool:
    """Whether a node with ``labels`` and ``fields`` satisfies one ``NodeSelectorTerm``.

    ``fields`` are the node's selectable fields; the scheduler offers exactly
    ``{"metadata.name": <node name>}``. A term with no requirements, or one that is malformed,
    matches no node (as in the scheduler).
    """
    if not isinstance(term, Mapping):
        return False
    try:
        expressions = [
            _requirement(e, field=f"matchExpressions[{i}]", operators=NODE_OPERATORS)
            for i, e in enumerate(_sequence(term, "matchExpressions"))
        ]
        field_reqs = [
            _field_requirement(e, field=f"matchFields[{i}]")
            for i, e in enumerate(_sequence(term, "matchFields"))
        ]
    except SelectorError:
        return False
    if not expressions and not field_reqs:
        return False
    node_fields = fields or {}
    return all(r.matches(labels) for r in expressions) and all(
        (node_fields.get(r.key, "") in r.values) == (r.operator == "In") for r in field_reqs
    )


def node_selector_matches(
    selector: Mapping[str, Any],
    *,
    labels: Mapping[str, str],
    fields: Mapping[str, str] | None = None,
) -> bool:
    """Whether a node satisfies a ``NodeSelector`` (e.g. required node affinity): any term does.

    No terms at all match no node. Callers decide what an absent selector means (for required
    node affinity: no constraint).
    """
    if not isinstance(selector, Mapping):
        return False
    try:
        terms = _sequence(selector, "nodeSelectorTerms")
    except SelectorError:
        return False
    return any(node_selector_term_matches(t, labels=labels, fields=fields) for t in terms)


def _sequence(obj: Mapping[str, Any], key: str, *, field: str = "") -> Sequence[Any]:
    value = obj.get(key)
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise SelectorError(field=f"{field}.{key}" if field else key, message="must be a list")
    return value


def _strings(expr: Mapping[str, Any], *, field: str) -> list[str]:
    values = list(_sequence(expr, "values", field=field))
    for j, value in enumerate(values):
        if not isinstance(value, str):
            raise SelectorError(field=f"{field}.values[{j}]", message="must be a string")
    return values


def _key_and_operator(expr: Any, *, field: str, operators: Sequence[str],
                      kind: str = "operator") -> tuple[str, str]:
    """The requirement's key and operator, or a SelectorError naming the bad one."""
    if not isinstance(expr, Mapping):
        raise SelectorError(field=field, message="must be a mapping")
    key = expr.get("key")
    if not isinstance(key, str) or not key:
        raise SelectorError(field=f"{field}.key", message="a non-empty key is required")
    operator = expr.get("operator")
    if operator not in operators:
        raise SelectorError(
            field=f"{field}.operator",
            message=f"{operator!r} is not a valid {kind} (one of {', '.join(operators)})",
        )
    return key, str(operator)


def _requirement(expr: Any, *, field: str, operators: Sequence[str]) -> _Requirement:
    key, operator = _key_and_operator(expr, field=field, operators=operators)
    values = _strings(expr, field=field)
    if operator in ("In", "NotIn") and not values:
        raise SelectorError(
            field=f"{field}.values", message=f"values must be non-empty for {operator}"
        )
    if operator in ("Exists", "DoesNotExist") and values:
        raise SelectorError(field=f"{field}.values", message=f"values must be empty for {operator}")
    bound = 0
    if operator in ("Gt", "Lt"):
        if len(values) != 1:
            raise SelectorError(
                field=f"{field}.values", message=f"exactly one value is required for {operator}"
            )
        parsed = _parse_int64(values[0]) if _REQUIREMENT_INT.fullmatch(values[0]) else None
        if parsed is None:
            raise SelectorError(
                field=f"{field}.values[0]",
                message=f"{values[0]!r} is not an integer (required for {operator})",
            )
        bound = parsed
    return _Requirement(key=key, operator=operator, values=frozenset(values), bound=bound)


def _field_requirement(expr: Any, *, field: str) -> _Requirement:
    key, operator = _key_and_operator(expr, field=field, operators=_FIELD_OPERATORS,
                                      kind="field selector operator")
    values = _strings(expr, field=field)
    if len(values) != 1:
        raise SelectorError(field=f"{field}.values", message="must have exactly one element")
    return _Requirement(key=key, operator=operator, values=frozenset(values))


def _parse_int64(text: str) -> int | None:
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None

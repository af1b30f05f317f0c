"""Reading a pod as untyped JSON: the small accessors translation and validation share.

Why it exists: a pod comes from the API server (or a pod author) as plain dicts, and any field
may be missing or of the wrong type. These accessors return an empty value of the expected type
instead of raising, so validation can name the field that is wrong instead of failing on a
``KeyError``; :func:`unsupported` builds the refusal that names it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vkprovider.errors import PodRejected
from vkprovider.node.fidelity import REASON_UNSUPPORTED

__all__ = ["C0", "LABEL_FIELD_RE", "MAPS", "list_at", "map_at", "str_at", "unsupported",
           "value_at"]

#: The pod's one container, as refusals name its fields.
C0 = "spec.containers[0]"
#: A downward-API ``fieldRef`` to one label or annotation.
LABEL_FIELD_RE = re.compile(r"metadata\.(?P<kind>labels|annotations)\['(?P<key>[^']+)'\]")

#: dict first: an exact type check before Mapping's slower ABC check (pods are plain dicts)
MAPS = (dict, Mapping)


def map_at(obj: Any, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, MAPS) else None
    return value if isinstance(value, MAPS) else {}


def list_at(obj: Any, key: str) -> Sequence[Any]:
    value = obj.get(key) if isinstance(obj, MAPS) else None
    return value if isinstance(value, list) else []


def str_at(obj: Any, key: str) -> str:
    value = obj.get(key) if isinstance(obj, MAPS) else None
    return value if isinstance(value, str) else ""


def unsupported(field: str, message: str) -> PodRejected:
    return PodRejected(reason=REASON_UNSUPPORTED, field=field, message=message)


def value_at(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None

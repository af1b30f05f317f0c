"""Reuse the parsed :class:`~providers.base.Instance` of an instance a cloud lists unchanged.

Why it exists: the provider lists every cloud every few seconds (one call per provider per
sweep) and, at thousands of instances, turning each listed JSON object into an ``Instance`` (tags
copied, times parsed) was the largest part of a steady sweep's CPU (bench/steady.py). Between two
sweeps almost every instance is listed exactly as before; comparing its JSON object with the one
seen last time is a C-level dict comparison, several times cheaper than parsing it again. The
same object coming back also lets the provider tell "unchanged" by identity.

An adapter keeps one :class:`ListingCache` and calls :meth:`ListingCache.parse` for each listed
object; entries not listed in the last call are dropped, so the cache never outgrows the listing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from providers.base import Instance

__all__ = ["ListingCache"]


class ListingCache:
    """Listed JSON object -> parsed Instance, for the objects of the last listing."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Mapping[str, Any], Instance]] = {}

    def parse_all(self, items: Iterable[Mapping[str, Any]], *,
                  key: Callable[[Mapping[str, Any]], str],
                  parse: Callable[[Mapping[str, Any]], Instance]) -> list[Instance]:
        """``parse`` each item, or reuse the Instance of an equal item from the last listing."""
        fresh: dict[str, tuple[Mapping[str, Any], Instance]] = {}
        out: list[Instance] = []
        for item in items:
            k = key(item)
            seen = self._last.get(k)
            inst = seen[1] if seen is not None and seen[0] == item else parse(item)
            fresh[k] = (item, inst)
            out.append(inst)
        self._last = fresh
        return out

    def __len__(self) -> int:
        return len(self._last)

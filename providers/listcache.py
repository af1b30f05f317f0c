"""Reuse the parsed :class:`~providers.base.Instance` of an instance a cloud lists unchanged.

Why it exists: the provider lists every cloud every few seconds (one call per provider per
sweep) and, at thousands of instances, turning each listed JSON object into an ``Instance`` (tags
copied, times parsed) was the largest part of a steady sweep's CPU (bench/steady.py). Between two
sweeps almost every instance is listed exactly as before; comparing its JSON object with the one
seen last time is a C-level dict comparison, several times cheaper than parsing it again. The
same object coming back also lets the provider tell "unchanged" by identity.

An adapter keeps one :class:`ListingCache` and calls :meth:`ListingCache.parse_all` with each
listing; entries not listed in the last call are dropped, so the cache never outgrows the listing.

What is kept of a listed object is not the object but its values in a tuple, next to its keys in
another tuple that all objects of one shape share: the mock's instance is a dict of 22 fields,
832 bytes of dict per instance (4 MiB at 5,000 instances), its values tuple 216.
Comparing keys and values in order is as exact as comparing the dicts, the order aside (a
cloud that reorders fields has its instances parsed again, nothing worse).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from providers.base import Instance

__all__ = ["ListingCache"]


_Seen = tuple[tuple[str, ...], tuple[Any, ...], Instance]


class ListingCache:
    """Listed JSON object -> parsed Instance, for the objects of the last listing."""

    def __init__(self) -> None:
        self._last: dict[str, _Seen] = {}
        self._shapes: dict[tuple[str, ...], tuple[str, ...]] = {}

    def parse_all(self, items: Iterable[Mapping[str, Any]], *,
                  key: Callable[[Mapping[str, Any]], str],
                  parse: Callable[[Mapping[str, Any]], Instance]) -> list[Instance]:
        """``parse`` each item, or reuse the Instance of an equal item from the last listing."""
        fresh: dict[str, _Seen] = {}
        out: list[Instance] = []
        shapes: dict[tuple[str, ...], tuple[str, ...]] = {}
        for item in items:
            k = key(item)
            names = tuple(item)
            names = shapes.setdefault(names, self._shapes.get(names, names))
            values = tuple(item.values())
            seen = self._last.get(k)
            if seen is not None and seen[0] is names and seen[1] == values:
                inst = seen[2]
            else:
                inst = parse(item)
            fresh[k] = (names, values, inst)
            out.append(inst)
        self._last = fresh
        self._shapes = shapes  # the shapes of this listing only: never more than it has
        return out

    def __len__(self) -> int:
        return len(self._last)

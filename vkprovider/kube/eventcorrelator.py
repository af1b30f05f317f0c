"""Which Events to write, and how: spam filter, aggregation and dedup, as the kubelet does.

Why it exists: every Event is an API write, and a retry loop or a burst of thousands of pods can
flood etcd with them. client-go's event correlator (what the kubelet runs) is the reference:

* **aggregation**: events of one object with the same (type, reason) but different messages,
  more than ``aggregate_after`` within ``aggregate_window``, are folded into one Event whose
  message starts "(combined from similar events): ";
* **dedup**: a repeat of an exact (object, type, reason, message) bumps the ``count`` of the
  Event already written instead of writing a new one;
* **spam filter**: each object (per source) has a token bucket of ``burst`` Events, refilled one
  per ``refill_seconds``; an Event with no token left is dropped (and counted).

Pure: no I/O, an injected clock, so every rule is unit-tested. :mod:`vkprovider.kube.events`
does the writing.
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

AGGREGATED_PREFIX = "(combined from similar events): "

#: (involved object uid, type, reason, message): one Event object per key. An aggregated Event's
#: key has :data:`AGGREGATED_PREFIX` as its message, so its repeats bump one object.
DedupKey = tuple[str, str, str, str]

_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True)
class Decision:
    """What to write for one recorded Event: a new object, or a count bump of an existing one."""

    key: DedupKey
    name: str  # the Event object's name
    message: str  # possibly aggregated
    count: int  # the count the Event object should have now
    new: bool  # True: create it; False: patch its count


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(slots=True)
class _Similar:
    first: float
    message: str  # the first message seen
    more: set[str] | None = None  # all distinct messages, made once a second one comes: most
    # objects repeat one message, and 4,096 sets were ~0.5 MiB of a 5,000-pod provider

    def add(self, message: str) -> int:
        """Count ``message`` in; how many distinct messages there are now."""
        if self.more is None:
            if message == self.message:
                return 1
            self.more = {self.message}
        self.more.add(message)
        return len(self.more)


class EventCorrelator:
    def __init__(self, *, burst: int = 25, refill_seconds: float = 300.0,
                 aggregate_after: int = 10, aggregate_window: float = 600.0,
                 cache_size: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._refill = refill_seconds
        self._aggregate_after = aggregate_after
        self._window = aggregate_window
        self._cache_size = cache_size
        self._clock = clock
        self._buckets: collections.OrderedDict[str, _Bucket] = collections.OrderedDict()
        self._similar: collections.OrderedDict[tuple[str, str, str], _Similar] = (
            collections.OrderedDict())
        self._seen: collections.OrderedDict[DedupKey, tuple[str, int]] = (
            collections.OrderedDict())
        self.dropped = 0  # Events the spam filter refused

    def observe(self, *, uid: str, obj_name: str, type_: str, reason: str,
                message: str) -> Decision | None:
        """Correlate one Event about object ``uid``; None when the spam filter drops it."""
        now = self._clock()
        if not self._take_token(uid, now):
            self.dropped += 1
            return None
        combined = self._aggregate(uid=uid, type_=type_, reason=reason, message=message, now=now)
        if combined:
            message = f"{AGGREGATED_PREFIX}{message}"
        key = (uid, type_, reason, AGGREGATED_PREFIX if combined else message)
        seen = self._seen.get(key)
        if seen is not None:
            name, count = seen[0], seen[1] + 1
            self._seen[key] = (name, count)
            self._seen.move_to_end(key)
            return Decision(key=key, name=name, message=message, count=count, new=False)
        name = f"{obj_name or 'object'}.{secrets.token_hex(8)}"
        self._remember(self._seen, key, (name, 1))
        return Decision(key=key, name=name, message=message, count=1, new=True)

    def forget(self, key: DedupKey) -> None:
        """The Event object is gone (expired by its TTL): the next repeat creates a new one."""
        self._seen.pop(key, None)

    def _take_token(self, uid: str, now: float) -> bool:
        bucket = self._buckets.get(uid)
        if bucket is None:
            bucket = _Bucket(tokens=float(self._burst), at=now)
            self._remember(self._buckets, uid, bucket)
        else:
            bucket.tokens = min(float(self._burst),
                                bucket.tokens + (now - bucket.at) / self._refill)
            bucket.at = now
            self._buckets.move_to_end(uid)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _aggregate(self, *, uid: str, type_: str, reason: str, message: str, now: float
                   ) -> bool:
        """Whether this event is one of too many similar ones (fold them into one Event)."""
        key = (uid, type_, reason)
        similar = self._similar.get(key)
        if similar is None or now - similar.first > self._window:
            similar = _Similar(first=now, message=message)
            self._remember(self._similar, key, similar)
        return similar.add(message) > self._aggregate_after

    def _remember(self, cache: collections.OrderedDict[_K, _V], key: _K, value: _V) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self._cache_size:
            cache.popitem(last=False)

"""Keep CPython's cyclic garbage collector from stalling the event loop over big caches.

Why it exists: the provider and the companion keep thousands of decoded API objects (pods,
ReplicaSets, ...) in informer caches: plain dicts, lists and strings without reference cycles,
freed by reference counting alone. CPython's full (generation 2) collection still walks every one
of them, and it runs whenever the objects that survived since the last one grow by a quarter:
exactly what a relist of 5,000 pods does, five or six times in a row. Measured by
bench/relist.py on the 2-core machine: 5-6 full collections per 5,000-pod relist, the longest
98-255 ms, the event loop stalled that long (probes late, Lease renewals late).

Two measures, both process-wide:

* :func:`tune` (once, at start): a full collection is considered every 100 generation-1
  collections instead of every 10; young collections run as before, so cyclic garbage (tasks,
  exceptions with tracebacks) is still found quickly.
* :func:`bulk_load` around a relist: the collector is off while the list is decoded and taken
  in, and what survived is then moved out of the collector's sight (:func:`gc.freeze`): the
  cache is never walked again, and objects that later leave it are freed by reference counting
  as before. The price: cyclic garbage that happened to be alive, or created, during the
  (about one second) load stays in memory. Relists are rare (start, leadership, a watch that fell
  behind), so this is a few objects per relist.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["FULL_COLLECTION_EVERY", "bulk_load", "tune"]

#: Generation-1 collections between two full ones considered (CPython's default: 10).
FULL_COLLECTION_EVERY = 100

_depth = 0
_was_enabled = True


def tune() -> None:
    """Make full collections ten times rarer; young ones unchanged."""
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, FULL_COLLECTION_EVERY)


@contextlib.contextmanager
def bulk_load() -> Iterator[None]:
    """No collection while the block runs; afterwards what survived is frozen. Nests (several
    informers relisting at once): the collector comes back when the last one is done."""
    global _depth, _was_enabled
    if _depth == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.freeze()
            if _was_enabled:
                gc.enable()

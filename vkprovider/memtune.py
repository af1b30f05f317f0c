"""Ask glibc's allocator to hand freed memory back to the system, once, at start.

Why it exists: a provider's memory has a steady part (the pod cache, one record per pod) and
bursts on top: 64 workers' TLS connections (uvloop gives each a 256 KiB read buffer), a cloud
listing decoded every few seconds (megabytes of JSON for thousands of instances). With glibc's
defaults the bursts stay in the resident set after they are freed: each freed large block raises
the threshold under which blocks come from the heap instead of their own mapping (so the next
ones land in the heap and pin it), and threads get arenas of their own. Measured by
bench/steady.py at 5,000 pods: 173 -> 163 MiB resident with the three settings below, the same
CPU per sweep.

* ``M_MMAP_THRESHOLD`` fixed at 128 KiB (glibc's starting value; fixing it stops the raising):
  blocks of that size and up get their own mapping, returned the moment they are freed;
* ``M_TRIM_THRESHOLD`` 128 KiB: free memory at the top of the heap goes back past that;
* ``M_ARENA_MAX`` 2: the few threads (DNS lookups, the loop's executor) share two arenas.

An operator's own ``MALLOC_*`` environment settings win: a setting named there is left alone.
Elsewhere than glibc (musl, macOS) this does nothing.

:func:`without_http2_client` is the other start-up saving: httpcore imports the ``h2`` stack
whenever it is installed (the image installs it for the mock cloud's HTTP/2 edge), ~1.4 MiB
resident in a process whose clients all speak HTTP/1.1 (the API server over the project's own
pool, the clouds over httpx's default). The provider and the companion call it first thing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping

from vkprovider.logs import kv

__all__ = ["SETTINGS", "tune_malloc", "without_http2_client"]

log = logging.getLogger(__name__)

#: mallopt() parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

#: (environment variable glibc reads, mallopt parameter, value).
SETTINGS: tuple[tuple[str, int, int], ...] = (
    ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, 128 * 1024),
    ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, 128 * 1024),
    ("MALLOC_ARENA_MAX", _M_ARENA_MAX, 2),
)


def tune_malloc(*, environ: Mapping[str, str] | None = None) -> list[str]:
    """Apply :data:`SETTINGS` that the environment does not set; the names of those applied
    (empty where the C library is not glibc)."""
    env = os.environ if environ is None else environ
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: AttributeError elsewhere
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = []
    for name, param, value in SETTINGS:
        if name in env:
            continue
        if mallopt(param, value) == 1:
            applied.append(name)
        else:  # glibc refused it: say so, run on with its default
            log.warning("mallopt refused a setting", extra=kv(setting=name, value=value))
    return applied


def without_http2_client() -> bool:
    """Load httpcore without its optional HTTP/2 connection class (its ``import h2`` fails once,
    so httpcore keeps the stub it has for installs without h2); ``h2`` itself stays importable
    for code that serves HTTP/2. False, changing nothing, when httpcore or h2 is loaded already.

    In this process an ``httpx`` client made with ``http2=True`` then fails at its first
    request (httpcore: "the h2 package is not installed"); no client of the provider or the
    companion asks for HTTP/2.
    """
    if "httpcore" in sys.modules or "h2" in sys.modules:
        return False
    sys.modules["h2"] = None  # type: ignore[assignment]  # the import system's "not here"
    try:
        import httpcore  # noqa: F401
    finally:
        if "h2" in sys.modules and sys.modules["h2"] is None:
            del sys.modules["h2"]
    return True

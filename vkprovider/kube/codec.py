"""JSON for the API server's bodies and watch events, decoded and encoded in C (orjson).

Why it exists: after TLS, decoding watch events is the provider's largest single CPU cost per
pod in a burst (each pod arrives as 4-5 events, each a whole pod); orjson decodes a pod in about
half the time of :mod:`json` and encodes a patch ten times faster (notes on Python client
speed; bench/burst.py --profile). It also takes the watch stream's bytes as they come, with no
text decoding first.

Exactness: orjson keeps integers exact up to 64 bits and turns larger ones into floats. The API
server never sends those: its JSON numbers are int64 or float64 by API conventions (it decodes
every body into them before storing it). Cloud APIs are not bound by that, so providers/ keep
the standard library's decoder.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["DecodeError", "dumps", "loads"]

#: Raised for bytes that are not JSON; a ValueError, like json.JSONDecodeError.
DecodeError = orjson.JSONDecodeError


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The value of one JSON document."""
    return orjson.loads(data)


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON bytes (UTF-8, no spaces), as a request body wants it."""
    return orjson.dumps(value)

"""Structured logs: one JSON object per line, with key/value context.

Why it exists: operators grep and ship logs; every message carries the fields that identify what it
is about (pod, uid, provider, instance) as keys rather than prose. Callers pass context as
``log.info("msg", extra=kv(pod=..., uid=...))``. Never pass secrets: nothing here can tell.
Both formats carry a UTC timestamp with milliseconds; the text format (for people at a terminal)
reads ``2025-01-31T12:00:00.123Z I logger: msg key=value``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_KV = "vk_kv"


def kv(**fields: Any) -> dict[str, Any]:
    """Context for one log call: ``log.info("created", extra=kv(pod="ns/name"))``."""
    return {_KV: fields}


def timestamp(record: logging.LogRecord) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2025-01-31T12:00:00.123Z``."""
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z")


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(getattr(record, _KV, {}) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, _KV, {}) or {}
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        base = f"{timestamp(record)} {record.levelname[0]} {record.name}: {record.getMessage()}"
        text = f"{base} {extra}" if extra else base
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup(*, level: str = "INFO", fmt: str = "json") -> None:
    # Neither format prints a record's source line, thread or process: do not collect them
    # (the logging HOWTO's "Optimization"; findCaller walks the stack on every call, a visible
    # share of a burst's CPU when every pod logs its create).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

"""Times as the Kubernetes API writes them: RFC 3339 in UTC, with or without microseconds.

Why it exists: conditions, events, pod status, leases and the kubelet API all carry timestamps,
and the API server is strict about their shape: ``metav1.Time`` is second precision
(``2026-01-01T12:00:00Z``), ``metav1.MicroTime`` (Lease ``renewTime``, Event ``eventTime``) has
exactly six fractional digits (``2026-01-01T12:00:00.000123Z``). One formatter each, and one
parser for what comes back.

A naive ``datetime`` (no ``tzinfo``) is taken to be UTC, never the host's local time: a server's
timezone must not shift what it writes into the cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["TimeFormatError", "format_micro_time", "format_time", "parse_time"]


class TimeFormatError(ValueError):
    """A timestamp that is not an RFC 3339 time; the message names it."""


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision (``metav1.Time``); fractions are dropped."""
    return _utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds (``metav1.MicroTime``)."""
    return _utc(moment).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """A timezone-aware ``datetime`` from an RFC 3339 time (``Z`` or an offset, any fraction).

    The offset is kept as written; a time without one is taken to be UTC. Like
    ``datetime.fromisoformat`` (which the callers used before) it also takes other ISO 8601
    shapes, such as a date alone. Raises :class:`TimeFormatError` naming ``text``.
    """
    if not isinstance(text, str):
        raise TimeFormatError(f"expected a string time, got {type(text).__name__}")
    value = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise TimeFormatError(f"{text!r} is not an RFC 3339 time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

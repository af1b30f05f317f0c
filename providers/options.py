"""Typed readers of an adapter's ``options`` mapping, shared by every cloud adapter.

Why it exists: each adapter used to read its options with ``bool()``/``int()``/``float()``, so the
string ``"false"`` meant *true*, ``"many"`` failed with a message that did not say which option it
was, and retry defaults drifted apart between adapters for no reason. Options come from a settings
file or from a GPUProvider's ``spec.options`` (hand-written YAML), so they are read here once, the
same way for every cloud:

* every reader raises :class:`InvalidOption` (a ``ValueError``, the adapters' invalid-options
  error) whose text is ``options.<name>: <why>``; the service prefixes it with the field it came
  from (``spec.options.verified: ...``, ``providers[vast].options.verified: ...``);
* a missing key and an explicit ``null`` both mean "the default";
* booleans accept ``true``/``false``, ``"true"``/``"false"``, ``1``/``0``, ``"1"``/``"0"``,
  ``"yes"``/``"no"`` (any case) and nothing else;
* numbers accept JSON numbers and decimal strings (never booleans, NaN or infinities);
* durations accept seconds (a number) or a Go-style string (``"500ms"``, ``"30s"``, ``"1m30s"``);
* :func:`retry_options` reads the four retry knobs with one set of defaults
  (:data:`DEFAULT_RETRY`) for every adapter.

Values of options named secret (registry credentials) are never quoted in an error.
Imports only the standard library (and nothing from the service), like every adapter module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_RETRY",
    "RETRY_KEYS",
    "InvalidOption",
    "RetrySettings",
    "boolean",
    "choice",
    "duration",
    "integer",
    "mapping",
    "name_map",
    "number",
    "optional_integer",
    "optional_number",
    "optional_string",
    "parse_duration",
    "reject_unknown",
    "retry_options",
    "string",
    "strings",
]

Options = Mapping[str, Any]

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                 "h": 3600.0}
_QUOTE_MAX = 40  # how much of a bad value an error quotes


class InvalidOption(ValueError):
    """An option is unknown or its value is not acceptable; the text names it.

    ``str(error)`` is ``options.<name>: <why>`` (``options: <why>`` for unknown keys). It is a
    ``ValueError`` because that is what adapters raised for bad options before this module
    existed, and what the service maps to a configuration error naming the field.
    """

    def __init__(self, name: str | None, why: str) -> None:
        super().__init__(f"options.{name}: {why}" if name else f"options: {why}")
        self.option = name
        self.why = why


def _quote(value: Any, *, secret: bool = False) -> str:
    if secret:
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= _QUOTE_MAX else text[: _QUOTE_MAX - 3] + "..."


def _given(raw: Options, name: str) -> bool:
    return raw.get(name) is not None


def reject_unknown(raw: Options, known: Collection[str], *, cloud: str = "") -> None:
    """Refuse keys not in ``known``: ``options: unknown <cloud> option(s) a, b; known: ...``."""
    unknown = sorted(str(k) for k in set(raw) - set(known))
    if unknown:
        label = f"{cloud} option(s)" if cloud else "option(s)"
        raise InvalidOption(None, f"unknown {label} {', '.join(unknown)}; "
                                  f"known: {', '.join(sorted(known))}")


def boolean(raw: Options, name: str, *, default: bool) -> bool:
    """``true``/``false`` as a boolean, ``1``/``0``, or a string true/false/1/0/yes/no."""
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise InvalidOption(name, f"must be true or false (got {_quote(value)})")


def _to_number(name: str, value: Any, *, what: str) -> float:
    if isinstance(value, bool):
        raise InvalidOption(name, f"must be {what} (got {_quote(value)})")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise InvalidOption(name, f"must be {what} (got {_quote(value)})") from None
    else:
        raise InvalidOption(name, f"must be {what} (got {_quote(value)})")
    if not math.isfinite(result):
        raise InvalidOption(name, f"must be {what} (got {_quote(value)})")
    return result


def _bounds(minimum: float | None, maximum: float | None, *, above: bool) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if above else '>='} {minimum:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    return " and ".join(parts)


def _check_range(name: str, value: float, *, what: str, minimum: float | None,
                 maximum: float | None, above: bool, shown: Any) -> None:
    low = minimum is not None and (value <= minimum if above else value < minimum)
    high = maximum is not None and value > maximum
    if low or high:
        limits = _bounds(minimum, maximum, above=above)
        raise InvalidOption(name, f"must be {what} {limits} (got {_quote(shown)})")


def optional_number(raw: Options, name: str, *, minimum: float | None = None,
                    maximum: float | None = None, above: bool = False) -> float | None:
    """A finite number (or a decimal string) within bounds; None when not given.

    ``above=True`` makes ``minimum`` exclusive (``> minimum``).
    """
    value = raw.get(name)
    if value is None:
        return None
    limits = _bounds(minimum, maximum, above=above)
    result = _to_number(name, value, what=f"a number {limits}".rstrip())
    _check_range(name, result, what="a number", minimum=minimum, maximum=maximum, above=above,
                 shown=value)
    return result


def number(raw: Options, name: str, *, default: float, minimum: float | None = None,
           maximum: float | None = None, above: bool = False) -> float:
    """:func:`optional_number` with a default."""
    result = optional_number(raw, name, minimum=minimum, maximum=maximum, above=above)
    return default if result is None else result


def optional_integer(raw: Options, name: str, *, minimum: int | None = None,
                     maximum: int | None = None) -> int | None:
    """A whole number (``20``, ``20.0`` or ``"20"``) within bounds; None when not given."""
    value = raw.get(name)
    if value is None:
        return None
    limits = _bounds(minimum, maximum, above=False)
    what = f"an integer {limits}".rstrip()
    result = _to_number(name, value, what=what)
    if not result.is_integer():
        raise InvalidOption(name, f"must be {what} (got {_quote(value)})")
    _check_range(name, result, what="an integer", minimum=minimum, maximum=maximum,
                 above=False, shown=value)
    return int(result)


def integer(raw: Options, name: str, *, default: int, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """:func:`optional_integer` with a default."""
    result = optional_integer(raw, name, minimum=minimum, maximum=maximum)
    return default if result is None else result


def parse_duration(text: str) -> float | None:
    """Seconds from ``"1.5"``, ``"500ms"``, ``"30s"``, ``"1h30m"``; None when it is none of them."""
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    return total if position == len(text) else None


def duration(raw: Options, name: str, *, default: float, minimum: float | None = None,
             maximum: float | None = None, above: bool = False) -> float:
    """Seconds: a number, or a string such as ``"500ms"``, ``"30s"``, ``"2m"``, ``"1h30m"``."""
    value = raw.get(name)
    if value is None:
        return default
    limits = _bounds(minimum, maximum, above=above)
    what = f'a duration (seconds, or e.g. "30s", "5m") {limits}'.rstrip()
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None:
        seconds = _to_number(name, value, what=what)
    if not math.isfinite(seconds):
        raise InvalidOption(name, f"must be {what} (got {_quote(value)})")
    _check_range(name, seconds, what="a duration", minimum=minimum, maximum=maximum,
                 above=above, shown=value)
    return seconds


def optional_string(raw: Options, name: str, *, pattern: re.Pattern[str] | None = None,
                    hint: str = "", secret: bool = False) -> str | None:
    """A non-empty string (matching ``pattern`` when given); None when not given."""
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        shown = _quote(value, secret=secret)
        raise InvalidOption(name, f"must be a non-empty string (got {shown})")
    if pattern is not None and not pattern.match(value):
        why = hint or f"must match {pattern.pattern}"
        raise InvalidOption(name, f"{why} (got {_quote(value, secret=secret)})")
    return value


def string(raw: Options, name: str, *, default: str, pattern: re.Pattern[str] | None = None,
           hint: str = "") -> str:
    """:func:`optional_string` with a default."""
    result = optional_string(raw, name, pattern=pattern, hint=hint)
    return default if result is None else result


def choice(raw: Options, name: str, *, choices: Sequence[str], default: str) -> str:
    """One of ``choices`` (compared exactly)."""
    value = raw.get(name)
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        raise InvalidOption(name, f"must be one of {', '.join(choices)} (got {_quote(value)})")
    return value


def strings(raw: Options, name: str, *, pattern: re.Pattern[str] | None = None,
            hint: str = "") -> tuple[str, ...]:
    """A list of non-empty strings (each matching ``pattern`` when given); ``()`` by default."""
    value = raw.get(name)
    if value is None:
        return ()
    what = hint or "must be a list of non-empty strings"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidOption(name, f"{what} (got {_quote(value)})")
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise InvalidOption(name, f"{what} (got {_quote(item)} in the list)")
        if pattern is not None and not pattern.match(item):
            raise InvalidOption(name, f"{what} (got {_quote(item)} in the list)")
    return tuple(value)


def mapping(raw: Options, name: str, *, secret: bool = False) -> dict[str, Any] | None:
    """A mapping with string keys, copied; None when not given."""
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidOption(name, f"must be a mapping (got {_quote(value, secret=secret)})")
    return dict(value)


def name_map(raw: Options, name: str) -> dict[str, tuple[str, ...]]:
    """``{cluster name: a name or a list of names}`` -> ``{cluster name: (names...)}``."""
    given = mapping(raw, name) or {}
    out: dict[str, tuple[str, ...]] = {}
    for key, value in given.items():
        names = (value,) if isinstance(value, str) else value
        if (not isinstance(names, Sequence) or isinstance(names, bytes) or not names
                or not all(isinstance(n, str) and n for n in names)):
            raise InvalidOption(f"{name}[{key!r}]", "must be a name or a list of names")
        out[key] = tuple(names)
    return out


@dataclass(frozen=True, kw_only=True)
class RetrySettings:
    """The retry knobs every adapter takes (option names as the keys); see providers.http."""

    max_attempts: int = 4
    backoff_initial: float = 0.1
    backoff_max: float = 2.0
    retry_after_cap: float = 5.0


#: The retry defaults of every adapter (and of :class:`providers.http.RetryPolicy`).
DEFAULT_RETRY = RetrySettings()

#: The option keys :func:`retry_options` reads.
RETRY_KEYS = ("max_attempts", "backoff_initial", "backoff_max", "retry_after_cap")


def retry_options(raw: Options) -> RetrySettings:
    """``max_attempts`` (>= 1), ``backoff_initial``, ``backoff_max``, ``retry_after_cap`` (>= 0)."""
    d = DEFAULT_RETRY
    return RetrySettings(
        max_attempts=integer(raw, "max_attempts", default=d.max_attempts, minimum=1),
        backoff_initial=duration(raw, "backoff_initial", default=d.backoff_initial, minimum=0),
        backoff_max=duration(raw, "backoff_max", default=d.backoff_max, minimum=0),
        retry_after_cap=duration(raw, "retry_after_cap", default=d.retry_after_cap, minimum=0),
    )

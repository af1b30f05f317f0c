"""Kubernetes ``resource.Quantity`` values ("500m", "1.5Gi", "1e3"), parsed exactly.

Why it exists: cpu, memory and GPU amounts are read from pods (what to ask a cloud for), from
nodes (what fits inside) and from budgets (how many GPUs a policy has out). They must agree to
the last unit, so there is one parser, and it works in ``Decimal``: a float would turn "0.1" into
0.1000000000000000055 and round "100M" of memory differently from the API server.

The grammar is Kubernetes' own: an optional sign, a decimal number ("1", "1.", ".5", "1.5"), then
one suffix: binary SI (Ki, Mi, Gi, Ti, Pi, Ei), decimal SI (n, u, m, "", k, M, G, T, P, E) or a
decimal exponent (e3, E-2). Suffixes are case-sensitive as in Kubernetes: "1M" is 10^6, "1m" is
1/1000, "1E" is 10^18 and "1E3" is 1000.

Two deliberate leniencies, kept from the parser this one replaced: surrounding whitespace is
ignored, and JSON numbers (int, finite float) are accepted besides strings.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal

__all__ = [
    "QuantityError",
    "cpu_millis",
    "memory_bytes",
    "parse_count",
    "parse_quantity",
    "whole_count",
]


class QuantityError(ValueError):
    """A quantity that cannot be parsed or converted; the message names the value and says why."""


_BINARY_SUFFIXES = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_DECIMAL_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)"
)
_MAX_QUANTITY_LEN = 64
_MAX_EXPONENT = 30

#: Arithmetic that never rounds: at most 64 input digits times 2^60 (19 digits) fits in 100.
#: The default context (28 digits) would silently round a long quantity.
_EXACT = Context(prec=100)


def parse_quantity(value: object) -> Decimal:
    """The exact value of a Kubernetes quantity ("500m", "1.5Gi", "1e3", "2", or a JSON number).

    Negative values parse (callers decide whether they make sense). Raises
    :class:`QuantityError` with a message that says what is wrong.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a finite quantity")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a string quantity, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise QuantityError("empty quantity")
    if len(text) > _MAX_QUANTITY_LEN:
        raise QuantityError(f"quantity longer than {_MAX_QUANTITY_LEN} characters")
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityError(
            f"{text!r} is not a quantity (expected a number with an optional suffix: "
            "n, u, m, k, M, G, T, P, E, Ki..Ei or an exponent like e3)"
        )
    number = Decimal(match["number"])
    if match["sign"] == "-" and number:  # copy_negate is exact; "-0" stays plain 0
        number = number.copy_negate()
    suffix = match["suffix"]
    if suffix in _BINARY_SUFFIXES:
        return _EXACT.multiply(number, _BINARY_SUFFIXES[suffix])
    if suffix in _DECIMAL_SUFFIXES:
        return _EXACT.multiply(number, _DECIMAL_SUFFIXES[suffix])
    exponent = int(suffix[1:])
    if abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(f"{text!r}: exponent {exponent} is out of range")
    return _EXACT.scaleb(number, exponent)


def cpu_millis(quantity: Decimal) -> int:
    """CPU cores to millicores, rounded up (as Kubernetes does: "0.0001" is 1m)."""
    return math.ceil(_EXACT.multiply(quantity, Decimal(1000)))


def memory_bytes(quantity: Decimal) -> int:
    """Memory to whole bytes, rounded up."""
    return math.ceil(quantity)


def whole_count(quantity: Decimal) -> int:
    """A parsed quantity as a count of devices: an extended resource such as ``nvidia.com/gpu``.

    Kubernetes only accepts whole, non-negative amounts of extended resources, in any notation:
    ``1``, ``1000m`` and ``1e0`` are all one GPU. Anything else raises :class:`QuantityError`
    naming the value.
    """
    return _count(quantity, shown=_show(quantity))


def parse_count(value: object) -> int:
    """:func:`parse_quantity` then :func:`whole_count`; an error names ``value`` as written.

    ``parse_count("1000m") == 1``; ``parse_count("1.5")`` and ``parse_count("500m")`` raise.
    """
    return _count(parse_quantity(value), shown=repr(value))


def _count(quantity: Decimal, *, shown: str) -> int:
    if not quantity.is_finite() or quantity != quantity.to_integral_value():
        raise QuantityError(
            f"{shown} is not a whole number (extended resources such as nvidia.com/gpu are "
            "counted in whole devices)"
        )
    if quantity < 0:
        raise QuantityError(f"{shown} is negative (a count cannot be)")
    return int(quantity)


def _show(quantity: Decimal) -> str:
    return repr(format(quantity, "f") if quantity.is_finite() else str(quantity))

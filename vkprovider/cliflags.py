"""Flag value types for the command line: each refusal is one line naming the flag and why.

Why it exists apart from :mod:`vkprovider.cli`: every command shares these (a log level, a port,
seconds, a count), and argparse turns their ``ArgumentTypeError`` into
``vkprovider run: error: argument --flag: <why>`` with exit status 2 through :class:`Parser`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from vkprovider.errors import one_line
from vkprovider.semantics.selectors import label_problem

__all__ = [
    "LOG_LEVELS",
    "Parser",
    "any_integer",
    "count",
    "finite_number",
    "integer",
    "log_level",
    "non_negative_seconds",
    "port_type",
    "positive_count",
    "positive_number",
    "positive_seconds",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")



def log_level(value: str) -> str:
    level = value.strip().upper()
    if level == "WARN":
        level = "WARNING"
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a log level ({', '.join(x.lower() for x in LOG_LEVELS)})")
    return level


def label_pair(value: str) -> tuple[str, str]:
    """``KEY=VALUE``, a valid Kubernetes label."""
    key, sep, val = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE")
    problem = label_problem(key=key, value=val)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return key, val


def finite_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number")
    return number


def positive_number(value: str) -> float:
    number = finite_number(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return number


def positive_seconds(value: str) -> float:
    number = finite_number(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of seconds")
    return number


def non_negative_seconds(value: str) -> float:
    number = finite_number(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (seconds, >= 0)")
    return number


def integer(value: str, *, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
    return number


def any_integer(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None


def count(value: str) -> int:
    return integer(value, minimum=0)


def positive_count(value: str) -> int:
    return integer(value, minimum=1)


def port_type(*, allow_zero: bool) -> Callable[[str], int]:
    low = 0 if allow_zero else 1

    def port(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
        if not low <= number <= 65535:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({low}-65535)")
        return number

    return port


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``vkprovider run: error: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")

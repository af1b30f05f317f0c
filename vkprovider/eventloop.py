"""Which event loop a vkprovider process runs on, and running its main coroutine there.

Why this exists: on a 2-core node the provider's CPU per pod is what limits a burst, and most of
that CPU is event-loop work (selecting, scheduling callbacks, socket reads and writes, TLS).
uvloop does the same work in C on libuv; ``bench/burst.py`` measures the difference side by side
(``--event-loop``). It is optional: where uvloop is not installed (Windows, a trimmed image) the
standard loop runs and nothing else changes. ``asyncio`` forces the standard loop (for a debugger,
or to rule the loop out when chasing a bug); ``uvloop`` refuses to start without it.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from vkprovider.errors import ConfigError

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
CHOICES: tuple[EventLoopChoice, ...] = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


def loop_factory(choice: EventLoopChoice, *,
                 named: str = "event_loop") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for ``choice``; None means the standard asyncio loop."""
    if choice not in CHOICES:
        raise ConfigError(f"{named}: {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(f"{named}: uvloop is not installed (pip install uvloop), "
                              f"or choose auto or asyncio") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: what the running loop is, for the start-up log line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], *, choice: EventLoopChoice,
        named: str = "event_loop") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names (a bad choice closes ``main``)."""
    try:
        factory = loop_factory(choice, named=named)
    except ConfigError:
        main.close()  # never awaited: say nothing about it
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

"""The event loop choice: uvloop when installed and asked for, the standard loop otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest

from vkprovider import eventloop
from vkprovider.config import Settings, load_model
from vkprovider.errors import ConfigError


async def _running_loop_name() -> str:
    return eventloop.loop_name(asyncio.get_running_loop())


def test_auto_runs_on_uvloop_when_installed() -> None:
    # uvloop is a dependency on Linux: auto must pick it up, not fall back silently
    assert eventloop.run(_running_loop_name(), choice="auto") == "uvloop"


def test_asyncio_forces_the_standard_loop() -> None:
    assert eventloop.loop_factory("asyncio") is None
    assert eventloop.run(_running_loop_name(), choice="asyncio") == "asyncio"


def test_uvloop_choice_runs_on_uvloop() -> None:
    assert eventloop.run(_running_loop_name(), choice="uvloop") == "uvloop"


def test_missing_uvloop_auto_falls_back_and_uvloop_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert eventloop.loop_factory("auto") is None
    assert eventloop.run(_running_loop_name(), choice="auto") == "asyncio"
    coro = _running_loop_name()
    with pytest.raises(ConfigError, match=r"^--event-loop: uvloop is not installed"):
        eventloop.run(coro, choice="uvloop", named="--event-loop")
    assert coro.cr_frame is None  # closed, never left to warn "never awaited"


def test_unknown_choice_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"event_loop: 'libev' is not one of auto, uvloop"):
        eventloop.loop_factory("libev")  # type: ignore[arg-type]


def test_settings_default_and_refusal() -> None:
    assert Settings().event_loop == "auto"
    with pytest.raises(ConfigError, match=r"event_loop"):
        load_model(Settings, None, overrides={"event_loop": "libev"})

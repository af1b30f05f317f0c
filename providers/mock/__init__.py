"""The mock GPU cloud and its adapter.

Why it exists: the service and its users need a GPU cloud they can run anywhere, script and
inspect: :mod:`providers.mock.server` is that cloud (an in-memory FastAPI app with a ledger and
admin endpoints) and :mod:`providers.mock.client` is the :class:`~providers.base.Provider` that
talks to it, the reference for every real adapter; :mod:`providers.mock.scenario` writes down a
fault profile (YAML) so a flaky cloud is reviewable and repeatable.

The names below are loaded on first use: a provider process that only talks to a mock cloud
imports :mod:`providers.mock.client` and must not carry the cloud's own server, state, edge and
protocol stacks (about 4 MiB of resident memory, measured with ``bench/steady.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.mock.client import MockProvider
    from providers.mock.scenario import Faults, Scenario, ScenarioError, load_scenario
    from providers.mock.server import (
        DEFAULT_INVENTORY,
        InventoryOffer,
        ManualClock,
        MockCloudError,
        MockCloudState,
        create_app,
        serve,
    )

#: where each public name lives
_HOMES = {
    "MockProvider": "providers.mock.client",
    **dict.fromkeys(("Faults", "Scenario", "ScenarioError", "load_scenario"),
                    "providers.mock.scenario"),
    **dict.fromkeys(("DEFAULT_INVENTORY", "InventoryOffer", "ManualClock", "MockCloudError",
                     "MockCloudState", "create_app", "serve"), "providers.mock.server"),
}

__all__ = [
    "DEFAULT_INVENTORY",
    "Faults",
    "InventoryOffer",
    "ManualClock",
    "MockCloudError",
    "MockCloudState",
    "MockProvider",
    "Scenario",
    "ScenarioError",
    "create_app",
    "load_scenario",
    "serve",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups are plain module attributes
    return value

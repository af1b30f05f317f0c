"""The mock GPU cloud and its adapter.

Why it exists: the service and its users need a GPU cloud they can run anywhere, script and
inspect: :mod:`providers.mock.server` is that cloud (an in-memory FastAPI app with a ledger and
admin endpoints) and :mod:`providers.mock.client` is the :class:`~providers.base.Provider` that
talks to it, the reference for every real adapter; :mod:`providers.mock.scenario` writes down a
fault profile (YAML) so a flaky cloud is reviewable and repeatable.
"""

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

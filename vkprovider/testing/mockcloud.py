"""The ``mock_cloud`` pytest fixture: a mock GPU cloud on a loopback port, inside the test.

Why it exists: platform teams test their own code (policies, dashboards, alert rules, retry
wrappers) against the mock cloud, and that test should need one fixture, not a subprocess, a
port hunt and a teardown. The cloud runs in the test's own event loop (uvicorn on a socket we
bind to port 0, so there is no race for the port), over real HTTP, so anything that can talk to
a URL can use it; and the test holds the :class:`~providers.mock.server.MockCloudState` itself,
so it can read the ledger, arm faults or change the inventory without going through HTTP.
Running containers' ports are served for real on loopback (``mock_cloud.listeners()``,
``mock_cloud.traffic()``); pass ``address_map_dir`` to publish their routes for an address map.
Every listener is closed when the block ends.

Use it with ``pytest_plugins = ["vkprovider.testing.plugin"]``::

    @pytest.mark.mock_cloud_scenario("mixed")          # a built-in, a path, a dict or a Scenario
    async def test_my_retry_wrapper(mock_cloud: MockCloud) -> None:
        ...  # point your code at mock_cloud.url
        assert all(e["state"] == "deleted" for e in mock_cloud.ledger()["instances"])

The marker's keyword arguments go to :class:`MockCloudState` (``api_key``, ``boot_delay``, ...).
Indirect parametrization works too: ``@pytest.mark.parametrize("mock_cloud", ["flaky",
"duplicate-trap"], indirect=True)``. A scenario named without ``/`` or ``.yaml`` is one of
``providers/mock/scenarios/``; a relative path is looked up next to the test file first.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import uvicorn

import providers.mock
from providers.mock import MockProvider
from providers.mock.scenario import Faults, Scenario, load_scenario, parse_scenario
from providers.mock.server import MockCloudState, create_app

__all__ = [
    "BUILTIN_SCENARIOS",
    "MARKER",
    "MockCloud",
    "mock_cloud",
    "pytest_configure",
    "resolve_scenario",
    "start_mock_cloud",
]

#: The marker that picks a scenario (and MockCloudState keyword arguments) for ``mock_cloud``.
MARKER = "mock_cloud_scenario"
#: Where the shipped scenarios live (``flaky``, ``capacity-crunch``, ``duplicate-trap``, ...).
BUILTIN_SCENARIOS = Path(providers.mock.__file__).resolve().parent / "scenarios"


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield  # pytest owns SIGINT; uvicorn must not take it over


class MockCloud:
    """A running mock cloud: ``url`` to talk to, ``state`` to inspect and steer."""

    def __init__(self, *, state: MockCloudState, url: str) -> None:
        self.state = state
        self.url = url
        self._providers: list[MockProvider] = []

    def __repr__(self) -> str:
        return f"MockCloud(url={self.url!r}, state={self.state!r})"

    def ledger(self) -> dict[str, Any]:
        """``{create_calls, total_cost, instances: [...]}``: every instance ever created."""
        return self.state.ledger()

    def stats(self) -> dict[str, int]:
        return self.state.stats()

    def listeners(self) -> list[dict[str, Any]]:
        """The containers' real listeners open now (what ``GET /admin/listeners`` answers)."""
        return self.state.listener_json()

    def traffic(self) -> dict[str, dict[str, Any]]:
        """Requests the listeners served, by instance (what ``GET /admin/traffic`` answers)."""
        return self.state.traffic()

    def set_faults(self, faults: Faults | Mapping[str, Any] | None = None, /,
                   **fields: Any) -> None:
        """Replace the fault profile: a :class:`Faults`, its dict form, or keyword fields
        (``mock_cloud.set_faults(list_lag_seconds=5)``); nothing means no faults."""
        if faults is None:
            faults = fields
        elif fields:
            raise TypeError("pass a fault profile or keyword fields, not both")
        self.state.set_faults(faults)

    def apply_scenario(self, scenario: str | Path | Scenario | Mapping[str, Any]) -> None:
        """Apply a whole scenario (inventory, delays, seed, faults) while running."""
        self.state.apply_scenario(resolve_scenario(scenario))

    def provider(self, *, owner: str = "vk-test", **kwargs: Any) -> MockProvider:
        """A :class:`MockProvider` for this cloud (closed when the test ends)."""
        kwargs.setdefault("name", "mock")
        provider = MockProvider(base_url=self.url, owner=owner, **kwargs)
        self._providers.append(provider)
        return provider

    async def aclose_providers(self) -> None:
        for provider in self._providers:
            await provider.aclose()
        self._providers.clear()


def resolve_scenario(scenario: str | Path | Scenario | Mapping[str, Any], *,
                     base_dir: Path | None = None) -> Scenario:
    """A :class:`Scenario` from a built-in name, a path (relative to ``base_dir`` first), a
    dict or a Scenario."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Mapping):
        return parse_scenario(dict(scenario))
    text = str(scenario)
    if "/" not in text and not text.endswith((".yaml", ".yml")):
        return load_scenario(BUILTIN_SCENARIOS / f"{text}.yaml")
    path = Path(text)
    if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
        path = base_dir / path
    return load_scenario(path)


@contextlib.asynccontextmanager
async def start_mock_cloud(*, scenario: Scenario | None = None, host: str = "127.0.0.1",
                           **state_kwargs: Any) -> AsyncIterator[MockCloud]:
    """Serve a fresh mock cloud in this event loop until the block ends, with its containers'
    listeners (closed, with their routes, when it ends)."""
    state = MockCloudState(scenario=scenario, **state_kwargs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(256)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(state=state), lifespan="off", log_level="warning",
                            access_log=False, log_config=None, timeout_graceful_shutdown=1)
    server = _QuietServer(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    cloud = MockCloud(state=state, url=f"http://{host}:{port}")
    try:
        while not server.started:
            if task.done():
                task.result()  # raises why it could not start
                raise RuntimeError("the mock cloud stopped before it started")
            await asyncio.sleep(0.005)
        state.start_listeners()
        yield cloud
    finally:
        await state.aclose_listeners()
        await cloud.aclose_providers()
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=5)
        except (TimeoutError, asyncio.CancelledError):
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        sock.close()


@pytest_asyncio.fixture
async def mock_cloud(request: pytest.FixtureRequest) -> AsyncIterator[MockCloud]:
    """A mock cloud for one test: ``.url``, ``.state``, ``.ledger()``, ``.set_faults(...)``."""
    raw: Any = getattr(request, "param", None)
    state_kwargs: dict[str, Any] = {}
    marker = request.node.get_closest_marker(MARKER)
    if marker is not None:
        if raw is None and marker.args:
            raw = marker.args[0]
        state_kwargs.update(marker.kwargs)
    scenario = None
    if raw is not None:
        scenario = resolve_scenario(raw, base_dir=Path(str(request.node.path)).parent)
    async with start_mock_cloud(scenario=scenario, **state_kwargs) as cloud:
        yield cloud


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(scenario, **state_kwargs): the scenario (built-in name, path, dict or "
        "Scenario) and MockCloudState arguments of the mock_cloud fixture",
    )

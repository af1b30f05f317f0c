"""What a provider process loads to talk to a mock cloud: the adapter, not the cloud.

Why: ``providers/mock/__init__.py`` used to import the mock cloud's server, state, edge and
protocol stacks (FastAPI app, HTTP/2, WebSocket) for anyone importing its adapter, about 4 MiB of
resident memory in every provider configured with a mock cloud (``bench/steady.py`` runs one).
Checked in a fresh interpreter, where ``sys.modules`` is the process's own.
"""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
import providers.mock.client
from vkprovider.registry import build_adapter
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("providers.mock", "wsproto")))))
"""


def _loaded(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_mock_adapter_comes_without_the_mock_cloud() -> None:
    assert _loaded(_PROBE) == ["providers.mock", "providers.mock.client"]


def test_the_package_names_still_load_on_first_use() -> None:
    loaded = _loaded(_PROBE.replace(
        "import providers.mock.client",
        "from providers.mock import MockCloudState, MockProvider, Scenario, create_app"))
    assert {"providers.mock.server", "providers.mock.scenario", "providers.mock.client"} <= \
        set(loaded)
    done = subprocess.run([sys.executable, "-c", "import providers.mock as m; m.Nope"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "has no attribute 'Nope'" in done.stderr

"""What a provider process loads that it never uses: the mock cloud, the HTTP/2 client stack.

Why: ``providers/mock/__init__.py`` used to import the mock cloud's server, state, edge and
protocol stacks (FastAPI app, HTTP/2, WebSocket) for anyone importing its adapter, about 4 MiB of
resident memory in every provider configured with a mock cloud (``bench/steady.py`` runs one).
And httpcore imports ``h2`` whenever it is installed (~1.4 MiB); the provider and the
companion load it without (``vkprovider.memtune.without_http2_client``). Checked in a fresh
interpreter, where ``sys.modules`` is the process's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def _imported_by(tmp_path: Path, *argv: str) -> set[str]:
    """The modules ``vkprovider ARGV`` imports before it exits on a missing kubeconfig (exit 2,
    after its start-up has loaded the API client), from ``-X importtime``."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "vkprovider", *argv],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=tmp_path)
    assert done.returncode == 2 and "no such file" in done.stderr, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:")}


def test_the_provider_and_the_companion_load_httpcore_without_h2(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "kubeconfig")
    config = tmp_path / "provider.yaml"
    config.write_text(f"kubeconfig: {missing}\n")
    for argv in (("run", "--config", str(config)), ("descheduler", "--kubeconfig", missing)):
        modules = _imported_by(tmp_path, *argv)
        assert "httpcore" in modules, argv  # what the check is about was loaded
        assert not {"h2", "hpack", "hyperframe"} & modules, (argv, sorted(
            m for m in modules if m.startswith(("h2", "hpack", "hyperframe"))))


def test_without_http2_client_leaves_h2_importable() -> None:
    loaded = _loaded("""
import json, sys
from vkprovider.memtune import without_http2_client
first, again = without_http2_client(), without_http2_client()
before = "h2" in sys.modules
import h2.connection
print(json.dumps([str(first), str(again), str(before), str("h2" in sys.modules)]))
""")
    assert loaded == ["True", "False", "False", "True"]

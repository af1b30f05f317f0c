"""The ``vkprovider`` command against the real local control plane.

What the unit tests of the CLI cannot show without a cluster: the companion started from a
settings file reaches a real API server and runs until SIGTERM (exit 0), and credentials the API
server rejects end both commands at start with one line on stderr and exit status 2.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vkprovider.testing.cluster import LocalCluster

pytestmark = pytest.mark.cluster


def _spawn(args: list[str], *, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "vkprovider", *args],
                                stdout=subprocess.DEVNULL, stderr=out)


def _wait_for_text(path: Path, text: str, *, proc: subprocess.Popen[bytes],
                   timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not logged; exit {proc.poll()}:\n{path.read_text()}")


def test_companion_from_a_settings_file_runs_until_sigterm(
        local_cluster: LocalCluster, companion_kubeconfig: Path, crds: list[str],
        tmp_path: Path) -> None:
    config = tmp_path / "companion.yaml"
    config.write_text(yaml.safe_dump({
        "kubeconfig": str(companion_kubeconfig), "node_name": "vk-cli-e2e",
        "interval_seconds": 0.5, "move_back_interval_seconds": 1,
        "api_server_timeout_seconds": 20,
    }))
    log = tmp_path / "companion.log"
    proc = _spawn(["descheduler", "--config", str(config), "--log-format", "json"], log=log)
    try:
        _wait_for_text(log, '"msg":"companion starting"', proc=proc)
        assert "vk-cli-e2e" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("command", ["run", "descheduler"])
def test_rejected_credentials_are_one_line_and_exit_2(command: str, local_cluster: LocalCluster,
                                                      tmp_path: Path) -> None:
    kubeconfig = tmp_path / "bad-token.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": local_cluster.server,
            "certificate-authority": str(local_cluster.ca_path)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "not-a-valid-token-0123456789"}}],
    }))
    args = [command, "--kubeconfig", str(kubeconfig), "--api-server-timeout", "20"]
    if command == "run":
        config = tmp_path / "vk.yaml"
        config.write_text(yaml.safe_dump({"node": {"name": "vk-cli-e2e"}}))
        args += ["--config", str(config)]
    done = subprocess.run([sys.executable, "-m", "vkprovider", *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "rejected the credentials (401 Unauthorized)" in lines[0]
    assert str(kubeconfig) in lines[0]
    assert "not-a-valid-token" not in done.stderr

"""The ``vkprovider`` command against the real local control plane.

What the unit tests of the CLI cannot show without a cluster: the companion started from a
settings file reaches a real API server and runs until SIGTERM (exit 0), and credentials the API
server rejects end both commands at start with one line on stderr and exit status 2, and
``dev curl`` says in one line when the Service does not exist or RBAC refuses it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import service_account_kubeconfig

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


def _dev_curl(target: str, *, kubeconfig: Path, address_map: Path
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vkprovider", "dev", "curl", target,
                           "--kubeconfig", str(kubeconfig), "--address-map", str(address_map)],
                          capture_output=True, text=True, timeout=60, check=False)


async def test_dev_curl_names_a_missing_service_and_a_refusal_in_one_line(
        local_cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path) -> None:
    """A mistyped Service (404) and credentials RBAC refuses (403): one line each, exit 1,
    no traceback (it used to be the API error's traceback)."""
    address_map = tmp_path / "addressmap"
    address_map.mkdir()
    done = _dev_curl(f"{namespace}/no-such-service/", kubeconfig=local_cluster.kubeconfig,
                     address_map=address_map)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"no Service no-such-service in namespace {namespace}" in lines[0], lines[0]

    # a ServiceAccount with no RoleBinding: the API server answers 403
    await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}})
    nobody = await service_account_kubeconfig(kube=kube, cluster=local_cluster,
                                              namespace=namespace, name="nobody",
                                              path=tmp_path / "nobody.kubeconfig")
    done = _dev_curl(f"{namespace}/web/", kubeconfig=nobody, address_map=address_map)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "403 Forbidden" in lines[0] and f"{namespace}/web" in lines[0], lines[0]

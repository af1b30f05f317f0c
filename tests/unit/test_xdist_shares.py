"""What the pytest-xdist workers of one run share, each takes its own part of, so two tests side
by side never pick alike (vkprovider.testing.workers, cluster.free_port, the harness's mock
clouds); and a test beside others cannot act on the whole cluster (harness.SIDE_BY_SIDE_VAR)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vkprovider.config import Settings
from vkprovider.testing import cluster, workers
from vkprovider.testing.harness import (
    SIDE_BY_SIDE_VAR,
    TEST_POLICY_LABEL,
    CompanionProcess,
    MockCloudProcess,
    ProviderProcess,
    SideBySideError,
    policy_label_for,
)


def _as_worker(monkeypatch: pytest.MonkeyPatch, index: int | None, count: int = 2) -> None:
    if index is None:
        monkeypatch.delenv(workers.WORKER_VAR, raising=False)
        monkeypatch.delenv(workers.COUNT_VAR, raising=False)
    else:
        monkeypatch.setenv(workers.WORKER_VAR, f"gw{index}")
        monkeypatch.setenv(workers.COUNT_VAR, str(count))


def test_outside_xdist_one_process_has_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_worker(monkeypatch, None)
    assert (workers.index(), workers.count()) == (0, 1)
    assert workers.port_range(low=20000, high=32000) == (20000, 32000)
    assert workers.public_block(15, blocks=16) == 15
    assert workers.tag("cloud0") == "cloud0"


def test_two_workers_get_disjoint_port_slices_and_address_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list[object]] = {"ports": [], "blocks": [], "tags": []}
    for index in (0, 1):
        _as_worker(monkeypatch, index)
        low, high = workers.port_range(low=20000, high=32000)
        seen["ports"].append(set(range(low, high)))
        seen["blocks"].append({workers.public_block(b, blocks=16) for b in range(8)})
        seen["tags"].append(workers.tag("cloud0"))
    ports0, ports1 = seen["ports"]
    assert isinstance(ports0, set) and isinstance(ports1, set)
    assert not ports0 & ports1 and len(ports0) == len(ports1) == 6000
    blocks0, blocks1 = seen["blocks"]
    assert isinstance(blocks0, set) and isinstance(blocks1, set)
    assert not blocks0 & blocks1 and blocks0 | blocks1 == set(range(16))
    assert seen["tags"] == ["cloud0-gw0", "cloud0-gw1"]


def test_a_block_past_the_workers_share_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_worker(monkeypatch, 1)
    with pytest.raises(workers.WorkerShareError, match="outside a worker's share"):
        workers.public_block(8, blocks=16)


def test_free_port_picks_from_this_workers_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_worker(monkeypatch, 1)
    high = min(cluster._ephemeral_start(), 65536)
    low, top = workers.port_range(low=max(1024, high - 12000), high=high)
    picked = [cluster.free_port() for _ in range(20)]
    assert all(low <= p < top for p in picked), (low, top, picked)


def test_a_mock_cloud_of_worker_one_publishes_under_its_own_name_and_block(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _as_worker(monkeypatch, 1)
    cloud = MockCloudProcess(work_dir=tmp_path, name="cloud0", address_map_dir=tmp_path / "net",
                             public_block=2)
    argv = cloud.component.argv
    assert argv[argv.index("--name") + 1] == "cloud0-gw1"
    assert argv[argv.index("--public-block") + 1] == "10"
    assert cloud.name == "cloud0"  # what the provider's config and the tests call it


def test_a_test_beside_others_may_not_start_a_companion(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(SIDE_BY_SIDE_VAR, "tests/e2e/test_x.py::test_y")
    companion = CompanionProcess(work_dir=tmp_path, kubeconfig=tmp_path / "kc", node_name="vk-x")
    with pytest.raises(SideBySideError, match=r"test_x.py::test_y starts a companion"):
        companion.start()
    assert companion.component.process is None


def test_a_provider_beside_others_ignores_gpuproviders_unless_its_test_configures_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def gpu_providers(**kwargs: Any) -> object:
        proc = ProviderProcess(work_dir=tmp_path, kubeconfig=tmp_path / "kc", node_name="vk-x",
                               clouds=[], **kwargs)
        return yaml.safe_load(proc.config_path.read_text()).get("gpu_providers")

    monkeypatch.delenv(SIDE_BY_SIDE_VAR, raising=False)
    assert gpu_providers() is None  # the product's default: every GPUProvider is served
    monkeypatch.setenv(SIDE_BY_SIDE_VAR, "tests/e2e/test_x.py::test_y")
    assert gpu_providers() == {"enabled": False}
    asked = {"secret_refresh_seconds": 1}
    assert gpu_providers(extra={"gpu_providers": asked}) == asked


def test_a_provider_beside_others_is_governed_only_by_policies_its_test_labels(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def policy_labels(**kwargs: Any) -> object:
        proc = ProviderProcess(work_dir=tmp_path, kubeconfig=tmp_path / "kc", node_name="vk-x",
                               clouds=[], **kwargs)
        return yaml.safe_load(proc.config_path.read_text())["pods"].get("policy_labels")

    monkeypatch.delenv(SIDE_BY_SIDE_VAR, raising=False)
    assert policy_labels() is None  # every policy, the product's default
    monkeypatch.setenv(SIDE_BY_SIDE_VAR, "tests/e2e/test_x.py::test_y")
    own = policy_labels()
    assert own == {TEST_POLICY_LABEL: policy_label_for("tests/e2e/test_x.py::test_y")}
    monkeypatch.setenv(SIDE_BY_SIDE_VAR, "tests/e2e/test_x.py::test_z")
    assert policy_labels() != own  # another test's policies are not this one's
    assert Settings.model_validate({"pods": {"policy_labels": own}}).pods.policy_labels == own
    assert policy_labels(pods={"policy_labels": {"team": "a"}}) == {"team": "a"}

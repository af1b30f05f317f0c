"""Unit tests for vkprovider.node.virtualnode's pure rules: status body, labels, taint union."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vkprovider.config import NodeSettings
from vkprovider.node.lease import format_micro_time
from vkprovider.node.nodebody import (
    TAINT_KEY,
    NodeCapacity,
    build_status,
    merge_taints,
    metadata_patch,
    node_labels,
    our_taints,
    status_key,
)
from vkprovider.node.virtualnode import VirtualNode
from vkprovider.semantics.gpus import GPU_RESOURCE

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=1)
SETTINGS = NodeSettings(
    name="vk-test",
    internal_ip="10.0.0.7",
    kubelet_port=10443,
    cpu="96",
    memory="1Ti",
    pods=250,
    labels={"team": "ml"},
)
OURS = {"key": "virtual-kubelet.io/provider", "value": "vkprovider", "effect": "NoSchedule"}


def conditions_by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


# ---- build_status -------------------------------------------------------------------------------


def test_status_reports_gpus_from_capacity_and_the_rest_from_settings() -> None:
    status = build_status(
        settings=SETTINGS, capacity=NodeCapacity(gpus=12), version="v1.2.3", now=T0
    )
    expected = {"cpu": "96", "memory": "1Ti", "pods": "250", GPU_RESOURCE: "12"}
    assert status["capacity"] == expected
    assert status["allocatable"] == expected
    assert status["capacity"] is not status["allocatable"]


def test_status_reports_zero_gpus_before_the_first_capacity_read() -> None:
    status = build_status(settings=SETTINGS, capacity=None, version="v1", now=T0)
    assert status["capacity"][GPU_RESOURCE] == "0"
    assert status["allocatable"][GPU_RESOURCE] == "0"


def test_negative_capacity_is_clamped_to_zero() -> None:
    status = build_status(settings=SETTINGS, capacity=NodeCapacity(gpus=-3), version="v1", now=T0)
    assert status["allocatable"][GPU_RESOURCE] == "0"


def test_status_has_ready_and_no_pressure_conditions() -> None:
    status = build_status(settings=SETTINGS, capacity=NodeCapacity(gpus=1), version="v1", now=T0)
    conds = conditions_by_type(status)
    assert set(conds) == {
        "Ready",
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "NetworkUnavailable",
    }
    assert conds["Ready"]["status"] == "True"
    assert conds["Ready"]["reason"] == "KubeletReady"
    for name in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"):
        assert conds[name]["status"] == "False"
    for cond in conds.values():
        assert cond["lastHeartbeatTime"] == "2026-01-01T12:00:00Z"
        assert cond["lastTransitionTime"] == "2026-01-01T12:00:00Z"
        assert cond["reason"] and cond["message"]


def test_status_addresses_endpoint_and_node_info() -> None:
    status = build_status(settings=SETTINGS, capacity=None, version="v0.4.0", now=T0)
    assert status["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.7"},
        {"type": "Hostname", "address": "vk-test"},
    ]
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10443}}
    info = status["nodeInfo"]
    assert info["kubeletVersion"] == "v0.4.0"
    assert info["containerRuntimeVersion"] == "vkprovider://v0.4.0"
    assert info["operatingSystem"] == "linux"
    assert info["architecture"] == "amd64"
    others = {
        k: v
        for k, v in info.items()
        if k not in {"kubeletVersion", "containerRuntimeVersion", "operatingSystem", "architecture"}
    }
    assert others and set(others.values()) == {""}


def test_transition_time_is_kept_while_the_status_does_not_change() -> None:
    first = build_status(settings=SETTINGS, capacity=None, version="v1", now=T0)
    second = build_status(
        settings=SETTINGS,
        capacity=None,
        version="v1",
        now=T1,
        previous_conditions=first["conditions"],
    )
    for cond in second["conditions"]:
        assert cond["lastTransitionTime"] == "2026-01-01T12:00:00Z", cond["type"]
        assert cond["lastHeartbeatTime"] == "2026-01-01T12:01:00Z", cond["type"]


def test_transition_time_moves_when_the_status_changed() -> None:
    # The node-lifecycle controller set Ready=Unknown while we were silent.
    previous = [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2025-12-31T00:00:00Z"},
        {"type": "DiskPressure", "status": "False", "lastTransitionTime": "2025-12-30T00:00:00Z"},
        {"type": "MemoryPressure", "status": "False"},  # no transition time recorded
    ]
    status = build_status(
        settings=SETTINGS, capacity=None, version="v1", now=T1, previous_conditions=previous
    )
    conds = conditions_by_type(status)
    assert conds["Ready"]["lastTransitionTime"] == "2026-01-01T12:01:00Z"
    assert conds["DiskPressure"]["lastTransitionTime"] == "2025-12-30T00:00:00Z"
    assert conds["MemoryPressure"]["lastTransitionTime"] == "2026-01-01T12:01:00Z"
    assert conds["PIDPressure"]["lastTransitionTime"] == "2026-01-01T12:01:00Z"


def test_status_key_ignores_times_but_not_capacity() -> None:
    a = build_status(settings=SETTINGS, capacity=NodeCapacity(gpus=4), version="v1", now=T0)
    b = build_status(settings=SETTINGS, capacity=NodeCapacity(gpus=4), version="v1", now=T1)
    c = build_status(settings=SETTINGS, capacity=NodeCapacity(gpus=5), version="v1", now=T0)
    assert a != b
    assert status_key(a) == status_key(b)
    assert status_key(a) != status_key(c)
    assert "lastHeartbeatTime" in a["conditions"][0]  # the key is a copy


# ---- labels and taints --------------------------------------------------------------------------


def test_labels_defaults_and_settings() -> None:
    labels = node_labels(SETTINGS)
    assert labels == {
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": "vk-test",
        "team": "ml",
    }


def test_our_taint_follows_the_setting() -> None:
    assert our_taints(SETTINGS) == [OURS]
    assert our_taints(SETTINGS.model_copy(update={"taint": False})) == []


def test_merge_taints_keeps_others_and_adds_ours() -> None:
    others = [
        {
            "key": "node.kubernetes.io/not-ready",
            "effect": "NoSchedule",
            "timeAdded": "2026-01-01T00:00:00Z",
        },
        {"key": "example.com/dedicated", "value": "x", "effect": "NoExecute"},
    ]
    merged = merge_taints(others, [OURS])
    assert merged == [*others, OURS]


def test_merge_taints_is_idempotent_and_updates_our_value_in_place() -> None:
    existing = [
        {"key": TAINT_KEY, "value": "old", "effect": "NoSchedule"},
        {"key": "a", "effect": "NoSchedule"},
    ]
    merged = merge_taints(existing, [OURS])
    assert merged == [OURS, {"key": "a", "effect": "NoSchedule"}]
    assert merge_taints(merged, [OURS]) == merged


def test_merge_taints_same_key_other_effect_is_a_different_taint() -> None:
    theirs = {"key": TAINT_KEY, "value": "vkprovider", "effect": "NoExecute"}
    assert merge_taints([theirs], [OURS]) == [theirs, OURS]


def test_merge_taints_removes_only_what_is_asked() -> None:
    existing = [OURS, {"key": "a", "effect": "NoSchedule"}]
    assert merge_taints(existing, [], remove=[{"key": TAINT_KEY, "effect": "NoSchedule"}]) == [
        {"key": "a", "effect": "NoSchedule"}
    ]


def test_metadata_patch_is_none_when_the_node_is_already_right() -> None:
    node = {
        "metadata": {"resourceVersion": "7", "labels": {**node_labels(SETTINGS), "x": "y"}},
        "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}, OURS]},
    }
    assert metadata_patch(node, SETTINGS) is None


def test_metadata_patch_adds_missing_labels_and_taint_with_a_precondition() -> None:
    other = {"key": "other", "value": "v", "effect": "NoSchedule"}
    node = {
        "metadata": {"resourceVersion": "42", "labels": {"type": "virtual-kubelet", "x": "y"}},
        "spec": {"taints": [other]},
    }
    patch = metadata_patch(node, SETTINGS)
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "42"
    assert "type" not in patch["metadata"]["labels"]  # already right: not sent
    assert "x" not in patch["metadata"]["labels"]  # never touched
    assert patch["metadata"]["labels"]["team"] == "ml"
    assert patch["spec"]["taints"] == [other, OURS]


def test_metadata_patch_leaves_taints_alone_when_only_labels_differ() -> None:
    node = {"metadata": {"resourceVersion": "1", "labels": {}}, "spec": {"taints": [OURS]}}
    patch = metadata_patch(node, SETTINGS)
    assert patch is not None
    assert "spec" not in patch


def test_metadata_patch_removes_our_taint_when_disabled() -> None:
    other = {"key": "other", "effect": "NoSchedule"}
    settings = SETTINGS.model_copy(update={"taint": False})
    node = {
        "metadata": {"resourceVersion": "3", "labels": node_labels(settings)},
        "spec": {"taints": [OURS, other]},
    }
    patch = metadata_patch(node, settings)
    assert patch == {"metadata": {"resourceVersion": "3"}, "spec": {"taints": [other]}}


# ---- capacity reads (no cluster: the client is never used) --------------------------------------


async def test_capacity_failure_keeps_the_last_known_figure() -> None:
    answers: list[NodeCapacity | Exception] = [
        RuntimeError("cloud down"),
        NodeCapacity(gpus=8, gpu_products=("H100",)),
        RuntimeError("cloud down again"),
        NodeCapacity(gpus=8, gpu_products=("H100",)),
        NodeCapacity(gpus=3),
    ]

    async def capacity() -> NodeCapacity:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    node = VirtualNode(
        client=None,  # type: ignore[arg-type]
        settings=SETTINGS,
        capacity=capacity,
        version="v1",
    )
    assert await node.refresh_capacity() is False
    assert node.capacity is None  # never made up
    assert await node.refresh_capacity() is True
    assert node.capacity == NodeCapacity(gpus=8, gpu_products=("H100",))
    assert await node.refresh_capacity() is False
    assert node.capacity == NodeCapacity(gpus=8, gpu_products=("H100",))
    assert await node.refresh_capacity() is False  # same answer: no change
    assert await node.refresh_capacity() is True
    assert node.capacity == NodeCapacity(gpus=3)


async def test_capacity_read_that_hangs_times_out_and_keeps_the_figure() -> None:
    async def capacity() -> NodeCapacity:
        await asyncio.sleep(30)
        return NodeCapacity(gpus=1)

    node = VirtualNode(
        client=None,  # type: ignore[arg-type]
        settings=SETTINGS,
        capacity=capacity,
        version="v1",
        capacity_timeout_seconds=0.05,
    )
    assert await node.refresh_capacity() is False
    assert node.capacity is None


def test_micro_time_format() -> None:
    moment = datetime(2026, 1, 1, 0, 0, 0, 123, tzinfo=UTC)
    assert format_micro_time(moment) == "2026-01-01T00:00:00.000123Z"
    assert format_micro_time(datetime(2026, 1, 1)) == "2026-01-01T00:00:00.000000Z"


@pytest.mark.parametrize("gpus", [0, 1, 64])
def test_gpu_count_is_a_string_quantity(gpus: int) -> None:
    status = build_status(settings=SETTINGS, capacity=NodeCapacity(gpus=gpus), version="v1", now=T0)
    assert status["allocatable"][GPU_RESOURCE] == str(gpus)


class _Marker:
    """The one GET the decommission check makes: the marker Lease, or 404."""

    def __init__(self, renew: str | None) -> None:
        self.renew = renew
        self.paths: list[str] = []

    async def get(self, path: str) -> dict[str, Any]:
        from vkprovider.kube.errors import NotFoundError
        self.paths.append(path)
        if self.renew is None:
            raise NotFoundError("not found", status=404)
        return {"spec": {"renewTime": self.renew}}


@pytest.mark.parametrize(("written", "counts"), [
    (None, False),  # no marker: register as always
    (30.0, True),  # written while this process ran
    (-30.0, True),  # just before it started: within the clock slack
    (-3600.0, False),  # an old uninstall's marker: a process started later registers
])
async def test_a_decommission_marker_counts_only_if_written_while_this_process_ran(
        written: float | None, counts: bool) -> None:
    from vkprovider.node.virtualnode import decommission_marker_path

    path = decommission_marker_path(namespace="ns", node="vk-test")
    node = VirtualNode(client=None, settings=SETTINGS,  # type: ignore[arg-type]
                       capacity=_no_capacity, version="v", decommission_marker=path)
    at = None if written is None else datetime.fromtimestamp(node._started + written, UTC)
    client = _Marker(None if at is None else format_micro_time(at))
    node._client = client  # type: ignore[assignment]
    assert await node._was_decommissioned() is counts
    assert client.paths == [
        "/apis/coordination.k8s.io/v1/namespaces/ns/leases/vkprovider-decommissioned-vk-test"]


async def _no_capacity() -> NodeCapacity:
    raise AssertionError("not called")

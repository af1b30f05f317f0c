"""Budget accounting per OverflowPolicy, and the admission helpers that are pure."""

from __future__ import annotations

from typing import Any

from vkprovider.descheduler.admission import (
    node_tolerations,
    tolerates_virtual_node,
    unschedulable_since,
)
from vkprovider.placement.budget import Usage, budget_refusal, pod_gpus, usage_by_policy


def pod(*, policy: str | None = None, gpus: int = 1, price: str | None = None,
        phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    ann = {}
    if policy:
        ann["vkprovider.io/overflow-policy"] = policy
    if price:
        ann["vkprovider.io/price-per-hour"] = price
    meta: dict[str, Any] = {"annotations": ann}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_usage_counts_live_pods_of_each_policy_only() -> None:
    usage = usage_by_policy([
        pod(policy="a", gpus=2, price="4.98"), pod(policy="a", gpus=1, price="2.49"),
        pod(policy="b", gpus=1), pod(gpus=8, price="20"),  # no policy: not counted
        pod(policy="a", phase="Failed", price="9"), pod(policy="a", deleting=True, price="9"),
    ])
    assert usage["a"].pods == 2 and usage["a"].gpus == 3
    assert abs(usage["a"].price_per_hour - 7.47) < 1e-9
    assert usage["b"] == Usage(pods=1, gpus=1, price_per_hour=0.0)
    assert set(usage) == {"a", "b"}


def test_pod_gpus_reads_limits_then_requests_and_ignores_garbage() -> None:
    assert pod_gpus(pod(gpus=4)) == 4
    p = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}},
                                 {"resources": {"limits": {"nvidia.com/gpu": "x"}}}]}}
    assert pod_gpus(p) == 2


def test_budget_refusal_names_the_limit_that_binds() -> None:
    u = Usage(pods=3, gpus=6, price_per_hour=9.0)
    assert budget_refusal(max_pods=4, max_gpus=None, max_price_per_hour=None, usage=u,
                          gpus=1) is None
    assert "maxPods 3" in str(budget_refusal(max_pods=3, max_gpus=None, max_price_per_hour=None,
                                             usage=u, gpus=1))
    assert "maxGPUs 7" in str(budget_refusal(max_pods=None, max_gpus=7, max_price_per_hour=None,
                                             usage=u, gpus=2))
    assert budget_refusal(max_pods=None, max_gpus=8, max_price_per_hour=None, usage=u,
                          gpus=2) is None
    assert "maxPricePerHour" in str(budget_refusal(max_pods=None, max_gpus=None,
                                                   max_price_per_hour=10.0, usage=u, gpus=1,
                                                   expected_price_per_hour=2.0))
    assert budget_refusal(max_pods=None, max_gpus=None, max_price_per_hour=10.0, usage=u,
                          gpus=1, expected_price_per_hour=0.5) is None


def test_tolerates_virtual_node_variants() -> None:
    def with_tol(tol: dict[str, str]) -> dict[str, Any]:
        return {"spec": {"tolerations": [tol]}}

    key = "virtual-kubelet.io/provider"
    assert tolerates_virtual_node(with_tol({"key": key, "operator": "Exists"}))
    assert tolerates_virtual_node(with_tol({"key": key, "operator": "Equal",
                                            "value": "vkprovider", "effect": "NoSchedule"}))
    assert not tolerates_virtual_node(with_tol({"key": key, "operator": "Equal",
                                                "value": "other"}))
    assert not tolerates_virtual_node(with_tol({"key": key, "operator": "Exists",
                                                "effect": "NoExecute"}))
    assert not tolerates_virtual_node({"spec": {}})


def test_unschedulable_since_reads_the_scheduler_condition() -> None:
    p = {"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                    "reason": "Unschedulable",
                                    "lastTransitionTime": "2026-01-01T00:00:10Z"}]}}
    assert unschedulable_since(p) == 1767225610.0
    bound = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert unschedulable_since(bound) is None
    assert unschedulable_since({"status": {}}) is None


def test_tolerations_follow_the_taints_of_the_nodes_a_policy_may_use() -> None:
    eu = {"key": "virtual-kubelet.io/provider", "value": "vkprovider-eu", "effect": "NoSchedule"}
    us = {"key": "virtual-kubelet.io/provider", "value": "vkprovider-us", "effect": "NoSchedule"}
    tols = node_tolerations({"vk-eu": eu, "vk-us": us}, ["vk-eu"])
    assert tols == [{"key": "virtual-kubelet.io/provider", "operator": "Equal",
                     "value": "vkprovider-eu", "effect": "NoSchedule"}]
    both = node_tolerations({"vk-eu": eu, "vk-us": None}, ["vk-eu", "vk-us"])
    assert [t["value"] for t in both] == ["vkprovider-eu", "vkprovider"], "unregistered: default"
    same = node_tolerations({"a": us, "b": us}, ["a", "b"])
    assert len(same) == 1, "one toleration per distinct taint"
    pod = {"spec": {"tolerations": tols}}
    assert tolerates_virtual_node(pod, [eu]) and not tolerates_virtual_node(pod, [us])

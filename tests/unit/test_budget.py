"""Budget accounting per OverflowPolicy, and the admission helpers that are pure."""

from __future__ import annotations

import asyncio
from typing import Any

from vkprovider.descheduler.admission import (
    node_tolerations,
    tolerates_virtual_node,
    unschedulable_since,
)
from vkprovider.node.budgetbook import Allocatable, BudgetBook, Claim, allocatable, pod_requests
from vkprovider.placement.budget import Usage, budget_refusal, pod_gpus, usage_by_policy
from vkprovider.placement.policy import Limits


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


# ---- the provider's own book (node/budgetbook.py): the last gate before money is spent -------

NODE = Allocatable(pods=1000, cpu_millis=1_000_000, memory_bytes=2**43)


def claim(policy: str | None = "p", *, gpus: int = 1, price: float = 0.0, cpu: int = 0,
          memory: int = 0) -> Claim:
    return Claim(policy=policy, gpus=gpus, price_per_hour=price, cpu_millis=cpu,
                 memory_bytes=memory)


def test_the_book_gives_the_last_slot_once_and_frees_it_on_drop() -> None:
    book = BudgetBook()
    limits = Limits(max_pods=2)
    assert book.reserve("a", claim(), limits=limits, node=NODE)[0] is None
    assert book.reserve("b", claim(), limits=limits, node=NODE)[0] is None
    refused, before = book.reserve("c", claim(), limits=limits, node=NODE)
    assert refused is not None and before is None and "c" not in book
    assert refused.budget == "maxPods" and not refused.node
    assert "OverflowPolicy p: maxPods 2 reached" in refused.message
    assert book.usage("p") == Usage(pods=2, gpus=2)
    book.drop("a")
    assert book.reserve("c", claim(), limits=limits, node=NODE)[0] is None
    assert book.usage("p").pods == 2 and book.node().pods == 2


async def test_parallel_workers_racing_for_the_last_slot_get_it_once() -> None:
    """Workers interleave at every await; check and reserve are one step between two."""
    book = BudgetBook()
    limits = Limits(max_pods=3)
    won: list[str] = []

    async def worker(uid: str) -> None:
        await asyncio.sleep(0)  # everyone reaches the gate before anyone creates
        refused, _ = book.reserve(uid, claim(), limits=limits, node=NODE)
        if refused is None:
            await asyncio.sleep(0.01)  # the cloud call
            won.append(uid)

    await asyncio.gather(*(worker(f"u{i}") for i in range(20)))
    assert len(won) == 3 and book.usage("p").pods == 3


def test_a_retried_create_is_not_counted_twice_and_a_refused_one_keeps_its_claim() -> None:
    book = BudgetBook()
    limits = Limits(max_pods=1, max_gpus=2)
    assert book.reserve("a", claim(gpus=2), limits=limits, node=NODE)[0] is None
    refused, before = book.reserve("a", claim(gpus=2), limits=limits, node=NODE)
    assert refused is None and before == claim(gpus=2), "its own earlier try"
    refused, _ = book.reserve("b", claim(gpus=1), limits=Limits(max_gpus=2), node=NODE)
    assert refused is not None and refused.budget == "maxGPUs"
    book.restore("a", None)
    assert "a" not in book and book.usage("p") == Usage()


def test_the_offer_price_counts_against_max_price_per_hour() -> None:
    book = BudgetBook()
    limits = Limits(max_price_per_hour=5.0)
    for uid in ("a", "b"):
        assert book.reserve(uid, claim(price=2.0), limits=limits, node=NODE)[0] is None
    refused, _ = book.reserve("c", claim(price=2.0), limits=limits, node=NODE)
    assert refused is not None and refused.budget == "maxPricePerHour"
    assert book.reserve("c", claim(price=1.0), limits=limits, node=NODE)[0] is None, \
        "a cheaper offer fits"
    book.priced("c", 1.5)  # the cloud's price replaces the offer's
    assert book.usage("p").price_per_hour == 5.5
    # float dollars: 3 x 1.10 is within $3.30
    cents = BudgetBook()
    for uid in "xyz":
        assert cents.reserve(uid, claim(price=1.1), limits=Limits(max_price_per_hour=3.3),
                             node=NODE)[0] is None


def test_the_node_allocatable_is_checked_for_every_pod_policy_or_not() -> None:
    book = BudgetBook()
    node = Allocatable(pods=2, cpu_millis=4000, memory_bytes=10, gpus=3)
    assert book.reserve("a", claim(None, gpus=2, cpu=3000), limits=None, node=node)[0] is None
    refused, _ = book.reserve("b", claim(None, gpus=0, cpu=2000), limits=None, node=node)
    assert refused is not None and refused.node and refused.budget == "cpu"
    assert refused.message == ("Node didn't have enough resource: cpu, requested: 2000, "
                               "used: 3000, capacity: 4000")
    refused, _ = book.reserve("b", claim("p", gpus=2), limits=Limits(), node=node)
    assert refused is not None and refused.budget == "nvidia.com/gpu"
    assert book.reserve("b", claim("p", gpus=1), limits=Limits(), node=node)[0] is None
    refused, _ = book.reserve("c", claim(None, gpus=0), limits=None, node=node)
    assert refused is not None and refused.budget == "pods"
    assert book.refusal("c", claim(None, gpus=9), limits=None, node=Allocatable()) is None, \
        "None: not checked"


def test_pod_requests_sum_containers_and_take_the_largest_init_container() -> None:
    p = {"spec": {"containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                                 {"resources": {"requests": {"cpu": "1"}}}],
                  "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "1Ki"}}}]}}
    assert pod_requests(p) == (2000, 2**30)
    assert pod_requests({"spec": {"containers": [{"resources": {"requests": {"cpu": "x"}}}]}}) \
        == (0, 0)
    assert allocatable(pods=10, cpu="1000", memory="8Ti", gpus=None) == Allocatable(
        pods=10, cpu_millis=1_000_000, memory_bytes=8 * 2**40)


def test_gpus_outside_counts_claims_not_yet_placed() -> None:
    book = BudgetBook()
    book.put("placed", claim(gpus=2))
    book.put("in-flight", claim(gpus=3))
    assert book.gpus_outside({"placed"}) == 3


def test_pods_that_claim_alike_share_one_claim_and_the_totals_stay_exact() -> None:
    book = BudgetBook()
    for i in range(100):
        book.put(f"u{i}", Claim(policy="p", gpus=1, price_per_hour=2.5, memory_bytes=2**33))
    book.put("dear", Claim(policy="p", gpus=1, price_per_hour=3.5, memory_bytes=2**33))
    held = {id(book.get(f"u{i}")) for i in range(100)}
    assert len(held) == 1, "one object for 100 alike claims"
    assert book.get("dear") is not book.get("u0")
    assert book.usage("p") == Usage(pods=101, gpus=101, price_per_hour=253.5)
    book.priced("u7", 2.75)  # the cloud's own price: a claim of its own
    assert book.get("u7") is not book.get("u0") and book.get("u7") == Claim(
        policy="p", gpus=1, price_per_hour=2.75, memory_bytes=2**33)
    assert book.usage("p").price_per_hour == 253.75
    for i in range(100):
        book.drop(f"u{i}")
    book.drop("dear")
    assert book.usage("p") == Usage() and book.node().pods == 0
    assert not book._shared, "a claim no pod holds is not kept"

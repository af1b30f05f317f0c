"""The provider's policy gate: one parse per version; budgets of the policies that may use it."""

from __future__ import annotations

from typing import Any, cast

from providers.base import Offer
from vkprovider.kube.watching import Informer
from vkprovider.node.policygate import PolicyGate
from vkprovider.placement.budget import Usage


def policy(name: str, rv: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
            "metadata": {"name": name, "resourceVersion": rv},
            "spec": {"providers": ["cloud0"], **spec}}


def gate(*objs: dict[str, Any], node: str = "vk-a") -> PolicyGate:
    informer = Informer(client=cast(Any, None), path="/x")
    for obj in objs:
        informer.store[obj["metadata"]["name"]] = obj
    return PolicyGate(client=cast(Any, None), node=node, policies=informer, require_policy=False)


OFFERS = [Offer(provider="cloud0", gpu_type="H100", region="us", available=100,
                price_per_gpu_hour=2.0)]


def test_a_policy_is_parsed_once_per_resource_version() -> None:
    g = gate(policy("p", "1", limits={"maxGPUs": 4}))
    first = g.parsed()["p"]
    assert g.parsed()["p"] is first, "same version: the cached object"
    g.policies.store["p"] = policy("p", "2", limits={"maxGPUs": 8})
    assert g.parsed()["p"].spec.limits.max_gpus == 8
    del g.policies.store["p"]
    assert g.parsed() == {}


def test_an_invalid_policy_is_left_out() -> None:
    g = gate(policy("bad", "1", limits={"maxGPUs": -1}), policy("ok", "1"))
    assert set(g.parsed()) == {"ok"}


def test_budgets_count_only_policies_that_may_use_this_node() -> None:
    elsewhere = policy("eu", "1", nodes=["vk-eu"], limits={"maxGPUs": 5})
    other_cloud = policy("rp", "1", providers=["runpod"], limits={"maxGPUs": 7})
    here = policy("here", "1", limits={"maxGPUs": 3})
    g = gate(elsewhere, other_cloud, here)
    usage = {"here": Usage(gpus=1, price_per_hour=2.0)}
    assert g.budget_gpus(offers=OFFERS, usage=usage, providers={"cloud0"}) == 2
    unlimited = policy("open", "1")
    g.policies.store["open"] = unlimited
    assert g.budget_gpus(offers=OFFERS, usage=usage, providers={"cloud0"}) is None


async def test_a_named_policy_must_allow_this_node_and_select_the_pod() -> None:
    g = gate(policy("eu", "1", nodes=["vk-eu"]),
             policy("web", "1", selector={"podSelector": {"matchLabels": {"app": "web"}}}))
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"},
                        "annotations": {"vkprovider.io/overflow-policy": "eu"}}, "spec": {}}
    chosen, why = await g.admitting(pod)
    assert chosen is None and "do not include vk-a" in why
    pod["metadata"]["annotations"]["vkprovider.io/overflow-policy"] = "web"
    chosen, why = await g.admitting(pod)
    assert chosen is not None and chosen.name == "web" and why == ""
    pod["metadata"]["labels"] = {"app": "batch"}
    chosen, why = await g.admitting(pod)
    assert chosen is None and "does not select it" in why and "podSelector" in why

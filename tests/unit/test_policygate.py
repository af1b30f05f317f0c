"""The provider's policy gate: one parse per version; budgets of the policies that may use it;
fail closed when the policies cannot be read after they were served."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, cast

from providers.base import Offer
from vkprovider.kube.errors import NotFoundError
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


class ScriptedServer:
    """Answers the informer's list and watch calls in the order a test scripts them (an
    exception is raised), so the gate sees what a CRD being re-established looks like."""

    def __init__(self) -> None:
        self.lists: asyncio.Queue[Any] = asyncio.Queue()
        self.watches: asyncio.Queue[Any] = asyncio.Queue()
        self.listed = asyncio.Event()

    async def list_all(self, path: str, *, params: Any = None, page: int = 0
                       ) -> tuple[list[dict[str, Any]], str]:
        answer = await self.lists.get()
        self.listed.set()
        if isinstance(answer, Exception):
            raise answer
        return list(answer), "1"

    def stream(self, path: str, *, params: Any = None, read_timeout: float = 0.0) -> Any:
        server = self

        class Watch:
            async def __aenter__(self) -> Any:
                answer = await server.watches.get()
                if isinstance(answer, Exception):
                    raise answer

                class Body:
                    async def aiter_bytes(self) -> Any:
                        for event in answer:
                            yield (json.dumps(event) + "\n").encode()
                        await asyncio.Event().wait()  # then quiet, as a watch is

                return Body()

            async def __aexit__(self, *exc: object) -> None:
                return None

        return Watch()


async def settle(informer: Informer, until: Any) -> None:
    for _ in range(200):
        if until():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the informer did not get there")


async def test_after_policies_were_served_a_404_or_an_empty_relist_is_not_no_policy() -> None:
    server = ScriptedServer()
    informer = Informer(client=cast(Any, server), path="/x", missing_ok=True, max_backoff=0.01,
                        name="policies")
    g = PolicyGate(client=cast(Any, None), node="vk-a", policies=informer, require_policy=False)
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}
    capped = policy("capped", "1", limits={"maxPods": 2})
    await server.lists.put([capped])
    task = asyncio.create_task(informer.run())
    try:
        await settle(informer, lambda: informer.synced.is_set())
        assert (await g.admitting(pod))[0] is not None, "served: the pod is under 'capped'"
        # the CRD is re-established: the watch and the next list answer 404, then an empty list
        await server.watches.put(NotFoundError("404", status=404))
        server.listed.clear()
        await server.lists.put(NotFoundError("404", status=404))
        await settle(informer, lambda: informer.missing and not informer.store)
        chosen, why = await g.admitting(pod)
        assert chosen is not None and chosen.name == "capped" and why == "", \
            "a 404 must not let a pod be created with no policy"
        assert g.held_over
        await server.lists.put([])
        await settle(informer, lambda: not informer.missing)
        assert informer.recovering and not informer.store
        chosen, _ = await g.admitting(pod)
        assert chosen is not None and chosen.name == "capped", "an empty list after a 404 too"
        assert set(g.parsed()) == {"capped"}
        # a real answer: the server tells of a policy again
        other = policy("other", "2")
        await server.watches.put([{"type": "ADDED", "object": other}])
        await settle(informer, lambda: "other" in informer.store)
        assert set(g.parsed()) == {"other"} and not g.held_over
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_provider_that_never_saw_a_policy_reads_a_404_as_none() -> None:
    server = ScriptedServer()
    informer = Informer(client=cast(Any, server), path="/x", missing_ok=True, max_backoff=0.01)
    g = PolicyGate(client=cast(Any, None), node="vk-a", policies=informer, require_policy=False)
    await server.lists.put(NotFoundError("404", status=404))
    task = asyncio.create_task(informer.run())
    try:
        await settle(informer, lambda: informer.synced.is_set())
        assert g.parsed() == {} and await g.admitting({"metadata": {}, "spec": {}}) == (None, "")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_policies_deleted_by_watch_are_gone_while_the_resource_is_served() -> None:
    g = gate(policy("p", "1"))
    assert set(g.parsed()) == {"p"}
    del g.policies.store["p"]  # a DELETED event: the server's answer
    assert g.parsed() == {}

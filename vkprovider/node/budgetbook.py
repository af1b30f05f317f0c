"""What the provider itself has committed on its node, per OverflowPolicy and in total.

Why it exists: the companion admits pods within a policy's budget, but a pod can reach the
virtual node without it (``spec.nodeName`` and the toleration), and the companion counts a pod by
its ``vkprovider.io/overflow-policy`` annotation, which the pod's author may remove. The provider
is where the money is spent, so it is the last gate (issue 34): before any cloud call it checks
the pod against its policy's ``limits`` (maxPods, maxGPUs, maxPricePerHour, the arithmetic of
:func:`vkprovider.placement.budget.budget_refusal`, shared with the companion) and against the
node's allocatable (pods, cpu, memory, ``nvidia.com/gpu``), counted from this book, never from
an annotation.

A *claim* is one pod the provider has committed to: reserved before its cloud call (so N
parallel workers cannot all take the last slot: check and reserve happen with no ``await`` in
between), kept while its instance may exist, dropped when the pod ends or its instance is being
deleted. Its policy is the one the provider resolved at create time and wrote into the
instance's tags (:data:`TAG_POLICY`); after a restart claims are rebuilt from those tags.
Totals are kept incrementally: O(1) per claim, check or drop, whatever the number of pods.
"""

from __future__ import annotations

import contextlib
from collections.abc import Container, Mapping
from dataclasses import dataclass, replace
from typing import Any

from vkprovider.placement.budget import Usage, budget_refusal
from vkprovider.placement.policy import Limits
from vkprovider.semantics.quantity import QuantityError, cpu_millis, memory_bytes, parse_quantity

#: The instance tag naming the OverflowPolicy the provider created the instance under.
TAG_POLICY = "vkprovider.io/policy"

_DOLLAR_EPSILON = 1e-9

#: The kubelet's reasons for a pod its node's allocatable cannot hold (the pod fails with it).
OUT_OF_REASONS = {"pods": "OutOfpods", "cpu": "OutOfcpu", "memory": "OutOfmemory"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """One pod the provider committed to: its policy (None: created with no policy) and size."""

    policy: str | None
    gpus: int
    price_per_hour: float = 0.0
    cpu_millis: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeUse:
    """What the claims on this node add up to (the kubelet's "used" of an admission check)."""

    pods: int = 0
    gpus: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Allocatable:
    """The node's allocatable as advertised; None: not checked (``gpus`` before the first
    capacity read)."""

    pods: int | None = None
    cpu_millis: int | None = None
    memory_bytes: int | None = None
    gpus: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusal:
    """Why a claim does not fit: ``budget`` names the limit (``maxPods``, ``pods``, ...).

    ``node`` True: the node's allocatable, False: the policy's limits.
    """

    node: bool
    budget: str
    message: str


def allocatable(*, pods: int, cpu: str, memory: str, gpus: int | None) -> Allocatable:
    """The node settings' figures (quantities as the Node publishes them) as numbers."""
    return Allocatable(pods=pods, cpu_millis=cpu_millis(parse_quantity(cpu)),
                       memory_bytes=memory_bytes(parse_quantity(memory)), gpus=gpus)


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(cpu millis, memory bytes) the pod requests, as the kubelet's admission counts them: the
    larger of the containers' sum and the largest init container. An unparsable amount counts
    0 (the API server has validated every quantity of a real pod)."""

    def one(container: Any) -> tuple[int, int]:
        if not isinstance(container, Mapping):
            return 0, 0
        resources = container.get("resources")
        requests = resources.get("requests") if isinstance(resources, Mapping) else None
        if not isinstance(requests, Mapping):
            return 0, 0
        out = [0, 0]
        for i, (key, convert) in enumerate((("cpu", cpu_millis), ("memory", memory_bytes))):
            raw = requests.get(key)
            if raw is None:
                continue
            with contextlib.suppress(QuantityError):
                out[i] = max(0, convert(parse_quantity(raw)))
        return out[0], out[1]

    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    cpu = mem = 0
    for container in spec.get("containers") or []:
        c, m = one(container)
        cpu, mem = cpu + c, mem + m
    for container in spec.get("initContainers") or []:
        c, m = one(container)
        cpu, mem = max(cpu, c), max(mem, m)
    return cpu, mem


class BudgetBook:
    """Pod UID -> :class:`Claim`, with running totals per policy and for the node.

    Totals are plain counters updated in place (a create checks and reserves in microseconds,
    whatever the number of pods: bench figures in docs/operations.md).
    """

    def __init__(self) -> None:
        self._claims: dict[str, Claim] = {}
        # one object per distinct claim, with how many pods hold it: the replicas of a
        # Deployment claim alike, so 5,000 of them keep one Claim (and its price), not 5,000
        # (~0.6 MiB, bench/steady.py); entries go with their last pod
        self._shared: dict[Claim, list[Any]] = {}  # claim -> [the shared object, pods]
        self._by_policy: dict[str, list[float]] = {}  # policy -> [pods, gpus, $/h]
        self._pods = 0
        self._gpus = 0
        self._cpu = 0
        self._memory = 0

    # ---- reads ---------------------------------------------------------------------------------

    def get(self, uid: str) -> Claim | None:
        return self._claims.get(uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._claims

    def __len__(self) -> int:
        return len(self._claims)

    def gpus_outside(self, uids: Container[str]) -> int:
        """GPUs of the claims whose pod is not in ``uids`` (creates in flight or in doubt, when
        ``uids`` are the placed pods). O(claims): for the periodic capacity read, not a create."""
        return sum(c.gpus for uid, c in self._claims.items() if uid not in uids)

    def usage(self, policy: str) -> Usage:
        t = self._by_policy.get(policy)
        if t is None:
            return Usage()
        return Usage(pods=int(t[0]), gpus=int(t[1]),
                     price_per_hour=t[2] if t[2] > _DOLLAR_EPSILON else 0.0)

    def usage_by_policy(self) -> dict[str, Usage]:
        return {name: self.usage(name) for name in self._by_policy}

    def node(self) -> NodeUse:
        return NodeUse(pods=self._pods, gpus=self._gpus, cpu_millis=self._cpu,
                       memory_bytes=self._memory)

    def refusal(self, uid: str, claim: Claim, *, limits: Limits | None,
                node: Allocatable) -> Refusal | None:
        """Why ``claim`` for ``uid`` would break the node's allocatable or its policy's
        ``limits`` (None: no policy), counting every other claim; None if it fits.

        The pod's own claim (an earlier try whose outcome is unknown) is not counted twice.
        """
        own = self._claims.get(uid)
        pods, gpus, cpu, memory = self._pods, self._gpus, self._cpu, self._memory
        if own is not None:
            pods, gpus = pods - 1, gpus - own.gpus
            cpu, memory = cpu - own.cpu_millis, memory - own.memory_bytes
        for name, want, have, cap in (
            ("pods", 1, pods, node.pods),
            ("cpu", claim.cpu_millis, cpu, node.cpu_millis),
            ("memory", claim.memory_bytes, memory, node.memory_bytes),
            ("nvidia.com/gpu", claim.gpus, gpus, node.gpus),
        ):
            if cap is not None and want > 0 and have + want > cap:
                return Refusal(node=True, budget=name, message=(
                    f"Node didn't have enough resource: {name}, requested: {want}, "
                    f"used: {have}, capacity: {cap}"))
        if limits is None or claim.policy is None or (
                limits.max_pods is None and limits.max_gpus is None
                and limits.max_price_per_hour is None):
            return None
        usage = self.usage(claim.policy)
        if own is not None and own.policy == claim.policy:
            usage = Usage(pods=usage.pods - 1, gpus=usage.gpus - own.gpus,
                          price_per_hour=usage.price_per_hour - own.price_per_hour)
        why = budget_refusal(max_pods=limits.max_pods, max_gpus=limits.max_gpus,
                             max_price_per_hour=limits.max_price_per_hour, usage=usage,
                             gpus=claim.gpus, expected_price_per_hour=claim.price_per_hour)
        if why is None:
            return None
        return Refusal(node=False, budget=why.split(" ", 1)[0],
                       message=f"OverflowPolicy {claim.policy}: {why} on this node")

    # ---- writes --------------------------------------------------------------------------------

    def reserve(self, uid: str, claim: Claim, *, limits: Limits | None, node: Allocatable
                ) -> tuple[Refusal | None, Claim | None]:
        """Check and take ``claim`` in one step (no ``await`` between: two workers racing for
        the last slot cannot both get it). Returns (refusal, the claim it replaced)."""
        refused = self.refusal(uid, claim, limits=limits, node=node)
        if refused is not None:
            return refused, self._claims.get(uid)
        return None, self.put(uid, claim)

    def put(self, uid: str, claim: Claim) -> Claim | None:
        """Set the claim of ``uid``; returns the one it replaced."""
        previous = self.drop(uid)
        shared = self._shared.get(claim)
        if shared is None:
            shared = self._shared[claim] = [claim, 0]
        shared[1] += 1
        self._claims[uid] = shared[0]
        self._add(claim, 1)
        return previous

    def restore(self, uid: str, previous: Claim | None) -> None:
        """Undo a reservation: back to ``previous`` (None: no claim)."""
        if previous is None:
            self.drop(uid)
        else:
            self.put(uid, previous)

    def priced(self, uid: str, price_per_hour: float) -> None:
        """The cloud's actual price replaces the offer's once the instance exists."""
        claim = self._claims.get(uid)
        if claim is not None and price_per_hour > 0 and price_per_hour != claim.price_per_hour:
            self.put(uid, replace(claim, price_per_hour=price_per_hour))

    def drop(self, uid: str) -> Claim | None:
        claim = self._claims.pop(uid, None)
        if claim is not None:
            self._add(claim, -1)
            shared = self._shared.get(claim)
            if shared is not None:
                shared[1] -= 1
                if shared[1] <= 0:
                    del self._shared[claim]
        return claim

    def _add(self, claim: Claim, sign: int) -> None:
        self._pods += sign
        self._gpus += sign * claim.gpus
        self._cpu += sign * claim.cpu_millis
        self._memory += sign * claim.memory_bytes
        if claim.policy is None:
            return
        t = self._by_policy.get(claim.policy)
        if t is None:
            t = self._by_policy[claim.policy] = [0, 0, 0.0]
        t[0] += sign
        t[1] += sign * claim.gpus
        t[2] += sign * claim.price_per_hour
        if t[0] <= 0:
            del self._by_policy[claim.policy]

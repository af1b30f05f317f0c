"""The provider's own policy check: money is only spent on pods an OverflowPolicy admits here.

Why it exists: the companion admits pods, but the provider is where the money is spent, and the
``vkprovider.io/overflow-policy`` annotation it reads is a claim anyone who can create pods can
write. So before any cloud call the provider checks that the named policy exists, may use this
node (``spec.nodes``) and selects the pod (namespaces, namespaceSelector, podSelector,
minPriority). It also tells the node how many GPUs the policies that may use it could still buy
(the node's ``nvidia.com/gpu`` allocatable is capped by that).

Fail closed: once policies have been served, a 404 (the CRD being re-established) or the empty
list that follows it is not "no policies" (which would let every pod be created with none, past
every budget): the last policies served stay in force until the server answers with policies
again or tells of a change. Only a provider that never saw a policy reads a 404 as "none" (set
``pods.require_policy`` to refuse even then).

Parsed policies are cached by ``resourceVersion``: a burst of thousands of creates parses each
policy once, not once per create. Namespace labels (for namespaceSelector) are read with one GET
per namespace, cached for ``NS_LABELS_TTL`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from providers.base import Offer
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.placement import policy as pol
from vkprovider.placement.budget import Usage, pod_policy

log = logging.getLogger(__name__)

NS_LABELS_TTL = 30.0  # seconds a namespace's labels are trusted for policy checks


class PolicyGate:
    def __init__(self, *, client: KubeClient, node: str, policies: Informer,
                 require_policy: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self.node = node
        self.policies = policies
        self._require = require_policy
        self._clock = clock
        self._parsed: dict[str, tuple[str, pol.OverflowPolicy | None]] = {}  # name -> (rv, p)
        self._ns_labels: dict[str, tuple[float, dict[str, str]]] = {}  # ns -> (read at, labels)
        self._last_served: dict[str, pol.OverflowPolicy] | None = None  # the last non-empty view
        self.held_over = False  # True while the last served policies stand in (fail closed)

    def parsed(self) -> dict[str, pol.OverflowPolicy]:
        """Every valid policy by name (an invalid one is logged once per resourceVersion).

        While the policies cannot be read (404, or the empty list of a re-established CRD) after
        some were served, the last ones served: see the module docstring.
        """
        in_doubt = self.policies.missing or self.policies.recovering
        if in_doubt and self._last_served is not None:
            if not self.held_over:
                self.held_over = True
                log.warning("OverflowPolicies cannot be read; the last ones served stay in force",
                            extra=kv(policies=",".join(sorted(self._last_served))))
            return self._last_served
        out = self._parse_store()
        if self.held_over and not in_doubt:
            self.held_over = False
            log.info("OverflowPolicies served again", extra=kv(policies=len(out)))
        if out:
            # Never forgotten, even when a watch empties the store: the CRD's deletion deletes
            # every policy (watch events) before the 404; fail closed is the safe side then.
            self._last_served = out
        return out

    def _parse_store(self) -> dict[str, pol.OverflowPolicy]:
        out: dict[str, pol.OverflowPolicy] = {}
        seen: set[str] = set()
        for obj in self.policies.store.values():
            meta = obj.get("metadata") or {}
            name, rv = str(meta.get("name")), str(meta.get("resourceVersion") or "")
            seen.add(name)
            cached = self._parsed.get(name)
            if cached is None or cached[0] != rv or not rv:
                try:
                    parsed: pol.OverflowPolicy | None = pol.parse_overflow_policy(obj)
                except pol.PolicyError as exc:
                    log.warning("ignoring invalid policy", extra=kv(policy=name, error=str(exc)))
                    parsed = None
                cached = (rv, parsed)
                self._parsed[name] = cached
            if cached[1] is not None:
                out[cached[1].name] = cached[1]
        for name in [n for n in self._parsed if n not in seen]:
            del self._parsed[name]
        return out

    def may_use_node(self, policy: pol.OverflowPolicy, *, providers: Collection[str]) -> bool:
        """Whether pods of ``policy`` may run here: its ``nodes`` allow this node (or name none)
        and it names at least one of the ``providers`` this node serves."""
        return ((not policy.spec.nodes or self.node in policy.spec.nodes)
                and any(p in providers for p in policy.spec.providers))

    def budget_gpus(self, *, offers: Iterable[Offer], usage: Mapping[str, Usage],
                    providers: Collection[str]) -> int | None:
        """GPUs the policies that may use this node may still buy here (None: no policy, or no
        such policy limits GPUs or $).

        A per-node upper bound: ``usage`` is what this node runs. With several virtual nodes the
        companion's admission is the gate that counts every node (docs/operations.md).
        """
        policies = self.parsed()
        if not policies:
            return None
        cheapest = min((o.price_per_gpu_hour for o in offers if o.available > 0), default=0.0)
        total = 0
        for policy in policies.values():
            if not self.may_use_node(policy, providers=providers):
                continue  # its pods never come here: its budget is not this node's to sell
            limits = policy.spec.limits
            used = usage.get(policy.name, Usage())
            left: int | None = None
            if limits.max_gpus is not None:
                left = max(0, limits.max_gpus - used.gpus)
            if limits.max_price_per_hour is not None and cheapest > 0:
                dollars = max(0.0, limits.max_price_per_hour - used.price_per_hour)
                by_price = int(dollars // cheapest)
                left = by_price if left is None else min(left, by_price)
            if left is None:
                return None  # an unlimited policy: the clouds' capacity is the only cap
            total += left
        return total

    async def namespace_labels(self, namespace: str) -> dict[str, str]:
        """The labels of ``namespace`` (cached for ``NS_LABELS_TTL``; one GET per namespace)."""
        now = self._clock()
        cached = self._ns_labels.get(namespace)
        if cached is not None and now - cached[0] < NS_LABELS_TTL:
            return cached[1]
        try:
            obj = await self._client.get(f"/api/v1/namespaces/{namespace}")
        except NotFoundError:
            labels: dict[str, str] = {}
        else:
            labels = dict((obj.get("metadata") or {}).get("labels") or {})
        self._ns_labels[namespace] = (now, labels)
        return labels

    async def admitting(self, pod: Mapping[str, Any]) -> tuple[pol.OverflowPolicy | None, str]:
        """The policy this pod was admitted under (None and "" when no policy exists and none is
        required), or None and why none admits it here."""
        policies = self.parsed()
        if not policies and not self._require:
            return None, ""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        labels: dict[str, str] | None = None

        async def selects(policy: pol.OverflowPolicy) -> tuple[bool, str]:
            nonlocal labels
            if policy.spec.selector.namespace_selector is not None and labels is None:
                labels = await self.namespace_labels(namespace)
            return pol.policy_selects(policy, pod=pod, namespace_labels=labels)

        named = pod_policy(pod)
        if named in policies:
            policy = policies[named]
            if policy.spec.nodes and self.node not in policy.spec.nodes:
                return None, (f"it names OverflowPolicy {named}, whose spec.nodes "
                              f"[{', '.join(policy.spec.nodes)}] do not include {self.node}")
            selected, why = await selects(policy)
            if selected:
                return policy, ""
            return None, f"it names OverflowPolicy {named}, which does not select it: {why}"
        for policy in policies.values():
            if policy.spec.nodes and self.node not in policy.spec.nodes:
                continue
            selected, _ = await selects(policy)
            if selected:
                return policy, ""
        if named:
            return None, f"it names OverflowPolicy {named}, which does not exist"
        if labels is None and any(p.spec.selector.namespace_selector is not None
                                  for p in policies.values()):
            labels = await self.namespace_labels(namespace)
        closest = pol.closest_refusal(list(policies.values()), pod, namespace_labels=labels)
        if closest is not None:
            return None, f"no OverflowPolicy selects it (closest: {closest[0]}: {closest[1]})"
        return None, "no OverflowPolicy selects it"

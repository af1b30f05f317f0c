"""Overflow admission: let an unschedulable pod onto the virtual node when a policy allows it.

Why it exists: the cluster stays internal-first. Pod templates never carry the virtual node's
toleration, so the scheduler only ever considers internal nodes. When a pod has been
Unschedulable for a policy's ``overflowAfter`` and an OverflowPolicy selects it with budget left,
this loop adds the toleration to that one pod (adding tolerations is an allowed pod update) and
names the policy in an annotation; the scheduler then places it on the virtual node. A pod no
policy admits stays Pending, and one Event per change of mind says which policy came closest and
why it said no.

It watches only what it needs: unscheduled pods (``spec.nodeName=``), pods on the virtual nodes
it serves (for budgets, counted across all of them), those Nodes (for their taints), and
OverflowPolicies.

Several virtual nodes (one provider Deployment each, e.g. per cloud or region) are served by one
companion. A pod is given a toleration for the taint of each node its policy may use
(``spec.nodes``, or every served node); nodes that should be told apart carry their own taint
value (``node.taint_value``), so the scheduler keeps a policy's pods to its nodes.

Budgets count admitted pods that are not bound yet, so a burst cannot overshoot a pod or GPU
limit. A price is known only once a cloud accepted the pod
(the provider writes ``vkprovider.io/price-per-hour``), so under a $/h limit the companion admits
the next pod only when every earlier one of that policy is priced: it never overshoots, at the
cost of admitting one pod per cloud round trip under a price cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.placement import policy as pol
from vkprovider.placement.budget import (
    POLICY_ANNOTATION,
    Usage,
    budget_refusal,
    is_live,
    pod_gpus,
    pod_policy,
    pod_price,
    usage_by_policy,
)
from vkprovider.semantics.taints import tolerates
from vkprovider.semantics.timefmt import TimeFormatError, format_time, parse_time

log = logging.getLogger(__name__)

Body = dict[str, Any]
POLICIES_PATH = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
TAINT = {"key": "virtual-kubelet.io/provider", "value": "vkprovider", "effect": "NoSchedule"}


def tolerates_virtual_node(pod: Mapping[str, Any],
                           taints: Sequence[Mapping[str, Any]] = (TAINT,)) -> bool:
    """Whether one of the pod's tolerations names the virtual nodes' taint key and tolerates one
    of ``taints`` (the served nodes' taints).

    A key-less toleration (``operator: Exists`` without a key tolerates every taint) does not
    count here: such a pod is still a candidate for admission, as it has always been.
    """
    return any(
        tol.get("key") == TAINT["key"] and any(tolerates(tol, taint=t) for t in taints)
        for tol in (pod.get("spec") or {}).get("tolerations") or []
    )


def node_tolerations(taints: Mapping[str, Mapping[str, Any] | None],
                     nodes: Sequence[str]) -> list[dict[str, Any]]:
    """Tolerations for the virtual-node taints of ``nodes`` (deduplicated, in order).

    ``taints`` maps a node name to its taint (None: not registered yet, so the default
    ``virtual-kubelet.io/provider=vkprovider:NoSchedule`` it will carry is assumed).
    """
    out: list[dict[str, Any]] = []
    for node in nodes:
        taint = taints.get(node) or TAINT
        toleration = {"key": TAINT["key"], "operator": "Equal", "value": taint.get("value"),
                      "effect": taint.get("effect", TAINT["effect"])}
        if toleration not in out:
            out.append(toleration)
    return out


def virtual_taint(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Node's ``virtual-kubelet.io/provider`` taint, if it has one."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") == TAINT["key"]:
            return dict(taint)
    return None


def _slim_node_taints(obj: Body) -> Body:
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "uid": meta.get("uid")},
            "spec": {"taints": (obj.get("spec") or {}).get("taints") or []}}


def unschedulable_since(pod: Mapping[str, Any]) -> float | None:
    """Epoch seconds since when the scheduler has found no node for the pod, if it has."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"):
            stamp = cond.get("lastTransitionTime")
            try:
                return parse_time(str(stamp)).timestamp() if stamp else time.time()
            except TimeFormatError:  # a malformed time must not stop the companion: count now
                return time.time()
    return None


@dataclass
class Decision:
    pod: str
    decision: str  # Admitted | Refused
    reason: str
    policy: str | None
    time: str = field(default_factory=lambda: format_time(datetime.now(UTC)))


class OverflowAdmission:
    def __init__(
        self,
        *,
        client: KubeClient,
        events: EventRecorder,
        node_names: Sequence[str],
        interval: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not node_names:
            raise ValueError("the companion needs at least one virtual node")
        self.client = client
        self.events = events
        self.node_names = tuple(dict.fromkeys(node_names))
        self.interval = interval
        self.clock = clock
        self.pending = Informer(client=client, path="/api/v1/pods",
                                params={"fieldSelector": "spec.nodeName="}, name="unscheduled",
                                handler=self._poke)
        # one watch per served virtual node: the field selector takes one node name
        self.external_by_node = {
            node: Informer(client=client, path="/api/v1/pods",
                           params={"fieldSelector": f"spec.nodeName={node}"},
                           name=f"external {node}")
            for node in self.node_names}
        self.virtual_nodes = Informer(client=client, path="/api/v1/nodes",
                                      params={"labelSelector": "type=virtual-kubelet"},
                                      name="virtual-nodes", transform=_slim_node_taints)
        self.policies = Informer(client=client, path=POLICIES_PATH, name="policies",
                                 handler=self._poke)
        self.namespaces = Informer(client=client, path="/api/v1/namespaces", name="namespaces")
        self.gpu_providers = Informer(client=client, path=pol.PROVIDERS_PATH,
                                      name="gpuproviders", missing_ok=True)
        self._valid_since: dict[str, tuple[str, str]] = {}  # policy -> (status, since)
        self._wake = asyncio.Event()
        self._refused: dict[str, str] = {}  # pod uid -> last refusal reason told
        self.decisions: dict[str, list[Decision]] = {}  # policy -> recent decisions
        self._status_sent: dict[str, Body] = {}
        self._unpriced: set[str | None] = set()
        self.hold: set[str] = set()  # ReplicaSet UIDs mid move-back: their pods stay inside

    def _poke(self, _event: str, _obj: Body) -> None:
        self._wake.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            informers = (self.pending, *self.external_by_node.values(), self.virtual_nodes,
                         self.policies, self.namespaces, self.gpu_providers)
            for informer in informers:
                tg.create_task(informer.run())
            for informer in informers:
                await informer.synced.wait()
            while True:
                try:
                    await self.pass_once()
                except APIError as exc:
                    log.warning("admission pass failed", extra=kv(error=str(exc)))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
                await asyncio.sleep(0.2)  # coalesce bursts of events into one pass

    def external(self) -> list[Body]:
        """Pods on every served virtual node (budgets count all of them)."""
        return [p for informer in self.external_by_node.values() for p in informer.store.values()]

    def served_taints(self) -> list[dict[str, Any]]:
        """The taint of every served virtual node (the default for one not registered yet)."""
        return [virtual_taint(self.virtual_nodes.store.get(n) or {}) or dict(TAINT)
                for n in self.node_names]

    def tolerations_for(self, policy: pol.OverflowPolicy) -> list[dict[str, Any]]:
        """What to add to a pod admitted under ``policy``: the taints of the nodes it may use."""
        nodes = [n for n in self.node_names if not policy.spec.nodes or n in policy.spec.nodes]
        taints = {n: virtual_taint(self.virtual_nodes.store.get(n) or {}) for n in nodes}
        return node_tolerations(taints, nodes)

    def parsed_policies(self) -> list[pol.OverflowPolicy]:
        out = []
        for obj in sorted(self.policies.store.values(), key=lambda o: o["metadata"]["name"]):
            try:
                out.append(pol.parse_overflow_policy(obj))
            except pol.PolicyError as exc:
                log.warning("ignoring invalid policy",
                            extra=kv(policy=obj["metadata"]["name"], error=str(exc)))
        return out

    async def pass_once(self) -> None:
        live = {p["metadata"].get("uid") for p in self.pending.store.values()}
        for uid in [u for u in self._refused if u not in live]:
            del self._refused[uid]  # scheduled or gone: forget what it was told (bounded)
        policies = self.parsed_policies()
        taints = self.served_taints()
        candidates = [p for p in self.pending.store.values()
                      if not tolerates_virtual_node(p, taints)
                      and unschedulable_since(p) is not None
                      and not p["metadata"].get("deletionTimestamp")
                      and not any(o.get("uid") in self.hold
                                  for o in p["metadata"].get("ownerReferences") or [])]
        in_flight = [p for p in self.pending.store.values() if pod_policy(p)]
        usage = usage_by_policy([*self.external(), *in_flight])
        per_gpu = self._price_per_gpu()
        self._unpriced = {pod_policy(p) for p in [*self.external(), *in_flight]
                          if pod_policy(p) and not pod_price(p) and is_live(p)}
        now = self.clock()
        for pod in sorted(candidates, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            decision = await self._decide(pod, policies, usage, per_gpu, now)
            if decision is not None and decision.decision == "Admitted" and decision.policy:
                u = usage.get(decision.policy, Usage())
                usage[decision.policy] = u.plus(gpus=pod_gpus(pod),
                                                price_per_hour=per_gpu.get(decision.policy, 0.0)
                                                * pod_gpus(pod))
                self._unpriced.add(decision.policy)
        await self._publish_status(policies, usage)

    def _price_per_gpu(self) -> dict[str, float]:
        spent: dict[str, tuple[float, int]] = {}
        for pod in self.external():
            name = pod_policy(pod)
            price = pod_price(pod)
            if name and price:
                dollars, gpus = spent.get(name, (0.0, 0))
                spent[name] = (dollars + price, gpus + max(1, pod_gpus(pod)))
        return {k: d / g for k, (d, g) in spent.items() if g}

    async def _decide(self, pod: Body, policies: list[pol.OverflowPolicy],
                      usage: dict[str, Usage], per_gpu: dict[str, float], now: float
                      ) -> Decision | None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        since = unschedulable_since(pod) or now
        gpus = pod_gpus(pod)
        ns_labels = (self.namespaces.store.get(meta["namespace"], {}).get("metadata") or {}).get(
            "labels") or {}
        refusals: list[tuple[str, str]] = []
        budget_refusals: dict[str, str] = {}
        for policy in policies:
            selected, why = pol.policy_selects(policy, pod=pod, namespace_labels=ns_labels)
            if not selected:
                refusals.append((policy.name, why))
                continue
            wait = pol.parse_duration(policy.spec.overflow_after)
            if now - since < wait:
                return None  # not yet: overflowAfter has not passed
            limits = policy.spec.limits
            if limits.max_price_per_hour is not None and policy.name in self._unpriced:
                return None  # wait until the cloud priced the previous admission
            refusal = budget_refusal(
                max_pods=limits.max_pods, max_gpus=limits.max_gpus,
                max_price_per_hour=limits.max_price_per_hour,
                usage=usage.get(policy.name, Usage()), gpus=gpus,
                expected_price_per_hour=per_gpu.get(policy.name, 0.0) * gpus,
            )
            if refusal is None:
                refusal = await self._fraction_refusal(pod, policy)
            if refusal is not None:
                refusals.append((policy.name, refusal))
                budget_refusals[policy.name] = refusal
                continue
            if policy.spec.dry_run:
                return await self._record(pod, Decision(
                    pod=key, decision="WouldAdmit", policy=policy.name,
                    reason="dry run: would add the virtual node's toleration"))
            if not self.tolerations_for(policy):
                refusals.append((policy.name, "spec.nodes names no virtual node this companion "
                                              f"serves ({', '.join(self.node_names)})"))
                continue
            if await self._admit(pod, policy):
                self._refused.pop(meta["uid"], None)
                return await self._record(pod, Decision(
                    pod=key, decision="Admitted", policy=policy.name,
                    reason=f"Unschedulable for {int(now - since)}s; {gpus} GPU(s) within "
                           f"the policy's limits"))
            return None
        if not policies:
            return None  # no policies: nothing is admitted, nothing to explain
        closest = pol.closest_refusal(policies, pod, namespace_labels=ns_labels,
                                      budget_refusals=budget_refusals)
        name, why = closest if closest else refusals[-1] if refusals else (None, "")
        if self._refused.get(meta["uid"]) == why:
            return None
        self._refused[meta["uid"]] = why
        return await self._record(pod, Decision(pod=key, decision="Refused", policy=name,
                                                reason=why))

    async def _fraction_refusal(self, pod: Body, policy: pol.OverflowPolicy) -> str | None:
        limit = policy.spec.limits.max_external_fraction
        if limit is None:
            return None
        owner = next((o for o in pod["metadata"].get("ownerReferences") or []
                      if o.get("controller")), None)
        if owner is None or owner.get("kind") != "ReplicaSet":
            return None
        ns = pod["metadata"]["namespace"]
        try:
            rs = await self.client.get(f"/apis/apps/v1/namespaces/{ns}/replicasets/"
                                       f"{owner['name']}")
        except NotFoundError:
            return None
        replicas = int((rs.get("spec") or {}).get("replicas") or 0)
        if replicas <= 0:
            return None
        external = sum(1 for p in [*self.external(), *self.pending.store.values()]
                       if pod_policy(p) and any(o.get("uid") == owner.get("uid") for o in
                                                p["metadata"].get("ownerReferences") or []))
        if (external + 1) / replicas > limit:
            return (f"maxExternalFraction {limit} would be exceeded for {owner['name']} "
                    f"({external + 1} of {replicas} replicas external)")
        return None

    async def _admit(self, pod: Body, policy: pol.OverflowPolicy) -> bool:
        meta = pod["metadata"]
        tolerations = [*(pod["spec"].get("tolerations") or []), *self.tolerations_for(policy)]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"],
                              "annotations": {POLICY_ANNOTATION: policy.name}},
                 "spec": {"tolerations": tolerations}}
        try:
            await self.client.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                    patch)
        except (ConflictError, NotFoundError):
            return False  # changed or gone since we looked: the next pass decides again
        log.info("admitted to overflow", extra=kv(pod=f"{meta['namespace']}/{meta['name']}",
                                                  policy=policy.name))
        return True

    async def _record(self, pod: Body, decision: Decision) -> Decision:
        if decision.policy:
            recent = self.decisions.setdefault(decision.policy, [])
            recent.append(decision)
            del recent[:-20]
        if decision.decision == "Admitted":
            await self.events.emit(obj=_pod_ref(pod), reason="OverflowAdmitted",
                                   message=f"OverflowPolicy {decision.policy} admitted the pod "
                                           f"to the virtual node: {decision.reason}")
        elif decision.decision == "WouldAdmit":
            await self.events.emit(obj=_pod_ref(pod), reason="OverflowDryRun",
                                   message=f"OverflowPolicy {decision.policy} would admit the "
                                           f"pod (dry run)")
        else:
            closest = f"closest policy {decision.policy}: " if decision.policy else ""
            await self.events.emit(obj=_pod_ref(pod), reason="OverflowRefused", type_="Warning",
                                   message=f"Not admitted to overflow; {closest}"
                                           f"{decision.reason}")
        return decision

    def _problems(self, policies: list[pol.OverflowPolicy]) -> dict[str, list[pol.Problem]]:
        """Semantic problems per policy. Providers may also come from a node's config file,
        which we cannot see: with no GPUProvider object at all, unknown names are not flagged."""
        providers = []
        for obj in self.gpu_providers.store.values():
            with contextlib.suppress(pol.PolicyError):
                providers.append(pol.parse_gpu_provider(obj))
        if not providers:
            return {p.name: [] for p in policies}
        found = pol.semantic_problems(policies=policies, providers=providers,
                                      secrets_present=lambda _ns, _name, _key: True)
        return {p.name: found.get((pol.KIND_POLICY, p.name), []) for p in policies}

    def _valid_condition(self, policy: pol.OverflowPolicy,
                         problems: list[pol.Problem]) -> Body:
        cond = pol.valid_condition(problems, observed_generation=policy.generation)
        prev = self._valid_since.get(policy.name)
        since = (prev[1] if prev and prev[0] == cond["status"]
                 else format_time(datetime.now(UTC)))
        self._valid_since[policy.name] = (cond["status"], since)
        return {**cond, "lastTransitionTime": since}

    async def _publish_status(self, policies: list[pol.OverflowPolicy],
                              usage: dict[str, Usage]) -> None:
        problems = self._problems(policies)
        for policy in policies:
            u = usage.get(policy.name, Usage())
            status: Body = {
                "conditions": [self._valid_condition(policy, problems.get(policy.name, []))],
                "observedGeneration": policy.generation,
                "externalPods": u.pods,
                "externalGPUs": u.gpus,
                "pricePerHour": round(u.price_per_hour, 4),
                "lastDecisions": [{"time": d.time, "pod": d.pod, "decision": d.decision,
                                   "reason": d.reason}
                                  for d in self.decisions.get(policy.name, [])],
            }
            if self._status_sent.get(policy.name) == status:
                continue
            try:
                await self.client.patch(f"{POLICIES_PATH}/{policy.name}/status",
                                        {"status": status})
                self._status_sent[policy.name] = status
            except NotFoundError:
                continue


def _pod_ref(pod: Body) -> Body:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}

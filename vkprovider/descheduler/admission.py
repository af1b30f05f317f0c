"""Overflow admission: let an unschedulable pod onto the virtual node when a policy allows it.

Why it exists: the cluster stays internal-first. Pod templates never carry the virtual node's
toleration, so the scheduler only ever considers internal nodes. When a pod has been
Unschedulable for a policy's ``overflowAfter`` and an OverflowPolicy selects it with budget left,
this loop adds the toleration to that one pod (adding tolerations is an allowed pod update) and
names the policy in an annotation; the scheduler then places it on the virtual node. A pod no
policy admits stays Pending, and one Event per change of mind says which policy came closest and
why it said no.

It watches only what it needs: unscheduled pods (``spec.nodeName=``, whole: the candidates),
every pod in one slim watch (budgets; move-back and pre-warm read the same cache), ReplicaSets
(``maxExternalFraction``), the virtual Nodes (for their taints), and OverflowPolicies.

Several virtual nodes (one provider Deployment each, e.g. per cloud or region) are served by one
companion. A pod is given a toleration for the taint of each node its policy may use
(``spec.nodes``, or every served node); nodes that should be told apart carry their own taint
value (``node.taint_value``), so the scheduler keeps a policy's pods to its nodes.

Budgets are counted from that one pod watch, classified by ``spec.nodeName``: a pod that binds is
one change there, never a moment in neither of two watches, so a pass cannot admit past
``maxPods``/``maxGPUs`` while pods are being bound; a pod admitted by this process counts from
its patch on, before the watch shows it. A cloud pod counts until its object is gone, terminating
or not (the provider deletes it only after the instance, which bills until then).
A price is known once a cloud accepted a pod (the provider writes ``vkprovider.io/price-per-hour``).
Under a $/h limit, a pod not priced yet counts at the dearest $/GPU-h among the offers its policy
could take, as the providers publish them on their Nodes (``vkprovider.io/offer-prices``,
:mod:`vkprovider.placement.offerprices`), or at the price per GPU the policy's cloud pods pay (or
paid, when this process last saw one) if that is higher. So a surge (a pre-warm's, say) is
admitted at once, as far as the cap allows, before any pod is priced, instead of one pod per
cloud round trip; the dearest offer, so the estimate is never below what a pod may cost. Only
while no price is known at all (a node the policy may use publishes none) does the companion
admit one pod and wait until it is priced. The provider checks each pod at the price of the
offer it is about to take (its last gate), so an estimate that proves low makes a pod wait on
the node, never overshoots the cap.

Policy status (``/status``, patched only when it changed): usage, the last ``MAX_DECISIONS``
decisions (admission's and move-back's, which records through
:meth:`OverflowAdmission.record_decision`), and the conditions of
:mod:`vkprovider.descheduler.policystatus`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from typing import Any

from vkprovider.descheduler import prewarm_plan
from vkprovider.descheduler.fit import slim_pod
from vkprovider.descheduler.loophealth import loop_problem
from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.descheduler.objects import pod_ref as _pod_ref
from vkprovider.descheduler.policystatus import (
    Decision,
    policy_conditions,
    policy_problems,
    stored_decisions,
)
from vkprovider.descheduler.preemption import PreemptionTracker
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.placement import offerprices
from vkprovider.placement import policy as pol
from vkprovider.placement.budget import (
    POLICY_ANNOTATION,
    Usage,
    budget_refusal,
    pod_gpus,
    pod_policy,
    pod_price,
)
from vkprovider.semantics.gpus import GPU_RESOURCE
from vkprovider.semantics.selectors import labels_params
from vkprovider.semantics.taints import tolerates
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

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


def _slim_node(obj: Body) -> Body:
    """A virtual Node as admission needs it: its taints, and the offers' prices its provider
    publishes (``offerPrices``: parsed, or None when absent or refused, which is logged)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "uid": meta.get("uid")},
            "spec": {"taints": (obj.get("spec") or {}).get("taints") or []},
            "offerPrices": node_offer_prices(obj)}


def node_offer_prices(node: Mapping[str, Any]) -> offerprices.OfferPrices | None:
    """The offers' $/GPU-h a virtual Node publishes (``vkprovider.io/offer-prices``), or None.

    The annotation is input (anyone who may patch Nodes can write it): a value that does not
    parse is ignored with a warning, and admission under a $/h cap admits one pod first there.
    """
    meta = node.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(offerprices.OFFER_PRICES_ANNOTATION)
    if text is None:
        return None
    try:
        return offerprices.decode(str(text))
    except offerprices.OfferPricesError as exc:
        log.warning("ignoring the node's offer prices", extra=kv(
            node=meta.get("name"), annotation=offerprices.OFFER_PRICES_ANNOTATION,
            error=str(exc)))
        return None


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


#: How long a pod this process admitted is counted although the pod watch has not shown it
#: annotated (it was deleted before the watch caught up, say): then the watch is the truth.
_ADMITTED_UNSEEN_SECONDS = 60.0


def slim_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs of a pod as the pod watch keeps it (:func:`fit.slim_pod`: summed requests)."""
    return int(((pod.get("spec") or {}).get("requests") or {}).get(GPU_RESOURCE) or 0)


def counts_against_budget(pod: Mapping[str, Any], *, served: AbstractSet[str]) -> bool:
    """Whether a (slim) pod counts against its OverflowPolicy's budget now.

    A pod on a served virtual node counts until its object is gone, terminating or not: the
    provider deletes the pod only after the cloud instance is deleted, and the instance bills
    until then. An unbound pod the companion admitted counts unless it is being deleted (it has
    no instance). A pod that ended (Succeeded, Failed) does not: the provider deleted its
    instance. A pod bound to any other node is not outside.
    """
    if not pod_policy(pod):
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return node in served
    return not (pod.get("metadata") or {}).get("deletionTimestamp")


def budget_usage(pods: Iterable[Mapping[str, Any]], *, served: AbstractSet[str]
                 ) -> dict[str, Usage]:
    """Each policy's pods, GPUs and $/h from one view of every (slim) pod."""
    out: dict[str, Usage] = {}
    for pod in pods:
        if not counts_against_budget(pod, served=served):
            continue
        name = str(pod_policy(pod))
        out[name] = out.get(name, Usage()).plus(gpus=slim_gpus(pod),
                                                price_per_hour=pod_price(pod))
    return out


def committed_usage(usage: Mapping[str, Usage], *, unpriced_gpus: Mapping[str, int],
                    price_per_gpu: Mapping[str, float]) -> dict[str, Usage]:
    """``usage`` with the pods no cloud has priced yet counted at their policy's price per GPU
    (``unpriced_gpus``: their GPUs per policy). What a $/h cap is checked against: a surge is
    admitted at once within the cap, each pod at the price the policy's pods pay, instead of
    one pod per cloud round trip."""
    out = dict(usage)
    for name, gpus in unpriced_gpus.items():
        u = out.get(name, Usage())
        out[name] = Usage(pods=u.pods, gpus=u.gpus,
                          price_per_hour=u.price_per_hour + price_per_gpu.get(name, 0.0) * gpus)
    return out


def higher_of(*tables: Mapping[str, float]) -> dict[str, float]:
    """Per key, the highest value any of ``tables`` has for it."""
    out: dict[str, float] = {}
    for table in tables:
        for key, value in table.items():
            out[key] = max(value, out.get(key, value))
    return out


def slim_replicaset(obj: Body) -> Body:
    """A ReplicaSet as the companion needs it: who owns it, how many replicas it wants."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "uid": meta.get("uid"),
                         "ownerReferences": meta.get("ownerReferences") or []},
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas")}}


class OverflowAdmission:
    def __init__(
        self,
        *,
        client: KubeClient,
        events: EventRecorder,
        node_names: Sequence[str],
        interval: float = 2.0,
        metrics: CompanionMetrics | None = None,
        clock: Callable[[], float] = time.time,
        preemptions: PreemptionTracker | None = None,
        policy_labels: Mapping[str, str] | None = None,
    ) -> None:
        if not node_names:
            raise ValueError("the companion needs at least one virtual node")
        self.metrics = metrics or CompanionMetrics()
        self.client = client
        self.events = events
        self.node_names = tuple(dict.fromkeys(node_names))
        self.interval = interval
        self.clock = clock
        # candidates: unscheduled pods, whole (policies select on their labels, tolerations,
        # priority, conditions)
        self.pending = Informer(client=client, path="/api/v1/pods",
                                params={"fieldSelector": "spec.nodeName="}, name="unscheduled",
                                handler=self._poke)
        # budgets: every pod, slim, in ONE watch (move-back and pre-warm read it too). A pod that
        # binds is one MODIFIED event here, so no pass can miss it between two watches.
        self.pods = Informer(client=client, path="/api/v1/pods", name="all-pods",
                             transform=slim_pod, handler=self._on_pod)
        #: told of every change of ``pods`` (move-back's wake-up, the preemption tracker)
        self.pod_listeners: list[Callable[[str, Body], None]] = []
        # owners and their replica counts (maxExternalFraction; move-back's Deployment lookup)
        self.replicasets = Informer(client=client, path="/apis/apps/v1/replicasets",
                                    name="replicasets", transform=slim_replicaset)
        self.virtual_nodes = Informer(client=client, path="/api/v1/nodes",
                                      params={"labelSelector": "type=virtual-kubelet"},
                                      name="virtual-nodes", transform=_slim_node)
        self.policies = Informer(client=client, path=POLICIES_PATH, name="policies",  # ours
                                 params=labels_params(policy_labels), handler=self._poke)
        self.namespaces = Informer(client=client, path="/api/v1/namespaces", name="namespaces")
        self.gpu_providers = Informer(client=client, path=pol.PROVIDERS_PATH,
                                      name="gpuproviders", missing_ok=True)
        # the preemption fast path (descheduler/preemption.py); None: every pod waits
        self.preemptions = preemptions
        if preemptions is not None:
            preemptions.on_credit = self._wake_now
        # Deployments a pre-warm surged (descheduler/prewarm.py): its label, its intent
        self.prewarmed = Informer(client=client, path="/apis/apps/v1/deployments",
                                  params={"labelSelector": f"{prewarm_plan.LABEL}=true"},
                                  name="prewarmed", handler=self._poke)
        self.informers = (self.pending, self.pods, self.replicasets, self.virtual_nodes,
                          self.policies, self.namespaces, self.gpu_providers, self.prewarmed,
                          *((preemptions.informer,) if preemptions is not None else ()))
        self._wake = asyncio.Event()
        self._refused: dict[str, str] = {}  # pod uid -> last refusal reason told
        self.decisions: dict[str, list[Decision]] = {}  # policy -> recent decisions
        self._seeded = False  # decisions read back from the policies' status
        self._status_sent: dict[str, Body] = {}
        self.beat: float | None = None  # time.monotonic() of the loop's last sign of life
        self._unpriced: set[str | None] = set()
        # policy -> $/h per GPU its cloud pods paid when last seen priced (pruned with policies)
        self._last_price_per_gpu: dict[str, float] = {}
        # pods admitted here: uid -> (policy, GPUs, when), until the pod watch shows them
        self._admitted: dict[str, tuple[str, int, float]] = {}
        self.hold: set[str] = set()  # ReplicaSet UIDs mid move-back: their pods stay inside

    def _poke(self, _event: str, _obj: Body) -> None:
        self._wake.set()

    def _on_pod(self, event: str, obj: Body) -> None:
        for listener in self.pod_listeners:
            try:
                listener(event, obj)
            except Exception:  # one listener's bug must not keep the others uninformed
                log.exception("pod listener failed")

    def _wake_now(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for informer in self.informers:
                tg.create_task(informer.run())
            for informer in self.informers:
                await informer.synced.wait()
            self._seed_decisions()
            while True:
                self.beat = time.monotonic()
                try:
                    await self.pass_once()
                except APIError as exc:
                    log.warning("admission pass failed", extra=kv(error=str(exc)))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
                await asyncio.sleep(0.2)  # coalesce bursts of events into one pass

    def problem(self, *, now: float, stale_after: float) -> str | None:
        """Why this loop is not healthy (``/healthz``), or None: every watch has synced and a
        pass began within ``stale_after`` seconds (``now`` on the ``time.monotonic`` clock)."""
        return loop_problem(loop="admission", informers=self.informers, beat=self.beat, now=now,
                            stale_after=stale_after)

    def _seed_decisions(self) -> None:
        """Once, when the policies are listed: continue the stored ``lastDecisions``.

        A new process (a restart, or a new leader) starts from what the status already holds,
        not from an empty list that the first status patch would write over it.
        """
        if self._seeded or not self.policies.synced.is_set():
            return
        self._seeded = True
        for name, obj in self.policies.store.items():
            stored = stored_decisions(obj)
            if stored:
                mine = self.decisions.get(name, [])
                self.decisions[name] = [*stored, *mine][-pol.MAX_DECISIONS:]

    def record_decision(self, decision: Decision) -> None:
        """Keep ``decision`` in its policy's ``status.lastDecisions`` (the last
        ``MAX_DECISIONS``), published by the next pass, which this wakes. Move-back records
        ``MovedBack``, ``MoveBackFailed`` and ``WouldMoveBack`` here."""
        if not decision.policy:
            return
        self._seed_decisions()
        recent = self.decisions.setdefault(decision.policy, [])
        recent.append(decision)
        del recent[:-pol.MAX_DECISIONS]
        self._wake.set()

    def external(self) -> list[Body]:
        """Pods on every served virtual node (slim, from the one pod watch)."""
        return [p for p in self.pods.store.values()
                if (p.get("spec") or {}).get("nodeName") in self.node_names]

    def budget_usage(self) -> dict[str, Usage]:
        """What each policy has spent, from one view: the pod watch, plus pods this process
        admitted that the watch does not show annotated yet (the patch's own answer is ahead of
        the watch). :func:`counts_against_budget` says which pods count."""
        view = list(self.pods.store.values())
        usage = budget_usage(view, served=frozenset(self.node_names))
        by_uid = {p["metadata"].get("uid"): p for p in view}
        now = time.monotonic()
        for uid, (policy, gpus, at) in list(self._admitted.items()):
            seen = by_uid.get(uid)
            if seen is not None and pod_policy(seen):
                del self._admitted[uid]  # the watch has it: counted above
            elif seen is None and now - at > _ADMITTED_UNSEEN_SECONDS:
                del self._admitted[uid]  # deleted before the watch told us (bounded memory)
            else:
                usage[policy] = usage.get(policy, Usage()).plus(gpus=gpus)
        return usage

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
        if self.preemptions is not None:
            self.preemptions.prune()
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
                                  for o in p["metadata"].get("ownerReferences") or [])
                      and self._prewarm_role(p) != "hold"]
        usage = self.budget_usage()
        # what one unpriced GPU is counted at: the dearest offer the policy could take, as the
        # providers publish them, or what its pods paid, whichever is higher (a paid average
        # can be below the offer the next pod takes); one of them alone when only it is known
        per_gpu = higher_of(self._offer_estimates(policies), self._price_per_gpu())
        unpriced = self._unpriced_gpus()
        self._unpriced = set(unpriced)
        # what the decisions count: the prices known, and each pod not priced yet at the price
        # its policy's pods pay (the provider checks the offer's own price before it creates)
        committed = committed_usage(usage, unpriced_gpus=unpriced, price_per_gpu=per_gpu)
        now = self.clock()
        for pod in sorted(candidates, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            self.beat = time.monotonic()  # a long burst is progress, not a stalled loop
            decision = await self._decide(pod, policies, committed, per_gpu, now)
            if decision is not None and decision.decision == "Admitted" and decision.policy:
                gpus = pod_gpus(pod)
                for table, dollars in ((usage, 0.0), (committed, per_gpu.get(decision.policy,
                                                                             0.0) * gpus)):
                    table[decision.policy] = table.get(decision.policy, Usage()).plus(
                        gpus=gpus, price_per_hour=dollars)
                self._unpriced.add(decision.policy)
        await self._publish_status(policies, usage, per_gpu)

    def _unpriced_gpus(self) -> dict[str, int]:
        """GPUs (at least 1 a pod) per policy of counted pods no cloud has priced yet, and of
        pods admitted here that the watch does not show yet."""
        served = frozenset(self.node_names)
        out: dict[str, int] = {}
        for pod in self.pods.store.values():
            if counts_against_budget(pod, served=served) and not pod_price(pod):
                name = str(pod_policy(pod))
                out[name] = out.get(name, 0) + max(1, slim_gpus(pod))
        for name, gpus, _at in self._admitted.values():
            out[name] = out.get(name, 0) + max(1, gpus)
        return out

    def _prewarm_role(self, pod: Body) -> str | None:
        """``"now"`` for a surge pod of a Deployment being pre-warmed (admitted without waiting
        ``overflowAfter``), ``"hold"`` for a Pending pod of one whose surge is Ready (a
        replacement the scale-back removes: not admitted), None otherwise. Read from the intent
        annotation on the Deployment (prewarm_plan.admission_role), so it survives restarts."""
        if not self.prewarmed.store:
            return None
        intents: dict[str, prewarm_plan.Intent] = {}
        for key, dep in self.prewarmed.store.items():
            with contextlib.suppress(ValueError):
                intent = prewarm_plan.intent_of(dep)
                if intent is not None:
                    intents[key] = intent
        return prewarm_plan.admission_role(pod, intents)

    def _offer_estimates(self, policies: Iterable[pol.OverflowPolicy]) -> dict[str, float]:
        """Per policy with a $/h cap, the dearest $/GPU-h among the offers it could take, as
        the providers of the nodes it may use publish them (:mod:`~vkprovider.placement.
        offerprices`). Absent: some node published none (or junk), or no offer is known; then
        a capped policy with no priced pod admits one pod first."""
        out: dict[str, float] = {}
        for policy in policies:
            if policy.spec.limits.max_price_per_hour is None:
                continue
            nodes = [n for n in self.node_names
                     if not policy.spec.nodes or n in policy.spec.nodes]
            estimate = offerprices.policy_price_per_gpu(
                [(self.virtual_nodes.store.get(n) or {}).get("offerPrices") for n in nodes],
                providers=policy.spec.providers, gpu_types=policy.spec.gpu_types)
            if estimate is not None and estimate > 0:
                out[policy.name] = estimate
        return out

    def _price_per_gpu(self) -> dict[str, float]:
        """What one GPU of each policy costs outside, by policy: the average over its priced
        cloud pods now, else what they paid when this process last saw one priced (absent: no
        price known, and a $/h cap admits one pod until a cloud priced it). Another policy's
        prices are not used: its GPU types, and so its offers, may differ."""
        spent: dict[str, tuple[float, int]] = {}
        for pod in self.external():
            name = pod_policy(pod)
            price = pod_price(pod)
            if name and price:
                dollars, gpus = spent.get(name, (0.0, 0))
                spent[name] = (dollars + price, gpus + max(1, slim_gpus(pod)))
        now = {k: d / g for k, (d, g) in spent.items() if g}
        self._last_price_per_gpu.update(now)
        return {**self._last_price_per_gpu, **now}

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
        selected_by_any = False
        for policy in policies:
            selected, why = pol.policy_selects(policy, pod=pod, namespace_labels=ns_labels)
            if not selected:
                refusals.append((policy.name, why))
                continue
            selected_by_any = True
            wait = pol.parse_duration(policy.spec.overflow_after)
            credit = (self.preemptions.credit_for(pod)
                      if self.preemptions is not None and now - since < wait else None)
            prewarm = now - since < wait and self._prewarm_role(pod) == "now"
            if now - since < wait and credit is None and not prewarm:
                return None  # not yet: overflowAfter has not passed
            limits = policy.spec.limits
            if (limits.max_price_per_hour is not None and policy.name in self._unpriced
                    and not per_gpu.get(policy.name)):
                return None  # no price known yet: wait until the cloud priced the first one
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
            if credit is not None and self.preemptions is not None \
                    and not await self.preemptions.claim(credit, replacement=key):
                return None  # the credit could not be marked spent: a later pass tries again
            if await self._admit(pod, policy):
                self._refused.pop(meta["uid"], None)
                why = f"Unschedulable for {int(now - since)}s"
                if credit is not None and self.preemptions is not None:
                    self.metrics.preemption_fast_path.inc()
                    why = (f"replaces {credit.victim}, preempted by the scheduler: admitted "
                           f"without waiting overflowAfter")
                elif prewarm:
                    why = ("a pre-warm surge replica (its Deployment is pre-warmed for a Kueue "
                           "gang): admitted without waiting overflowAfter")
                return await self._record(pod, Decision(
                    pod=key, decision="Admitted", policy=policy.name,
                    reason=f"{why}; {gpus} GPU(s) within the policy's limits"))
            return None
        if not selected_by_any:
            # No policy is meant for this pod (a training gang's, say): not a refusal, so no
            # Warning on every pending pod; Warnings are for pods a policy selects and cannot
            # admit.
            return None
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
        rs = self.replicasets.store.get(f"{pod['metadata']['namespace']}/{owner['name']}")
        if rs is None or rs["metadata"].get("uid") != owner.get("uid"):
            return None  # not in the watch (yet), or gone
        replicas = int((rs.get("spec") or {}).get("replicas") or 0)
        if replicas <= 0:
            return None
        served = frozenset(self.node_names)
        external = sum(1 for p in self.pods.store.values()
                       if counts_against_budget(p, served=served)
                       and any(o.get("uid") == owner.get("uid") for o in
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
        # counted from now on, whether or not the pod watch has shown the patch yet
        self._admitted[meta["uid"]] = (policy.name, pod_gpus(pod), time.monotonic())
        log.info("admitted to overflow", extra=kv(pod=f"{meta['namespace']}/{meta['name']}",
                                                  policy=policy.name))
        return True

    async def _record(self, pod: Body, decision: Decision) -> Decision:
        self.record_decision(decision)
        self.metrics.admissions.labels(decision.policy or "", decision.decision).inc()
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

    def _provider_objects(self) -> dict[str, Body]:
        """The GPUProvider objects by name, as watched (status included)."""
        return {str(o["metadata"]["name"]): o for o in self.gpu_providers.store.values()}

    async def _publish_status(self, policies: list[pol.OverflowPolicy],
                              usage: dict[str, Usage], per_gpu: dict[str, float]) -> None:
        providers = self._provider_objects()
        problems = policy_problems(policies=policies, providers=providers)
        now = datetime.now(UTC)
        live = set(self.policies.store)
        for table in (self._status_sent, self.decisions, self._last_price_per_gpu):
            for name in [n for n in table if n not in live]:
                del table[name]  # the policy is gone: forget it (bounded memory)
        for policy in policies:
            u = usage.get(policy.name, Usage())
            stored = (self.policies.store.get(policy.name) or {}).get("status") or {}
            sent = self._status_sent.get(policy.name)
            old = (sent if sent is not None else stored).get("conditions") or []
            status: Body = {
                "conditions": policy_conditions(policy=policy,
                                                problems=problems.get(policy.name, []),
                                                usage=u, providers=providers, old=old, now=now,
                                                price_per_gpu=per_gpu.get(policy.name, 0.0)),
                "observedGeneration": policy.generation,
                "externalPods": u.pods,
                "externalGPUs": u.gpus,
                "pricePerHour": round(u.price_per_hour, 4),
                "lastDecisions": [d.as_status() for d in self.decisions.get(policy.name, [])],
            }
            if sent == status:
                continue
            if sent is None and all(stored.get(k) == v for k, v in status.items()):
                self._status_sent[policy.name] = status  # already stored (e.g. before a restart)
                continue
            try:
                await self.client.patch(f"{POLICIES_PATH}/{policy.name}/status",
                                        {"status": status})
                self._status_sent[policy.name] = status
            except NotFoundError:
                continue


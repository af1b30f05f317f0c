"""Move-back: bring overflowed inference home, make-before-break, as soon as it fits inside.

Why it exists: a pod on the virtual node costs cloud money every hour it stays there. Evicting it
(what descheduler-style tools do) drops serving capacity until a replacement is ready; instead we
surge first and remove the cloud replica only once an internal one serves:

1. gate: an internal node fits the Deployment's pod template (resources incl. nvidia.com/gpu,
   nodeSelector, required affinity, taints, cordons) after pending pods' GPU demand and a
   headroom, continuously for ``stableFor``; the Deployment is not mid-rollout; no move of it is in
   flight; fewer than ``maxConcurrent`` moves run; the workload is out of its cooldown (which only
   failed moves start, ``moveBack.cooldown`` doubling with each further failure; after a success
   the fit has held through a whole move, so the workload's next replica may go at once);
2. record intent on the Deployment (annotation ``vkprovider.io/move-back``);
3. mark the virtual pod ``controller.kubernetes.io/pod-deletion-cost: "-2147483648"``;
4. surge N -> N+1 through the scale subresource, or raise the HPA's minReplicas when an HPA targets
   the Deployment (never fight the HPA over spec.replicas); the new pod has no toleration for the
   virtual node, so it can only land inside (the companion never admits it to overflow);
5. wait until an internal replica that was not there before is Ready and the Deployment has N+1
   available;
6. scale back to N: the ReplicaSet removes the lowest-cost pod, the virtual one, and the provider
   stops its instance;
7. on timeout, or when the surge pod cannot be scheduled any more: scale back to N (the
   ReplicaSet removes an unscheduled or not-ready pod before any ready one), unmark the virtual
   pod, and back the workload off (the cooldown doubles each time it fails).

No ping-pong: the fit subtracts what Kueue will place on those nodes next (Workloads with quota
reserved whose pods are not running, heads of ClusterQueues that fit their quota, and the part of
a gang queued behind another gang's quota that the holders' release does not cover;
:mod:`vkprovider.descheduler.kueue_demand`, under the policy's ``moveBack.holdWhileQueued``) and
the policy's ``moveBack.headroomGPUs``; GPUs of unhealthy nodes (a health taint, a withdrawn GPU)
never count. A move held back only by one of these is a ``MoveBackHeld`` event on the Deployment
saying which, once per change of reason, and ``vkprovider_moveback_held_total{reason}``.

Reads come from watches (informers of Nodes, Pods, ReplicaSets, Deployments and HPAs, and of
Kueue's Workloads, ClusterQueues, LocalQueues and ResourceFlavors when Kueue is installed), never a
GET per pod per pass nor a poll of the API server per second; a move waits for its Deployment or
pods to change. What is remembered per workload or pod is pruned when the object is gone, so no
map grows without bound.

Every outcome (``MovedBack``, ``MoveBackFailed``, and ``WouldMoveBack`` under ``dryRun``) is an
Event on the Deployment and a ``status.lastDecisions`` entry of the pod's OverflowPolicy, recorded
through the admission loop, which owns the policy status.

Restart safety: steps 6 and 7 are the same action, "take the surge back", so every recorded move
with no live task (a previous process wrote it, or its task died on an API error) is finished at
the next pass by doing it: whether that rolls forward or back is decided by the ReplicaSet's own
ranking (not-ready first, then deletion cost). The surge is taken back relative to the count now
(:func:`~vkprovider.descheduler.surge.scale_back`: an HPA or a person who scaled up meanwhile
keeps their replicas) in the same write that records it in the intent, so a restart never takes
it back twice; an HPA's floor is restored only while it is still the one the surge set. An HPA
at its ``maxReplicas`` has no room for a surge: the Deployment is skipped (a
``MoveBackSkipped`` Warning on it says so) instead of a move the API server refuses. Whether the
cloud replica is gone is read from the API (one GET of the pod), not from a watch cache that may
lag the Deployment's. Ready replicas never drop below N because nothing is removed before the
surge pod is ready.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from vkprovider.descheduler.admission import OverflowAdmission
from vkprovider.descheduler.crashpoint import crash_point
from vkprovider.descheduler.fit import (
    DEFAULT_HEALTH_TAINTS,
    Claim,
    find_fit,
    parse_health_taint,
    slim_node,
)
from vkprovider.descheduler.kueue_demand import upcoming_claims
from vkprovider.descheduler.kueueapi import KueueAPI
from vkprovider.descheduler.loophealth import loop_problem
from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.descheduler.objects import deployment_path as _dep_path
from vkprovider.descheduler.objects import deployment_ref as _dep_ref
from vkprovider.descheduler.objects import hpa_path as _hpa_path
from vkprovider.descheduler.objects import object_key as _key
from vkprovider.descheduler.objects import pod_ref as _pod_ref
from vkprovider.descheduler.policystatus import Decision
from vkprovider.descheduler.prewarm_plan import INTENT as PREWARM_INTENT
from vkprovider.descheduler.scoped import TaskScope
from vkprovider.descheduler.surge import (
    floor_to_restore,
    hpa_surge_floor,
    outcome_reason,
    pod_gone,
    scale_back_body,
    surge_body,
)
from vkprovider.errors import VKError
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.placement import policy as pol
from vkprovider.placement.budget import pod_policy

log = logging.getLogger(__name__)

Body = dict[str, Any]
INTENT = "vkprovider.io/move-back"
COST = "controller.kubernetes.io/pod-deletion-cost"
HOTSWAP_INTENT = "vkprovider.io/hot-swap"  # hotswap.INTENT (it imports this module)
LOWEST_COST = "-2147483648"


@dataclass
class Intent:
    pod: str  # name of the virtual pod being replaced
    pod_uid: str
    replicas: int  # N before the surge
    started: float  # epoch seconds
    policy: str
    hpa: str | None = None
    hpa_min: int | None = None
    hpa_floor: int | None = None  # the minReplicas the surge set (None: intents before it)
    scaled_back: int | None = None  # set in the write that took the surge back: to this count

    def dumps(self) -> str:
        return json.dumps(asdict(self))


class MoveBackError(VKError):
    """A move could not write what it needed (the Deployment kept changing under it); its intent
    stays and the next pass finishes it."""


@dataclass
class MoveResult:
    deployment: str
    result: str  # moved | rolled-back
    seconds: float
    min_ready: int
    desired: int
    reason: str


class MoveBack:
    def __init__(
        self,
        *,
        client: KubeClient,
        events: EventRecorder,
        node_names: Sequence[str],
        admission: OverflowAdmission,
        interval: float = 30.0,
        headroom_gpus: int = 0,
        poll: float = 1.0,
        metrics: CompanionMetrics | None = None,
        clock: Callable[[], float] = time.time,
        health_taints: Sequence[str] = DEFAULT_HEALTH_TAINTS,
        on_pod: Callable[[str, Body], None] | None = None,
        kueue: KueueAPI | None = None,
    ) -> None:
        self.metrics = metrics or CompanionMetrics()
        # also told of every pod change (the preemption fast path reads its victims here)
        self.on_pod = on_pod
        self.kueue = kueue or KueueAPI()
        kueue_base = self.kueue.base
        self.client = client
        self.events = events
        self.virtual = frozenset(node_names)  # the virtual nodes served (every one is "outside")
        self.admission = admission
        self.interval = interval
        self.headroom_gpus = headroom_gpus
        self.poll = poll
        self.clock = clock
        self.changed = asyncio.Event()  # a watched Deployment or pod changed: moves look again
        health = tuple(parse_health_taint(t) for t in health_taints)
        self.nodes = Informer(client=client, path="/api/v1/nodes", name="nodes",
                              transform=functools.partial(slim_node, health_taints=health))
        # every pod and every ReplicaSet: admission's watches (one view for budgets and moves),
        # run by the admission loop
        self.pods = admission.pods
        admission.pod_listeners.append(self._on_pod)
        self.replicasets = admission.replicasets
        self.deployments = Informer(client=client, path="/apis/apps/v1/deployments",
                                    name="deployments", handler=self._poke)
        self.hpas = Informer(client=client, path="/apis/autoscaling/v2/horizontalpodautoscalers",
                             name="hpas", transform=_slim_hpa, missing_ok=True)
        # Kueue (kueue_demand.py): what it places next; absent Kueue, empty and nothing changes
        self.workloads = Informer(client=client, path=f"{kueue_base}/workloads",
                                  name="kueue-workloads", transform=_slim_workload,
                                  missing_ok=True)
        self.cluster_queues = Informer(client=client, path=f"{kueue_base}/clusterqueues",
                                       name="clusterqueues", missing_ok=True)
        self.local_queues = Informer(client=client, path=f"{kueue_base}/localqueues",
                                     name="localqueues", missing_ok=True)
        self.flavors = Informer(client=client, path=f"{kueue_base}/resourceflavors",
                                name="kueue-flavors", missing_ok=True)
        self.fit_since: dict[str, float] = {}
        self.cooldown_until: dict[str, float] = {}
        self.failures: dict[str, int] = {}
        self.in_flight: dict[str, asyncio.Task[MoveResult]] = {}
        self.scope = TaskScope()  # the moves' tasks end with run(): none outlives leadership
        self.results: collections.deque[MoveResult] = collections.deque(maxlen=_KEEP_RESULTS)
        self._skipped: dict[str, str] = {}
        self._held: dict[str, str] = {}  # Deployment -> why its move is held, as last told
        self._hpa_told: dict[str, str] = {}  # Deployment -> why its HPA leaves no room, as told
        self.informers: tuple[Informer, ...] = (
            self.nodes, self.deployments, self.hpas,
            self.workloads, self.cluster_queues, self.local_queues, self.flavors)
        if not self.kueue.usable:  # a Kueue this code does not speak: its objects count as none
            kueue_informers = (self.workloads, self.cluster_queues, self.local_queues,
                               self.flavors)
            self.informers = tuple(i for i in self.informers if i not in kueue_informers)
            for idle in kueue_informers:
                idle.synced.set()
        self.beat: float | None = None  # time.monotonic() of the loop's last sign of life

    def _poke(self, _event: str, _obj: Body) -> None:
        self.changed.set()

    def _on_pod(self, event: str, obj: Body) -> None:
        self.changed.set()
        if self.on_pod is not None:
            self.on_pod(event, obj)

    async def _changed(self, timeout: float) -> None:
        """Wait until a watched Deployment or pod changes, or ``timeout``."""
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.changed.wait()

    def _deployment(self, dep: Body) -> Body:
        """The cached Deployment (fresh from the watch), or ``dep`` if it is gone."""
        return self.deployments.store.get(_key(dep), dep)

    async def run(self) -> None:
        """Pass every ``interval`` until cancelled (the companion cancels it when it stops or
        loses the leader Lease); the moves it started are cancelled with it."""
        try:
            async with asyncio.TaskGroup() as tg:
                for informer in self.informers:
                    tg.create_task(informer.run(), name=f"informer {informer.name}")
                for informer in (*self.informers, self.pods, self.replicasets):
                    await informer.synced.wait()
                await self.admission.policies.synced.wait()
                self.beat = time.monotonic()
                while True:
                    self.beat = time.monotonic()
                    try:
                        await self.pass_once()
                    except APIError as exc:
                        log.warning("move-back pass failed", extra=kv(error=str(exc)))
                    await asyncio.sleep(self.interval)
        finally:
            await self.scope.close()

    def problem(self, *, now: float, stale_after: float) -> str | None:
        """Why this loop is not healthy (``/healthz``), or None: every watch has synced and the
        loop showed life (a pass, or one recovered move) within ``stale_after`` seconds."""
        return loop_problem(loop="move-back", informers=self.informers, beat=self.beat, now=now,
                            stale_after=stale_after)

    def _decide(self, *, policy: str, pod: str, decision: str, reason: str) -> None:
        """Record a move-back decision in the policy's ``status.lastDecisions``."""
        self.admission.record_decision(Decision(pod=pod, decision=decision, reason=reason,
                                                policy=policy))

    # ---- recovery: finish every recorded move that has no live task ---------------------------

    async def recover(self) -> None:
        """Finish every recorded move with no live task, and wait for them (at start, and on
        every pass without waiting: :meth:`_recover_orphans`)."""
        self._recover_orphans()
        tasks = list(self.in_flight.values())
        if tasks:
            await asyncio.wait(tasks)

    def _recover_orphans(self) -> None:
        """A recorded move whose task is not running here (a previous process wrote it, or its
        task died on an API error) is finished now, in its own task: take the surge back (the
        ReplicaSet decides forward or back), then clear the intent. Until then the gate skips
        the Deployment, so no second move is started over it."""
        for key, dep in list(self.deployments.store.items()):
            raw = (dep["metadata"].get("annotations") or {}).get(INTENT)
            if not raw or key in self.in_flight:
                continue
            self.in_flight[key] = self.scope.spawn(
                self._recover_one(dep, str(raw)), name=f"move-back recovery {key}")

    async def _recover_one(self, dep: Body, raw: str) -> MoveResult:
        self.beat = time.monotonic()
        key = _key(dep)
        try:
            intent = Intent(**json.loads(raw))
        except (TypeError, ValueError):
            log.error("unreadable move-back intent; clearing", extra=kv(deployment=key))
            await self._clear_intent(dep)
            return MoveResult(deployment=key, result="skipped", seconds=0, min_ready=0,
                              desired=0, reason="unreadable intent cleared")
        log.info("finishing a recorded move that has no live task",
                 extra=kv(deployment=key, pod=intent.pod))
        return await self._finish(dep, intent, raw, ok=None,
                                  reason="the move was interrupted (companion restart or error)",
                                  min_ready=int((dep.get("status") or {}).get("readyReplicas")
                                                or 0))

    # ---- the gate ------------------------------------------------------------------------------

    def _policies(self) -> dict[str, pol.OverflowPolicy]:
        return {p.name: p for p in self.admission.parsed_policies()}

    async def pass_once(self) -> None:
        self._reap()
        self._prune()
        self._recover_orphans()
        policies = self._policies()
        now = self.clock()
        seen: set[str] = set()
        claims: list[Claim] | None = None  # computed once per pass, when a fit needs them
        for pod in list(self.pods.store.values()):
            if (pod["spec"]["nodeName"] not in self.virtual
                    or pod["metadata"]["deletionTimestamp"]):
                continue
            if not pod["status"]["ready"]:
                continue
            policy = policies.get(pod_policy(pod) or "")
            if policy is None or not policy.spec.move_back.enabled:
                continue
            dep = self._deployment_of(pod)
            if dep is None or {PREWARM_INTENT, HOTSWAP_INTENT, INTENT} & set(
                    dep["metadata"].get("annotations") or {}):
                continue  # (a pre-warm, a hot-swap or a recorded move owns the count until done)
            key = _key(dep)
            if key in seen or key in self.in_flight:
                continue
            seen.add(key)
            if now < self.cooldown_until.get(key, 0.0):
                continue
            running = sum(1 for t in self.in_flight.values() if not t.done())
            if running >= policy.spec.move_back.max_concurrent:
                return
            if _mid_rollout(dep):
                self.fit_since.pop(key, None)
                continue
            full = self._hpa_full(dep)
            if full:
                self.fit_since.pop(key, None)
                await self._tell_skipped(dep, full)
                continue
            self._hpa_told.pop(key, None)
            if claims is None:
                claims = self.kueue_claims()
            move_back = policy.spec.move_back
            fit = find_fit(pod_spec=dep["spec"]["template"]["spec"],
                           nodes=self.nodes.store.values(), pods=self.pods.store.values(),
                           exclude_nodes=self.virtual, headroom_gpus=self.headroom_gpus,
                           claims=claims if move_back.hold_while_queued else (),
                           policy_headroom_gpus=move_back.headroom_gpus)
            if fit.node is None:
                self.fit_since.pop(key, None)
                await self._tell_held(dep, pod, fit.held, fit.held_by)
                continue
            self._held.pop(key, None)
            since = self.fit_since.setdefault(key, now)
            if now - since < policy.spec.move_back.stable_for_seconds:
                continue
            if policy.spec.dry_run:
                message = (f"dry run: would move {pod['metadata']['name']} back inside "
                           f"({fit.node} fits)")
                await self.events.emit(obj=_dep_ref(dep), reason="WouldMoveBack",
                                       message=message)
                self._decide(policy=policy.name, pod=_key(pod), decision="WouldMoveBack",
                             reason=message)
                self.cooldown_until[key] = now + policy.spec.move_back.cooldown_seconds
                continue
            self.in_flight[key] = self.scope.spawn(
                self._move(dep=dep, pod=pod, policy=policy), name=f"move-back {key}")

    def kueue_claims(self) -> list[Claim]:
        """What Kueue will place on internal nodes next (empty without Kueue)."""
        if not self.workloads.store:
            return []
        return upcoming_claims(
            workloads=self.workloads.store.values(), cluster_queues=self.cluster_queues.store,
            local_queues=self.local_queues.store, flavors=self.flavors.store,
            nodes=self.nodes.store.values(), pods=self.pods.store.values(),
            exclude_nodes=self.virtual)

    async def _tell_held(self, dep: Body, pod: Body, held: str, held_by: str) -> None:
        """A ``MoveBackHeld`` event (and count) when why a move is held changes; nothing per
        pass while it stays the same."""
        key = _key(dep)
        if not held:
            self._held.pop(key, None)
            return
        if self._held.get(key) == held:
            return
        self._held[key] = held
        self.metrics.held.labels(held_by).inc()
        message = f"Not moving {pod['metadata']['name']} back inside yet: {held}"
        log.info("move held", extra=kv(deployment=key, reason=held_by, why=held))
        await self.events.emit(obj=_dep_ref(dep), reason="MoveBackHeld", message=message)

    def _hpa_full(self, dep: Body) -> str:
        """Why an HPA leaves no room for a surge replica ("" when it does, or there is none)."""
        hpa = self._hpa_for(dep)
        if hpa is None:
            return ""
        n = int(dep["spec"].get("replicas") or 0)
        if hpa_surge_floor(hpa_min=_hpa_min(hpa), hpa_max=_hpa_max(hpa), replicas=n,
                           surge=1) is not None:
            return ""
        return (f"its HorizontalPodAutoscaler {hpa['metadata']['name']} is at maxReplicas "
                f"{_hpa_max(hpa)}: no room for the surge replica a move needs (raise "
                f"maxReplicas to move replicas home)")

    async def _tell_skipped(self, dep: Body, why: str) -> None:
        """A ``MoveBackSkipped`` Warning on the Deployment, once per change of reason."""
        key = _key(dep)
        if self._hpa_told.get(key) == why:
            return
        self._hpa_told[key] = why
        self.metrics.skipped.labels("the HPA is at maxReplicas").inc()
        log.warning("move-back skipped", extra=kv(deployment=key, why=why))
        await self.events.emit(obj=_dep_ref(dep), reason="MoveBackSkipped", type_="Warning",
                               message=f"Not moving replicas back inside: {why}")

    def _reap(self) -> None:
        self.metrics.in_flight.set(sum(1 for t in self.in_flight.values() if not t.done()))
        for key, task in list(self.in_flight.items()):
            if task.done():
                del self.in_flight[key]
                if task.cancelled():
                    continue
                exc = task.exception()
                if exc is not None:
                    log.error("move crashed", extra=kv(deployment=key, error=repr(exc)))

    def _deployment_of(self, pod: Body) -> Body | None:
        """The Deployment that owns ``pod`` through its ReplicaSet, from the watch caches."""
        meta = pod["metadata"]
        owners = meta["ownerReferences"]
        if not owners or owners[0].get("kind") != "ReplicaSet":
            self._skip(pod, "not owned by a ReplicaSet of a Deployment")
            return None
        rs = self.replicasets.store.get(f"{meta['namespace']}/{owners[0]['name']}")
        if rs is None:
            return None  # not in the cache yet (or gone): the next pass sees it
        dep_owner = next((o for o in rs["metadata"].get("ownerReferences") or []
                          if o.get("controller") and o.get("kind") == "Deployment"), None)
        if dep_owner is None:
            self._skip(pod, "its ReplicaSet is not owned by a Deployment")
            return None
        return self.deployments.store.get(f"{meta['namespace']}/{dep_owner['name']}")

    def _skip(self, pod: Body, why: str) -> None:
        uid = pod["metadata"]["uid"]
        if self._skipped.get(uid) == why:
            return
        self._skipped[uid] = why
        self.metrics.skipped.labels(why).inc()
        self.events.record(obj=_pod_ref(pod), reason="MoveBackSkipped", type_="Warning",
                           message=f"Not moved back: {why} (only Deployments are moved)")

    def _prune(self) -> None:
        """Forget what belongs to pods and Deployments that are gone (bounded memory)."""
        live_pods = {p["metadata"]["uid"] for p in self.pods.store.values()}
        for uid in [u for u in self._skipped if u not in live_pods]:
            del self._skipped[uid]
        live = set(self.deployments.store) | set(self.in_flight)
        for table in (self.fit_since, self.cooldown_until, self.failures, self._held,
                      self._hpa_told):
            for key in [k for k in table if k not in live]:
                del table[key]

    # ---- the move ------------------------------------------------------------------------------

    async def _move(self, *, dep: Body, pod: Body, policy: pol.OverflowPolicy) -> MoveResult:
        ns = dep["metadata"]["namespace"]
        key = _key(dep)
        n = int(dep["spec"].get("replicas") or 0)
        hpa = self._hpa_for(dep)
        floor = None
        if hpa is not None:
            floor = hpa_surge_floor(hpa_min=_hpa_min(hpa), hpa_max=_hpa_max(hpa), replicas=n,
                                    surge=1)
            if floor is None:  # (the gate saw room; the HPA changed since)
                return MoveResult(deployment=key, result="skipped", seconds=0, min_ready=n,
                                  desired=n, reason="the HPA has no room for a surge replica")
        intent = Intent(pod=pod["metadata"]["name"], pod_uid=pod["metadata"]["uid"], replicas=n,
                        started=self.clock(), policy=policy.name,
                        hpa=hpa["metadata"]["name"] if hpa else None,
                        hpa_min=_hpa_min(hpa) if hpa else None, hpa_floor=floor)
        raw = intent.dumps()
        try:
            written = await self.client.patch(_dep_path(dep), {"metadata": {
                "resourceVersion": dep["metadata"]["resourceVersion"],
                "annotations": {INTENT: raw}}})
        except (ConflictError, NotFoundError):
            return MoveResult(deployment=key, result="skipped", seconds=0, min_ready=n,
                              desired=n, reason="the Deployment changed; will look again")
        crash_point("move-back: intent recorded")
        rs_uid = pod["metadata"]["ownerReferences"][0]["uid"]
        self.admission.hold.add(rs_uid)  # the surge pod must never be admitted to overflow
        before = {p["metadata"]["uid"] for p in self.pods.store.values()
                  if p["metadata"]["ownerReferences"]
                  and p["metadata"]["ownerReferences"][0].get("uid") == rs_uid}
        await self.events.emit(obj=_dep_ref(dep), reason="MoveBackStarted",
                               message=f"Moving {intent.pod} back inside: surge {n} -> {n + 1}")
        min_ready = n
        cur = dep
        try:
            # From here on every way out finishes the move (forward or back): an error of the
            # surge is a rollback, never a task that dies leaving its intent behind.
            try:
                with contextlib.suppress(NotFoundError):
                    await self.client.patch(f"/api/v1/namespaces/{ns}/pods/{intent.pod}",
                                            {"metadata": {"annotations": {COST: LOWEST_COST}}})
                crash_point("move-back: deletion cost written")
                if hpa is not None:
                    await self.client.patch(_hpa_path(hpa), {"spec": {"minReplicas": floor}})
                elif await self._write_deployment(
                        dep, lambda d: surge_body(d, key=INTENT, raw=raw, n=n), suffix="/scale",
                        first=written) is None:
                    return await self._finish(cur, intent, raw, ok=False, min_ready=min_ready,
                                              reason="the Deployment was scaled by someone "
                                                     "else before the surge")
                crash_point("move-back: surge written")
            except APIError as exc:
                return await self._finish(cur, intent, raw, ok=False, min_ready=min_ready,
                                          reason=f"the surge was refused: {exc}")
            deadline = intent.started + policy.spec.move_back.timeout_seconds
            ok = False
            reason = "timed out waiting for the internal replica"
            unschedulable_since: float | None = None
            while self.clock() < deadline:
                await self._changed(self.poll)
                cur = self._deployment(dep)
                status = cur.get("status") or {}
                min_ready = min(min_ready, int(status.get("readyReplicas") or 0))
                fresh = [p for p in self.pods.store.values()
                         if p["metadata"]["ownerReferences"]
                         and p["metadata"]["ownerReferences"][0].get("uid") == rs_uid
                         and p["metadata"]["uid"] not in before
                         and not p["metadata"]["deletionTimestamp"]]
                if any(p["status"]["ready"] and p["spec"]["nodeName"]
                       and p["spec"]["nodeName"] not in self.virtual for p in fresh) and int(
                        status.get("availableReplicas") or 0) >= n + 1:
                    ok, reason = True, "the internal replica is ready"
                    break
                if any(not p["spec"]["nodeName"] for p in fresh):
                    unschedulable_since = unschedulable_since or self.clock()
                    fit = find_fit(pod_spec=dep["spec"]["template"]["spec"],
                                   nodes=self.nodes.store.values(), pods=[],
                                   exclude_nodes=self.virtual)
                    if fit.node is None and self.clock() - unschedulable_since > 5 * self.poll:
                        reason = f"internal capacity vanished: {fit.reason}"
                        break
                else:
                    unschedulable_since = None
            return await self._finish(cur, intent, raw, ok=ok, reason=reason,
                                      min_ready=min_ready)
        finally:
            self.admission.hold.discard(rs_uid)

    async def _write_deployment(self, dep: Body, body_for: Callable[[Body], Body | None], *,
                                suffix: str = "", first: Body | None = None) -> Body | None:
        """Patch the Deployment (``suffix`` ``/scale`` for the scale subresource) with
        ``body_for(current)`` under its resourceVersion, ``current`` being ``first`` and then the
        watch cache: a conflict waits for the cache to catch up and decides again. Returns what
        the server answered, or None when ``body_for`` finds nothing to write (None) or the
        Deployment is gone. Raises :class:`MoveBackError` when it keeps changing."""
        cur = first
        for _ in range(_WRITE_ATTEMPTS):
            if cur is None:
                cur = self._deployment(dep)
            body = body_for(cur)
            if body is None:
                return None
            try:
                answer: Body = await self.client.patch(f"{_dep_path(dep)}{suffix}", body)
                return answer
            except NotFoundError:
                return None
            except ConflictError:
                await self._changed(self.poll)
                cur = None
        raise MoveBackError(f"{_key(dep)} kept changing: gave up writing it after "
                            f"{_WRITE_ATTEMPTS} attempts")

    async def _restore_floor(self, *, ns: str, name: str, surged_to: int, original: int) -> None:
        """Put an HPA's ``minReplicas`` back to ``original`` while it is still the floor the
        surge set (under the HPA's resourceVersion); a floor someone changed since is left."""
        for _ in range(_WRITE_ATTEMPTS):
            hpa = self.hpas.store.get(f"{ns}/{name}")
            if hpa is None:
                return
            current = int(hpa["spec"].get("minReplicas") or 1)
            if not floor_to_restore(current=current, surged_to=surged_to, original=original):
                log.info("HPA floor changed by someone else; left as it is",
                         extra=kv(hpa=f"{ns}/{name}", floor=current, ours=surged_to))
                return
            try:
                await self.client.patch(_hpa_path(hpa), {"metadata": {
                    "resourceVersion": hpa["metadata"]["resourceVersion"]},
                    "spec": {"minReplicas": original}})
                crash_point("move-back: HPA floor restored")
                return
            except NotFoundError:
                return
            except ConflictError:
                await asyncio.sleep(self.poll)  # the HPA cache catches up; decide again
        raise MoveBackError(f"HPA {ns}/{name} kept changing: could not restore its floor")

    async def _finish(self, dep: Body, intent: Intent, raw: str, *, ok: bool | None, reason: str,
                      min_ready: int) -> MoveResult:
        """Take the surge back (forward or back, the ReplicaSet decides), judge, clean up.

        ``raw`` is the intent as recorded on the Deployment: the scale-back is written only while
        it is still there, in one write with the intent marked ``scaled_back`` (so a restart in
        between never takes the surge back twice)."""
        key = _key(dep)
        ns = dep["metadata"]["namespace"]
        n = intent.replicas
        back = intent.scaled_back
        generation = 0
        if back is None:
            if intent.hpa:
                await self._restore_floor(
                    ns=ns, name=intent.hpa, original=intent.hpa_min or 1,
                    surged_to=intent.hpa_floor or max(intent.hpa_min or 1, n + 1))
            written = await self._write_deployment(
                dep, lambda d: scale_back_body(d, key=INTENT, raw=raw, intent=intent))
            if written is None:  # gone, or the intent is no longer (or not yet) in the cache
                return MoveResult(deployment=key, result="skipped", seconds=0,
                                  min_ready=min_ready, desired=n,
                                  reason="the intent is gone; nothing to finish here")
            back = int(written["spec"].get("replicas") or 0)
            generation = int(written["metadata"].get("generation") or 0)
            crash_point("move-back: surge taken back")
        # Wait until the ReplicaSet settled on the count, watching readiness the whole time.
        deadline = self.clock() + 120
        while self.clock() < deadline:
            cur = self._deployment(dep)
            status = cur.get("status") or {}
            min_ready = min(min_ready, int(status.get("readyReplicas") or 0))
            if int(status.get("replicas") or 0) <= back and (
                    int(status.get("observedGeneration") or 0)
                    >= max(generation, int(cur["metadata"].get("generation") or 0))):
                break
            await self._changed(self.poll)
        # One consistent read of the cloud pod: the pod cache may lag the Deployment's.
        try:
            current: Body | None = await self.client.get(
                f"/api/v1/namespaces/{ns}/pods/{intent.pod}")
        except NotFoundError:
            current = None
        virtual_gone = pod_gone(current, uid=intent.pod_uid)
        moved = virtual_gone
        reason = outcome_reason(reason=reason, ready=ok, gone=moved, recorded=n,
                                back=back)
        if not virtual_gone:
            with contextlib.suppress(NotFoundError):  # it stays: unmark it
                await self.client.patch(f"/api/v1/namespaces/{ns}/pods/{intent.pod}",
                                        {"metadata": {"annotations": {COST: None}}})
        # Reported (the Event written, not only queued) before the intent is cleared: a crash
        # right after the clear must not lose a move that worked, since nothing judges it again;
        # a crash between the two finishes it again from the intent and reports it twice, never
        # not at all.
        seconds = max(0.0, self.clock() - intent.started)
        result = MoveResult(deployment=key, result="moved" if moved else "rolled-back",
                            seconds=round(seconds, 2), min_ready=min_ready, desired=n,
                            reason=reason)
        self.results.append(result)
        self.metrics.moves.labels(result.result).inc()
        self.metrics.move_seconds.observe(seconds)
        self.metrics.min_ready_ratio.set(min_ready / n if n else 1.0)
        pod_key = f"{ns}/{intent.pod}"
        if moved:
            self.failures.pop(key, None)
            self.cooldown_until[key] = self.clock() + self._cooldown(intent, base=True)
            message = (f"{intent.pod} replaced by an internal replica in {seconds:.0f}s; ready "
                       f"replicas never below {min_ready} (desired {n})")
            await self.events.emit(obj=_dep_ref(dep), reason="MovedBack", message=message)
            self._decide(policy=intent.policy, pod=pod_key, decision="MovedBack",
                         reason=f"{key}: {message}")
        else:
            self.failures[key] = self.failures.get(key, 0) + 1
            self.cooldown_until[key] = self.clock() + self._cooldown(intent, base=False,
                                                                     key=key)
            message = f"Rolled back the move of {intent.pod}: {reason}"
            await self.events.emit(obj=_dep_ref(dep), reason="MoveBackFailed", type_="Warning",
                                   message=message)
            self._decide(policy=intent.policy, pod=pod_key, decision="MoveBackFailed",
                         reason=f"{key}: {message}")
        log.info("move finished", extra=kv(**asdict(result)))
        await self.events.flush()
        await self._clear_intent(dep)
        crash_point("move-back: intent cleared")
        return result

    def _cooldown(self, intent: Intent, *, base: bool, key: str = "") -> float:
        policy = self._policies().get(intent.policy)
        seconds = policy.spec.move_back.cooldown_seconds if policy else 300.0
        if base:
            # After a success the fit has held through a whole move: the next replica of the
            # workload may go at the next pass. The cooldown is for workloads whose moves fail.
            return 0.0
        return float(seconds * 2 ** min(self.failures.get(key, 1) - 1, 6))

    async def _clear_intent(self, dep: Body) -> None:
        with contextlib.suppress(NotFoundError):
            await self.client.patch(_dep_path(dep), {"metadata": {"annotations": {INTENT: None}}})

    def _hpa_for(self, dep: Body) -> Body | None:
        ns, name = dep["metadata"]["namespace"], dep["metadata"]["name"]
        for hpa in self.hpas.store.values():
            ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            if (hpa["metadata"].get("namespace") == ns and ref.get("kind") == "Deployment"
                    and ref.get("name") == name):
                return hpa
        return None


_KEEP_RESULTS = 256  # recent moves kept in memory (bench and tests read them)
_WRITE_ATTEMPTS = 30  # conditional writes of a Deployment before a move gives up (next pass)


def _hpa_min(hpa: Body) -> int:
    return int(hpa["spec"].get("minReplicas") or 1)


def _hpa_max(hpa: Body) -> int | None:
    value = hpa["spec"].get("maxReplicas")
    return int(value) if value is not None else None




def _slim_hpa(obj: Body) -> Body:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "spec": {"scaleTargetRef": spec.get("scaleTargetRef") or {},
                     "minReplicas": spec.get("minReplicas"),
                     "maxReplicas": spec.get("maxReplicas")}}


def _slim_workload(obj: Body) -> Body:
    """A Kueue Workload as kueue_demand needs it (pod templates cut to their requests)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    podsets = [{"name": p.get("name"), "count": p.get("count"), "template": {"spec": {
        "containers": [{"resources": c.get("resources") or {}}
                       for c in ((p.get("template") or {}).get("spec") or {}).get("containers")
                       or []]}}} for p in spec.get("podSets") or []]
    status = obj.get("status") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "uid": meta.get("uid"), "creationTimestamp": meta.get("creationTimestamp"),
                         "ownerReferences": meta.get("ownerReferences") or []},
            "spec": {"queueName": spec.get("queueName"), "priority": spec.get("priority"),
                     "active": spec.get("active"), "podSets": podsets},
            "status": {"conditions": status.get("conditions") or [],
                       "admission": status.get("admission")}}


def _mid_rollout(dep: Body) -> bool:
    spec, status = dep.get("spec") or {}, dep.get("status") or {}
    want = int(spec.get("replicas") or 0)
    return (int(status.get("observedGeneration") or 0) < int(dep["metadata"].get("generation")
                                                               or 0)
            or int(status.get("updatedReplicas") or 0) != want
            or int(status.get("replicas") or 0) != want
            or int(status.get("availableReplicas") or 0) < want)





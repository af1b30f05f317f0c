"""Pre-warm: a Kueue AdmissionCheck that surges inference onto the cloud before a gang lands.

Why it exists: without it the way out is break-before-make. Kueue admits a training gang, the
scheduler preempts inference replicas for it, their replacements overflow, and only then does a
cloud instance boot and load weights: the site serves with fewer replicas for all that time.
With this check in the gang's ClusterQueue (``spec.admissionChecksStrategy``), Kueue holds the
gang, quota reserved, until the replicas it will displace already serve from the cloud:

1. for a Workload with ``QuotaReserved`` and this check ``Pending``, compute what its pods
   displace (:func:`~vkprovider.descheduler.prewarm_plan.displacement`: the gang's GPUs against
   free internal GPUs per node, whole pods, on the nodes of the flavor Kueue assigned and the
   template's selectors), victims among pods an OverflowPolicy with ``prewarm.enabled`` selects,
   lowest priority first, only below the gang's priority;
2. group them by Deployment; record the intent on each (annotation ``vkprovider.io/prewarm``,
   label ``vkprovider.io/prewarm=true``), then surge it by its count (scale subresource, or the
   HPA's ``minReplicas`` when one targets it);
3. overflow admission sees the label and admits the surge pods to the virtual node at once (no
   ``overflowAfter``: inside they cannot fit, that is the point);
4. until then, plan the displacement again on every pass: what the first plan counted as free
   GPUs fills up (the scheduler puts surge replicas there while there is room), and a gang that
   displaces more than was surged would preempt replicas nobody pre-warmed. Where it grew, the
   intent is rewritten with the bigger surge, then the Deployment scaled to it, and a
   ``PrewarmGrown`` Event says so (:func:`~vkprovider.descheduler.prewarm_plan.grow`; never
   smaller while pending);
   once each Deployment has ``N + surge`` Ready replicas (readiness probes, on the cloud) and the
   plan did not grow, mark the intents ``Ready`` and set the check ``Ready``; Kueue admits the
   gang;
5. when the gang's pods are bound (or every expected victim is gone), take each surge back,
   relative to the Deployment's count now (:func:`~vkprovider.descheduler.surge.scale_back`: an
   HPA or a person who scaled up meanwhile keeps their replicas): the ReplicaSet removes the
   Pending replacements of the preempted replicas first (admission holds them meanwhile, so no
   instance starts for nothing), and the cloud replicas keep serving until move-back brings
   them home.

Fail-safe: a pre-warm not Ready within the policy's ``prewarm.timeout`` (no capacity, budget,
cloud errors) is undone (scale back to N) and the check goes ``Ready`` anyway with a Warning
Event (training is never blocked by inference), or ``Retry`` under ``onTimeout: Retry``.

Restart safety: every step is decided by :func:`~vkprovider.descheduler.prewarm_plan.next_action`
from the API alone (the Workload's check state and the intents on Deployments). The surge sets an
absolute value (``replicas = N + surge``); the scale-back is written together with the intent
marked ``scaled_back`` (one write, under the resourceVersion), so a companion killed at any step
finishes the story when it comes back, never surges twice and never takes a surge back twice. An
outcome recorded on the intents is written to the check whenever the check is still Pending on a
Workload holding quota (:func:`~vkprovider.descheduler.prewarm_plan.outcome_to_write`), so a crash
between the two writes does not leave the gang waiting a second timeout. The wait for a blocked
Deployment counts from ``QuotaReserved``, not from queueing. An API error on one Workload backs
that Workload off (:mod:`~vkprovider.descheduler.backoff`) and leaves the others alone.

The AdmissionChecks it serves (``spec.controllerName: vkprovider.io/prewarm``) are kept
``Active=True``; one whose ``spec.parameters`` make no sense is ``Active=False`` with reason
``InvalidParameters`` naming the field, and a Warning Event (Kueue then holds its ClusterQueue).

Reads come from watches: its own informers of Workloads, AdmissionChecks, ResourceFlavors and
surged Deployments (label selector), and move-back's caches of pods, nodes, ReplicaSets,
Deployments and HPAs, which it only reads. It looks again on every change of its own watches,
and every ``tick`` seconds while a pre-warm is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from vkprovider.descheduler import prewarm_plan as plan
from vkprovider.descheduler.admission import OverflowAdmission
from vkprovider.descheduler.backoff import Backoff
from vkprovider.descheduler.crashpoint import crash_point
from vkprovider.descheduler.kueueapi import KueueAPI
from vkprovider.descheduler.loophealth import loop_problem
from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.descheduler.moveback import INTENT as MOVE_BACK_INTENT
from vkprovider.descheduler.moveback import MoveBack, MoveBackError
from vkprovider.descheduler.objects import deployment_path as _dep_path
from vkprovider.descheduler.objects import deployment_ref as _dep_ref
from vkprovider.descheduler.objects import object_key as _key
from vkprovider.descheduler.policystatus import Decision
from vkprovider.descheduler.surge import scale_back
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.placement import policy as pol
from vkprovider.semantics.timefmt import TimeFormatError, format_time, parse_time

log = logging.getLogger(__name__)

Body = dict[str, Any]
FIELD_MANAGER = "vkprovider-prewarm"
REASON_INVALID_PARAMETERS = plan.REASON_INVALID_PARAMETERS
DEFAULT_TIMEOUT = 300.0  # when no policy is left to say (it was deleted mid-pre-warm)


class Prewarm:
    def __init__(
        self,
        *,
        client: KubeClient,
        events: EventRecorder,
        node_names: Sequence[str],
        admission: OverflowAdmission,
        moveback: MoveBack,
        interval: float = 10.0,
        tick: float = 1.0,
        metrics: CompanionMetrics | None = None,
        clock: Callable[[], float] = time.time,
        kueue: KueueAPI | None = None,
    ) -> None:
        self.client = client
        self.kueue = kueue or KueueAPI()
        base = self.kueue.base
        self.events = events
        self.virtual = frozenset(node_names)
        self.admission = admission
        self.moveback = moveback
        self.interval = interval
        self.tick = tick
        self.metrics = metrics or moveback.metrics
        self.clock = clock
        self._wake = asyncio.Event()
        self.workloads = Informer(client=client, path=f"{base}/workloads", name="workloads",
                                  handler=self._poke, missing_ok=True)
        self.checks = Informer(client=client, path=f"{base}/admissionchecks",
                               name="admissionchecks", handler=self._poke, missing_ok=True)
        self.flavors = Informer(client=client, path=f"{base}/resourceflavors",
                                name="resourceflavors", missing_ok=True)
        self.surged = Informer(client=client, path="/apis/apps/v1/deployments",
                               params={"labelSelector": f"{plan.LABEL}=true"},
                               name="prewarmed-deployments", handler=self._poke)
        self.informers: tuple[Informer, ...] = (self.workloads, self.checks, self.flavors,
                                                self.surged)
        if not self.kueue.usable:
            # A Kueue this code does not speak: only its AdmissionChecks are read (to mark ours
            # inactive, through the version it serves); Workloads and flavors are left alone.
            self.informers = (self.checks, self.surged)
            for idle in (self.workloads, self.flavors):
                idle.synced.set()
        self._active_sent: dict[str, tuple[str, str, str]] = {}
        self._told: dict[str, str] = {}  # workload uid -> last waiting message written
        self._backoff = Backoff(base=tick, cap=max(60.0, interval))  # per Workload uid
        self.beat: float | None = None

    def _poke(self, _event: str, _obj: Body) -> None:
        self._wake.set()

    # ---- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for informer in self.informers:
                tg.create_task(informer.run(), name=f"informer {informer.name}")
            for informer in (*self.informers, self.moveback.pods, self.moveback.nodes,
                             self.moveback.replicasets, self.moveback.deployments,
                             self.moveback.hpas, self.admission.policies,
                             self.admission.namespaces):
                await informer.synced.wait()
            while True:
                self.beat = time.monotonic()
                busy = False
                try:
                    busy = await self.pass_once()
                except APIError as exc:
                    log.warning("pre-warm pass failed", extra=kv(error=str(exc)))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(),
                                           timeout=self.tick if busy else self.interval)
                await asyncio.sleep(0.1)  # coalesce bursts of events into one pass

    def problem(self, *, now: float, stale_after: float) -> str | None:
        """Why this loop is not healthy (``/healthz``), or None."""
        return loop_problem(loop="pre-warm", informers=self.informers, beat=self.beat, now=now,
                            stale_after=stale_after)

    async def pass_once(self) -> bool:
        """One look at everything; True while a pre-warm is in flight (look again soon)."""
        policies = self._policies()
        ours = await self._keep_checks_active(policies)
        intents = self._intents()
        by_workload: dict[str, list[tuple[plan.Intent, Body]]] = {}
        for intent, dep in intents:
            by_workload.setdefault(intent.workload_uid, []).append((intent, dep))
        surged = sum(i.surge for i, _ in intents if i.phase != plan.RESTORING)
        self.metrics.prewarm_surge_replicas.set(surged)
        seen: set[str] = set()
        busy = bool(intents)
        now = self.clock()
        for wl in list(self.workloads.store.values()):
            uid = str(wl["metadata"].get("uid"))
            check = next((c["name"] for c in (wl.get("status") or {}).get("admissionChecks")
                          or [] if c.get("name") in ours), None)
            if check is None and uid not in by_workload:
                continue
            seen.add(uid)
            busy |= await self._isolated(uid, _key(wl), now, self._reconcile(
                wl, check or by_workload[uid][0][0].check, ours.get(check or ""),
                by_workload.get(uid, []), policies))
        for uid, recorded in by_workload.items():
            if uid not in seen:  # the Workload is gone: undo what was done for it
                seen.add(uid)
                await self._isolated(uid, recorded[0][0].workload, now, self._reconcile(
                    None, recorded[0][0].check, None, recorded, policies))
        for uid in [u for u in self._told if u not in seen]:
            del self._told[uid]
        self._backoff.keep(seen)
        return busy

    async def _isolated(self, uid: str, name: str, now: float,
                        step: Coroutine[Any, Any, bool]) -> bool:
        """Run one Workload's step; an API error there backs that Workload off (doubling) and
        leaves the others alone. True while it needs another look soon."""
        if not self._backoff.ready(uid, now=now):
            step.close()
            return True
        try:
            busy = await step
        except (APIError, MoveBackError) as exc:
            delay = self._backoff.failed(uid, now=now)
            log.warning("pre-warm step failed; backing this Workload off",
                        extra=kv(workload=name, error=str(exc), retry_in=round(delay, 1)))
            return True
        self._backoff.succeeded(uid)
        return busy

    # ---- AdmissionChecks -----------------------------------------------------------------------

    def _policies(self) -> dict[str, pol.OverflowPolicy | pol.PolicyError]:
        out: dict[str, pol.OverflowPolicy | pol.PolicyError] = {}
        for name, obj in self.admission.policies.store.items():
            try:
                out[name] = pol.parse_overflow_policy(obj)
            except pol.PolicyError as exc:
                out[name] = exc
        return out

    async def _keep_checks_active(self, policies: Mapping[str, pol.OverflowPolicy |
                                                          pol.PolicyError]) -> dict[str, Body]:
        """The AdmissionChecks this controller serves and can work with, by name; each gets its
        ``Active`` condition (written when it changes)."""
        usable: dict[str, Body] = {}
        for name, check in self.checks.store.items():
            if (check.get("spec") or {}).get("controllerName") != plan.CONTROLLER_NAME:
                continue
            status, reason, message = plan.check_active(check, policies,
                                                        kueue_problem=self.kueue.problem)
            if status == "True":
                usable[name] = check
            try:
                await self._write_active(check, status, reason, message)
            except APIError as exc:  # one check's status write failing stops no other
                log.warning("could not write an AdmissionCheck's Active condition",
                            extra=kv(check=name, error=str(exc)))
        for name in [n for n in self._active_sent if n not in self.checks.store]:
            del self._active_sent[name]
        return usable

    async def _write_active(self, check: Body, status: str, reason: str, message: str) -> None:
        name = check["metadata"]["name"]
        want = (status, reason, message)
        if self._active_sent.get(name) == want:
            return
        current: Body = next((c for c in (check.get("status") or {}).get("conditions") or []
                              if c.get("type") == "Active"), {})
        generation = int(check["metadata"].get("generation") or 0)
        if (current.get("status"), current.get("reason"), current.get("message")) == want and \
                current.get("observedGeneration") == generation:
            self._active_sent[name] = want
            return
        since = (current.get("lastTransitionTime") if current.get("status") == status
                 else None) or format_time(datetime.now(UTC))
        cond = {"type": "Active", "status": status, "reason": reason, "message": message,
                "observedGeneration": generation, "lastTransitionTime": since}
        others = [c for c in (check.get("status") or {}).get("conditions") or []
                  if c.get("type") != "Active"]
        try:
            await self.client.patch(f"{self.kueue.base}/admissionchecks/{name}/status",
                                    {"status": {"conditions": [*others, cond]}})
        except NotFoundError:
            return
        self._active_sent[name] = want
        ref = {"apiVersion": self.kueue.api_version, "kind": "AdmissionCheck",
               "metadata": check["metadata"]}
        if status == "False":
            await self.events.emit(obj=ref, reason="PrewarmCheckRefused", type_="Warning",
                                   message=f"AdmissionCheck {name} is not usable: {message}")
        else:
            await self.events.emit(obj=ref, reason="PrewarmCheckActive", message=message)

    # ---- one Workload --------------------------------------------------------------------------

    def _intents(self) -> list[tuple[plan.Intent, Body]]:
        out = []
        for dep in self.surged.store.values():
            try:
                intent = plan.intent_of(dep)
            except ValueError as exc:
                log.error("unreadable pre-warm intent; ignoring it",
                          extra=kv(deployment=_key(dep), error=str(exc)))
                continue
            if intent is not None:
                out.append((intent, dep))
        return out

    def _view(self, wl: Body | None, check: str,
              recorded: Sequence[tuple[plan.Intent, Body]]) -> plan.WorkloadView:
        if wl is None:
            return plan.WorkloadView(exists=False)
        conds = {c.get("type"): c.get("status") for c in (wl.get("status") or {}).get(
            "conditions") or []}
        state = next((c.get("state") for c in (wl.get("status") or {}).get("admissionChecks")
                      or [] if c.get("name") == check), None)
        owners = {o.get("uid") for o in wl["metadata"].get("ownerReferences") or []}
        total = sum(int(p.get("count") or 0) for p in (wl.get("spec") or {}).get("podSets")
                    or [])
        gang = [p for p in self.moveback.pods.store.values()
                if any(o.get("uid") in owners for o in p["metadata"]["ownerReferences"])
                and not p["metadata"].get("deletionTimestamp")
                and p["status"].get("phase") not in ("Succeeded", "Failed")]
        bound = bool(total) and len(gang) >= total and all(p["spec"].get("nodeName")
                                                           for p in gang)
        victims = [f"{dep['metadata']['namespace']}/{name}" for intent, dep in recorded
                   for name in intent.victims]
        gone = bool(victims) and all(
            (p := self.moveback.pods.store.get(v)) is None or p["metadata"].get(
                "deletionTimestamp") for v in victims)
        return plan.WorkloadView(exists=True, quota_reserved=conds.get("QuotaReserved") == "True",
                                 admitted=conds.get("Admitted") == "True",
                                 finished=conds.get("Finished") == "True", check_state=state,
                                 gang_bound=bound, victims_gone=gone,
                                 evicted=conds.get("Evicted") == "True")

    def _settings(self, names: Sequence[str], policies: Mapping[str, pol.OverflowPolicy |
                                                                   pol.PolicyError]
                  ) -> tuple[float, str]:
        """(timeout, onTimeout) over the policies involved: the shortest timeout; ``Retry`` only
        when every one of them says so (training is never blocked by default)."""
        found = [p for n in names if isinstance(p := policies.get(n), pol.OverflowPolicy)]
        if not found:
            return DEFAULT_TIMEOUT, "Proceed"
        timeout = min(p.spec.prewarm.timeout_seconds for p in found)
        retry = all(p.spec.prewarm.on_timeout == "Retry" for p in found)
        return timeout, "Retry" if retry else "Proceed"

    async def _reconcile(self, wl: Body | None, check: str, check_obj: Body | None,
                         recorded: list[tuple[plan.Intent, Body]],
                         policies: Mapping[str, pol.OverflowPolicy | pol.PolicyError]) -> bool:
        view = self._view(wl, check, recorded)
        names = ([i.policy for i, _ in recorded] if recorded
                 else self._check_policies(check_obj, policies))
        timeout, on_timeout = self._settings(names, policies)
        surged = [plan.Surged(intent=i, ready=_ready(self._fresh(d))) for i, d in recorded]
        action = plan.next_action(view, surged, now=self.clock(), timeout=timeout,
                                  on_timeout=on_timeout)
        if action.kind == "idle":
            return False
        if action.kind == "plan" and wl is not None:
            return await self._plan(wl, check, check_obj, policies, timeout, on_timeout)
        if (action.kind in ("surge", "ready") and wl is not None
                and plan.replanning(view, surged)
                and await self._replan(wl, check, check_obj, policies, recorded)):
            return True  # grown: wait for the bigger surge before marking anything Ready
        if action.kind == "surge":
            for intent, dep in recorded:
                await self._scale(self._fresh(dep), intent, intent.target)
            return True
        if action.kind == "ready" and wl is not None:
            await self._mark_ready(wl, check, recorded)
            return True
        if action.kind == "restore":
            await self._restore(wl, check, recorded, action)
            return True
        return False

    def _check_policies(self, check_obj: Body | None,
                        policies: Mapping[str, pol.OverflowPolicy | pol.PolicyError]
                        ) -> list[str]:
        """The policies a check pre-warms under: the one its parameters name, else every valid
        policy with ``prewarm.enabled``."""
        params = ((check_obj or {}).get("spec") or {}).get("parameters")
        if isinstance(params, Mapping) and params.get("name"):
            return [str(params["name"])]
        return sorted(n for n, p in policies.items()
                      if isinstance(p, pol.OverflowPolicy) and p.spec.prewarm.enabled)

    def _policy_for(self, pod: Body, names: Sequence[str],
                    policies: Mapping[str, pol.OverflowPolicy | pol.PolicyError]
                    ) -> pol.OverflowPolicy | None:
        ns = pod["metadata"].get("namespace")
        ns_labels = ((self.admission.namespaces.store.get(str(ns)) or {}).get("metadata")
                     or {}).get("labels") or {}
        full = {"metadata": pod["metadata"], "spec": {"priority": pod["spec"].get("priority")}}
        for name in names:
            policy = policies.get(name)
            if isinstance(policy, pol.OverflowPolicy) and pol.policy_selects(
                    policy, pod=full, namespace_labels=ns_labels)[0]:
                return policy
        return None

    def _displacement(self, wl: Body, check_obj: Body | None,
                      policies: Mapping[str, pol.OverflowPolicy | pol.PolicyError]
                      ) -> tuple[plan.Displacement, dict[str, pol.OverflowPolicy]]:
        """What the gang displaces now, from the caches, and the policy that pre-warms each
        victim (by pod uid). Victims other Workloads' pre-warms counted are not counted again
        (their GPUs go to those gangs); this Workload's own are."""
        names = self._check_policies(check_obj, policies)
        flavors = {name: dict((f.get("spec") or {}).get("nodeLabels") or {})
                   for name, f in self.flavors.store.items()}
        uid = str(wl["metadata"].get("uid"))
        claimed = {f"{d['metadata']['namespace']}/{v}" for i, d in self._intents()
                   if i.workload_uid != uid for v in i.victims}
        chosen: dict[str, pol.OverflowPolicy] = {}

        def prewarmable(pod: Body) -> bool:
            policy = self._policy_for(pod, names, policies)
            if policy is None or plan.deployment_of_pod(pod) is None:
                return False
            chosen[pod["metadata"]["uid"]] = policy
            return True

        found = plan.displacement(gang=plan.gang_of(wl, flavors),
                                  priority=plan.workload_priority(wl),
                                  nodes=self.moveback.nodes.store.values(),
                                  pods=self.moveback.pods.store.values(),
                                  exclude_nodes=self.virtual, prewarmable=prewarmable,
                                  claimed=claimed)
        return found, chosen

    def _blocked(self, key: str) -> tuple[Body | None, str]:
        """The cached Deployment, and why it cannot be surged now ("" when it can)."""
        dep = self.moveback.deployments.store.get(key)
        if dep is None:
            return None, f"{key} is not in the cache yet"
        annotations = dep["metadata"].get("annotations") or {}
        if MOVE_BACK_INTENT in annotations:
            return dep, f"{key} is mid move-back"
        if plan.INTENT in annotations:
            return dep, f"{key} is pre-warmed for another Workload"
        return dep, ""

    async def _plan(self, wl: Body, check: str, check_obj: Body | None,
                    policies: Mapping[str, pol.OverflowPolicy | pol.PolicyError],
                    timeout: float, on_timeout: str) -> bool:
        found, chosen = self._displacement(wl, check_obj, policies)
        groups = plan.group_by_deployment(found.victims)
        if not groups:
            message = f"nothing to pre-warm: {found.summary()}"
            self.metrics.prewarm_checks.labels("not-needed").inc()
            await self._event(wl, reason="PrewarmNotNeeded", message=message)
            await self._set_check(wl, check, "Ready", message)
            return False
        blocked = []
        deps: list[tuple[Body, list[Body]]] = []
        for key, victims in sorted(groups.items()):
            dep, why = self._blocked(key)
            if why:
                blocked.append(why)
            if dep is not None:
                deps.append((dep, victims))
        if blocked:
            return await self._wait_or_give_up(wl, check, "; ".join(blocked), timeout,
                                               on_timeout)
        dry = [chosen[v[0]["metadata"]["uid"]] for _d, v in deps
               if chosen[v[0]["metadata"]["uid"]].spec.dry_run]
        if dry:
            message = "dry run: would surge " + ", ".join(
                f"{_key(d)} by {len(v)}" for d, v in deps)
            self.metrics.prewarm_checks.labels("dry-run").inc()
            await self._event(wl, reason="WouldPrewarm", message=message)
            for name in sorted({p.name for p in dry}):
                self._decide(name, wl, "WouldPrewarm", message)
            await self._set_check(wl, check, "Ready", message)
            return False
        now = self.clock()
        started: list[str] = []
        for dep, victims in deps:
            line = await self._start(wl, check, dep, victims,
                                     chosen[victims[0]["metadata"]["uid"]], now)
            if line:
                started.append(line)
        if started:
            message = f"surging {', '.join(started)} on the virtual node; {found.summary()}"
            await self._event(wl, reason="PrewarmStarted", message=message)
            await self._set_check(wl, check, "Pending", message)
        return True

    async def _start(self, wl: Body, check: str, dep: Body, victims: Sequence[Body],
                     policy: pol.OverflowPolicy, now: float) -> str | None:
        """Record the intent on one Deployment, then surge it; ``"ns/name N -> N+s"``, or None
        when it changed since it was read (the next pass decides again)."""
        n = int((dep.get("spec") or {}).get("replicas") or 0)
        hpa = self._hpa_for(dep)
        intent = plan.Intent(
            workload=_key(wl), workload_uid=str(wl["metadata"]["uid"]), check=check,
            replicas=n, surge=len(victims), phase=plan.SURGING, started=now,
            policy=policy.name, victims=tuple(v["metadata"]["name"] for v in victims),
            hpa=hpa["metadata"]["name"] if hpa else None,
            hpa_min=int(hpa["spec"].get("minReplicas") or 1) if hpa else None)
        try:
            await self.client.patch(_dep_path(dep), {"metadata": {
                "resourceVersion": dep["metadata"]["resourceVersion"],
                "labels": {plan.LABEL: "true"},
                "annotations": {plan.INTENT: intent.dumps()}}})
        except (ConflictError, NotFoundError):
            return None
        crash_point("pre-warm: intent recorded")
        await self._scale(dep, intent, intent.target)
        text = (f"Pre-warming for Workload {_key(wl)}: surge {n} -> {intent.target} on the "
                f"virtual node (replaces {', '.join(intent.victims)})")
        await self.events.emit(obj=_dep_ref(dep), reason="PrewarmStarted", message=text)
        return f"{_key(dep)} {n} -> {intent.target}"

    async def _replan(self, wl: Body, check: str, check_obj: Body | None,
                      policies: Mapping[str, pol.OverflowPolicy | pol.PolicyError],
                      recorded: Sequence[tuple[plan.Intent, Body]]) -> bool:
        """Plan the displacement again while the check is Pending; grow the surge where the
        gang now displaces more than was surged (recorded first, then scaled: a restart reads
        the bigger target). True when something grew or started (wait before Ready)."""
        found, chosen = self._displacement(wl, check_obj, policies)
        mine = {_key(dep): intent for intent, dep in recorded}
        growth = plan.grow(intents=mine, victims=plan.group_by_deployment(found.victims))
        if not growth:
            return False
        changed: list[str] = []
        for key, (was, now) in growth.grown.items():
            dep = self._fresh(next(d for i, d in recorded if _key(d) == key))
            try:
                await self.client.patch(_dep_path(dep), {"metadata": {
                    "resourceVersion": dep["metadata"]["resourceVersion"],
                    "annotations": {plan.INTENT: now.dumps()}}})
            except (ConflictError, NotFoundError):
                continue  # changed since we looked: the next pass plans again
            crash_point("pre-warm: intent grown")
            await self._scale(dep, now, now.target)
            text = (f"Pre-warm for Workload {_key(wl)} grew: surge {now.replicas} -> "
                    f"{now.target} (was -> {was.target}); the gang now displaces "
                    f"{', '.join(now.victims)}")
            await self.events.emit(obj=_dep_ref(dep), reason="PrewarmGrown", message=text)
            log.info("pre-warm grew", extra=kv(workload=_key(wl), deployment=key,
                                               surge=now.surge, was=was.surge))
            changed.append(f"{key} {now.replicas} -> {now.target} (was -> {was.target})")
        at = self.clock()
        for key, victims in growth.new.items():
            other, why = self._blocked(key)
            if other is None or why:
                log.info("pre-warm cannot grow onto a Deployment yet",
                         extra=kv(workload=_key(wl), deployment=key, why=why))
                continue
            line = await self._start(wl, check, other, victims,
                                     chosen[victims[0]["metadata"]["uid"]], at)
            if line:
                changed.append(line)
        if not changed:
            return False
        message = f"the gang now displaces more: surging {', '.join(changed)}; {found.summary()}"
        await self._event(wl, reason="PrewarmGrown", message=message)
        await self._set_check(wl, check, "Pending", message)
        return True

    async def _wait_or_give_up(self, wl: Body, check: str, why: str, timeout: float,
                               on_timeout: str) -> bool:
        since = _since(plan.waiting_since(wl, check)) or self.clock()
        if self.clock() - since <= timeout:
            message = f"waiting: {why}"
            if self._told.get(wl["metadata"]["uid"]) != message:
                self._told[wl["metadata"]["uid"]] = message
                await self._set_check(wl, check, "Pending", message)
            return True
        state = "Retry" if on_timeout == "Retry" else "Ready"
        message = f"pre-warm timed out after {timeout:.0f}s ({why}); " + (
            "retrying later" if state == "Retry" else "proceeding without it")
        self.metrics.prewarm_checks.labels("retry" if state == "Retry" else "timed-out").inc()
        await self._event(wl, reason="PrewarmTimedOut", message=message, type_="Warning")
        await self._set_check(wl, check, state, message)
        return False

    async def _mark_ready(self, wl: Body, check: str,
                          recorded: list[tuple[plan.Intent, Body]]) -> None:
        now = self.clock()
        for intent, dep in recorded:
            if intent.phase != plan.SURGING:
                continue
            ready = intent.moved(phase=plan.READY, ready_at=now)
            with contextlib.suppress(NotFoundError):
                await self.client.patch(_dep_path(dep), {"metadata": {"annotations": {
                    plan.INTENT: ready.dumps()}}})
                crash_point("pre-warm: intent marked Ready")
            seconds = now - intent.started
            self.metrics.prewarm_seconds.observe(seconds)
            text = (f"{intent.surge} surge replica(s) Ready on the virtual node in "
                    f"{seconds:.0f}s, before Workload {intent.workload} is admitted")
            await self.events.emit(obj=_dep_ref(dep), reason="Prewarmed", message=text)
            self._decide(intent.policy, wl, "Prewarmed", f"{_key(dep)}: {text}")
        seconds = now - min(i.started for i, _ in recorded)
        message = ("pre-warmed " + ", ".join(f"{_key(d)} +{i.surge}" for i, d in recorded)
                   + f" on the virtual node: Ready in {seconds:.0f}s")
        state = next((c.get("state") for c in (wl.get("status") or {}).get("admissionChecks")
                      or [] if c.get("name") == check), None)
        if state != "Ready":
            if any(i.phase == plan.SURGING for i, _ in recorded):
                self.metrics.prewarm_checks.labels("ready").inc()
                await self._event(wl, reason="Prewarmed", message=message)
            await self._set_check(wl, check, "Ready", message)

    async def _restore(self, wl: Body | None, check: str,
                       recorded: list[tuple[plan.Intent, Body]], action: plan.Action) -> None:
        """Take each Deployment's surge back, relative to its count now (an HPA or a person who
        scaled up meanwhile keeps their replicas), in one write with the intent marked
        Restoring and ``scaled_back`` (a restart never takes it back twice); tell it once; write
        the recorded outcome to the check whenever it is still to be written; clear the intents
        only once the ReplicaSets removed the extra pods. Until then admission keeps holding the
        Pending replacements of preempted replicas (the intent's "hold"): clearing it at the
        scale-down let one be admitted and start a cloud instance for nothing."""
        timed_out = bool(action.check)
        first = any(intent.phase != plan.RESTORING for intent, _ in recorded)
        done: list[tuple[plan.Intent, Body]] = []
        for intent, dep in recorded:
            if intent.scaled_back is None:
                restoring = intent if intent.phase == plan.RESTORING else intent.moved(
                    phase=plan.RESTORING, outcome=action.check, message=action.reason)
                if intent.hpa:
                    ns = dep["metadata"]["namespace"]
                    top = ((self.moveback.hpas.store.get(f"{ns}/{intent.hpa}") or {}).get(
                        "spec") or {}).get("maxReplicas")
                    surged_to = max(intent.hpa_min or 1, intent.target)
                    await self.moveback._restore_floor(
                        ns=ns, name=intent.hpa, original=intent.hpa_min or 1,
                        surged_to=surged_to if top is None else min(surged_to, int(top)))
                raw = str((dep["metadata"].get("annotations") or {}).get(plan.INTENT))
                written = await self.moveback._write_deployment(
                    dep, functools.partial(_restore_body, raw=raw, restoring=restoring),
                    first=dep)
                if written is None:
                    continue  # gone, or changed since it was read: the next pass decides again
                crash_point("pre-warm: surge taken back")
                intent = plan.intent_of(written) or restoring
            done.append((intent, dep))
            if not first:
                continue
            text = f"Back to {intent.scaled_back} replicas: {action.reason}"
            await self.events.emit(obj=_dep_ref(dep), reason="PrewarmRestored", message=text,
                                   type_="Warning" if timed_out else "Normal")
            if timed_out:
                self._decide(intent.policy, wl, "PrewarmTimedOut",
                             f"{_key(dep)}: {action.reason}")
        outcome = plan.outcome_to_write(outcome=action.check,
                                        view=self._view(wl, check, recorded))
        told = f"outcome {outcome}"
        if wl is not None and outcome is not None and self._told.get(wl["metadata"]["uid"]) != told:
            self._told[wl["metadata"]["uid"]] = told
            message = f"pre-warm {action.reason}; " + (
                "retrying later" if outcome == "Retry" else "proceeding without it: the "
                "displaced replicas overflow after preemption")
            self.metrics.prewarm_checks.labels("retry" if outcome == "Retry" else
                                               "timed-out").inc()
            await self._event(wl, reason="PrewarmTimedOut", message=message, type_="Warning")
            await self._set_check(wl, check, outcome, message)
        elif first and wl is not None and not action.check:
            await self._event(wl, reason="PrewarmFinished",
                              message=f"surge undone: {action.reason}")
        # (an HPA owns the count after its floor is restored: nothing to wait for there)
        if len(done) < len(recorded) or not all(
                intent.hpa or _settled(self._fresh(dep), intent.scaled_back
                                       if intent.scaled_back is not None else intent.replicas)
                for intent, dep in done):
            return  # the next pass (the Deployment's status changing) finishes it
        for _intent, dep in recorded:
            with contextlib.suppress(NotFoundError):
                await self.client.patch(_dep_path(dep), {"metadata": {
                    "labels": {plan.LABEL: None}, "annotations": {plan.INTENT: None}}})
                crash_point("pre-warm: intent cleared")

    # ---- writes --------------------------------------------------------------------------------

    def _fresh(self, dep: Body) -> Body:
        return self.surged.store.get(_key(dep)) or self.moveback.deployments.store.get(
            _key(dep)) or dep

    def _hpa_for(self, dep: Body) -> Body | None:
        ns, name = dep["metadata"]["namespace"], dep["metadata"]["name"]
        for hpa in self.moveback.hpas.store.values():
            ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            if (hpa["metadata"].get("namespace") == ns and ref.get("kind") == "Deployment"
                    and ref.get("name") == name):
                return hpa
        return None

    async def _scale(self, dep: Body, intent: plan.Intent, replicas: int) -> None:
        """Surge the Deployment (or raise its HPA's minReplicas) to ``replicas``: absolute,
        idempotent. An HPA's floor is clamped to its ``maxReplicas`` (the API server refuses
        more): a surge the HPA has no room for never becomes Ready, and the timeout undoes it."""
        ns = dep["metadata"]["namespace"]
        try:
            if intent.hpa:
                path = f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/" \
                       f"{intent.hpa}"
                hpa = self.moveback.hpas.store.get(f"{ns}/{intent.hpa}")
                floor = max(intent.hpa_min or 1, replicas)
                top = (hpa or {}).get("spec", {}).get("maxReplicas")
                if top is not None and floor > int(top):
                    log.warning("the HPA has no room for the whole surge; clamped",
                                extra=kv(deployment=_key(dep), hpa=intent.hpa, want=floor,
                                         max_replicas=top))
                    floor = int(top)
                if hpa is None or hpa["spec"].get("minReplicas") != floor:
                    await self.client.patch(path, {"spec": {"minReplicas": floor}})
                    crash_point("pre-warm: surge written (HPA floor)")
                return  # the HPA scales the Deployment up to its new floor
            if int((dep.get("spec") or {}).get("replicas") or 0) != replicas:
                await self.client.patch(f"{_dep_path(dep)}/scale",
                                        {"spec": {"replicas": replicas}})
                crash_point("pre-warm: surge written")
        except NotFoundError:
            return

    async def _set_check(self, wl: Body, check: str, state: str, message: str) -> None:
        """Server-side apply of this check's entry in ``status.admissionChecks`` (a list keyed by
        name: Kueue's own entries are left alone)."""
        current: Body = next((c for c in (wl.get("status") or {}).get("admissionChecks")
                              or [] if c.get("name") == check), {})
        if current.get("state") == state and current.get("message") == message[:1024]:
            return
        since = (current.get("lastTransitionTime") if current.get("state") == state else None) \
            or format_time(datetime.now(UTC))
        body = {"apiVersion": self.kueue.api_version, "kind": "Workload",
                "metadata": {"name": wl["metadata"]["name"],
                             "namespace": wl["metadata"]["namespace"]},
                "status": {"admissionChecks": [{"name": check, "state": state,
                                                "message": message[:1024],
                                                "lastTransitionTime": since}]}}
        try:
            await self.client.request(
                "PATCH", f"{self.kueue.base}/namespaces/{wl['metadata']['namespace']}/workloads/"
                         f"{wl['metadata']['name']}/status",
                params={"fieldManager": FIELD_MANAGER, "force": True}, body=body,
                content_type="application/apply-patch+yaml")
        except NotFoundError:
            return
        log.info("pre-warm check", extra=kv(workload=_key(wl), check=check, state=state,
                                            message=message))
        crash_point(f"pre-warm: check {state}")

    async def _event(self, wl: Body, *, reason: str, message: str,
                     type_: str = "Normal") -> None:
        await self.events.emit(obj={"apiVersion": self.kueue.api_version, "kind": "Workload",
                                    "metadata": wl["metadata"]},
                               reason=reason, message=message, type_=type_)

    def _decide(self, policy: str, wl: Body | None, decision: str, reason: str) -> None:
        """Record a pre-warm step in the policy's ``status.lastDecisions`` (``pod`` names the
        Workload, the reason starts with the Deployment)."""
        who = _key(wl) if wl is not None else ""
        if decision == "Prewarmed":
            self.admission.record_decision(Decision(pod=who, decision="Prewarmed",
                                                    reason=reason, policy=policy))
        elif decision == "PrewarmTimedOut":
            self.admission.record_decision(Decision(pod=who, decision="PrewarmTimedOut",
                                                    reason=reason, policy=policy))
        else:
            self.admission.record_decision(Decision(pod=who, decision="WouldPrewarm",
                                                    reason=reason, policy=policy))


def _settled(dep: Body, replicas: int) -> bool:
    """The Deployment runs at most ``replicas`` pods now (its controller saw the scale-down and
    the ReplicaSet removed the extra ones), or it is gone."""
    if not dep.get("metadata"):
        return True
    status = dep.get("status") or {}
    seen = int(status.get("observedGeneration") or 0) >= int(dep["metadata"].get("generation")
                                                              or 0)
    return seen and int(status.get("replicas") or 0) <= replicas

def _ready(dep: Body) -> int:
    return int((dep.get("status") or {}).get("readyReplicas") or 0)


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text).timestamp()
    except TimeFormatError:
        return None


def _restore_body(dep: Body, *, raw: str, restoring: plan.Intent) -> Body | None:
    """One write that takes the surge back relative to the count now and records it in the
    intent (phase Restoring, ``scaled_back``); None when the intent on the Deployment is no longer
    ``raw`` (someone else finished it, or the cache lags: the next pass decides again)."""
    if (dep["metadata"].get("annotations") or {}).get(plan.INTENT) != raw:
        return None
    current = int((dep.get("spec") or {}).get("replicas") or 0)
    back = scale_back(current=current, recorded=restoring.replicas, surge=restoring.surge)
    body: Body = {"metadata": {"resourceVersion": dep["metadata"]["resourceVersion"],
                               "annotations": {plan.INTENT: restoring.moved(
                                   scaled_back=back).dumps()}}}
    if back != current:
        body["spec"] = {"replicas": back}
    return body



"""Hot-swap: replace a cloud replica whose GPU runs hot, or whose instance the cloud will
reclaim, make-before-break.

Why it exists: the provider marks a cloud pod ``vkprovider.io/GPUHealthy=False`` when its hottest
GPU stays above its OverflowPolicy's ``gpuHealth.maxTemperatureCelsius`` for ``sustainedFor``
(node/gpuhealth.py), and avoids that offer for a while; it marks a pod
``vkprovider.io/InterruptionPlanned=True`` when the cloud announced it will reclaim its
interruptible (spot) instance (node/interruption.py). Deleting the pod would drop a serving
replica until its replacement boots; instead, as move-back does (moveback.py):

1. a pod on a virtual node with either condition (a :class:`Trigger`), owned by a Deployment,
   whose policy has ``gpuHealth`` (for a hot GPU; any policy for an announced interruption) and
   is not ``dryRun``; the Deployment is settled, no move-back, pre-warm or other replacement of
   it is in flight, and it is out of its cooldown;
2. record intent on the Deployment (annotation ``vkprovider.io/hot-swap``) and mark the hot pod
   ``controller.kubernetes.io/pod-deletion-cost: "-2147483648"``;
3. surge N -> N+1 through the scale subresource; the new pod overflows to the virtual node as
   admission allows (the hot offer is blocked, so it lands elsewhere when the cloud sells
   elsewhere);
4. wait until a replica that was not there before is Ready and the Deployment has N+1 available
   (at most the policy's ``moveBack.timeout``);
5. scale back to N: the ReplicaSet removes the lowest-cost pod, the hot one, and the provider
   stops its instance. On timeout the same scale-back removes the not-ready surge pod instead,
   the hot pod is unmarked and the Deployment backs off for ``moveBack.cooldown``.

Events ``ReplacingHotReplica``, ``ReplacedHotReplica`` and ``HotReplicaNotReplaced`` (hot GPU),
``ReplacingInterruptedReplica``, ``ReplacedInterruptedReplica`` and
``InterruptedReplicaNotReplaced`` (announced interruption) on the Deployment;
``vkprovider_hot_replacements_total{result, trigger}``. Restart-safe like move-back: every
recorded intent with no live task (a previous process wrote it, or its task died on an API error)
is finished at the next pass by taking the surge back, relative to the count now and in the same
write that marks the intent (:func:`~vkprovider.descheduler.surge.scale_back`: a ``kubectl
scale`` in between is kept, and a restart never takes it back twice). Whether the hot pod is
gone is read from the API. Deployments an HPA scales are left alone (not yet supported: the HPA
owns ``replicas``).

It shares move-back's watches (pods, ReplicaSets, Deployments, HPAs), so it adds no API reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from vkprovider.descheduler.moveback import (
    COST,
    LOWEST_COST,
    MoveBack,
)
from vkprovider.descheduler.moveback import (
    INTENT as MOVEBACK_INTENT,
)
from vkprovider.descheduler.objects import deployment_path as _dep_path
from vkprovider.descheduler.objects import deployment_ref as _dep_ref
from vkprovider.descheduler.objects import object_key as _key
from vkprovider.descheduler.prewarm_plan import INTENT as PREWARM_INTENT
from vkprovider.descheduler.scoped import TaskScope
from vkprovider.descheduler.surge import pod_gone, scale_back_body, surge_body
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.logs import kv
from vkprovider.placement import policy as pol
from vkprovider.placement.budget import pod_policy

log = logging.getLogger(__name__)

Body = dict[str, Any]
INTENT = "vkprovider.io/hot-swap"  # move-back skips Deployments carrying it


@dataclass(frozen=True, kw_only=True)
class Trigger:
    """Why a replica is replaced: its metric label, its words and its Events."""

    name: str  # the metric's ``trigger`` label and the intent's ``trigger``
    why: str  # "its GPU runs hot"
    short: str  # "hot GPU"
    replacing: str
    replaced: str
    not_replaced: str


# Event reasons on the Deployment (docs/operations.md lists them)
REASON_REPLACING_HOT = "ReplacingHotReplica"
REASON_REPLACED_HOT = "ReplacedHotReplica"
REASON_NOT_REPLACED_HOT = "HotReplicaNotReplaced"
REASON_REPLACING_INTERRUPTED = "ReplacingInterruptedReplica"
REASON_REPLACED_INTERRUPTED = "ReplacedInterruptedReplica"
REASON_NOT_REPLACED_INTERRUPTED = "InterruptedReplicaNotReplaced"

HOT_GPU = Trigger(name="hot-gpu", why="its GPU runs hot", short="hot GPU",
                  replacing=REASON_REPLACING_HOT, replaced=REASON_REPLACED_HOT,
                  not_replaced=REASON_NOT_REPLACED_HOT)
INTERRUPTION = Trigger(name="interruption", why="its cloud will reclaim its instance",
                       short="interruption announced", replacing=REASON_REPLACING_INTERRUPTED,
                       replaced=REASON_REPLACED_INTERRUPTED,
                       not_replaced=REASON_NOT_REPLACED_INTERRUPTED)
TRIGGERS = {t.name: t for t in (HOT_GPU, INTERRUPTION)}


@dataclass
class SwapIntent:
    pod: str  # name of the pod being replaced
    pod_uid: str
    replicas: int  # N before the surge
    started: float  # epoch seconds
    policy: str
    trigger: str = HOT_GPU.name  # intents recorded before triggers existed were hot GPUs
    scaled_back: int | None = None  # set in the write that took the surge back: to this count

    def dumps(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class SwapResult:
    deployment: str
    pod: str
    result: str  # replaced | rolled-back
    seconds: float
    min_ready: int
    desired: int
    reason: str
    trigger: str = HOT_GPU.name


def replaceable(pods: Iterable[Mapping[str, Any]], *, virtual: Iterable[str]
                ) -> list[tuple[Body, Trigger]]:
    """Pods on a virtual node to replace and why, oldest first (pure): an announced
    interruption (``InterruptionPlanned=True``, it has a deadline) wins over a hot GPU."""
    nodes = set(virtual)
    out: list[tuple[Body, Trigger]] = []
    for p in pods:
        if p["spec"].get("nodeName") not in nodes or p["metadata"].get("deletionTimestamp"):
            continue
        if p["status"].get("interruptionPlanned") == "True":
            out.append((dict(p), INTERRUPTION))
        elif p["status"].get("gpuHealthy") == "False":
            out.append((dict(p), HOT_GPU))
    return sorted(out, key=lambda t: (str(t[0]["metadata"].get("creationTimestamp") or ""),
                                      str(t[0]["metadata"].get("name"))))


def settled(dep: Mapping[str, Any]) -> bool:
    """The Deployment's controller has caught up and runs exactly what it wants (pure)."""
    spec, status = dep.get("spec") or {}, dep.get("status") or {}
    return (int(status.get("observedGeneration") or 0)
            >= int(dep["metadata"].get("generation") or 0)
            and int(status.get("replicas") or 0) == int(spec.get("replicas") or 0))


class HotSwap:
    def __init__(self, *, moveback: MoveBack, interval: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.mb = moveback  # its watches, client, events, admission and metrics are shared
        self.interval = interval
        self.clock = clock
        self.in_flight: dict[str, asyncio.Task[SwapResult]] = {}
        self.scope = TaskScope()  # the swaps' tasks end with run(): none outlives leadership
        self.cooldown_until: dict[str, float] = {}
        self.results: list[SwapResult] = []

    async def run(self) -> None:
        """Run beside move-back (which runs the shared watches) until cancelled; the swaps it
        started are cancelled with it (a replica that lost the Lease writes nothing more)."""
        try:
            for informer in (*self.mb.informers, self.mb.pods, self.mb.replicasets):
                await informer.synced.wait()
            await self.mb.admission.policies.synced.wait()
            await self.recover()
            while True:
                try:
                    await self.pass_once()
                except APIError as exc:
                    log.warning("hot-swap pass failed", extra=kv(error=str(exc)))
                await asyncio.sleep(self.interval)
        finally:
            await self.scope.close()

    async def recover(self) -> None:
        """Finish every recorded swap with no live task and wait for them."""
        self._recover_orphans()
        tasks = list(self.in_flight.values())
        if tasks:
            await asyncio.wait(tasks)

    def _recover_orphans(self) -> None:
        """A recorded swap whose task is not running here is finished now, in its own task."""
        for key, dep in list(self.mb.deployments.store.items()):
            raw = (dep["metadata"].get("annotations") or {}).get(INTENT)
            if raw and key not in self.in_flight:
                self.in_flight[key] = self.scope.spawn(
                    self._recover_one(dep, str(raw)), name=f"hot-swap recovery {key}")

    async def _recover_one(self, dep: Body, raw: str) -> SwapResult:
        try:
            intent = SwapIntent(**json.loads(raw))
        except (TypeError, ValueError):
            log.error("unreadable hot-swap intent; clearing", extra=kv(deployment=_key(dep)))
            await self._clear_intent(dep)
            return SwapResult(deployment=_key(dep), pod="", result="skipped", seconds=0,
                              min_ready=0, desired=0, reason="unreadable intent cleared")
        return await self._finish(dep, intent, raw, ok=None,
                                  reason="the swap was interrupted (companion restart or error)",
                                  min_ready=int((dep.get("status") or {}).get("readyReplicas")
                                                or 0))

    async def pass_once(self) -> None:
        for key, task in list(self.in_flight.items()):
            if task.done():
                del self.in_flight[key]
                if not task.cancelled() and task.exception() is not None:
                    log.error("hot-swap crashed",
                              extra=kv(deployment=key, error=repr(task.exception())))
        self._recover_orphans()
        live = set(self.mb.deployments.store)
        for key in [k for k in self.cooldown_until if k not in live]:
            del self.cooldown_until[key]
        policies = {p.name: p for p in self.mb.admission.parsed_policies()}
        now = self.clock()
        for pod, trigger in replaceable(self.mb.pods.store.values(), virtual=self.mb.virtual):
            policy = policies.get(pod_policy(pod) or "")
            if policy is None or policy.spec.dry_run or (
                    trigger is HOT_GPU and policy.spec.gpu_health is None):
                continue
            dep = self.mb._deployment_of(pod)
            if dep is None:
                continue
            key = _key(dep)
            annotations = dep["metadata"].get("annotations") or {}
            if (key in self.in_flight or key in self.mb.in_flight
                    or now < self.cooldown_until.get(key, 0.0)
                    or any(k in annotations for k in (INTENT, MOVEBACK_INTENT, PREWARM_INTENT))
                    or not settled(dep)):
                continue
            if self.mb._hpa_for(dep) is not None:
                continue  # the HPA owns replicas (not supported yet)
            self.in_flight[key] = self.scope.spawn(
                self._replace(dep=dep, pod=pod, policy=policy, trigger=trigger),
                name=f"hot-swap {key}")

    async def _replace(self, *, dep: Body, pod: Body, policy: pol.OverflowPolicy,
                       trigger: Trigger = HOT_GPU) -> SwapResult:
        mb = self.mb
        ns = dep["metadata"]["namespace"]
        n = int(dep["spec"].get("replicas") or 0)
        intent = SwapIntent(pod=pod["metadata"]["name"], pod_uid=pod["metadata"]["uid"],
                            replicas=n, started=self.clock(), policy=policy.name,
                            trigger=trigger.name)
        raw = intent.dumps()
        try:
            written = await mb.client.patch(_dep_path(dep), {"metadata": {
                "resourceVersion": dep["metadata"]["resourceVersion"],
                "annotations": {INTENT: raw}}})
        except (ConflictError, NotFoundError):
            return SwapResult(deployment=_key(dep), pod=intent.pod, result="skipped", seconds=0,
                              min_ready=n, desired=n, reason="the Deployment changed",
                              trigger=trigger.name)
        rs_uid = pod["metadata"]["ownerReferences"][0]["uid"]
        before = {p["metadata"]["uid"] for p in mb.pods.store.values()
                  if p["metadata"]["ownerReferences"]
                  and p["metadata"]["ownerReferences"][0].get("uid") == rs_uid}
        await mb.events.emit(obj=_dep_ref(dep), reason=trigger.replacing,
                             message=f"Replacing {intent.pod}: {trigger.why}; surge "
                                     f"{n} -> {n + 1}, then {intent.pod} is removed")
        ok, reason, min_ready, cur = False, "timed out waiting for the new replica", n, dep
        try:  # every way out finishes the swap: an error is a rollback, not a stranded intent
            with contextlib.suppress(NotFoundError):
                await mb.client.patch(f"/api/v1/namespaces/{ns}/pods/{intent.pod}",
                                      {"metadata": {"annotations": {COST: LOWEST_COST}}})
            if await mb._write_deployment(
                    dep, lambda d: surge_body(d, key=INTENT, raw=raw, n=n), suffix="/scale",
                    first=written) is None:
                return await self._finish(cur, intent, raw, ok=False, min_ready=min_ready,
                                          reason="the Deployment was scaled by someone else "
                                                 "before the surge")
        except APIError as exc:
            return await self._finish(cur, intent, raw, ok=False, min_ready=min_ready,
                                      reason=f"the surge was refused: {exc}")
        deadline = intent.started + policy.spec.move_back.timeout_seconds
        while self.clock() < deadline:
            await mb._changed(mb.poll)
            cur = mb._deployment(dep)
            status = cur.get("status") or {}
            min_ready = min(min_ready, int(status.get("readyReplicas") or 0))
            fresh_ready = any(
                p["metadata"]["ownerReferences"]
                and p["metadata"]["ownerReferences"][0].get("uid") == rs_uid
                and p["metadata"]["uid"] not in before and not p["metadata"]["deletionTimestamp"]
                and p["status"]["ready"] for p in mb.pods.store.values())
            if fresh_ready and int(status.get("availableReplicas") or 0) >= n + 1:
                ok, reason = True, "the new replica is ready"
                break
        return await self._finish(cur, intent, raw, ok=ok, reason=reason, min_ready=min_ready)

    async def _finish(self, dep: Body, intent: SwapIntent, raw: str, *, ok: bool | None,
                      reason: str, min_ready: int) -> SwapResult:
        """Take the surge back relative to the count now, in one write with the intent marked
        (the ReplicaSet removes the hot pod, or a not-ready surge pod), then clean up; the same
        action finishes a swap recorded before a restart or whose task died."""
        mb = self.mb
        key, ns, n = _key(dep), dep["metadata"]["namespace"], intent.replicas
        trigger = TRIGGERS.get(intent.trigger, HOT_GPU)
        back, generation = intent.scaled_back, 0
        if back is None:
            written = await mb._write_deployment(
                dep, lambda d: scale_back_body(d, key=INTENT, raw=raw, intent=intent))
            if written is None:
                return SwapResult(deployment=key, pod=intent.pod, result="skipped", seconds=0,
                                  min_ready=min_ready, desired=n, trigger=trigger.name,
                                  reason="the intent is gone; nothing to finish here")
            back = int(written["spec"].get("replicas") or 0)
            generation = int(written["metadata"].get("generation") or 0)
        deadline = self.clock() + 120
        while self.clock() < deadline:
            cur = mb._deployment(dep)
            status = cur.get("status") or {}
            min_ready = min(min_ready, int(status.get("readyReplicas") or 0))
            if int(status.get("replicas") or 0) <= back and (
                    int(status.get("observedGeneration") or 0)
                    >= max(generation, int(cur["metadata"].get("generation") or 0))):
                break
            await mb._changed(mb.poll)
        try:  # one consistent read: the pod cache may lag the Deployment's
            current: Body | None = await mb.client.get(
                f"/api/v1/namespaces/{ns}/pods/{intent.pod}")
        except NotFoundError:
            current = None
        hot_gone = pod_gone(current, uid=intent.pod_uid)
        replaced = hot_gone
        if not hot_gone:
            with contextlib.suppress(NotFoundError):
                await mb.client.patch(f"/api/v1/namespaces/{ns}/pods/{intent.pod}",
                                      {"metadata": {"annotations": {COST: None}}})
        await self._clear_intent(dep)
        seconds = max(0.0, self.clock() - intent.started)
        result = SwapResult(deployment=key, pod=intent.pod,
                            result="replaced" if replaced else "rolled-back",
                            seconds=round(seconds, 2), min_ready=min_ready, desired=n,
                            reason=reason, trigger=trigger.name)
        self.results.append(result)
        del self.results[:-256]
        mb.metrics.hot_replacements.labels(result.result, trigger.name).inc()
        if replaced:
            await mb.events.emit(obj=_dep_ref(dep), reason=trigger.replaced,
                                 message=f"{intent.pod} ({trigger.short}) replaced in "
                                         f"{seconds:.0f}s; "
                                         f"ready replicas never below {min_ready} (desired {n})")
        else:
            policy = {p.name: p for p in mb.admission.parsed_policies()}.get(intent.policy)
            self.cooldown_until[key] = self.clock() + (
                policy.spec.move_back.cooldown_seconds if policy else 300.0)
            await mb.events.emit(obj=_dep_ref(dep), reason=trigger.not_replaced,
                                 type_="Warning",
                                 message=f"{intent.pod} ({trigger.short}) kept: {reason}; tried "
                                         "again after the policy's moveBack.cooldown")
        log.info("hot-swap finished", extra=kv(**asdict(result)))
        return result

    async def _clear_intent(self, dep: Body) -> None:
        with contextlib.suppress(NotFoundError):
            await self.mb.client.patch(_dep_path(dep),
                                       {"metadata": {"annotations": {INTENT: None}}})



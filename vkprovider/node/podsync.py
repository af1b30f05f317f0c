"""The status path of the pod engine: a placed instance's state becomes the pod's status.

Why it exists: once a pod has an instance, every reconcile maps what the cloud last reported
(booting, running, exited, failed, reclaimed) onto the pod as the kubelet would: status writes
only on change, probes and endpoints of running replicas (node/replicas.py), restarts after a
crash-loop back-off or a failed liveness probe, ``activeDeadlineSeconds``, and the Events users
read. Functions of the controller (node/pods.py); per-pod facts in node/podstate.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from providers.base import (
    Instance,
    InstanceState,
    ProviderError,
)
from vkprovider.kube.podstatus_write import StatusWrite
from vkprovider.kube.watching import object_key
from vkprovider.logs import kv
from vkprovider.node import (
    interruption,
    podend,
    podstatus,
    vanished,
)
from vkprovider.node.placements import Placed
from vkprovider.node.podstate import (
    DONE_STATES,
    Body,
    Retry,
    describe,
    is_ready,
    parse_time_or_none,
    pod_ref,
)

if TYPE_CHECKING:
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)


async def reject(c: PodController, pod: Body, *, reason: str, message: str) -> None:
    c.metrics.pods_rejected.labels(reason).inc()
    status = podstatus.failed_status(pod=pod, reason=reason, message=message,
                                     now=datetime.now(UTC))
    await write_status(c, pod, status)
    await c.events.emit(obj=pod_ref(pod), reason=reason, message=message,
                        type_="Warning")
    log.info("pod rejected", extra=kv(pod=object_key(pod), reason=reason, message=message))


async def sync(c: PodController, pod: Body, uid: str, placed: Placed) -> None:
    inst = placed.instance
    if (uid not in c.book and inst.state != InstanceState.TERMINATING
            and c.placed.deleting_since(placed.key) is None):
        c.book.put(uid, c.claim_of(pod, inst))  # listed later than the first sweep
    if not placed.listed and inst.state == InstanceState.PENDING:
        # Just created, booting as far as we know: the next list tells its state, and
        # writing "booting" now would often cost a write that "Running" replaces seconds
        # later (bench/burst.py counts writes per pod). A long boot is written then.
        return
    annotations = podstatus.instance_annotations(inst)
    current = pod["metadata"].get("annotations") or {}
    stale = {k: v for k, v in annotations.items() if current.get(k) != v}
    if await past_active_deadline(c, pod, uid, placed):
        return
    if inst.interrupted and inst.state == InstanceState.FAILED:  # the cloud reclaimed it
        await interruption.reclaimed(c, pod, placed=placed)
        return
    if inst.state in DONE_STATES and restarts_on_exit(c, pod, inst, placed.provider):
        await restart_exited(c, pod, uid, placed)
        return
    for message in c.addresses.untold(uid):
        await c.events.emit(obj=pod_ref(pod), reason="EndpointRefused", type_="Warning",
                            message=message)
    probe = None
    if inst.state == InstanceState.RUNNING:
        record = c.pods.ensure(uid)
        if record.running_seen is None:
            record.running_seen = time.time()
        probe = c.replicas.running(uid=uid, pod=pod, provider=placed.provider,
                                   instance=inst)
        if probe is not None and probe.liveness_failed:
            await restart(c, pod, uid, placed, message=probe.message)
            return
    else:
        c.replicas.stopped(uid=uid, pod=pod, instance=inst)
    status = podstatus.compute_status(
        pod=pod, instance=inst, node_name=c.node, now=datetime.now(UTC),
        probe_started=None if probe is None else probe.started,
        probe_ready=None if probe is None else probe.ready)
    lost = c.vanished.get(uid)
    if lost is not None and lost.handled:
        vanished.carry(status, vanish=lost, instance_restarts=inst.restart_count)
    elif lost is not None:
        c.vanished.forget(uid)  # listed again before it was told: it was not gone
    old = pod.get("status") or {}
    changed = podstatus.status_changed(old, status)
    if changed or stale:
        # One write: pods/status takes metadata too (only spec and ownerReferences are
        # reset there), so the instance annotations ride along with the status.
        await write_status(c, pod, status, annotations=stale or None)
    if changed:
        if probe is not None:
            await readiness_told(c, pod, uid, old, status, probe.message)
        if inst.state == InstanceState.PENDING:
            tell_created(c, pod, uid, placed)  # a boot users may wait minutes for
        await interruption.tell_planned(c, pod, old=old, new=status, placed=placed)
        if status.get("phase") == "Running" and old.get("phase") != "Running":
            seen = c.pods.ensure(uid).running_seen
            if seen is not None:
                c.metrics.status_latency.labels(placed.provider).observe(
                    max(0.0, time.time() - seen))
            what = ("running" if c.pods.ensure(uid).told_created
                    else f"created and running ({describe(inst)})")
            await c.events.emit(obj=pod_ref(pod), reason="Started",
                                message=f"Instance {inst.id} on {placed.provider} {what}")
        if inst.state == InstanceState.FAILED:
            await c.events.emit(obj=pod_ref(pod), reason="InstanceFailed",
                                type_="Warning",
                                message=f"Instance {inst.id} on {placed.provider} failed: "
                                        f"{inst.message or 'no reason given'}")
    if inst.state in DONE_STATES:
        await podend.stop_spend(c, placed)


def restarts_on_exit(c: PodController, pod: Body, inst: Instance, provider: str) -> bool:
    """The kubelet's rule: ``Always`` restarts an exited container, ``OnFailure`` only a
    failed one, ``Never`` none; here only where the cloud can restart an instance (others
    end the pod, and its controller replaces it)."""
    policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
    wants = policy == "Always" or (policy == "OnFailure"
                                   and inst.state == InstanceState.FAILED)
    return wants and getattr(c.providers.get(provider), "restart", None) is not None


async def restart_exited(c: PodController, pod: Body, uid: str, placed: Placed) -> None:
    """Restart an exited container after the kubelet's crash-loop back-off (the first
    restart after ``crash_backoff_seconds``, doubling per restart, at most 300 s); the pod
    stays Running, its container waiting in ``CrashLoopBackOff`` meanwhile."""
    inst = placed.instance
    c.replicas.stopped(uid=uid, pod=pod, instance=inst)
    base = c.settings.pods.crash_backoff_seconds
    delay = min(300.0, base * (2 ** min(inst.restart_count, 16)))
    ended = inst.finished_at or datetime.now(UTC)
    left = (ended - datetime.now(UTC)).total_seconds() + delay
    if left > 0:
        status = podstatus.crash_loop_status(pod=pod, instance=inst, delay=delay,
                                             now=datetime.now(UTC))
        if podstatus.status_changed(pod.get("status") or {}, status):
            await write_status(c, pod, status)
            name = (pod["spec"].get("containers") or [{}])[0].get("name", "")
            await c.events.emit(obj=pod_ref(pod), reason="BackOff", type_="Warning",
                                message=f"Back-off restarting failed container {name} "
                                        f"(instance {inst.id} on {placed.provider})")
        raise Retry("crash loop back-off", after=left)
    await restart_instance(c, uid, placed)


async def past_active_deadline(c: PodController, pod: Body, uid: str, placed: Placed) -> bool:
    """``spec.activeDeadlineSeconds`` after ``status.startTime``: the pod fails
    (``DeadlineExceeded``) and its instance is stopped, as the kubelet does."""
    deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    started = parse_time_or_none((pod.get("status") or {}).get("startTime"))
    if not isinstance(deadline, int) or isinstance(deadline, bool) or started is None:
        return False
    left = (started - datetime.now(UTC)).total_seconds() + deadline
    if left > 0:
        c.queue.add_after(uid, left + 0.05)
        return False
    c.replicas.forget(uid)
    await reject(c, pod, reason="DeadlineExceeded",
                 message="Pod was active on the node longer than the specified "
                         f"deadline ({deadline}s)")
    await podend.stop_spend(c, placed)
    return True


async def readiness_told(c: PodController, pod: Body, uid: str, old: Body, status: Body,
                         message: str | None) -> None:
    """A Warning when a replica that was Ready stops answering its readiness probe."""
    was = is_ready({"status": old})
    now = is_ready({"status": status})
    if was and not now and status.get("phase") == "Running" and message:
        await c.events.emit(obj=pod_ref(pod), reason="Unhealthy", type_="Warning",
                            message=f"Readiness probe failed: {message}")


async def restart(c: PodController, pod: Body, uid: str, placed: Placed, *,
                  message: str | None) -> None:
    """Liveness (or startup) failed past its threshold: restart the instance in place, as
    the kubelet restarts a container. The pod's restartCount follows the instance's."""
    inst = placed.instance
    name = (pod["spec"].get("containers") or [{}])[0].get("name", "")
    c.replicas.stopped(uid=uid, pod=pod, instance=inst)
    provider = c.providers.get(placed.provider)
    restart = getattr(provider, "restart", None)
    await c.events.emit(obj=pod_ref(pod), reason="Unhealthy", type_="Warning",
                        message=f"Liveness probe failed: {message or 'no answer'}")
    if restart is None:
        await reject(c, pod, reason="LivenessProbeFailed",
                     message=f"container {name} failed its liveness probe and "
                             f"{placed.provider} cannot restart an instance; the "
                             "pod fails so that its controller replaces it")
        return
    await restart_instance(c, uid, placed)
    c.metrics.probe_restarts.labels(placed.provider).inc()
    await c.events.emit(obj=pod_ref(pod), reason="Killing",
                        message=f"Container {name} failed liveness probe, will be "
                                f"restarted (instance {inst.id} on {placed.provider})")


async def restart_instance(c: PodController, uid: str, placed: Placed) -> None:
    """Restart the container of ``placed`` through its cloud; until the next list shows it
    booting (restart count up) it is taken as booting, so probes start afresh then."""
    restart = getattr(c.providers.get(placed.provider), "restart", None)
    if restart is None:
        return
    try:
        await restart(placed.instance.id)
        c._count(placed.provider, "restart", None)
    except ProviderError as exc:
        c._count(placed.provider, "restart", exc)
        raise
    c.placed.set(uid, dataclasses.replace(
        placed, instance=dataclasses.replace(placed.instance, state=InstanceState.PENDING)))


def tell_created(c: PodController, pod: Body, uid: str, placed: Placed) -> None:
    record = c.pods.ensure(uid)
    if record.told_created:
        return
    record.told_created = True
    inst = placed.instance
    c.events.record(obj=pod_ref(pod), reason="ProviderCreated",
                    message=f"Created instance {inst.id} on {placed.provider} "
                            f"({describe(inst)})")


async def write_status(c: PodController, pod: Body, status: Body, *,
                       annotations: dict[str, str] | None = None) -> None:
    """One write of the pod's status (annotations ride along): kube/podstatus_write.py."""
    landed = await c.status_writer.write(pod=pod, status=status, annotations=annotations)
    if landed is not StatusWrite.GONE:
        c.metrics.kube_writes.labels("pod_status").inc()
    if landed is StatusWrite.PATCHED_AFTER_CONFLICT:  # the refused replace was a request too
        c.metrics.kube_writes.labels("pod_status_conflict").inc()

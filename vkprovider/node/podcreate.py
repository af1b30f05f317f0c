"""The create path of the pod engine: admit, translate, place and create one pod's instance.

Why it exists: placing a pod is the longest thing the engine does (policy, budgets, the node's
allocatable, blocks, spend caps, spot plans, pins after an unknown outcome, and what to tell the
pod when nothing fits); it lives here, beside the controller (node/pods.py), as functions of the
controller so that the per-pod record (node/podstate.py) stays the one place a pod's facts live.

A create whose outcome is unknown (timeout, 5xx) pins the pod to that provider (``unsure``) until
a list shows the instance or proves it never happened; only an idempotent create by name on the
same provider is safe meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from providers.base import (
    AuthError,
    CapacityError,
    ImagePullError,
    InstanceSpec,
    InvalidSpec,
    Provider,
    ProviderError,
    QuotaError,
    RateLimited,
    runs_without_gpu,
)
from vkprovider.errors import PodConfigPending, PodRejected
from vkprovider.kube.watching import object_key
from vkprovider.logs import kv
from vkprovider.node import podstatus, podsync
from vkprovider.node.budgetbook import (
    OUT_OF_REASONS,
    TAG_POLICY,
    Allocatable,
    Claim,
    Refusal,
    pod_requests,
)
from vkprovider.node.placements import Placed
from vkprovider.node.podstate import (
    Body,
    Retry,
    parse_time_or_none,
    pod_ref,
)
from vkprovider.node.providercaps import (
    Held,
    caps_refusal,
    expected_price,
)
from vkprovider.node.translate import translate
from vkprovider.placement import policy as pol
from vkprovider.placement import spot
from vkprovider.placement.blocks import ANY_TYPE
from vkprovider.placement.budget import pod_gpus

if TYPE_CHECKING:
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)


def provider_caps_refusal(c: PodController, name: str, spec: InstanceSpec
                          ) -> tuple[str | None, Held]:
    """Why ``spec`` would break the provider's caps, and what to reserve if it does not."""
    caps = c.caps.get(name)
    want = Held(gpus=spec.gpu_count, price_per_hour=expected_price(
        c.offers, provider=name, gpu_type=spec.gpu_type, region=spec.region,
        gpus=spec.gpu_count, interruptible=spec.interruptible))
    if caps is None or caps.unlimited:
        return None, want
    held = c.held_by_provider().get(name, Held())
    return caps_refusal(caps=caps, held=held, gpus=want.gpus,
                        price_per_hour=want.price_per_hour), want


def unrunnable(c: PodController, spec: InstanceSpec) -> str | None:
    """Why no configured cloud could ever run ``spec`` (checked before any create call)."""
    if spec.gpu_count <= 0 or not c.largest_offer:
        return None
    if spec.gpu_type is not None and spec.gpu_type not in c.largest_offer:
        known = ", ".join(sorted(c.largest_offer))
        return f"no provider sells GPU type {spec.gpu_type!r} (sold: {known})"
    types = [spec.gpu_type] if spec.gpu_type else list(c.largest_offer)
    largest = max(c.largest_offer[t] for t in types)
    if largest == 0:
        return None  # sold but out of stock everywhere so far: wait for capacity
    if spec.gpu_count > largest:
        return (f"{spec.gpu_count} GPUs requested; the largest offer of "
                f"{spec.gpu_type or 'any type'} is {largest}")
    return None


async def create(c: PodController, pod: Body, uid: str) -> None:
    meta = pod["metadata"]
    record = c.pods.ensure(uid)
    # Policy first: a pod no policy admits never has its Secrets read.
    policy, refusal = await c.gate.admitting(pod)
    if refusal:
        await podsync.reject(c, pod, reason="NotAdmitted",
                             message=f"not sent to any cloud: {refusal}")
        return
    if uid not in c.unsure:
        c.book.drop(uid)  # no instance, no create in doubt: an old claim is stale
    policy = sticky_policy(c, uid, policy)
    # Budgets and the node's allocatable before anything else (no Secret read, no cloud
    # call); checked again, and reserved, right before each create below.
    cpu, memory = pod_requests(pod)
    claim = Claim(policy=policy.name if policy is not None else None, gpus=pod_gpus(pod),
                  cpu_millis=cpu, memory_bytes=memory)
    early = c.book.refusal(uid, claim, limits=policy.spec.limits if policy else None,
                           node=Allocatable())
    if early is not None:
        await refuse_over(c, pod, meta, early)
        return
    blind = c.blind_to(uid)
    if blind:
        wait = (f"{', '.join(blind)} not listed yet and may hold this pod's instance "
                "(created before a restart); not creating blind")
        if not record.wait().told_blind:  # once per pod: say why it waits
            record.wait().told_blind = True
            log.info("pod waits for a provider list", extra=kv(pod=object_key(pod), uid=uid,
                                                               providers=",".join(blind)))
            await c.events.emit(obj=pod_ref(pod), reason="WaitingForProvider",
                                message=f"Waiting: {wait}")
        raise Retry(wait, after=2.0)
    waiting = record.wait()
    waiting.told_blind = False
    try:
        spec = await translate(
            pod=pod, node_name=c.node, refs=c.refs,
            ignore_exec_probes=policy is not None and policy.spec.exec_probes == "Ignore",
            # One Warning naming what the clouds this pod may go to drop (not again on
            # each retry after NoCapacity: nothing about the pod changed).
            adapters=[p for n, p in c.providers.items()
                      if policy is None or n in policy.spec.providers],
            on_dropped=None if waiting.unplaced_tries else (
                lambda dropped: c.events.record(
                    obj=pod_ref(pod), reason="FieldsDropped", type_="Warning",
                    message=dropped.message)))
    except PodRejected as exc:
        await podsync.reject(c, pod, reason=exc.reason, message=f"{exc.field}: {exc.message}")
        return
    except PodConfigPending as exc:
        status = podstatus.config_pending_status(pod=pod, message=exc.message,
                                                 now=datetime.now(UTC))
        await podsync.write_status(c, pod, status)
        await c.events.emit(obj=pod_ref(pod), reason="Failed", type_="Warning",
                            message=f"Error: {exc.message} ({exc.field})")
        raise Retry("waiting for a Secret/ConfigMap") from None
    if policy is not None:  # a restart counts the instance under the policy it was made for
        spec = dataclasses.replace(spec, tags={**spec.tags, TAG_POLICY: policy.name})
    # The kubelet's admission: the pods the node runs must fit its allocatable (a pod bound
    # by hand skipped the scheduler's check). GPUs are checked per offer below.
    unfit = c.book.refusal(uid, claim, limits=None,
                           node=dataclasses.replace(c.allocatable(), gpus=None))
    if unfit is not None:
        await refuse_over(c, pod, meta, unfit)
        return

    if not c.offers_read:
        await c.node_capacity()
    why = unrunnable(c, spec)
    if why is not None:
        reason = "UnknownGPUType" if "GPU type" in why else "GPUCountUnavailable"
        await podsync.reject(c, pod, reason=reason, message=why)
        return

    allowed = [n for n in c.providers if n not in c.draining]
    if policy is not None:
        allowed = [n for n in policy.spec.providers
                   if n in c.providers and n not in c.draining]
        if not allowed:
            await podsync.reject(c, pod, reason="NotAdmitted",
                                 message=f"OverflowPolicy {policy.name} names providers "
                                         f"{', '.join(policy.spec.providers)}, none of which "
                                         f"this node serves")
            return
    if spec.gpu_count <= 0:
        # Most clouds here rent GPU machines only; ask only those that run GPU-less pods.
        able = [n for n in allowed if runs_without_gpu(c.providers[n])]
        if not able:
            await podsync.reject(
                c, pod, reason="InvalidResources",
                message=f"spec.containers[0].resources.limits[nvidia.com/gpu]: no GPU "
                        f"requested, and none of {', '.join(allowed) or 'no provider'} "
                        "runs pods without a GPU (set a GPU limit of at least 1)")
            return
        allowed = able
    # (provider, interruptible) candidates: placement mode and spec.interruptible (spot.py)
    plan = [(cand.provider, cand.interruptible) for cand in spot.plan(
        allowed, offers=c.offers, gpu_type=spec.gpu_type, gpus=spec.gpu_count,
        blocked=lambda o: c.blocks.blocked(provider=o.provider, region=o.region,
                                           gpu_type=o.gpu_type) is not None,
        mode=policy.spec.interruptible if policy is not None else "Never",
        cheapest=policy is not None and policy.spec.placement == "Cheapest")]
    # Pinned to one provider: a create there may have happened (unsure), or the pod ran there
    # and its instance is missing from the list (lagging, or gone). Only a create on that same
    # provider is safe: idempotent by name, it returns the instance if it exists after all.
    unsure = c.unsure.get(uid)
    ran_on = (meta.get("annotations") or {}).get(f"{podstatus.ANNOTATION_PREFIX}provider")
    if uid in c.vanished:
        ran_on = None  # a list proved its instance gone: a new one goes where it fits best
    pinned = unsure[0] if unsure else (ran_on if ran_on in c.providers else None)
    sticky = pinned is not None
    order = plan if pinned is None else [
        (pinned, next((k for n, k in plan if n == pinned), False))]
    reasons: list[str] = []
    over_budget: list[Refusal] = []  # candidates the policy's limits refuse (their price)
    refused: list[str] = []
    pull_denied: list[ImagePullError] = []
    unlisted: list[str] = []
    cooling: list[float] = []  # seconds until a rate-limited provider may be asked again
    for name, interruptible in order:
        spec = dataclasses.replace(spec, interruptible=interruptible)  # the candidate's kind
        if not sticky and not c.listed.get(name, False):
            unlisted.append(name)  # never place new work where we cannot see it
            continue
        pause = c.cooldown.get(name, 0.0) - c.clock()
        if pause > 0:  # it asked us to slow down (Retry-After): no pod asks it before then
            if sticky:
                raise Retry(f"{name}: rate limited", after=pause)
            cooling.append(pause)
            continue
        block = c.blocks.blocked(provider=name, region=spec.region, gpu_type=spec.gpu_type)
        if block is not None and not sticky:
            reasons.append(f"{name}: blocked ({block.reason})")
            continue
        unsold = spot.not_sold(c.offers, provider=name, gpu_type=spec.gpu_type,
                               interruptible=interruptible) if spec.gpu_type else None
        if not sticky and c.offers_read and unsold is not None:
            reasons.append(unsold)
            continue
        provider = c.providers.get(name)
        if provider is None:
            raise Retry(f"{name}: no longer served", after=1.0)
        over, want = provider_caps_refusal(c, name, spec)
        if over is not None and not sticky:
            reasons.append(f"{name}: blocked (provider budget: {over})")
            continue
        # The policy's limits and the node's allocatable, at this offer's price: checked and
        # reserved with no await in between, so parallel workers never share the last slot.
        claim = dataclasses.replace(claim, gpus=spec.gpu_count,
                                    price_per_hour=want.price_per_hour)
        budget_over, before = c.book.reserve(
            uid, claim, limits=policy.spec.limits if policy else None,
            node=c.allocatable())
        if budget_over is None and (policy is not None and spec.gpu_count > 0
                                    and policy.spec.limits.max_price_per_hour is not None
                                    and want.price_per_hour <= 0):
            c.book.restore(uid, before)  # a price cap and no price known: fail closed
            budget_over = Refusal(node=False, budget="maxPricePerHour", message=(
                f"OverflowPolicy {policy.name}: maxPricePerHour "
                f"${policy.spec.limits.max_price_per_hour:.2f} and {name} quotes no price "
                f"for {spec.gpu_type or 'this GPU'}"))
        if budget_over is not None:
            if budget_over.node and budget_over.budget != "nvidia.com/gpu":
                await refuse_over(c, pod, meta, budget_over)  # pods, cpu, memory
                return
            if budget_over.node:
                reasons.append(f"{name}: {budget_over.message} (node allocatable)")
            else:
                over_budget.append(budget_over)
            continue
        kept = False  # True once the claim stands: created, or the outcome is unknown
        c.reserved[name] = c.reserved.get(name, Held()).plus(
            gpus=want.gpus, price_per_hour=want.price_per_hour)
        c.inflight[name] = c.inflight.get(name, 0) + 1
        try:
            inst = await provider.create(spec)
        except CapacityError as exc:
            c._count(name, "create", exc)
            c.blocks.block(provider=name, region=spec.region,
                           gpu_type=spec.gpu_type if spec.gpu_type else ANY_TYPE,
                           seconds=c.settings.pods.capacity_block_seconds,
                           reason="no capacity")
            reasons.append(f"{name}: no capacity ({exc})")
            continue
        except AuthError as exc:
            c._count(name, "create", exc)
            c.blocks.block(provider=name, region=None, gpu_type=None, seconds=300,
                           reason="credentials rejected")
            reasons.append(f"{name}: credentials rejected")
            continue
        except QuotaError as exc:  # account-wide: no other offer of it will do
            c._count(name, "create", exc)
            c.blocks.block(provider=name, region=None, gpu_type=None,
                           seconds=c.settings.pods.capacity_block_seconds,
                           reason="quota")
            reasons.append(f"{name}: quota ({exc})")
            continue
        except ImagePullError as exc:  # the image's credentials: wait, as ImagePullBackOff
            c._count(name, "create", exc)
            pull_denied.append(exc)
            continue
        except InvalidSpec as exc:  # this cloud never can; another of the policy may
            c._count(name, "create", exc)
            text = str(exc)
            refused.append(text if text.startswith(f"{name}:") else f"{name}: {text}")
            continue
        except ProviderError as exc:  # transient or rate limited: outcome unknown
            kept = True  # the instance may exist: its claim stays until a list tells
            c._count(name, "create", exc)
            if isinstance(exc, RateLimited) and exc.retry_after:
                c.cooldown[name] = c.clock() + exc.retry_after
            # pinned to it, counted from this failure (the latest request may land last)
            c.unsure[uid] = (c._key_of(provider, name), c.clock())
            if past_create_deadline(c, meta):
                # Failed, not forgotten: an instance that did start is deleted once listed
                await give_up(c, pod, f"the last try: {name}: {exc}")
                return
            after = exc.retry_after if isinstance(exc, RateLimited) else None
            raise Retry(f"{name}: {exc}", after=after) from exc
        else:
            kept = True
        finally:
            release(c, name, provider, want)
            if not kept:
                c.book.restore(uid, before)
        c.book.priced(uid, inst.price_per_hour)  # the cloud's price, not the offer's
        name = c._key_of(provider, name)  # retired while the call ran: its alias
        inst = c.addresses.screen(uid=uid, provider=name, instance=inst)
        c._count(name, "create", None)
        c.unsure.pop(uid, None)
        record.waiting = None  # placed: nothing left to tell about waiting
        c.placed.set(uid, Placed(provider=name, instance=inst, seen_at=c.clock(),
                                 listed=False))
        c.metrics.create_latency.labels(name).observe(
            c.clock() - record.first_seen)
        log.info("instance created", extra=kv(pod=object_key(pod), uid=uid, provider=name,
                                              instance=inst.id))
        if c.verbose_events:
            podsync.tell_created(c, pod, uid, c.placed[uid])
        await podsync.sync(c, pod, uid, c.placed[uid])
        return

    if over_budget and not (reasons or refused or pull_denied or cooling or unlisted):
        await refuse_over(c, pod, meta, over_budget[0])  # every offer breaks the budget
        return
    reasons += [f"{o.message} (policy budget)" for o in over_budget]
    if pull_denied and not past_create_deadline(c, meta):
        await image_pull_backoff(c, pod, spec, pull_denied)
    if cooling and not past_create_deadline(c, meta):
        # a provider of this pod only asked us to wait: no event, no failover cost
        raise Retry("rate limited by the cloud", after=min(cooling))
    if refused and not reasons and not unlisted:  # every cloud tried says never
        await podsync.reject(c, pod, reason="ProviderRejected", message="; ".join(refused))
        return
    reasons += [f"{r} (refused)" for r in refused]
    if unlisted and not reasons and not past_create_deadline(c, meta):
        # only unknown providers were left: a failed list is usually one sweep's blip
        raise Retry(f"{', '.join(unlisted)} cannot be listed now", after=2.0)
    await no_provider(c, pod, meta, spec, list(dict.fromkeys(  # a provider's 2 kinds
        reasons + [f"{n}: cannot be listed now" for n in unlisted])))


async def image_pull_backoff(c: PodController, pod: Body, spec: InstanceSpec,
                             denied: list[ImagePullError]) -> None:
    """No cloud could pull the image with the pod's credentials: the pod waits in
    ``ErrImagePull`` (a Warning names imagePullSecrets and the registry) and is retried
    with backoff, re-reading its Secrets, as the kubelet's ImagePullBackOff does."""
    registry = denied[0].registry or "its registry"
    secret = spec.registry_auth.secret if spec.registry_auth is not None else None
    given = (f"the credential from Secret {secret!r}" if secret
             else "no credential (no matching spec.imagePullSecrets entry)")
    message = (f"spec.imagePullSecrets: {registry} refused the pull of {spec.image} with "
               f"{given}: " + "; ".join(f"{e.provider or '?'}: {e}" for e in denied))
    status = podstatus.image_pull_status(pod=pod, message=message, now=datetime.now(UTC))
    await podsync.write_status(c, pod, status)
    await c.events.emit(obj=pod_ref(pod), reason="Failed", type_="Warning",
                        message=f"Failed to pull image {spec.image!r}: {message}")
    raise Retry("image pull refused")  # rate-limited backoff, up to max_backoff_seconds


def sticky_policy(c: PodController, uid: str, policy: pol.OverflowPolicy | None
                  ) -> pol.OverflowPolicy | None:
    """A create retried after an unknown outcome keeps the policy of its claim (while that
    policy exists): the same tags, so the same instance if the first try did happen."""
    claim = c.book.get(uid)
    if claim is None or claim.policy is None or policy is None \
            or claim.policy == policy.name:
        return policy
    return c.gate.parsed().get(claim.policy, policy)


async def refuse_over(c: PodController, pod: Body, meta: Body, over: Refusal) -> None:
    """Not created: the node's allocatable (pods, cpu, memory) fails the pod as the kubelet
    does (``OutOf<resource>``); a policy's budget keeps it waiting, told once per reason
    (Warning ``BudgetExceeded``), and fails it at the create deadline."""
    if over.node:
        await podsync.reject(c, pod, reason=OUT_OF_REASONS[over.budget], message=over.message)
        return
    message = f"not sent to any cloud: {over.message}"
    if past_create_deadline(c, meta):
        await podsync.reject(c, pod, reason="BudgetExceeded", message=message)
        return
    uid = str(meta.get("uid"))
    record = c.pods.ensure(uid)
    if record.wait().told_budget != over.message:
        record.wait().told_budget = over.message
        log.info("pod over its policy's budget", extra=kv(pod=object_key(pod), uid=uid,
                                                          budget=over.budget))
        await c.events.emit(obj=pod_ref(pod), reason="BudgetExceeded", type_="Warning",
                            message=f"{message}; waiting for the budget to free up")
    # A check costs no cloud call: look again soon, less often the longer the pod waits
    # (1 s, up to 10 s).
    waited = c.clock() - record.first_seen
    delay = min(10.0, max(1.0, waited / 2))
    raise Retry("over the policy's budget",
                after=max(0.5, min(delay, until_create_deadline(c, meta) + 0.1)))


def release(c: PodController, name: str, provider: Provider, want: Held) -> None:
    """Undo the reservation of one create (under the name it is served by now)."""
    key = c._key_of(provider, name)  # retire_provider moved its bookkeeping there
    if key in c.reserved:
        left = c.reserved[key].minus(gpus=want.gpus, price_per_hour=want.price_per_hour)
        c.reserved[key] = left
        if left.gpus == 0 and left.price_per_hour < 1e-9:
            del c.reserved[key]
    if c.inflight.get(key):
        c.inflight[key] -= 1
        if not c.inflight[key]:
            del c.inflight[key]


async def no_provider(c: PodController, pod: Body, meta: Body, spec: InstanceSpec,
                      reasons: list[str]) -> None:
    summary = "; ".join(reasons) or "no provider configured"
    if past_create_deadline(c, meta):
        await give_up(c, pod, summary)
        return
    uid = str(meta.get("uid"))
    record = c.pods.ensure(uid)
    waiting = record.wait()
    if waiting.told_no_capacity != summary:  # one event per change of reason
        waiting.told_no_capacity = summary
        await c.events.emit(obj=pod_ref(pod), reason="NoCapacity", type_="Warning",
                            message=f"No provider can run {spec.gpu_count}x "
                                    f"{spec.gpu_type or 'any GPU'} now: {summary}")
    tries = waiting.unplaced_tries
    waiting.unplaced_tries = tries + 1
    delay = no_capacity_delay(tries, cap=c.settings.pods.max_backoff_seconds)
    # never sleep past the create deadline: the pod must fail on time, not a backoff later
    delay = max(0.5, min(delay, until_create_deadline(c, meta) + 0.1))
    raise Retry("no capacity", after=delay)


async def give_up(c: PodController, pod: Body, detail: str) -> None:
    deadline = int(c.settings.pods.create_deadline_seconds)
    await podsync.reject(c, pod, reason="ProviderUnavailable",
                         message=f"no cloud could run it within {deadline}s: {detail}")


def until_create_deadline(c: PodController, meta: Body) -> float:
    created = parse_time_or_none(meta.get("creationTimestamp"))
    lost = c.vanished.since(str(meta.get("uid")))
    if lost is not None and (created is None or lost > created):
        created = lost  # a new instance after a vanished one: counted from the vanishing
    age = (datetime.now(UTC) - created).total_seconds() if created else 0.0
    return c.settings.pods.create_deadline_seconds - age


def past_create_deadline(c: PodController, meta: Body) -> bool:
    return until_create_deadline(c, meta) < 0


def no_capacity_delay(tries: int, *, cap: float) -> float:
    """When to look again for a provider after ``tries`` looks found none: 5 s, doubling, capped.

    Capacity blocks last minutes (``capacity_block_seconds``), so asking every sweep only burns
    CPU and API writes; the growing delay is what "backoff that holds" means for a pod.
    """
    return float(min(cap, 5.0 * 2 ** min(tries, 16)))

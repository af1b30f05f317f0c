"""The pod controller: drive every pod on the virtual node to its cloud instance and back.

Why it exists: this is the kubelet's job for a node whose "containers" are cloud instances. It is
level-triggered: every reconcile compares the pod (from the watch cache) with the instance the
cloud last reported for it (from ONE list call per provider per sweep, never a call per pod) and
does the one step that brings them closer:

* no instance, pod live          -> translate, pick a provider, create (idempotent by name)
* instance exists                -> map its state to the pod status; patch only on change
* instance finished or failed    -> the pod becomes Succeeded/Failed; the instance is deleted
* pod terminating                -> delete the instance, then the pod (grace 0, UID precondition)
* pod gone from the API          -> delete its instance
* instance with no pod           -> orphan; deleted after two sightings ``orphan_grace`` apart

Crash safety: instance names are ``<node>-<pod uid>`` and carry tags (node, namespace, pod, uid);
create is idempotent by name; a create whose outcome is unknown (timeout, 5xx) is retried on the
SAME provider only, until a later list proves it did not happen; on start the first sweep runs
before any worker, so existing instances are adopted rather than created again; a provider whose
list failed is "unknown" for that sweep, and nothing is created on it or collected from it.

Who waits for an unknown provider. Only a pod that may already have an instance there we cannot
see: one this process inherited (bound before its first sync, so a predecessor may have created
for it and died before annotating the pod) while that provider has not been listed even once by
this process. Every other pod is free to go to a provider that can be listed: this process knows
every create it made (``unsure`` keeps an uncertain one sticky to its provider), and no
predecessor acted after this process took over. So one broken account (bad key, outage) never
holds back creates on the whole node.

Providers can change at runtime (GPUProvider objects, see ``node/providerset.py``): one can be
added, replaced (new credentials, same account) or drained. A drained provider creates nothing
but is still listed, so its instances keep their status and are deleted as their pods go; it is
removed only once a list shows it holds nothing of ours (money is never orphaned). Structural
changes take ``providers_lock``, which a sweep holds, so a sweep never mixes two views. A new
provider is "unknown" until its first list: nothing is created on it, and inherited pods wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from providers.addresses import AddressPolicy
from providers.base import (
    TAG_NODE,
    TAG_UID,
    AuthError,
    CapacityError,
    ImagePullError,
    Instance,
    InstanceSpec,
    InstanceState,
    InvalidSpec,
    NotFound,
    Offer,
    Provider,
    ProviderError,
    QuotaError,
    RateLimited,
    runs_without_gpu,
    sweep_registry_auth,
)
from vkprovider.config import Settings
from vkprovider.errors import PodConfigPending, PodRejected
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.podstatus_write import PodStatusWriter, StatusWrite, pod_path
from vkprovider.kube.sharing import TreeSharer
from vkprovider.kube.watching import Informer, SharedSlim, object_key
from vkprovider.logs import kv
from vkprovider.metrics import Metrics
from vkprovider.node import duplicates, interruption, podstatus, vanished
from vkprovider.node.addressscreen import AddressScreen
from vkprovider.node.budgetbook import (
    OUT_OF_REASONS,
    TAG_POLICY,
    Allocatable,
    BudgetBook,
    Claim,
    Refusal,
    allocatable,
    pod_requests,
)
from vkprovider.node.listing import Lister, ListResult
from vkprovider.node.placements import InstanceKey, Placed, Placements
from vkprovider.node.podstate import PodStates
from vkprovider.node.policygate import PolicyGate
from vkprovider.node.providercaps import (
    Held,
    ProviderCaps,
    caps_refusal,
    expected_price,
    fold_capacity,
)
from vkprovider.node.replicas import EndpointSink, ProberLike, Replicas
from vkprovider.node.spend import SpendRecorder
from vkprovider.node.translate import RefSource, translate
from vkprovider.node.virtualnode import NodeCapacity
from vkprovider.node.workqueue import ShutDown, WorkQueue
from vkprovider.placement import policy as pol
from vkprovider.placement import spot
from vkprovider.placement.blocks import ANY_TYPE, Blocks
from vkprovider.placement.budget import Usage, pod_gpus
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

POLICIES_PATH = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
#: Beyond the request timeout, how long after a create failed a list must start before its
#: silence proves the create did not happen (clouds whose list lags behind their creates).
UNSURE_SETTLE_SECONDS = 30.0

log = logging.getLogger(__name__)

Body = dict[str, Any]
_TERMINAL = ("Succeeded", "Failed")
_DONE_STATES = (InstanceState.SUCCEEDED, InstanceState.FAILED)


class Retry(Exception):
    """Reconcile again later (``after`` seconds, or backoff when None)."""

    def __init__(self, reason: str, *, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return parse_time(value)
    except TimeFormatError:
        return None


class PodController:
    def __init__(
        self,
        *,
        client: KubeClient,
        settings: Settings,
        providers: Mapping[str, Provider],
        events: EventRecorder,
        refs: RefSource,
        metrics: Metrics,
        blocks: Blocks | None = None,
        clock: Callable[[], float] = time.monotonic,
        prober: ProberLike | None = None,
        endpoints: EndpointSink | None = None,
        policy: AddressPolicy | None = None,
    ) -> None:
        self.client = client
        self.status_writer = PodStatusWriter(client)
        self.settings = settings
        self.node = settings.node.name
        self.providers = dict(providers)
        self.events = events
        self.refs = refs
        self.metrics = metrics
        self.blocks = blocks or Blocks(clock=clock)
        self.clock = clock
        self.queue: WorkQueue[str] = WorkQueue(max_delay=settings.pods.max_backoff_seconds)
        self.informer = Informer(
            client=client,
            path="/api/v1/pods",
            params={"fieldSelector": f"spec.nodeName={self.node}"},
            handler=self._on_pod,
            name="pods",
            # Pods of one Deployment are mostly alike: the cache shares what they have in
            # common (kube/sharing.py), less than half the memory at 5,000 pods; an update
            # walks only what changed since the cached version.
            transform=(slim := SharedSlim(TreeSharer())),
            transform_update=slim.update,
        )
        self.policies = Informer(client=client, path=POLICIES_PATH, name="policies",
                                 missing_ok=True, handler=lambda _e, _o: None)
        self.gate = PolicyGate(client=client, node=self.node, policies=self.policies,
                               require_policy=settings.pods.require_policy, clock=clock)
        # One record per pod (node/podstate.py): what we know and told about it.
        self.pods = PodStates(clock=clock)
        self.pod_keys = self.pods.keys  # uid -> namespace/name of the pods the watch shows
        self.unsure = self.pods.unsure  # uid -> (provider, since): a create's outcome unknown
        self.placed = Placements()  # uid -> instance, from sweeps and creates; held totals
        self.listed: dict[str, bool] = dict.fromkeys(self.providers, False)  # last list ok?
        self.last_list: dict[str, float] = {}  # provider -> clock() of its last good list
        self.last_resync = clock()  # every pod reconciled after a sweep at least this often
        self.listed_once: set[str] = set()  # providers listed OK at least once by this process
        self.verbose_events = settings.pods.lifecycle_events == "verbose"
        self.cooldown: dict[str, float] = {}  # provider -> clock() until which it said 429
        # An unknown create stays pinned until a list that started this long after it failed
        # has not shown it (its request may still land, and a list may lag behind a create).
        self.unsure_hold_seconds = max(
            [p.timeout_seconds for p in settings.providers]
            + [settings.gpu_providers.timeout_seconds]) + UNSURE_SETTLE_SECONDS
        self.vanished = vanished.VanishBook()  # instances gone under their pods (vanished.py)
        # Every provider listed at once, none under the lock (node/listing.py): a sweep waits
        # for its new lists one interval at most.
        self.lister = Lister(clock=clock, wait=settings.pods.status_interval_seconds)
        self.orphans: dict[InstanceKey, float] = {}  # (provider, id) -> first sighting
        self.offers: list[Offer] = []
        self.offers_read = False
        self.largest_offer: dict[str, int] = {}  # GPU type -> most GPUs ever offered at once
        # Runtime provider changes (node/providerset.py); see the module docstring.
        self.providers_lock = asyncio.Lock()
        self.draining: set[str] = set()  # listed and deleted from, never created on
        self.caps: dict[str, ProviderCaps] = {}  # per-account spend caps
        self.reserved: dict[str, Held] = {}  # creates in flight, counted against the caps
        self.inflight: dict[str, int] = {}  # provider -> creates in flight
        # What this provider committed per policy and on the node (node/budgetbook.py): the
        # last gate on a policy's limits and the node's allocatable, never an annotation.
        self.book = BudgetBook()
        self.advertised_gpus: int | None = None  # nvidia.com/gpu allocatable last computed
        self._static_allocatable: Allocatable | None = None
        self.spend = SpendRecorder(client=client, node=self.node, metrics=metrics,
                                   namespace=settings.leader_election.namespace,
                                   blocks=self.blocks,
                                   every=settings.pods.spend_record_seconds, clock=clock)
        # Probes, published endpoints and drain of running replicas (node/replicas.py).
        self.replicas = Replicas(prober=prober, sink=endpoints, clock=clock,
                                 drain_seconds=settings.pods.drain_seconds)
        # Published addresses are untrusted: every instance from list() or create() is
        # screened here first (node/addressscreen.py, providers/addresses.py).
        self.addresses = AddressScreen(
            policy=policy if policy is not None else settings.endpoints.policy(),
            metrics=metrics)
        # called with (provider, operation, error or None) after each cloud call
        self.observer: Callable[[str, str, Exception | None], None] | None = None

    @property
    def inherited(self) -> set[str]:
        """Pod UIDs bound before our first sync (see the module docstring)."""
        return self.pods.inherited()

    @inherited.setter
    def inherited(self, uids: set[str]) -> None:
        self.pods.set_inherited(set(uids))

    # ---- capacity (the node reports it; create checks against it) ---------------------------

    async def node_capacity(self) -> NodeCapacity:
        """What the clouds sell now plus what our pods already hold (the node's allocatable)."""
        offers: list[Offer] = []
        answered = 0
        for name, provider in list(self.providers.items()):
            if name in self.draining:
                continue  # creates nothing: its offers are not the node's to sell
            try:
                got = await provider.capacity()
            except ProviderError as exc:
                self._count(name, "capacity", exc)
                log.warning("capacity read failed", extra=kv(provider=name, error=str(exc)))
                continue
            self._count(name, "capacity", None)
            answered += 1
            offers.extend(got)
        if not answered:
            raise ProviderError("no provider answered the capacity call")
        self.offers = offers
        self.offers_read = True
        for offer in offers:
            held = self.placed.gpus_on_offer((offer.provider, offer.gpu_type, offer.region))
            size = offer.available + held
            if size > self.largest_offer.get(offer.gpu_type, 0):
                self.largest_offer[offer.gpu_type] = size
        free = fold_capacity(offers, caps=self.caps, held=self.held_by_provider())
        # held: every placed instance, plus creates in flight (the budgets count them already)
        held = self.placed.total_gpus() + self.book.gpus_outside(self.placed)
        budget = self.gate.budget_gpus(offers=offers, usage=self.policy_usage(),
                                       providers=self.providers)
        if budget is not None:
            free = min(free, budget)
        self.advertised_gpus = free + held
        return NodeCapacity(gpus=free + held,
                            gpu_products=tuple(sorted({o.gpu_type for o in offers})))

    def held_by_provider(self) -> dict[str, Held]:
        """GPUs and $/h each provider holds for this node (not being deleted), plus in flight."""
        out = self.placed.held_by_provider()
        for name, held in self.reserved.items():
            out[name] = out.get(name, Held()).plus(gpus=held.gpus,
                                                   price_per_hour=held.price_per_hour)
        return out

    def _caps_refusal(self, name: str, spec: InstanceSpec) -> tuple[str | None, Held]:
        """Why ``spec`` would break the provider's caps, and what to reserve if it does not."""
        caps = self.caps.get(name)
        want = Held(gpus=spec.gpu_count, price_per_hour=expected_price(
            self.offers, provider=name, gpu_type=spec.gpu_type, region=spec.region,
            gpus=spec.gpu_count, interruptible=spec.interruptible))
        if caps is None or caps.unlimited:
            return None, want
        held = self.held_by_provider().get(name, Held())
        return caps_refusal(caps=caps, held=held, gpus=want.gpus,
                            price_per_hour=want.price_per_hour), want

    # ---- runtime provider changes (node/providerset.py) --------------------------------------

    async def add_provider(self, name: str, provider: Provider) -> None:
        """Serve a new provider; unknown (nothing created on it, inherited pods wait) until its
        first list."""
        async with self.providers_lock:
            if name in self.providers:
                raise ValueError(f"provider {name} exists")
            self.providers[name] = provider
            self.listed[name] = False
            self.draining.discard(name)

    async def replace_provider(self, name: str, provider: Provider) -> Provider:
        """Swap the adapter of the same account (new key or options); returns the old one.

        The instances are the same (same cloud, same tags), so what we know about them stays;
        blocks of the provider are lifted (new credentials deserve a new try).
        """
        async with self.providers_lock:
            old = self.providers[name]
            self.providers[name] = provider
            self.blocks.unblock_provider(name)
            return old

    async def retire_provider(self, name: str, *, alias: str) -> None:
        """Keep an account's adapter under ``alias``, draining, so ``name`` can be reused.

        Used when a GPUProvider points at another account or cloud (type or endpoint changed):
        the instances on the old one keep being listed and deleted under the alias.
        """
        async with self.providers_lock:
            if name not in self.providers:
                return
            self.providers[alias] = self.providers.pop(name)
            self.listed[alias] = self.listed.pop(name, False)
            if name in self.listed_once:
                self.listed_once.discard(name)
                self.listed_once.add(alias)
            if name in self.last_list:
                self.last_list[alias] = self.last_list.pop(name)
            if name in self.inflight:
                self.inflight[alias] = self.inflight.pop(name)
            if name in self.reserved:
                self.reserved[alias] = self.reserved.pop(name)
            self.placed.rename_provider(name, alias)
            self.orphans = {((alias if p == name else p), i): t
                            for (p, i), t in self.orphans.items()}
            self.spend.book.rename(name, alias)
            self.blocks.unblock_provider(name)  # the next account under this name starts afresh
            for uid, (where, since) in list(self.unsure.items()):
                if where == name:
                    self.unsure[uid] = (alias, since)
            self.vanished.rename_provider(name, alias)
            self.draining.discard(name)
            self.draining.add(alias)
            self.caps.pop(name, None)

    def set_draining(self, name: str, draining: bool) -> None:
        if draining and name in self.providers:
            self.draining.add(name)
        else:
            self.draining.discard(name)

    async def remove_drained(self) -> list[tuple[str, Provider]]:
        """Drop drained providers that hold nothing of ours; the caller closes them."""
        out: list[tuple[str, Provider]] = []
        async with self.providers_lock:
            for name in sorted(self.draining):
                if (
                    not self.listed.get(name)
                    or self.inflight.get(name)
                    or self.placed.uses_provider(name)
                    or any(where == name for where, _ in self.unsure.values())
                ):
                    continue
                provider = self.providers.pop(name, None)
                self.draining.discard(name)
                self.listed.pop(name, None)
                self.listed_once.discard(name)
                self.last_list.pop(name, None)
                self.caps.pop(name, None)
                if provider is not None:
                    out.append((name, provider))
        return out

    def hold_back(self, name: str, unknown: bool) -> None:
        """Mark a provider that is declared but not built yet as unknown (inherited pods wait)."""
        if unknown:
            if name not in self.providers:
                self.listed[name] = False
        elif name not in self.providers:
            self.listed.pop(name, None)

    def blind_to(self, uid: str) -> list[str]:
        """Unknown providers that may hide an instance of this pod (see the module docstring)."""
        record = self.pods.get(uid)
        if record is None or not record.inherited:
            return []
        return sorted(n for n, ok in self.listed.items() if not ok and n not in self.listed_once)

    def _key_of(self, provider: Provider, default: str) -> str:
        """The name a provider object is served under now (it may have been retired)."""
        if self.providers.get(default) is provider:
            return default
        for key, value in self.providers.items():
            if value is provider:
                return key
        return default

    # ---- policies: money is only spent on purpose (node/policygate.py) ---------------------

    def parsed_policies(self) -> dict[str, pol.OverflowPolicy]:
        return self.gate.parsed()

    def policy_usage(self) -> dict[str, Usage]:
        """Pods, GPUs and $/h this node has committed per policy (node/budgetbook.py: the
        policy the provider resolved at create, never the pod's annotation)."""
        return self.book.usage_by_policy()

    def allocatable(self) -> Allocatable:
        """The node's allocatable as published: pods, cpu, memory from the settings (parsed
        once), ``nvidia.com/gpu`` as last computed by :meth:`node_capacity`."""
        if self._static_allocatable is None:
            node = self.settings.node
            self._static_allocatable = allocatable(pods=node.pods, cpu=node.cpu,
                                                   memory=node.memory, gpus=None)
        return dataclasses.replace(self._static_allocatable, gpus=self.advertised_gpus)

    def claim_of(self, pod: Body, instance: Instance) -> Claim:
        """A claim for an instance found in a list (adopted after a restart): its policy from
        the tags the provider wrote at create."""
        cpu, memory = pod_requests(pod)
        return Claim(policy=instance.tags.get(TAG_POLICY) or None, gpus=instance.gpu_count,
                     price_per_hour=instance.price_per_hour, cpu_millis=cpu,
                     memory_bytes=memory)

    def _claim_listed(self, uids: list[str]) -> None:
        """Count instances a list shows that the book does not (after a restart, or a provider
        listed late): before any create may race past them. O(uids): a sweep passes only the
        instances whose record is new."""
        for uid in uids:
            placed = self.placed.get(uid)
            key = self.pod_keys.get(uid)
            pod = self.informer.store.get(key) if key else None
            if (pod is not None and placed is not None and uid not in self.book
                    and not pod["metadata"].get("deletionTimestamp")
                    and (pod.get("status") or {}).get("phase") not in _TERMINAL
                    and placed.instance.state != InstanceState.TERMINATING
                    and self.placed.deleting_since(placed.key) is None):
                self.book.put(uid, self.claim_of(pod, placed.instance))

    def _unrunnable(self, spec: InstanceSpec) -> str | None:
        """Why no configured cloud could ever run ``spec`` (checked before any create call)."""
        if spec.gpu_count <= 0 or not self.largest_offer:
            return None
        if spec.gpu_type is not None and spec.gpu_type not in self.largest_offer:
            known = ", ".join(sorted(self.largest_offer))
            return f"no provider sells GPU type {spec.gpu_type!r} (sold: {known})"
        types = [spec.gpu_type] if spec.gpu_type else list(self.largest_offer)
        largest = max(self.largest_offer[t] for t in types)
        if largest == 0:
            return None  # sold but out of stock everywhere so far: wait for capacity
        if spec.gpu_count > largest:
            return (f"{spec.gpu_count} GPUs requested; the largest offer of "
                    f"{spec.gpu_type or 'any type'} is {largest}")
        return None

    # ---- wiring ------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.informer.run(), name="pods-informer")
            tg.create_task(self.policies.run(), name="policies-informer")
            await self.informer.synced.wait()
            await self.policies.synced.wait()
            self.pods.mark_inherited()  # a predecessor may have created for these
            await self.spend.load()  # before the first sweep counts anything
            await self.sweep()  # adopt what exists before any worker may create
            self._publish_running()  # endpoints of adopted replicas, before slices are pruned
            log.info("pods synced and instances adopted; starting workers",
                     extra=kv(pods=len(self.pod_keys), instances=len(self.placed),
                              unlisted=",".join(n for n, ok in self.listed.items() if not ok)))
            tg.create_task(self._sweeper(), name="status-sweeper")
            for i in range(self.settings.pods.workers):
                tg.create_task(self._worker(), name=f"pod-worker-{i}")

    def _publish_running(self) -> None:
        for uid, placed in self.placed.items():
            key = self.pod_keys.get(uid)
            pod = self.informer.store.get(key) if key else None
            if pod is not None and placed.instance.state == InstanceState.RUNNING:
                self.replicas.running(uid=uid, pod=pod, provider=placed.provider,
                                      instance=placed.instance)
        for uid in self.pod_keys:  # on a cloud not listed yet: endpoints kept as they are
            ran_on = self._annotations(uid).get(duplicates.PROVIDER_ANNOTATION)
            if uid not in self.placed and ran_on is not None and ran_on in self.listed \
                    and not self.listed[ran_on]:
                self.replicas.hold(uid)
        self.replicas.synced()

    def _release_held(self, started: Mapping[str, float]) -> None:
        """Held endpoints (see :meth:`_publish_running`) of pods whose cloud has now been
        listed without their instance: they go. Those listed with it are published by their
        reconcile."""
        for uid in self.replicas.held():
            if uid in self.placed:
                continue
            ran_on = self._annotations(uid).get(duplicates.PROVIDER_ANNOTATION)
            if ran_on in started or ran_on not in self.listed or uid not in self.pod_keys:
                self.replicas.forget(uid)

    def _on_pod(self, event: str, pod: Body) -> None:
        uid = str(pod["metadata"].get("uid", ""))
        if not uid:
            return
        if event == "DELETED":
            self.pods.unwatched(uid)
        else:
            self.pods.watched(uid, object_key(pod))
        self.queue.add(uid)

    async def _sweeper(self) -> None:
        interval = self.settings.pods.status_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except Exception:  # the sweeper must outlive any bug in one sweep
                log.exception("status sweep failed")

    async def _worker(self) -> None:
        while True:
            try:
                uid = await self.queue.get()
            except ShutDown:
                return
            try:
                await self.reconcile(uid)
                self.queue.forget(uid)
            except Retry as exc:
                self.metrics.queue_retries.inc()
                if exc.after is not None:
                    self.queue.add_after(uid, exc.after)
                else:
                    self.queue.add_rate_limited(uid)
            except (APIError, ProviderError) as exc:
                self.metrics.queue_retries.inc()
                delay = self.queue.add_rate_limited(uid, at_least=_retry_after(exc))
                log.warning("reconcile failed; will retry",
                            extra=kv(uid=uid, pod=self.pod_keys.get(uid), error=str(exc),
                                     retry_in=round(delay, 2)))
            except Exception:
                self.metrics.queue_retries.inc()
                self.queue.add_rate_limited(uid)
                log.exception("reconcile crashed; will retry", extra=kv(uid=uid))
            finally:
                self.queue.done(uid)
                self.metrics.queue_depth.set(len(self.queue))

    # ---- the sweep: one list per provider ----------------------------------------------------

    async def sweep(self) -> None:
        """One sweep: every provider listed at once (node/listing.py, no lock held over the
        calls); the answers applied under ``providers_lock`` (one view of the providers);
        then the cloud calls the answers ask for (duplicates, orphans), in parallel."""
        with self.metrics.sweep_duration.time():
            async with self.providers_lock:
                serving = list(self.providers.items())
            results = await self.lister.round(serving)
            async with self.providers_lock:
                doomed = self._apply_lists(results, served=[n for n, _ in serving])
            await self._bounded(doomed)
            await self._collect_orphans(self.clock())
            await self._sweep_registry_auth()
            await self.spend.maybe_record()

    async def _bounded(self, deletes: list[tuple[str, str, str]]) -> None:
        """Delete ``(provider, instance id, why)`` in parallel, at most 8 calls at once."""
        if not deletes:
            return
        gate = asyncio.Semaphore(8)

        async def one(provider: str, instance_id: str, why: str) -> None:
            async with gate:
                await self._delete_instance(provider, instance_id, why=why)

        await asyncio.gather(*(one(*d) for d in deletes))

    def _served_as(self, result: ListResult) -> str | None:
        """The name a listed provider is served under now (retired: its alias; replaced by a
        new adapter of the same account: its name); None once it is gone."""
        for key, value in self.providers.items():
            if value is result.provider:
                return key
        return result.name if result.name in self.providers else None

    def _apply_lists(self, results: list[ListResult], *, served: list[str]
                     ) -> list[tuple[str, str, str]]:
        """Take the lists that finished into the view of every pod; no await (the caller holds
        ``providers_lock``). Returns the duplicate instances to delete."""
        now = self.clock()
        seen: dict[str, Placed] = {}
        fresh: list[str] = []  # pods whose instance record is new in this sweep
        doomed: list[tuple[str, str, str]] = []
        started: dict[str, float] = {}  # provider -> start of its list that answered now
        answered: set[str] = set()
        for result in results:
            name = self._served_as(result)
            if name is None:
                continue  # removed while it was listed
            answered.add(name)
            if result.instances is None:
                self.listed[name] = False
                self._count(name, "list", result.error)
                log.warning("provider list failed",
                            extra=kv(provider=name, error=str(result.error)))
                continue
            at = result.started
            started[name] = at
            self._count(name, "list", None)
            self.listed[name] = True
            self.listed_once.add(name)
            self.last_list[name] = at
            ours = [i for i in result.instances
                    if i.tags.get(TAG_UID) and i.tags.get(TAG_NODE) == self.node]
            # the list's start: never count what was not billed
            self.spend.book.observe(provider=name, instances=ours, at=result.started_wall)
            cost = 0.0
            for listed in ours:
                uid = listed.tags[TAG_UID]
                inst = self.addresses.screen(uid=uid, provider=name, instance=listed)
                cost += inst.price_per_hour
                other = seen.get(uid)
                if other is not None and other.instance.id != inst.id:
                    keep, drop = duplicates.keep_first(
                        other, Placed(name, inst, at), annotations=self._annotations(uid))
                    log.error("two instances for one pod; deleting the one not serving",
                              extra=kv(uid=uid, keep=keep.instance.id, delete=drop.instance.id))
                    doomed.append((drop.provider, drop.instance.id, "duplicate"))
                    if keep is other:
                        continue
                    inst, name_kept = keep.instance, keep.provider
                    seen[uid] = Placed(provider=name_kept, instance=inst, seen_at=at)
                    fresh.append(uid)
                    continue
                prev = self.placed.get(uid)
                if prev is not None and prev.instance is inst and prev.provider == name \
                        and prev.listed:
                    # Listed exactly as before (the adapter hands back the same Instance):
                    # the same record, seen again. Readers that cache by record (the kubelet
                    # API's view) keep their work, and 5,000 pods cost no new records a sweep.
                    prev.seen_at = at
                    seen[uid] = prev
                else:
                    seen[uid] = Placed(provider=name, instance=inst, seen_at=at)
                    fresh.append(uid)
            self.metrics.instances.labels(name).set(len(ours))
            self.metrics.cost.labels(name).set(round(cost, 6))
        for name in served:
            if name not in answered and name in self.providers:
                self.listed[name] = False  # its list is still out: unknown this sweep
        # Keep what we created since its provider's list began (lists may lag behind creates),
        # and what providers we could not list reported last time.
        for uid, placed in self.placed.items():
            if uid in seen:
                continue
            began = started.get(placed.provider)
            if began is None or placed.seen_at > began:
                seen[uid] = placed
        before = self.placed.snapshot()
        gone = vanished.detect(before=before, after=seen, listed=self.listed,
                               list_started=started, deleting=self.placed.deleting_since,
                               pods=self._live_pod)
        self.placed.replace(seen)
        self.addresses.keep_only(seen)
        self._claim_listed(fresh)  # counted against budgets before any worker creates more
        vanished.found(self, gone)  # endpoints withdrawn now; the pod is told by its reconcile
        self._release_held(started)
        hold = self.unsure_hold_seconds
        for uid, (where, since) in list(self.unsure.items()):
            if uid in seen or (where in started and started[where] >= since + hold):
                del self.unsure[uid]  # the list has spoken: it exists, or it never happened
        full = now - self.last_resync >= self.settings.pods.resync_seconds
        if full:
            self.last_resync = now
        for uid in list(self.pod_keys):
            if uid not in self.placed and before.get(uid) is None:
                # Still to be created: a pod backing off (no capacity, Retry-After) keeps its
                # delay; the sweep only wakes one that is not already scheduled.
                if self.changed_in_sweep(uid, None):
                    self.queue.nudge(uid)
            elif full or self.changed_in_sweep(uid, before.get(uid)):
                self.queue.add(uid)
        self.metrics.queue_depth.set(len(self.queue))
        return doomed

    def _annotations(self, uid: str) -> dict[str, str]:
        key = self.pod_keys.get(uid)
        pod = self.informer.store.get(key) if key else None
        return dict((pod or {}).get("metadata", {}).get("annotations") or {})

    def _live_pod(self, uid: str) -> bool:
        """Whether the pod is on the node, not being deleted and not finished."""
        key = self.pod_keys.get(uid)
        pod = self.informer.store.get(key) if key else None
        return (pod is not None and not pod["metadata"].get("deletionTimestamp")
                and (pod.get("status") or {}).get("phase") not in _TERMINAL)

    async def _sweep_registry_auth(self) -> None:
        """Cloud-side pull credentials no instance uses any more are deleted (RunPod); cheap
        when nothing was deleted since the last sweep (the adapter keeps track)."""
        for name, provider in list(self.providers.items()):
            if not self.listed.get(name):
                continue
            try:
                removed = await sweep_registry_auth(provider)
            except ProviderError as exc:
                log.warning("registry credential cleanup failed",
                            extra=kv(provider=name, error=str(exc)))
                continue
            if removed:
                log.info("registry credentials deleted", extra=kv(provider=name, count=removed))

    def changed_in_sweep(self, uid: str, before: Placed | None) -> bool:
        """Whether a sweep must reconcile this pod: its instance changed, or it is in motion.

        A steady Running pod whose instance the cloud reports exactly as before has nothing to
        do; its pod changing reaches the queue through the watch. Skipping it is what keeps a
        sweep over 5,000 pods cheap (bench/steady.py); ``resync_seconds`` reconciles every pod
        anyway, as an informer's resync would.
        """
        placed = self.placed.get(uid)
        if placed is None:
            if before is not None:
                return True  # its instance is gone from the list
            key = self.pod_keys.get(uid)
            pod = self.informer.store.get(key) if key else None
            phase = ((pod or {}).get("status") or {}).get("phase")
            return phase not in _TERMINAL  # still to be created (a finished one rests)
        inst = placed.instance
        return (
            before is None
            or (before.instance is not inst and before.instance != inst)
            or inst.state != InstanceState.RUNNING
            or self.placed.deleting_since(placed.key) is not None
            or uid in self.unsure
        )

    async def _collect_orphans(self, now: float) -> None:
        if not self.informer.synced.is_set():
            return
        live: set[InstanceKey] = set()
        doomed: list[tuple[str, str, str]] = []
        for uid, placed in self.placed.items():
            key = placed.key
            live.add(key)
            if uid in self.pod_keys:
                self.orphans.pop(key, None)
                continue
            if not self.listed.get(placed.provider):
                continue
            first = self.orphans.setdefault(key, now)
            if now - first >= self.settings.pods.orphan_grace_seconds and first < now:
                doomed.append((placed.provider, placed.instance.id, "orphan"))
                self.metrics.orphans_deleted.labels(placed.provider).inc()
        for key in [k for k in self.orphans if k not in live]:
            del self.orphans[key]
        await self._bounded(doomed)  # in parallel: one slow cloud never holds up the others

    def _delete_in_progress(self, placed: Placed) -> bool:
        """Whether our delete of this instance may still be under way.

        A cloud that accepted a delete but did nothing would bill forever if we trusted it: an
        instance still listed, and not terminating, ``delete_retry_seconds`` after our call is
        deleted again.
        """
        at = self.placed.deleting_since(placed.key)
        if at is None:
            return False
        if placed.instance.state == InstanceState.TERMINATING:
            return True
        return self.clock() - at < self.settings.pods.delete_retry_seconds

    async def _delete_instance(self, provider: str, instance_id: str, *, why: str) -> bool:
        """Ask the cloud to delete; True once the cloud accepted (or it is already gone)."""
        adapter = self.providers.get(provider)
        if adapter is None:  # removed meanwhile; the next sweep shows where it is now
            return False
        try:
            await adapter.delete(instance_id)
        except NotFound:
            pass
        except ProviderError as exc:
            self._count(provider, "delete", exc)
            log.warning("instance delete failed", extra=kv(provider=provider,
                                                           instance=instance_id, why=why,
                                                           error=str(exc)))
            return False
        self._count(provider, "delete", None)
        self.placed.mark_deleting((provider, instance_id), at=self.clock())
        log.info("instance deleted", extra=kv(provider=provider, instance=instance_id, why=why))
        return True

    # ---- reconcile ---------------------------------------------------------------------------

    async def reconcile(self, uid: str) -> None:
        key = self.pod_keys.get(uid)
        pod = self.informer.store.get(key) if key else None
        if pod is not None and pod["metadata"].get("uid") != uid:
            pod = None
        placed = self.placed.get(uid)
        if pod is None:
            await self._pod_gone(uid, placed)
            return
        if pod["metadata"].get("deletionTimestamp"):
            await self._terminate(pod, uid, placed)
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in _TERMINAL:
            self.book.drop(uid)
            if (record := self.pods.get(uid)) is not None:
                record.told_budget = None
            self.vanished.forget(uid)
            if placed is not None:
                await self._stop_spend(placed)
            return
        if placed is None:
            if uid in self.vanished and (await vanished.tell(self, pod, uid)
                                         or not vanished.wants_restart(pod)):
                return  # restartPolicy Never: the pod failed (its status is on its way)
            await self._create(pod, uid)
            return
        await self._sync(pod, uid, placed)

    async def _pod_gone(self, uid: str, placed: Placed | None) -> None:
        if (
            placed is not None
            and not self._delete_in_progress(placed)
            and not await self._delete_instance(placed.provider, placed.instance.id,
                                                why="pod deleted")
        ):
            raise Retry("instance delete failed")
        self.queue.remove(uid)
        self.book.drop(uid)
        self.pods.drop(uid)  # every per-pod fact at once (node/podstate.py)
        self.vanished.forget(uid)
        self.addresses.forget(uid)
        self.replicas.forget(uid)
        if placed is None or self._delete_in_progress(placed):
            self.placed.pop(uid)

    async def _stop_spend(self, placed: Placed) -> None:
        self.replicas.forget(str(placed.instance.tags.get(TAG_UID, "")))
        if self._delete_in_progress(placed):
            return
        if placed.instance.state == InstanceState.TERMINATING:
            return
        if not await self._delete_instance(placed.provider, placed.instance.id,
                                           why="pod finished"):
            raise Retry("instance delete failed")

    async def _terminate(self, pod: Body, uid: str, placed: Placed | None) -> None:
        meta = pod["metadata"]
        if placed is not None and not self._delete_in_progress(placed):
            left = self.replicas.drain_left(uid=uid, pod=pod, instance=placed.instance,
                                            was_ready=_is_ready(pod))
            if left > 0:  # endpoints are terminating; load balancers stop sending first
                raise Retry("draining", after=left)
            self.replicas.forget(uid)
            if await self._delete_instance(placed.provider, placed.instance.id,
                                           why="pod terminating"):
                if self.verbose_events:
                    await self.events.emit(obj=_pod_ref(pod), reason="Killing",
                                           message=f"Stopping instance {placed.instance.id} on "
                                                   f"{placed.provider}")
            else:
                deadline = _parse_time(meta.get("deletionTimestamp"))
                if deadline is None or datetime.now(UTC) < deadline:
                    raise Retry("instance delete failed")
                # Past the grace period: let the pod go; the orphan collector keeps deleting.
        if uid in self.unsure:
            raise Retry("a create may be in flight", after=1.0)
        self.book.drop(uid)  # its instance is being deleted: its slot is free
        if meta.get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers"):
            return  # deleted with grace 0: the API server removes it itself (a DELETE: a 404)
        try:
            await self.client.delete(pod_path(pod), grace_period_seconds=0, uid=uid)
            self.metrics.kube_writes.labels("pod_delete").inc()
        except (NotFoundError, ConflictError):
            pass

    # ---- create ------------------------------------------------------------------------------

    async def _create(self, pod: Body, uid: str) -> None:
        meta = pod["metadata"]
        record = self.pods.ensure(uid)
        # Policy first: a pod no policy admits never has its Secrets read.
        policy, refusal = await self.gate.admitting(pod)
        if refusal:
            await self._reject(pod, reason="NotAdmitted",
                               message=f"not sent to any cloud: {refusal}")
            return
        if uid not in self.unsure:
            self.book.drop(uid)  # no instance, no create in doubt: an old claim is stale
        policy = self._sticky_policy(uid, policy)
        # Budgets and the node's allocatable before anything else (no Secret read, no cloud
        # call); checked again, and reserved, right before each create below.
        cpu, memory = pod_requests(pod)
        claim = Claim(policy=policy.name if policy is not None else None, gpus=pod_gpus(pod),
                      cpu_millis=cpu, memory_bytes=memory)
        early = self.book.refusal(uid, claim, limits=policy.spec.limits if policy else None,
                                  node=Allocatable())
        if early is not None:
            await self._refuse_over(pod, meta, early)
            return
        blind = self.blind_to(uid)
        if blind:
            wait = (f"{', '.join(blind)} not listed yet and may hold this pod's instance "
                    "(created before a restart); not creating blind")
            if not record.told_blind:  # once per pod: say why it waits
                record.told_blind = True
                log.info("pod waits for a provider list", extra=kv(pod=object_key(pod), uid=uid,
                                                                    providers=",".join(blind)))
                await self.events.emit(obj=_pod_ref(pod), reason="WaitingForProvider",
                                       message=f"Waiting: {wait}")
            raise Retry(wait, after=2.0)
        record.told_blind = False
        try:
            spec = await translate(
                pod=pod, node_name=self.node, refs=self.refs,
                ignore_exec_probes=policy is not None and policy.spec.exec_probes == "Ignore",
                # One Warning naming what the clouds this pod may go to drop (not again on
                # each retry after NoCapacity: nothing about the pod changed).
                adapters=[p for n, p in self.providers.items()
                          if policy is None or n in policy.spec.providers],
                on_dropped=None if record.unplaced_tries else (
                    lambda dropped: self.events.record(
                        obj=_pod_ref(pod), reason="FieldsDropped", type_="Warning",
                        message=dropped.message)))
        except PodRejected as exc:
            await self._reject(pod, reason=exc.reason, message=f"{exc.field}: {exc.message}")
            return
        except PodConfigPending as exc:
            status = podstatus.config_pending_status(pod=pod, message=exc.message,
                                                     now=datetime.now(UTC))
            await self._write_status(pod, status)
            await self.events.emit(obj=_pod_ref(pod), reason="Failed", type_="Warning",
                                   message=f"Error: {exc.message} ({exc.field})")
            raise Retry("waiting for a Secret/ConfigMap") from None
        if policy is not None:  # a restart counts the instance under the policy it was made for
            spec = dataclasses.replace(spec, tags={**spec.tags, TAG_POLICY: policy.name})
        # The kubelet's admission: the pods the node runs must fit its allocatable (a pod bound
        # by hand skipped the scheduler's check). GPUs are checked per offer below.
        unfit = self.book.refusal(uid, claim, limits=None,
                                  node=dataclasses.replace(self.allocatable(), gpus=None))
        if unfit is not None:
            await self._refuse_over(pod, meta, unfit)
            return

        if not self.offers_read:
            await self.node_capacity()
        why = self._unrunnable(spec)
        if why is not None:
            reason = "UnknownGPUType" if "GPU type" in why else "GPUCountUnavailable"
            await self._reject(pod, reason=reason, message=why)
            return

        allowed = [n for n in self.providers if n not in self.draining]
        if policy is not None:
            allowed = [n for n in policy.spec.providers
                       if n in self.providers and n not in self.draining]
            if not allowed:
                await self._reject(pod, reason="NotAdmitted",
                                   message=f"OverflowPolicy {policy.name} names providers "
                                           f"{', '.join(policy.spec.providers)}, none of which "
                                           f"this node serves")
                return
        if spec.gpu_count <= 0:
            # Most clouds here rent GPU machines only; ask only those that run GPU-less pods.
            able = [n for n in allowed if runs_without_gpu(self.providers[n])]
            if not able:
                await self._reject(
                    pod, reason="InvalidResources",
                    message=f"spec.containers[0].resources.limits[nvidia.com/gpu]: no GPU "
                            f"requested, and none of {', '.join(allowed) or 'no provider'} "
                            "runs pods without a GPU (set a GPU limit of at least 1)")
                return
            allowed = able
        # (provider, interruptible) candidates: placement mode and spec.interruptible (spot.py)
        plan = [(c.provider, c.interruptible) for c in spot.plan(
            allowed, offers=self.offers, gpu_type=spec.gpu_type, gpus=spec.gpu_count,
            blocked=lambda o: self.blocks.blocked(provider=o.provider, region=o.region,
                                                  gpu_type=o.gpu_type) is not None,
            mode=policy.spec.interruptible if policy is not None else "Never",
            cheapest=policy is not None and policy.spec.placement == "Cheapest")]
        # Pinned to one provider: a create there may have happened (unsure), or the pod ran there
        # and its instance is missing from the list (lagging, or gone). Only a create on that same
        # provider is safe: idempotent by name, it returns the instance if it exists after all.
        unsure = self.unsure.get(uid)
        ran_on = (meta.get("annotations") or {}).get(f"{podstatus.ANNOTATION_PREFIX}provider")
        if uid in self.vanished:
            ran_on = None  # a list proved its instance gone: a new one goes where it fits best
        pinned = unsure[0] if unsure else (ran_on if ran_on in self.providers else None)
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
            if not sticky and not self.listed.get(name, False):
                unlisted.append(name)  # never place new work where we cannot see it
                continue
            pause = self.cooldown.get(name, 0.0) - self.clock()
            if pause > 0:  # it asked us to slow down (Retry-After): no pod asks it before then
                if sticky:
                    raise Retry(f"{name}: rate limited", after=pause)
                cooling.append(pause)
                continue
            block = self.blocks.blocked(provider=name, region=spec.region, gpu_type=spec.gpu_type)
            if block is not None and not sticky:
                reasons.append(f"{name}: blocked ({block.reason})")
                continue
            unsold = spot.not_sold(self.offers, provider=name, gpu_type=spec.gpu_type,
                                   interruptible=interruptible) if spec.gpu_type else None
            if not sticky and self.offers_read and unsold is not None:
                reasons.append(unsold)
                continue
            provider = self.providers.get(name)
            if provider is None:
                raise Retry(f"{name}: no longer served", after=1.0)
            over, want = self._caps_refusal(name, spec)
            if over is not None and not sticky:
                reasons.append(f"{name}: blocked (provider budget: {over})")
                continue
            # The policy's limits and the node's allocatable, at this offer's price: checked and
            # reserved with no await in between, so parallel workers never share the last slot.
            claim = dataclasses.replace(claim, gpus=spec.gpu_count,
                                        price_per_hour=want.price_per_hour)
            budget_over, before = self.book.reserve(
                uid, claim, limits=policy.spec.limits if policy else None,
                node=self.allocatable())
            if budget_over is None and (policy is not None and spec.gpu_count > 0
                                        and policy.spec.limits.max_price_per_hour is not None
                                        and want.price_per_hour <= 0):
                self.book.restore(uid, before)  # a price cap and no price known: fail closed
                budget_over = Refusal(node=False, budget="maxPricePerHour", message=(
                    f"OverflowPolicy {policy.name}: maxPricePerHour "
                    f"${policy.spec.limits.max_price_per_hour:.2f} and {name} quotes no price "
                    f"for {spec.gpu_type or 'this GPU'}"))
            if budget_over is not None:
                if budget_over.node and budget_over.budget != "nvidia.com/gpu":
                    await self._refuse_over(pod, meta, budget_over)  # pods, cpu, memory
                    return
                if budget_over.node:
                    reasons.append(f"{name}: {budget_over.message} (node allocatable)")
                else:
                    over_budget.append(budget_over)
                continue
            kept = False  # True once the claim stands: created, or the outcome is unknown
            self.reserved[name] = self.reserved.get(name, Held()).plus(
                gpus=want.gpus, price_per_hour=want.price_per_hour)
            self.inflight[name] = self.inflight.get(name, 0) + 1
            try:
                inst = await provider.create(spec)
            except CapacityError as exc:
                self._count(name, "create", exc)
                self.blocks.block(provider=name, region=spec.region,
                                  gpu_type=spec.gpu_type if spec.gpu_type else ANY_TYPE,
                                  seconds=self.settings.pods.capacity_block_seconds,
                                  reason="no capacity")
                reasons.append(f"{name}: no capacity ({exc})")
                continue
            except AuthError as exc:
                self._count(name, "create", exc)
                self.blocks.block(provider=name, region=None, gpu_type=None, seconds=300,
                                  reason="credentials rejected")
                reasons.append(f"{name}: credentials rejected")
                continue
            except QuotaError as exc:  # account-wide: no other offer of it will do
                self._count(name, "create", exc)
                self.blocks.block(provider=name, region=None, gpu_type=None,
                                  seconds=self.settings.pods.capacity_block_seconds,
                                  reason="quota")
                reasons.append(f"{name}: quota ({exc})")
                continue
            except ImagePullError as exc:  # the image's credentials: wait, as ImagePullBackOff
                self._count(name, "create", exc)
                pull_denied.append(exc)
                continue
            except InvalidSpec as exc:  # this cloud never can; another of the policy may
                self._count(name, "create", exc)
                text = str(exc)
                refused.append(text if text.startswith(f"{name}:") else f"{name}: {text}")
                continue
            except ProviderError as exc:  # transient or rate limited: outcome unknown
                kept = True  # the instance may exist: its claim stays until a list tells
                self._count(name, "create", exc)
                if isinstance(exc, RateLimited) and exc.retry_after:
                    self.cooldown[name] = self.clock() + exc.retry_after
                # pinned to it, counted from this failure (the latest request may land last)
                self.unsure[uid] = (self._key_of(provider, name), self.clock())
                if self._past_create_deadline(meta):
                    # Failed, not forgotten: an instance that did start is deleted once listed
                    await self._give_up(pod, f"the last try: {name}: {exc}")
                    return
                after = exc.retry_after if isinstance(exc, RateLimited) else None
                raise Retry(f"{name}: {exc}", after=after) from exc
            else:
                kept = True
            finally:
                self._release(name, provider, want)
                if not kept:
                    self.book.restore(uid, before)
            self.book.priced(uid, inst.price_per_hour)  # the cloud's price, not the offer's
            name = self._key_of(provider, name)  # retired while the call ran: its alias
            inst = self.addresses.screen(uid=uid, provider=name, instance=inst)
            self._count(name, "create", None)
            self.unsure.pop(uid, None)
            record.told_no_capacity = record.told_budget = None
            record.unplaced_tries = 0
            self.placed.set(uid, Placed(provider=name, instance=inst, seen_at=self.clock(),
                                        listed=False))
            self.metrics.create_latency.labels(name).observe(
                self.clock() - record.first_seen)
            log.info("instance created", extra=kv(pod=object_key(pod), uid=uid, provider=name,
                                                  instance=inst.id))
            if self.verbose_events:
                self._tell_created(pod, uid, self.placed[uid])
            await self._sync(pod, uid, self.placed[uid])
            return

        if over_budget and not (reasons or refused or pull_denied or cooling or unlisted):
            await self._refuse_over(pod, meta, over_budget[0])  # every offer breaks the budget
            return
        reasons += [f"{o.message} (policy budget)" for o in over_budget]
        if pull_denied and not self._past_create_deadline(meta):
            await self._image_pull_backoff(pod, spec, pull_denied)
        if cooling and not self._past_create_deadline(meta):
            # a provider of this pod only asked us to wait: no event, no failover cost
            raise Retry("rate limited by the cloud", after=min(cooling))
        if refused and not reasons and not unlisted:  # every cloud tried says never
            await self._reject(pod, reason="ProviderRejected", message="; ".join(refused))
            return
        reasons += [f"{r} (refused)" for r in refused]
        if unlisted and not reasons and not self._past_create_deadline(meta):
            # only unknown providers were left: a failed list is usually one sweep's blip
            raise Retry(f"{', '.join(unlisted)} cannot be listed now", after=2.0)
        await self._no_provider(pod, meta, spec, list(dict.fromkeys(  # a provider's 2 kinds
            reasons + [f"{n}: cannot be listed now" for n in unlisted])))

    async def _image_pull_backoff(self, pod: Body, spec: InstanceSpec,
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
        await self._write_status(pod, status)
        await self.events.emit(obj=_pod_ref(pod), reason="Failed", type_="Warning",
                               message=f"Failed to pull image {spec.image!r}: {message}")
        raise Retry("image pull refused")  # rate-limited backoff, up to max_backoff_seconds

    def _sticky_policy(self, uid: str, policy: pol.OverflowPolicy | None
                       ) -> pol.OverflowPolicy | None:
        """A create retried after an unknown outcome keeps the policy of its claim (while that
        policy exists): the same tags, so the same instance if the first try did happen."""
        claim = self.book.get(uid)
        if claim is None or claim.policy is None or policy is None \
                or claim.policy == policy.name:
            return policy
        return self.gate.parsed().get(claim.policy, policy)

    async def _refuse_over(self, pod: Body, meta: Body, over: Refusal) -> None:
        """Not created: the node's allocatable (pods, cpu, memory) fails the pod as the kubelet
        does (``OutOf<resource>``); a policy's budget keeps it waiting, told once per reason
        (Warning ``BudgetExceeded``), and fails it at the create deadline."""
        if over.node:
            await self._reject(pod, reason=OUT_OF_REASONS[over.budget], message=over.message)
            return
        message = f"not sent to any cloud: {over.message}"
        if self._past_create_deadline(meta):
            await self._reject(pod, reason="BudgetExceeded", message=message)
            return
        uid = str(meta.get("uid"))
        record = self.pods.ensure(uid)
        if record.told_budget != over.message:
            record.told_budget = over.message
            log.info("pod over its policy's budget", extra=kv(pod=object_key(pod), uid=uid,
                                                              budget=over.budget))
            await self.events.emit(obj=_pod_ref(pod), reason="BudgetExceeded", type_="Warning",
                                   message=f"{message}; waiting for the budget to free up")
        # A check costs no cloud call: look again soon, less often the longer the pod waits
        # (1 s, up to 10 s).
        waited = self.clock() - record.first_seen
        delay = min(10.0, max(1.0, waited / 2))
        raise Retry("over the policy's budget",
                    after=max(0.5, min(delay, self._until_create_deadline(meta) + 0.1)))

    def _release(self, name: str, provider: Provider, want: Held) -> None:
        """Undo the reservation of one create (under the name it is served by now)."""
        key = self._key_of(provider, name)  # retire_provider moved its bookkeeping there
        if key in self.reserved:
            left = self.reserved[key].minus(gpus=want.gpus, price_per_hour=want.price_per_hour)
            self.reserved[key] = left
            if left.gpus == 0 and left.price_per_hour < 1e-9:
                del self.reserved[key]
        if self.inflight.get(key):
            self.inflight[key] -= 1
            if not self.inflight[key]:
                del self.inflight[key]

    async def _no_provider(self, pod: Body, meta: Body, spec: InstanceSpec,
                           reasons: list[str]) -> None:
        summary = "; ".join(reasons) or "no provider configured"
        if self._past_create_deadline(meta):
            await self._give_up(pod, summary)
            return
        uid = str(meta.get("uid"))
        record = self.pods.ensure(uid)
        if record.told_no_capacity != summary:  # one event per change of reason
            record.told_no_capacity = summary
            await self.events.emit(obj=_pod_ref(pod), reason="NoCapacity", type_="Warning",
                                   message=f"No provider can run {spec.gpu_count}x "
                                           f"{spec.gpu_type or 'any GPU'} now: {summary}")
        tries = record.unplaced_tries
        record.unplaced_tries = tries + 1
        delay = no_capacity_delay(tries, cap=self.settings.pods.max_backoff_seconds)
        # never sleep past the create deadline: the pod must fail on time, not a backoff later
        delay = max(0.5, min(delay, self._until_create_deadline(meta) + 0.1))
        raise Retry("no capacity", after=delay)

    async def _give_up(self, pod: Body, detail: str) -> None:
        deadline = int(self.settings.pods.create_deadline_seconds)
        await self._reject(pod, reason="ProviderUnavailable",
                           message=f"no cloud could run it within {deadline}s: {detail}")

    def _until_create_deadline(self, meta: Body) -> float:
        created = _parse_time(meta.get("creationTimestamp"))
        lost = self.vanished.since(str(meta.get("uid")))
        if lost is not None and (created is None or lost > created):
            created = lost  # a new instance after a vanished one: counted from the vanishing
        age = (datetime.now(UTC) - created).total_seconds() if created else 0.0
        return self.settings.pods.create_deadline_seconds - age

    def _past_create_deadline(self, meta: Body) -> bool:
        return self._until_create_deadline(meta) < 0

    async def _reject(self, pod: Body, *, reason: str, message: str) -> None:
        self.metrics.pods_rejected.labels(reason).inc()
        status = podstatus.failed_status(pod=pod, reason=reason, message=message,
                                         now=datetime.now(UTC))
        await self._write_status(pod, status)
        await self.events.emit(obj=_pod_ref(pod), reason=reason, message=message,
                               type_="Warning")
        log.info("pod rejected", extra=kv(pod=object_key(pod), reason=reason, message=message))

    # ---- status ------------------------------------------------------------------------------

    async def _sync(self, pod: Body, uid: str, placed: Placed) -> None:
        inst = placed.instance
        if (uid not in self.book and inst.state != InstanceState.TERMINATING
                and self.placed.deleting_since(placed.key) is None):
            self.book.put(uid, self.claim_of(pod, inst))  # listed later than the first sweep
        if not placed.listed and inst.state == InstanceState.PENDING:
            # Just created, booting as far as we know: the next list tells its state, and
            # writing "booting" now would often cost a write that "Running" replaces seconds
            # later (bench/burst.py counts writes per pod). A long boot is written then.
            return
        annotations = podstatus.instance_annotations(inst)
        current = pod["metadata"].get("annotations") or {}
        stale = {k: v for k, v in annotations.items() if current.get(k) != v}
        if await self._past_active_deadline(pod, uid, placed):
            return
        if inst.interrupted and inst.state == InstanceState.FAILED:  # the cloud reclaimed it
            await interruption.reclaimed(self, pod, placed=placed)
            return
        if inst.state in _DONE_STATES and self._restarts_on_exit(pod, inst, placed.provider):
            await self._restart_exited(pod, uid, placed)
            return
        for message in self.addresses.untold(uid):
            await self.events.emit(obj=_pod_ref(pod), reason="EndpointRefused", type_="Warning",
                                   message=message)
        probe = None
        if inst.state == InstanceState.RUNNING:
            record = self.pods.ensure(uid)
            if record.running_seen is None:
                record.running_seen = time.time()
            probe = self.replicas.running(uid=uid, pod=pod, provider=placed.provider,
                                          instance=inst)
            if probe is not None and probe.liveness_failed:
                await self._restart(pod, uid, placed, message=probe.message)
                return
        else:
            self.replicas.stopped(uid=uid, pod=pod, instance=inst)
        status = podstatus.compute_status(
            pod=pod, instance=inst, node_name=self.node, now=datetime.now(UTC),
            probe_started=None if probe is None else probe.started,
            probe_ready=None if probe is None else probe.ready)
        lost = self.vanished.get(uid)
        if lost is not None and lost.handled:
            vanished.carry(status, vanish=lost, instance_restarts=inst.restart_count)
        elif lost is not None:
            self.vanished.forget(uid)  # listed again before it was told: it was not gone
        old = pod.get("status") or {}
        changed = podstatus.status_changed(old, status)
        if changed or stale:
            # One write: pods/status takes metadata too (only spec and ownerReferences are
            # reset there), so the instance annotations ride along with the status.
            await self._write_status(pod, status, annotations=stale or None)
        if changed:
            if probe is not None:
                await self._readiness_told(pod, uid, old, status, probe.message)
            if inst.state == InstanceState.PENDING:
                self._tell_created(pod, uid, placed)  # a boot users may wait minutes for
            await interruption.tell_planned(self, pod, old=old, new=status, placed=placed)
            if status.get("phase") == "Running" and old.get("phase") != "Running":
                seen = self.pods.ensure(uid).running_seen
                if seen is not None:
                    self.metrics.status_latency.labels(placed.provider).observe(
                        max(0.0, time.time() - seen))
                what = ("running" if self.pods.ensure(uid).told_created
                        else f"created and running ({_describe(inst)})")
                await self.events.emit(obj=_pod_ref(pod), reason="Started",
                                       message=f"Instance {inst.id} on {placed.provider} {what}")
            if inst.state == InstanceState.FAILED:
                await self.events.emit(obj=_pod_ref(pod), reason="InstanceFailed",
                                       type_="Warning",
                                       message=f"Instance {inst.id} on {placed.provider} failed: "
                                               f"{inst.message or 'no reason given'}")
        if inst.state in _DONE_STATES:
            await self._stop_spend(placed)

    def _restarts_on_exit(self, pod: Body, inst: Instance, provider: str) -> bool:
        """The kubelet's rule: ``Always`` restarts an exited container, ``OnFailure`` only a
        failed one, ``Never`` none; here only where the cloud can restart an instance (others
        end the pod, and its controller replaces it)."""
        policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
        wants = policy == "Always" or (policy == "OnFailure"
                                       and inst.state == InstanceState.FAILED)
        return wants and getattr(self.providers.get(provider), "restart", None) is not None

    async def _restart_exited(self, pod: Body, uid: str, placed: Placed) -> None:
        """Restart an exited container after the kubelet's crash-loop back-off (the first
        restart after ``crash_backoff_seconds``, doubling per restart, at most 300 s); the pod
        stays Running, its container waiting in ``CrashLoopBackOff`` meanwhile."""
        inst = placed.instance
        self.replicas.stopped(uid=uid, pod=pod, instance=inst)
        base = self.settings.pods.crash_backoff_seconds
        delay = min(300.0, base * (2 ** min(inst.restart_count, 16)))
        ended = inst.finished_at or datetime.now(UTC)
        left = (ended - datetime.now(UTC)).total_seconds() + delay
        if left > 0:
            status = podstatus.crash_loop_status(pod=pod, instance=inst, delay=delay,
                                                 now=datetime.now(UTC))
            if podstatus.status_changed(pod.get("status") or {}, status):
                await self._write_status(pod, status)
                name = (pod["spec"].get("containers") or [{}])[0].get("name", "")
                await self.events.emit(obj=_pod_ref(pod), reason="BackOff", type_="Warning",
                                       message=f"Back-off restarting failed container {name} "
                                               f"(instance {inst.id} on {placed.provider})")
            raise Retry("crash loop back-off", after=left)
        await self._restart_instance(uid, placed)

    async def _past_active_deadline(self, pod: Body, uid: str, placed: Placed) -> bool:
        """``spec.activeDeadlineSeconds`` after ``status.startTime``: the pod fails
        (``DeadlineExceeded``) and its instance is stopped, as the kubelet does."""
        deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
        started = _parse_time((pod.get("status") or {}).get("startTime"))
        if not isinstance(deadline, int) or isinstance(deadline, bool) or started is None:
            return False
        left = (started - datetime.now(UTC)).total_seconds() + deadline
        if left > 0:
            self.queue.add_after(uid, left + 0.05)
            return False
        self.replicas.forget(uid)
        await self._reject(pod, reason="DeadlineExceeded",
                           message="Pod was active on the node longer than the specified "
                                   f"deadline ({deadline}s)")
        await self._stop_spend(placed)
        return True

    async def _readiness_told(self, pod: Body, uid: str, old: Body, status: Body,
                              message: str | None) -> None:
        """A Warning when a replica that was Ready stops answering its readiness probe."""
        was = _is_ready({"status": old})
        now = _is_ready({"status": status})
        if was and not now and status.get("phase") == "Running" and message:
            await self.events.emit(obj=_pod_ref(pod), reason="Unhealthy", type_="Warning",
                                   message=f"Readiness probe failed: {message}")

    async def _restart(self, pod: Body, uid: str, placed: Placed, *,
                       message: str | None) -> None:
        """Liveness (or startup) failed past its threshold: restart the instance in place, as
        the kubelet restarts a container. The pod's restartCount follows the instance's."""
        inst = placed.instance
        name = (pod["spec"].get("containers") or [{}])[0].get("name", "")
        self.replicas.stopped(uid=uid, pod=pod, instance=inst)
        provider = self.providers.get(placed.provider)
        restart = getattr(provider, "restart", None)
        await self.events.emit(obj=_pod_ref(pod), reason="Unhealthy", type_="Warning",
                               message=f"Liveness probe failed: {message or 'no answer'}")
        if restart is None:
            await self._reject(pod, reason="LivenessProbeFailed",
                               message=f"container {name} failed its liveness probe and "
                                       f"{placed.provider} cannot restart an instance; the "
                                       "pod fails so that its controller replaces it")
            return
        await self._restart_instance(uid, placed)
        self.metrics.probe_restarts.labels(placed.provider).inc()
        await self.events.emit(obj=_pod_ref(pod), reason="Killing",
                               message=f"Container {name} failed liveness probe, will be "
                                       f"restarted (instance {inst.id} on {placed.provider})")

    async def _restart_instance(self, uid: str, placed: Placed) -> None:
        """Restart the container of ``placed`` through its cloud; until the next list shows it
        booting (restart count up) it is taken as booting, so probes start afresh then."""
        restart = getattr(self.providers.get(placed.provider), "restart", None)
        if restart is None:
            return
        try:
            await restart(placed.instance.id)
            self._count(placed.provider, "restart", None)
        except ProviderError as exc:
            self._count(placed.provider, "restart", exc)
            raise
        self.placed.set(uid, dataclasses.replace(
            placed, instance=dataclasses.replace(placed.instance, state=InstanceState.PENDING)))

    def _tell_created(self, pod: Body, uid: str, placed: Placed) -> None:
        record = self.pods.ensure(uid)
        if record.told_created:
            return
        record.told_created = True
        inst = placed.instance
        self.events.record(obj=_pod_ref(pod), reason="ProviderCreated",
                           message=f"Created instance {inst.id} on {placed.provider} "
                                   f"({_describe(inst)})")

    async def _write_status(self, pod: Body, status: Body, *,
                            annotations: dict[str, str] | None = None) -> None:
        """One write of the pod's status (annotations ride along): kube/podstatus_write.py."""
        landed = await self.status_writer.write(pod=pod, status=status, annotations=annotations)
        if landed is not StatusWrite.GONE:
            self.metrics.kube_writes.labels("pod_status").inc()
        if landed is StatusWrite.PATCHED_AFTER_CONFLICT:  # the refused replace was a request too
            self.metrics.kube_writes.labels("pod_status_conflict").inc()

    def _count(self, provider: str, op: str, exc: Exception | None) -> None:
        result = "ok" if exc is None else type(exc).__name__
        self.metrics.provider_requests.labels(provider, op, result).inc()
        if self.observer is not None:
            try:
                self.observer(provider, op, exc)
            except Exception:  # status bookkeeping must never break a reconcile
                log.exception("provider observer failed", extra=kv(provider=provider))

    async def aclose(self) -> None:
        await self.queue.shutdown()
        await self.lister.aclose()
        for provider in list(self.providers.values()):
            with contextlib.suppress(Exception):
                await provider.aclose()


def no_capacity_delay(tries: int, *, cap: float) -> float:
    """When to look again for a provider after ``tries`` looks found none: 5 s, doubling, capped.

    Capacity blocks last minutes (``capacity_block_seconds``), so asking every sweep only burns
    CPU and API writes; the growing delay is what "backoff that holds" means for a pod.
    """
    return float(min(cap, 5.0 * 2 ** min(tries, 16)))


def _retry_after(exc: Exception) -> float:
    value = getattr(exc, "retry_after", None)
    return float(value) if isinstance(value, int | float) else 0.0


def _is_ready(pod: Body) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _pod_ref(pod: Body) -> Body:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}


def _describe(inst: Instance) -> str:
    parts = [f"{inst.gpu_count}x {inst.gpu_type or 'GPU'}"]
    if inst.region:
        parts.append(inst.region)
    parts.append(f"${inst.price_per_hour:.2f}/h")
    return ", ".join(parts)

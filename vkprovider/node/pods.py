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

The engine's modules: this one holds the controller's state, the wiring (watch, workers,
sweeper), capacity, runtime provider changes and :meth:`PodController.reconcile`, which names
the pod's state (node/podstate.py, one record per pod) and hands it to the path that acts:
node/podcreate.py (place and create), node/podsync.py (instance state to pod status, probes,
restarts), node/podend.py (terminate, finish, gone, orphans, every cloud delete) and
node/podsweep.py (one list per provider, applied to every pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

from providers.addresses import AddressPolicy
from providers.base import (
    Instance,
    Offer,
    Provider,
    ProviderError,
)
from vkprovider.config import Settings
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.kube.events import EventRecorder
from vkprovider.kube.podstatus_write import PodStatusWriter
from vkprovider.kube.sharing import TreeSharer
from vkprovider.kube.watching import Informer, SharedSlim, object_key
from vkprovider.logs import kv
from vkprovider.metrics import Metrics
from vkprovider.node import (
    podcreate,
    podend,
    podsweep,
    podsync,
    vanished,
)
from vkprovider.node.addressscreen import AddressScreen
from vkprovider.node.budgetbook import (
    TAG_POLICY,
    Allocatable,
    BudgetBook,
    Claim,
    allocatable,
    pod_requests,
)
from vkprovider.node.listing import Lister
from vkprovider.node.nodebody import NodeCapacity
from vkprovider.node.placements import InstanceKey, Placed, Placements
from vkprovider.node.podstate import (
    Body,
    PodStates,
    Retry,
    Serving,
    Stage,
    serving_of,
    stage_of,
)
from vkprovider.node.policygate import PolicyGate
from vkprovider.node.providercaps import (
    Held,
    ProviderCaps,
    fold_capacity,
)
from vkprovider.node.replicas import EndpointSink, ProberLike, Replicas
from vkprovider.node.spend import SpendRecorder
from vkprovider.node.translate import RefSource
from vkprovider.node.workqueue import ShutDown, WorkQueue
from vkprovider.placement import offerprices
from vkprovider.placement import policy as pol
from vkprovider.placement.blocks import Blocks
from vkprovider.placement.budget import Usage
from vkprovider.semantics.selectors import labels_params

POLICIES_PATH = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
#: Beyond the request timeout, how long after a create failed a list must start before its
#: silence proves the create did not happen (clouds whose list lags behind their creates).
UNSURE_SETTLE_SECONDS = 30.0

log = logging.getLogger(__name__)


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
        # called on every policy watch event (the gateway re-routes on a traffic change)
        self.on_policy_change: Callable[[], None] = lambda: None
        # only this install's policies, when it names them (pods.policy_labels)
        self.policies = Informer(client=client, path=POLICIES_PATH, name="policies",
                                 params=labels_params(settings.pods.policy_labels),
                                 missing_ok=True, handler=lambda _e, _o: self.on_policy_change())
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
        self._offer_prices_unpublished = False  # too big to publish when last computed
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
                            gpu_products=tuple(sorted({o.gpu_type for o in offers})),
                            offer_prices=self._offer_prices_text(offers))

    def _offer_prices_text(self, offers: list[Offer]) -> str | None:
        """The offers' $/GPU-h for the Node annotation the companion estimates with under a
        $/h cap (placement/offerprices.py); None, logged once, when too big to publish."""
        text = offerprices.encode(offerprices.offer_prices(offers))
        if (text is None) != self._offer_prices_unpublished:
            self._offer_prices_unpublished = text is None
            if text is None:
                log.warning("offer prices too many to publish on the node; the companion "
                            "admits one pod first under a price cap",
                            extra=kv(node=self.node, offers=len(offers),
                                     limit=offerprices.MAX_ANNOTATION_BYTES))
        return text

    def held_by_provider(self) -> dict[str, Held]:
        """GPUs and $/h each provider holds for this node (not being deleted), plus in flight."""
        out = self.placed.held_by_provider()
        for name, held in self.reserved.items():
            out[name] = out.get(name, Held()).plus(gpus=held.gpus,
                                                   price_per_hour=held.price_per_hour)
        return out

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
            podsweep.publish_running(self)  # adopted replicas, before slices are pruned
            log.info("pods synced and instances adopted; starting workers",
                     extra=kv(pods=len(self.pod_keys), instances=len(self.placed),
                              unlisted=",".join(n for n, ok in self.listed.items() if not ok)))
            tg.create_task(self._sweeper(), name="status-sweeper")
            for i in range(self.settings.pods.workers):
                tg.create_task(self._worker(), name=f"pod-worker-{i}")

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

    # ---- reconcile ---------------------------------------------------------------------------

    async def reconcile(self, uid: str) -> None:
        """Do the one step that brings this pod closer to its instance (or the instance to
        its end), chosen by the pod's named state (node/podstate.py)."""
        pod = self._pod(uid)
        placed = self.placed.get(uid)
        stage = stage_of(pod=pod, placed=placed, record=self.pods.get(uid))
        try:
            if pod is None:
                await podend.pod_gone(self, uid, placed)
            elif stage is Stage.TERMINATING:
                await podend.terminate(self, pod, uid, placed)
            elif stage is Stage.FINISHED:
                self.book.drop(uid)
                if (record := self.pods.get(uid)) is not None and record.waiting is not None:
                    record.waiting.told_budget = None
                self.vanished.forget(uid)
                if placed is not None:
                    await podend.stop_spend(self, placed)
            elif placed is None:  # UNPLACED or UNSURE
                if uid in self.vanished and (await vanished.tell(self, pod, uid)
                                             or not vanished.wants_restart(pod)):
                    return  # restartPolicy Never: the pod failed (its status is on its way)
                await podcreate.create(self, pod, uid)
            else:  # BOOTING, RUNNING or EXITED
                await podsync.sync(self, pod, uid, placed)
        finally:
            self._settle_endpoints(uid)

    def _pod(self, uid: str) -> Body | None:
        """The pod with this UID as the watch shows it now (None: not on the node)."""
        key = self.pod_keys.get(uid)
        pod = self.informer.store.get(key) if key else None
        return None if pod is None or pod["metadata"].get("uid") != uid else pod

    def _settle_endpoints(self, uid: str) -> None:
        """Withdraw the endpoints of a pod whose state (as it is now) allows none
        (``podstate.serving_of``): gone, finished, unplaced, terminating and drained."""
        stage = stage_of(pod=self._pod(uid), placed=self.placed.get(uid), record=self.pods.get(uid))
        if serving_of(stage, held=self.replicas.is_held(uid),
                      draining=self.replicas.is_draining(uid)) is Serving.NONE:
            self.replicas.forget(uid)

    # ---- what other modules and tests call ---------------------------------------------------

    async def sweep(self) -> None:
        """One sweep (node/podsweep.py)."""
        await podsweep.sweep(self)

    def changed_in_sweep(self, uid: str, before: Placed | None) -> bool:
        return podsweep.changed_in_sweep(self, uid, before)

    def _delete_in_progress(self, placed: Placed) -> bool:
        return podend.delete_in_progress(self, placed)

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


def _retry_after(exc: Exception) -> float:
    value = getattr(exc, "retry_after", None)
    return float(value) if isinstance(value, int | float) else 0.0



"""Providers declared as GPUProvider objects: built, rebuilt, drained, and their status written.

Why it exists: platform teams declare cloud accounts as cluster objects (``kubectl apply``), not
only in the virtual kubelet's settings file. This module keeps the pod controller's providers in
step with those objects while never orphaning money, and reports what this node sees of each
account in the object's ``status``.

Rules:

* ``providers:`` in the settings file win on a name clash (logged once; the object is ignored
  and its status left alone).
* A valid object gets an adapter built by :mod:`vkprovider.registry` (type -> class, ``url`` =
  ``spec.endpoint`` or the cloud's public API, ``options`` = ``spec.options`` plus
  ``gpuTypes``/``regions`` where the adapter has such options, the API key from the credentials
  Secret). The Secret is read with a GET (RBAC ``get`` only, its name is known) when the object
  changes and at most every ``secret_refresh_seconds`` otherwise; its value is handed to the
  adapter and not kept here. A new ``metadata.generation`` or Secret ``resourceVersion``
  rebuilds the adapter: same type and endpoint -> swapped in place (same account, same
  instances); otherwise the old adapter is kept, draining, under an alias.
* An invalid object (schema problem, missing Secret or key, options the adapter refuses) is not
  used: ``Valid=False`` names the field. If it was serving, its adapter drains.
* An untrusted object (:func:`vkprovider.registry.trust_problems`: a ``credentialsSecret``
  outside our own namespace and ``gpu_providers.secret_namespaces``, or an ``endpoint`` that is
  not the cloud's public API or an allowed host) is invalid the same way, and judged first: its
  Secret is never read and its endpoint never called.
* A deleted object's adapter drains: it creates nothing, keeps being listed (pods keep their
  status) and deletes its instances as their pods go; once a list shows it holds nothing of this
  node it is closed and removed.
* Until an object is resolved (Secret not read yet, adapter not listed yet) its name counts as a
  provider that could not be listed: pods this process inherited wait for it, as at start-up,
  so a pod whose instance may live there is never created twice (see ``node/pods.py``).

Status (``/status`` merge patch, only on change, at most every ``status_interval_seconds`` per
object): ``Valid``/``Ready`` conditions, ``health``, ``blockedOffers`` (this provider's blocks),
``runningInstances`` and ``currentPricePerHour`` (this node's instances). Several virtual nodes
may serve one GPUProvider; each writes its own view (last writer wins), which is why one
GPUProvider per node is the recommended setup (docs/configuration.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from providers.base import InstanceState, Provider
from vkprovider.config import Settings
from vkprovider.errors import ConfigError
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.kube.watching import Informer
from vkprovider.logs import kv
from vkprovider.node import providerstatus as ps
from vkprovider.node.providercaps import ProviderCaps
from vkprovider.placement import policy as pol
from vkprovider.registry import (
    DEFAULT_ENDPOINTS,
    adapter_options,
    build_from_spec,
    trust_problems,
)

if TYPE_CHECKING:
    from vkprovider.node.pods import PodController

log = logging.getLogger(__name__)

Body = dict[str, Any]
_CLOSE_DELAY = 60.0  # seconds an old adapter stays open for calls still in flight


@dataclass
class _Served:
    """An object whose adapter the controller serves under the object's name."""

    identity: tuple[str, str]  # (type, url): same identity = same account and instances
    fingerprint: str  # everything the adapter was built from (no secret value)
    generation: int
    secret_rv: str


@dataclass
class _SecretSeen:
    checked_at: float  # clock() of the last GET
    generation: int  # of the object when it was read
    exists: bool
    has_key: bool
    resource_version: str


def _caps(spec: pol.GPUProviderSpec) -> ProviderCaps:
    return ProviderCaps(max_gpus=spec.max_gpus, max_price_per_hour=spec.max_price_per_hour)


def fingerprint(*, spec: pol.GPUProviderSpec, url: str, secret_rv: str, timeout: float) -> str:
    """What an adapter is built from, hashed; a change means rebuild. Holds no secret value."""
    ref = spec.credentials_secret
    raw = json.dumps([spec.type, url, adapter_options(spec), timeout,
                      [ref.namespace, ref.name, ref.key] if ref else None, secret_rv],
                     sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _problem_from_config_error(exc: ConfigError) -> pol.Problem:
    text = str(exc)
    field, sep, message = text.partition(": ")
    if not sep or not field.startswith("spec"):
        field, message = "spec.options", text
    return pol.Problem(field=field, message=message, reason="InvalidOptions")


class ProviderSource:
    """Watches GPUProviders and keeps ``controller.providers`` in step with them."""

    def __init__(
        self,
        *,
        client: KubeClient,
        controller: PodController,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.on_change = on_change  # e.g. the node agent's capacity refresh
        self.controller = controller
        self.settings = settings.gpu_providers
        self.node = settings.node.name
        self.namespace = settings.leader_election.namespace  # where our own Secrets are
        self.config_names = frozenset(p.name for p in settings.providers)
        self.clock = clock
        self.wall = wall
        self.wall_offset = wall() - clock()  # blocks keep clock() times; status wants wall time
        self.informer = Informer(client=client, path=pol.PROVIDERS_PATH, name="gpuproviders",
                                 missing_ok=True, handler=self._on_event)
        self.served: dict[str, _Served] = {}
        self.secrets: dict[str, _SecretSeen] = {}  # by object name
        self.problems: dict[str, list[pol.Problem]] = {}  # by object name, after a sync
        self.health: dict[str, ps.HealthTracker] = {}  # by provider key
        self.last_patch: dict[str, float] = {}
        self.rejected: dict[str, str] = {}  # name -> fingerprint the adapter refused
        self.traffic: dict[str, str] = {}  # spec.traffic of each valid object, by name
        self._closing: list[tuple[float, str, Provider]] = []
        self._aliases = 0
        self._shadow_logged: set[str] = set()
        self._wake = asyncio.Event()
        self._informer_task: asyncio.Task[None] | None = None
        controller.observer = self._observe

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Watch, and serve what exists now; returns before the pod controller may start."""
        self._informer_task = asyncio.get_running_loop().create_task(
            self.informer.run(), name="gpuproviders-informer")
        await self.informer.synced.wait()
        await self.sync()

    async def run(self) -> None:
        """Keep in step until cancelled (``start`` must have run)."""
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.resync_seconds):
                        await self._wake.wait()
                self._wake.clear()
                try:
                    await self.sync()
                except Exception:  # one bad object or call must not stop the others
                    log.exception("GPUProvider sync failed")
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._informer_task is not None:
            self._informer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._informer_task
            self._informer_task = None
        for _, _, provider in self._closing:
            with contextlib.suppress(Exception):
                await provider.aclose()
        self._closing.clear()

    def _on_event(self, event: str, obj: Body) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if event == "ADDED" and name and name not in self.config_names:
            # Known to exist but not served yet: inherited pods wait until it is (module doc).
            self.controller.hold_back(name, True)
        self._wake.set()

    def _observe(self, provider: str, _op: str, error: Exception | None) -> None:
        tracker = self.health.get(provider)
        if tracker is None:
            tracker = self.health[provider] = ps.HealthTracker(clock=self.clock)
        tracker.record(error=error)

    # ---- sync --------------------------------------------------------------------------------

    async def sync(self) -> None:
        present: set[str] = set()
        for obj in list(self.informer.store.values()):
            name = str(obj["metadata"].get("name"))
            if name in self.config_names:
                if name not in self._shadow_logged:
                    self._shadow_logged.add(name)
                    log.warning("GPUProvider ignored: the settings file defines a provider of "
                                "this name", extra=kv(provider=name))
                continue
            present.add(name)
            try:
                await self._sync_one(name, obj)
            except APIError as exc:
                log.warning("GPUProvider sync failed; will retry",
                            extra=kv(provider=name, error=str(exc)))
        for name in [n for n in self.served if n not in present]:
            await self._stop_serving(name, why="GPUProvider deleted")
        for name in [n for n in self.problems if n not in present]:
            del self.problems[name]
            self.secrets.pop(name, None)
        for name in [n for n in self.controller.listed
                     if n not in present and n not in self.controller.providers]:
            self.controller.hold_back(name, False)  # deleted before it was ever served
        for name, provider in await self.controller.remove_drained():
            log.info("drained provider removed: it holds no instances of this node",
                     extra=kv(provider=name))
            self.served.pop(name, None)  # an invalid object's adapter, now empty
            self._close_later(name, provider, delay=0.0)
        await self._close_due()
        await self.write_statuses()

    async def _sync_one(self, name: str, obj: Body) -> None:
        generation = int(obj["metadata"].get("generation") or 0)
        try:
            parsed = pol.parse_gpu_provider(obj)
        except pol.PolicyError as exc:
            await self._invalid(name, list(exc.problems))
            return
        spec = parsed.spec
        distrust = trust_problems(spec=spec, own_namespace=self.namespace, settings=self.settings)
        if distrust:  # before anything is read or called: no Secret read, no request sent
            self.secrets.pop(name, None)
            await self._invalid(name, distrust)
            return
        served = self.served.get(name)
        api_key: str | None = None
        secret_rv = ""
        ref = spec.credentials_secret
        if ref is not None:
            seen = self.secrets.get(name)
            if (seen is None or seen.generation != generation
                    or self.clock() - seen.checked_at >= self.settings.secret_refresh_seconds):
                try:
                    seen, api_key = await self._read_secret(ref, generation=generation)
                except APIError as exc:
                    if seen is None:  # never read: unknown, creates keep waiting
                        self.controller.hold_back(name, True)
                    log.warning("credentials Secret read failed",
                                extra=kv(provider=name, secret=f"{ref.namespace}/{ref.name}",
                                         error=str(exc)))
                    return
                self.secrets[name] = seen
            usable = seen.exists and seen.has_key
            problems = pol.semantic_problems(
                policies=(), providers=(parsed,), secrets_present=lambda *_: usable,
            )[(pol.KIND_PROVIDER, name)]
            if problems:
                await self._invalid(name, problems)
                return
            secret_rv = seen.resource_version
        url = spec.endpoint or DEFAULT_ENDPOINTS.get(spec.type, "")
        timeout = self.settings.timeout_seconds
        wanted = fingerprint(spec=spec, url=url, secret_rv=secret_rv, timeout=timeout)
        self._set_caps(name, _caps(spec))
        self.traffic[name] = spec.traffic
        if served is not None and served.fingerprint == wanted:
            served.generation = generation
            self.controller.set_draining(name, False)
            self.problems[name] = []
            return
        if self.rejected.get(name) == wanted:
            return  # the adapter refused exactly this; Valid=False already says why
        if ref is not None and api_key is None:
            # A rebuild needs the key, which is never kept: read it afresh.
            try:
                seen, api_key = await self._read_secret(ref, generation=generation)
            except APIError as exc:
                log.warning("credentials Secret read failed",
                            extra=kv(provider=name, error=str(exc)))
                return
            self.secrets[name] = seen
            if not (seen.exists and seen.has_key):
                return  # the next sync reports it
            secret_rv = seen.resource_version
            wanted = fingerprint(spec=spec, url=url, secret_rv=secret_rv, timeout=timeout)
        try:
            adapter = build_from_spec(name=name, spec=spec, api_key=api_key, owner=self.node,
                                      timeout=timeout)
        except ConfigError as exc:
            self.rejected[name] = wanted
            await self._invalid(name, [_problem_from_config_error(exc)])
            return
        self.rejected.pop(name, None)
        identity = (spec.type, url)
        if served is None:
            await self.controller.add_provider(name, adapter)
            why = "new"
        elif served.identity == identity:
            old = await self.controller.replace_provider(name, adapter)
            self._close_later(name, old, delay=_CLOSE_DELAY)
            self.health.pop(name, None)  # new credentials: judge them afresh
            why = "credentials or options changed"
        else:
            await self._retire(name)
            await self.controller.add_provider(name, adapter)
            self.health.pop(name, None)
            why = "type or endpoint changed"
        self.controller.set_draining(name, False)
        self._changed()
        self.served[name] = _Served(identity=identity, fingerprint=wanted, generation=generation,
                                    secret_rv=secret_rv)
        self.problems[name] = []
        log.info("provider built from GPUProvider",
                 extra=kv(provider=name, type=spec.type, endpoint=url, generation=generation,
                          why=why))

    async def _read_secret(self, ref: pol.SecretRef, *, generation: int
                           ) -> tuple[_SecretSeen, str | None]:
        """GET the Secret; the value is returned for one build and never stored."""
        try:
            body = await self.client.get(f"/api/v1/namespaces/{ref.namespace}/secrets/{ref.name}")
        except NotFoundError:
            return _SecretSeen(checked_at=self.clock(), generation=generation, exists=False,
                               has_key=False, resource_version=""), None
        value: str | None = None
        raw = (body.get("data") or {}).get(ref.key)
        if isinstance(raw, str):
            with contextlib.suppress(binascii.Error, ValueError):
                value = base64.b64decode(raw).decode("utf-8").strip()
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return _SecretSeen(checked_at=self.clock(), generation=generation, exists=True,
                           has_key=bool(value), resource_version=rv), value

    async def _invalid(self, name: str, problems: list[pol.Problem]) -> None:
        if self.problems.get(name) != problems:
            log.warning("GPUProvider invalid; not used",
                        extra=kv(provider=name,
                                 problems="; ".join(f"{p.field}: {p.message}" for p in problems)))
        self.problems[name] = problems
        self.controller.hold_back(name, False)
        if name in self.served and name not in self.controller.draining:
            self.controller.set_draining(name, True)  # keep listing and deleting, create nothing
            self._changed()

    async def _stop_serving(self, name: str, *, why: str) -> None:
        await self._retire(name)
        self.problems.pop(name, None)
        self.secrets.pop(name, None)
        self.traffic.pop(name, None)
        log.info("provider draining", extra=kv(provider=name, why=why))

    async def _retire(self, name: str) -> None:
        self._aliases += 1
        alias = f"{name}~{self._aliases}"
        await self.controller.retire_provider(name, alias=alias)
        self.served.pop(name, None)
        self._changed()
        if name in self.health:
            self.health[alias] = self.health.pop(name)

    def _set_caps(self, name: str, caps: ProviderCaps) -> None:
        if self.controller.caps.get(name) != caps:
            self.controller.caps[name] = caps
            self._changed()

    def _changed(self) -> None:
        """Providers or caps changed: the node's allocatable should be read again now."""
        if self.on_change is not None:
            self.on_change()

    def _close_later(self, name: str, provider: Provider, *, delay: float) -> None:
        self._closing.append((self.clock() + delay, name, provider))

    async def _close_due(self) -> None:
        now = self.clock()
        due = [c for c in self._closing if c[0] <= now]
        self._closing = [c for c in self._closing if c[0] > now]
        for _, name, provider in due:
            try:
                await provider.aclose()
            except Exception as exc:
                log.warning("closing a provider failed", extra=kv(provider=name, error=str(exc)))

    # ---- status ------------------------------------------------------------------------------

    def desired_status(self, name: str, obj: Body) -> Body | None:
        problems = self.problems.get(name)
        if problems is None:
            return None  # not examined yet (e.g. its Secret could not be read)
        generation = int(obj["metadata"].get("generation") or 0)
        tracker = self.health.get(name) if name in self.controller.providers else None
        running = 0
        price = 0.0
        for placed in self.controller.placed.values():
            inst = placed.instance
            if placed.provider != name or inst.state in (InstanceState.SUCCEEDED,
                                                         InstanceState.FAILED):
                continue
            running += 1
            price += inst.price_per_hour
        blocked = ps.blocked_offers(self.controller.blocks.active(), provider=name,
                                    wall_offset=self.wall_offset)
        return ps.build_status(generation=generation, problems=problems,
                               health=tracker.health() if tracker else None,
                               running_instances=running, price_per_hour=price, blocked=blocked,
                               old=obj.get("status") or {},
                               now=datetime.fromtimestamp(self.wall(), UTC))

    async def write_statuses(self) -> None:
        for obj in list(self.informer.store.values()):
            name = str(obj["metadata"].get("name"))
            if name in self.config_names:
                continue
            new = self.desired_status(name, obj)
            if new is None or not ps.status_changed(obj.get("status") or {}, new):
                continue
            last = self.last_patch.get(name)
            if last is not None and self.clock() - last < self.settings.status_interval_seconds:
                self._wake_later(self.settings.status_interval_seconds - (self.clock() - last))
                continue
            self.last_patch[name] = self.clock()
            try:
                await self.client.patch(f"{pol.PROVIDERS_PATH}/{name}/status", {"status": new})
            except NotFoundError:
                continue
            except APIError as exc:
                log.warning("GPUProvider status patch failed",
                            extra=kv(provider=name, error=str(exc)))
                continue
            self.controller.metrics.kube_writes.labels("gpuprovider_status").inc()

    def _wake_later(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(max(0.0, delay), self._wake.set)

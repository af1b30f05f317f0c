"""``vkprovider decommission``: take this installation's virtual node out of service, leaving no
cloud instance running and no Node behind.

Why it exists: uninstalling the provider (``helm uninstall``, deleting the Deployment) with pods
on the virtual node used to leave their cloud instances billing, with nothing left to delete
them, and the Node in the cluster. This command is what the chart's pre-delete hook runs, and
what a kustomize user runs before deleting the objects (docs/install.md, "Uninstall").

What it does, for the node of the settings file (``node.name``), with the same cloud accounts
the provider uses (``providers:`` of the file and, when ``gpu_providers.enabled``, the
GPUProvider objects, each adapter scoped to this node's tag ``vkprovider.io/node=<node>``):

1. Marks the node decommissioned: the Lease ``vkprovider-decommissioned-<node>`` in
   ``leader_election.namespace`` (no provider process running at that time registers the Node
   again once it is deleted: node/virtualnode.py), cordons the Node and taints it
   ``vkprovider.io/decommissioning=true:NoSchedule``.
2. Deletes every pod bound to the node (their grace period honoured; PodDisruptionBudgets are
   not consulted: uninstalling is the decision). A running provider deletes each pod's instance
   and finishes the pod's deletion, the normal path.
3. Until every account lists no instance of this node and no pod is bound to it: while the
   provider is alive (its node Lease renewed within its duration) and ``provider_grace`` has not
   passed, it waits for the provider; otherwise it deletes the listed instances itself (only
   those tagged with this node: never another node's) and then finishes pods that have no
   instance left (grace 0).
4. Deletes the Node.

Every step is printed as it happens. If ``timeout`` passes first, or an account cannot be
listed (zero instances cannot be proven there), it prints what remains and returns 1, keeping
the Node (a provider started again adopts what is left).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from providers.base import TAG_NAMESPACE, TAG_NODE, TAG_POD, Instance, Provider
from vkprovider.config import Settings
from vkprovider.errors import ConfigError, VKError
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.node.virtualnode import decommission_marker_path
from vkprovider.placement import policy as pol
from vkprovider.registry import build_from_spec, build_provider
from vkprovider.semantics.timefmt import TimeFormatError, parse_time

__all__ = ["TAINT_KEY", "Decommission", "Outcome", "run_decommission"]

Body = dict[str, Any]

#: The taint put on the node being decommissioned (beside the cordon).
TAINT_KEY = "vkprovider.io/decommissioning"
_NODES = "/api/v1/nodes"
_NODE_LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
_CONFLICT_RETRIES = 10


def _micro(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Outcome:
    """What is left: instances by account, pods bound to the node, accounts not listed."""

    instances: dict[str, list[Instance]] = field(default_factory=dict)
    pods: list[Body] = field(default_factory=list)
    unlisted: dict[str, str] = field(default_factory=dict)  # account -> why

    @property
    def clean(self) -> bool:
        return not self.pods and not self.unlisted and not any(self.instances.values())


class _NoKey(VKError):
    """A GPUProvider's credentials cannot be read."""


class Decommission:
    """One decommission run (see the module docstring); :meth:`run` returns the exit status."""

    def __init__(self, *, settings: Settings, client: KubeClient, timeout: float,
                 provider_grace: float = 120.0, poll: float = 2.0, out: TextIO,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.client = client
        self.node = settings.node.name
        self.timeout = timeout
        self.provider_grace = provider_grace
        self.poll = poll
        self.out = out
        self.clock = clock
        self.accounts: dict[str, Provider] = {}
        self.unbuildable: dict[str, str] = {}  # account -> why it could not be built

    def say(self, text: str) -> None:
        self.out.write(f"decommission {self.node}: {text}\n")
        self.out.flush()

    # ---- accounts ------------------------------------------------------------------------------

    async def build_accounts(self) -> None:
        """The provider's cloud accounts, each scoped to this node's tag."""
        for p in self.settings.providers:
            try:
                self.accounts[p.name] = build_provider(settings=p, owner=self.node)
            except ConfigError as exc:
                self.unbuildable[p.name] = str(exc)
        if not self.settings.gpu_providers.enabled:
            return
        try:
            items, _ = await self.client.list_all(pol.PROVIDERS_PATH)
        except NotFoundError:
            return  # the CRD is not installed: no GPUProvider accounts
        for obj in items:
            name = str(obj["metadata"]["name"])
            if name in self.accounts or name in self.unbuildable:
                continue  # the settings file wins, as in the provider
            try:
                parsed = pol.parse_gpu_provider(obj)
                api_key = await self._api_key(parsed.spec.credentials_secret)
                self.accounts[name] = build_from_spec(
                    name=name, spec=parsed.spec, api_key=api_key, owner=self.node,
                    timeout=self.settings.gpu_providers.timeout_seconds)
            except (pol.PolicyError, ConfigError, _NoKey) as exc:
                self.unbuildable[name] = str(exc)

    async def _api_key(self, ref: pol.SecretRef | None) -> str | None:
        """The key a GPUProvider names (a GET by name, as the provider); never kept."""
        if ref is None:
            return None
        try:
            body = await self.client.get(f"/api/v1/namespaces/{ref.namespace}/secrets/{ref.name}")
        except NotFoundError:
            raise _NoKey(f"credentials Secret {ref.namespace}/{ref.name} not found") from None
        raw = (body.get("data") or {}).get(ref.key)
        with contextlib.suppress(binascii.Error, ValueError, TypeError):
            value = base64.b64decode(str(raw)).decode("utf-8").strip()
            if value:
                return value
        raise _NoKey(f"credentials Secret {ref.namespace}/{ref.name} has no key {ref.key}")

    async def aclose(self) -> None:
        for provider in self.accounts.values():
            with contextlib.suppress(Exception):
                await provider.aclose()

    # ---- the cluster side ----------------------------------------------------------------------

    async def mark(self) -> bool:
        """The marker Lease, the cordon and the taint; False when the Node does not exist."""
        ns = self.settings.leader_election.namespace
        path = decommission_marker_path(namespace=ns, node=self.node)
        spec = {"holderIdentity": "vkprovider-decommission", "renewTime": _micro(time.time())}
        collection, _, name = path.rpartition("/")
        try:
            await self.client.create(collection, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name}, "spec": spec})
        except ConflictError:
            await self.client.patch(path, {"spec": spec})
        for attempt in range(_CONFLICT_RETRIES):
            try:
                node = await self.client.get(f"{_NODES}/{self.node}")
            except NotFoundError:
                self.say("no Node object (already deleted?); checking the clouds")
                return False
            # spec.taints is replaced whole: keep every other taint, with the node's
            # resourceVersion as the precondition (the provider merges taints the same way)
            taints = [t for t in (node.get("spec") or {}).get("taints") or []
                      if t.get("key") != TAINT_KEY]
            taints.append({"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"})
            try:
                await self.client.patch(f"{_NODES}/{self.node}", {
                    "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                    "spec": {"unschedulable": True, "taints": taints}})
            except ConflictError:
                if attempt == _CONFLICT_RETRIES - 1:
                    raise
                continue
            break
        self.say(f"cordoned and tainted {TAINT_KEY}=true:NoSchedule; new pods cannot land")
        return True

    async def pods(self) -> list[Body]:
        body = await self.client.get("/api/v1/pods",
                                     params={"fieldSelector": f"spec.nodeName={self.node}"})
        return list(body.get("items") or [])

    async def delete_pods(self, pods: list[Body], *, grace: int | None = None) -> int:
        """Delete ``pods`` (their own grace period, or ``grace``); skip those already going
        unless ``grace`` is given. Returns how many deletes were sent."""
        deleted = 0
        for pod in pods:
            meta = pod["metadata"]
            if grace is None and meta.get("deletionTimestamp"):
                continue
            with contextlib.suppress(NotFoundError, ConflictError):
                await self.client.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    grace_period_seconds=grace, uid=meta["uid"])
                deleted += 1
        return deleted

    async def provider_alive(self) -> bool:
        """The node Lease was renewed within its duration: a provider serves this node."""
        try:
            lease = await self.client.get(f"{_NODE_LEASES}/{self.node}")
        except NotFoundError:
            return False
        spec = lease.get("spec") or {}
        try:
            renewed = parse_time(str(spec.get("renewTime") or "")).timestamp()
        except TimeFormatError:
            return False
        return time.time() - renewed <= float(spec.get("leaseDurationSeconds") or 40)

    # ---- the clouds ----------------------------------------------------------------------------

    async def instances(self) -> Outcome:
        """Every account's instances of this node, and the pods still bound to it."""
        left = Outcome(unlisted=dict(self.unbuildable))
        for name, provider in self.accounts.items():
            try:
                listed = await provider.list()
            except Exception as exc:  # any cloud failure: zero is not proven there
                left.unlisted[name] = f"{type(exc).__name__}: {exc}"
                continue
            # the adapter lists only this node's; a second check costs nothing
            left.instances[name] = [i for i in listed if i.tags.get(TAG_NODE) == self.node]
        left.pods = await self.pods()
        return left

    async def delete_instances(self, left: Outcome) -> None:
        for name, instances in left.instances.items():
            for inst in instances:
                if inst.tags.get(TAG_NODE) != self.node:
                    continue  # never another node's
                try:
                    await self.accounts[name].delete(inst.id)
                except Exception as exc:
                    self.say(f"{name}: delete of instance {inst.id} failed ({type(exc).__name__}:"
                             f" {exc}); retrying")
                else:
                    self.say(f"{name}: deleted instance {inst.id} ({_owner(inst)})")

    def describe(self, left: Outcome) -> str:
        parts = [f"{name}: {len(i)} instance(s)" for name, i in sorted(left.instances.items())]
        parts += [f"{name}: not listed ({why})" for name, why in sorted(left.unlisted.items())]
        parts.append(f"{len(left.pods)} pod(s) on the node")
        return ", ".join(parts)

    # ---- the whole run -------------------------------------------------------------------------

    async def run(self) -> int:
        start = self.clock()
        await self.build_accounts()
        if not self.accounts and not self.unbuildable:
            self.say("no cloud account configured")
        has_node = await self.mark()
        pods = await self.pods()
        deleted = await self.delete_pods(pods)
        self.say(f"deleted {deleted} pod(s) bound to the node "
                 f"({len(pods) - deleted} already terminating)")
        taken_over = False
        last = ""
        while True:
            left = await self.instances()
            text = self.describe(left)
            if text != last:
                self.say(f"remaining: {text}")
                last = text
            if left.clean:
                break
            elapsed = self.clock() - start
            if elapsed >= self.timeout:
                return self._failed(left)
            alive = await self.provider_alive()
            if not alive or elapsed >= self.provider_grace:
                if not taken_over:
                    self.say("the provider is not running: deleting the instances directly"
                             if not alive else
                             f"the provider has not finished in {self.provider_grace:g}s: "
                             "deleting the instances directly")
                    taken_over = True
                await self.delete_instances(left)
                if not any(left.instances.values()) and not left.unlisted:
                    # nothing runs any more: nobody else will finish these pods
                    await self.delete_pods(left.pods, grace=0)
            await asyncio.sleep(self.poll)
        self.say(f"every account lists 0 instances of this node "
                 f"({', '.join(sorted(self.accounts)) or 'none configured'})")
        if has_node:
            with contextlib.suppress(NotFoundError):
                await self.client.delete(f"{_NODES}/{self.node}")
            self.say("deleted the Node")
        return 0

    def _failed(self, left: Outcome) -> int:
        self.say(f"timed out after {self.timeout:g}s; the Node is kept. Still there:")
        for name, instances in sorted(left.instances.items()):
            for inst in instances:
                self.say(f"  {name}: instance {inst.id} {inst.state.value} ({_owner(inst)})")
        for name, why in sorted(left.unlisted.items()):
            self.say(f"  {name}: could not be listed: {why}")
        for pod in left.pods:
            meta = pod["metadata"]
            self.say(f"  pod {meta['namespace']}/{meta['name']}")
        return 1


def _owner(inst: Instance) -> str:
    tags: Mapping[str, str] = inst.tags
    return f"pod {tags.get(TAG_NAMESPACE, '?')}/{tags.get(TAG_POD, '?')}"


async def run_decommission(*, settings: Settings, timeout: float, provider_grace: float,
                           out: TextIO) -> int:
    client = KubeClient.from_kubeconfig(kubeconfig=settings.kubeconfig,
                                        user_agent="vkprovider-decommission")
    job = Decommission(settings=settings, client=client, timeout=timeout,
                       provider_grace=provider_grace, out=out)
    try:
        return await job.run()
    except APIError as exc:
        job.say(f"failed: {exc}")
        return 1
    finally:
        await job.aclose()
        with contextlib.suppress(Exception):
            await client.aclose()

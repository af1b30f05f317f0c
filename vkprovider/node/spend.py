"""What the node's cloud instances have cost so far, counted by the provider itself.

Why it exists: the cloud's invoice arrives days later; a platform team wants to alert on spend as
it happens, and to cross-check the invoice (a leak shows as the cloud billing more than we
counted). The counter must survive what the provider survives: a kill -9, a restart, a leader
hand-over. So it is computed from the cloud's own listing and persisted in a Lease.

How it counts. Every sweep lists each provider's instances (one call; see pods.py). For each
listed instance that has started (billing runs from ``started_at``, as on the clouds and the mock)
the book adds ``price_per_hour x (list time - counted until)`` and moves that instance's
"counted until" to the list time. The list time is taken *before* the request goes out, so the
book never counts a moment the cloud had not yet billed: the count is a lower bound of the bill,
short by at most one sweep interval per instance (the time between the last list that showed it
and its release).

Why it survives restarts. The book is persisted as JSON in the annotation ``vkprovider.io/spend``
of the Lease ``vkprovider-spend-<node>`` in the provider's namespace (``leader_election.
namespace``): per provider, the dollars counted and the time they were counted until
(the list time of the last sweep). A new process (or a new leader) loads it and counts each
instance only from ``max(started_at, counted until)``: nothing is counted twice and nothing
still running is lost. Only the metric of what was persisted is exported, so the exported counter
never goes backwards across a restart (a Prometheus counter that shrinks reads as a reset and
``increase()`` would count it all again).

Why a Lease and not the Node (where older versions kept it): every write to a Node wakes every
Node watcher in the cluster (scheduler, controller-manager, kube-proxy and CNI agents on every
node); nothing but this project reads this Lease. A record found only on the Node is read once at
start (an upgrade loses nothing) and removed from the Node after the first write to the Lease.

What can be lost: spend of an instance that was released between the last persisted record and a
crash (at most ``spend_record_seconds`` of it). docs/operations.md explains the metric.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from providers.base import Instance
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, ConflictError, NotFoundError
from vkprovider.logs import kv
from vkprovider.metrics import Metrics
from vkprovider.placement.blocks import BadBlocks, Blocks, decode_blocks, encode_blocks

log = logging.getLogger(__name__)

#: The annotation (on the spend Lease; on the Node before) that holds the persisted book.
SPEND_ANNOTATION = "vkprovider.io/spend"
#: The annotation on the same Lease that holds the blocked offers (placement/blocks.py).
BLOCKS_ANNOTATION = "vkprovider.io/blocks"


def spend_lease_path(*, namespace: str, node: str) -> str:
    """The Lease that holds ``node``'s spend record."""
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/vkprovider-spend-{node}"
_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Counted:
    """One provider's persisted record: dollars counted up to (wall) time ``until``, when
    ``open`` instances were still billing."""

    dollars: float
    until: datetime
    open: int = 0


class SpendBook:
    """Per-provider dollars spent, counted from the clouds' listings. Pure: no I/O."""

    def __init__(self, *, resumed: Mapping[str, Counted] | None = None) -> None:
        self.dollars: dict[str, float] = {p: c.dollars for p, c in (resumed or {}).items()}
        # the predecessor counted every instance it knew up to here (per provider)
        self._resume_from: dict[str, float] = {
            p: c.until.timestamp() for p, c in (resumed or {}).items()
        }
        self._until: dict[str, float] = dict(self._resume_from)  # last list time, per provider
        self._counted: dict[str, dict[str, float]] = {}  # provider -> instance id -> until
        self.open: dict[str, int] = {p: c.open for p, c in (resumed or {}).items()}

    def observe(self, *, provider: str, instances: Iterable[Instance], at: datetime) -> float:
        """Count ``provider``'s instances as listed at ``at``; returns the dollars added.

        ``instances`` is the provider's complete listing of this node's instances: one missing
        from it is gone, and its count is closed.
        """
        at_s = at.timestamp()
        before = self._counted.get(provider, {})
        after: dict[str, float] = {}
        added = 0.0
        floor = self._resume_from.get(provider, -math.inf)
        for inst in instances:
            if inst.started_at is None:
                continue  # not billed until it has started
            start = max(inst.started_at.timestamp(), floor)
            since = max(before.get(inst.id, start), start)
            if at_s > since and inst.price_per_hour > 0:
                added += inst.price_per_hour * (at_s - since) / 3600.0
            after[inst.id] = max(since, at_s)
        self._counted[provider] = after
        self.open[provider] = len(after)
        self._until[provider] = max(self._until.get(provider, at_s), at_s)
        self.dollars[provider] = self.dollars.get(provider, 0.0) + added
        return added

    def rename(self, old: str, new: str) -> None:
        """An account is now listed under another name (retired): its instances are already
        counted up to their last listing, so counting goes on from there, never from the start."""
        if old in self._counted:
            self._counted[new] = self._counted.pop(old)
        if old in self._resume_from:
            self._resume_from[new] = self._resume_from[old]

    def record(self) -> dict[str, Counted]:
        """What to persist: every provider's dollars and the time they are counted until."""
        return {
            p: Counted(dollars=self.dollars.get(p, 0.0),
                       until=datetime.fromtimestamp(t, tz=UTC), open=self.open.get(p, 0))
            for p, t in self._until.items()
        }


def encode(record: Mapping[str, Counted]) -> str:
    """The annotation value for ``record`` (compact, stable key order)."""
    body = {
        "v": _VERSION,
        "providers": {
            p: {"dollars": round(c.dollars, 9), "until": c.until.isoformat(), "open": c.open}
            for p, c in sorted(record.items())
        },
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


class BadRecord(ValueError):
    """The annotation is not a spend record this version can read."""


def decode(value: str) -> dict[str, Counted]:
    """Parse the annotation; BadRecord naming what is wrong (the caller starts afresh)."""
    try:
        body: Any = json.loads(value)
    except ValueError as exc:
        raise BadRecord(f"{SPEND_ANNOTATION} is not JSON: {exc}") from None
    version = body.get("v") if isinstance(body, dict) else None
    if version != _VERSION:
        raise BadRecord(f"{SPEND_ANNOTATION}: unknown version {version!r}")
    providers = body.get("providers")
    if not isinstance(providers, dict):
        raise BadRecord(f"{SPEND_ANNOTATION}.providers must be an object")
    out: dict[str, Counted] = {}
    for name, entry in providers.items():
        try:
            dollars = float(entry["dollars"])
            until = datetime.fromisoformat(entry["until"])
            open_ = int(entry.get("open", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRecord(f"{SPEND_ANNOTATION}.providers.{name}: {exc}") from None
        if not math.isfinite(dollars) or dollars < 0 or until.tzinfo is None or open_ < 0:
            raise BadRecord(f"{SPEND_ANNOTATION}.providers.{name}: dollars must be a finite "
                            "non-negative number, until a timezone-aware time and open >= 0")
        out[str(name)] = Counted(dollars=dollars, until=until, open=open_)
    return out


class SpendRecorder:
    """Loads the book at start, persists it every ``every`` seconds in its Lease, exports it.

    The exported ``vkprovider_spend_dollars_total`` only ever moves to a value that has been
    persisted, so it continues where the previous process (or leader) left off.
    """

    def __init__(self, *, client: KubeClient, node: str, namespace: str, metrics: Metrics,
                 every: float, clock: Callable[[], float] = time.monotonic,
                 blocks: Blocks | None = None) -> None:
        self._client = client
        self._blocks = blocks  # persisted beside the spend, so a restart skips full clouds
        self._recorded_blocks: list[tuple[str, ...]] = []
        self._node_path = f"/api/v1/nodes/{node}"
        self._path = spend_lease_path(namespace=namespace, node=node)
        self._namespace = namespace
        self._lease_exists = False
        self._legacy_on_node = False  # a record of an older version sits on the Node
        self._node = node
        self._metrics = metrics
        self._every = every
        self._clock = clock
        self.book = SpendBook()
        self._recorded_at: float | None = None
        self._recorded: dict[str, tuple[float, int]] = {}  # provider -> (dollars, open)
        self._exported: dict[str, float] = {}

    async def _read(self, path: str) -> dict[str, str] | None:
        """The annotations of the object at ``path`` (None if it does not exist). Retries API
        errors: starting afresh over an existing record would move the exported counter back."""
        delay = 0.5
        while True:
            try:
                obj = await self._client.get(path)
            except NotFoundError:
                return None
            except APIError as exc:
                log.warning("cannot read the spend record; retrying",
                            extra=kv(node=self._node, error=str(exc), retry_in=delay))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if path == self._path:
                self._lease_exists = True
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            return {str(k): str(v) for k, v in annotations.items()}

    async def load(self) -> None:
        """Resume from the Lease's record, or from the Node's (written by older versions)."""
        annotations = await self._read(self._path) or {}
        self._load_blocks(annotations.get(BLOCKS_ANNOTATION))
        value = annotations.get(SPEND_ANNOTATION)
        if value is None:
            value = (await self._read(self._node_path) or {}).get(SPEND_ANNOTATION)
            self._legacy_on_node = value is not None
        if value is None:
            return
        try:
            resumed = decode(value)
        except BadRecord as exc:
            log.error("unreadable spend record; counting afresh", extra=kv(node=self._node,
                                                                          error=str(exc)))
            return
        self.book = SpendBook(resumed=resumed)
        self._recorded = _essence(resumed)
        self._export(resumed)
        log.info("spend record resumed", extra=kv(
            node=self._node, dollars=round(sum(c.dollars for c in resumed.values()), 6)))

    def _load_blocks(self, value: str | None) -> None:
        if self._blocks is None or not value:
            return
        try:
            restored = self._blocks.restore(decode_blocks(value), wall_now=datetime.now(UTC))
        except BadBlocks as exc:
            log.error("unreadable blocks record; starting without", extra=kv(
                node=self._node, error=f"{BLOCKS_ANNOTATION}: {exc}"))
            return
        if restored:
            log.info("blocked offers restored", extra=kv(node=self._node, blocks=restored))

    def _blocks_now(self) -> tuple[list[dict[str, Any]], list[tuple[str, ...]]]:
        if self._blocks is None:
            return [], []
        records = self._blocks.snapshot(wall_now=datetime.now(UTC))
        return records, [tuple(str(r.get(k)) for k in ("provider", "region", "gpu_type",
                                                          "until")) for r in records]

    async def maybe_record(self) -> None:
        """Persist the book (and the blocked offers) if they changed and ``every`` seconds have
        passed since the last write. An idle node writes nothing."""
        now = self._clock()
        if self._recorded_at is not None and now - self._recorded_at < self._every:
            return
        record = self.book.record()
        blocks, blocks_key = self._blocks_now()
        spend_changed = _essence(record) != self._recorded
        if not spend_changed and blocks_key == self._recorded_blocks:
            return
        values = {SPEND_ANNOTATION: encode(record)} if spend_changed or record else {}
        if self._blocks is not None:
            values[BLOCKS_ANNOTATION] = encode_blocks(blocks)
        try:
            await self._write(values)
        except APIError as exc:  # the next sweep tries again; nothing is lost meanwhile
            log.warning("cannot persist the spend record",
                        extra=kv(node=self._node, error=str(exc)))
            return
        self._metrics.kube_writes.labels("spend_record").inc()
        self._recorded_at = now
        self._recorded = _essence(record)
        self._recorded_blocks = blocks_key
        self._export(record)

    async def _write(self, values: Mapping[str, str]) -> None:
        annotations = {"metadata": {"annotations": dict(values)}}
        if not self._lease_exists:
            try:
                await self._client.create(
                    f"/apis/coordination.k8s.io/v1/namespaces/{self._namespace}/leases",
                    {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": self._path.rsplit("/", 1)[1],
                                  "namespace": self._namespace,
                                  "labels": {"app.kubernetes.io/managed-by": "vkprovider"},
                                  "annotations": dict(values)},
                     "spec": {}})
            except ConflictError:  # created meanwhile (a predecessor): patch it below
                self._lease_exists = True
            else:
                self._lease_exists = True
                await self._drop_legacy()
                return
        await self._client.patch(self._path, annotations, patch_type="merge")
        await self._drop_legacy()

    async def _drop_legacy(self) -> None:
        """Once the Lease holds the record, the Node's copy (an older version's) goes."""
        if not self._legacy_on_node:
            return
        try:
            await self._client.patch(self._node_path,
                                     {"metadata": {"annotations": {SPEND_ANNOTATION: None}}},
                                     patch_type="merge")
        except NotFoundError:
            pass
        except APIError as exc:
            log.warning("cannot remove the old spend record from the Node; will retry",
                        extra=kv(node=self._node, error=str(exc)))
            return
        self._legacy_on_node = False

    def _export(self, record: Mapping[str, Counted]) -> None:
        for provider, counted in record.items():
            delta = counted.dollars - self._exported.get(provider, 0.0)
            if delta > 0:
                self._metrics.spend.labels(provider).inc(delta)
                self._exported[provider] = counted.dollars


def _essence(record: Mapping[str, Counted]) -> dict[str, tuple[float, int]]:
    """What makes a record worth writing: dollars (to the micro-dollar) and open instances."""
    return {p: (round(c.dollars, 6), c.open) for p, c in record.items()}

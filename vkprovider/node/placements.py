"""Where every pod's instance lives, keyed right, with what each account holds kept as it changes.

Why it exists: the pod controller asks "what does this account hold?" on every create (spend
caps) and "what does this node hold of that offer?" on every capacity read. Summing over every
placed instance each time made a burst of N pods O(N^2) (issue: pod engine rebuild). Here the
totals are kept incrementally: O(1) per create, delete or state change, O(providers) per read.

Instance ids are only unique within one cloud: two mock clouds (or two accounts of one cloud)
can hand out the same id. Everything here is keyed by :data:`InstanceKey`, ``(provider, id)``,
so a delete on one cloud is never taken for a delete of the other's instance.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from providers.base import Instance, InstanceState
from vkprovider.node.providercaps import Held

#: An instance, identified across clouds: (provider name as served now, instance id).
InstanceKey = tuple[str, str]

#: An offer's slice of what we hold: (provider, GPU type, region).
OfferKey = tuple[str, str | None, str | None]

_DOLLAR_EPSILON = 1e-9


@dataclass(slots=True)
class Placed:
    """Where a pod's instance lives, as far as we know."""

    provider: str
    instance: Instance
    seen_at: float  # clock() of the list (or create) that reported it
    listed: bool = True  # False: known from our create call only, no list has shown it yet

    @property
    def key(self) -> InstanceKey:
        return (self.provider, self.instance.id)


@dataclass(frozen=True)
class _Share:
    provider: str
    gpus: int
    price: float


class Placements:
    """Pod UID -> :class:`Placed`, plus the deletes we asked for and running totals.

    Mapping-like for reads (``get``, ``in``, ``items``, ``values``); every write goes through a
    method so the totals stay right. A placed instance counts as *held* unless we asked to delete
    it or the cloud reports it terminating (spend caps and node capacity both use this).
    """

    def __init__(self) -> None:
        self._by_uid: dict[str, Placed] = {}
        self._deleting: dict[InstanceKey, float] = {}  # key -> clock() of our delete call
        self._share: dict[str, _Share] = {}  # uid -> what it adds to ``_held``
        self._held: dict[str, Held] = {}
        self._by_offer: dict[OfferKey, int] = {}  # GPUs of every placed instance, by offer
        self._uid_of: dict[InstanceKey, str] = {}
        #: Bumped by every write that can change what a pod's entry says (not by ``seen_at``):
        #: readers that scan every placement skip a scan when it has not moved.
        self.version = 0

    # ---- reads ---------------------------------------------------------------------------------

    def get(self, uid: str) -> Placed | None:
        return self._by_uid.get(uid)

    def __getitem__(self, uid: str) -> Placed:
        return self._by_uid[uid]

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_uid)

    def __len__(self) -> int:
        return len(self._by_uid)

    def items(self) -> list[tuple[str, Placed]]:
        return list(self._by_uid.items())

    def values(self) -> list[Placed]:
        return list(self._by_uid.values())

    def snapshot(self) -> dict[str, Placed]:
        return dict(self._by_uid)

    def held_by_provider(self) -> dict[str, Held]:
        """GPUs and $/h each provider holds for this node (not being deleted): O(providers)."""
        return dict(self._held)

    def gpus_on_offer(self, key: OfferKey) -> int:
        """GPUs of every placed instance of this (provider, GPU type, region), deleting or not."""
        return self._by_offer.get(key, 0)

    def total_gpus(self) -> int:
        return sum(self._by_offer.values())

    def deleting_since(self, key: InstanceKey) -> float | None:
        """clock() of our last delete call for this instance, if one is remembered."""
        return self._deleting.get(key)

    def uses_provider(self, provider: str) -> bool:
        return any(p.provider == provider for p in self._by_uid.values())

    # ---- writes --------------------------------------------------------------------------------

    def __setitem__(self, uid: str, placed: Placed) -> None:
        self.set(uid, placed)

    def __delitem__(self, uid: str) -> None:
        if self.pop(uid) is None:
            raise KeyError(uid)

    def set(self, uid: str, placed: Placed) -> None:
        self.version += 1
        self._drop(uid)
        self._by_uid[uid] = placed
        self._add(uid, placed)

    def pop(self, uid: str) -> Placed | None:
        self.version += 1
        self._drop(uid)
        return self._by_uid.pop(uid, None)

    def replace(self, placed: Mapping[str, Placed]) -> None:
        """Take a sweep's whole view; forget deletes of instances no longer listed."""
        self.version += 1
        self._by_uid = dict(placed)
        live = {p.key for p in self._by_uid.values()}
        self._deleting = {k: t for k, t in self._deleting.items() if k in live}
        self._rebuild()

    def mark_deleting(self, key: InstanceKey, *, at: float) -> None:
        self._deleting[key] = at
        self._refresh_key(key)

    def forget_delete(self, key: InstanceKey) -> None:
        if self._deleting.pop(key, None) is not None:
            self._refresh_key(key)

    def rename_provider(self, old: str, new: str) -> None:
        """A provider is served under another name (retired): carry everything over."""
        self.version += 1
        for placed in self._by_uid.values():
            if placed.provider == old:
                placed.provider = new
        self._deleting = {((new if p == old else p), i): t for (p, i), t in self._deleting.items()}
        self._rebuild()

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _refresh_key(self, key: InstanceKey) -> None:
        uid = self._uid_of.get(key)
        placed = self._by_uid.get(uid) if uid is not None else None
        if uid is not None and placed is not None:
            self._drop(uid)
            self._add(uid, placed)

    def _counts(self, placed: Placed) -> bool:
        return (placed.key not in self._deleting
                and placed.instance.state != InstanceState.TERMINATING)

    def _add(self, uid: str, placed: Placed) -> None:
        inst = placed.instance
        self._uid_of[placed.key] = uid
        offer = (placed.provider, inst.gpu_type, inst.region)
        self._by_offer[offer] = self._by_offer.get(offer, 0) + inst.gpu_count
        if not self._counts(placed):
            return
        share = _Share(placed.provider, inst.gpu_count, inst.price_per_hour)
        self._share[uid] = share
        self._held[share.provider] = self._held.get(share.provider, Held()).plus(
            gpus=share.gpus, price_per_hour=share.price)

    def _drop(self, uid: str) -> None:
        placed = self._by_uid.get(uid)
        if placed is None:
            return
        inst = placed.instance
        if self._uid_of.get(placed.key) == uid:
            del self._uid_of[placed.key]
        offer = (placed.provider, inst.gpu_type, inst.region)
        left = self._by_offer.get(offer, 0) - inst.gpu_count
        if left > 0:
            self._by_offer[offer] = left
        else:
            self._by_offer.pop(offer, None)
        share = self._share.pop(uid, None)
        if share is None:
            return
        held = self._held.get(share.provider, Held()).minus(gpus=share.gpus,
                                                            price_per_hour=share.price)
        if held.gpus == 0 and held.price_per_hour < _DOLLAR_EPSILON:
            self._held.pop(share.provider, None)
        else:
            self._held[share.provider] = held

    def _rebuild(self) -> None:
        """Recount everything in one pass (a sweep's new view): plain sums, one Held each."""
        self._share.clear()
        self._by_offer.clear()
        self._uid_of.clear()
        gpus: dict[str, int] = {}
        dollars: dict[str, float] = {}
        for uid, placed in self._by_uid.items():
            inst = placed.instance
            provider = placed.provider
            key = (provider, inst.id)
            self._uid_of[key] = uid
            offer = (provider, inst.gpu_type, inst.region)
            self._by_offer[offer] = self._by_offer.get(offer, 0) + inst.gpu_count
            if key in self._deleting or inst.state == InstanceState.TERMINATING:
                continue
            self._share[uid] = _Share(provider, inst.gpu_count, inst.price_per_hour)
            gpus[provider] = gpus.get(provider, 0) + inst.gpu_count
            dollars[provider] = dollars.get(provider, 0.0) + inst.price_per_hour
        self._held = {p: Held(gpus=gpus[p], price_per_hour=dollars[p]) for p in gpus}

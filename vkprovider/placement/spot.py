"""Which (provider, kind of offer) a pod is offered to, in order: the policy's ``interruptible``.

Why it exists: a cloud may sell the same GPU on demand and as interruptible (spot, bid) capacity,
cheaper but reclaimable. Whether a pod may run on the latter is the platform team's call, per
OverflowPolicy (``spec.interruptible``): ``Never`` keeps today's behaviour (on-demand only, and
no cloud is ever asked for an interruptible instance), ``Allow`` lets the two kinds compete (on
price with ``placement: Cheapest``; in ``Ordered`` mode each provider is asked for its cheaper
kind first), ``Prefer`` tries every interruptible candidate before any on-demand one. The pod
controller walks the plan this returns, one create per candidate, as it walked providers before.

A provider reports which kinds it sells through its offers (``Offer.interruptible``). A provider
with no offer of a kind for the pod's GPU type is not asked for that kind; one whose offers are
unknown (its capacity read failed) is asked on demand only, as before. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from providers.base import Offer
from vkprovider.placement.cheapest import offer_price

__all__ = ["CONDITION_PLANNED", "Candidate", "InterruptibleMode", "not_sold", "plan", "sells"]

InterruptibleMode = Literal["Never", "Allow", "Prefer"]

#: The pod condition the provider sets when the cloud announced an interruption of its instance
#: (node/interruption.py); the companion replaces such a replica (descheduler/hotswap.py).
CONDITION_PLANNED = "vkprovider.io/InterruptionPlanned"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """Ask ``provider`` for an instance of this kind (``interruptible``), at about ``price``
    per GPU-hour (None: no offer that can run the pod now is known)."""

    provider: str
    interruptible: bool
    price: float | None = None


def sells(offers: Sequence[Offer], *, provider: str, gpu_type: str | None,
          interruptible: bool) -> bool:
    """Whether ``provider`` offers this kind of ``gpu_type`` at all (available now or not)."""
    return any(o.provider == provider and o.interruptible == interruptible
               and (gpu_type is None or o.gpu_type == gpu_type) for o in offers)


def not_sold(offers: Sequence[Offer], *, provider: str, gpu_type: str,
             interruptible: bool) -> str | None:
    """Why ``provider`` cannot be asked for this kind of ``gpu_type`` (None: it sells it)."""
    if sells(offers, provider=provider, gpu_type=gpu_type, interruptible=interruptible):
        return None
    if sells(offers, provider=provider, gpu_type=gpu_type, interruptible=not interruptible):
        return (f"{provider}: sells {gpu_type} only as interruptible (spec.interruptible "
                "does not allow it)" if not interruptible
                else f"{provider}: sells {gpu_type} only on demand")
    return f"{provider}: does not sell {gpu_type}"


def plan(names: Sequence[str], *, offers: Sequence[Offer], gpu_type: str | None, gpus: int,
         blocked: Callable[[Offer], bool], mode: InterruptibleMode,
         cheapest: bool) -> list[Candidate]:
    """The candidates to try, in order.

    ``names``: the providers the pod may use, in the policy's order. ``cheapest``: the policy's
    ``placement`` is ``Cheapest`` (candidates with a fitting offer by price, the rest after them
    in policy order); else ``Ordered``.
    """
    spot_ok = mode != "Never"
    out: list[Candidate] = []
    for name in names:
        spot = spot_ok and sells(offers, provider=name, gpu_type=gpu_type, interruptible=True)
        kinds = []
        if not spot or sells(offers, provider=name, gpu_type=gpu_type, interruptible=False):
            kinds.append(False)  # on demand first: at one price, the kind that stays
        if spot:
            kinds.append(True)
        for kind in kinds:
            price = offer_price(provider=name, offers=offers, gpu_type=gpu_type, gpus=gpus,
                                blocked=blocked, interruptible=kind)
            out.append(Candidate(provider=name, interruptible=kind, price=price))
    order = {id(c): i for i, c in enumerate(out)}

    def unpriced_last(c: Candidate) -> tuple[bool, float]:
        return (c.price is None, c.price if c.price is not None else 0.0)

    if cheapest:
        out.sort(key=lambda c: (*unpriced_last(c), order[id(c)]))
    elif mode == "Allow":
        # Ordered: providers keep the policy's order; within one, its cheaper kind first.
        rank = {n: i for i, n in enumerate(names)}
        out.sort(key=lambda c: (rank[c.provider], *unpriced_last(c), order[id(c)]))
    if mode == "Prefer":
        out.sort(key=lambda c: not c.interruptible)  # stable: the order above within each kind
    return out

"""Per-account spend caps: a GPUProvider's ``spec.maxGPUs`` and ``spec.maxPricePerHour``.

Why it exists: a platform team caps what one cloud account may cost, over all policies. The pod
controller must refuse a create that would break the cap (skipped like a blocked offer, reason
"provider budget", so the next provider in the policy's order is tried), and the node's
allocatable ``nvidia.com/gpu`` must not advertise GPUs the caps forbid, or the scheduler would
place pods that can only wait. Both use the arithmetic here; it is pure so it is unit-tested.

What counts as held: the instances this node has on the account (from the last sweep, plus
creates since) that are not being deleted, plus creates in flight (reserved before the call, so
N concurrent workers cannot overshoot the cap together).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from providers.base import Offer

_EPSILON = 1e-9  # float dollars: 2.49 * 2 must not exceed a cap of 4.98


@dataclass(frozen=True, kw_only=True)
class ProviderCaps:
    """The caps of one account (None: no cap)."""

    max_gpus: int | None = None
    max_price_per_hour: float | None = None

    @property
    def unlimited(self) -> bool:
        return self.max_gpus is None and self.max_price_per_hour is None


@dataclass(frozen=True, kw_only=True)
class Held:
    """GPUs and dollars per hour held on one account."""

    gpus: int = 0
    price_per_hour: float = 0.0

    def plus(self, *, gpus: int, price_per_hour: float) -> Held:
        return Held(gpus=self.gpus + gpus, price_per_hour=self.price_per_hour + price_per_hour)

    def minus(self, *, gpus: int, price_per_hour: float) -> Held:
        return Held(gpus=max(0, self.gpus - gpus),
                    price_per_hour=max(0.0, self.price_per_hour - price_per_hour))


def caps_refusal(*, caps: ProviderCaps, held: Held, gpus: int, price_per_hour: float
                 ) -> str | None:
    """Why one more instance (``gpus``, expected ``price_per_hour``) would break a cap."""
    if caps.max_gpus is not None and held.gpus + gpus > caps.max_gpus:
        return f"maxGPUs {caps.max_gpus} would be exceeded ({held.gpus} held + {gpus})"
    cap = caps.max_price_per_hour
    # At the cap, even an instance of unknown price (0.0) is refused: it would go over.
    if cap is not None and (
        cap <= 0
        or held.price_per_hour >= cap - _EPSILON
        or held.price_per_hour + price_per_hour > cap + _EPSILON
    ):
        return (f"maxPricePerHour ${cap:.2f} would be exceeded (${held.price_per_hour:.2f}/h "
                f"held + ${price_per_hour:.2f}/h)")
    return None


def capped_free(*, caps: ProviderCaps, free: int, held: Held, cheapest_per_gpu: float) -> int:
    """How many of ``free`` sellable GPUs the caps still allow on this account."""
    out = max(0, free)
    if caps.max_gpus is not None:
        out = min(out, max(0, caps.max_gpus - held.gpus))
    cap = caps.max_price_per_hour
    if cap is not None:
        if cap <= 0:
            return 0
        if cheapest_per_gpu > 0:
            dollars = max(0.0, cap - held.price_per_hour)
            out = min(out, int((dollars + _EPSILON) // cheapest_per_gpu))
    return out


def expected_price(offers: Iterable[Offer], *, provider: str, gpu_type: str | None,
                   region: str | None, gpus: int, interruptible: bool = False) -> float:
    """The cheapest price the account quotes for ``gpus`` of this type (0.0 when unknown), of
    the kind asked for (on demand unless ``interruptible``)."""
    prices = [o.price_per_gpu_hour for o in offers
              if o.provider == provider and o.interruptible == interruptible
              and (gpu_type is None or o.gpu_type == gpu_type)
              and (region is None or o.region == region)]
    return min(prices) * gpus if prices else 0.0


def fold_capacity(offers: Iterable[Offer], *, caps: dict[str, ProviderCaps],
                  held: dict[str, Held], exclude: set[str] | frozenset[str] = frozenset()
                  ) -> int:
    """Sellable GPUs over all accounts, each account cut to what its caps allow.

    ``exclude`` names accounts that create nothing (being drained): their offers do not count.
    A GPU a cloud sells both on demand and as interruptible counts once (the larger of the two
    offers of one type and region).
    """
    free: dict[str, int] = {}
    cheapest: dict[str, float] = {}
    seen: dict[tuple[str, str, str], int] = {}
    for offer in offers:
        if offer.provider in exclude:
            continue
        key = (offer.provider, offer.gpu_type, offer.region)
        count = max(0, offer.available)
        extra = max(0, count - seen.get(key, 0))
        seen[key] = max(seen.get(key, 0), count)
        free[offer.provider] = free.get(offer.provider, 0) + extra
        if offer.available > 0:
            price = cheapest.get(offer.provider)
            if price is None or offer.price_per_gpu_hour < price:
                cheapest[offer.provider] = offer.price_per_gpu_hour
    total = 0
    for name, count in free.items():
        account = caps.get(name)
        if account is None or account.unlimited:
            total += count
            continue
        total += capped_free(caps=account, free=count, held=held.get(name, Held()),
                             cheapest_per_gpu=cheapest.get(name, 0.0))
    return total

"""The ``Cheapest`` placement mode: try providers by the live price of what can run the pod now.

Why it exists: clouds' prices for the same GPU differ by 2x and change through the day, and a
platform team paying for burst capacity wants the cheapest GPU that can run a pod, not the first
in a list. The clouds' offers (read with node capacity) carry a price per GPU-hour; this orders a
policy's providers by their cheapest offer that fits the pod now (its GPU type, enough GPUs
available, not blocked by an earlier "no capacity"). Providers with no fitting offer keep their
policy order, after the priced ones, so failover still reaches them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from providers.base import Offer

__all__ = ["cheapest_first", "offer_price"]


def offer_price(*, provider: str, offers: Iterable[Offer], gpu_type: str | None, gpus: int,
                blocked: Callable[[Offer], bool], interruptible: bool | None = False
                ) -> float | None:
    """The lowest price per GPU-hour among ``provider``'s offers that can run the pod now.

    ``interruptible``: only on-demand offers (False, the default), only interruptible ones
    (True), or either (None).
    """
    best: float | None = None
    for o in offers:
        if o.provider != provider or o.available < max(1, gpus) or blocked(o):
            continue
        if interruptible is not None and o.interruptible != interruptible:
            continue
        if gpu_type is not None and o.gpu_type != gpu_type:
            continue
        if best is None or o.price_per_gpu_hour < best:
            best = o.price_per_gpu_hour
    return best


def cheapest_first(names: Sequence[str], *, offers: Sequence[Offer], gpu_type: str | None,
                   gpus: int, blocked: Callable[[Offer], bool]) -> list[str]:
    """``names`` ordered by :func:`offer_price`, cheapest first; ties and unpriced providers
    keep their order (unpriced last)."""
    priced = [(offer_price(provider=n, offers=offers, gpu_type=gpu_type, gpus=gpus,
                           blocked=blocked), i, n) for i, n in enumerate(names)]
    priced.sort(key=lambda t: (t[0] is None, t[0] if t[0] is not None else 0.0, t[1]))
    return [n for _, _, n in priced]

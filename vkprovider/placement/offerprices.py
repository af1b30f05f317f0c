"""What the clouds' offers cost per GPU-hour, as the provider publishes it on its Node.

Why it exists: under a $/h limit (``limits.maxPricePerHour``) the companion must count every pod
it admits at some price before a cloud has priced it, or a surge (a pre-warm's) goes past the cap.
Until one pod of the policy was priced, the companion knew no price and admitted one pod per
cloud round trip. The provider lists the clouds' offers anyway (its capacity refresh), so it
publishes their $/GPU-h range per account and GPU type in the Node annotation
``vkprovider.io/offer-prices``; the companion estimates an unpriced pod at the dearest offer its
policy could take (:func:`policy_price_per_gpu`), never lower than what it may pay, and admits
as many as fit at once. The provider's own check against the offer it takes stays the last gate.

The format, compact JSON, account -> GPU type -> range (both kinds of offer, on demand and
interruptible, in one range: the dearest of either is the conservative figure)::

    {"cloud-a": {"H100": {"min": 2.19, "max": 2.49}}, "cloud-b": {"*": {"min": 0.3, "max": 4.1}}}

``*`` stands for every type of that account: when the full map would exceed
:data:`MAX_ANNOTATION_BYTES`, each account is folded into one range (still conservative); when
even that is too big, nothing is published and the companion falls back to one pod first. The
companion treats the annotation as input (anyone who may patch Nodes can write it): anything
that does not parse as this shape, is too large, or has a negative, non-finite or inverted
price is rejected whole (:class:`OfferPricesError`). Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from providers.base import Offer
from vkprovider.errors import VKError

__all__ = [
    "ANY_TYPE",
    "MAX_ANNOTATION_BYTES",
    "OFFER_PRICES_ANNOTATION",
    "OfferPrices",
    "OfferPricesError",
    "PriceRange",
    "decode",
    "encode",
    "offer_prices",
    "policy_price_per_gpu",
]

OFFER_PRICES_ANNOTATION = "vkprovider.io/offer-prices"
#: Every GPU type of one account (the folded form, see the module docstring).
ANY_TYPE = "*"
#: The most the provider writes and the companion reads (an annotation may hold 256 KiB in all).
MAX_ANNOTATION_BYTES = 16 * 1024
_MAX_NAME = 256  # an account or GPU type name longer than this is junk


class OfferPricesError(VKError, ValueError):
    """The annotation is not an offer-price map this version reads (it is ignored whole)."""


@dataclass(frozen=True, kw_only=True)
class PriceRange:
    """The cheapest and the dearest $/GPU-hour among some offers."""

    min: float
    max: float

    def widened(self, other: PriceRange) -> PriceRange:
        return PriceRange(min=min(self.min, other.min), max=max(self.max, other.max))


#: account -> GPU type (or :data:`ANY_TYPE`) -> range
OfferPrices = dict[str, dict[str, PriceRange]]


def offer_prices(offers: Iterable[Offer]) -> OfferPrices:
    """The $/GPU-h range per account and GPU type of ``offers`` (sold out or not: what is sold
    out now may be back by the time a pod is placed, so it counts for the dearest)."""
    out: OfferPrices = {}
    for offer in offers:
        price = float(offer.price_per_gpu_hour)
        if not math.isfinite(price) or price < 0:
            continue
        types = out.setdefault(offer.provider, {})
        here = PriceRange(min=price, max=price)
        have = types.get(offer.gpu_type)
        types[offer.gpu_type] = here if have is None else have.widened(here)
    return out


def _dump(prices: Mapping[str, Mapping[str, PriceRange]]) -> str:
    return json.dumps({p: {t: {"min": r.min, "max": r.max} for t, r in sorted(types.items())}
                       for p, types in sorted(prices.items())},
                      separators=(",", ":"), allow_nan=False)


def encode(prices: Mapping[str, Mapping[str, PriceRange]]) -> str | None:
    """The annotation's text; each account folded into :data:`ANY_TYPE` when the full map is too
    big; None when even that is (nothing is published then)."""
    text = _dump(prices)
    if len(text.encode()) <= MAX_ANNOTATION_BYTES:
        return text
    folded: OfferPrices = {}
    for provider, types in prices.items():
        ranges = list(types.values())
        if ranges:
            whole = ranges[0]
            for r in ranges[1:]:
                whole = whole.widened(r)
            folded[provider] = {ANY_TYPE: whole}
    text = _dump(folded)
    return text if len(text.encode()) <= MAX_ANNOTATION_BYTES else None


def _price(value: object, *, where: str) -> float:
    # bool is an int: true/false are not prices
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OfferPricesError(f"{where}: not a number")
    price = float(value)
    if not math.isfinite(price) or price < 0:
        raise OfferPricesError(f"{where}: not a finite, non-negative price")
    return price


def _name(value: str, *, where: str) -> str:
    if not value or len(value) > _MAX_NAME:
        raise OfferPricesError(f"{where}: a name of 1 to {_MAX_NAME} characters expected")
    return value


def decode(text: str) -> OfferPrices:
    """Parse and validate the annotation; :class:`OfferPricesError` says why it is refused."""
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise OfferPricesError(f"{len(text.encode())} bytes, more than {MAX_ANNOTATION_BYTES}")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise OfferPricesError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise OfferPricesError("not a JSON object of accounts")
    out: OfferPrices = {}
    for provider, types in raw.items():
        _name(provider, where="account")
        if not isinstance(types, dict):
            raise OfferPricesError(f"{provider[:64]}: not an object of GPU types")
        ranges: dict[str, PriceRange] = {}
        for gpu_type, entry in types.items():
            _name(gpu_type, where=f"{provider[:64]}: GPU type")
            where = f"{provider[:64]}.{gpu_type[:64]}"
            if not isinstance(entry, dict) or set(entry) != {"min", "max"}:
                raise OfferPricesError(f"{where}: an object with min and max expected")
            low = _price(entry["min"], where=f"{where}.min")
            high = _price(entry["max"], where=f"{where}.max")
            if low > high:
                raise OfferPricesError(f"{where}: min {low} above max {high}")
            ranges[gpu_type] = PriceRange(min=low, max=high)
        out[provider] = ranges
    return out


def policy_price_per_gpu(nodes: Sequence[OfferPrices | None], *, providers: Sequence[str],
                         gpu_types: Sequence[str] = ()) -> float | None:
    """What one GPU of a policy may cost at most: the dearest offer it could take.

    ``nodes``: the offer prices of every virtual node the policy may use (None: that node
    published none, or junk). ``providers``: the policy's ``spec.providers``; ``gpu_types`` its
    ``spec.gpuTypes`` (empty: any type). An account a node does not list had no offers read
    there, and the provider places nothing on it under a $/h cap (it knows no price), so it
    adds nothing. None (no estimate: one pod first) when a node published nothing, or when no
    offer the policy could take is known.
    """
    dearest: float | None = None
    for prices in nodes:
        if prices is None:
            return None  # a node whose offers are unknown may take the pod at any price
        for provider in providers:
            types = prices.get(provider) or {}
            for gpu_type, price in types.items():
                if gpu_types and gpu_type != ANY_TYPE and gpu_type not in gpu_types:
                    continue
                dearest = price.max if dearest is None else max(dearest, price.max)
    return dearest

"""vkprovider.placement.cheapest: providers ordered by the live price of what fits the pod."""

from __future__ import annotations

from providers.base import Offer


def offer(provider: str, price: float, *, gpu: str = "H100", region: str = "r1",
          available: int = 4) -> Offer:
    return Offer(provider=provider, gpu_type=gpu, region=region, available=available,
                 price_per_gpu_hour=price)


def order(offers: list[Offer], *, gpus: int = 1, gpu_type: str | None = "H100",
          blocked: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    from vkprovider.placement.cheapest import cheapest_first
    return cheapest_first(["a", "b", "c"], offers=offers, gpu_type=gpu_type, gpus=gpus,
                          blocked=lambda o: (o.provider, o.region) in blocked)


def test_cheapest_fitting_offer_first_unpriced_last_in_policy_order() -> None:
    offers = [offer("a", 3.0), offer("b", 1.5), offer("b", 4.0, region="r2")]
    assert order(offers) == ["b", "a", "c"]


def test_an_offer_too_small_of_another_type_or_blocked_does_not_count() -> None:
    offers = [offer("a", 3.0), offer("b", 1.0, available=1), offer("c", 0.5, gpu="A100"),
              offer("c", 2.0, region="r2")]
    assert order(offers, gpus=2) == ["c", "a", "b"]
    assert order(offers, gpus=2, blocked=frozenset({("c", "r2")})) == ["a", "b", "c"]


def test_ties_keep_the_policy_order_and_no_gpu_type_takes_any() -> None:
    offers = [offer("c", 2.0), offer("a", 2.0), offer("b", 0.9, gpu="A100")]
    assert order(offers) == ["a", "c", "b"]
    assert order(offers, gpu_type=None) == ["b", "a", "c"]

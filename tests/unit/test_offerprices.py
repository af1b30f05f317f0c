"""The offer-price annotation (vkprovider/placement/offerprices.py): what the provider writes,
what the companion accepts, and the conservative estimate of one GPU of a policy."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from providers.base import Offer, Provider
from vkprovider.config import Settings
from vkprovider.kube import KubeClient
from vkprovider.metrics import Metrics
from vkprovider.node.nodebody import NodeCapacity, metadata_annotations
from vkprovider.node.pods import PodController
from vkprovider.placement.offerprices import (
    ANY_TYPE,
    MAX_ANNOTATION_BYTES,
    OFFER_PRICES_ANNOTATION,
    OfferPricesError,
    PriceRange,
    decode,
    encode,
    offer_prices,
    policy_price_per_gpu,
)


def offer(provider: str, gpu: str, price: float, *, region: str = "r", available: int = 1,
          interruptible: bool = False) -> Offer:
    return Offer(provider=provider, gpu_type=gpu, region=region, available=available,
                 price_per_gpu_hour=price, interruptible=interruptible)


def test_ranges_per_account_and_type_over_regions_kinds_and_sold_out_offers() -> None:
    prices = offer_prices([
        offer("a", "H100", 2.49, region="us"), offer("a", "H100", 2.19, region="eu"),
        offer("a", "H100", 1.10, interruptible=True), offer("a", "H100", 3.10, available=0),
        offer("a", "A100", 1.29), offer("b", "H100", 2.00),
        offer("b", "H100", float("nan")), offer("b", "H100", -1.0),  # junk from a cloud
    ])
    assert prices == {"a": {"H100": PriceRange(min=1.10, max=3.10),
                            "A100": PriceRange(min=1.29, max=1.29)},
                      "b": {"H100": PriceRange(min=2.00, max=2.00)}}


def test_encode_and_decode_round_trip_exactly() -> None:
    prices = offer_prices([offer("cloud-a", "H100", 2.49), offer("cloud-b", "H100", 2.19),
                           offer("cloud-b", "RTX 4090 (24 GB)", 0.35)])
    text = encode(prices)
    assert text is not None
    assert json.loads(text)["cloud-a"] == {"H100": {"min": 2.49, "max": 2.49}}
    assert decode(text) == prices
    assert decode(encode({}) or "") == {}


def test_too_many_types_fold_into_one_range_per_account() -> None:
    many = [offer(f"acct-{a}", f"GPU-{t:04d}", 0.1 + t / 100) for a in range(4)
            for t in range(200)]
    text = encode(offer_prices(many))
    assert text is not None and len(text.encode()) <= MAX_ANNOTATION_BYTES
    folded = decode(text)
    assert folded["acct-0"] == {ANY_TYPE: PriceRange(min=0.1, max=0.1 + 199 / 100)}
    # the folded range still bounds any type, the dearest included
    assert policy_price_per_gpu([folded], providers=["acct-3"],
                                gpu_types=["GPU-0199"]) == 0.1 + 199 / 100


def test_nothing_is_published_when_even_the_folded_map_is_too_big() -> None:
    many = [offer(f"account-{a:05d}-" + "x" * 200, "H100", 1.0) for a in range(100)]
    assert encode(offer_prices(many)) is None


@pytest.mark.parametrize("text", [
    "", "null", "[]", '{"a":[]}', '{"a":{"H100":[1,2]}}', '{"a":{"H100":{"min":1}}}',
    '{"a":{"H100":{"min":1,"max":2,"x":3}}}', '{"a":{"H100":{"min":"1","max":2}}}',
    '{"a":{"H100":{"min":3,"max":2}}}', '{"a":{"H100":{"min":NaN,"max":2}}}',
    '{"a":{"H100":{"min":1,"max":Infinity}}}', '{"":{"H100":{"min":1,"max":2}}}',
    '{"a":{"":{"min":1,"max":2}}}', '{"a":{"H100":{"min":false,"max":2}}}',
    '{"' + "a" * 300 + '":{}}', "{" * 5000 + "}" * 5000, "x" * (MAX_ANNOTATION_BYTES + 1),
])
def test_decode_refuses_junk_whole(text: str) -> None:
    with pytest.raises(OfferPricesError):
        decode(text)


NODE_A = {"cloud-a": {"H100": PriceRange(min=2.0, max=2.5), "A100": PriceRange(min=1, max=1.3)},
          "cloud-b": {"H100": PriceRange(min=2.2, max=2.2)},
          "other": {"H100": PriceRange(min=9, max=9)}}


def test_the_estimate_is_the_dearest_offer_of_the_policys_accounts_and_types() -> None:
    est = policy_price_per_gpu([NODE_A], providers=["cloud-a", "cloud-b"])
    assert est == 2.5
    assert policy_price_per_gpu([NODE_A], providers=["cloud-a"], gpu_types=["A100"]) == 1.3
    assert policy_price_per_gpu([NODE_A], providers=["cloud-b", "nowhere"]) == 2.2
    # over every node the policy may use
    node_b = {"cloud-b": {"H100": PriceRange(min=3.0, max=3.1)}}
    assert policy_price_per_gpu([NODE_A, node_b], providers=["cloud-b"]) == 3.1


def test_no_estimate_when_a_node_published_nothing_or_no_offer_fits() -> None:
    assert policy_price_per_gpu([NODE_A, None], providers=["cloud-a"]) is None
    assert policy_price_per_gpu([NODE_A], providers=["nowhere"]) is None
    assert policy_price_per_gpu([NODE_A], providers=["cloud-b"], gpu_types=["A100"]) is None
    assert policy_price_per_gpu([], providers=["cloud-a"]) is None


def test_the_node_patch_sets_changes_and_removes_the_annotation() -> None:
    bare: dict[str, object] = {"metadata": {"annotations": {}}}
    cap = NodeCapacity(gpus=4, gpu_products=("H100",), offer_prices='{"a":{}}')
    assert metadata_annotations(bare, cap) == {"vkprovider.io/gpu-products": "H100",
                                               OFFER_PRICES_ANNOTATION: '{"a":{}}'}
    same = {"metadata": {"annotations": {"vkprovider.io/gpu-products": "H100",
                                         OFFER_PRICES_ANNOTATION: '{"a":{}}'}}}
    assert metadata_annotations(same, cap) == {}
    assert metadata_annotations(same, NodeCapacity(gpus=4, gpu_products=("H100",))) == {
        OFFER_PRICES_ANNOTATION: None}


class OffersOnly:
    """A cloud adapter that only answers the capacity call (the node's capacity refresh)."""

    def __init__(self, offers: list[Offer]) -> None:
        self.offers = offers

    async def capacity(self) -> list[Offer]:
        return self.offers

    async def aclose(self) -> None:
        return None


async def test_the_capacity_refresh_prices_what_the_node_sells_not_a_draining_account() -> None:
    clouds = {"a": OffersOnly([offer("a", "H100", 2.49), offer("a", "H100", 2.19, region="eu")]),
              "old": OffersOnly([offer("old", "H100", 9.0)])}
    ctl = PodController(client=cast(KubeClient, object()), settings=Settings(),
                        providers={n: cast(Provider, p) for n, p in clouds.items()},
                        events=cast(Any, object()), refs=cast(Any, object()), metrics=Metrics())
    ctl.set_draining("old", True)  # creates nothing: its offers are not the node's to sell
    capacity = await ctl.node_capacity()
    assert capacity.offer_prices is not None
    assert decode(capacity.offer_prices) == {"a": {"H100": PriceRange(min=2.19, max=2.49)}}

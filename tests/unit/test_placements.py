"""Placements: instances keyed by (provider, id), and held totals kept as they change."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

import pytest

from providers.base import Instance, InstanceState
from vkprovider.node.placements import Placed, Placements
from vkprovider.node.providercaps import Held
from vkprovider.node.spend import SpendBook
from vkprovider.placement.blocks import ANY_TYPE, BadBlocks, Blocks, decode_blocks, encode_blocks


def placed(uid: str, provider: str, *, inst_id: str | None = None, gpus: int = 1,
           price: float = 2.0, state: InstanceState = InstanceState.RUNNING,
           gpu_type: str = "H100", region: str = "us") -> Placed:
    return Placed(provider=provider, seen_at=0.0, instance=Instance(
        id=inst_id or f"i-{uid}", name=f"vk-{uid}", provider=provider, state=state,
        gpu_type=gpu_type, region=region, gpu_count=gpus, price_per_hour=price,
        tags={"vkprovider.io/uid": uid}))


def brute_held(pl: Placements) -> dict[str, Held]:
    out: dict[str, Held] = {}
    for p in pl.values():
        if pl.deleting_since(p.key) is not None or p.instance.state == InstanceState.TERMINATING:
            continue
        out[p.provider] = out.get(p.provider, Held()).plus(
            gpus=p.instance.gpu_count, price_per_hour=p.instance.price_per_hour)
    return out


def same(a: dict[str, Held], b: dict[str, Held]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].gpus == b[k].gpus and abs(a[k].price_per_hour - b[k].price_per_hour) < 1e-6
        for k in a)


def test_the_same_instance_id_on_two_clouds_is_two_instances() -> None:
    pl = Placements()
    pl.set("u1", placed("u1", "cloud0", inst_id="mi-x"))
    pl.set("u2", placed("u2", "cloud1", inst_id="mi-x"))
    pl.mark_deleting(("cloud0", "mi-x"), at=5.0)
    assert pl.deleting_since(("cloud0", "mi-x")) == 5.0
    assert pl.deleting_since(("cloud1", "mi-x")) is None, "cloud1's mi-x was never deleted"
    assert pl.held_by_provider() == {"cloud1": Held(gpus=1, price_per_hour=2.0)}


def test_held_totals_follow_every_change_like_a_full_recount() -> None:
    rng = random.Random(7)
    pl = Placements()
    for step in range(3000):
        uid = f"u{rng.randrange(40)}"
        provider = rng.choice(["a", "b", "c"])
        action = rng.random()
        if action < 0.45:
            state = rng.choice([InstanceState.RUNNING, InstanceState.PENDING,
                                InstanceState.TERMINATING])
            pl.set(uid, placed(uid, provider, gpus=rng.randint(1, 8),
                               price=round(rng.uniform(0.5, 20), 2), state=state))
        elif action < 0.65:
            pl.pop(uid)
        elif action < 0.8 and uid in pl:
            pl.mark_deleting(pl[uid].key, at=float(step))
        elif action < 0.9 and uid in pl:
            pl.forget_delete(pl[uid].key)
        elif action < 0.95:
            keep = {u: p for u, p in pl.items() if rng.random() < 0.8}
            pl.replace(keep)
        else:
            pl.rename_provider(provider, provider + "~1")
        assert same(pl.held_by_provider(), brute_held(pl)), step
        assert pl.total_gpus() == sum(p.instance.gpu_count for p in pl.values())


def test_gpus_on_offer_count_every_placed_instance_of_that_offer() -> None:
    pl = Placements()
    pl.set("u1", placed("u1", "a", gpus=2))
    pl.set("u2", placed("u2", "a", gpus=3, region="eu"))
    pl.set("u3", placed("u3", "a", gpus=4))
    pl.mark_deleting(("a", "i-u3"), at=1.0)  # still occupies the offer until it is gone
    assert pl.gpus_on_offer(("a", "H100", "us")) == 6
    assert pl.gpus_on_offer(("a", "H100", "eu")) == 3
    pl.pop("u1")
    assert pl.gpus_on_offer(("a", "H100", "us")) == 4


def test_a_sweep_forgets_deletes_of_instances_it_no_longer_lists() -> None:
    pl = Placements()
    pl.set("u1", placed("u1", "a"))
    pl.mark_deleting(("a", "i-u1"), at=1.0)
    pl.replace({})
    pl.set("u1", placed("u1", "a"))  # the same id listed again later: a new delete is needed
    assert pl.deleting_since(("a", "i-u1")) is None


def test_a_renamed_provider_keeps_its_deletes_and_totals() -> None:
    pl = Placements()
    pl.set("u1", placed("u1", "a"))
    pl.set("u2", placed("u2", "a"))
    pl.mark_deleting(("a", "i-u2"), at=1.0)
    pl.rename_provider("a", "a~1")
    assert pl.deleting_since(("a~1", "i-u2")) == 1.0
    assert pl.held_by_provider() == {"a~1": Held(gpus=1, price_per_hour=2.0)}
    assert not pl.uses_provider("a") and pl.uses_provider("a~1")


def test_no_capacity_for_an_untyped_pod_does_not_block_typed_pods() -> None:
    blocks = Blocks(clock=lambda: 0.0)
    blocks.block(provider="a", region=None, gpu_type=ANY_TYPE, seconds=60, reason="no capacity")
    assert blocks.blocked(provider="a", region=None, gpu_type=None) is not None
    assert blocks.blocked(provider="a", region=None, gpu_type="H100") is None
    blocks.block(provider="b", region=None, gpu_type=None, seconds=60, reason="credentials")
    assert blocks.blocked(provider="b", region=None, gpu_type="H100") is not None, "provider-wide"


def test_a_retired_account_is_not_counted_again_under_its_alias() -> None:
    book = SpendBook()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    inst = Instance(id="i-1", name="vk-1", provider="a", state=InstanceState.RUNNING,
                    price_per_hour=3600.0, started_at=t0)
    book.observe(provider="a", instances=[inst], at=t0 + timedelta(seconds=10))
    book.rename("a", "a~1")
    added = book.observe(provider="a~1", instances=[inst], at=t0 + timedelta(seconds=12))
    assert added == 2.0, "only the 2 s since the last listing; 12 would count 10 s twice"


def test_blocks_round_trip_through_wall_clock_records_and_bad_records_are_named() -> None:
    now = [100.0]
    blocks = Blocks(clock=lambda: now[0])
    blocks.block(provider="a", region="us", gpu_type="H100", seconds=60, reason="no capacity")
    wall = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    records = decode_blocks(encode_blocks(blocks.snapshot(wall_now=wall)))
    assert records[0]["until"] == "2026-12-03T12:01:00+00:00"
    later = Blocks(clock=lambda: 0.0)
    assert later.restore(records, wall_now=wall + timedelta(seconds=20)) == 1
    block = later.blocked(provider="a", region="us", gpu_type="H100")
    assert block is not None and block.until == 40.0
    assert later.restore(records, wall_now=wall + timedelta(seconds=61)) == 0, "expired"
    for bad, named in (("nope", "not JSON"), ('{"v": 2, "blocks": []}', '"v": 1'),
                       ('{"v": 1, "blocks": [{"provider": "a"}]}', "blocks[0]")):
        with pytest.raises(BadBlocks, match=re.escape(named)):
            decode_blocks(bad)

"""providers/listcache.py: an instance listed unchanged is not parsed again; a changed or new
one is; one no longer listed is dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.base import Instance, InstanceState
from providers.listcache import ListingCache


def test_unchanged_items_reuse_their_instance_and_the_rest_are_parsed() -> None:
    parsed: list[str] = []

    def parse(item: Mapping[str, Any]) -> Instance:
        parsed.append(item["id"])
        return Instance(id=item["id"], name=item["id"], provider="p",
                        state=InstanceState(item["state"]))

    cache = ListingCache()
    first = cache.parse_all([{"id": "a", "state": "running"}, {"id": "b", "state": "pending"}],
                            key=lambda i: i["id"], parse=parse)
    assert parsed == ["a", "b"]
    second = cache.parse_all([{"id": "a", "state": "running"}, {"id": "b", "state": "running"},
                              {"id": "c", "state": "pending"}], key=lambda i: i["id"],
                             parse=parse)
    assert parsed == ["a", "b", "b", "c"]
    assert second[0] is first[0] and second[1] is not first[1]
    assert second[1].state is InstanceState.RUNNING
    cache.parse_all([{"id": "c", "state": "pending"}], key=lambda i: i["id"], parse=parse)
    assert len(cache) == 1
    cache.parse_all([{"id": "a", "state": "running"}], key=lambda i: i["id"], parse=parse)
    assert parsed[-1] == "a", "a was dropped when it was not listed: parsed again"


def test_a_change_of_field_name_or_type_is_a_change() -> None:
    parsed: list[str] = []

    def parse(item: Mapping[str, Any]) -> Instance:
        parsed.append(item["id"])
        return Instance(id=item["id"], name=item["id"], provider="p",
                        state=InstanceState.RUNNING)

    cache = ListingCache()
    cache.parse_all([{"id": "a", "x": 1}], key=lambda i: i["id"], parse=parse)
    cache.parse_all([{"id": "a", "y": 1}], key=lambda i: i["id"], parse=parse)
    assert parsed == ["a", "a"], "same values under another field name: parsed again"
    cache.parse_all([{"id": "a", "y": 1}], key=lambda i: i["id"], parse=parse)
    assert parsed == ["a", "a"], "listed as before: not parsed"
    cache.parse_all([{"id": "a", "y": {"n": 1}}], key=lambda i: i["id"], parse=parse)
    cache.parse_all([{"id": "a", "y": {"n": 2}}], key=lambda i: i["id"], parse=parse)
    assert parsed == ["a", "a", "a", "a"], "a nested change is a change"

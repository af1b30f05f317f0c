"""Cached objects share their keys, short strings and equal subtrees (kube/watching.py ``_slim``,
kube/sharing.py), an update takes over what it repeats; watch lines and the JSON codec."""

from __future__ import annotations

import json
from typing import Any, cast

from vkprovider.kube import codec
from vkprovider.kube.sharing import TreeSharer
from vkprovider.kube.watching import Informer, Lines, _slim

RAW = json.dumps({
    "metadata": {"name": "p1", "managedFields": [{"manager": "x"}], "labels": {"app": "a"}},
    "status": {"phase": "Running", "message": "m" * 40,
               "conditions": [{"type": "Ready", "status": "True"}, 3, None, [1, "True"]]},
})


def test_slim_keeps_the_content_and_shares_keys_and_short_strings() -> None:
    a, b = _slim(json.loads(RAW)), _slim(json.loads(RAW))
    expected = json.loads(RAW)
    del expected["metadata"]["managedFields"]
    assert a == expected and b == expected
    key_a = next(k for k in a["status"] if k == "conditions")
    key_b = next(k for k in b["status"] if k == "conditions")
    assert key_a is key_b, "keys are one object across cached objects"
    assert a["status"]["phase"] is b["status"]["phase"]
    assert a["status"]["conditions"][3][1] is b["status"]["conditions"][3][1]
    assert a["status"]["message"] is not b["status"]["message"], "long strings stay apart"


POD = json.dumps({
    "metadata": {"name": "p1", "uid": "u1", "labels": {"app": "a"}},
    "spec": {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 300}],
             "volumes": [{"name": "v", "projected": {"sources": [{"serviceAccountToken": {
                 "path": "token", "expirationSeconds": 3607}}], "defaultMode": 420}}],
             "securityContext": {}},
    "status": {"conditions": [{"type": "Ready", "status": "True", "lastProbeTime": None}]},
})


def test_the_sharer_makes_equal_subtrees_one_object_and_keeps_the_content() -> None:
    sharer = TreeSharer()
    other = json.loads(POD)
    other["metadata"]["name"] = "p2"
    a, b = sharer(json.loads(POD)), sharer(other)
    assert a == json.loads(POD) and b == other
    assert a["spec"]["tolerations"] is b["spec"]["tolerations"]
    assert a["spec"]["volumes"] is b["spec"]["volumes"]
    assert a["spec"]["securityContext"] is b["spec"]["securityContext"]
    assert a["status"]["conditions"] is b["status"]["conditions"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    # The object and its first level are its own: one object's metadata is never another's.
    assert a is not b and a["spec"] is not b["spec"] and a["metadata"] is not b["metadata"]


def test_the_sharer_tells_types_and_values_apart() -> None:
    sharer = TreeSharer()
    docs = [{"s": {"x": {"v": True}}}, {"s": {"x": {"v": 1}}}, {"s": {"x": {"v": 1.0}}},
            {"s": {"x": {"v": "1"}}}, {"s": {"x": {"v": None}}}, {"s": {"x": []}},
            {"s": {"x": {}}}, {"s": {"x": [None]}}, {"s": {"x": {"v": [1]}}},
            {"s": {"x": {"v": [True]}}}, {"s": {"x": {"w": 1}}}]
    shared = [sharer(json.loads(json.dumps(d))) for d in docs]
    assert shared == docs
    subtrees = [got["s"]["x"] for got in shared]
    assert len({id(x) for x in subtrees}) == len(docs), "no two different subtrees merged"
    assert [type(got["s"]["x"]["v"]) for got in shared[:3]] == [bool, int, float]


def test_the_sharers_table_is_bounded_and_emptied_when_full() -> None:
    sharer = TreeSharer(limit=8)
    seen = []
    for i in range(50):
        seen.append(sharer({"spec": {"x": {"n": i}, "y": [i, "same"]}}))
        assert len(sharer) <= 8
    assert [d["spec"]["x"]["n"] for d in seen] == list(range(50))
    # After the table was emptied, sharing starts again: equal subtrees meet again.
    again = sharer({"spec": {"x": {"n": 49}}})
    assert again["spec"]["x"] is seen[-1]["spec"]["x"]


def test_the_change_count_moves_with_every_store_change_and_only_then() -> None:
    informer = Informer(client=cast(Any, None), path="/x")
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "1"}}
    informer._apply({"type": "ADDED", "object": json.loads(json.dumps(pod))})
    assert informer.changes == 1
    informer._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "2"}}})
    assert informer.changes == 1, "a bookmark changes no object"
    informer._apply({"type": "MODIFIED", "object": json.loads(json.dumps(pod))})
    informer._apply({"type": "DELETED", "object": json.loads(json.dumps(pod))})
    assert informer.changes == 3 and informer.store == {}


def test_an_update_takes_over_what_it_repeats_of_the_cached_version() -> None:
    sharer = TreeSharer()
    first = sharer(json.loads(POD))
    changed = json.loads(POD)
    changed["metadata"]["resourceVersion"] = "2"
    changed["status"]["conditions"][0]["status"] = "False"
    changed["status"]["phase"] = "Running"
    got = sharer.update(json.loads(json.dumps(changed)), first)
    assert got == changed
    assert got["spec"] is first["spec"], "an unchanged first-level subtree is the cached one"
    assert got["metadata"]["labels"] is first["metadata"]["labels"]
    assert got["status"]["conditions"] != first["status"]["conditions"]
    assert first["status"]["conditions"][0]["status"] == "True", "the cached version is intact"
    # What changed is shared with the rest of the cache like any new subtree.
    other = sharer(json.loads(json.dumps(changed)))
    assert other["status"]["conditions"] is got["status"]["conditions"]
    assert got["metadata"] is not first["metadata"] and got is not first


def test_an_update_of_a_different_shape_is_shared_whole() -> None:
    sharer = TreeSharer()
    first = sharer({"spec": {"x": [1, 2]}, "status": {"y": {"z": 1}}})
    got = sharer.update({"spec": {"x": {"a": 1}}, "status": [1], "extra": {"k": "v"}}, first)
    assert got == {"spec": {"x": {"a": 1}}, "status": [1], "extra": {"k": "v"}}
    assert sharer.update([1, 2], first) == [1, 2] and sharer.update({"a": {}}, [3]) == {"a": {}}


def test_the_informer_hands_an_update_its_cached_version() -> None:
    calls: list[tuple[str, Any]] = []
    sharer = TreeSharer()

    def update(obj: Any, previous: Any) -> Any:
        calls.append(("update", previous["metadata"]["resourceVersion"]))
        return sharer.update(obj, previous)

    informer = Informer(client=cast(Any, None), path="/x", transform=sharer,
                        transform_update=update)
    pod = json.loads(POD)
    pod["metadata"].update(namespace="ns", resourceVersion="1")
    informer._apply({"type": "ADDED", "object": json.loads(json.dumps(pod))})
    pod["metadata"]["resourceVersion"] = "2"
    informer._apply({"type": "MODIFIED", "object": json.loads(json.dumps(pod))})
    assert calls == [("update", "1")]
    assert informer.store["ns/p1"] == pod


def test_watch_lines_are_split_across_chunks_without_decoding_text() -> None:
    lines = Lines()
    assert lines.feed(b'{"a":1}\n{"b"') == [bytearray(b'{"a":1}')]
    assert lines.pending == 4
    assert lines.feed(b':2}\n\n{"c":"\xc3\xa9"}\n') == [bytearray(b'{"b":2}'),
                                                       bytearray(b'{"c":"\xc3\xa9"}')]
    assert lines.pending == 0
    assert lines.feed(b"") == [] and lines.feed(b"\n") == []
    assert codec.loads(bytearray(b'{"c":"\xc3\xa9"}')) == {"c": "é"}


def test_the_codec_writes_compact_utf8_and_reads_it_back() -> None:
    body = {"metadata": {"name": "é", "labels": {"a": "b"}}, "n": [1, 2.5, None, True]}
    raw = codec.dumps(body)
    assert raw == json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    assert codec.loads(raw) == body and codec.loads(raw.decode()) == body
    try:
        codec.loads(b"{not json")
    except ValueError:
        pass
    else:
        raise AssertionError("not JSON must raise a ValueError")


def test_a_tree_copy_is_equal_writable_and_shares_nothing_with_the_cache() -> None:
    from vkprovider.kube.sharing import copy_dict, tree_copy

    sharer = TreeSharer()
    cached = sharer(json.loads(POD))
    cached["status"]["more"] = [cached["status"]["conditions"], cached["status"]["conditions"]]
    got = copy_dict(cached)
    assert got == cached and tree_copy(cached) == cached
    assert got["spec"]["tolerations"] is not cached["spec"]["tolerations"]
    got["status"]["more"][0][0]["status"] = "False"
    assert got["status"]["more"][1][0]["status"] == "True", "two places, two copies"
    assert cached["status"]["conditions"][0]["status"] == "True", "the cached object is intact"
    assert type(got["spec"]["tolerations"][0]["tolerationSeconds"]) is int
    assert tree_copy("x") == "x" and tree_copy(None) is None

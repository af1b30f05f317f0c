"""Cached objects share their keys and short strings (kube/watching.py ``_slim``): same content,
managedFields gone, one string object for a key or short value across objects."""

from __future__ import annotations

import json
from typing import Any, cast

from vkprovider.kube.sharing import TreeSharer
from vkprovider.kube.watching import Informer, _slim

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

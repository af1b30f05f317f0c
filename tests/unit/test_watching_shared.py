"""Cached objects share their keys and short strings (kube/watching.py ``_slim``): same content,
managedFields gone, one string object for a key or short value across objects."""

from __future__ import annotations

import json

from vkprovider.kube.watching import _slim

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

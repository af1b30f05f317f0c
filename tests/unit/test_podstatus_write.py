"""The bodies of a pod status write (kube/podstatus_write.py): the guarded replace and its
fallback patch, built from a cached pod without changing it."""

from __future__ import annotations

import copy
import json
from typing import Any

from vkprovider.kube.podstatus_write import pod_status_path, replacement, strategic_patch


def cached_pod() -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "41",
                         "uid": "u-1", "labels": {"app": "a"},
                         "annotations": {"theirs": "1", "vkprovider.io/instance": "old"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending"}}


def status() -> dict[str, Any]:
    return {"phase": "Running", "podIP": "100.64.0.9", "podIPs": [{"ip": "100.64.0.9"}],
            "hostIPs": [{"ip": "100.64.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"},
                           {"type": "example.com/gate", "status": "True"}]}


def test_the_replace_is_the_cached_pod_with_the_new_status_and_annotations() -> None:
    pod = cached_pod()
    before = copy.deepcopy(pod)
    body = replacement(pod=pod, status=status(), annotations={"vkprovider.io/instance": "mi-9"})
    assert body["apiVersion"] == "v1" and body["kind"] == "Pod"
    assert body["metadata"]["resourceVersion"] == "41"  # the precondition
    assert body["metadata"]["uid"] == "u-1" and body["metadata"]["labels"] == {"app": "a"}
    assert body["metadata"]["annotations"] == {"theirs": "1", "vkprovider.io/instance": "mi-9"}
    assert "managedFields" not in body["metadata"]  # omitted: the server keeps its own
    assert body["spec"] == pod["spec"]
    assert body["status"] == status()
    assert "$patch" not in json.dumps(body)  # directives are for patches only
    assert pod == before  # the cache's copy is shared: never written to


def test_no_annotations_leaves_the_pods_own() -> None:
    body = replacement(pod=cached_pod(), status=status())
    assert body["metadata"]["annotations"] == cached_pod()["metadata"]["annotations"]


def test_the_fallback_patch_replaces_the_ip_lists_and_carries_the_annotations() -> None:
    st = status()
    body = strategic_patch(status=st, annotations={"vkprovider.io/instance": "mi-9"})
    assert body["status"]["podIPs"] == [{"ip": "100.64.0.9"}, {"$patch": "replace"}]
    assert body["status"]["hostIPs"] == [{"ip": "100.64.0.1"}, {"$patch": "replace"}]
    assert body["status"]["conditions"] == st["conditions"]
    assert body["metadata"] == {"annotations": {"vkprovider.io/instance": "mi-9"}}
    assert st == status()  # the caller's status is not changed
    assert "metadata" not in strategic_patch(status=status())


def test_the_path_is_the_pods_status_subresource() -> None:
    assert pod_status_path(cached_pod()) == "/api/v1/namespaces/ns/pods/p/status"


def test_the_patch_against_a_base_carries_only_what_the_write_changes() -> None:
    """A status built from a copy carries that copy's fields; the patch sends only the builder's
    changes, so fields others changed since (on the API server) are not put back."""
    base = {"phase": "Pending", "qosClass": "BestEffort", "reason": "Old", "podIPs": [],
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "t0"},
                           {"type": "example.com/gate", "status": "True"},
                           {"type": "vkprovider.io/GPUHealthy", "status": "True"},
                           {"type": "Gone", "status": "True"}]}
    st = {"phase": "Running", "qosClass": "BestEffort", "podIPs": [{"ip": "100.64.0.9"}],
          "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t1"},
                         {"type": "example.com/gate", "status": "True"},
                         {"type": "vkprovider.io/GPUHealthy", "status": "True"}]}
    before = copy.deepcopy(st)
    body = strategic_patch(status=st, base=base)
    assert body == {"status": {
        "phase": "Running", "podIPs": [{"ip": "100.64.0.9"}, {"$patch": "replace"}],
        "reason": None,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t1"},
                       {"type": "Gone", "$patch": "delete"}]}}
    assert st == before
    assert strategic_patch(status=base, base=base) == {"status": {}}

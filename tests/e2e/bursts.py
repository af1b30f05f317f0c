"""The one overflow the install tests play: a policy and a one-replica GPU Deployment.

Why it exists: the chart test (server-side install, processes run locally) and the real install
(the chart's pods on a real node) prove the same thing, that a pod nothing inside can hold
overflows to the mock cloud; they build the same two objects, once, here.
"""

from __future__ import annotations

from typing import Any


def burst_objects(*, namespace: str, policy: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An OverflowPolicy ``policy`` for ``app=burst`` pods of ``namespace`` (provider ``mock``,
    no wait), and the Deployment ``burst``: one H100 pod pinned to the node pool ``namespace``,
    which no internal node carries, so only the virtual node can take it."""
    overflow = {
        "apiVersion": "vkprovider.io/v1alpha1", "kind": "OverflowPolicy",
        "metadata": {"name": policy},
        "spec": {"selector": {"namespaces": [namespace],
                              "podSelector": {"matchLabels": {"app": "burst"}}},
                 "providers": ["mock"], "overflowAfter": "0s"}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "burst"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "burst"}},
                 "template": {
                     "metadata": {"labels": {"app": "burst"},
                                  "annotations": {"vkprovider.io/gpu-type": "H100"}},
                     "spec": {"nodeSelector": {"vkprovider.io/pool": namespace},
                              "terminationGracePeriodSeconds": 1,
                              "containers": [{"name": "server", "image": "example.com/s:1",
                                              "resources": {"limits": {
                                                  "nvidia.com/gpu": "1"}}}]}}}}
    return overflow, deployment

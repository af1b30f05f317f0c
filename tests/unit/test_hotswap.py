"""Hot-swap on the companion: which pods are replaced, and when a Deployment is settled."""

from __future__ import annotations

from typing import Any

from vkprovider.descheduler.fit import slim_pod
from vkprovider.descheduler.hotswap import HOT_GPU, replaceable, settled


def _pod(name: str, *, node: str = "vk", healthy: str | None = "False", created: str = "1",
         deleting: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if healthy is not None:
        conditions.append({"type": "vkprovider.io/GPUHealthy", "status": healthy,
                           "reason": "GPUTooHot"})
    return slim_pod({"metadata": {"name": name, "namespace": "ns", "uid": name,
                                  "creationTimestamp": created,
                                  "deletionTimestamp": "x" if deleting else None},
                     "spec": {"nodeName": node, "containers": []},
                     "status": {"phase": "Running", "conditions": conditions}})


def test_the_slim_pod_keeps_the_gpu_health_verdict() -> None:
    assert _pod("a")["status"]["gpuHealthy"] == "False"
    assert _pod("a", healthy=None)["status"]["gpuHealthy"] is None
    assert _pod("a")["status"]["ready"] is True


def test_only_marked_live_pods_on_a_virtual_node_oldest_first() -> None:
    pods = [_pod("late", created="3"), _pod("early", created="1"),
            _pod("cool", healthy="True"), _pod("unmarked", healthy=None),
            _pod("inside", node="gpu-1"), _pod("going", deleting=True)]
    found = replaceable(pods, virtual=["vk"])
    assert [(p["metadata"]["name"], t) for p, t in found] == [("early", HOT_GPU), ("late", HOT_GPU)]
    assert replaceable(pods, virtual=["other"]) == []


def test_settled_means_observed_and_at_the_wanted_count() -> None:
    def dep(gen: int, observed: int, want: int, have: int) -> dict[str, Any]:
        return {"metadata": {"generation": gen}, "spec": {"replicas": want},
                "status": {"observedGeneration": observed, "replicas": have}}

    assert settled(dep(2, 2, 2, 2))
    assert not settled(dep(3, 2, 2, 2))  # the controller has not seen the change
    assert not settled(dep(2, 2, 3, 2))  # a surge (ours or someone's) in progress

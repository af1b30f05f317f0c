"""The story over the real path: overflow and move-back under a client pod's load, via kube-proxy.

:func:`vkprovider.realdemo.play_real_story` (what ``vkprovider demo --real-node`` plays): on the
real node, inference (two replicas) is preempted by a training Job, overflows to the mock cloud
(whose instances' public addresses live in namespaces beside the node, with a real model server
each), and comes home make-before-break when training ends. A client pod sends requests to the
Service's ClusterIP the whole time; kube-proxy's rules deliver them; the client counts. No
address table anywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vkprovider.kube import KubeClient
from vkprovider.realdemo import MEASURED, REPLICAS, play_real_story
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.realnode import RealNode

pytestmark = pytest.mark.cluster


async def test_overflow_and_move_back_under_a_client_pods_load_through_kube_proxy(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str,
        provider_kubeconfig: Path, companion_kubeconfig: Path, crds: list[str],
        tmp_path: Path) -> None:
    story = await play_real_story(kube=kube, cluster=local_cluster, node=real_node,
                                  namespace=namespace, provider_kubeconfig=provider_kubeconfig,
                                  companion_kubeconfig=companion_kubeconfig, work_dir=tmp_path,
                                  say=print)
    print(f"\nthe story over kube-proxy (client pod's counts):\n{story.table()}\n"
          f"timings {story.timings}")
    assert [r.chapter for r in story.rows] == ["inside", "way out", "on the cloud",
                                               "way back", "home"]
    # the client failed nothing in any chapter but the way out (measured: by plain
    # preemption the replicas may go before their cloud replacements serve)
    assert all(r.failed == 0 for r in story.rows if r.chapter != MEASURED), story.table()
    # both cloud replicas answered, and each server counted exactly what the client saw
    assert len(story.served) == REPLICAS and all(story.served.values()), story.table()
    for name, count in story.served.items():
        assert count == sum(r.by_replica.get(name, 0) for r in story.rows), story.table()
    assert set(story.row("on the cloud").by_replica) & set(story.served), story.table()
    assert not set(story.row("home").by_replica) & set(story.served), story.table()
    assert story.problems == []

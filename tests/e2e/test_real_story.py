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
from vkprovider.realdemo import MEASURED, REPLICAS, RealStory, play_real_story
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.kueue import KueueManager
from vkprovider.testing.realnode import RealNode

pytestmark = pytest.mark.cluster


async def play(*, prewarm: bool, real_node: RealNode, local_cluster: LocalCluster,
               kube: KubeClient, namespace: str, provider_kubeconfig: Path,
               companion_kubeconfig: Path, tmp_path: Path) -> RealStory:
    story = await play_real_story(kube=kube, cluster=local_cluster, node=real_node,
                                  namespace=namespace, provider_kubeconfig=provider_kubeconfig,
                                  companion_kubeconfig=companion_kubeconfig, work_dir=tmp_path,
                                  say=print, prewarm=prewarm)
    print(f"\nthe story over kube-proxy{' (Kueue pre-warm)' if prewarm else ''}, the client "
          f"pod's counts:\n{story.table()}\ntimings {story.timings}")
    assert [r.chapter for r in story.rows] == ["inside", "way out", "on the cloud",
                                               "way back", "home"]
    # the client failed nothing in any chapter; by plain preemption the way out is measured,
    # not judged (the replicas may go before their cloud replacements serve)
    assert all(r.failed == 0 for r in story.rows if prewarm or r.chapter != MEASURED), \
        story.table()
    # both cloud replicas answered, and each server counted exactly what the client saw
    assert len(story.served) >= REPLICAS and all(story.served.values()), story.table()
    for name, count in story.served.items():
        assert count == sum(r.by_replica.get(name, 0) for r in story.rows), story.table()
    assert set(story.row("on the cloud").by_replica) & set(story.served), story.table()
    assert not set(story.row("home").by_replica) & set(story.served), story.table()
    assert story.problems == []
    if prewarm:
        assert story.check_state == "Ready", story.check_state
    return story


async def test_overflow_and_move_back_under_a_client_pods_load_through_kube_proxy(
        real_node: RealNode, local_cluster: LocalCluster, kube: KubeClient, namespace: str,
        provider_kubeconfig: Path, companion_kubeconfig: Path, crds: list[str],
        tmp_path: Path) -> None:
    """The way out by plain preemption: the scheduler evicts inference for the gang."""
    await play(prewarm=False, real_node=real_node, local_cluster=local_cluster, kube=kube,
               namespace=namespace, provider_kubeconfig=provider_kubeconfig,
               companion_kubeconfig=companion_kubeconfig, tmp_path=tmp_path)


async def test_the_way_out_through_kueue_pre_warm_fails_no_request(
        kueue: KueueManager, real_node: RealNode, local_cluster: LocalCluster,
        kube: KubeClient, namespace: str, provider_kubeconfig: Path,
        companion_kubeconfig: Path, crds: list[str], tmp_path: Path) -> None:
    """Through real Kueue with the pre-warm AdmissionCheck: inference surges onto the cloud
    before the gang is admitted, so the way out is judged like every other chapter."""
    await play(prewarm=True, real_node=real_node, local_cluster=local_cluster, kube=kube,
               namespace=namespace, provider_kubeconfig=provider_kubeconfig,
               companion_kubeconfig=companion_kubeconfig, tmp_path=tmp_path)

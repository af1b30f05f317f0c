"""The story over the real path: overflow and move-back under a client pod's load, via kube-proxy.

:func:`vkprovider.realdemo.play_real_story` (what ``vkprovider demo --real-node`` plays): on the
real node, inference (two replicas) is preempted by a training Job, overflows to the mock cloud
(whose instances' public addresses live in namespaces beside the node, with a real model server
each), and comes home make-before-break when training ends. A client pod sends requests to the
Service's ClusterIP the whole time; kube-proxy's rules deliver them; the client counts. No
address table anywhere.

Played twice with local processes (the provider, companion and mock cloud started by the story),
and once with the installed chart: ``helm install`` on the real node from the project's image
(:mod:`.realinstall`), the provider (2 replicas, leader election), the companion (2) and the
mock cloud as pods, the way out through real Kueue with the pre-warm check, and, while the cloud
replicas serve, ``helm upgrade`` of a changed config of both processes: both Deployments roll, a
new provider pod takes the lead, and the client's requests in that chapter fail none. The host
asks the
mock cloud pod for its instances at its pod IP (the host routes the node's pod range); the
provider pod reaches the mock cloud by its Service's name and the API server through the
``kubernetes`` Service, as in the install test.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.realdemo import (
    MEASURED,
    REPLICAS,
    CloudChapter,
    InstalledChart,
    RealStory,
    play_real_story,
)
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.kueue import KueueManager
from vkprovider.testing.realnode import RealNode
from vkprovider.testing.waiting import eventually

from .realinstall import (
    CHART,
    helm,
    import_project_image,
    mock_cloud_api,
    node_ready,
    print_release,
    real_node_values,
    upgrade_with_a_new_leader,
)

pytestmark = pytest.mark.cluster


async def play(*, prewarm: bool, real_node: RealNode, local_cluster: LocalCluster,
               kube: KubeClient, namespace: str, tmp_path: Path,
               provider_kubeconfig: Path | None = None,
               companion_kubeconfig: Path | None = None,
               installed: InstalledChart | None = None,
               on_the_cloud: CloudChapter | None = None) -> RealStory:
    story = await play_real_story(kube=kube, cluster=local_cluster, node=real_node,
                                  namespace=namespace, provider_kubeconfig=provider_kubeconfig,
                                  companion_kubeconfig=companion_kubeconfig, work_dir=tmp_path,
                                  installed=installed, say=print, prewarm=prewarm,
                                  on_the_cloud=on_the_cloud)
    print(f"\nthe story over kube-proxy{' (Kueue pre-warm)' if prewarm else ''}"
          f"{' with the installed chart' if installed else ''}, the client "
          f"pod's counts:\n{story.table()}\ntimings {story.timings}")
    assert [r.chapter for r in story.rows] == [
        "inside", "way out", "on the cloud", *([on_the_cloud.name] if on_the_cloud else []),
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


@pytest.mark.timeout(900)
async def test_the_story_with_the_installed_chart_fails_no_request(
        kueue: KueueManager, real_node: RealNode, local_cluster: LocalCluster,
        kube: KubeClient, namespace: str, tmp_path: Path) -> None:
    """``helm install`` of the chart on the real node (the project's image), then overflow, the
    Kueue pre-warm way out and move-back played by the release's pods: every chapter judged,
    the cloud replicas counted by their servers, and the mock cloud pod left with no instance.
    While the cloud replicas serve, ``helm upgrade`` (a changed setting of each process's
    config, ``--wait``) rolls both Deployments and hands the provider's lead to a new pod: the
    client's requests in that chapter fail none, and only the cloud replicas answer them."""
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    image = await import_project_image(real_node, timings)
    suffix = uuid.uuid4().hex[:6]
    release, vnode = f"rs{suffix}", f"vk-story-{suffix}"
    values = real_node_values(
        real_node=real_node, image=image, virtual_node=vnode, pool=namespace,
        mock_cloud_args=["--inventory=H100:us-east:8:2.49", "--boot-delay=0.3"],
        tmp_path=tmp_path,
        # the story's pace, as the local processes get it (harness): passes every 0.5 s,
        # move-back every 1 s, pod status every 1 s; the chart's defaults are a cluster's
        extra={"companion": {"intervalSeconds": 0.5, "moveBackIntervalSeconds": 1},
               "provider": {"settings": {
                   "node": {"capacity_refresh_seconds": 2},
                   "pods": {"status_interval_seconds": 1, "orphan_grace_seconds": 3}}}})
    installed = False
    try:
        t1 = time.monotonic()
        done = await helm(local_cluster, "install", release, str(CHART), "--namespace",
                          namespace, "--values", str(values), "--wait", "--timeout", "5m")
        installed = done.returncode == 0
        assert done.returncode == 0, done.stdout + done.stderr
        await eventually(lambda: node_ready(kube, vnode), timeout=120, interval=0.5,
                         what=f"virtual node {vnode} Ready")
        timings["install to virtual node Ready"] = time.monotonic() - t1
        cloud = await mock_cloud_api(kube, real_node, namespace)

        async def upgrade() -> None:
            """``helm upgrade`` of a changed setting of each process: both Deployments roll,
            a new provider pod takes the lead, the virtual node stays Ready."""
            await upgrade_with_a_new_leader(
                kube, local_cluster, release=release, namespace=namespace, virtual_node=vnode,
                sets=["companion.moveBackIntervalSeconds=2", "provider.settings.pods.workers=32"])

        t2 = time.monotonic()
        story = await play(prewarm=True, real_node=real_node, local_cluster=local_cluster,
                           kube=kube, namespace=namespace, tmp_path=tmp_path,
                           installed=InstalledChart(virtual_node=vnode, cloud=cloud),
                           on_the_cloud=CloudChapter(name="helm upgrade", run=upgrade))
        timings["the story"] = time.monotonic() - t2
        timings["helm upgrade to new leader"] = story.timings["helm upgrade"]
        # the upgrade's chapter: the client's load ran across it (failing none, judged in
        # play) and only the cloud replicas answered it
        during = story.row("helm upgrade")
        assert during.failed == 0 and during.by_replica, story.table()
        assert set(during.by_replica) <= set(story.served), story.table()
        # the mock cloud pod's own word: an instance for each cloud replica that served (the
        # pre-warm surge, which stayed), every one deleted
        ledger = await cloud.ledger()
        assert len(ledger) == len(story.served) == REPLICAS, ledger
        assert [e for e in ledger if e["state"] != "deleted"] == [], ledger
    except BaseException:
        await print_release(kube, local_cluster, namespace)
        raise
    finally:
        if installed:  # no instance is left (judged above): the hook has nothing to do
            await helm(local_cluster, "uninstall", release, "--namespace", namespace,
                       "--no-hooks", "--timeout", "2m")
        with contextlib.suppress(APIError):
            await kube.delete(f"/api/v1/nodes/{vnode}")
        timings["whole test"] = time.monotonic() - t0
        print("\ninstalled-chart story timings (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in timings.items()))

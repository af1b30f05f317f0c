"""The fake kubelet ends a run when a test says so (``vkprovider.io/fake-run-seconds``, lowered).

Why it exists: the move-back stories (tests/e2e/test_moveback.py ``overflow_then_free``) end the
training only once their dip watcher samples, by lowering the training pods' run to 0. A fixed
run time was idle waiting on a fast machine and, on a loaded one, a move the watcher partly
missed. If the fake kubelet read the annotation only once, those stories would wait out the
whole run (600 s) and time out: this pins the behaviour on one pod.
"""

from __future__ import annotations

from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

pytestmark = pytest.mark.cluster
RUN_SECONDS = "vkprovider.io/fake-run-seconds"


async def phase(kube: KubeClient, path: str) -> str:
    pod: dict[str, Any] = await kube.get(path)
    return str((pod.get("status") or {}).get("phase") or "")


async def test_lowering_a_running_pods_run_seconds_ends_its_run(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory,
) -> None:
    await gpu_nodes.create(count=1, gpus=1)
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "annotations": {RUN_SECONDS: "600"}},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"vkprovider.io/pool": namespace},
                 "containers": [{"name": "t", "image": "trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    path = f"/api/v1/namespaces/{namespace}/pods/train"
    await eventually(lambda: phase(kube, path), until=lambda p: p == "Running", timeout=30,
                     what="the pod Running")
    assert await phase(kube, path) == "Running"  # a 600 s run: not over by itself
    await kube.patch(path, {"metadata": {"annotations": {RUN_SECONDS: "0"}}})
    await eventually(lambda: phase(kube, path), until=lambda p: p == "Succeeded", timeout=20,
                     what="the run ended once lowered to 0")
    pod = await kube.get(path)
    [status] = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["reason"] == "Completed"

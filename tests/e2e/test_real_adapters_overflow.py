"""The overflow story through the real cloud adapters: a GPUProvider of type runpod (and one of
type vastai) pointed at that cloud's fake on loopback, which validates every request and response
against the cloud's published OpenAPI spec.

Unscheduled inference replicas are admitted by the companion, the provider creates instances
through the real adapter (GPU type mapped through the GPUProvider's gpuTypes), they run, and
deleting the Deployment deletes them on the cloud. The fake must record no spec violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import uvicorn

from tests.fakes.runpod_fake import FakeRunPod
from tests.fakes.runpod_fake import create_app as runpod_app
from tests.fakes.vastai_fake import FakeVastAI
from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster, free_port
from vkprovider.testing.harness import CompanionProcess, ProviderProcess
from vkprovider.testing.plugin import GPUNodeFactory
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_gpuproviders import GPUPROVIDERS, secret, trusting
from .test_overflow import POLICIES, gpu_deployment, pods, policy

pytestmark = pytest.mark.cluster


@dataclass
class Cloud:
    type: str
    url: str
    api_key: str
    gpu_id: str  # what the GPUProvider maps "H100" to
    live: Callable[[], set[str]]  # instance ids the cloud runs
    violations: Callable[[], list[Any]]


@pytest_asyncio.fixture(params=["runpod", "vastai"])
async def cloud(request: pytest.FixtureRequest) -> AsyncIterator[Cloud]:
    port = free_port()
    booting: asyncio.Task[None] | None = None
    if request.param == "runpod":
        rp = FakeRunPod(api_key="rp-e2e-key", start_running=True)
        app: Any = runpod_app(rp)
        info = Cloud(type="runpod", url=f"http://127.0.0.1:{port}", api_key=rp.api_key,
                     gpu_id="NVIDIA H100 80GB HBM3",
                     live=lambda: {i for i, p in rp.pods.items() if p["status"] != "TERMINATED"},
                     violations=lambda: list(rp.violations))
    else:
        vast = FakeVastAI()
        for _ in range(4):
            vast.add_offer(gpu_name="H100 SXM", num_gpus=1, dph_total=2.1)
        app = vast.app

        async def boot() -> None:  # the cloud finishes loading what was rented
            while True:
                for contract, item in list(vast.instances.items()):
                    if item["actual_status"] == "loading":
                        vast.set_status(contract, "running")
                await asyncio.sleep(0.3)

        booting = asyncio.get_running_loop().create_task(boot())
        info = Cloud(type="vastai", url=f"http://127.0.0.1:{port}", api_key=vast.api_key,
                     gpu_id="H100 SXM", live=lambda: {str(i) for i in vast.instances},
                     violations=lambda: list(vast.violations))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield info
    finally:
        server.should_exit = True
        await task
        if booting is not None:
            booting.cancel()


async def test_overflow_runs_through_the_real_adapter_and_its_spec_validated_fake(
    kube: KubeClient, namespace: str, gpu_nodes: GPUNodeFactory, system: System,
    local_cluster: LocalCluster, companion_kubeconfig: Path, crds: list[str], cloud: Cloud,
) -> None:
    tag = uuid.uuid4().hex[:6]
    provider_name, policy_name = f"{cloud.type}-{tag}", f"pol-{tag}"
    await gpu_nodes.create(count=1, gpus=1)
    await secret(kube, namespace, "cloud-key", cloud.api_key)
    system.provider = ProviderProcess(
        work_dir=system.work_dir, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=[], config_providers=False, client_ca_file=local_cluster.ca_path,
        extra=trusting(namespace), node={"labels": {"vkprovider.io/pool": namespace}})
    system.provider.start()
    system.companion = CompanionProcess(work_dir=system.work_dir, kubeconfig=companion_kubeconfig,
                                        node_name=system.node_name, interval=0.5)
    system.companion.start()
    created: list[str] = []
    try:
        await kube.create(GPUPROVIDERS, {
            "apiVersion": "vkprovider.io/v1alpha1", "kind": "GPUProvider",
            "metadata": {"name": provider_name},
            "spec": {"type": cloud.type, "endpoint": cloud.url,
                     "credentialsSecret": {"namespace": namespace, "name": "cloud-key"},
                     "gpuTypes": {"H100": cloud.gpu_id}}})
        created.append(f"{GPUPROVIDERS}/{provider_name}")
        await kube.create(POLICIES, policy(policy_name, namespace=namespace, app="inference",
                                           providers=[provider_name]))
        created.append(f"{POLICIES}/{policy_name}")
        await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                          gpu_deployment("inference", replicas=3, pool=namespace))

        def overflowed(ps: list[dict[str, Any]]) -> bool:
            out = [p for p in ps if p["spec"].get("nodeName") == system.node_name
                   and p["status"].get("phase") == "Running"]
            return len(ps) == 3 and len(out) == 2

        ps = await eventually(lambda: pods(kube, namespace, "inference"), until=overflowed,
                              timeout=120, what=f"2 replicas Running on {cloud.type}, 1 inside")
        ann = [p["metadata"]["annotations"] for p in ps
               if p["spec"].get("nodeName") == system.node_name]
        assert {a["vkprovider.io/provider"] for a in ann} == {provider_name}
        assert {a["vkprovider.io/instance-id"] for a in ann} == cloud.live()
        assert cloud.violations() == []

        await kube.delete(f"/apis/apps/v1/namespaces/{namespace}/deployments/inference",
                          propagation="Foreground")
        await eventually(lambda: pods(kube, namespace, "inference"), until=lambda ps: not ps,
                         timeout=90, what="the Deployment's pods gone")

        async def live() -> set[str]:
            return cloud.live()

        await eventually(live, until=lambda ids: not ids, timeout=60,
                         what=f"{cloud.type} instances deleted")
        assert cloud.violations() == []
    finally:
        for path in reversed(created):
            with contextlib.suppress(Exception):
                await kube.delete(path)

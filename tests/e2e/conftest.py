"""Fixtures for e2e tests of the whole system: RBAC from manifests/, mock clouds, the provider."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess, install_provider_rbac


@pytest.fixture(scope="session")
def provider_kubeconfig(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
                        ) -> Path:
    """A kubeconfig with the token of the ServiceAccount in manifests/base/rbac.yaml."""
    path = tmp_path_factory.mktemp("rbac") / "provider.kubeconfig"

    async def install() -> Path:
        async with local_cluster.client() as kube:
            return await install_provider_rbac(kube=kube, cluster=local_cluster, path=path)

    return asyncio.run(install())


class System:
    """Mock clouds and one provider process for one test, with its own virtual node."""

    def __init__(self, *, work_dir: Path, kubeconfig: Path, kube: KubeClient) -> None:
        self.work_dir = work_dir
        self.kubeconfig = kubeconfig
        self.kube = kube
        self.node_name = f"vk-{uuid.uuid4().hex[:8]}"
        self.clouds: list[MockCloudProcess] = []
        self.provider: ProviderProcess | None = None

    async def start(self, *, clouds: int = 1, boot_delay: float = 0.3,
                    pods: dict[str, object] | None = None,
                    inventory: str = "H100:us-east:256:2.49,H100:eu-west:64:2.19,"
                                     "A100:us-east:64:1.29") -> ProviderProcess:
        for i in range(clouds):
            cloud = MockCloudProcess(work_dir=self.work_dir, name=f"cloud{i}",
                                     boot_delay=boot_delay, inventory=inventory)
            await cloud.start()
            self.clouds.append(cloud)
        self.provider = ProviderProcess(work_dir=self.work_dir, kubeconfig=self.kubeconfig,
                                        node_name=self.node_name, clouds=self.clouds, pods=pods)
        self.provider.start()
        return self.provider

    def stop(self) -> None:
        if self.provider is not None:
            self.provider.stop()
        for cloud in self.clouds:
            cloud.stop()


@pytest_asyncio.fixture
async def system(kube: KubeClient, provider_kubeconfig: Path, tmp_path: Path,
                 request: pytest.FixtureRequest) -> AsyncIterator[System]:
    sys_ = System(work_dir=tmp_path, kubeconfig=provider_kubeconfig, kube=kube)
    try:
        yield sys_
    finally:
        sys_.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed and sys_.provider is not None:
            print(f"--- provider log tail ({sys_.node_name})")
            print("\n".join(sys_.provider.log_text().splitlines()[-60:]))
        with contextlib.suppress(Exception):
            await kube.delete(f"/api/v1/nodes/{sys_.node_name}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report

"""Fixtures for e2e tests of the whole system: RBAC from manifests/, mock clouds, the provider."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.testing.cluster import LocalCluster
from vkprovider.testing.harness import (
    SIDE_BY_SIDE_VAR,
    CompanionProcess,
    MockCloudProcess,
    ProviderProcess,
    grant_provider_node,
    install_crds,
    install_provider_rbac,
    service_account_kubeconfig,
)
from vkprovider.testing.kueue import (
    KueueManager,
    kueue,  # noqa: F401 - the session's real Kueue fixture
)
from vkprovider.testing.plugin import locked, worker_shared_dir
from vkprovider.testing.realnode import RealNode


@pytest.fixture(scope="session")
def provider_kubeconfig(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
                        ) -> Path:
    """A kubeconfig with the token of the provider's ServiceAccount (manifests/base/
    serviceaccount.yaml), bound by manifests/base/rbac.yaml."""
    path = tmp_path_factory.mktemp("rbac") / "provider.kubeconfig"

    async def install() -> Path:
        async with local_cluster.client() as kube:
            return await install_provider_rbac(kube=kube, cluster=local_cluster, path=path)

    return asyncio.run(install())


@pytest.fixture(scope="session")
def companion_kubeconfig(local_cluster: LocalCluster, provider_kubeconfig: Path,
                         tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The companion's ServiceAccount token (RBAC from manifests/base/rbac-policies.yaml)."""
    path = tmp_path_factory.mktemp("rbac") / "companion.kubeconfig"

    async def mint() -> Path:
        async with local_cluster.client() as kube:
            return await service_account_kubeconfig(kube=kube, cluster=local_cluster,
                                                    namespace="vkprovider-system",
                                                    name="vkprovider-companion", path=path)

    return asyncio.run(mint())


@pytest.fixture(scope="session")
def crds(local_cluster: LocalCluster) -> list[str]:
    """The GPUProvider and OverflowPolicy CRDs, installed once per run."""

    async def install() -> list[str]:
        async with local_cluster.client() as kube:
            return await install_crds(kube)

    return asyncio.run(install())


# ---- which tests may run side by side (pytest-xdist, `make test`) ----------------------------
#
# The workers share one control plane, so a test that acts on what the whole cluster shares
# would act on its neighbour's objects too: a companion decides for every OverflowPolicy and
# every pending pod they select, and for every Workload with the pre-warm check; a provider
# serves every GPUProvider; Kueue and the real node are one per cluster. Such tests form one
# xdist group (``--dist loadgroup`` runs a group on one worker, one test at a time). So do the
# tests that start a control plane of their own, which load the machine as much as the whole
# shared one. Everything else runs beside them. A test lands in the cluster-wide group by the
# fixtures it uses (_CLUSTER_WIDE_FIXTURES) or by the ``cluster_wide`` mark; the rest is checked
# as it runs: a test outside both groups gets providers that ignore GPUProviders, and starting
# a companion there fails (vkprovider.testing.harness.SIDE_BY_SIDE_VAR).
CLUSTER_WIDE = "cluster-wide"
OWN_CLUSTER = "own-cluster"
_CLUSTER_WIDE_FIXTURES = frozenset({"kueue", "kueue_objects", "real_node", "companion_kubeconfig",
                                    "cluster_objects"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster_wide: acts on cluster-wide state (a companion, OverflowPolicies, "
        "GPUProviders, Kueue, the real node): never runs beside another such test")
    config.addinivalue_line(
        "markers", "own_cluster: starts a control plane of its own: never runs beside another "
        "such test")


def side_by_side_group(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must run in, or None when it may run beside anything."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("cluster_wide") or fixtures & _CLUSTER_WIDE_FIXTURES:
        return CLUSTER_WIDE
    if item.get_closest_marker("own_cluster"):
        return OWN_CLUSTER
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as each test is collected: before xdist reads the marks (its own
    ``pytest_collection_modifyitems``, which may run ahead of a conftest's)."""
    group = side_by_side_group(item) if item.path.is_relative_to(Path(__file__).parent) else None
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _side_by_side(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                  ) -> Iterator[None]:
    """Outside both groups, say so to the harness (it then refuses what acts cluster-wide).
    Inside one, under xdist, hold the group's lock for the test: a second test of the group
    running at the same time (the groups not honoured) fails at once instead of flaking."""
    group = side_by_side_group(request.node)
    if group is None:
        monkeypatch.setenv(SIDE_BY_SIDE_VAR, request.node.nodeid)
        yield
        return
    shared = worker_shared_dir(request.config)
    if shared is None:  # one process: one test at a time anyway
        yield
        return
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(locked(shared / f"group-{group}.lock", wait=False))
        except BlockingIOError:
            pytest.fail(f"another test of the {group} group is running on another worker: "
                        "the xdist groups are not honoured (vkprovider/testing/xdistgroups.py)")
        yield

class System:
    """Mock clouds and one provider process for one test, with its own virtual node."""

    def __init__(self, *, work_dir: Path, kubeconfig: Path, kube: KubeClient,
                 client_ca: Path | None = None, network: Path | None = None) -> None:
        self.work_dir = work_dir
        #: the lab network's address map (LocalCluster.address_map_dir): mock clouds publish
        #: their instances' listeners there and the provider's probes dial through it
        self.network = network
        self.kubeconfig = kubeconfig
        self.kube = kube
        self.client_ca = client_ca  # the cluster CA: the API server's kubelet-client cert
        self.node_name = f"vk-{uuid.uuid4().hex[:8]}"
        self.clouds: list[MockCloudProcess] = []
        self.provider: ProviderProcess | None = None
        self.companion: CompanionProcess | None = None

    async def start(self, *, clouds: int = 1, boot_delay: float = 0.3,
                    pods: dict[str, object] | None = None,
                    node_labels: dict[str, str] | None = None,
                    taint_value: str | None = None,
                    inventories: list[str] | None = None,
                    inventory: str = "H100:us-east:256:2.49,H100:eu-west:64:2.19,"
                                     "A100:us-east:64:1.29") -> ProviderProcess:
        for i in range(clouds):
            cloud = MockCloudProcess(work_dir=self.work_dir, name=f"cloud{i}",
                                     boot_delay=boot_delay,
                                     inventory=inventories[i] if inventories else inventory,
                                     address_map_dir=self.network, public_block=i)
            await cloud.start()
            self.clouds.append(cloud)
        lab = {"probe_address_map": str(self.network)} if self.network else {}
        self.provider = ProviderProcess(work_dir=self.work_dir, kubeconfig=self.kubeconfig,
                                        node_name=self.node_name, clouds=self.clouds,
                                        pods={**lab, **(pods or {})},
                                        node={"labels": node_labels or {},
                                              **({"taint_value": taint_value}
                                                 if taint_value else {})},
                                        client_ca_file=self.client_ca)
        self.provider.start()
        return self.provider

    def start_companion(self, *, kubeconfig: Path) -> CompanionProcess:
        self.companion = CompanionProcess(work_dir=self.work_dir, kubeconfig=kubeconfig,
                                          node_name=self.node_name, interval=0.5)
        self.companion.start()
        return self.companion

    def stop(self) -> None:
        if self.provider is not None:
            self.provider.stop()
        for cloud in self.clouds:
            cloud.stop()


@pytest_asyncio.fixture
async def system(kube: KubeClient, provider_kubeconfig: Path, tmp_path: Path,
                 local_cluster: LocalCluster, request: pytest.FixtureRequest
                 ) -> AsyncIterator[System]:
    sys_ = System(work_dir=tmp_path, kubeconfig=provider_kubeconfig, kube=kube,
                  client_ca=local_cluster.ca_path, network=local_cluster.address_map_dir)
    await grant_provider_node(kube=kube, node=sys_.node_name)  # its Node and Leases, by name
    try:
        yield sys_
    finally:
        sys_.stop()
        if sys_.companion is not None:
            sys_.companion.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed and sys_.provider is not None:
            print(f"--- provider log tail ({sys_.node_name})")
            print("\n".join(sys_.provider.log_text().splitlines()[-60:]))
        with contextlib.suppress(Exception):
            await kube.delete(f"/api/v1/nodes/{sys_.node_name}")


class Cluster:
    """Cluster-scoped objects a test creates (policies, priority classes), deleted after it."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.paths: list[str] = []

    async def create(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = await self.kube.create(collection, body)
        self.paths.append(f"{collection}/{obj['metadata']['name']}")
        return obj


@pytest_asyncio.fixture
async def cluster_objects(kube: KubeClient, crds: list[str]) -> AsyncIterator[Cluster]:
    objs = Cluster(kube)
    try:
        yield objs
    finally:
        for path in reversed(objs.paths):
            with contextlib.suppress(Exception):
                await kube.delete(path)


@pytest_asyncio.fixture
async def kueue_objects(
    kueue: KueueManager,  # noqa: F811 - requests the session's Kueue (imported above)
    kube: KubeClient,
) -> AsyncIterator[list[str]]:
    """Cluster-scoped Kueue objects a test creates, deleted after it (checks last)."""
    paths: list[str] = []
    try:
        yield paths
    finally:
        for path in reversed(paths):
            with contextlib.suppress(APIError):
                await kube.delete(path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def real_node(local_cluster: LocalCluster) -> Iterator[RealNode]:
    """A real worker node (containerd, runc, bridge CNI, kubelet, kube-proxy) in its own network
    namespace, joined to the session's cluster; tainted ``TAINT`` so only tests that tolerate it
    use it (vkprovider.testing.realnode)."""
    node = RealNode(cluster=local_cluster)
    asyncio.run(node.start())  # stops what it started if it fails
    try:
        yield node
    finally:
        node.stop()

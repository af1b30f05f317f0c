"""pytest plugin: one real control plane per test run, a namespace per test.

Why it exists: starting etcd and kube-apiserver costs ~10-20 s, so the whole run shares one
cluster and tests isolate by namespace. Use it from your own tests with
``pytest_plugins = ["vkprovider.testing.plugin"]``.

Fixtures:

* ``local_cluster`` (session): a started :class:`LocalCluster` with the fake kubelet running,
  serving pods on real listeners behind ``local_cluster.address_map_dir``.
* ``kube`` (function, async): an admin :class:`KubeClient`.
* ``namespace`` (function, async): a fresh namespace, deleted after the test.
* ``mock_cloud`` (function, async): a mock GPU cloud in the test's loop, optionally with a
  scenario (:mod:`vkprovider.testing.mockcloud`; no control plane needed).

A failing test gets the tail of every component's log attached to its report; the full logs stay
under ``.artifacts/controlplane-logs`` (or ``VKP_ARTIFACTS``).

Under pytest-xdist (``-n N``) the workers share the one cluster too: the first worker that needs
it starts it, under a lock in a folder the controller hands every worker, and writes down how to
reach it (:meth:`LocalCluster.save`); the others adopt it (:meth:`LocalCluster.adopt`). No worker
stops it: a worker may finish while another still runs tests, so the controller, which outlives
them all, stops it at the end by its processes' groups. What the workers could pick alike
(ports, mock-cloud address blocks) each picks from its own share
(:mod:`vkprovider.testing.workers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFoundError
from vkprovider.testing.cluster import REPO_ROOT, LocalCluster
from vkprovider.testing.fakekubelet import create_gpu_nodes
from vkprovider.testing.mockcloud import (  # noqa: F401 - pytest registers these from here
    mock_cloud,
    pytest_configure,
)
from vkprovider.testing.waiting import eventually

_CLUSTER_KEY = pytest.StashKey[LocalCluster]()
#: the controller's folder for what its xdist workers share (the cluster's state file, a lock)
_SHARED_KEY = pytest.StashKey[Path]()
_WORKER_INPUT = "vkp_shared_dir"
_STATE = "cluster.json"


def _artifacts() -> Path:
    return Path(os.environ.get("VKP_ARTIFACTS", REPO_ROOT / ".artifacts"))


def _start_cluster() -> LocalCluster:
    log_dir = _artifacts() / "controlplane-logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    cluster = LocalCluster(log_dir=log_dir)
    try:
        asyncio.run(cluster.start())
        cluster.start_fake_kubelet(start_delay=0.3, max_grace=1,
                                   address_map_dir=cluster.address_map_dir)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def local_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    shared = worker_shared_dir(request.config)
    if shared is not None:  # an xdist worker: the run's one cluster, started by whoever came first
        with locked(shared / "lock"):
            state = shared / _STATE
            if state.exists():
                cluster = LocalCluster.adopt(state)
            else:
                cluster = _start_cluster()
                cluster.save(state)
        request.config.stash[_CLUSTER_KEY] = cluster
        yield cluster  # the controller stops it once every worker is done (pytest_unconfigure)
        return
    cluster = _start_cluster()
    try:
        request.config.stash[_CLUSTER_KEY] = cluster
        yield cluster
    finally:
        cluster.stop()


def worker_shared_dir(config: pytest.Config) -> Path | None:
    """The folder the xdist controller shares with this worker (None outside xdist)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or _WORKER_INPUT not in workerinput:
        return None
    return Path(workerinput[_WORKER_INPUT])


@contextlib.contextmanager
def locked(path: Path, *, wait: bool = True) -> Iterator[None]:
    """An exclusive lock on ``path`` for the block, between processes; with ``wait=False``,
    ``BlockingIOError`` when another holds it."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, for each worker: where the workers meet (one folder a run)."""
    config: pytest.Config = node.config
    shared = config.stash.get(_SHARED_KEY, None)
    if shared is None:
        shared = Path(tempfile.mkdtemp(prefix="vkp-xdist-"))
        config.stash[_SHARED_KEY] = shared
    node.workerinput[_WORKER_INPUT] = str(shared)


@pytest.hookimpl(trylast=True)  # after every plugin and conftest marked its tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An xdist worker: tell the controller which group each test is in (xdistgroups)."""
    shared = worker_shared_dir(config)
    if shared is not None:
        from vkprovider.testing.xdistgroups import write_groups

        worker = str(getattr(config, "workerinput", {}).get("workerid", "gw"))
        write_groups(folder=shared, worker=worker, items=items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The controller: ``--dist loadgroup`` by the groups the workers wrote down."""
    shared = config.stash.get(_SHARED_KEY, None)
    if shared is None or config.getvalue("dist") != "loadgroup":
        return None
    from vkprovider.testing.xdistgroups import GroupScheduling

    return GroupScheduling(config, log, folder=shared)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller, after every worker ended: stop the cluster one of them started."""
    shared = config.stash.get(_SHARED_KEY, None)
    if shared is None:
        return
    state = shared / _STATE
    if state.exists():
        LocalCluster.adopt(state).stop()
    shutil.rmtree(shared, ignore_errors=True)


@pytest_asyncio.fixture
async def kube(local_cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    client = local_cluster.client()
    try:
        yield client
    finally:
        await client.aclose()


@pytest_asyncio.fixture
async def namespace(kube: KubeClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-") or "test"
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    await kube.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    try:
        yield name
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/namespaces/{name}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    cluster = item.config.stash.get(_CLUSTER_KEY, None)
    if report.failed and cluster is not None:
        for comp in cluster.components.values():
            report.sections.append((f"{comp.name} log (tail)", comp.tail(30)))
    return report


@pytest_asyncio.fixture
async def gpu_nodes(kube: KubeClient, namespace: str) -> AsyncIterator[GPUNodeFactory]:
    """A factory for simulated GPU nodes in a pool of this test; deleted after the test.

    Each node is labelled ``vkprovider.io/pool=<namespace>``, so a test's pods can select its own
    nodes with that nodeSelector and never land on another test's.
    """
    factory = GPUNodeFactory(kube=kube, pool=namespace)
    try:
        yield factory
    finally:
        for name in factory.created:
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"/api/v1/nodes/{name}")


class GPUNodeFactory:
    def __init__(self, *, kube: KubeClient, pool: str) -> None:
        self.kube = kube
        self.pool = pool
        self.created: list[str] = []

    async def create(
        self, *, count: int, gpus: int, product: str = "NVIDIA-H100-80GB-HBM3"
    ) -> list[str]:
        names = [f"{self.pool[:40]}-gpu-{len(self.created) + i}" for i in range(count)]
        await create_gpu_nodes(
            kube=self.kube,
            names=names,
            gpus=gpus,
            product=product,
            labels={"vkprovider.io/pool": self.pool},
        )
        self.created.extend(names)
        for name in names:  # usable = Ready and the node-lifecycle controller's taints gone
            await eventually(
                lambda n=name: self.kube.get(f"/api/v1/nodes/{n}"),  # type: ignore[misc]
                until=_schedulable,
                timeout=60,
                what=f"node {name} Ready without not-ready taints",
            )
        return names


def _schedulable(node: dict[str, Any]) -> bool:
    taints = node.get("spec", {}).get("taints") or []
    conds = node.get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
    return ready and not any(t["key"].startswith("node.kubernetes.io/") for t in taints)

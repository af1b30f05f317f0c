"""Run the system under test as real processes: mock clouds and ``vkprovider run``.

Why it exists: e2e tests (and benchmarks, and the demo) must exercise the shipped entry points,
with the RBAC from ``manifests/`` (the provider authenticates with a token of its ServiceAccount
obtained through the TokenRequest API), and must be able to ``kill -9`` the provider mid-flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from providers.mock.records import PUBLIC_BLOCKS
from vkprovider.errors import VKError
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import ConflictError
from vkprovider.testing import workers
from vkprovider.testing.cluster import REPO_ROOT, Component, LocalCluster, free_port

MANIFESTS = REPO_ROOT / "manifests"

#: Set (to the test's id) while a test runs beside others on the shared cluster (pytest-xdist;
#: tests/e2e/conftest.py): its providers then ignore GPUProvider objects and other tests'
#: OverflowPolicies unless it configures ``gpu_providers`` or ``pods.policy_labels`` itself, and
#: it may not start a companion, which acts on every policy.
SIDE_BY_SIDE_VAR = "VKP_TEST_SIDE_BY_SIDE"


#: the label that makes an OverflowPolicy a side-by-side test's own (pods.policy_labels)
TEST_POLICY_LABEL = "vkprovider.io/e2e-test"


def policy_label_for(test_id: str) -> str:
    """A label value naming one test (its node id, hashed to fit)."""
    return hashlib.sha256(test_id.encode()).hexdigest()[:16]


class SideBySideError(VKError):
    """A test that runs beside others started something that acts on the whole cluster."""

# kind -> (API path prefix, plural, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions",
                                 False),
}


def collection_path(obj: dict[str, Any]) -> str:
    prefix, plural, namespaced = _KINDS[obj["kind"]]
    if namespaced:
        ns = obj["metadata"].get("namespace", "default")
        return f"{prefix}/namespaces/{ns}/{plural}"
    return f"{prefix}/{plural}"


async def apply_file(kube: KubeClient, path: Path) -> list[dict[str, Any]]:
    """Create every object in a YAML file; objects that exist are left as they are."""
    objs = [o for o in yaml.safe_load_all(path.read_text()) if o]  # noqa: ASYNC240 - tiny file
    for obj in objs:
        with contextlib.suppress(ConflictError):
            await kube.create(collection_path(obj), obj)
    return objs


async def service_account_kubeconfig(
    *, kube: KubeClient, cluster: LocalCluster, namespace: str, name: str, path: Path
) -> Path:
    """A kubeconfig with a fresh TokenRequest token for ``namespace/name``."""
    body = await kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 86400}},
    )
    return cluster.write_token_kubeconfig(path=path, token=body["status"]["token"])


#: The node name manifests/base is rendered for (the chart's default ``node.name``).
MANIFESTS_NODE = "vk-gpu-burst"


def node_rbac(node: str) -> list[dict[str, Any]]:
    """The rules of manifests/base/rbac*.yaml that name the node's objects, for ``node``.

    The rendered RBAC grants the provider its own Node and Leases, and the companion its Lease,
    by name (resourceNames), for the chart's ``node.name``. A test node of another name gets the
    same rules with its name: what ``helm template --set node.name=<node>`` renders, as extra
    Roles and bindings whose names end in ``--<node>``.
    """
    objs = [o for name in ("rbac.yaml", "rbac-policies.yaml")
            for o in yaml.safe_load_all((MANIFESTS / "base" / name).read_text()) if o]
    out: list[dict[str, Any]] = []
    roles: set[tuple[str, str]] = set()
    for obj in objs:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        rules = [{**rule, "resourceNames": [n.replace(MANIFESTS_NODE, node)
                                            for n in rule["resourceNames"]]}
                 for rule in obj.get("rules") or []
                 if any(MANIFESTS_NODE in n for n in rule.get("resourceNames") or [])]
        if rules:
            roles.add((obj["kind"], obj["metadata"]["name"]))
            meta = {**obj["metadata"], "name": f"{obj['metadata']['name']}--{node}"}
            out.append({**obj, "metadata": meta, "rules": rules})
    for obj in objs:
        ref = obj.get("roleRef") or {}
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding") and (
                ref.get("kind"), ref.get("name")) in roles:
            meta = {**obj["metadata"], "name": f"{obj['metadata']['name']}--{node}"}
            out.append({**obj, "metadata": meta,
                        "roleRef": {**ref, "name": f"{ref['name']}--{node}"}})
    return out


async def grant_provider_node(*, kube: KubeClient, node: str) -> None:
    """Let the ServiceAccounts serve ``node`` as the chart would (see node_rbac)."""
    if node == MANIFESTS_NODE:
        return
    for obj in node_rbac(node):
        with contextlib.suppress(ConflictError):
            await kube.create(collection_path(obj), obj)


async def install_provider_rbac(*, kube: KubeClient, cluster: LocalCluster, path: Path,
                                nodes: Sequence[str] = ()) -> Path:
    """manifests/base RBAC (for its node, and ``nodes``); the provider's token in ``path``."""
    await apply_file(kube, MANIFESTS / "base" / "namespace.yaml")
    await apply_file(kube, MANIFESTS / "base" / "serviceaccount.yaml")  # both processes'
    await apply_file(kube, MANIFESTS / "base" / "rbac.yaml")
    await apply_file(kube, MANIFESTS / "base" / "rbac-policies.yaml")
    for node in nodes:
        await grant_provider_node(kube=kube, node=node)
    return await service_account_kubeconfig(kube=kube, cluster=cluster,
                                            namespace="vkprovider-system", name="vkprovider",
                                            path=path)


class _Process:
    """A process of the system under test: SIGKILL (a crash), stop, read its log."""

    component: Component

    def alive(self) -> bool:
        return self.component.alive()

    def kill(self) -> None:
        self.component.kill()

    def stop(self) -> None:
        self.component.stop()

    def log_text(self) -> str:
        return self.component.log_path.read_text(errors="replace")


class MockCloudAPI:
    """A mock cloud's API at ``url``, wherever it runs (a process here, or a pod the host
    reaches): its instances and its admin ledger. ``api_key``: the key the cloud wants (its
    ``--api-key-env``), sent with every call."""

    def __init__(self, *, url: str, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key

    async def admin(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.api_key is not None:
            kwargs["headers"] = {"Authorization": f"Bearer {self.api_key}",
                                 **(kwargs.get("headers") or {})}
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as http:
            resp = await http.request(method, path, **kwargs)
            resp.raise_for_status()
            return resp.json() if resp.content else None

    async def ledger(self) -> list[dict[str, Any]]:
        body = await self.admin("GET", "/admin/ledger")
        return list(body["instances"] if isinstance(body, dict) else body)

    async def stats(self) -> dict[str, Any]:
        return dict(await self.admin("GET", "/admin/stats"))

    async def instances(self) -> list[dict[str, Any]]:
        body = await self.admin("GET", "/instances")
        return list(body["instances"] if isinstance(body, dict) else body)


class MockCloudProcess(MockCloudAPI, _Process):
    """``vkprovider mock-cloud`` on a free loopback port, with its admin API at hand."""

    def __init__(self, *, work_dir: Path, name: str = "mock", boot_delay: float = 0.5,
                 delete_delay: float = 0.0, inventory: str | None = None,
                 scenario: str | Path | None = None,
                 address_map_dir: Path | None = None, public_block: int = 0,
                 event_loop: str | None = None, edge_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, api_key: str | None = None) -> None:
        self.name = name
        self.address_map_dir = address_map_dir  # routes to its listeners: mock-<name>.json
        self.port = free_port()
        super().__init__(url=f"http://127.0.0.1:{self.port}", api_key=api_key)
        self.component = Component(
            name=f"mock-cloud-{name}",
            argv=[sys.executable, "-m", "vkprovider", "mock-cloud", "--port", str(self.port),
                  "--boot-delay", str(boot_delay), "--delete-delay", str(delete_delay),
                  *(["--inventory", inventory] if inventory else []),
                  *(["--scenario", str(scenario)] if scenario else []),
                  # route file and address block: this pytest-xdist worker's own, as workers
                  # share the lab network's address map (vkprovider.testing.workers)
                  *(["--address-map-dir", str(address_map_dir), "--name", workers.tag(name)]
                    if address_map_dir is not None else []),
                  "--public-block", str(workers.public_block(public_block,
                                                             blocks=PUBLIC_BLOCKS)),
                  *(["--event-loop", event_loop] if event_loop else []),
                  # hostname-only mode (--edge-domain ...; providers/mock/edge.py)
                  *edge_args],
            log_path=work_dir / f"mock-cloud-{name}.log",
        )
        self.env = env  # e.g. the API key (--api-key-env) the edge wants

    async def start(self) -> None:
        self.component.start(env=self.env)
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=self.url) as http:
            while True:
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if not self.component.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"mock cloud did not start:\n{self.component.tail()}")
                await asyncio.sleep(0.1)


#: a checkout whose ``vkprovider`` and ``providers`` the e2e harness's provider processes run
#: instead of this tree's (everything else, the tests, the mock cloud and the harness, stays
#: this tree's): how a new e2e is shown to fail on an older provider (docs/testing.md)
PROVIDER_SOURCE_VAR = "VKP_E2E_PROVIDER_SOURCE"


def provider_source_env() -> dict[str, str]:
    """The environment that makes a provider process import another checkout's code, or none.
    ``PYTHONSAFEPATH`` keeps the working directory (this tree) off the front of ``sys.path``."""
    source = os.environ.get(PROVIDER_SOURCE_VAR)
    if not source:
        return {}
    root = Path(source).resolve()
    if not (root / "vkprovider" / "__init__.py").is_file():
        raise ValueError(f"{PROVIDER_SOURCE_VAR}={source!r} is not a vkprovider checkout")
    return {"PYTHONPATH": str(root), "PYTHONSAFEPATH": "1"}


class ProviderProcess(_Process):
    """``vkprovider run`` with a generated config, restartable, killable with SIGKILL.

    ``config_providers=False`` writes no ``providers:`` (GPUProvider objects only); ``replica``
    tells apart several processes of one node (files, ports); ``extra`` adds top-level settings
    (``leader_election``, ``gpu_providers``); ``env`` adds environment variables; ``python`` runs
    it with another interpreter (the benches' runtime-only venv).
    """

    def __init__(self, *, work_dir: Path, kubeconfig: Path, node_name: str,
                 clouds: list[MockCloudProcess], pods: dict[str, Any] | None = None,
                 node: dict[str, Any] | None = None, client_ca_file: Path | None = None,
                 kubelet_api: dict[str, Any] | None = None, config_providers: bool = True,
                 replica: str | None = None, extra: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, python: Path | None = None) -> None:
        self.node_name = node_name
        self.replica = replica
        self.env = env
        self.metrics_port = free_port()
        self.kubelet_port = free_port()
        config = {
            "kubeconfig": str(kubeconfig),
            "metrics_port": self.metrics_port,
            "node": {"name": node_name, "kubelet_port": self.kubelet_port,
                     "capacity_refresh_seconds": 2, **(node or {})},
            "pods": {"status_interval_seconds": 1, "orphan_grace_seconds": 3, **(pods or {})},
            # the kubelet API trusts client certificates of this CA (the API server's
            # kubelet-client certificate in LocalCluster) and reads GPU figures every 2 s
            "kubelet_api": {"client_ca_file": str(client_ca_file) if client_ca_file else None,
                            "gpu_metrics_interval_seconds": 2, **(kubelet_api or {})},
            **(extra or {}),
        }
        beside = os.environ.get(SIDE_BY_SIDE_VAR)
        if beside and "gpu_providers" not in config:
            # GPUProviders are cluster-wide: a neighbour test's are not this test's to serve
            config["gpu_providers"] = {"enabled": False}
        if beside and "policy_labels" not in config["pods"]:
            # nor are its OverflowPolicies: once one exists, every pod needs one (node/
            # policygate.py); this test's provider is governed by the policies it labels so
            config["pods"]["policy_labels"] = {TEST_POLICY_LABEL: policy_label_for(beside)}
        if config_providers:
            config["providers"] = [{"name": c.name, "type": "mock", "url": c.url}
                                   for c in clouds]
        stem = f"{node_name}-{replica}" if replica else node_name
        self.config_path = work_dir / f"{stem}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.component = Component(
            name=f"provider-{stem}",
            argv=[str(python or sys.executable), "-m", "vkprovider", "--log-format=json", "run",
                  "--config", str(self.config_path)],
            log_path=work_dir / f"provider-{stem}.log",
        )

    def start(self) -> None:
        env = {**(self.env or {}), **provider_source_env()}
        self.component.start(env={**os.environ, **env} if env else None)

    def returncode(self) -> int | None:
        proc = self.component.process
        return None if proc is None else proc.poll()

    async def metrics(self) -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"http://127.0.0.1:{self.metrics_port}/metrics")).text


class CompanionProcess(_Process):
    """``vkprovider descheduler`` for one virtual node, or several (``node_name`` a list)."""

    def __init__(self, *, work_dir: Path, kubeconfig: Path, node_name: str | Sequence[str],
                 interval: float = 1.0, move_back_interval: float = 1.0,
                 extra_args: Sequence[str] = ()) -> None:
        nodes = [node_name] if isinstance(node_name, str) else list(node_name)
        self.component = Component(
            name=f"companion-{nodes[0]}",
            argv=[sys.executable, "-m", "vkprovider", "--log-format=json", "descheduler",
                  "--kubeconfig", str(kubeconfig),
                  *(arg for node in nodes for arg in ("--node-name", node)),
                  "--interval", str(interval), "--move-back-interval", str(move_back_interval),
                  *extra_args],
            log_path=work_dir / f"companion-{nodes[0]}.log",
        )

    def start(self) -> None:
        test = os.environ.get(SIDE_BY_SIDE_VAR)
        if test:
            raise SideBySideError(
                f"{test} starts a companion, which acts on every OverflowPolicy and pre-warm "
                "Workload in the cluster, beside other tests: mark it cluster_wide "
                "(tests/e2e/conftest.py)")
        self.component.start()


async def install_crds(kube: KubeClient, *, timeout: float = 30.0) -> list[str]:
    """Create the CRDs in manifests/crds (idempotent) and wait until each is Established."""
    names: list[str] = []
    for path in sorted((MANIFESTS / "crds").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for obj in await apply_file(kube, path):
            names.append(obj["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {name} not Established after {timeout}s")
            await asyncio.sleep(0.2)
    return names

"""The Helm chart against the real local control plane (issue "Ship it").

helm is built from tools/helm by its build.sh (warm: instant; cold: ~2.5 min, so the first test
may wait for it; a failed build fails the tests, never skips them). `kubectl` is not used: every
object goes through the project's KubeClient.

* `helm lint --strict` is clean, with the default values and with every optional part on, and
  as a subchart's values (`global` set);
* `helm template` output, every optional part on, passes the API server's validation and
  admission as a server-side apply with dryRun=All (the Prometheus Operator's CRDs are not
  installed here: stand-ins that accept any spec make their kinds known, so only group, kind,
  namespace and name are checked for those two);
* the restricted Pod Security level admits the rendered pods: the Deployments' pod templates,
  created with dryRun=All as Pods in a namespace labelled `enforce: restricted` (and a pod
  without the securityContext is refused there, so the check has teeth);
* installed for real under a release name of this test (CRDs, RBAC, ConfigMap), with both
  processes run as local subprocesses on the chart's ServiceAccounts' tokens, the chart's args
  and the chart's settings files (only loopback ports, the kubelet address, the client CA path,
  the mock cloud's URL and the kubeconfig are rewritten), an unschedulable GPU pod that an
  OverflowPolicy selects is admitted and runs on the virtual node in the mock cloud, and the
  `helm test` pod's check, run against those processes, passes (and fails for another node).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError, NotFoundError
from vkprovider.testing.cluster import Component, LocalCluster, free_port
from vkprovider.testing.harness import MockCloudProcess, service_account_kubeconfig
from vkprovider.testing.waiting import eventually

from .bursts import burst_objects
from .conftest import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]  # a cold helm build: ~2.5 min

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vkprovider"
FIELD_MANAGER = "vkprovider-chart-test"
POLICIES = "/apis/vkprovider.io/v1alpha1/overflowpolicies"

Obj = dict[str, Any]

# Every optional part of the chart on (the dry-run and Pod Security checks render this).
FULL_VALUES: Obj = {
    "mockCloud": {"enabled": True},
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "dashboard": {"enabled": True},
    "networkPolicy": {"enabled": True,
                      "metricsFrom": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": "monitoring"}}}],
                      "kubeletAPIFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
                      "egress": [{}]},
    "kubeletAPI": {"tls": {"secretName": "vkprovider-serving"}},  # a cert-manager Secret
    "helmTest": {"enabled": True},
    "global": {"imageRegistry": "example.com"},  # as an umbrella chart passes it
    "providers": [{"name": "my-runpod", "type": "runpod", "url": "https://api.runpod.io",
                   "apiKeySecret": {"name": "runpod-credentials"}}],
    "gpuProviders": [{"name": "PLACEHOLDER", "type": "vastai",
                      "credentialsSecret": {"name": "vastai-credentials"},
                      "gpuTypes": {"H100": "H100_SXM"}, "maxGPUs": 4,
                      "options": {"verified": True}}],
}


@pytest.fixture(scope="module")
def helm() -> Path:
    done = subprocess.run(["bash", str(REPO / "tools" / "helm" / "build.sh")],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, f"tools/helm/build.sh failed:\n{done.stderr[-4000:]}"
    path = Path(done.stdout.strip().splitlines()[-1]) / "helm"
    assert path.is_file(), f"tools/helm/build.sh printed {path.parent}, which has no helm"
    return path


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def render(helm: Path, *, release: str, namespace: str, values: Obj | None = None,
           work: Path, crds: bool = False) -> list[Obj]:
    argv = ["template", release, str(CHART), "--namespace", namespace]
    if values is not None:
        path = work / f"values-{release}.yaml"
        path.write_text(yaml.safe_dump(values))
        argv += ["--values", str(path)]
    if crds:
        argv.append("--include-crds")
    done = run_helm(helm, *argv)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def full_values(tag: str) -> Obj:
    values = yaml.safe_load(yaml.safe_dump(FULL_VALUES))
    values["gpuProviders"][0]["name"] = f"vastai-{tag}"
    values["node"] = {"name": f"vk-{tag}", "taintValue": "vkprovider"}
    return dict(values)


class Resources:
    """Where each kind lives on this API server (discovery), for kinds the chart renders."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._groups: dict[str, tuple[str, dict[str, tuple[str, bool]]]] = {}

    async def collection(self, obj: Obj) -> str:
        api_version, kind = obj["apiVersion"], obj["kind"]
        if kind not in self._groups.get(api_version, ("", {}))[1]:
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            body = await eventually(lambda: self.kube.get(prefix),
                                    until=lambda b: any(r["kind"] == kind
                                                        for r in b.get("resources", [])),
                                    timeout=30, what=f"{kind} served at {prefix}")
            self._groups[api_version] = (prefix, {
                r["kind"]: (r["name"], r["namespaced"]) for r in body["resources"]
                if "/" not in r["name"]})
        prefix, kinds = self._groups[api_version]
        plural, namespaced = kinds[kind]
        if namespaced:
            return f"{prefix}/namespaces/{obj['metadata']['namespace']}/{plural}"
        return f"{prefix}/{plural}"

    async def apply(self, obj: Obj, *, dry_run: bool) -> Obj:
        """Server-side apply (what `kubectl apply --server-side [--dry-run=server]` sends)."""
        path = f"{await self.collection(obj)}/{obj['metadata']['name']}"
        params: dict[str, str | int | bool] = {"fieldManager": FIELD_MANAGER, "force": True}
        if dry_run:
            params["dryRun"] = "All"
        return await self.kube.request("PATCH", path, params=params, body=obj,
                                       content_type="application/apply-patch+yaml")


def stand_in_crd(plural: str, kind: str) -> Obj:
    """A CRD for a Prometheus Operator kind that accepts any spec (its schema is not here)."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind,
                               "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                         "openAPIV3Schema": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest_asyncio.fixture
async def monitoring_crds(kube: KubeClient) -> AsyncIterator[None]:
    created = []
    for plural, kind in (("servicemonitors", "ServiceMonitor"),
                         ("prometheusrules", "PrometheusRule")):
        path = (f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                f"{plural}.monitoring.coreos.com")
        try:
            await kube.get(path)
        except NotFoundError:
            await kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                              stand_in_crd(plural, kind))
            created.append(path)
    try:
        yield
    finally:
        for path in created:
            with contextlib.suppress(APIError):
                await kube.delete(path)


# -- (a) lint ----------------------------------------------------------------------------------


def test_helm_lint_is_clean(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "full.yaml"
    values.write_text(yaml.safe_dump(full_values("lint")))
    for extra in ([], ["--values", str(values)]):
        done = run_helm(helm, "lint", "--strict", str(CHART), *extra)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "1 chart(s) linted, 0 chart(s) failed" in out, out
        assert "[WARNING]" not in out and "[ERROR]" not in out, out


# -- (b) server-side dry-run -------------------------------------------------------------------


async def test_rendered_chart_passes_server_side_dry_run(
    helm: Path, kube: KubeClient, namespace: str, crds: list[str], monitoring_crds: None,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    objs = render(helm, release=f"dry{tag}", namespace=namespace, values=full_values(tag),
                  work=tmp_path, crds=True)
    kinds = {o["kind"] for o in objs}
    assert kinds >= {"CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                     "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Service",
                     "Deployment", "PodDisruptionBudget", "GPUProvider", "ServiceMonitor",
                     "PrometheusRule", "NetworkPolicy", "Pod"}, kinds
    resources = Resources(kube)
    for obj in objs:
        try:
            out = await resources.apply(obj, dry_run=True)
        except APIError as exc:
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {exc}") from exc
        assert out["kind"] == obj["kind"] and out["metadata"]["name"] == obj["metadata"]["name"]
    # dryRun=All persisted nothing
    dep = next(o for o in objs if o["kind"] == "Deployment")
    with pytest.raises(NotFoundError):
        await kube.get(f"{await resources.collection(dep)}/{dep['metadata']['name']}")


# -- (c) Pod Security: restricted --------------------------------------------------------------


async def test_restricted_pod_security_admits_the_rendered_pods(
    helm: Path, kube: KubeClient, tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    ns = f"restricted-{tag}"
    await kube.create("/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                            "pod-security.kubernetes.io/enforce-version":
                                                "latest"}}})
    try:
        objs = render(helm, release=f"psa{tag}", namespace=ns, values=full_values(tag),
                      work=tmp_path)
        for sa in (o for o in objs if o["kind"] == "ServiceAccount"):
            await kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts", sa)
        deployments = [o for o in objs if o["kind"] == "Deployment"]
        assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments} == {
            "virtual-kubelet", "companion", "mock-cloud"}
        (test_pod,) = [o for o in objs if o["kind"] == "Pod"]  # the `helm test` hook
        pods = [(dep["metadata"]["name"], dep["spec"]["template"]) for dep in deployments]
        for name, template in [*pods, (test_pod["metadata"]["name"], test_pod)]:
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"{name}-psa", "namespace": ns,
                                "labels": template["metadata"]["labels"]},
                   "spec": template["spec"]}
            try:
                await kube.request("POST", f"/api/v1/namespaces/{ns}/pods",
                                   params={"dryRun": "All"}, body=pod)
            except APIError as exc:
                raise AssertionError(f"{name}: {exc}") from exc

        # the same pod without its securityContext is refused: the level is enforced here
        bare = yaml.safe_load(yaml.safe_dump(deployments[0]["spec"]["template"]["spec"]))
        for container in bare["containers"]:
            container.pop("securityContext")
        with pytest.raises(APIError, match="PodSecurity"):
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", params={"dryRun": "All"},
                               body={"apiVersion": "v1", "kind": "Pod",
                                     "metadata": {"name": "bare", "namespace": ns},
                                     "spec": bare})
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/namespaces/{ns}")


# -- (d) installed for real: one overflow --------------------------------------------------------


def container_args(dep: Obj, config: Path) -> list[str]:
    """The Deployment's args with --config pointing at the local copy of its settings file."""
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = [a for a in container["args"] if not a.startswith("--config=")]
    assert len(args) == len(container["args"]) - 1, container["args"]
    return [*args, f"--config={config}"]


async def healthz(port: int) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        try:
            return (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code
        except httpx.TransportError:
            return 0


async def helm_test_check(pod: Obj, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The `helm test` pod's container run here: its command with this Python, its args, env."""
    (container,) = pod["spec"]["containers"]
    assert container["command"][0] == "python", container["command"]
    argv = [sys.executable, *container["command"][1:], *container["args"]]
    return await asyncio.to_thread(subprocess.run, argv, env={**os.environ, **env},
                                   capture_output=True, text=True, timeout=120, check=False)


async def test_installed_chart_bursts_an_unschedulable_gpu_pod(
    helm: Path, kube: KubeClient, namespace: str, crds: list[str], local_cluster: LocalCluster,
    cluster_objects: Cluster, tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    release, node = f"e2e{tag}", f"vk-{uuid.uuid4().hex[:8]}"
    fullname = f"{release}-vkprovider"
    objs = render(helm, release=release, namespace=namespace, work=tmp_path, crds=True, values={
        "node": {"name": node, "labels": {"vkprovider.io/pool": namespace}},
        "mockCloud": {"enabled": True}})

    # the CRDs, RBAC and ConfigMap as `helm install` creates them (not the Deployments and
    # Services: their pods run here as local processes instead)
    resources = Resources(kube)
    installed: list[str] = []
    for kind in ("CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                 "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap"):
        for obj in (o for o in objs if o["kind"] == kind):
            await resources.apply(obj, dry_run=False)
            namespaced = obj["metadata"].get("namespace")
            if kind != "CustomResourceDefinition" and namespaced != namespace:
                installed.append(f"{await resources.collection(obj)}/{obj['metadata']['name']}")
    assert any(p.endswith(f"/clusterroles/{fullname}") for p in installed)
    assert any("/namespaces/kube-node-lease/" in p for p in installed)

    cloud = MockCloudProcess(work_dir=tmp_path, name="mock", inventory="H100:us-east:8:2.49")
    processes: list[Component] = []
    try:
        await cloud.start()
        (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
        deps = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o
                for o in objs if o["kind"] == "Deployment"}
        tokens = {name: await service_account_kubeconfig(
            kube=kube, cluster=local_cluster, namespace=namespace, name=name,
            path=tmp_path / f"{name}.kubeconfig") for name in (fullname, f"{fullname}-companion")}

        # the provider: the chart's config.yaml, loopback-only things rewritten
        config = yaml.safe_load(cm["data"]["config.yaml"])
        svc = next(o for o in objs if o["kind"] == "Service"
                   and o["metadata"]["name"] == f"{fullname}-mock-cloud")
        port = svc["spec"]["ports"][0]["port"]
        assert config["providers"] == [{
            "name": "mock", "type": "mock",
            "url": f"http://{fullname}-mock-cloud.{namespace}.svc:{port}"}]
        assert config["leader_election"] == {"enabled": True, "namespace": namespace}
        config["providers"][0]["url"] = cloud.url
        config["kubeconfig"] = str(tokens[fullname])
        config["metrics_port"] = provider_metrics = free_port()
        config["node"].update(kubelet_port=free_port(), internal_ip="127.0.0.1")
        config["kubelet_api"]["client_ca_file"] = str(local_cluster.ca_path)
        provider_config = tmp_path / "config.yaml"
        provider_config.write_text(yaml.safe_dump(config))

        # the companion: the chart's companion.yaml, kubeconfig and port rewritten
        companion = yaml.safe_load(cm["data"]["companion.yaml"])
        assert companion["node_name"] == node
        assert companion["leader_election"] == {"enabled": True, "namespace": namespace}
        companion["kubeconfig"] = str(tokens[f"{fullname}-companion"])
        companion["metrics_port"] = companion_metrics = free_port()
        companion_config = tmp_path / "companion.yaml"
        companion_config.write_text(yaml.safe_dump(companion))

        for name, dep, path in (("provider", deps["virtual-kubelet"], provider_config),
                                ("companion", deps["companion"], companion_config)):
            proc = Component(name=f"chart-{name}",
                             argv=[sys.executable, "-m", "vkprovider",
                                   *container_args(dep, path)],
                             log_path=tmp_path / f"{name}.log")
            proc.start()
            processes.append(proc)

        # both lead in the release namespace (the chart's leader-election Roles) and are healthy
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

        async def holder(lease: str) -> str | None:
            with contextlib.suppress(NotFoundError):
                return (await kube.get(f"{leases}/{lease}"))["spec"].get("holderIdentity")
            return None

        for lease in (f"vkprovider-{node}", f"vkprovider-companion-{node}"):
            await eventually(lambda lease=lease: holder(lease), timeout=60,
                             what=f"Lease {lease} held")
        for port in (provider_metrics, companion_metrics):
            await eventually(lambda port=port: healthz(port),
                             until=lambda code: code == 200, timeout=60,
                             what=f"/healthz on {port}")

        async def gpus() -> int:
            with contextlib.suppress(NotFoundError):
                node_obj = await kube.get(f"/api/v1/nodes/{node}")
                return int(node_obj["status"].get("allocatable", {}).get("nvidia.com/gpu", "0"))
            return 0

        await eventually(gpus, timeout=60, what=f"node {node} with GPUs from the mock cloud")

        # `helm test`: the hook pod's own check, pointed at these processes' ports
        (test_pod,) = [o for o in objs if o["kind"] == "Pod"]
        assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        check_env = {e["name"]: e["value"] for e in test_pod["spec"]["containers"][0]["env"]}
        assert check_env["NODE"] == node
        check_env.update(PROVIDER_URL=f"http://127.0.0.1:{provider_metrics}",
                         COMPANION_URL=f"http://127.0.0.1:{companion_metrics}",
                         TIMEOUT_SECONDS="60")
        passed = await helm_test_check(test_pod, check_env)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert f"ok: the provider leads for {node}" in passed.stdout
        failed = await helm_test_check(test_pod, {**check_env, "NODE": "not-this-node",
                                                  "TIMEOUT_SECONDS": "3"})
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "no provider replica answered as the leader of not-this-node" in failed.stdout

        # one overflow: nothing inside fits (no node of this pool but the virtual one)
        policy = f"chart-{tag}"
        overflow, deployment = burst_objects(namespace=namespace, policy=policy)
        await cluster_objects.create(POLICIES, overflow)
        await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)

        async def burst_pods() -> list[Obj]:
            body = await kube.get(f"/api/v1/namespaces/{namespace}/pods",
                                  params={"labelSelector": "app=burst"})
            return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]

        (pod,) = await eventually(
            burst_pods, until=lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName") == node
            and ps[0]["status"].get("phase") == "Running", timeout=120,
            what=f"the GPU pod Running on {node}")
        annotations = pod["metadata"]["annotations"]
        assert annotations["vkprovider.io/overflow-policy"] == policy
        assert annotations["vkprovider.io/provider"] == "mock"
        events = await kube.get(f"/api/v1/namespaces/{namespace}/events", params={
            "fieldSelector": f"involvedObject.name={pod['metadata']['name']}"})
        assert any(e["reason"] == "OverflowAdmitted" for e in events["items"])
        ledger = await cloud.ledger()
        assert [e["uid"] for e in ledger if e["state"] != "deleted"] == [pod["metadata"]["uid"]]
        for proc in processes:
            assert proc.alive(), proc.tail()
    except BaseException:
        for proc in processes:
            print(f"--- {proc.name} log (tail)\n{proc.tail(60)}")
        raise
    finally:
        for proc in processes:
            proc.stop()
        cloud.stop()
        with contextlib.suppress(APIError):
            await kube.delete(f"/api/v1/nodes/{node}")
        for path in reversed(installed):
            with contextlib.suppress(APIError):
                await kube.delete(path)

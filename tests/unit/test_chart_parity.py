"""The Helm chart and the kustomize install are one install: same objects, same settings.

manifests/base and manifests/mock-cloud are rendered from charts/vkprovider by
tools/helm/render-manifests.sh. These tests render the chart again with `helm template` (helm
built from tools/helm by its build.sh; built here when missing, never skipped) and read the
kustomize files the way `kubectl apply -k` would (resources, components, strategic-merge patches;
any other kustomize feature is refused here rather than silently ignored), then compare every
object in full. A difference means someone edited one side only: edit the chart, run
tools/helm/render-manifests.sh.

They also check what the chart promises besides: its CRDs and dashboard are manifests/'s, its
version is the project's, its alerts are docs/operations.md's verbatim, its settings files load
with the service's own settings models, the release namespace and node name are each set in one
place, and no default provider points at something the install does not create.
"""

from __future__ import annotations

import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from vkprovider.config import CompanionSettings, Settings, load_model

pytestmark = pytest.mark.timeout(900)  # a cold build of helm: ~2.5 min on 2 cores

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vkprovider"
MANIFESTS = REPO / "manifests"
RENDER = "tools/helm/render-manifests.sh"
RELEASE, NAMESPACE = "vkprovider", "vkprovider-system"  # what the script renders base/ with

Obj = dict[str, Any]
Key = tuple[str, str, str]


@cache
def helm() -> Path:
    """The helm binary built from tools/helm (tools/helm/build.sh; warm: prints its folder)."""
    done = subprocess.run(["bash", str(REPO / "tools" / "helm" / "build.sh")],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, f"tools/helm/build.sh failed:\n{done.stderr[-4000:]}"
    path = Path(done.stdout.strip().splitlines()[-1]) / "helm"
    assert path.is_file(), f"tools/helm/build.sh printed {path.parent}, which has no helm"
    return path


def template(*sets: str, release: str = RELEASE, namespace: str = NAMESPACE,
             values: Path | None = None, hooks: bool = False) -> list[Obj]:
    """The release's objects; ``hooks``: also the Helm hooks (objects that exist only during
    `helm uninstall`; manifests/ leaves them out)."""
    argv = [str(helm()), "template", release, str(CHART), "--namespace", namespace]
    if not hooks:
        argv.append("--no-hooks")
    for item in sets:
        argv += ["--set", item]
    if values is not None:
        argv += ["--values", str(values)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def by_key(objs: list[Obj]) -> dict[Key, Obj]:
    out: dict[Key, Obj] = {}
    for obj in objs:
        assert key(obj) not in out, f"{key(obj)} twice"
        out[key(obj)] = obj
    return out


# -- kustomize, the subset manifests/ uses ------------------------------------------------------

_KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "components", "patches"}


def merge(target: Any, patch: Any) -> Any:
    """A strategic-merge patch of mappings and scalars (what render-manifests.sh writes)."""
    if isinstance(target, dict) and isinstance(patch, dict):
        out = dict(target)
        for k, v in patch.items():
            out[k] = merge(target.get(k), v) if k in target else v
        return out
    assert not isinstance(patch, list), "list patches need merge keys; not used in manifests/"
    return patch


def kustomize(folder: Path, *, components: tuple[Path, ...] = ()) -> dict[Key, Obj]:
    """What `kubectl kustomize` builds from ``folder`` (plus ``components``)."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - _KUSTOMIZATION_KEYS
    assert not unknown, f"{folder}/kustomization.yaml uses {unknown}: teach this test about it"
    objs: dict[Key, Obj] = {}
    for entry in spec.get("resources") or []:
        path = folder / entry
        found = (kustomize(path) if path.is_dir() else
                 by_key([o for o in yaml.safe_load_all(path.read_text()) if o]))
        clash = set(found) & set(objs)
        assert not clash, f"{clash} defined twice under {folder}"
        objs.update(found)
    for comp in [*(folder / c for c in spec.get("components") or []), *components]:
        cspec = yaml.safe_load((comp / "kustomization.yaml").read_text())
        assert cspec["kind"] == "Component", f"{comp} is not a kustomize Component"
        unknown = set(cspec) - _KUSTOMIZATION_KEYS
        assert not unknown, f"{comp}/kustomization.yaml uses {unknown}: teach this test about it"
        objs.update(kustomize_resources(comp, cspec.get("resources") or []))
        for entry in cspec.get("patches") or []:
            assert set(entry) == {"path"}, f"{comp}: only `patches: - path:` is understood"
            patch = yaml.safe_load((comp / entry["path"]).read_text())
            target = key(patch)
            assert target in objs, f"{comp}/{entry['path']} patches {target}, which is not there"
            objs[target] = merge(objs[target], patch)
    return objs


def kustomize_resources(folder: Path, entries: list[str]) -> dict[Key, Obj]:
    out: dict[Key, Obj] = {}
    for entry in entries:
        out.update(by_key([o for o in yaml.safe_load_all((folder / entry).read_text()) if o]))
    return out


def service_objects(objs: dict[Key, Obj]) -> dict[Key, Obj]:
    """Everything but the CRDs (the chart's crds/) and the Namespace (Helm's --namespace)."""
    return {k: v for k, v in objs.items()
            if k[0] not in ("CustomResourceDefinition", "Namespace")}


def differences(left: Any, right: Any, where: str = "") -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        out = []
        for k in sorted(set(left) | set(right), key=str):
            if k not in left or k not in right:
                out.append(f"{where}.{k}: only in {'kustomize' if k in left else 'helm'}")
            else:
                out += differences(left[k], right[k], f"{where}.{k}")
        return out
    if left != right:
        return [f"{where}: kustomize {left!r} != helm {right!r}"[:400]]
    return []


def assert_same(kust: dict[Key, Obj], chart: dict[Key, Obj]) -> None:
    assert sorted(kust) == sorted(chart), (
        f"objects differ (run {RENDER}): only in kustomize {sorted(set(kust) - set(chart))}, "
        f"only in the chart {sorted(set(chart) - set(kust))}")
    problems = [p for k in sorted(kust) for p in differences(kust[k], chart[k], "/".join(k))]
    assert not problems, f"run {RENDER}; differences:\n" + "\n".join(problems)


# -- the tests ----------------------------------------------------------------------------------


def test_kustomize_install_is_the_chart_with_default_values() -> None:
    kust = kustomize(MANIFESTS)
    assert_same(service_objects(kust), by_key(template()))
    assert ("Namespace", "", NAMESPACE) in kust
    crds = {k[2] for k in kust if k[0] == "CustomResourceDefinition"}
    assert crds == {"gpuproviders.vkprovider.io", "overflowpolicies.vkprovider.io"}


def test_mock_cloud_component_is_the_chart_with_mock_cloud_enabled() -> None:
    kust = kustomize(MANIFESTS, components=(MANIFESTS / "mock-cloud",))
    assert_same(service_objects(kust), by_key(template("mockCloud.enabled=true")))


def test_every_kind_the_chart_can_render_has_a_namespace_or_none(full_values_file: Path) -> None:
    """Helm's release namespace is the one place: nothing namespaced lands elsewhere, except the
    node heartbeat's Role and RoleBinding, which live in kube-node-lease by design."""
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "GPUProvider"}
    for obj in template(values=full_values_file, release="r1", namespace="ns1"):
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert ns is None, key(obj)
        elif obj["metadata"]["name"].endswith("-node-lease"):
            assert ns == "kube-node-lease", key(obj)
        else:
            assert ns == "ns1", key(obj)


@pytest.fixture(scope="module")
def full_values_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every optional part on, one provider with a key Secret, one GPUProvider."""
    path = tmp_path_factory.mktemp("chart") / "values-full.yaml"
    path.write_text(yaml.safe_dump(full_values()))
    return path


def full_values() -> Obj:
    return {
        "node": {"name": "vk-full", "taintValue": "full", "labels": {"team": "a"}},
        "mockCloud": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
        "providers": [{"name": "my-runpod", "type": "runpod", "url": "https://api.runpod.io",
                       "apiKeySecret": {"name": "runpod-credentials"},
                       "options": {"cloud": "SECURE"}}],
        "gpuProviders": [{"name": "vastai-full", "type": "vastai",
                          "credentialsSecret": {"name": "vastai-credentials"},
                          "gpuTypes": {"H100": "H100_SXM"}, "maxGPUs": 4}],
        "provider": {"settings": {"pods": {"workers": 20}}},
        "companion": {"settings": {"api_server_timeout_seconds": 30}},
    }


def test_release_name_namespace_and_node_name_are_each_one_value(full_values_file: Path,
                                                                tmp_path: Path) -> None:
    objs = template(values=full_values_file, release="acme", namespace="acme-burst")
    text = yaml.safe_dump_all(objs)
    assert "vkprovider-system" not in text, "a namespace not taken from the release"
    assert "vk-gpu-burst" not in text, "a node name not taken from node.name"
    for obj in objs:
        if obj["kind"] not in ("GPUProvider",):
            assert obj["metadata"]["name"].startswith("acme-vkprovider"), key(obj)
        for subject in obj.get("subjects") or []:
            assert subject["namespace"] == "acme-burst"
            assert subject["name"] in ("acme-vkprovider", "acme-vkprovider-companion")
    provider, companion = settings_files(objs, tmp_path)
    assert provider.node.name == "vk-full" and companion.node_names() == ["vk-full"]
    assert provider.leader_election.namespace == "acme-burst"
    assert companion.leader_election.namespace == "acme-burst"
    assert provider.node.taint_value == "full" and provider.node.labels == {"team": "a"}


def settings_files(objs: list[Obj], folder: Path) -> tuple[Settings, CompanionSettings]:
    """The ConfigMap's two files, loaded by the service's own loaders (unknown keys fail)."""
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and "config.yaml" in o["data"]]
    (folder / "config.yaml").write_text(cm["data"]["config.yaml"])
    (folder / "companion.yaml").write_text(cm["data"]["companion.yaml"])
    return (load_model(Settings, folder / "config.yaml"),
            load_model(CompanionSettings, folder / "companion.yaml"))


def deployment(objs: list[Obj], component: str) -> Obj:
    (found,) = [o for o in objs if o["kind"] == "Deployment"
                and o["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return found


def test_settings_files_load_and_say_what_the_values_say(full_values_file: Path,
                                                         tmp_path: Path) -> None:
    default = template()
    provider, companion = settings_files(default, tmp_path)
    assert provider.providers == (), "no default provider pointing at something not deployed"
    assert provider.gpu_providers.enabled and provider.leader_election.enabled
    assert provider.kubelet_api.client_ca_file == "/etc/vkprovider/cluster-ca/ca.crt"
    assert companion.leader_election.enabled and companion.metrics_port == 9465
    assert companion.node_names() == [provider.node.name] == ["vk-gpu-burst"]

    full = template(values=full_values_file)
    provider, companion = settings_files(full, tmp_path)
    mock, runpod = provider.providers
    svc = next(o for o in full if o["kind"] == "Service" and o["metadata"]["name"].endswith(
        "-mock-cloud"))
    assert mock.url == (f"http://{svc['metadata']['name']}.{NAMESPACE}.svc:"
                        f"{svc['spec']['ports'][0]['port']}"), "the mock entry names its Service"
    assert runpod.api_key_env == "VKP_API_KEY_MY_RUNPOD"
    env = deployment(full, "virtual-kubelet")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "VKP_API_KEY_MY_RUNPOD", "valueFrom": {"secretKeyRef": {
        "name": "runpod-credentials", "key": "apiKey"}}} in env
    assert provider.pods.workers == 20 and companion.api_server_timeout_seconds == 30
    (gpup,) = [o for o in full if o["kind"] == "GPUProvider"]
    assert gpup["spec"]["credentialsSecret"] == {"name": "vastai-credentials",
                                                 "namespace": NAMESPACE}


def test_deployments_run_the_settings_files_of_their_configmap() -> None:
    objs = template()
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    for component, command, file in (("virtual-kubelet", "run", "config.yaml"),
                                     ("companion", "descheduler", "companion.yaml")):
        pod = deployment(objs, component)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = container["args"]
        assert command in args and f"--config=/etc/vkprovider/{file}" in args
        mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
        assert mount == {"name": "config", "mountPath": f"/etc/vkprovider/{file}",
                         "subPath": file}
        volume = next(v for v in pod["volumes"] if v["name"] == "config")
        assert volume["configMap"]["name"] == cm["metadata"]["name"]
        assert pod["topologySpreadConstraints"] == [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": deployment(objs, component)["spec"]["selector"][
                "matchLabels"]}}]


def test_probes_never_make_a_healthy_standby_unready() -> None:
    """Both processes answer /healthz on a standby too (service.py, descheduler/service.py), so
    both are probed and a rollout replaces one pod at a time without a surge."""
    objs = template()
    provider = deployment(objs, "virtual-kubelet")
    assert provider["spec"]["replicas"] == 2 and provider["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    (container,) = provider["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    off = deployment(template("provider.probes=false"), "virtual-kubelet")
    (container,) = off["spec"]["template"]["spec"]["containers"]
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(container)
    companion = deployment(objs, "companion")
    (container,) = companion["spec"]["template"]["spec"]["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}

    single = deployment(template("provider.replicas=1"), "virtual-kubelet")
    (container,) = single["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    pdbs = [o for o in template("provider.replicas=1") if o["kind"] == "PodDisruptionBudget"]
    assert [p["metadata"]["name"] for p in pdbs] == ["vkprovider-companion"], (
        "minAvailable 1 over a single replica would block every drain")


def test_pod_disruption_budgets_select_their_deployments() -> None:
    objs = template()
    pdbs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodDisruptionBudget"}
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        pdb = pdbs[dep["metadata"]["name"]]
        assert pdb["spec"]["minAvailable"] == 1
        assert pdb["spec"]["selector"] == dep["spec"]["selector"]


def test_chart_crds_and_dashboard_are_copies_of_manifests() -> None:
    crds = sorted(p.name for p in (MANIFESTS / "crds").glob("*.yaml")
                  if p.name != "kustomization.yaml")
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == crds
    for name in crds:
        assert (CHART / "crds" / name).read_bytes() == (MANIFESTS / "crds" / name).read_bytes(), (
            f"charts/vkprovider/crds/{name} differs from manifests/crds/{name}: run {RENDER}")
    dashboard = (MANIFESTS / "dashboards" / "vkprovider.json").read_bytes()
    assert (CHART / "dashboards" / "vkprovider.json").read_bytes() == dashboard, (
        f"charts/vkprovider/dashboards/vkprovider.json is stale: run {RENDER}")
    (cm,) = [o for o in template("dashboard.enabled=true")
             if o["kind"] == "ConfigMap" and "vkprovider.json" in o["data"]]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["vkprovider.json"] == dashboard.decode().rstrip("\n")


def test_chart_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    for dep in (o for o in template() if o["kind"] == "Deployment"):
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"ghcr.io/vkprovider/vkprovider:{version}"


def documented_rule() -> Obj:
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("## What to alert on", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    rule = yaml.safe_load(block)
    assert rule["kind"] == "PrometheusRule"
    return dict(rule)


def test_prometheus_rule_is_the_documented_one() -> None:
    (rule,) = [o for o in template("prometheusRule.enabled=true") if o["kind"] == "PrometheusRule"]
    assert rule["spec"] == documented_rule()["spec"], (
        "charts/vkprovider/templates/prometheusrule.yaml and docs/operations.md "
        "('What to alert on') differ")
    monitors = [o for o in template("serviceMonitor.enabled=true")
                if o["kind"] == "ServiceMonitor"]
    provider = next(m for m in monitors if m["metadata"]["name"] == "vkprovider")
    assert provider["spec"]["jobLabel"] == "app.kubernetes.io/name", (
        'the alerts read up{job="vkprovider"}')
    services = {o["metadata"]["name"]: o for o in template() if o["kind"] == "Service"}
    assert services["vkprovider"]["metadata"]["labels"]["app.kubernetes.io/name"] == "vkprovider"
    for monitor in monitors:
        selected = [s for s in services.values() if all(
            s["metadata"]["labels"].get(k) == v
            for k, v in monitor["spec"]["selector"]["matchLabels"].items())]
        assert len(selected) == 1, monitor["metadata"]["name"]
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_optional_parts_are_off_by_default() -> None:
    kinds = {o["kind"] for o in template()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "GPUProvider"}
    names = {o["metadata"]["name"] for o in template()}
    assert not any("mock-cloud" in n or "dashboard" in n for n in names)


def test_uninstall_runs_decommission_first_with_the_release_config(full_values_file: Path,
                                                                 tmp_path: Path) -> None:
    """The pre-delete hook Job runs `vkprovider decommission` on the provider's config.yaml
    (same node, same accounts and their key env), as its own ServiceAccount; its RBAC is bound
    to that account; every hook object is a pre-delete hook deleted once it succeeded; and
    decommissionOnUninstall: false renders none of it."""
    objs = template(values=full_values_file, release="acme", namespace="acme-burst", hooks=True)
    hooks = [o for o in objs if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]
    assert {o["kind"] for o in hooks} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                          "Role", "RoleBinding", "Job"}
    for obj in hooks:
        ann = obj["metadata"]["annotations"]
        assert ann["helm.sh/hook"] == "pre-delete", key(obj)
        assert set(ann["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation",
                                                                     "hook-succeeded"}
        assert obj["metadata"]["name"] == "acme-vkprovider-decommission", key(obj)
        # RBAC and the account first, the Job last
        assert int(ann["helm.sh/hook-weight"]) < 0 or obj["kind"] == "Job", key(obj)
        for subject in obj.get("subjects") or []:
            assert subject == {"kind": "ServiceAccount", "name": "acme-vkprovider-decommission",
                               "namespace": "acme-burst"}
    (job,) = [o for o in hooks if o["kind"] == "Job"]
    assert job["metadata"]["namespace"] == "acme-burst"
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "acme-vkprovider-decommission"
    (container,) = spec["containers"]
    args = container["args"]
    assert args[args.index("decommission") + 1:] == ["--config=/etc/vkprovider/config.yaml",
                                                     "--timeout=240"]
    timeout = 240
    assert job["spec"]["activeDeadlineSeconds"] > timeout
    # the provider's own config.yaml, from the release's ConfigMap, and the same key env
    provider = deployment(objs, "virtual-kubelet")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config = volumes[mounts["/etc/vkprovider/config.yaml"]["name"]]["configMap"]["name"]
    assert config == "acme-vkprovider"
    key_env = {e["name"]: e for e in provider["containers"][0]["env"] if "secretKeyRef" in str(e)}
    assert key_env and all(e in container["env"] for e in key_env.values())
    (provider_settings, _) = settings_files(objs, tmp_path)
    assert provider_settings.node.name == "vk-full"
    # the marker Lease lives in the namespace the provider reads it from
    (role,) = [o for o in hooks if o["kind"] == "Role"]
    assert role["metadata"]["namespace"] == provider_settings.leader_election.namespace
    off = template("decommissionOnUninstall=false", hooks=True)
    assert not [o for o in off if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]

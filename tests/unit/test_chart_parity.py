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
place, no default provider points at something the install does not create, the values table of
docs/install.md is values.yaml's, the support matrix there is Chart.yaml's (and what is tested),
and the values an umbrella chart or a GitOps setup needs (global, image digest, ServiceAccount,
pod labels, security contexts, extra volumes, NetworkPolicy, serving certificate, helm test)
render as documented.
"""

from __future__ import annotations

import json
import re
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


def installed(objs: list[Obj]) -> list[Obj]:
    """What an install creates: not Helm's hooks (the `helm test` pod), which kustomize lacks."""
    return [o for o in objs if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]


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
    assert_same(service_objects(kust), by_key(installed(template())))
    assert ("Namespace", "", NAMESPACE) in kust
    crds = {k[2] for k in kust if k[0] == "CustomResourceDefinition"}
    assert crds == {"gpuproviders.vkprovider.io", "overflowpolicies.vkprovider.io"}


def test_mock_cloud_component_is_the_chart_with_mock_cloud_enabled() -> None:
    kust = kustomize(MANIFESTS, components=(MANIFESTS / "mock-cloud",))
    assert_same(service_objects(kust), by_key(installed(template("mockCloud.enabled=true"))))


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
        "networkPolicy": {"enabled": True, "egress": [{}]},
        "kubeletAPI": {"tls": {"secretName": "vk-full-serving"}},
        "providers": [{"name": "my-runpod", "type": "runpod", "url": "https://api.runpod.io",
                       "apiKeySecret": {"name": "runpod-credentials"},
                       "options": {"cloud": "SECURE"}}],
        "gpuProviders": [{"name": "vastai-full", "type": "vastai",
                          "credentialsSecret": {"name": "vastai-credentials"},
                          "gpuTypes": {"H100": "H100_SXM"}, "maxGPUs": 4}],
        "provider": {"settings": {"pods": {"workers": 20}}},
        "companion": {"settings": {"api_server_timeout_seconds": 30}},
        "policyLabels": {"example.com/burst-install": "full"},
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
    assert provider.pods.policy_labels == companion.policy_labels == {}  # every policy

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
    # one value, both halves: the install's policies are the same for its gate and its companion
    assert provider.pods.policy_labels == companion.policy_labels == {
        "example.com/burst-install": "full"}
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
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "GPUProvider", "NetworkPolicy"}
    names = {o["metadata"]["name"] for o in template()}
    assert not any("mock-cloud" in n or "dashboard" in n for n in names)


# -- monitoring: every replica scraped, every release told apart, the rule on its own ---------


def test_service_monitors_label_every_series_with_the_virtual_node() -> None:
    """Several releases share the job "vkprovider": the label virtual_node (node.name) tells them
    apart, on both processes' series; the leader gauge's own copy is not kept twice."""
    monitors = [o for o in template("serviceMonitor.enabled=true", "node.name=vk-eu")
                if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert {"targetLabel": "virtual_node", "replacement": "vk-eu"} in endpoint["relabelings"]
        assert {"action": "labeldrop", "regex": "exported_virtual_node"} in endpoint[
            "metricRelabelings"]


def test_prometheus_rule_needs_no_service_monitor_and_selects_its_node() -> None:
    objs = template("prometheusRule.enabled=true", "node.name=vk-eu")
    assert not [o for o in objs if o["kind"] == "ServiceMonitor"]
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    down = alerts["VKProviderDown"]["expr"]
    assert down == 'absent(vkprovider_leader{virtual_node="vk-eu"} == 1)'
    for name, alert in alerts.items():
        # every selector of the release's series names its node, never another release's
        found = re.findall(r'(?:virtual_node|\bnode)="([^"]*)"', alert["expr"])
        assert found and set(found) == {"vk-eu"}, (name, alert["expr"])
        assert "vk-gpu-burst" not in yaml.safe_dump(alert), name


# -- the values table of docs/install.md is values.yaml's --------------------------------------


def _leaves(values: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths of values.yaml: mappings are walked, anything else (lists, scalars, empty
    mappings) is a leaf."""
    if isinstance(values, dict) and values:
        out: dict[str, Any] = {}
        for k, v in values.items():
            out.update(_leaves(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): values}


def _documented_values() -> dict[str, str]:
    """value path -> its default cell, from the table under "### Values" in docs/install.md.
    A cell `a.b`, `.c` names a.b and a.c."""
    text = (REPO / "docs" / "install.md").read_text()
    section = text.split("\n### Values\n", 1)[1].split("\n#", 1)[0]
    out: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        parent = names[0].rsplit(".", 1)[0] if "." in names[0] else ""
        for name in names:
            path = f"{parent}{name}" if name.startswith(".") else name
            assert path not in out, f"docs/install.md documents {path} twice"
            out[path] = cells[1]
    assert out, "no values table under ### Values in docs/install.md"
    return out


def test_values_table_documents_every_value_with_its_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves = _leaves(values)
    documented = _documented_values()
    unknown = sorted(d for d in documented
                     if not any(p == d or p.startswith(d + ".") for p in leaves))
    assert not unknown, f"docs/install.md documents values values.yaml lacks: {unknown}"
    missing = sorted(p for p in leaves
                     if not any(p == d or p.startswith(d + ".") for d in documented))
    assert not missing, f"values.yaml has values docs/install.md does not document: {missing}"
    wrong = []
    for path, cell in documented.items():
        literal = re.fullmatch(r"`([^`]*)`", cell)
        if literal is None:
            continue  # prose (e.g. "requests 200m / 256Mi, limit 1Gi"): not a literal default
        default: Any = values
        for part in path.split("."):
            default = default[part]
        if yaml.safe_load(literal.group(1) or '""') != default:
            wrong.append(f"{path}: docs say {cell}, values.yaml has {default!r}")
    assert not wrong, "\n".join(wrong)


def test_values_schema_knows_every_value_and_accepts_global() -> None:
    """A key values.yaml has but the schema lacks is refused (additionalProperties: false)."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def known(path: str) -> bool:
        node = schema
        for part in path.split("."):
            props = node.get("properties")
            if props is None:
                return (node.get("type") == "object"
                        and node.get("additionalProperties") is not False)
            if part not in props:
                return False
            node = props[part]
        return True

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not [p for p in _leaves(values) if not known(p)]
    assert "global" in schema["properties"] and schema["additionalProperties"] is False
    objs = template("global.imageRegistry=example.com", "global.anything.nested=1")
    assert {o["kind"] for o in objs} >= {"Deployment", "ConfigMap"}


# -- the support matrix -----------------------------------------------------------------------


def _matrix() -> dict[str, tuple[str, str]]:
    """component -> (supported, tested) from "## Supported versions" in docs/install.md."""
    text = (REPO / "docs" / "install.md").read_text()
    section = text.split("\n## Supported versions\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[1].startswith("`"):
            out[cells[0].split()[0].lower()] = (cells[1].strip("`"), cells[2].strip("`"))
    return out


def test_support_matrix_is_the_charts_and_what_is_tested() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    notes = chart["annotations"]
    matrix = _matrix()
    assert set(matrix) == {"kubernetes", "kueue", "python"}, matrix
    for component, (supported, tested) in matrix.items():
        assert notes[f"vkprovider.io/{component}-versions"] == supported, component
        assert notes[f"vkprovider.io/{component}-tested"] == tested, component
    floor = re.fullmatch(r">=(\d+)\.(\d+)", matrix["kubernetes"][0])
    assert floor and chart["kubeVersion"] == f">={floor[1]}.{floor[2]}.0-0", chart["kubeVersion"]

    # tested: the versions the repository's tests build and run
    k8s = re.search(r"^K8S=(v[\d.]+)$", (REPO / "tools" / "controlplane" / "build.sh").read_text(),
                    re.M)
    assert k8s and matrix["kubernetes"][1] == k8s[1]
    kueue = re.search(r"sigs\.k8s\.io/kueue (v[\d.]+)", (REPO / "tools" / "kueue" / "go.mod")
                      .read_text())
    assert kueue and matrix["kueue"][1] == kueue[1]
    image = re.search(r"python:(\d+\.\d+)", (REPO / "Dockerfile").read_text())
    assert image and matrix["python"][1] == image[1]
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert matrix["python"][0] == requires

    # supported: no lower than what the code needs
    def version(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", text)[:2])

    crds = "".join(p.read_text() for p in (MANIFESTS / "crds").glob("*.yaml"))
    if re.search(r"^\s+(reason|fieldPath): ", crds, re.M):  # CEL rule fields of 1.28
        assert version(matrix["kubernetes"][0]) >= (1, 28)
    companion = "".join(p.read_text() for p in (REPO / "vkprovider" / "descheduler").glob("*.py"))
    if "kueue.x-k8s.io/v1beta2" in companion:  # Kueue's v1beta2 API: v0.15 and later
        assert version(matrix["kueue"][0]) >= (0, 15)


# -- values for umbrella charts and GitOps ----------------------------------------------------


def pod_spec(objs: list[Obj], component: str) -> Obj:
    spec: Obj = deployment(objs, component)["spec"]["template"]["spec"]
    return spec


def test_image_digest_service_account_labels_and_security_contexts(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({
        "image": {"digest": digest},
        "serviceAccount": {"name": "burst", "annotations": {"iam.example.com/role": "r"}},
        "podLabels": {"team": "gpu", "app.kubernetes.io/component": "not-mine"},
        "podSecurityContext": {"fsGroup": 65532},
        "securityContext": {"readOnlyRootFilesystem": None, "runAsUser": 1000},
        "mockCloud": {"enabled": True},
        "provider": {"extraVolumes": [{"name": "keys", "secret": {"secretName": "k"}}],
                     "extraVolumeMounts": [{"name": "keys", "mountPath": "/keys"}]},
        "companion": {"extraVolumes": [{"name": "c", "emptyDir": {}}],
                      "extraVolumeMounts": [{"name": "c", "mountPath": "/c"}]},
    }))
    objs = template(values=values)
    accounts = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceAccount"}
    assert set(accounts) == {"burst", "burst-companion"}
    for account in accounts.values():
        assert account["metadata"]["annotations"] == {"iam.example.com/role": "r"}
    subjects = {s["name"] for o in objs for s in o.get("subjects") or []}
    assert subjects == {"burst", "burst-companion"}
    for component, account in (("virtual-kubelet", "burst"), ("companion", "burst-companion"),
                               ("mock-cloud", None)):
        dep = deployment(objs, component)
        spec = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert labels["team"] == "gpu" and labels["app.kubernetes.io/component"] == component
        assert spec.get("serviceAccountName") == account
        assert spec["securityContext"] == {"fsGroup": 65532}
        for container in spec["containers"]:
            assert container["image"] == f"ghcr.io/vkprovider/vkprovider@{digest}"
            assert container["securityContext"]["runAsUser"] == 1000
            assert "readOnlyRootFilesystem" not in container["securityContext"]
    provider, companion = pod_spec(objs, "virtual-kubelet"), pod_spec(objs, "companion")
    assert {"name": "keys", "secret": {"secretName": "k"}} in provider["volumes"]
    assert {"name": "keys", "mountPath": "/keys"} in provider["containers"][0]["volumeMounts"]
    assert {"name": "c", "emptyDir": {}} in companion["volumes"]
    assert {"name": "c", "mountPath": "/c"} in companion["containers"][0]["volumeMounts"]

    bring_your_own = template("serviceAccount.create=false")
    assert not [o for o in bring_your_own if o["kind"] == "ServiceAccount"]
    assert pod_spec(bring_your_own, "virtual-kubelet")["serviceAccountName"] == "vkprovider"


def test_serving_certificate_comes_from_the_secret(tmp_path: Path) -> None:
    """kubeletAPI.tls.secretName: the Secret mounted as a directory (a renewal reaches the pod;
    a subPath would not), its tls.crt/tls.key set as the files the provider loads and re-reads."""
    objs = template("kubeletAPI.tls.secretName=vk-serving")
    provider, _ = settings_files(objs, tmp_path)
    spec = pod_spec(objs, "virtual-kubelet")
    (volume,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") ==
                 "vk-serving"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert "subPath" not in mount and mount["readOnly"] is True
    assert provider.tls_cert_file == f"{mount['mountPath']}/tls.crt"
    assert provider.tls_key_file == f"{mount['mountPath']}/tls.key"
    default, _ = settings_files(template(), tmp_path)
    assert default.tls_cert_file is None and default.tls_key_file is None


def test_network_policies_open_only_the_ports_each_process_serves(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    monitoring = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}
    apiserver = {"ipBlock": {"cidr": "10.0.0.0/24"}}
    values.write_text(yaml.safe_dump({"networkPolicy": {
        "enabled": True, "metricsFrom": [monitoring], "kubeletAPIFrom": [apiserver]}}))
    objs = template(values=values, hooks=True)  # with the `helm test` pod
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {"vkprovider", "vkprovider-companion"}
    for name, component in (("vkprovider", "virtual-kubelet"),
                            ("vkprovider-companion", "companion")):
        assert policies[name]["podSelector"] == deployment(objs, component)["spec"]["selector"]
        assert policies[name]["policyTypes"] == ["Ingress"], "egress open by default"
    test_pod = next(o for o in objs if o["kind"] == "Pod")
    tester = {"podSelector": {"matchLabels": {
        k: v for k, v in test_pod["metadata"]["labels"].items()
        if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                 "app.kubernetes.io/component")}}}
    kubelet, metrics = policies["vkprovider"]["ingress"]
    assert kubelet == {"ports": [{"protocol": "TCP", "port": 10250}], "from": [apiserver]}
    assert metrics == {"ports": [{"protocol": "TCP", "port": 9464}],
                       "from": [tester, monitoring]}
    (companion,) = policies["vkprovider-companion"]["ingress"]
    assert companion == {"ports": [{"protocol": "TCP", "port": 9465}],
                         "from": [tester, monitoring]}

    egress = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]
    values.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True, "egress": egress}}))
    for policy in (o for o in template(values=values) if o["kind"] == "NetworkPolicy"):
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert policy["spec"]["egress"] == egress


def test_helm_test_pod_checks_the_release_through_its_services() -> None:
    objs = template("node.name=vk-eu", release="acme", namespace="burst", hooks=True)
    (pod,) = [o for o in objs if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    assert container["args"] == [(CHART / "files" / "helm-test.py").read_text()]
    env = {e["name"]: e["value"] for e in container["env"]}
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert env["NODE"] == "vk-eu"
    assert env["PROVIDER_URL"] == "http://acme-vkprovider.burst.svc:9464"
    assert env["COMPANION_URL"] == "http://acme-vkprovider-companion.burst.svc:9465"
    assert {"acme-vkprovider", "acme-vkprovider-companion"} <= set(services)
    assert container["securityContext"] == deployment(objs, "virtual-kubelet")["spec"][
        "template"]["spec"]["containers"][0]["securityContext"]
    assert not [o for o in template("helmTest.enabled=false", hooks=True) if o["kind"] == "Pod"]
    assert not [o for o in template("provider.metricsPort=0", "provider.probes=false", hooks=True)
                if o["kind"] == "Pod"]


def test_uninstall_runs_decommission_first_with_the_release_config(full_values_file: Path,
                                                                 tmp_path: Path) -> None:
    """The pre-delete hook Job runs `vkprovider decommission` on the provider's config.yaml
    (same node, same accounts and their key env), as its own ServiceAccount; its RBAC is bound
    to that account; every hook object is a pre-delete hook deleted once it succeeded; and
    decommissionOnUninstall: false renders none of it."""
    objs = template(values=full_values_file, release="acme", namespace="acme-burst", hooks=True)
    hooks = [o for o in objs  # every hook but the `helm test` pod
             if (o["metadata"].get("annotations") or {}).get("helm.sh/hook") not in (None, "test")]
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
    assert not [o for o in off if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")
                == "pre-delete"]

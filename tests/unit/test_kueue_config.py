"""Kueue's webhook and CRD config pointed at loopback (vkprovider.testing.kueue), without a cluster.

The shapes below are cut from sigs.k8s.io/kueue v0.17.0's config/components (manifests.yaml, the
webhook kustomization's namespaceSelector patch, a CRD conversion patch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vkprovider.testing.kueue import configuration, loopback_crds, loopback_webhooks


def hook(name: str, group: str, resource: str, path: str) -> dict[str, Any]:
    return {"admissionReviewVersions": ["v1"], "name": name, "failurePolicy": "Fail",
            "sideEffects": "None",
            "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                         "path": path}},
            "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": [resource]}]}


MANIFESTS = [{
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": "mutating-webhook-configuration"},
    "webhooks": [
        hook("mclusterqueue.kb.io", "kueue.x-k8s.io", "clusterqueues",
             "/mutate-kueue-x-k8s-io-v1beta2-clusterqueue"),
        hook("mjob.kb.io", "batch", "jobs", "/mutate-batch-v1-job"),
        hook("mpod.kb.io", "", "pods", "/mutate--v1-pod"),
        hook("mdeployment.kb.io", "apps", "deployments", "/mutate-apps-v1-deployment"),
        hook("mmpijob.kb.io", "kubeflow.org", "mpijobs", "/mutate-kubeflow-org-v2beta1-mpijob"),
    ]}]

KUSTOMIZATION = {"patches": [{"patch": """\
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- name: mpod.kb.io
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: [kube-system, kueue-system]
"""}]}


def names(confs: list[dict[str, Any]]) -> list[str]:
    return [h["name"] for c in confs for h in c["webhooks"]]


def test_only_kueue_api_and_enabled_frameworks_get_webhooks_on_loopback() -> None:
    confs = loopback_webhooks(manifests=MANIFESTS, kustomization=KUSTOMIZATION,
                              url="https://127.0.0.1:9443", ca_bundle="Q0E=")
    assert [c["metadata"]["name"] for c in confs] == ["kueue-mutating-webhook-configuration"]
    assert names(confs) == ["mclusterqueue.kb.io", "mjob.kb.io"]
    job = confs[0]["webhooks"][1]
    assert job["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-batch-v1-job",
                                   "caBundle": "Q0E="}
    assert MANIFESTS[0]["webhooks"][1]["clientConfig"]["service"]["path"]  # input untouched


def test_framework_names_follow_kueue_and_pod_keeps_its_namespace_selector() -> None:
    confs = loopback_webhooks(manifests=MANIFESTS, kustomization=KUSTOMIZATION,
                              url="https://127.0.0.1:1", ca_bundle="x",
                              frameworks=("pod", "deployment", "kubeflow.org/mpijob"),
                              namespace="kq")
    assert names(confs) == ["mclusterqueue.kb.io", "mpod.kb.io", "mdeployment.kb.io",
                            "mmpijob.kb.io"]
    pod = confs[0]["webhooks"][1]
    expr = pod["namespaceSelector"]["matchExpressions"][0]
    assert expr["values"] == ["kube-system", "kq"]
    assert "namespaceSelector" not in confs[0]["webhooks"][2]


def test_crds_get_the_active_conversion_patches_on_loopback(tmp_path: Path) -> None:
    (tmp_path / "bases").mkdir()
    (tmp_path / "patches").mkdir()
    for plural in ("clusterqueues", "resourceflavors"):
        (tmp_path / "bases" / f"{plural}.yaml").write_text(yaml.safe_dump({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"}, "spec": {"group": "kueue"}}))
        (tmp_path / "patches" / f"webhook_in_{plural}.yaml").write_text(yaml.safe_dump({
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"}, "spec": {"conversion": {
                "strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                             "path": "/convert"}}}}}}))
    (tmp_path / "kustomization.yaml").write_text("""\
resources:
- bases/clusterqueues.yaml
- bases/resourceflavors.yaml
patches:
- path: patches/webhook_in_clusterqueues.yaml
#- path: patches/webhook_in_resourceflavors.yaml
""")
    crds = {c["metadata"]["name"]: c for c in loopback_crds(
        crd_dir=tmp_path, url="https://127.0.0.1:7", ca_bundle="Y")}
    conversion = crds["clusterqueues.kueue.x-k8s.io"]["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["clientConfig"] == {"url": "https://127.0.0.1:7/convert",
                                                     "caBundle": "Y"}
    assert "conversion" not in crds["resourceflavors.kueue.x-k8s.io"]["spec"]


def test_configuration_serves_on_loopback_with_our_certs_and_no_internal_certs() -> None:
    cfg = configuration(namespace="kueue-system", webhook_port=9443, health_port=8081,
                        cert_dir=Path("/w/certs"), frameworks=("batch/job",))
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": "/w/certs"}
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:8081"}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["metrics"] == {"bindAddress": "0"}
    assert cfg["featureGates"] == {"VisibilityOnDemand": False}
    assert cfg["integrations"] == {"frameworks": ["batch/job"]}

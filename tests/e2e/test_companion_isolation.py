"""One failing object never starves the others (issue 36).

A ValidatingAdmissionPolicy refuses the companion's writes to one Deployment, and only the
companion's (its ServiceAccount): a real API error on one object, nothing faked. Two Deployments
carry pre-warm intents for Workloads that are gone, the refused one first in the companion's
order; the companion must
undo the other's surge although every attempt on the first fails (pre-warm backs that one off).
On 48cf15e the first error aborted the whole pass, every pass, and the second was never undone.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.testing.waiting import eventually

from .conftest import System

pytestmark = pytest.mark.cluster
INTENT = LABEL = "vkprovider.io/prewarm"
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
COMPANION = "system:serviceaccount:vkprovider-system:vkprovider-companion"


def deployment(name: str, *, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "server:1"}]}}}}


def surged_for_a_gone_workload(name: str, tag: str) -> dict[str, Any]:
    """The patch that leaves a Deployment as a pre-warm of 1 -> 2 for a Workload now gone."""
    intent = {"workload": f"gone/{name}", "workload_uid": f"gone-{tag}-{name}",
              "check": f"prewarm-{tag}", "replicas": 1, "surge": 1, "phase": "Surging",
              "started": time.time(), "policy": f"none-{tag}", "victims": []}
    return {"metadata": {"labels": {LABEL: "true"}, "annotations": {INTENT: json.dumps(intent)}},
            "spec": {"replicas": 2}}


async def test_a_deployment_whose_writes_fail_does_not_stop_the_others_being_restored(
    kube: KubeClient, namespace: str, system: System, companion_kubeconfig: Path,
    crds: list[str],
) -> None:
    tag = uuid.uuid4().hex[:6]
    deps = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    await kube.create(deps, deployment("blocked", labels={"testdeny": tag}))
    await kube.create(deps, deployment("other", labels={}))
    name = f"deny-companion-{tag}"
    await kube.create(VAP, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                     "resources": ["deployments", "deployments/scale"]}]},
                 "matchConditions": [{"name": "the-companion",
                                      "expression": f"request.userInfo.username == '{COMPANION}'"}],
                 "validations": [{
                     "expression": "!has(oldObject.metadata.labels) || !('testdeny' in "
                                   "oldObject.metadata.labels) || "
                                   f"oldObject.metadata.labels['testdeny'] != '{tag}'",
                     "message": "the companion's writes to this Deployment are refused (test)"}]}})
    await kube.create(BINDINGS, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": namespace}}}}})
    companion = KubeClient.from_kubeconfig(kubeconfig=str(companion_kubeconfig))
    try:
        async def refused() -> str:
            try:
                await companion.patch(f"{deps}/blocked", {"metadata": {"annotations": {
                    "probe": str(time.time())}}})
            except APIError as exc:
                return str(exc)
            return ""

        await eventually(refused, until=lambda err: "refused (test)" in err, timeout=30,
                         interval=0.3, what="the companion's writes to 'blocked' denied")
        # a pass meets the blocked Deployment first (lists come sorted by name)
        await kube.patch(f"{deps}/blocked", surged_for_a_gone_workload("blocked", tag))
        await kube.patch(f"{deps}/other", surged_for_a_gone_workload("other", tag))
        await system.start(clouds=1)
        system.start_companion(kubeconfig=companion_kubeconfig)
        other = await eventually(lambda: kube.get(f"{deps}/other"), timeout=90, interval=0.3,
                                until=lambda d: INTENT not in (d["metadata"].get("annotations")
                                                               or {}),
                                what="the other Deployment's surge undone")
        assert other["spec"]["replicas"] == 1
        assert LABEL not in (other["metadata"].get("labels") or {})
        stuck = await kube.get(f"{deps}/blocked")
        assert INTENT in (stuck["metadata"].get("annotations") or {}), "its writes are refused"
        assert stuck["spec"]["replicas"] == 2
        assert system.companion is not None
        assert "backing this Workload off" in system.companion.log_text()
    finally:
        await companion.aclose()
        for path in (f"{BINDINGS}/{name}", f"{VAP}/{name}"):
            with contextlib.suppress(APIError):
                await kube.delete(path)

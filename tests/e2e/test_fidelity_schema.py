"""The pod-fidelity table against the real API server: every field has a decision, and it holds.

* The OpenAPI v3 schema the local kube-apiserver (1.37) serves for core/v1 is walked: a property
  of PodSpec, Container, their security contexts, ResourceRequirements or Probe without an entry
  in vkprovider.node.fidelity fails, and so does an entry naming a property the schema lacks (a
  field renamed or removed upstream).
* A pod as the API server stores it (defaults and admission applied) gets no warning: the
  table's "quiet" values are the API server's real defaults.
* A pod with dropped fields runs on the mock cloud and gets one FieldsDropped Warning naming them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.kube.errors import APIError
from vkprovider.node import fidelity, fieldcheck
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, events_for, node_ready, pod_spec

pytestmark = pytest.mark.cluster

_PREFIX = "io.k8s.api.core.v1."


def _decoded(body: dict[str, Any]) -> dict[str, Any]:
    """The client hands a non-JSON content type back as text: decode it."""
    if set(body) == {"text"}:
        decoded = json.loads(body["text"])
        assert isinstance(decoded, dict)
        return decoded
    return body


async def core_v1_schemas(kube: KubeClient) -> dict[str, dict[str, Any]]:
    """The component schemas of the API server's OpenAPI v3 document for api/v1."""
    index = _decoded(await kube.get("/openapi/v3"))
    url = index["paths"]["api/v1"]["serverRelativeURL"]
    path, _, query = url.partition("?")
    params = dict(p.split("=", 1) for p in query.split("&")) if query else None
    document = _decoded(await kube.get(path, params=params))
    schemas: dict[str, dict[str, Any]] = document["components"]["schemas"]
    return schemas


async def test_every_pod_and_container_property_has_a_decision_and_every_entry_exists(
    kube: KubeClient,
) -> None:
    version = await kube.get("/version")
    assert version["minor"].rstrip("+") == "37", "the table is written for Kubernetes 1.37"
    schemas = await core_v1_schemas(kube)
    covered = fidelity.coverage()

    missing: list[str] = []
    for name in fidelity.COMPLETE_SCHEMAS:
        properties = set(schemas[_PREFIX + name]["properties"])
        missing += [f"{name}.{p}" for p in sorted(properties - covered.get(name, set()))]
    assert not missing, f"fields without a decision in vkprovider/node/fidelity.py: {missing}"

    unknown: list[str] = []
    for name, props in covered.items():
        properties = set(schemas[_PREFIX + name]["properties"])
        unknown += [f"{name}.{p}" for p in sorted(props - properties)]
    assert not unknown, f"the table names fields the API server does not have: {unknown}"
    assert set(fidelity.COMPLETE_SCHEMAS) >= {"PodSpec", "Container", "PodSecurityContext",
                                              "SecurityContext"}


async def test_a_pod_with_only_the_api_servers_defaults_gets_no_warning(
    kube: KubeClient, namespace: str,
) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
            "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6",
                                     "ports": [{"name": "http", "containerPort": 8000}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1",
                                                              "cpu": "4", "memory": "16Gi"}}}]}}

    async def admitted() -> dict[str, Any] | None:
        try:  # dry run: defaults and admission (the service-account token volume), not stored
            return await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods",
                                      params={"dryRun": "All"}, body=body)
        except APIError:
            return None  # the namespace's default ServiceAccount does not exist yet

    pod = await eventually(admitted, until=lambda p: p is not None, timeout=30,
                           what="the pod admitted (dry run)")
    assert pod is not None
    spec = pod["spec"]
    # what the API server filled in, which the table must not warn about
    assert spec["restartPolicy"] == "Always" and spec["dnsPolicy"] == "ClusterFirst"
    assert spec["enableServiceLinks"] is True and spec["terminationGracePeriodSeconds"] == 30
    assert spec["volumes"][0]["name"].startswith("kube-api-access-")
    container = spec["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["imagePullPolicy"] == "IfNotPresent"
    for clouds in (("mock",), ("vastai",), ("salad",), ("mock", "vastai", "salad")):
        assert fieldcheck.dropped_fields(pod, clouds=clouds) == (), clouds


async def test_a_pod_with_dropped_fields_runs_and_gets_one_fields_dropped_warning(
    kube: KubeClient, namespace: str, system: System,
) -> None:
    await system.start()
    await node_ready(kube, system.node_name)
    spec = pod_spec(system.node_name, container={
        "workingDir": "/srv", "securityContext": {"runAsUser": 1000, "runAsNonRoot": True}})
    spec["hostAliases"] = [{"ip": "10.0.0.1", "hostnames": ["db"]}]
    await create_pod(kube, namespace, "dropped", spec)
    await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/dropped"),
                     until=lambda p: p.get("status", {}).get("phase") == "Running",
                     timeout=60, what="the pod Running")
    events = await eventually(
        lambda: events_for(kube, namespace, "dropped"),
        until=lambda ev: any(e["reason"] == "FieldsDropped" for e in ev),
        timeout=30, what="a FieldsDropped event")
    dropped = [e for e in events if e["reason"] == "FieldsDropped"]
    assert len(dropped) == 1 and dropped[0]["type"] == "Warning"
    message = dropped[0]["message"]
    for field in ("spec.hostAliases", "spec.containers[0].workingDir",
                  "spec.containers[0].securityContext.runAsUser",
                  "spec.containers[0].securityContext.runAsNonRoot"):
        assert field in message
    assert len(message.encode()) <= 1024
    assert (await system.clouds[0].stats())["create_calls"] == 1

    # a plain pod on the same node gets none
    await create_pod(kube, namespace, "plain", pod_spec(system.node_name))
    await eventually(lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/plain"),
                     until=lambda p: p.get("status", {}).get("phase") == "Running",
                     timeout=60, what="the plain pod Running")
    # Events are written in the order they are recorded: FieldsDropped would precede Started.
    events = await eventually(lambda: events_for(kube, namespace, "plain"),
                              until=lambda ev: any(e["reason"] == "Started" for e in ev),
                              timeout=30, what="the plain pod's Started event")
    assert not [e for e in events if e["reason"] == "FieldsDropped"]

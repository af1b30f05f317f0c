"""A private image on the mock cloud: a wrong pull Secret waits in ErrImagePull naming
imagePullSecrets and the registry; once the Secret is right the pod runs; the password is in no
log line, event, annotation or status of the whole test."""

from __future__ import annotations

import base64
import json
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, list_pods, node_ready, pod_spec

REGISTRY = "registry.private.example:5000"
IMAGE = f"{REGISTRY}/team/llm:1.0"
RIGHT = "pw-right-7f3c1e9a"
WRONG = "pw-wrong-2b8d4c6f"


def dockerconfig(password: str) -> dict[str, str]:
    auth = base64.b64encode(f"robot:{password}".encode()).decode()
    raw = json.dumps({"auths": {REGISTRY: {"auth": auth}}}).encode()
    return {".dockerconfigjson": base64.b64encode(raw).decode()}


def waiting(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict((statuses[0].get("state") or {}).get("waiting") or {})


async def test_a_wrong_pull_secret_waits_named_and_the_right_one_runs(
        kube: KubeClient, namespace: str, system: System) -> None:
    await system.start()
    cloud = system.clouds[0]
    await cloud.admin("PUT", f"/admin/registries/{REGISTRY}",
                      json={"username": "robot", "password": RIGHT})
    await node_ready(kube, system.node_name)
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    await kube.create(secrets, {"apiVersion": "v1", "kind": "Secret",
                                "metadata": {"name": "regcred"},
                                "type": "kubernetes.io/dockerconfigjson",
                                "data": dockerconfig(WRONG)})
    spec = pod_spec(system.node_name, container={"image": IMAGE},
                    imagePullSecrets=[{"name": "regcred"}])
    await create_pod(kube, namespace, "private", spec, labels={"app": "private"})

    pods = await eventually(lambda: list_pods(kube, namespace, "app=private"), timeout=60,
                            until=lambda ps: waiting(ps[0]).get("reason") == "ErrImagePull",
                            what="the pod waiting in ErrImagePull")
    message = waiting(pods[0])["message"]
    assert "spec.imagePullSecrets" in message and REGISTRY in message, message
    assert "'regcred'" in message, "the Secret is named"
    assert pods[0]["status"]["phase"] == "Pending"
    assert (await cloud.stats())["instances_created"] == 0, "nothing runs without the pull"
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events",
                             params={"fieldSelector": "involvedObject.name=private"}))["items"]
    failed = [e for e in events if e["reason"] == "Failed" and e["type"] == "Warning"]
    assert failed and REGISTRY in failed[0]["message"]

    await kube.patch(f"{secrets}/regcred", {"data": dockerconfig(RIGHT)})
    pods = await eventually(lambda: list_pods(kube, namespace, "app=private"), timeout=120,
                            until=lambda ps: ps[0]["status"].get("phase") == "Running",
                            what="the pod Running once the Secret is right")
    ledger = await cloud.ledger()
    assert [e["uid"] for e in ledger] == [pods[0]["metadata"]["uid"]]

    # the credential is nowhere it could leak
    everything = json.dumps(await list_pods(kube, namespace)) + json.dumps(
        (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"])
    assert system.provider is not None
    logs = system.provider.log_text() + cloud.log_text()
    for secret in (RIGHT, WRONG, base64.b64encode(f"robot:{RIGHT}".encode()).decode()):
        assert secret not in everything
        assert secret not in logs

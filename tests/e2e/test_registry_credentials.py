"""Registry credentials go only to their registry, on the real control plane.

The provider has a node-wide credential for registry.example.com (the mock adapter's options
``registry_auth`` + ``registry_hosts``, as RunPod's ``registry_id``, Salad's
``registry_authentication`` and Vast.ai's ``image_login`` are scoped) and the namespace has a pull
Secret for the same registry. A pod whose image is on attacker.example must be created with no
credential at all (the mock cloud's ledger records what each create carried), with or without
the Secret, while a pod of registry.example.com gets the node-wide one and runs (the mock's
registry is private: it runs only if the credential was sent). No password appears anywhere."""

from __future__ import annotations

import base64
import json
from typing import Any

from vkprovider.kube import KubeClient
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, list_pods, node_ready, pod_spec

REGISTRY = "registry.example.com"
ORG_PASSWORD = "org-pw-5d2e8b7c41"
TEAM_PASSWORD = "team-pw-a93f06d2e7"


def dockerconfig(user: str, password: str) -> dict[str, str]:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    raw = json.dumps({"auths": {REGISTRY: {"auth": auth}}}).encode()
    return {".dockerconfigjson": base64.b64encode(raw).decode()}


async def start(system: System) -> MockCloudProcess:
    cloud = MockCloudProcess(work_dir=system.work_dir, name="cloud0", boot_delay=0.3,
                             inventory="H100:us-east:16:2.49")
    await cloud.start()
    system.clouds.append(cloud)
    await cloud.admin("PUT", f"/admin/registries/{REGISTRY}",
                      json={"username": "org", "password": ORG_PASSWORD})
    system.provider = ProviderProcess(
        work_dir=system.work_dir, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=system.clouds, client_ca_file=system.client_ca, config_providers=False,
        extra={"providers": [{
            "name": cloud.name, "type": "mock", "url": cloud.url,
            "options": {"registry_auth": {"username": "org", "password": ORG_PASSWORD},
                        "registry_hosts": [REGISTRY]},
        }]})
    system.provider.start()
    return cloud


async def test_credentials_go_only_with_images_of_their_registry(
        kube: KubeClient, namespace: str, system: System) -> None:
    cloud = await start(system)
    await node_ready(kube, system.node_name)
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"},
        "type": "kubernetes.io/dockerconfigjson", "data": dockerconfig("team", TEAM_PASSWORD)})
    pods = {
        "attacker": pod_spec(system.node_name, container={"image": "attacker.example/x:1"}),
        "attacker-secret": pod_spec(system.node_name,
                                    container={"image": "attacker.example/x:1"},
                                    imagePullSecrets=[{"name": "regcred"}]),
        "ours": pod_spec(system.node_name, container={"image": f"{REGISTRY}/team/model:1"}),
    }
    for name, spec in pods.items():
        await create_pod(kube, namespace, name, spec, labels={"app": "registry"})

    running = await eventually(
        lambda: list_pods(kube, namespace, "app=registry"), timeout=120,
        until=lambda ps: len(ps) == 3 and all(p["status"].get("phase") == "Running" for p in ps),
        what="the three pods Running")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running}
    carried: dict[str, Any] = {e["uid"]: e["registry_auth"] for e in await cloud.ledger()}
    assert carried[uids["attacker"]] is None, "no credential with another registry's image"
    assert carried[uids["attacker-secret"]] is None, "a pull Secret names only its registry"
    assert carried[uids["ours"]] == {"registry": REGISTRY, "username": "org"}

    everything = json.dumps(await list_pods(kube, namespace)) + json.dumps(
        (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"])
    assert system.provider is not None
    logs = system.provider.log_text() + cloud.log_text()
    for secret in (ORG_PASSWORD, TEAM_PASSWORD,
                   base64.b64encode(f"org:{ORG_PASSWORD}".encode()).decode()):
        assert secret not in everything
        assert secret not in logs

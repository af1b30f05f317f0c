"""``pods.policy_labels``: another install's OverflowPolicies neither open nor close a node.

Once any OverflowPolicy exists, the provider refuses every pod none selects (node/policygate.py).
A provider of install "a" (its policies labelled so) must not be closed by install "b"'s policy:
to it, no policy exists, and it creates the pod. Once a policy of its own exists, that one
governs it, and a pod it does not select is refused naming it, not the other install's.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_chaos_profiles import failed_with
from .test_create_rules import pod_named, running
from .test_overflow import POLICIES, policy
from .test_pods import create_pod, node_ready, pod_spec

pytestmark = pytest.mark.cluster

INSTALL = "example.com/burst-install"


def labelled(body: dict[str, Any], install: str) -> dict[str, Any]:
    body["metadata"]["labels"] = {INSTALL: install}
    return body


async def test_only_the_installs_own_policies_govern_its_node(
        kube: KubeClient, namespace: str, system: System, cluster_objects: Cluster) -> None:
    tag = uuid.uuid4().hex[:6]
    # install b's policy would close every node that reads it: none of it selects our pod
    await cluster_objects.create(POLICIES, labelled(policy(
        f"install-b-{tag}", namespace=f"{namespace}-b", app="x", providers=["cloud0"]), "b"))
    await system.start(clouds=1, pods={"policy_labels": {INSTALL: "a"}})
    await node_ready(kube, system.node_name)
    await create_pod(kube, namespace, "open", pod_spec(system.node_name))
    await eventually(lambda: pod_named(kube, namespace, "open"), until=running, timeout=60,
                     what="the pod Running: to install a, no policy exists")

    own = f"install-a-{tag}"
    await cluster_objects.create(POLICIES, labelled(policy(
        own, namespace=f"{namespace}-a", app="x", providers=["cloud0"]), "a"))
    await asyncio.sleep(1.0)  # the provider's policy watch delivers it (milliseconds)
    await create_pod(kube, namespace, "closed", pod_spec(system.node_name))
    pod = await eventually(lambda: pod_named(kube, namespace, "closed"),
                           until=lambda p: failed_with(p, "NotAdmitted"), timeout=60,
                           what="the next pod refused: install a's own policy now governs")
    message = pod["status"]["message"]
    assert own in message and f"install-b-{tag}" not in message, message
    assert (await system.clouds[0].stats())["instances_created"] == 1

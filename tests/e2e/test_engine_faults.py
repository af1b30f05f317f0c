"""The pod engine under cloud faults (issue 35): vanished instances, lagging and dead lists,
restarts with one cloud down. Real control plane, real provider process, mock clouds with the
scenario faults of providers/mock/scenario.py.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.loadgen import LoadGenerator
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, events_for, list_pods, node_ready, pod_spec
from .test_traffic import endpoint_ready, server, service, slices

pytestmark = pytest.mark.cluster


def by_name(pods: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((p for p in pods if p["metadata"]["name"] == name), {})


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def log_lines(text: str, message: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("msg") == message:
            out.append(record)
    return out


async def web_replica(kube: KubeClient, namespace: str, system: System, name: str) -> None:
    """A pod of the Service "web" with a model server, once it is Ready in that Service."""
    await create_pod(kube, namespace, name, pod_spec(system.node_name, container=server()),
                     labels={"app": "web"})
    await eventually(lambda: slices(kube, namespace, "web", ours=True), timeout=60,
                     until=lambda s: endpoint_ready(s, name) is True, what=f"{name} Ready")


async def test_a_vanished_instance_is_a_container_that_died(
    kube: KubeClient, namespace: str, system: System
) -> None:
    await system.start(pods={"capacity_block_seconds": 1})
    cloud = system.clouds[0]
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "web", "web")
    for name, policy in (("never", "Never"), ("always", "Always")):
        await create_pod(kube, namespace, name,
                         pod_spec(system.node_name, container=server(), restartPolicy=policy),
                         labels={"app": "web"})
    await eventually(lambda: slices(kube, namespace, "web", ours=True), timeout=90,
                     until=lambda s: endpoint_ready(s, "never") and endpoint_ready(s, "always"),
                     what="both replicas Ready in the Service")
    before = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}

    # Both instances vanish (host lost), and the cloud has no capacity for a new one for now.
    await cloud.admin("PUT", "/admin/scenario", json={"name": "vanish", "faults": {
        "vanish": [{"tags": {"vkprovider.io/pod": "never"}},
                   {"tags": {"vkprovider.io/pod": "always"}}],
        "capacity_outages": [{"gpu_type": "H100", "count": 0}]}})
    await eventually(cloud.stats, until=lambda s: s["injected_vanished"] == 2, timeout=30,
                     what="both instances vanished")
    await eventually(lambda: slices(kube, namespace, "web", ours=True), timeout=30,
                     until=lambda s: endpoint_ready(s, "never") is None
                     and endpoint_ready(s, "always") is None,
                     what="the endpoints of the vanished instances withdrawn (no new instance "
                          "can be made: nothing else would take them away)")

    pods = await eventually(lambda: list_pods(kube, namespace), timeout=60,
                            until=lambda ps: (by_name(ps, "never").get("status") or {})
                            .get("phase") == "Failed"
                            and container(by_name(ps, "always")).get("restartCount") == 1,
                            what="the Never pod Failed, the Always pod's restart counted")
    never = by_name(pods, "never")
    assert never["status"]["reason"] == "InstanceVanished", never["status"]
    terminated = container(never)["state"]["terminated"]
    assert terminated["reason"] == "InstanceVanished" and "vanished" in terminated["message"]
    always = by_name(pods, "always")
    assert always["status"]["phase"] == "Running", "a restarting pod stays Running"
    assert not is_ready(always)
    last = container(always)["lastState"]["terminated"]
    assert last["reason"] == "InstanceVanished", last
    said = [e["reason"] for e in await events_for(kube, namespace, "always")]
    assert "InstanceVanished" in said, said

    await cloud.admin("DELETE", "/admin/scenario")  # capacity is back
    pods = await eventually(lambda: list_pods(kube, namespace), timeout=90,
                            until=lambda ps: is_ready(by_name(ps, "always")),
                            what="the Always pod Ready on a new instance")
    always = by_name(pods, "always")
    assert container(always)["restartCount"] == 1
    old_id = before["always"]["metadata"]["annotations"]["vkprovider.io/instance-id"]
    assert always["metadata"]["annotations"]["vkprovider.io/instance-id"] != old_id
    await eventually(lambda: slices(kube, namespace, "web", ours=True), timeout=30,
                     until=lambda s: endpoint_ready(s, "always") is True,
                     what="the new instance back in the Service")
    per_uid = collections.Counter(e["uid"] for e in await cloud.ledger())
    assert per_uid[never["metadata"]["uid"]] == 1, "restartPolicy Never: never run twice"
    assert per_uid[always["metadata"]["uid"]] == 2


async def test_a_lagging_list_never_yields_two_instances_for_one_pod(
    kube: KubeClient, namespace: str, system: System
) -> None:
    # cloud0 loses the answer of a create it did make, fails the adapter's retries (the create
    # is unsure), then has no capacity for a while; its list shows an instance only 20 s
    # after it was made. cloud1 has room.
    await system.start(clouds=2, pods={"capacity_block_seconds": 60},
                       inventories=["H100:us-east:16:1.99", "H100:eu-west:16:2.19"])
    cloud0, cloud1 = system.clouds
    await node_ready(kube, system.node_name)
    await cloud0.admin("PUT", "/admin/scenario", json={"name": "lagging", "faults": {
        "lost_create_responses": {"rate": 1.0, "then": [{"status": 503, "count": 3},
                                                         {"status": 409, "count": 50}]},
        "list_lag_seconds": 20}})
    await create_pod(kube, namespace, "once", pod_spec(system.node_name))
    pods = await eventually(lambda: list_pods(kube, namespace), timeout=120,
                            until=lambda ps: (by_name(ps, "once").get("status") or {})
                            .get("phase") == "Running",
                            what="the pod Running")
    uid = by_name(pods, "once")["metadata"]["uid"]
    assert (await cloud0.stats())["injected_lost_creates"] == 1
    ledger = [e for e in await cloud0.ledger() + await cloud1.ledger() if e["uid"] == uid]
    assert len(ledger) == 1, f"one instance per pod, not {ledger}"
    assert by_name(pods, "once")["metadata"]["annotations"]["vkprovider.io/provider"] == "cloud0"


async def test_a_black_holed_cloud_stalls_no_other(
    kube: KubeClient, namespace: str, system: System
) -> None:
    provider = await system.start(clouds=2, inventories=["A100:us-east:8:1.29",
                                                         "H100:eu-west:16:2.19"])
    cloud0, cloud1 = system.clouds
    await node_ready(kube, system.node_name)
    # cloud0's lists hang far longer than the adapter's whole retry cycle
    await cloud0.admin("PUT", "/admin/scenario", json={"name": "black-hole", "faults": {
        "endpoints": {"list": {"hang_rate": 1.0, "hang_seconds": 300}}}})
    await eventually(cloud0.stats, until=lambda s: s["injected_hangs"] >= 1, timeout=30,
                     what="a list of cloud0 hanging")
    failed_before = len([r for r in log_lines(provider.log_text(), "provider list failed")
                         if r.get("provider") == "cloud0"])
    await create_pod(kube, namespace, "healthy", pod_spec(system.node_name))
    await eventually(lambda: list_pods(kube, namespace), timeout=60,
                     until=lambda ps: (by_name(ps, "healthy").get("status") or {})
                     .get("phase") == "Running",
                     what="the pod on cloud1 Running")
    failed = [r for r in log_lines(provider.log_text(), "provider list failed")
              if r.get("provider") == "cloud0"]
    assert len(failed) == failed_before, (
        "cloud1's status came while cloud0's list was still hanging, not after it failed")
    assert (await cloud1.stats())["instances_created"] == 1


async def test_a_restart_with_one_cloud_unlisted_keeps_its_replicas_in_services(
    kube: KubeClient, namespace: str, system: System, local_cluster: Any
) -> None:
    provider = await system.start(clouds=2, inventories=["H100:us-east:1:1.99",
                                                         "H100:eu-west:16:2.19"])
    cloud0, cloud1 = system.clouds
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "web", "web")
    await web_replica(kube, namespace, system, "a")
    await web_replica(kube, namespace, system, "b")
    pods = await list_pods(kube, namespace)
    assert by_name(pods, "a")["metadata"]["annotations"]["vkprovider.io/provider"] == "cloud0"
    assert by_name(pods, "b")["metadata"]["annotations"]["vkprovider.io/provider"] == "cloud1"
    a_instance = by_name(pods, "a")["metadata"]["annotations"]["vkprovider.io/instance-id"]

    async def served_by_a() -> int:
        """Requests a's model server (on cloud0) answered, as it counts them."""
        return int(((await cloud0.admin("GET", "/admin/traffic")).get(a_instance) or {})
                   .get("traffic") or 0)

    # Users send requests the whole time, as kube-proxy would route them (the harness's
    # address table reaches the clouds' virtual addresses).
    async with LoadGenerator(kube=kube, namespace=namespace, service="web", rate=40,
                             address_map=Path(local_cluster.address_map_dir),
                             chapter="before") as lg:
        await eventually(lambda: lg_replicas(lg), timeout=30,
                         until=lambda r: a_instance in r and len(r) == 2,
                         what="requests answered by both replicas before the restart")

        provider.kill()
        await cloud0.admin("PUT", "/admin/scenario", json={"name": "broken-lists", "faults": {
            "endpoints": {"list": {"error_rate": 1.0, "error_status": 500}}}})
        provider.start()

        async def log() -> str:
            return provider.log_text()

        await eventually(log, timeout=60,
                         until=lambda t: len(log_lines(t, "endpointslices synced; starting "
                                                          "workers")) == 2,
                         what="the restarted provider reconciling EndpointSlices")
        lg.mark("restarted")
        served_then = await served_by_a()
        start = (await cloud1.stats())["list_calls"]
        seen: list[tuple[bool | None, bool | None]] = []

        async def observe() -> int:
            s = await slices(kube, namespace, "web", ours=True)
            seen.append((endpoint_ready(s, "a"), endpoint_ready(s, "b")))
            return int((await cloud1.stats())["list_calls"]) - start

        await eventually(observe, until=lambda n: n >= 6, timeout=60,
                         what="six sweeps of the restarted provider")
    report = lg.report()
    assert report.failed == 0, report.as_dict()
    after = report.chapter("restarted")
    assert after.sent > 0 and after.failed == 0, report.as_dict()
    assert after.by_replica.get(a_instance, 0) > 0, (
        f"cloud0's replica answered no request after the restart: {dict(after.by_replica)}")
    assert await served_by_a() > served_then, "cloud0's model server counted no new request"
    assert all(a is True and b is True for a, b in seen), (
        f"both replicas stay in the Service while cloud0 cannot be listed: {seen}")


async def lg_replicas(lg: LoadGenerator) -> set[str]:
    return {r for r, n in lg.report().by_replica.items() if n > 0}


async def test_a_duplicate_on_a_cloud_listed_first_never_costs_the_serving_replica(
    kube: KubeClient, namespace: str, system: System
) -> None:
    """Item 6: two instances carry one pod's UID (a create retried elsewhere after its answer
    was lost). The one the pod names (its instance-id annotation) serves; the duplicate sits on
    the cloud listed first. The duplicate goes; the serving replica stays in its Service."""
    # the pod asks for an H100: only cloud1 has them
    await system.start(clouds=2, inventories=["A100:us-east:8:1.29", "H100:eu-west:16:2.19"])
    cloud0, cloud1 = system.clouds
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "web", "web")
    await web_replica(kube, namespace, system, "a")
    notes = by_name(await list_pods(kube, namespace), "a")["metadata"]["annotations"]
    assert notes["vkprovider.io/provider"] == "cloud1", "placed where the H100s are"
    serving = notes["vkprovider.io/instance-id"]
    [original] = [i for i in await cloud1.instances() if i["id"] == serving]

    # the same pod's instance made again on cloud0, tags and all (as the provider's retry of a
    # create whose answer was lost would have made it), and running
    copy = await cloud0.admin("POST", "/instances", json={
        "name": original["name"], "image": original.get("image") or "server:1",
        "gpu_count": 1, "gpu_type": "A100", "tags": original["tags"]})
    seen: list[bool | None] = []

    async def duplicate_state() -> str:
        seen.append(endpoint_ready(await slices(kube, namespace, "web", ours=True), "a"))
        return next(e["state"] for e in await cloud0.ledger() if e["id"] == copy["id"])

    await eventually(duplicate_state, until=lambda s: s == "deleted", timeout=60,
                     what="the duplicate on cloud0 deleted")
    [kept] = [e for e in await cloud1.ledger() if e["id"] == serving]
    assert kept["state"] == "running", f"the serving instance was deleted instead: {kept}"
    notes = by_name(await list_pods(kube, namespace), "a")["metadata"]["annotations"]
    assert (notes["vkprovider.io/provider"], notes["vkprovider.io/instance-id"]) == (
        "cloud1", serving)
    assert seen and all(ready is True for ready in seen), (
        f"the replica stays Ready in its Service throughout: {seen}")
    after = await slices(kube, namespace, "web", ours=True)
    assert endpoint_ready(after, "a") is True, after

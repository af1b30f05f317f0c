"""A cloud that publishes an address inside the cluster gets no endpoint and no probe (issue 34).

Real control plane, real provider process, one mock cloud that lies: a ``published_hosts``
scenario fault makes one instance report 10.0.0.5 and another 169.254.169.254 as its public
address. The lab's address map routes both to those instances' own listeners on loopback, so
anything that dialled them would show in the mock's ``/admin/traffic`` counts; nothing ever
dials the addresses themselves. An honest pod beside them (198.18.x.y) proves the lab works:
it is probed, Ready and in the slice.
"""

from __future__ import annotations

import re
from typing import Any

from providers.mock.records import is_public_address
from vkprovider.kube import KubeClient
from vkprovider.testing.waiting import eventually

from .conftest import System
from .test_pods import create_pod, list_pods, node_ready, pod_spec
from .test_traffic import ready, server, service, slices

HOSTILE = {"evil-private": ("10.0.0.5", "private"),
           "evil-metadata": ("169.254.169.254", "metadata")}


def _metric(text: str, name: str, **labels: str) -> float:
    """A sample's value in a Prometheus text page (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def _refused_events(kube: KubeClient, ns: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{ns}/events",
                          params={"fieldSelector": "reason=EndpointRefused"})
    return list(body["items"])


def _addresses(items: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Pod name -> every address any slice holds for it."""
    out: dict[str, list[str]] = {}
    for s in items:
        for ep in s.get("endpoints") or []:
            name = (ep.get("targetRef") or {}).get("name", "")
            out.setdefault(name, []).extend(ep.get("addresses") or [])
    return out


async def test_addresses_inside_the_cluster_are_never_published_or_probed(
        kube: KubeClient, namespace: str, system: System) -> None:
    provider = await system.start(boot_delay=0.3)
    cloud = system.clouds[0]
    await cloud.admin("PUT", "/admin/scenario", json={"faults": {"published_hosts": [
        {"tags": {"vkprovider.io/namespace": namespace, "vkprovider.io/pod": pod},
         "host": host} for pod, (host, _) in HOSTILE.items()]}})
    await node_ready(kube, system.node_name)
    await service(kube, namespace, "web", "web")

    # The lying instances first: they run (and, unfiltered, would be probed every second)
    # for the whole time the honest pod below takes to become Ready.
    for name in HOSTILE:
        await create_pod(kube, namespace, name, pod_spec(system.node_name, container=server()),
                         labels={"app": "web"})

    def running(pods: list[dict[str, Any]]) -> bool:
        by = {p["metadata"]["name"]: p for p in pods}
        return all((by.get(n, {}).get("status") or {}).get("phase") == "Running"
                   for n in HOSTILE)

    await eventually(lambda: list_pods(kube, namespace), until=running, timeout=90,
                     what="the lying instances running")
    listed = {i["tags"].get("vkprovider.io/pod"): i for i in await cloud.instances()}
    for name, (host, _) in HOSTILE.items():
        assert listed[name]["public_ip"] == host, "the mock cloud lies as the scenario says"

    await create_pod(kube, namespace, "honest", pod_spec(system.node_name, container=server()),
                     labels={"app": "web"})
    pods = await eventually(
        lambda: list_pods(kube, namespace),
        until=lambda ps: any(p["metadata"]["name"] == "honest" and ready(p) for p in ps),
        timeout=90, what="the honest pod Ready by its probe")
    honest_id = next(p for p in pods if p["metadata"]["name"] == "honest")["metadata"][
        "annotations"]["vkprovider.io/instance-id"]
    await eventually(lambda: cloud.admin("GET", "/admin/traffic"),
                     until=lambda t: t.get(honest_id, {}).get("probes", 0) >= 3, timeout=30,
                     what="the honest instance probed a few times")
    ours = await eventually(
        lambda: slices(kube, namespace, "web", ours=True),
        until=lambda items: "honest" in _addresses(items), timeout=30,
        what="the honest pod in the Service's slice")

    # No endpoint anywhere carries a lying address, and the lying pods have none at all.
    every = _addresses(await slices(kube, namespace, "web"))
    assert is_public_address(every["honest"][0]), every
    for name, (host, _) in HOSTILE.items():
        assert name not in every, (name, every)
        assert not any(host in addrs for addrs in every.values()), (host, every)
    assert all(s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"]
               == "vkprovider.io" for s in ours)

    # Nothing dialled them: every dial would have been routed to their listeners and counted;
    # the honest instance beside them was probed all along.
    traffic = await cloud.admin("GET", "/admin/traffic")
    for name in HOSTILE:
        served = traffic.get(listed[name]["id"], {"probes": 0, "traffic": 0})
        assert (served["probes"], served["traffic"]) == (0, 0), (name, served)

    await eventually(
        lambda: _refused_events(kube, namespace),
        until=lambda es: {e["involvedObject"]["name"] for e in es} >= set(HOSTILE),
        timeout=30, what="an EndpointRefused event on each lying pod")
    by_name = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    for name, (host, reason) in HOSTILE.items():
        pod = by_name[name]
        assert not ready(pod), f"{name} cannot pass a probe that was never sent"
        annotations = pod["metadata"].get("annotations") or {}
        assert host not in annotations.get("vkprovider.io/ports", ""), annotations
        assert "podIP" not in (pod.get("status") or {})
        [event] = [e for e in await _refused_events(kube, namespace)
                   if e["involvedObject"]["name"] == name]
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Pod"
        assert event.get("count", 1) == 1, "told once, not at every sweep"
        assert host in event["message"] and f"({reason})" in event["message"], event["message"]
        assert "8000/TCP" in event["message"] and cloud.name in event["message"]

    # Counted once per pod and address, though many sweeps saw them; the prober's backstop
    # never had to act (the screen took them out before any probe was set up).
    page = await provider.metrics()
    for _, reason in HOSTILE.values():
        assert _metric(page, "vkprovider_endpoints_refused_total", provider=cloud.name,
                       reason=reason) == 1, reason
    assert _metric(page, "vkprovider_endpoints_refused_total") == len(HOSTILE)
    assert _metric(page, "vkprovider_probes_refused_total") == 0

"""OverflowPolicy status as the companion writes it: Valid, Ready, BudgetExhausted, lastDecisions.

Real control plane; one mock cloud declared as a GPUProvider (the provider process has no
``providers:`` in its settings, so the GPUProvider objects are all it serves), plus GPUProviders
that cannot serve (a closed port, a missing Secret). The companion runs as a process with the RBAC
from manifests/, and is restarted to show that what the status holds survives it. Its
``/healthz`` is checked on a leader and a standby.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from vkprovider.kube import KubeClient
from vkprovider.testing.cluster import Component, LocalCluster, free_port
from vkprovider.testing.harness import MockCloudProcess, ProviderProcess
from vkprovider.testing.waiting import eventually

from .conftest import Cluster, System
from .test_overflow import POLICIES, gpu_deployment, pods, policy

pytestmark = pytest.mark.cluster

GPUPROVIDERS = "/apis/vkprovider.io/v1alpha1/gpuproviders"
FAST = {"gpu_providers": {"secret_refresh_seconds": 1, "status_interval_seconds": 1,
                          "resync_seconds": 0.5}}


def cond(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def decisions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("lastDecisions") or [])


async def start(system: System, local_cluster: LocalCluster, namespace: str,
                companion_kubeconfig: Path) -> MockCloudProcess:
    """A mock cloud, a provider serving only GPUProvider objects, and the companion."""
    cloud = MockCloudProcess(work_dir=system.work_dir, name="cloud0", boot_delay=0.3)
    await cloud.start()
    system.clouds.append(cloud)
    system.provider = ProviderProcess(
        work_dir=system.work_dir, kubeconfig=system.kubeconfig, node_name=system.node_name,
        clouds=[], config_providers=False, client_ca_file=local_cluster.ca_path,
        extra={"gpu_providers": {**FAST["gpu_providers"], "secret_namespaces": [namespace]}},
        node={"labels": {"vkprovider.io/pool": namespace}})
    system.provider.start()
    system.start_companion(kubeconfig=companion_kubeconfig)
    return cloud


async def gpu_provider(objects: Cluster, name: str, spec: dict[str, Any]) -> None:
    await objects.create(GPUPROVIDERS, {"apiVersion": "vkprovider.io/v1alpha1",
                                        "kind": "GPUProvider", "metadata": {"name": name},
                                        "spec": spec})


async def test_conditions_valid_ready_and_budget_exhausted(
    kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster,
    companion_kubeconfig: Path, cluster_objects: Cluster,
) -> None:
    cloud = await start(system, local_cluster, namespace, companion_kubeconfig)
    tag = uuid.uuid4().hex[:6]
    ok, down, broken = f"ok-{tag}", f"down-{tag}", f"broken-{tag}"
    await gpu_provider(cluster_objects, ok, {"type": "mock", "endpoint": cloud.url})
    await gpu_provider(cluster_objects, down, {
        "type": "mock", "endpoint": f"http://127.0.0.1:{free_port()}",  # nothing listens
        "options": {"max_attempts": 1}})
    await gpu_provider(cluster_objects, broken, {
        "type": "runpod", "credentialsSecret": {"namespace": namespace, "name": "no-such"}})
    served, stranded, invalid = f"served-{tag}", f"stranded-{tag}", f"invalid-{tag}"
    await cluster_objects.create(POLICIES, policy(served, namespace=namespace, app="inference",
                                                  providers=[ok], limits={"maxPods": 1}))
    await cluster_objects.create(POLICIES, policy(stranded, namespace=namespace, app="batch",
                                                  providers=[down]))
    await cluster_objects.create(POLICIES, policy(invalid, namespace=namespace, app="eval",
                                                  providers=[broken, f"missing-{tag}"]))

    # Valid, and its provider is Ready (the virtual kubelet's own Ready condition on it)
    obj = await eventually(lambda: kube.get(f"{POLICIES}/{served}"), timeout=60,
                           until=lambda o: cond(o, "Ready").get("status") == "True",
                           what=f"{served}: Ready=True")
    for kind in ("Valid", "Ready", "BudgetExhausted"):
        c = cond(obj, kind)
        assert c["observedGeneration"] == obj["metadata"]["generation"], c
        assert c["lastTransitionTime"] and c["message"] is not None, c
    assert cond(obj, "Valid")["status"] == "True"
    assert cond(obj, "Ready")["reason"] == "ProviderReady" and ok in cond(obj, "Ready")["message"]
    budget = cond(obj, "BudgetExhausted")
    assert (budget["status"], budget["reason"]) == ("False", "WithinLimits")
    assert "maxPods 1" in budget["message"]
    valid_since = cond(obj, "Valid")["lastTransitionTime"]

    # a provider that does not answer: valid, but not Ready, naming why
    obj = await eventually(lambda: kube.get(f"{POLICIES}/{stranded}"), timeout=90,
                           until=lambda o: cond(o, "Ready").get("status") == "False",
                           what=f"{stranded}: Ready=False")
    assert cond(obj, "Valid")["status"] == "True"
    ready = cond(obj, "Ready")
    assert ready["reason"] == "NoReadyProvider"
    assert f"{down}: Unreachable" in ready["message"]

    # every provider missing or invalid: never Valid=True, each field named
    obj = await eventually(lambda: kube.get(f"{POLICIES}/{invalid}"), timeout=60,
                           until=lambda o: cond(o, "Valid").get("reason") == "InvalidProvider",
                           what=f"{invalid}: Valid=False naming the invalid provider")
    valid = cond(obj, "Valid")
    assert valid["status"] == "False"
    assert f"spec.providers[0]: GPUProvider {broken} is not valid" in valid["message"]
    assert f"Secret {namespace}/no-such" in valid["message"]  # the provider's own reason
    assert f"spec.providers[1]: GPUProvider missing-{tag} does not exist" in valid["message"]
    assert (cond(obj, "Ready")["status"], cond(obj, "Ready")["reason"]) == ("False", "Invalid")

    # maxPods 1: one replica bursts, the limit is reached and named
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=2, pool=namespace))
    obj = await eventually(lambda: kube.get(f"{POLICIES}/{served}"), timeout=60,
                           until=lambda o: cond(o, "BudgetExhausted").get("status") == "True",
                           what=f"{served}: BudgetExhausted=True")
    budget = cond(obj, "BudgetExhausted")
    assert budget["reason"] == "MaxPods" and "maxPods 1 reached" in budget["message"]
    assert cond(obj, "Valid")["lastTransitionTime"] == valid_since, \
        "lastTransitionTime is kept while the status does not change"
    obj = await eventually(lambda: kube.get(f"{POLICIES}/{served}"), timeout=30,
                           until=lambda o: {"Admitted", "Refused"} <= {
                               d["decision"] for d in decisions(o)},
                           what="an Admitted and a Refused decision")
    refused = next(d for d in decisions(obj) if d["decision"] == "Refused")
    assert "maxPods 1 reached" in refused["reason"]
    running = await eventually(
        lambda: pods(kube, namespace, "inference"), timeout=60,
        until=lambda ps: any(p["status"].get("phase") == "Running" for p in ps),
        what="the admitted replica Running on the GPUProvider's cloud")
    assert {p["metadata"]["annotations"].get("vkprovider.io/provider") for p in running
            if p["status"].get("phase") == "Running"} == {ok}

    # usage drops: room again, and the transition is recorded
    exhausted_since = budget["lastTransitionTime"]
    await kube.patch(f"/apis/apps/v1/namespaces/{namespace}/deployments/inference/scale",
                     {"spec": {"replicas": 0}})
    obj = await eventually(lambda: kube.get(f"{POLICIES}/{served}"), timeout=60,
                           until=lambda o: cond(o, "BudgetExhausted").get("status") == "False",
                           what=f"{served}: BudgetExhausted=False again")
    assert cond(obj, "BudgetExhausted")["reason"] == "WithinLimits"
    assert cond(obj, "BudgetExhausted")["lastTransitionTime"] >= exhausted_since


async def test_last_decisions_survive_a_companion_restart(
    kube: KubeClient, namespace: str, system: System, local_cluster: LocalCluster,
    companion_kubeconfig: Path, cluster_objects: Cluster,
) -> None:
    cloud = await start(system, local_cluster, namespace, companion_kubeconfig)
    tag = uuid.uuid4().hex[:6]
    ok, name = f"ok-{tag}", f"keep-{tag}"
    await gpu_provider(cluster_objects, ok, {"type": "mock", "endpoint": cloud.url})
    await cluster_objects.create(POLICIES, policy(name, namespace=namespace, app="inference",
                                                  providers=[ok], limits={"maxPods": 1}))
    await kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      gpu_deployment("inference", replicas=2, pool=namespace))
    before = await eventually(lambda: kube.get(f"{POLICIES}/{name}"), timeout=60,
                              until=lambda o: {"Admitted", "Refused"} <= {
                                  d["decision"] for d in decisions(o)},
                              what="an Admitted and a Refused decision")
    recorded = decisions(before)
    valid_since = cond(before, "Valid")["lastTransitionTime"]

    assert system.companion is not None
    system.companion.stop()
    system.companion.start()  # a new process: nothing in memory
    # a decision only the new process can make: a third replica, refused by maxPods 1 (a pod
    # no policy selects gets no decision at all)
    await kube.patch(f"/apis/apps/v1/namespaces/{namespace}/deployments/inference/scale",
                     {"spec": {"replicas": 3}})
    known = {d["pod"] for d in recorded}
    after = await eventually(
        lambda: kube.get(f"{POLICIES}/{name}"), timeout=60,
        until=lambda o: any(d["pod"].startswith(f"{namespace}/inference-")
                            and d["pod"] not in known for d in decisions(o)),
        what="a decision recorded by the restarted companion")
    kept = decisions(after)
    assert kept[:len(recorded)] == recorded, \
        f"the restarted companion dropped decisions: {recorded} -> {kept}"
    assert len(kept) <= 20
    assert cond(after, "Valid")["lastTransitionTime"] == valid_since


async def _healthz(port: int) -> tuple[int, str]:
    async with httpx.AsyncClient(timeout=5) as http:
        try:
            resp = await http.get(f"http://127.0.0.1:{port}/healthz")
        except httpx.TransportError as exc:
            return 0, repr(exc)
        return resp.status_code, resp.text


async def test_healthz_is_200_on_the_leader_and_on_the_standby(
    kube: KubeClient, system: System, companion_kubeconfig: Path, crds: list[str],
) -> None:
    """Readiness must not mean "is the leader": both replicas answer 200 when healthy."""
    replicas: list[tuple[Component, int]] = []
    for i in range(2):
        port = free_port()
        component = Component(
            name=f"companion-{system.node_name}-{i}",
            argv=[sys.executable, "-m", "vkprovider", "--log-format=json", "descheduler",
                  "--kubeconfig", str(companion_kubeconfig), "--node-name", system.node_name,
                  "--interval", "0.5", "--move-back-interval", "1", "--leader-elect",
                  "--metrics-port", str(port)],
            log_path=system.work_dir / f"companion-{i}.log")
        component.start()
        replicas.append((component, port))
    try:
        async def both() -> list[tuple[int, str]]:
            return [await _healthz(port) for _c, port in replicas]

        answers = await eventually(
            both, timeout=60,
            until=lambda a: [c for c, _t in a] == [200, 200]
            and sorted("standby" in t for _c, t in a) == [False, True],
            what="a leader and a standby, both answering 200")
        leader = next(i for i, (_c, text) in enumerate(answers) if "standby" not in text)
        async with httpx.AsyncClient(timeout=5) as http:
            for _c, port in replicas:
                scrape = await http.get(f"http://127.0.0.1:{port}/metrics")
                assert scrape.status_code == 200
                assert "vkprovider_overflow_decisions_total" in scrape.text \
                    or "vkprovider_moveback_in_flight" in scrape.text
        # the leader leaves (SIGTERM releases the Lease): the standby acts, still 200
        first = replicas[leader][0]
        first.stop()
        assert first.process is not None and first.process.returncode == 0, first.tail()
        assert "Traceback" not in first.log_path.read_text(), first.tail()
        other = replicas[1 - leader][1]
        status, text = await eventually(lambda: _healthz(other), timeout=60,
                                        until=lambda a: a == (200, "ok\n"),
                                        what="the former standby acting and healthy")
        assert (status, text) == (200, "ok\n")
        # a standby stops at once on SIGTERM (it used to wait for SIGKILL)
        port = free_port()
        third = Component(
            name=f"companion-{system.node_name}-2",
            argv=[*replicas[0][0].argv[:-1], str(port)],
            log_path=system.work_dir / "companion-2.log")
        third.start()
        replicas.append((third, port))
        await eventually(lambda: _healthz(port), timeout=60,
                         until=lambda a: a[0] == 200 and "standby" in a[1],
                         what="a third replica standing by")
        stopped = time.monotonic()
        third.stop()
        assert third.process is not None and third.process.returncode == 0, third.tail()
        assert time.monotonic() - stopped < 5, "a standby must not wait to be killed"
        assert "stopped while standing by" in third.log_path.read_text()
    finally:
        for component, _port in replicas:
            component.stop()
        with contextlib.suppress(Exception):
            await kube.delete("/apis/coordination.k8s.io/v1/namespaces/vkprovider-system/"
                              f"leases/vkprovider-companion-{system.node_name}")

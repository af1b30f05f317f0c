"""vkprovider.node.replicas: probe tracking, published endpoints and drain of cloud replicas."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from providers.base import Instance, InstanceState, PublishedPort
from vkprovider.node.replicas import Replicas
from vkprovider.probing.prober import ContainerProbeState
from vkprovider.probing.spec import ContainerProbes


class FakeProber:
    """Records what the replica tracker asks; the state is set by the test (pure logic)."""

    def __init__(self) -> None:
        self.tracked: dict[str, tuple[Sequence[ContainerProbes], Callable[[int], Any], float]] = {}
        self.states: dict[str, ContainerProbeState] = {}
        self.tracks = 0
        self.assumed = False

    def track(self, key: str, *, containers: Sequence[ContainerProbes],
              target: Callable[[int], Any], running_since: float,
              assume_ready: bool = False) -> None:
        self.tracks += 1
        self.assumed = assume_ready
        self.tracked[key] = (containers, target, running_since)

    def forget(self, key: str) -> None:
        self.tracked.pop(key, None)

    def state(self, key: str) -> tuple[ContainerProbeState, ...] | None:
        s = self.states.get(key)
        return None if s is None else (s,)


class Sink:
    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}

    def set_pod(self, *, namespace: str, name: str, uid: str, labels: Mapping[str, str],
                container_ports: Sequence[tuple[str, str | None, int, str]],
                endpoints: Sequence[Any]) -> None:
        self.pods[uid] = {"labels": labels, "ports": list(container_ports),
                          "endpoints": list(endpoints)}

    def remove_pod(self, *, uid: str) -> None:
        self.pods.pop(uid)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pod(*, probe: bool = True, grace: int | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "srv", "ports": [{"name": "http",
                                                          "containerPort": 8000}]}
    if probe:
        container["readinessProbe"] = {"httpGet": {"port": "http", "path": "/ready"}}
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "a"}}
    if grace is not None:
        meta["deletionGracePeriodSeconds"] = grace
    return {"metadata": meta, "spec": {"containers": [container]}}


def instance(*, restarts: int = 0, port: int = 30000, iid: str = "i-1") -> Instance:
    return Instance(id=iid, name="n", provider="mock", state=InstanceState.RUNNING,
                    restart_count=restarts, published=(
                        PublishedPort(container_port=8000, host="198.18.0.1", port=port,
                                      kind="ip"),
                        PublishedPort(container_port=8000, host="x.example", port=443,
                                      kind="hostname", scheme="https")))


def make() -> tuple[Replicas, FakeProber, Sink, Clock]:
    prober, sink, clock = FakeProber(), Sink(), Clock()
    return Replicas(prober=prober, sink=sink, clock=clock, drain_seconds=5.0), prober, sink, clock


def test_running_tracks_once_and_targets_the_preferred_published_address() -> None:
    r, prober, sink, _ = make()
    first = r.running(uid="u1", pod=pod(), provider="mock", instance=instance())
    assert first is not None and not first.ready, "probes declared, none answered: not ready"
    prober.states["u1"] = ContainerProbeState(name="srv", started=True, ready=True,
                                              liveness_failed=False)
    r.running(uid="u1", pod=pod(), provider="mock", instance=instance())
    assert prober.tracks == 1
    _, target, _ = prober.tracked["u1"]
    assert target(8000) == ("198.18.0.1", 30000, None)
    assert target(9999) is None
    ep, proxy = sink.pods["u1"]["endpoints"]  # every published entry, preferred first
    assert (ep.host, ep.port, ep.ready, ep.terminating) == ("198.18.0.1", 30000, True, False)
    assert (proxy.kind, proxy.host) == ("hostname", "x.example")


def test_probe_state_decides_endpoint_readiness() -> None:
    r, prober, sink, _ = make()
    prober.states["u1"] = ContainerProbeState(name="srv", started=True, ready=False,
                                              liveness_failed=False)
    state = r.running(uid="u1", pod=pod(), provider="mock", instance=instance())
    assert state is not None and not state.ready
    assert sink.pods["u1"]["endpoints"][0].ready is False
    prober.states["u1"] = ContainerProbeState(name="srv", started=True, ready=True,
                                              liveness_failed=False)
    r.running(uid="u1", pod=pod(), provider="mock", instance=instance())
    assert sink.pods["u1"]["endpoints"][0].ready is True


def test_a_restart_or_new_instance_tracks_afresh() -> None:
    r, prober, _, clock = make()
    r.running(uid="u1", pod=pod(), provider="mock", instance=instance())
    clock.now += 10
    r.running(uid="u1", pod=pod(), provider="mock", instance=instance(restarts=1))
    assert prober.tracks == 2 and prober.tracked["u1"][2] == 110.0
    r.running(uid="u1", pod=pod(), provider="mock", instance=instance(restarts=1, iid="i-2"))
    assert prober.tracks == 3


def test_no_probes_no_tracking() -> None:
    r, prober, sink, _ = make()
    assert r.running(uid="u1", pod=pod(probe=False), provider="mock",
                     instance=instance()) is None
    assert prober.tracks == 0
    assert sink.pods["u1"]["endpoints"][0].ready is True


def test_drain_marks_terminating_then_counts_down_within_the_grace_period() -> None:
    r, _, sink, clock = make()
    r.running(uid="u1", pod=pod(probe=False), provider="mock", instance=instance())
    assert r.drain_left(uid="u1", pod=pod(grace=30), instance=instance(), was_ready=True) == 5.0
    ep = sink.pods["u1"]["endpoints"][0]
    assert (ep.ready, ep.serving, ep.terminating) == (False, True, True)
    clock.now += 3
    assert r.drain_left(uid="u1", pod=pod(grace=30), instance=instance(), was_ready=True) == 2.0
    clock.now += 3
    assert r.drain_left(uid="u1", pod=pod(grace=30), instance=instance(), was_ready=True) == 0.0
    r.forget("u1")
    assert "u1" not in sink.pods


def test_no_drain_for_unready_pods_or_grace_zero() -> None:
    r, _, _, _ = make()
    assert r.drain_left(uid="u1", pod=pod(grace=30), instance=instance(), was_ready=False) == 0
    assert r.drain_left(uid="u2", pod=pod(grace=0), instance=instance(), was_ready=True) == 0
    assert r.drain_left(uid="u3", pod=pod(grace=2), instance=instance(), was_ready=True) == 2.0


def test_stopped_forgets_probes_and_unpublishes_readiness() -> None:
    r, prober, sink, _ = make()
    r.running(uid="u1", pod=pod(), provider="mock", instance=instance())
    r.stopped(uid="u1", pod=pod(), instance=instance())
    assert "u1" not in prober.tracked
    assert sink.pods["u1"]["endpoints"][0].ready is False


def test_a_new_process_keeps_a_ready_replica_ready_until_its_probes_say_otherwise() -> None:
    r, prober, _, _ = make()
    ready_pod = pod()
    ready_pod["metadata"]["annotations"] = {"vkprovider.io/instance-id": "i-1"}
    ready_pod["status"] = {"containerStatuses": [{"ready": True, "restartCount": 0}]}
    r.running(uid="u1", pod=ready_pod, provider="mock", instance=instance())
    assert prober.assumed is True
    r2, prober2, _, _ = make()
    r2.running(uid="u1", pod=ready_pod, provider="mock", instance=instance(iid="i-9"))
    assert prober2.assumed is False, "another instance: its probes start from zero"


def test_under_traffic_gateway_probes_go_to_the_edge_the_gateway_sends_traffic_to() -> None:
    """Issue 38, item 5: a replica whose policy says ``traffic: gateway`` and whose cloud
    offers a TLS edge beside its IP:port (RunPod's proxy) is served through that edge
    (node/slicebodies.py), so it is probed there too, not at the IP:port no traffic uses; the
    mode is asked at every probe, so a policy edit moves the probes with the traffic."""
    r, prober, _, _ = make()
    gateway = {"u1": True}
    r.via_edge = lambda uid: gateway.get(uid, False)
    r.running(uid="u1", pod=pod(), provider="mock", instance=instance())
    _, target, _ = prober.tracked["u1"]
    assert target(8000) == ("x.example", 443, "https")
    gateway["u1"] = False  # the policy says auto again: the IP:port, as the traffic
    assert target(8000) == ("198.18.0.1", 30000, None)
    # an IP:port replica with no edge is probed at its IP:port whatever the mode (the gateway
    # dials that IP:port too)
    gateway["u2"] = True
    ip_only = Instance(id="i-2", name="n", provider="mock", state=InstanceState.RUNNING,
                       published=(PublishedPort(container_port=8000, host="198.18.0.2",
                                                port=30001, kind="ip"),))
    r.running(uid="u2", pod=pod(), provider="mock", instance=ip_only)
    _, target2, _ = prober.tracked["u2"]
    assert target2(8000) == ("198.18.0.2", 30001, None)
    # a cloud that lists the edge first: the IP:port still takes the traffic (and the probes)
    # unless the gateway fronts the replica through the edge
    edge_first = Instance(id="i-3", name="n", provider="mock", state=InstanceState.RUNNING,
                          published=tuple(reversed(instance().published)))
    r.running(uid="u3", pod=pod(), provider="mock", instance=edge_first)
    _, target3, _ = prober.tracked["u3"]
    assert target3(8000) == ("198.18.0.1", 30000, None)
    gateway["u3"] = True
    assert target3(8000) == ("x.example", 443, "https")

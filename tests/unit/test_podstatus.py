"""Unit tests for vkprovider.node.podstatus: the pod status derived from the cloud's instance."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from providers.base import Instance, InstanceState, PublishedPort
from vkprovider.node.podstatus import (
    compute_status,
    config_pending_status,
    failed_status,
    format_time,
    instance_annotations,
    status_changed,
)

NODE = "vk-gpu-burst"
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=1)
T2 = T0 + timedelta(minutes=2)
T3 = T0 + timedelta(minutes=3)


def ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_pod(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "llm-0", "namespace": "infer", "uid": "uid-1"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "server", "image": "ghcr.io/acme/llm:1.2",
                            "ports": [{"containerPort": 8000}]}],
        },
        "status": status if status is not None else {"phase": "Pending", "qosClass": "Burstable"},
    }


def make_instance(state: InstanceState, **kw: Any) -> Instance:
    fields: dict[str, Any] = {
        "id": "i-123",
        "name": f"{NODE}-uid-1",
        "provider": "runpod",
        "state": state,
        "gpu_type": "H100",
        "gpu_count": 1,
        "region": "eu-west",
        "price_per_hour": 2.49,
    }
    fields.update(kw)
    if fields.get("ip") and "published" not in kw:  # the cloud maps port 8000 one-to-one
        fields["published"] = (PublishedPort(container_port=8000, host=fields["ip"], port=8000,
                                             kind="ip"),)
    return Instance(**fields)


def status_for(
    pod: dict[str, Any], instance: Instance | None, now: datetime = T1
) -> dict[str, Any]:
    return compute_status(pod=pod, instance=instance, node_name=NODE, now=now)


def advance(pod: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The pod after its status was patched."""
    new = copy.deepcopy(pod)
    new["status"] = status
    return new


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    matches = [c for c in status["conditions"] if c["type"] == ctype]
    assert len(matches) == 1, ctype
    found: dict[str, Any] = matches[0]
    return found


def cs(status: dict[str, Any]) -> dict[str, Any]:
    statuses = status["containerStatuses"]
    assert len(statuses) == 1
    found: dict[str, Any] = statuses[0]
    return found


# --------------------------------------------------------------------------------------------
# format_time


def test_format_time_is_utc_seconds() -> None:
    assert (
        format_time(datetime(2024, 5, 1, 12, 0, 0, 999_999, tzinfo=UTC)) == "2024-05-01T12:00:00Z"
    )
    plus2 = timezone(timedelta(hours=2))
    assert format_time(datetime(2024, 5, 1, 14, 0, 0, tzinfo=plus2)) == "2024-05-01T12:00:00Z"
    assert format_time(datetime(2024, 5, 1, 12, 0, 0)) == "2024-05-01T12:00:00Z"  # naive = UTC


# --------------------------------------------------------------------------------------------
# Phases and container states


def test_no_instance_is_pending_container_creating() -> None:
    status = status_for(make_pod(), None)
    assert status["phase"] == "Pending"
    assert status["startTime"] == ts(T1)
    assert cs(status)["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert cs(status)["ready"] is False
    assert cs(status)["started"] is False
    assert cs(status)["name"] == "server"
    assert cs(status)["image"] == "ghcr.io/acme/llm:1.2"
    assert cs(status)["imageID"] == ""
    assert "containerID" not in cs(status)
    assert cond(status, "PodScheduled")["status"] == "True"
    assert cond(status, "Initialized")["status"] == "True"
    assert cond(status, "ContainersReady")["status"] == "False"
    ready = cond(status, "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == "ContainersNotReady"
    assert ready["message"] == "containers with unready status: [server]"
    assert "podIP" not in status
    assert status["qosClass"] == "Burstable"  # set by the API server; kept


def test_pending_instance_carries_its_message() -> None:
    inst = make_instance(InstanceState.PENDING, message="pulling image")
    status = status_for(make_pod(), inst)
    assert status["phase"] == "Pending"
    assert cs(status)["state"] == {
        "waiting": {"reason": "ContainerCreating", "message": "pulling image"}
    }
    assert cs(status)["containerID"] == "vkprovider://i-123"


def test_running_instance() -> None:
    inst = make_instance(InstanceState.RUNNING, ip="203.0.113.7", started_at=T0, restart_count=2)
    status = status_for(make_pod(), inst)
    assert status["phase"] == "Running"
    c = cs(status)
    assert c["state"] == {"running": {"startedAt": ts(T0)}}
    assert c["ready"] is True
    assert c["started"] is True
    assert c["restartCount"] == 2
    assert c["containerID"] == "vkprovider://i-123"
    assert status["podIP"] == "203.0.113.7"
    assert status["podIPs"] == [{"ip": "203.0.113.7"}]
    assert status["hostIP"] == "203.0.113.7"
    assert status["hostIPs"] == [{"ip": "203.0.113.7"}]
    for ctype in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        assert cond(status, ctype)["status"] == "True"
        assert "reason" not in cond(status, ctype)


def test_running_without_started_at_keeps_first_seen_time() -> None:
    pod = make_pod()
    inst = make_instance(InstanceState.RUNNING)
    first = status_for(pod, inst, T1)
    assert cs(first)["state"]["running"]["startedAt"] == ts(T1)
    second = status_for(advance(pod, first), inst, T2)
    assert cs(second)["state"]["running"]["startedAt"] == ts(T1)
    assert second["startTime"] == first["startTime"] == ts(T1)
    assert not status_changed(first, second)


def test_pod_ip_only_when_every_declared_port_maps_one_to_one() -> None:
    remapped = make_instance(InstanceState.RUNNING, ip="100.64.0.9", published=(
        PublishedPort(container_port=8000, host="198.18.0.9", port=30000, kind="ip"),))
    status = status_for(make_pod(), remapped)
    assert "podIP" not in status and "podIPs" not in status
    assert status["hostIP"] == "100.64.0.9"
    proxied = make_instance(InstanceState.RUNNING, ip="198.18.0.9", published=(
        PublishedPort(container_port=8000, host="198.18.0.9", port=8000, kind="ip",
                      scheme="https"),))
    assert "podIP" not in status_for(make_pod(), proxied)
    no_ports = make_pod()
    no_ports["spec"]["containers"][0].pop("ports")
    assert "podIP" not in status_for(no_ports, make_instance(InstanceState.RUNNING,
                                                             ip="203.0.113.7"))
    hostname = make_instance(InstanceState.RUNNING, published=(
        PublishedPort(container_port=8000, host="x.example", port=8000, kind="hostname"),))
    assert "podIP" not in status_for(make_pod(), hostname)


def test_probes_decide_started_and_ready() -> None:
    inst = make_instance(InstanceState.RUNNING, ip="203.0.113.7", started_at=T0)
    loading = compute_status(pod=make_pod(), instance=inst, node_name=NODE, now=T1,
                             probe_started=True, probe_ready=False)
    assert loading["phase"] == "Running"
    assert cs(loading)["ready"] is False and cs(loading)["started"] is True
    assert cond(loading, "Ready")["status"] == "False"
    assert cond(loading, "ContainersReady")["reason"] == "ContainersNotReady"
    starting = compute_status(pod=make_pod(), instance=inst, node_name=NODE, now=T1,
                              probe_started=False, probe_ready=False)
    assert cs(starting)["started"] is False
    ready = compute_status(pod=advance(make_pod(), loading), instance=inst, node_name=NODE,
                           now=T2, probe_started=True, probe_ready=True)
    assert cond(ready, "Ready")["status"] == "True"
    assert cond(ready, "Ready")["lastTransitionTime"] == ts(T2)
    assert status_changed(loading, ready)


def test_ip_is_kept_when_the_cloud_stops_reporting_it() -> None:
    pod = make_pod()
    first = status_for(pod, make_instance(InstanceState.RUNNING, ip="198.51.100.1"))
    second = status_for(advance(pod, first), make_instance(InstanceState.RUNNING, ip=None))
    assert second["podIP"] == "198.51.100.1"


def test_succeeded_instance() -> None:
    inst = make_instance(InstanceState.SUCCEEDED, exit_code=0, started_at=T0, finished_at=T2)
    status = status_for(make_pod(), inst, T3)
    assert status["phase"] == "Succeeded"
    assert cs(status)["state"] == {
        "terminated": {
            "exitCode": 0,
            "reason": "Completed",
            "startedAt": ts(T0),
            "finishedAt": ts(T2),
        }
    }
    assert cs(status)["ready"] is False
    assert cs(status)["started"] is False
    assert cond(status, "Ready")["reason"] == "PodCompleted"
    assert cond(status, "ContainersReady")["reason"] == "PodCompleted"


def test_failed_instance() -> None:
    inst = make_instance(InstanceState.FAILED, exit_code=3, message="OOM", started_at=T0)
    status = status_for(make_pod(), inst, T3)
    assert status["phase"] == "Failed"
    assert cs(status)["state"] == {
        "terminated": {
            "exitCode": 3,
            "reason": "Error",
            "message": "OOM",
            "startedAt": ts(T0),
            "finishedAt": ts(T3),  # the cloud did not say: first seen
        }
    }
    assert cond(status, "Ready")["reason"] == "PodFailed"


def test_failed_instance_without_exit_code_reports_one() -> None:
    status = status_for(make_pod(), make_instance(InstanceState.FAILED, message="preempted"))
    terminated = cs(status)["state"]["terminated"]
    assert terminated["exitCode"] == 1
    assert terminated["reason"] == "Error"
    assert "startedAt" not in terminated


def test_terminated_keeps_the_running_start_time() -> None:
    pod = make_pod()
    running = status_for(pod, make_instance(InstanceState.RUNNING), T1)
    done = status_for(advance(pod, running), make_instance(InstanceState.SUCCEEDED), T3)
    assert cs(done)["state"]["terminated"]["startedAt"] == ts(T1)
    assert cs(done)["state"]["terminated"]["exitCode"] == 0


def test_pending_straight_to_succeeded_is_allowed() -> None:
    status = status_for(make_pod(), make_instance(InstanceState.SUCCEEDED, exit_code=0))
    assert status["phase"] == "Succeeded"


# --------------------------------------------------------------------------------------------
# Monotonic phase


def _running_pod() -> dict[str, Any]:
    pod = make_pod()
    inst = make_instance(InstanceState.RUNNING, ip="203.0.113.7", started_at=T0)
    return advance(pod, status_for(pod, inst, T1))


@pytest.mark.parametrize(
    "instance",
    [
        pytest.param(make_instance(InstanceState.PENDING, restart_count=1), id="pending"),
        pytest.param(None, id="no instance"),
    ],
)
def test_running_never_goes_back_to_pending(instance: Instance | None) -> None:
    pod = _running_pod()
    status = status_for(pod, instance, T2)
    assert status["phase"] == "Running"
    assert cs(status)["ready"] is False
    assert "waiting" in cs(status)["state"]
    assert cond(status, "Ready")["status"] == "False"
    assert cond(status, "Ready")["lastTransitionTime"] == ts(T2)
    assert status["podIP"] == "203.0.113.7"
    assert cs(status)["containerID"] == "vkprovider://i-123"


def test_restart_count_never_decreases() -> None:
    pod = make_pod()
    first = status_for(pod, make_instance(InstanceState.RUNNING, restart_count=3))
    second = status_for(advance(pod, first), make_instance(InstanceState.RUNNING, restart_count=0))
    assert cs(second)["restartCount"] == 3


@pytest.mark.parametrize("terminal", ["Succeeded", "Failed"])
@pytest.mark.parametrize(
    "instance",
    [
        pytest.param(make_instance(InstanceState.RUNNING), id="running"),
        pytest.param(make_instance(InstanceState.PENDING), id="pending"),
        pytest.param(make_instance(InstanceState.FAILED, exit_code=9), id="failed"),
        pytest.param(make_instance(InstanceState.SUCCEEDED, exit_code=0), id="succeeded"),
        pytest.param(make_instance(InstanceState.TERMINATING), id="terminating"),
        pytest.param(None, id="none"),
    ],
)
def test_terminal_phase_is_final(terminal: str, instance: Instance | None) -> None:
    done = {
        "phase": terminal,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ts(T0)}],
        "containerStatuses": [{"name": "server", "state": {"terminated": {"exitCode": 7}}}],
    }
    pod = make_pod(copy.deepcopy(done))
    assert status_for(pod, instance, T3) == done


def test_terminating_keeps_running_but_not_ready() -> None:
    pod = _running_pod()
    status = status_for(pod, make_instance(InstanceState.TERMINATING), T2)
    assert status["phase"] == "Running"
    assert cs(status)["state"] == {"running": {"startedAt": ts(T0)}}
    assert cs(status)["ready"] is False
    assert cond(status, "Ready")["status"] == "False"


def test_terminating_keeps_pending() -> None:
    status = status_for(make_pod(), make_instance(InstanceState.TERMINATING), T2)
    assert status["phase"] == "Pending"
    assert "waiting" in cs(status)["state"]


def test_pod_of_another_node_is_left_alone() -> None:
    pod = make_pod()
    pod["spec"]["nodeName"] = "real-node-1"
    assert status_for(pod, make_instance(InstanceState.RUNNING)) == pod["status"]


# --------------------------------------------------------------------------------------------
# Conditions


def test_last_transition_time_preserved_while_status_unchanged() -> None:
    pod = make_pod()
    pending = status_for(pod, None, T0)
    running = status_for(advance(pod, pending), make_instance(InstanceState.RUNNING), T1)
    again = status_for(advance(pod, running), make_instance(InstanceState.RUNNING), T2)
    assert cond(running, "PodScheduled")["lastTransitionTime"] == ts(T0)  # always True
    assert cond(running, "Ready")["lastTransitionTime"] == ts(T1)  # False -> True
    assert cond(again, "Ready")["lastTransitionTime"] == ts(T1)  # unchanged
    assert again == running


def test_foreign_conditions_are_carried_over() -> None:
    gate = {"type": "example.com/warm", "status": "False", "lastTransitionTime": ts(T0)}
    pod = make_pod({"phase": "Pending", "conditions": [gate]})
    status = status_for(pod, make_instance(InstanceState.RUNNING))
    assert gate in status["conditions"]
    assert [c["type"] for c in status["conditions"]][:4] == [
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
    ]


def test_readiness_gates_hold_ready_back() -> None:
    pod = make_pod({"phase": "Pending", "conditions": []})
    pod["spec"]["readinessGates"] = [{"conditionType": "example.com/warm"}]
    status = status_for(pod, make_instance(InstanceState.RUNNING))
    assert cond(status, "ContainersReady")["status"] == "True"
    assert cond(status, "Ready")["status"] == "False"
    assert cond(status, "Ready")["reason"] == "ReadinessGatesNotReady"

    pod["status"]["conditions"] = [{"type": "example.com/warm", "status": "True"}]
    status = status_for(pod, make_instance(InstanceState.RUNNING))
    assert cond(status, "Ready")["status"] == "True"


# --------------------------------------------------------------------------------------------
# Annotations


def test_instance_annotations() -> None:
    inst = make_instance(
        InstanceState.RUNNING, endpoints=("https://a.example:8000", "203.0.113.7:22")
    )
    assert instance_annotations(inst) == {
        "vkprovider.io/provider": "runpod",
        "vkprovider.io/instance-id": "i-123",
        "vkprovider.io/region": "eu-west",
        "vkprovider.io/gpu-type": "H100",
        "vkprovider.io/price-per-hour": "2.49",
        "vkprovider.io/endpoints": "https://a.example:8000,203.0.113.7:22",
        "vkprovider.io/ports": "",  # the cloud reported no per-port mapping
    }


def test_instance_annotations_unknowns_are_empty() -> None:
    inst = make_instance(InstanceState.PENDING, region=None, gpu_type=None, price_per_hour=0.0)
    ann = instance_annotations(inst)
    assert ann["vkprovider.io/region"] == ""
    assert ann["vkprovider.io/gpu-type"] == ""
    assert ann["vkprovider.io/endpoints"] == ""
    assert ann["vkprovider.io/price-per-hour"] == "0"
    assert all(k.startswith("vkprovider.io/") for k in ann)


@pytest.mark.parametrize(
    ("price", "text"),
    [(0.44, "0.44"), (1e-05, "0.00001"), (2.0, "2"), (100.0, "100"), (12.3456, "12.3456")],
)
def test_price_is_a_plain_decimal(price: float, text: str) -> None:
    inst = make_instance(InstanceState.RUNNING, price_per_hour=price)
    assert instance_annotations(inst)["vkprovider.io/price-per-hour"] == text


# --------------------------------------------------------------------------------------------
# Failed before any cloud call / config pending


def test_failed_status() -> None:
    status = failed_status(
        pod=make_pod(),
        reason="UnsupportedPodSpec",
        message="spec.volumes[1].hostPath: not supported",
        now=T1,
    )
    assert status["phase"] == "Failed"
    assert status["reason"] == "UnsupportedPodSpec"
    assert status["message"] == "spec.volumes[1].hostPath: not supported"
    assert status["startTime"] == ts(T1)
    assert cs(status)["state"] == {
        "terminated": {
            "exitCode": 1,
            "reason": "UnsupportedPodSpec",
            "message": "spec.volumes[1].hostPath: not supported",
            "finishedAt": ts(T1),
        }
    }
    assert cs(status)["ready"] is False
    assert cond(status, "Ready")["reason"] == "PodFailed"
    assert status["qosClass"] == "Burstable"


def test_failed_status_keeps_a_terminal_pod() -> None:
    done = {"phase": "Succeeded"}
    assert failed_status(pod=make_pod(done), reason="X", message="y", now=T1) == done


def test_config_pending_status() -> None:
    msg = 'secret "infer/creds" not found'
    status = config_pending_status(pod=make_pod(), message=msg, now=T1)
    assert status["phase"] == "Pending"
    assert "reason" not in status
    assert cs(status)["state"] == {
        "waiting": {"reason": "CreateContainerConfigError", "message": msg}
    }
    assert cond(status, "Ready")["status"] == "False"


def test_config_pending_after_failure_clears_pod_reason() -> None:
    pod = make_pod({"phase": "Pending", "reason": "Old", "message": "old"})
    status = config_pending_status(pod=pod, message="m", now=T1)
    assert "reason" not in status and "message" not in status


def test_config_pending_never_moves_back_or_out_of_terminal() -> None:
    running = _running_pod()
    assert config_pending_status(pod=running, message="m", now=T2)["phase"] == "Running"
    failed = make_pod({"phase": "Failed", "reason": "X"})
    assert config_pending_status(pod=failed, message="m", now=T2) == {
        "phase": "Failed",
        "reason": "X",
    }


# --------------------------------------------------------------------------------------------
# status_changed


def _base() -> dict[str, Any]:
    return status_for(make_pod(), make_instance(InstanceState.RUNNING, ip="10.0.0.1"), T1)


def test_status_changed_identical() -> None:
    assert status_changed(_base(), _base()) is False


def test_status_changed_ignores_transition_and_probe_times() -> None:
    old, new = _base(), _base()
    for c in new["conditions"]:
        c["lastTransitionTime"] = ts(T3)
        c["lastProbeTime"] = ts(T3)
    assert status_changed(old, new) is False


def test_status_changed_ignores_order_nulls_and_extra_server_fields() -> None:
    old, new = _base(), _base()
    old["conditions"].reverse()
    for c in old["conditions"]:
        del c["lastProbeTime"]  # the API server may drop nulls
    del new["qosClass"]  # a field new does not set stays as it is
    old["containerStatuses"][0]["volumeMounts"] = []
    assert status_changed(old, new) is False


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda s: s.update(phase="Succeeded"), id="phase"),
        pytest.param(lambda s: s["conditions"][3].update(status="False"), id="condition"),
        pytest.param(lambda s: s["containerStatuses"][0].update(ready=False), id="ready"),
        pytest.param(lambda s: s["containerStatuses"][0].update(restartCount=1), id="restarts"),
        pytest.param(lambda s: s.update(podIP="10.0.0.2"), id="ip"),
        pytest.param(
            lambda s: s["containerStatuses"][0].update(state={"waiting": {"reason": "X"}}),
            id="state",
        ),
        pytest.param(
            lambda s: s["conditions"].append({"type": "Extra", "status": "True"}), id="new cond"
        ),
    ],
)
def test_status_changed_detects(mutate: Any) -> None:
    old, new = _base(), _base()
    mutate(new)
    assert status_changed(old, new) is True


def test_status_changed_from_an_empty_status() -> None:
    assert status_changed({}, _base()) is True
    assert status_changed({"phase": "Pending"}, status_for(make_pod(), None)) is True


def test_the_ports_annotation_says_how_each_container_port_is_reached_while_running() -> None:
    from dataclasses import replace

    from providers.base import PublishedPort
    from vkprovider.node.podstatus import published_ports

    inst = replace(make_instance(InstanceState.RUNNING), published=(
        PublishedPort(container_port=8000, host="198.18.0.7", port=30000, kind="ip"),
        PublishedPort(container_port=8080, host="abc-8080.proxy.example", port=443,
                      kind="hostname", scheme="https"),
        PublishedPort(container_port=9000, protocol="UDP", host="2001:db8::1", port=31000,
                      kind="ip")))
    assert published_ports(inst) == ("8000/TCP=198.18.0.7:30000,"
                                     "8080/TCP=https://abc-8080.proxy.example:443,"
                                     "9000/UDP=[2001:db8::1]:31000")
    assert published_ports(replace(inst, state=InstanceState.PENDING)) == ""

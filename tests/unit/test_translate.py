"""Unit tests for vkprovider.node.translate: pod dict -> InstanceSpec, and what is refused."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from providers.base import TAG_NAMESPACE, TAG_NODE, TAG_POD, TAG_UID, Port
from vkprovider.errors import PodConfigPending, PodRejected
from vkprovider.node.translate import RefSource, instance_name, translate, validate

NODE = "vk-gpu-burst"
UID = "0d6c2a8e-1111-2222-3333-444455556666"
SECRET_VALUE = "s3cr3t-v4lue"


class FakeRefs:
    """A dict-backed RefSource that counts reads."""

    def __init__(
        self,
        *,
        secrets: dict[tuple[str, str], dict[str, str]] | None = None,
        config_maps: dict[tuple[str, str], dict[str, str]] | None = None,
    ) -> None:
        self.secrets = secrets or {}
        self.config_maps = config_maps or {}
        self.reads: list[tuple[str, str, str]] = []

    async def secret(self, *, namespace: str, name: str) -> dict[str, str] | None:
        self.reads.append(("secret", namespace, name))
        return self.secrets.get((namespace, name))

    async def config_map(self, *, namespace: str, name: str) -> dict[str, str] | None:
        self.reads.append(("configMap", namespace, name))
        return self.config_maps.get((namespace, name))


def test_fake_refs_is_a_ref_source() -> None:
    refs: RefSource = FakeRefs()  # mypy checks the structural match
    assert hasattr(refs, "secret")


def make_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "llm-0",
            "namespace": "infer",
            "uid": UID,
            "labels": {"app": "llm"},
            "annotations": {"team": "ml"},
        },
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": "runner",
            "containers": [
                {
                    "name": "server",
                    "image": "ghcr.io/acme/llm:1.2",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
                    },
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-abcde",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "kube-api-access-abcde",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                }
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }


def c0(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def with_env(*entries: dict[str, Any]) -> dict[str, Any]:
    pod = make_pod()
    c0(pod)["env"] = list(entries)
    return pod


async def run(pod: dict[str, Any], refs: FakeRefs | None = None) -> Any:
    return await translate(pod=pod, node_name=NODE, refs=refs or FakeRefs())


# --------------------------------------------------------------------------------------------
# instance_name


def test_instance_name_is_deterministic() -> None:
    assert instance_name(node_name=NODE, pod_uid=UID) == f"{NODE}-{UID}"
    assert instance_name(node_name=NODE, pod_uid=UID) == instance_name(node_name=NODE, pod_uid=UID)


@pytest.mark.parametrize(("node", "uid"), [("", UID), (NODE, "")])
def test_instance_name_refuses_empty_parts(node: str, uid: str) -> None:
    with pytest.raises(ValueError):
        instance_name(node_name=node, pod_uid=uid)


# --------------------------------------------------------------------------------------------
# Rejections

Mutator = Callable[[dict[str, Any]], None]


def _set_resources(kind: str, name: str, value: object) -> Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        c0(pod).setdefault("resources", {}).setdefault(kind, {})[name] = value

    return mutate


def _add_volume(volume: dict[str, Any]) -> Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["volumes"].append(volume)

    return mutate


def _shm_volume(*, size: str | None = None, medium: str = "Memory",
                mount_path: str = "/dev/shm", also: str | None = None) -> Mutator:
    """A memory-backed emptyDir (as inference pods size their shared memory), mounted."""
    def mutate(pod: dict[str, Any]) -> None:
        empty_dir: dict[str, Any] = {"medium": medium} if medium else {}
        if size is not None:
            empty_dir["sizeLimit"] = size
        pod["spec"]["volumes"].append({"name": "dshm", "emptyDir": empty_dir})
        for path in (mount_path, *((also,) if also else ())):
            c0(pod)["volumeMounts"].append({"name": "dshm", "mountPath": path})

    return mutate


def _second_container(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})


REJECTIONS: list[tuple[str, Mutator, str, str]] = [
    ("two containers", _second_container, "UnsupportedPodSpec", "spec.containers"),
    (
        "no containers",
        lambda p: p["spec"].update(containers=[]),
        "UnsupportedPodSpec",
        "spec.containers",
    ),
    (
        "init container",
        lambda p: p["spec"].update(initContainers=[{"name": "init", "image": "busybox"}]),
        "UnsupportedPodSpec",
        "spec.initContainers",
    ),
    (
        "ephemeral container",
        lambda p: p["spec"].update(ephemeralContainers=[{"name": "dbg", "image": "busybox"}]),
        "UnsupportedPodSpec",
        "spec.ephemeralContainers",
    ),
    (
        "hostPath volume",
        _add_volume({"name": "host", "hostPath": {"path": "/var/lib"}}),
        "UnsupportedPodSpec",
        "spec.volumes[1].hostPath",
    ),
    (
        "pvc volume",
        _add_volume({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}),
        "UnsupportedPodSpec",
        "spec.volumes[1].persistentVolumeClaim",
    ),
    (
        "configMap volume",
        _add_volume({"name": "cfg", "configMap": {"name": "cfg"}}),
        "UnsupportedPodSpec",
        "spec.volumes[1].configMap",
    ),
    (
        "secret volume",
        _add_volume({"name": "creds", "secret": {"secretName": "creds"}}),
        "UnsupportedPodSpec",
        "spec.volumes[1].secret",
    ),
    (
        "emptyDir volume",
        _add_volume({"name": "scratch", "emptyDir": {}}),
        "UnsupportedPodSpec",
        "spec.volumes[1].emptyDir",
    ),
    (
        "memory emptyDir not at /dev/shm",
        _shm_volume(mount_path="/cache"),
        "UnsupportedPodSpec",
        "spec.volumes[1].emptyDir",
    ),
    (
        "memory emptyDir at /dev/shm and elsewhere",
        _shm_volume(also="/cache"),
        "UnsupportedPodSpec",
        "spec.volumes[1].emptyDir",
    ),
    (
        "disk emptyDir at /dev/shm",
        _shm_volume(medium=""),
        "UnsupportedPodSpec",
        "spec.volumes[1].emptyDir",
    ),
    (
        "unparsable /dev/shm size",
        _shm_volume(size="lots"),
        "InvalidResources",
        "spec.volumes[1].emptyDir.sizeLimit",
    ),
    (
        "zero /dev/shm size",
        _shm_volume(size="0"),
        "InvalidResources",
        "spec.volumes[1].emptyDir.sizeLimit",
    ),
    (
        "downwardAPI volume",
        _add_volume({"name": "info", "downwardAPI": {"items": []}}),
        "UnsupportedPodSpec",
        "spec.volumes[1].downwardAPI",
    ),
    (
        "projected volume with a secret",
        _add_volume(
            {
                "name": "mixed",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"path": "token"}},
                        {"secret": {"name": "creds"}},
                    ]
                },
            }
        ),
        "UnsupportedPodSpec",
        "spec.volumes[1].projected",
    ),
    (
        "projected volume without token",
        _add_volume({"name": "cm", "projected": {"sources": [{"configMap": {"name": "x"}}]}}),
        "UnsupportedPodSpec",
        "spec.volumes[1].projected",
    ),
    (
        "privileged",
        lambda p: c0(p).update(securityContext={"privileged": True}),
        "UnsupportedPodSpec",
        "spec.containers[0].securityContext.privileged",
    ),
    (
        "hostNetwork",
        lambda p: p["spec"].update(hostNetwork=True),
        "UnsupportedPodSpec",
        "spec.hostNetwork",
    ),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "UnsupportedPodSpec", "spec.hostPID"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "UnsupportedPodSpec", "spec.hostIPC"),
    (
        "volumeDevices",
        lambda p: c0(p).update(volumeDevices=[{"name": "blk", "devicePath": "/dev/xvda"}]),
        "UnsupportedPodSpec",
        "spec.containers[0].volumeDevices",
    ),
    (
        "missing image",
        lambda p: c0(p).pop("image"),
        "InvalidImageName",
        "spec.containers[0].image",
    ),
    (
        "empty image",
        lambda p: c0(p).update(image=""),
        "InvalidImageName",
        "spec.containers[0].image",
    ),
    (
        "blank image",
        lambda p: c0(p).update(image="   "),
        "InvalidImageName",
        "spec.containers[0].image",
    ),
    (
        "image with whitespace",
        lambda p: c0(p).update(image="nginx latest"),
        "InvalidImageName",
        "spec.containers[0].image",
    ),
    (
        "negative cpu",
        _set_resources("requests", "cpu", "-1"),
        "InvalidResources",
        "spec.containers[0].resources.requests[cpu]",
    ),
    (
        "unparsable memory",
        _set_resources("limits", "memory", "16 gigs"),
        "InvalidResources",
        "spec.containers[0].resources.limits[memory]",
    ),
    (
        "too much cpu",
        _set_resources("limits", "cpu", "4097"),
        "InvalidResources",
        "spec.containers[0].resources.limits[cpu]",
    ),
    (
        "too much memory",
        _set_resources("limits", "memory", "65Ti"),
        "InvalidResources",
        "spec.containers[0].resources.limits[memory]",
    ),
    (
        "too many gpus",
        _set_resources("limits", "nvidia.com/gpu", "1025"),
        "InvalidResources",
        "spec.containers[0].resources.limits[nvidia.com/gpu]",
    ),
    (
        "fractional gpus",
        _set_resources("limits", "nvidia.com/gpu", "1.5"),
        "InvalidResources",
        "spec.containers[0].resources.limits[nvidia.com/gpu]",
    ),
    (
        "milli gpus",
        _set_resources("limits", "nvidia.com/gpu", "500m"),
        "InvalidResources",
        "spec.containers[0].resources.limits[nvidia.com/gpu]",
    ),
    (
        "gpu request differs from limit",
        _set_resources("requests", "nvidia.com/gpu", "2"),
        "InvalidResources",
        "spec.containers[0].resources.requests[nvidia.com/gpu]",
    ),
    (
        "unparsable extended resource",
        _set_resources("limits", "ephemeral-storage", "lots"),
        "InvalidResources",
        "spec.containers[0].resources.limits[ephemeral-storage]",
    ),
    (
        "bad port",
        lambda p: c0(p).update(ports=[{"containerPort": 80}, {"containerPort": 70000}]),
        "UnsupportedPodSpec",
        "spec.containers[0].ports[1].containerPort",
    ),
    (
        "missing uid",
        lambda p: p["metadata"].pop("uid"),
        "UnsupportedPodSpec",
        "metadata.uid",
    ),
    (
        "env without name",
        lambda p: c0(p).update(env=[{"name": "A", "value": "1"}, {"value": "x"}]),
        "UnsupportedPodSpec",
        "spec.containers[0].env[1].name",
    ),
    (
        "unsupported downward field",
        lambda p: c0(p).update(
            env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.generation"}}}]
        ),
        "UnsupportedPodSpec",
        "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
    ),
    (
        "unsupported resource field",
        lambda p: c0(p).update(
            env=[
                {
                    "name": "X",
                    "valueFrom": {"resourceFieldRef": {"resource": "limits.ephemeral-storage"}},
                }
            ]
        ),
        "UnsupportedPodSpec",
        "spec.containers[0].env[0].valueFrom.resourceFieldRef.resource",
    ),
    (
        "resource field of another container",
        lambda p: c0(p).update(
            env=[
                {
                    "name": "X",
                    "valueFrom": {
                        "resourceFieldRef": {"resource": "limits.cpu", "containerName": "other"}
                    },
                }
            ]
        ),
        "UnsupportedPodSpec",
        "spec.containers[0].env[0].valueFrom.resourceFieldRef.containerName",
    ),
    (
        "zero divisor",
        lambda p: c0(p).update(
            env=[
                {
                    "name": "X",
                    "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}},
                }
            ]
        ),
        "InvalidResources",
        "spec.containers[0].env[0].valueFrom.resourceFieldRef.divisor",
    ),
    (
        "empty valueFrom",
        lambda p: c0(p).update(env=[{"name": "X", "valueFrom": {}}]),
        "UnsupportedPodSpec",
        "spec.containers[0].env[0].valueFrom",
    ),
    (
        "secretKeyRef without key",
        lambda p: c0(p).update(env=[{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}}]),
        "UnsupportedPodSpec",
        "spec.containers[0].env[0].valueFrom.secretKeyRef.key",
    ),
    (
        "envFrom with both sources",
        lambda p: c0(p).update(
            envFrom=[{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]
        ),
        "UnsupportedPodSpec",
        "spec.containers[0].envFrom[0]",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "reason", "field"),
    [pytest.param(m, r, f, id=name) for name, m, r, f in REJECTIONS],
)
async def test_rejections_name_reason_and_field(mutate: Mutator, reason: str, field: str) -> None:
    pod = make_pod()
    mutate(pod)
    with pytest.raises(PodRejected) as info:
        validate(pod)
    assert info.value.reason == reason
    assert info.value.field == field
    assert info.value.message
    # translate validates first and never reads a Secret for a rejected pod
    refs = FakeRefs()
    with pytest.raises(PodRejected) as again:
        await run(pod, refs)
    assert again.value.field == field
    assert refs.reads == []


def test_rejected_volume_message_names_volume_and_type() -> None:
    pod = make_pod()
    pod["spec"]["volumes"].append({"name": "host-data", "hostPath": {"path": "/data"}})
    with pytest.raises(PodRejected) as info:
        validate(pod)
    assert "host-data" in info.value.message
    assert "hostPath" in info.value.message


def test_init_container_message_says_unsupported() -> None:
    pod = make_pod()
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    with pytest.raises(PodRejected, match="not supported"):
        validate(pod)


def test_several_containers_message_names_them() -> None:
    pod = make_pod()
    _second_container(pod)
    with pytest.raises(PodRejected) as info:
        validate(pod)
    assert "2" in info.value.message
    assert "server" in info.value.message and "sidecar" in info.value.message


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda p: None, id="baseline"),
        pytest.param(lambda p: p["spec"].update(hostNetwork=False), id="hostNetwork false"),
        pytest.param(
            lambda p: c0(p).update(securityContext={"privileged": False, "runAsUser": 1000}),
            id="privileged false",
        ),
        pytest.param(lambda p: p["spec"].update(volumes=[]), id="no volumes"),
        pytest.param(lambda p: p["spec"].update(initContainers=[]), id="empty initContainers"),
        pytest.param(_set_resources("limits", "nvidia.com/gpu", "1024"), id="1024 gpus"),
        pytest.param(_set_resources("limits", "cpu", "4096"), id="4096 cpu"),
        pytest.param(_set_resources("limits", "memory", "64Ti"), id="64Ti memory"),
        pytest.param(_set_resources("requests", "nvidia.com/gpu", "1e0"), id="equal gpu request"),
        pytest.param(_set_resources("limits", "cpu", "0"), id="zero cpu"),
    ],
)
def test_accepted_pods(mutate: Mutator) -> None:
    pod = make_pod()
    mutate(pod)
    validate(pod)


# --------------------------------------------------------------------------------------------
# Translation: basics


async def test_translate_baseline() -> None:
    spec = await run(make_pod())
    assert spec.name == f"{NODE}-{UID}"
    assert spec.image == "ghcr.io/acme/llm:1.2"
    assert spec.gpu_count == 1
    assert spec.gpu_type is None
    assert spec.command is None
    assert spec.args is None
    assert dict(spec.env) == {}
    assert spec.ports == ()
    assert spec.cpu_millis == 4000
    assert spec.memory_bytes == 16 * 2**30
    assert spec.region is None
    assert dict(spec.tags) == {
        TAG_NODE: NODE,
        TAG_NAMESPACE: "infer",
        TAG_POD: "llm-0",
        TAG_UID: UID,
    }


async def test_translate_does_not_mutate_the_pod() -> None:
    pod = with_env({"name": "A", "value": "$(B)"})
    before = copy.deepcopy(pod)
    await run(pod)
    assert pod == before


async def test_command_args_and_ports() -> None:
    pod = make_pod()
    c0(pod).update(
        command=["python", "-m", "serve"],
        args=["--port", "8000"],
        ports=[
            {"containerPort": 8000, "name": "http"},
            {"containerPort": 9000, "protocol": "UDP"},
        ],
    )
    spec = await run(pod)
    assert spec.command == ("python", "-m", "serve")
    assert spec.args == ("--port", "8000")
    assert spec.ports == (
        Port(container_port=8000, protocol="TCP", name="http"),
        Port(container_port=9000, protocol="UDP", name=None),
    )


async def test_empty_command_is_none() -> None:
    pod = make_pod()
    c0(pod).update(command=[], args=[])
    spec = await run(pod)
    assert spec.command is None
    assert spec.args is None


async def test_resources_fall_back_to_requests() -> None:
    pod = make_pod()
    c0(pod)["resources"] = {
        "requests": {"nvidia.com/gpu": "2", "cpu": "1500m", "memory": "1G"},
    }
    spec = await run(pod)
    assert spec.gpu_count == 2
    assert spec.cpu_millis == 1500
    assert spec.memory_bytes == 10**9


async def test_limits_win_over_requests() -> None:
    pod = make_pod()
    c0(pod)["resources"] = {
        "limits": {"cpu": "2", "memory": "2Gi"},
        "requests": {"cpu": "500m", "memory": "1Gi"},
    }
    spec = await run(pod)
    assert spec.cpu_millis == 2000
    assert spec.memory_bytes == 2 * 2**30
    assert spec.gpu_count == 0


async def test_no_resources_means_zero() -> None:
    pod = make_pod()
    del c0(pod)["resources"]
    spec = await run(pod)
    assert (spec.gpu_count, spec.cpu_millis, spec.memory_bytes) == (0, 0, 0)


async def test_gpu_count_from_exponent_form() -> None:
    pod = make_pod()
    c0(pod)["resources"] = {"limits": {"nvidia.com/gpu": "8e0"}}
    assert (await run(pod)).gpu_count == 8


# --------------------------------------------------------------------------------------------
# GPU type


@pytest.mark.parametrize(
    ("annotation", "selector", "expected"),
    [
        ("H100", "NVIDIA-A100-SXM4-80GB", "H100"),  # annotation wins
        (None, "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("H100", None, "H100"),
        ("  ", "L4", "L4"),  # a blank annotation does not count
        (None, None, None),
    ],
)
async def test_gpu_type_precedence(
    annotation: str | None, selector: str | None, expected: str | None
) -> None:
    pod = make_pod()
    if annotation is not None:
        pod["metadata"]["annotations"]["vkprovider.io/gpu-type"] = annotation
    if selector is not None:
        pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": selector}
    assert (await run(pod)).gpu_type == expected


# --------------------------------------------------------------------------------------------
# Env: plain values and expansion


async def test_plain_env_and_expansion() -> None:
    pod = with_env(
        {"name": "HOST", "value": "db"},
        {"name": "URL", "value": "postgres://$(HOST):5432/$(MISSING)"},
        {"name": "ESCAPED", "value": "$$(HOST) costs $5 and $("},
        {"name": "EMPTY"},
    )
    c0(pod).update(command=["sh", "-c", "echo $(URL)"], args=["$(HOST)", "$$(HOST)"])
    spec = await run(pod)
    assert dict(spec.env) == {
        "HOST": "db",
        "URL": "postgres://db:5432/$(MISSING)",
        "ESCAPED": "$(HOST) costs $5 and $(",
        "EMPTY": "",
    }
    assert spec.command == ("sh", "-c", "echo postgres://db:5432/$(MISSING)")
    assert spec.args == ("db", "$(HOST)")


async def test_expansion_sees_only_earlier_variables() -> None:
    pod = with_env({"name": "A", "value": "$(B)"}, {"name": "B", "value": "b"})
    spec = await run(pod)
    assert spec.env["A"] == "$(B)"


# --------------------------------------------------------------------------------------------
# Env: Secret and ConfigMap references


def _key_ref(kind: str, name: str, key: str, optional: bool | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": name, "key": key}
    if optional is not None:
        ref["optional"] = optional
    return {kind: ref}


async def test_secret_and_config_map_key_refs() -> None:
    refs = FakeRefs(
        secrets={("infer", "creds"): {"token": SECRET_VALUE}},
        config_maps={("infer", "settings"): {"level": "debug"}},
    )
    pod = with_env(
        {"name": "TOKEN", "valueFrom": _key_ref("secretKeyRef", "creds", "token")},
        {"name": "LEVEL", "valueFrom": _key_ref("configMapKeyRef", "settings", "level")},
    )
    spec = await run(pod, refs)
    assert dict(spec.env) == {"TOKEN": SECRET_VALUE, "LEVEL": "debug"}
    assert SECRET_VALUE not in repr(spec)


async def test_valuefrom_values_are_not_expanded() -> None:
    refs = FakeRefs(secrets={("infer", "creds"): {"token": "$(A)"}})
    pod = with_env(
        {"name": "A", "value": "a"},
        {"name": "T", "valueFrom": _key_ref("secretKeyRef", "creds", "token")},
    )
    assert (await run(pod, refs)).env["T"] == "$(A)"


@pytest.mark.parametrize(
    ("kind", "objects_field", "missing_key", "expected_message"),
    [
        ("secretKeyRef", "secrets", False, 'secret "infer/creds" not found'),
        ("secretKeyRef", "secrets", True, 'key "token" not found in secret "infer/creds"'),
        ("configMapKeyRef", "config_maps", False, 'configMap "infer/creds" not found'),
        (
            "configMapKeyRef",
            "config_maps",
            True,
            'key "token" not found in configMap "infer/creds"',
        ),
    ],
)
async def test_missing_required_ref_is_config_pending(
    kind: str, objects_field: str, missing_key: bool, expected_message: str
) -> None:
    refs = FakeRefs()
    if missing_key:
        getattr(refs, objects_field)[("infer", "creds")] = {"other": SECRET_VALUE}
    pod = with_env(
        {"name": "A", "value": "1"},
        {"name": "B", "value": "2"},
        {"name": "TOKEN", "valueFrom": _key_ref(kind, "creds", "token")},
    )
    with pytest.raises(PodConfigPending) as info:
        await run(pod, refs)
    err = info.value
    assert err.field == f"spec.containers[0].env[2].valueFrom.{kind}"
    assert err.message == expected_message
    assert err.reason == "CreateContainerConfigError"
    assert SECRET_VALUE not in str(err)
    assert SECRET_VALUE not in repr(err)


async def test_optional_false_is_required() -> None:
    pod = with_env({"name": "T", "valueFrom": _key_ref("secretKeyRef", "nope", "k", False)})
    with pytest.raises(PodConfigPending):
        await run(pod)


@pytest.mark.parametrize("kind", ["secretKeyRef", "configMapKeyRef"])
@pytest.mark.parametrize("object_exists", [False, True])
async def test_optional_missing_ref_is_skipped(kind: str, object_exists: bool) -> None:
    refs = FakeRefs()
    if object_exists:  # the object exists but not the key
        refs.secrets[("infer", "creds")] = {"other": "x"}
        refs.config_maps[("infer", "creds")] = {"other": "x"}
    pod = with_env(
        {"name": "TOKEN", "value": "default"},
        {"name": "TOKEN", "valueFrom": _key_ref(kind, "creds", "token", True)},
        {"name": "AFTER", "value": "yes"},
    )
    spec = await run(pod, refs)
    # skipped: the earlier plain value stays, and later entries still apply
    assert dict(spec.env) == {"TOKEN": "default", "AFTER": "yes"}


async def test_each_object_is_read_once() -> None:
    refs = FakeRefs(secrets={("infer", "creds"): {"a": "1", "b": "2"}})
    pod = with_env(
        {"name": "A", "valueFrom": _key_ref("secretKeyRef", "creds", "a")},
        {"name": "B", "valueFrom": _key_ref("secretKeyRef", "creds", "b")},
    )
    c0(pod)["envFrom"] = [{"secretRef": {"name": "creds"}}]
    await run(pod, refs)
    assert refs.reads == [("secret", "infer", "creds")]


async def test_refs_are_read_in_the_pod_namespace() -> None:
    refs = FakeRefs(secrets={("other", "creds"): {"a": "1"}})
    pod = with_env({"name": "A", "valueFrom": _key_ref("secretKeyRef", "creds", "a")})
    with pytest.raises(PodConfigPending):
        await run(pod, refs)
    assert refs.reads == [("secret", "infer", "creds")]


async def test_ref_source_errors_propagate() -> None:
    class Broken(FakeRefs):
        async def secret(self, *, namespace: str, name: str) -> dict[str, str] | None:
            raise RuntimeError("api down")

    pod = with_env({"name": "A", "valueFrom": _key_ref("secretKeyRef", "creds", "a")})
    with pytest.raises(RuntimeError, match="api down"):
        await translate(pod=pod, node_name=NODE, refs=Broken())


# --------------------------------------------------------------------------------------------
# Env: envFrom


async def test_env_from_prefix_and_override_order() -> None:
    refs = FakeRefs(
        secrets={("infer", "creds"): {"USER": "admin", "PASSWORD": SECRET_VALUE}},
        config_maps={("infer", "defaults"): {"USER": "guest", "LEVEL": "info", "MODE": "a"}},
    )
    pod = with_env({"name": "LEVEL", "value": "debug"}, {"name": "DB_USER", "value": "$(USER)"})
    c0(pod)["envFrom"] = [
        {"configMapRef": {"name": "defaults"}},
        {"secretRef": {"name": "creds"}},  # later envFrom overrides earlier (USER)
        {"prefix": "DB_", "secretRef": {"name": "creds"}},
    ]
    spec = await run(pod, refs)
    assert dict(spec.env) == {
        "USER": "admin",
        "LEVEL": "debug",  # env overrides envFrom
        "MODE": "a",
        "PASSWORD": SECRET_VALUE,
        "DB_USER": "admin",  # env overrides the prefixed envFrom entry, and expands $(USER)
        "DB_PASSWORD": SECRET_VALUE,
    }


async def test_env_from_skips_invalid_names() -> None:
    refs = FakeRefs(config_maps={("infer", "cm"): {"ok": "1", "bad=name": "2", "tab\tname": "3"}})
    pod = make_pod()
    c0(pod)["envFrom"] = [{"configMapRef": {"name": "cm"}}]
    assert dict((await run(pod, refs)).env) == {"ok": "1"}


@pytest.mark.parametrize(
    ("source", "kind"), [("secretRef", "secret"), ("configMapRef", "configMap")]
)
async def test_env_from_missing(source: str, kind: str) -> None:
    pod = make_pod()
    c0(pod)["envFrom"] = [
        {source: {"name": "gone", "optional": True}},
        {source: {"name": "also-gone"}},
    ]
    with pytest.raises(PodConfigPending) as info:
        await run(pod)
    assert info.value.field == f"spec.containers[0].envFrom[1].{source}"
    assert info.value.message == f'{kind} "infer/also-gone" not found'


async def test_env_from_optional_missing_is_skipped() -> None:
    refs = FakeRefs(config_maps={("infer", "cm"): {"A": "1"}})
    pod = make_pod()
    c0(pod)["envFrom"] = [
        {"secretRef": {"name": "gone", "optional": True}},
        {"configMapRef": {"name": "cm"}},
    ]
    assert dict((await run(pod, refs)).env) == {"A": "1"}


# --------------------------------------------------------------------------------------------
# Env: downward API


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "llm-0"),
        ("metadata.namespace", "infer"),
        ("metadata.uid", UID),
        ("metadata.labels['app']", "llm"),
        ("metadata.labels['absent']", ""),
        ("metadata.annotations['team']", "ml"),
        ("spec.nodeName", NODE),
        ("spec.serviceAccountName", "runner"),
        ("status.podIP", ""),
        ("status.hostIP", ""),
        ("status.podIPs", ""),
    ],
)
async def test_field_refs(path: str, expected: str) -> None:
    pod = with_env(
        {"name": "X", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
    )
    assert (await run(pod)).env["X"] == expected


def _resource_env(resource: str, divisor: str | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"resource": resource}
    if divisor is not None:
        ref["divisor"] = divisor
    return {"name": "X", "valueFrom": {"resourceFieldRef": ref}}


@pytest.mark.parametrize(
    ("resources", "resource", "divisor", "expected"),
    [
        ({"limits": {"cpu": "2500m"}}, "limits.cpu", None, "3"),  # rounded up
        ({"limits": {"cpu": "2500m"}}, "limits.cpu", "1m", "2500"),
        ({"limits": {"memory": "1Gi"}}, "limits.memory", None, str(2**30)),
        ({"limits": {"memory": "1Gi"}}, "limits.memory", "1Mi", "1024"),
        ({"requests": {"cpu": "250m"}}, "limits.cpu", "1m", "250"),  # limit falls back to request
        ({"limits": {"cpu": "2"}}, "requests.cpu", None, "2"),  # request defaults to limit
        ({"requests": {"memory": "1M"}}, "requests.memory", "1k", "1000"),
        ({}, "requests.cpu", None, "0"),
    ],
)
async def test_resource_field_refs(
    resources: dict[str, Any], resource: str, divisor: str | None, expected: str
) -> None:
    pod = with_env(_resource_env(resource, divisor))
    c0(pod)["resources"] = resources
    assert (await run(pod)).env["X"] == expected


async def test_resource_field_ref_without_any_value_is_unset() -> None:
    pod = with_env(_resource_env("limits.memory"))
    c0(pod)["resources"] = {"limits": {"cpu": "1"}}
    assert "X" not in (await run(pod)).env


async def test_resource_field_ref_naming_own_container() -> None:
    pod = with_env(
        {
            "name": "X",
            "valueFrom": {
                "resourceFieldRef": {"resource": "limits.cpu", "containerName": "server"}
            },
        }
    )
    assert (await run(pod)).env["X"] == "4"


# --------------------------------------------------------------------------------------------
# probes: run over the network, so exec is refused and ports must be declared


PROBE_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("readinessProbe", {"httpGet": {"path": "/health", "port": 8000}}, None),
    ("readinessProbe", {"httpGet": {"path": "/health", "port": "http"}}, None),
    ("livenessProbe", {"tcpSocket": {"port": "8000"}}, None),
    ("readinessProbe", {"exec": {"command": ["cat", "/ready"]}},
     "spec.containers[0].readinessProbe.exec"),
    ("startupProbe", {"httpGet": {"path": "/", "port": 9999}},
     "spec.containers[0].startupProbe.httpGet.port"),
    ("livenessProbe", {"tcpSocket": {"port": "metrics"}},
     "spec.containers[0].livenessProbe.tcpSocket.port"),
    ("readinessProbe", {"grpc": {"port": 50051}}, "spec.containers[0].readinessProbe.grpc.port"),
]


@pytest.mark.parametrize(("kind", "probe", "refused_field"), PROBE_CASES)
async def test_probes_are_refused_by_field_when_they_cannot_reach_the_instance(
    kind: str, probe: dict[str, Any], refused_field: str | None
) -> None:
    pod = make_pod()
    c0(pod)["ports"] = [{"name": "http", "containerPort": 8000}]
    c0(pod)[kind] = probe
    if refused_field is None:
        await run(pod)
        return
    with pytest.raises(PodRejected) as info:
        await run(pod)
    assert info.value.field == refused_field
    assert info.value.reason == "UnsupportedPodSpec"


async def test_an_exec_probe_is_ignored_when_the_policy_says_so() -> None:
    pod = make_pod()
    c0(pod)["livenessProbe"] = {"exec": {"command": ["true"]}}
    spec = await translate(pod=pod, node_name=NODE, refs=FakeRefs(), ignore_exec_probes=True)
    assert spec.image == c0(pod)["image"]


def _dockerconfig(registry: str, user: str, password: str) -> dict[str, str]:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {".dockerconfigjson": json.dumps({"auths": {registry: {"auth": auth}}})}


async def test_image_pull_secrets_become_the_instance_registry_auth() -> None:
    pod = make_pod()
    pod["spec"]["containers"][0]["image"] = "registry.example.com/team/llm:1"
    pod["spec"]["imagePullSecrets"] = [{"name": "missing"}, {"name": "other"},
                                       {"name": "regcred"}]
    refs = FakeRefs(secrets={
        ("infer", "other"): _dockerconfig("ghcr.io", "gh", "gh-pass"),
        ("infer", "regcred"): _dockerconfig("registry.example.com", "bot", "s3cret-pw"),
    })
    spec = await translate(pod=pod, node_name=NODE, refs=refs)
    assert spec.registry_auth is not None
    assert (spec.registry_auth.username, spec.registry_auth.password) == ("bot", "s3cret-pw")
    assert "s3cret-pw" not in repr(spec)
    assert ("secret", "infer", "missing") in refs.reads, "a missing Secret is skipped"


async def test_no_pull_secret_no_registry_auth() -> None:
    spec = await translate(pod=make_pod(), node_name=NODE, refs=FakeRefs())
    assert spec.registry_auth is None


async def test_a_malformed_pull_secret_keeps_the_pod_waiting_with_the_field_named() -> None:
    pod = make_pod()
    pod["spec"]["imagePullSecrets"] = [{"name": "broken"}]
    refs = FakeRefs(secrets={("infer", "broken"): {".dockerconfigjson": "{not json hunter2"}})
    with pytest.raises(PodConfigPending) as err:
        await translate(pod=pod, node_name=NODE, refs=refs)
    assert err.value.field == "spec.imagePullSecrets"
    assert "broken" in err.value.message and "hunter2" not in err.value.message


# --------------------------------------------------------------------------------------------
# Shared memory and the user


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(lambda p: None, None, id="no /dev/shm volume"),
        pytest.param(_shm_volume(size="8Gi"), 8 * 2**30, id="sizeLimit"),
        pytest.param(_shm_volume(size="32Gi"), 16 * 2**30, id="bounded by the memory limit"),
        pytest.param(_shm_volume(), 16 * 2**30, id="no sizeLimit: the memory limit"),
        pytest.param(_shm_volume(mount_path="/dev/shm/"), 16 * 2**30, id="trailing slash"),
    ],
)
async def test_a_memory_emptydir_at_dev_shm_sizes_shared_memory(
    mutate: Mutator, expected: int | None
) -> None:
    pod = make_pod()
    mutate(pod)
    spec = await run(pod)
    assert spec.shm_bytes == expected


async def test_an_unsized_dev_shm_without_a_memory_limit_is_the_instances_memory() -> None:
    pod = make_pod()
    del c0(pod)["resources"]["limits"]["memory"]
    c0(pod)["resources"]["requests"] = {"memory": "8Gi"}  # a request does not bound it
    _shm_volume()(pod)
    spec = await run(pod)
    assert spec.shm_bytes == 0


@pytest.mark.parametrize(
    ("pod_context", "container_context", "user", "group"),
    [
        ({}, {}, None, None),
        ({"runAsUser": 1000, "runAsGroup": 3000}, {}, 1000, 3000),
        ({"runAsUser": 1000, "runAsGroup": 3000}, {"runAsUser": 0}, 0, 3000),
        ({}, {"runAsGroup": 5}, None, 5),
    ],
)
async def test_run_as_user_and_group_the_containers_over_the_pods(
    pod_context: dict[str, Any], container_context: dict[str, Any], user: int | None,
    group: int | None,
) -> None:
    pod = make_pod()
    if pod_context:
        pod["spec"]["securityContext"] = pod_context
    if container_context:
        c0(pod)["securityContext"] = container_context
    spec = await run(pod)
    assert (spec.run_as_user, spec.run_as_group) == (user, group)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({}, None), ({"hostname": "llm"}, "llm"),
     ({"hostname": "llm", "hostnameOverride": "llm-0.example"}, "llm-0.example")],
)
async def test_the_hostname_override_wins_over_the_hostname(
    fields: dict[str, Any], expected: str | None
) -> None:
    pod = make_pod()
    pod["spec"].update(fields)
    assert (await run(pod)).hostname == expected

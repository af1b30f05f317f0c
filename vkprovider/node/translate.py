"""Turn a pod (a plain dict from the API server) into the InstanceSpec a cloud adapter runs.

Why it exists: this is the one place that decides what of a pod a GPU cloud can honour. Anything no
cloud can do is refused here, before any cloud call, with a ``PodRejected`` that names the exact
pod field (so the pod is failed with a clear reason and a Warning event); a missing Secret or
ConfigMap raises ``PodConfigPending`` so the pod waits like the kubelet's
``CreateContainerConfigError``. Everything else is mapped: image, command/args (with ``$(VAR)``
expansion), env (plain, Secret/ConfigMap refs, downward API, resource fields, ``envFrom``), ports,
GPU count and type, cpu and memory, the size of ``/dev/shm`` (a memory-backed emptyDir mounted
there, the only volume besides the service-account token), the user and group
(``runAsUser``/``runAsGroup``), and the tags that let a restart adopt the instance.

What is refused and what is dropped with a warning is decided in one table,
:mod:`vkprovider.node.fidelity`: the simple refusals (a flag that is true, a list that is not
empty) are checked straight from it, the others here, each under an entry of that table. The
fields the pod sets that the cloud will not honour are handed to ``on_dropped`` (the pod
controller turns them into one ``FieldsDropped`` Warning event).

Validation lives in :mod:`vkprovider.node.podvalidate` and the environment in
:mod:`vkprovider.node.podenv`. The only I/O is reading Secrets and ConfigMaps through the
injected ``RefSource``; each object is read at most once per translation. Secret values end up in
``InstanceSpec.env`` (whose repr hides them) and never in an error message.

Decisions worth knowing:

* GPU type: the annotation ``vkprovider.io/gpu-type`` wins over the nodeSelector
  ``nvidia.com/gpu.product``: the annotation is the provider-specific, explicit choice, while the
  nodeSelector is usually written for internal nodes.
* GPU count, cpu and memory come from limits, else requests. If both set ``nvidia.com/gpu`` they
  must be equal (an extended resource cannot be overcommitted).
* A missing or blank image is rejected with reason ``InvalidImageName`` (the kubelet's own reason
  for a bad image reference); other unsupported features use ``UnsupportedPodSpec``; bad
  quantities use ``InvalidResources``.
* ``resourceFieldRef`` on ``limits.*`` falls back to the request (the kubelet would use the node's
  allocatable, which a cloud instance does not have); when neither is set the variable is left
  unset. ``requests.*`` falls back to the limit, then to 0, as Kubernetes defaults requests.
* ``status.podIP``/``status.hostIP`` (and the plural forms) are empty: the cloud assigns the
  address only after the instance exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from providers.base import (
    TAG_NAMESPACE,
    TAG_NODE,
    TAG_POD,
    TAG_UID,
    InstanceSpec,
    Port,
    RegistryAuth,
)
from vkprovider.errors import PodConfigPending
from vkprovider.logs import kv
from vkprovider.node import fieldcheck
from vkprovider.node.fidelity import (
    REASON_INVALID_IMAGE,
    REASON_INVALID_RESOURCES,
    REASON_UNSUPPORTED,
)
from vkprovider.node.fieldcheck import FieldsDropped
from vkprovider.node.podenv import CachedRefs, RefSource, build_env, expand
from vkprovider.node.podjson import list_at, map_at, str_at
from vkprovider.node.podvalidate import shm_bytes, validate
from vkprovider.node.pullsecrets import (
    PullSecret,
    PullSecretError,
    pull_secret_names,
    registry_auth_for_image,
)
from vkprovider.semantics.gpus import GPU_RESOURCE, container_gpus
from vkprovider.semantics.quantity import (
    cpu_millis,
    memory_bytes,
    parse_quantity,
)

__all__ = [
    "ANNOTATION_GPU_TYPE",
    "GPU_RESOURCE",
    "NODE_SELECTOR_GPU_PRODUCT",
    "REASON_INVALID_IMAGE",
    "REASON_INVALID_RESOURCES",
    "REASON_UNSUPPORTED",
    "FieldsDropped",
    "RefSource",
    "fields_dropped",
    "instance_name",
    "translate",
    "validate",
]

ANNOTATION_GPU_TYPE = "vkprovider.io/gpu-type"
NODE_SELECTOR_GPU_PRODUCT = "nvidia.com/gpu.product"

log = logging.getLogger(__name__)




def instance_name(*, node_name: str, pod_uid: str) -> str:
    """The deterministic instance name ``<node>-<pod uid>``: the cloud-side idempotency key."""
    if not node_name or not pod_uid:
        raise ValueError("node_name and pod_uid must not be empty")
    return f"{node_name}-{pod_uid}"


# --------------------------------------------------------------------------------------------
# Translation


def _strings(container: Mapping[str, Any], key: str, env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(expand(s, env) for s in list_at(container, key) if isinstance(s, str))


def _gpu_type(pod: Mapping[str, Any]) -> str | None:
    annotated = str_at(map_at(pod, "metadata").get("annotations"), ANNOTATION_GPU_TYPE).strip()
    if annotated:
        return annotated
    selected = str_at(map_at(pod, "spec").get("nodeSelector"), NODE_SELECTOR_GPU_PRODUCT).strip()
    return selected or None


def _quantity(resources: Mapping[str, Any], name: str) -> Decimal | None:
    for kind in ("limits", "requests"):
        raw = map_at(resources, kind).get(name)
        if raw is not None:
            return parse_quantity(raw)
    return None


def fields_dropped(pod: Mapping[str, Any], *,
                   adapters: Iterable[object] | None = None) -> FieldsDropped:
    """The fields the pod sets that a cloud of ``adapters`` would not honour (every cloud type
    when None, or when none of them is a known adapter): the fidelity table's WARNED entries."""
    clouds = fieldcheck.cloud_types(adapters)
    return FieldsDropped(entries=fieldcheck.dropped_fields(pod, clouds=clouds))


async def translate(*, pod: Mapping[str, Any], node_name: str, refs: RefSource,
                    ignore_exec_probes: bool = False,
                    adapters: Iterable[object] | None = None,
                    on_dropped: Callable[[FieldsDropped], None] | None = None) -> InstanceSpec:
    """Validate the pod and build the InstanceSpec for it.

    Raises ``PodRejected`` for what no cloud can run and ``PodConfigPending`` when a non-optional
    Secret/ConfigMap (or key) is missing. Any error of ``refs`` propagates unchanged.

    ``on_dropped`` is called once, after a successful translation and only when the pod sets
    fields that a cloud of ``adapters`` (the ones the pod may go to) would not honour.
    """
    validate(pod, ignore_exec_probes=ignore_exec_probes)
    meta = map_at(pod, "metadata")
    namespace = str_at(meta, "namespace")
    pod_name = str_at(meta, "name")
    uid = str_at(meta, "uid")
    container = map_at(pod, "spec")["containers"][0]

    cached = CachedRefs(refs, namespace)
    env = await build_env(pod=pod, container=container, refs=cached, namespace=namespace)
    command = _strings(container, "command", env)
    args = _strings(container, "args", env)
    ports = tuple(
        Port(
            container_port=int(p["containerPort"]),
            protocol=str_at(p, "protocol") or "TCP",
            name=str_at(p, "name") or None,
        )
        for p in list_at(container, "ports")
    )
    resources = map_at(container, "resources")
    cpu = _quantity(resources, "cpu")
    memory = _quantity(resources, "memory")
    registry_auth = await _registry_auth(pod=pod, image=str(container["image"]), refs=cached)

    if on_dropped is not None:
        dropped = fields_dropped(pod, adapters=adapters)
        if dropped.entries:
            log.debug("pod fields not honoured", extra=kv(pod=f"{namespace}/{pod_name}",
                                                          fields=",".join(dropped.fields)))
            on_dropped(dropped)
    return InstanceSpec(
        name=instance_name(node_name=node_name, pod_uid=uid),
        image=container["image"],
        gpu_count=container_gpus(container),
        gpu_type=_gpu_type(pod),
        command=command or None,
        args=args or None,
        env=env,
        ports=ports,
        cpu_millis=cpu_millis(cpu) if cpu is not None else 0,
        memory_bytes=memory_bytes(memory) if memory is not None else 0,
        tags={TAG_NODE: node_name, TAG_NAMESPACE: namespace, TAG_POD: pod_name, TAG_UID: uid},
        registry_auth=registry_auth,
        shm_bytes=shm_bytes(pod, container),
        run_as_user=_security(pod, container, "runAsUser"),
        run_as_group=_security(pod, container, "runAsGroup"),
        hostname=(str_at(map_at(pod, "spec"), "hostnameOverride")
                  or str_at(map_at(pod, "spec"), "hostname") or None),
    )


def _security(pod: Mapping[str, Any], container: Mapping[str, Any], key: str) -> int | None:
    """A user or group id of the container's securityContext, else of the pod's (as Kubernetes
    does: the container's wins)."""
    for context in (map_at(container, "securityContext"),
                    map_at(map_at(pod, "spec"), "securityContext")):
        value = context.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


async def _registry_auth(*, pod: Mapping[str, Any], image: str, refs: CachedRefs
                         ) -> RegistryAuth | None:
    """The credential the cloud pulls ``image`` with, from the pod's ``imagePullSecrets``.

    As the kubelet does: only the pod's list is read (the ServiceAccount admission plugin has
    already copied the ServiceAccount's into a pod that had none); a Secret that does not exist
    is skipped (the pull may still work anonymously, or the cloud refuses it by name); one that
    cannot be parsed keeps the pod waiting, as a failing pull does, with the Secret named."""
    secrets: list[PullSecret] = []
    for name in pull_secret_names(pod):
        data = await refs.get("secret", name)
        if data is not None:
            secrets.append(PullSecret(name=name, data=data))
    try:
        return registry_auth_for_image(image, secrets)
    except PullSecretError as e:
        raise PodConfigPending(field="spec.imagePullSecrets", message=str(e)) from e

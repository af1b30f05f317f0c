"""The pod-fidelity table: what happens to every PodSpec and Container field on each cloud.

Why it exists: a pod that reaches the virtual node is turned into an ``InstanceSpec`` and run on a
GPU cloud, and much of a pod has no counterpart there. Every field must be *honoured* (it takes
effect: in the cloud, in this provider, or already in the scheduler or API server), *refused* by
name (the pod fails before any cloud call, naming the field) or *warned* about (the pod runs, and
one ``FieldsDropped`` Warning event names what was dropped and why). This module is the one table
of those decisions, per cloud type (``mock``, ``runpod``, ``vastai``, ``salad``), so that:

* :mod:`vkprovider.node.translate` refuses from it (the simple refusals are checked straight from
  the table by :mod:`vkprovider.node.fieldcheck`; the others are checked in code, and tests tie
  every refusal to an entry),
* the warnings come from it (:func:`vkprovider.node.fieldcheck.dropped_fields`),
* ``docs/pod-spec.md`` is rendered from it (``python -m vkprovider.node.fidelitydoc``), and
* a test walks the API server's OpenAPI schema and fails when a field has no decision.

Decisions, per entry and cloud:

``HONOURED``
    The value takes effect; the text says how it maps (``InstanceSpec`` field and the cloud's
    API field) or who uses it ("used by the scheduler").
``REFUSED``
    By translation (the default): ``PodRejected`` naming the field, the same on every cloud,
    since the cloud is chosen only after translation. With ``by_adapter``: that cloud's adapter
    refuses the spec (``InvalidSpec``) before any HTTP call, and another cloud of the pod's
    policy is tried.
``WARNED``
    Accepted and dropped. The warning fires only when the pod sets the field to a value other
    than those in ``quiet`` (the API server's defaults, or values whose loss changes nothing),
    so a plain pod gets no warning.

Paths are patterns over the pod: ``[0]`` an index, ``[*]`` every index or key, ``[key]`` one
key, ``{a,b}`` alternatives. A concrete field in a refusal or a warning is written the same way
with the pattern's wildcards filled in (``spec.containers[0].resources.limits[cpu]``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vkprovider.errors import VKError
from vkprovider.node.fieldpaths import matches, values_at
from vkprovider.node.fieldpaths import segments as _segments
from vkprovider.placement.policy import PROVIDER_TYPES, ProviderType
from vkprovider.semantics.gpus import GPU_RESOURCE

__all__ = [
    "CHILD_SCHEMA",
    "CLOUD_TYPES",
    "COMPLETE_SCHEMAS",
    "ENTRIES",
    "EVENT_MESSAGE_LIMIT",
    "REASON_INVALID_IMAGE",
    "REASON_INVALID_RESOURCES",
    "REASON_UNSUPPORTED",
    "SIMPLE_REFUSALS",
    "CloudType",
    "Decision",
    "Entry",
    "FidelityError",
    "Rule",
    "coverage",
    "matches",
    "values_at",
]

CloudType = ProviderType
CLOUD_TYPES: tuple[CloudType, ...] = PROVIDER_TYPES

REASON_UNSUPPORTED = "UnsupportedPodSpec"
REASON_INVALID_IMAGE = "InvalidImageName"
REASON_INVALID_RESOURCES = "InvalidResources"

#: Where the rendered table lives in a checkout.
#: The Warning event carries at most this many bytes of message (the API server's own cap is
#: 1 KiB, and the event recorder cuts there).
EVENT_MESSAGE_LIMIT = 1000

_TOKEN_VOLUME_PREFIX = "kube-api-access-"  # the name ServiceAccount admission gives its volume
_SHM_PATH = "/dev/shm"  # a memory-backed emptyDir mounted here sizes the shared memory


class FidelityError(VKError):
    """The table itself is inconsistent (a programming error, found at import)."""


class Decision(enum.StrEnum):
    HONOURED = "HONOURED"
    REFUSED = "REFUSED"
    WARNED = "WARNED"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One cloud type's decision about one entry, and the text that explains it."""

    decision: Decision
    text: str
    by_adapter: bool = False  # REFUSED by the cloud's adapter (InvalidSpec), not by translation
    #: WARNED: the cloud honours the field after all in a pod for which this holds (no warning
    #: for this cloud then); the text says when.
    honoured_if: Callable[[Mapping[str, Any]], bool] | None = None


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One row of the table: a field pattern and a rule per cloud type."""

    path: str
    rules: Mapping[CloudType, Rule]
    when: str = ""  # when the decision applies (REFUSED, WARNED); "" for HONOURED
    reason: str = ""  # REFUSED by translation: the PodRejected reason
    refuse_if: Literal["true", "non-empty"] | None = None  # checked straight from the table
    quiet: tuple[Any, ...] = ()  # WARNED: values not warned about (besides unset and empty)
    warns_if: Callable[[str, Any], bool] | None = None  # WARNED: a custom test of (field, value)
    also: tuple[str, ...] = ()  # sub-properties this entry decides too (schema coverage)

    def rule(self, cloud: CloudType) -> Rule:
        return self.rules[cloud]

    @property
    def decisions(self) -> frozenset[Decision]:
        return frozenset(r.decision for r in self.rules.values())

    @property
    def refused_by_translation(self) -> bool:
        return any(r.decision is Decision.REFUSED and not r.by_adapter
                   for r in self.rules.values())

    @property
    def refusal(self) -> str:
        """The PodRejected message of a translation refusal (the same on every cloud)."""
        return self.rules[CLOUD_TYPES[0]].text

    def refuses(self, value: Any) -> bool:
        """For a simple refusal: whether ``value`` is refused."""
        if self.refuse_if == "true":
            return value is True
        if self.refuse_if == "non-empty":
            return isinstance(value, list) and len(value) > 0
        return False

    def warns(self, *, field: str, value: Any) -> bool:
        """For a WARNED entry: whether ``value`` (at the concrete ``field``) is worth a warning."""
        if self.warns_if is not None:
            return self.warns_if(field, value)
        if value is None or value == "" or value == [] or value == {}:
            return False
        return not any(type(value) is type(q) and value == q for q in self.quiet)


# --------------------------------------------------------------------------------------------
# Building the table


def _all(decision: Decision, text: str) -> dict[CloudType, Rule]:
    return {c: Rule(decision=decision, text=text) for c in CLOUD_TYPES}


def _each(**texts: str | Rule) -> dict[CloudType, Rule]:
    """Per cloud: a plain string is HONOURED with that text."""
    out: dict[CloudType, Rule] = {}
    for cloud in CLOUD_TYPES:
        value = texts[cloud]
        out[cloud] = value if isinstance(value, Rule) else Rule(decision=Decision.HONOURED,
                                                                text=value)
    return out


def _h(path: str, text: str) -> Entry:
    return Entry(path=path, rules=_all(Decision.HONOURED, text))


def _hh(path: str, **texts: str | Rule) -> Entry:
    return Entry(path=path, rules=_each(**texts))


def _warned(text: str) -> Rule:
    return Rule(decision=Decision.WARNED, text=text)


def _w(path: str, text: str | Mapping[CloudType, Rule], *, quiet: tuple[Any, ...] = (),
       when: str = "", warns_if: Callable[[str, Any], bool] | None = None,
       also: tuple[str, ...] = ()) -> Entry:
    rules = _all(Decision.WARNED, text) if isinstance(text, str) else dict(text)
    if not when:
        when = ("set to anything but " + " or ".join(_show(q) for q in quiet)) if quiet else "set"
    return Entry(path=path, rules=rules, when=when, quiet=quiet, warns_if=warns_if, also=also)


def _r(path: str, text: str, *, when: str, reason: str = REASON_UNSUPPORTED,
       refuse_if: Literal["true", "non-empty"] | None = None) -> Entry:
    return Entry(path=path, rules=_all(Decision.REFUSED, text), when=when, reason=reason,
                 refuse_if=refuse_if)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _key(concrete: str) -> str:
    """The key of a field ending in ``[key]``."""
    return concrete.rsplit("[", 1)[-1].rstrip("]")


def _other_resource(concrete: str, value: Any) -> bool:
    return _key(concrete) not in ("cpu", "memory", GPU_RESOURCE)


def _not_the_admission_token(concrete: str, value: Any) -> bool:
    """A mount worth a warning: neither the admission's token nor ``/dev/shm`` (whose volume
    entry decides it: a pod with any other memory-backed mount is refused)."""
    if not isinstance(value, Mapping):
        return True
    name, path = value.get("name"), value.get("mountPath")
    if isinstance(path, str) and path.rstrip("/") == _SHM_PATH:
        return False
    return not (isinstance(name, str) and name.startswith(_TOKEN_VOLUME_PREFIX))


def _run_as_user_set(pod: Mapping[str, Any]) -> bool:
    """The container or the pod sets runAsUser (so a group can be sent with it)."""
    return bool(values_at(pod, pattern="spec.securityContext.runAsUser")
                or values_at(pod, pattern="spec.containers[0].securityContext.runAsUser"))


def _not_run_as_written(concrete: str, value: Any) -> bool:
    return isinstance(value, Mapping) and ("exec" in value or "grpc" in value)


def _longer_than_default_grace(concrete: str, value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 30


def _run_as_user(whose: str) -> dict[CloudType, Rule]:
    return _each(mock=_warned(_IDENTITY), runpod=_warned(_IDENTITY), salad=_warned(_IDENTITY),
                 vastai=f"run_as_user, sent as the rent's user (docker create --user UID, with "
                        f":GID when a runAsGroup is set); {whose} unless the container sets "
                        "its own")


def _run_as_group(whose: str) -> dict[CloudType, Rule]:
    return _each(mock=_warned(_IDENTITY), runpod=_warned(_IDENTITY), salad=_warned(_IDENTITY),
                 vastai=Rule(decision=Decision.WARNED, honoured_if=_run_as_user_set,
                             text=f"run_as_group ({whose} unless the container sets its own), "
                                  "sent as the GID of the rent's user UID:GID when a runAsUser "
                                  "is set; without one it is not applied (Docker's user names "
                                  "a user first) and only then warned"))


_SCHEDULER = "used by the scheduler"
_HOST = "not applied: the cloud names the instance's host"
_C0 = "spec.containers[0]"
_PROBES = "{startupProbe,readinessProbe,livenessProbe}"
_NO_ATTACH = ("not connected: the cloud starts the container without a terminal or stdin "
              "(kubectl attach is not supported)")
_IDENTITY = "not applied: the cloud runs the container as its image says"
_CONFINEMENT = "not applied: the cloud's own confinement applies"
_LINUX = "not applied: the clouds run Linux containers"
_ENV = "resolved here (Secret and ConfigMap refs, downward API, $(VAR) expansion), sent as "
_ENV_FROM = "merged into the environment, then sent as "
_RESTART = ("not restarted in place (the adapter has no restart yet): a container that exits "
            "ends the pod, Succeeded or Failed with its exit code, and its controller replaces "
            "it")


ENTRIES: tuple[Entry, ...] = (
    # ---- PodSpec -------------------------------------------------------------------------
    _h("spec.activeDeadlineSeconds",
       "once the pod has been active this long (from status.startTime) it fails with "
       "DeadlineExceeded and its instance is stopped, as on a kubelet"),
    _h("spec.affinity", _SCHEDULER),
    _w("spec.automountServiceAccountToken",
       "no service-account token is mounted on the cloud instance", quiet=(False,)),
    _r("spec.containers", "exactly one container is supported", when="not exactly one"),
    _w("spec.dnsConfig", "not applied: the instance uses its cloud's resolver"),
    _w("spec.dnsPolicy",
       "not applied: the instance uses its cloud's resolver (cluster names do not resolve)",
       quiet=("ClusterFirst", "Default")),
    _w("spec.enableServiceLinks",
       "service environment variables are not injected: they would name cluster addresses "
       "the instance cannot reach",
       quiet=(True, False), when="never warned: true is every pod's default"),
    _r("spec.ephemeralContainers", "ephemeral containers are not supported",
       when="not empty", refuse_if="non-empty"),
    _h("spec.evictionResponders",
       "used by the API server's eviction (an eviction deletes the pod, and its instance)"),
    _w("spec.hostAliases", "not applied: no /etc/hosts entries are added on the instance"),
    _r("spec.hostIPC", "hostIPC is not supported: the pod runs on a cloud instance",
       when="true", refuse_if="true"),
    _r("spec.hostNetwork", "hostNetwork is not supported: the pod runs on a cloud instance",
       when="true", refuse_if="true"),
    _r("spec.hostPID", "hostPID is not supported: the pod runs on a cloud instance",
       when="true", refuse_if="true"),
    _w("spec.hostUsers", "not applied: the cloud decides the user namespace", quiet=(True,)),
    _w("spec.hostname", _each(
        mock=_warned(_HOST), runpod=_warned(_HOST), salad=_warned(_HOST),
        vastai="hostname, sent as the docker create option -h in the rent's env (unless "
               "hostnameOverride is set)")),
    _w("spec.hostnameOverride", _each(
        mock=_warned(_HOST), runpod=_warned(_HOST), salad=_warned(_HOST),
        vastai="hostname, sent as the docker create option -h in the rent's env (it wins "
               "over spec.hostname)")),
    _hh("spec.imagePullSecrets",
        mock="the image's credential (dockerconfigjson, kubelet matching) is sent with the "
             "create; the mock checks it for its private registries",
        runpod="the image's credential becomes a RunPod registry credential (/v2/registries, "
               "reused by content, deleted when unused), named on the pod create",
        vastai="the image's credential is sent as the instance's image_login",
        salad="the image's credential is sent as the container's registry_authentication "
              "(basic)"),
    _r("spec.initContainers", "init containers are not supported",
       when="not empty", refuse_if="non-empty"),
    _h("spec.nodeName",
       "the binding to this virtual node (and spec.nodeName for the downward API)"),
    _h("spec.nodeSelector",
       _SCHEDULER + "; nvidia.com/gpu.product also names the GPU type when the pod has no "
       "vkprovider.io/gpu-type annotation"),
    _w("spec.os.name", _LINUX, quiet=("linux",)),
    _h("spec.overhead", _SCHEDULER),
    _h("spec.preemptionPolicy", _SCHEDULER),
    _h("spec.priority", _SCHEDULER),
    _h("spec.priorityClassName", _SCHEDULER),
    _h("spec.readinessGates", "Ready also waits for each gate's condition to be True"),
    _w("spec.resourceClaims",
       "no DRA device is allocated on a cloud instance: GPUs come from nvidia.com/gpu"),
    _w("spec.resources",
       "pod-level resources do not size the instance: only the container's resources do"),
    _w("spec.restartPolicy", _each(
        mock="Always and OnFailure restart an exited container in place (the cloud's restart "
             "API) after the kubelet's crash-loop back-off, restartCount follows; Never ends "
             "the pod Succeeded or Failed with the exit code",
        runpod=_warned(_RESTART), vastai=_warned(_RESTART),
        salad=_warned("not passed to the cloud: the provider option restart_policy applies "
                      "(default never: the pod ends when its container exits)")),
       quiet=("Always", "Never"),
       when="OnFailure (a pod ends when its instance exits, as with Never; Always, the "
            "default, is not warned: a controller replaces an ended pod)"),
    _w("spec.runtimeClassName", "not applied: the cloud's own container runtime runs the pod"),
    _h("spec.schedulerName", _SCHEDULER),
    _h("spec.schedulingGates", _SCHEDULER),
    _h("spec.schedulingGroup", _SCHEDULER),
    _h("spec.serviceAccount",
       "used by the API server (deprecated alias of serviceAccountName)"),
    _h("spec.serviceAccountName",
       "used by the API server, and spec.serviceAccountName for the downward API"),
    _w("spec.setHostnameAsFQDN", "not applied: the cloud names the instance's host",
       quiet=(False,)),
    _w("spec.shareProcessNamespace",
       "not applied: the instance runs one container in its own process namespace",
       quiet=(False,)),
    _w("spec.subdomain", "not applied: the instance has no cluster DNS name"),
    _w("spec.terminationGracePeriodSeconds",
       "not passed to the cloud: a deleted pod's instance is stopped at once, as the cloud "
       "stops it", warns_if=_longer_than_default_grace,
       when="more than 30 (the default): the container is not given the longer time"),
    _h("spec.tolerations",
       _SCHEDULER + " (the companion adds the virtual node's toleration)"),
    _h("spec.topologySpreadConstraints", _SCHEDULER),
    _r("spec.volumes[*]",
       "only the service-account token volume is supported, and a memory-backed emptyDir "
       "mounted at /dev/shm only (the volume type is named)",
       when="any volume but a projected service-account token or a memory-backed emptyDir "
            "the container mounts at /dev/shm only"),
    _w("spec.volumes[*].emptyDir", _each(
        mock=_warned("the container's /dev/shm is not sized: the mock cloud keeps its own"),
        runpod=Rule(decision=Decision.REFUSED, by_adapter=True,
                    text="refused by the adapter (InvalidSpec): RunPod's pod create cannot "
                         "size /dev/shm"),
        vastai=Rule(decision=Decision.REFUSED, by_adapter=True,
                    text="refused by the adapter (InvalidSpec): Vast.ai sizes /dev/shm itself, "
                         "in proportion to the GPU share, and its rent cannot set it"),
        salad="shm_bytes, sent as container.resources.shm_size (MB, rounded up): the smaller "
              "of sizeLimit and the memory limit, as the kubelet sizes it (without either, the "
              "container's memory), at least Salad's minimum of 64"),
       when="a memory-backed emptyDir the container mounts at /dev/shm only (any other "
            "emptyDir is refused above)"),
    _r("spec.volumes[*].emptyDir.sizeLimit",
       "the size of /dev/shm must be a positive quantity of at most 64Ti",
       when="not a positive quantity up to 64Ti", reason=REASON_INVALID_RESOURCES),
    # ---- PodSecurityContext --------------------------------------------------------------
    _w("spec.securityContext.appArmorProfile", _CONFINEMENT),
    _w("spec.securityContext.fsGroup", "not applied: no volume is mounted on the instance"),
    _w("spec.securityContext.fsGroupChangePolicy",
       "not applied: no volume is mounted on the instance"),
    _w("spec.securityContext.runAsGroup", _run_as_group("the pod's")),
    _w("spec.securityContext.runAsNonRoot", _IDENTITY, quiet=(False,)),
    _w("spec.securityContext.runAsUser", _run_as_user("the pod's")),
    _w("spec.securityContext.seLinuxChangePolicy", _CONFINEMENT),
    _w("spec.securityContext.seLinuxOptions", _CONFINEMENT),
    _w("spec.securityContext.seccompProfile", _CONFINEMENT),
    _w("spec.securityContext.supplementalGroups", _IDENTITY),
    _w("spec.securityContext.supplementalGroupsPolicy", _IDENTITY),
    _w("spec.securityContext.sysctls", "not applied: the cloud's kernel settings apply"),
    _w("spec.securityContext.windowsOptions", _LINUX),
    # ---- Container -----------------------------------------------------------------------
    _hh(f"{_C0}.args",
        mock="args",
        runpod="args, as one shell-quoted string",
        vastai="args (run type args, after the image's ENTRYPOINT)",
        salad="appended to command; args without command is refused by the adapter (Salad "
              "cannot pass arguments to the image's ENTRYPOINT)"),
    _hh(f"{_C0}.command",
        mock="command",
        runpod=Rule(decision=Decision.REFUSED, by_adapter=True,
                    text="refused by the adapter (InvalidSpec): RunPod v2 cannot override the "
                         "image's ENTRYPOINT; use args"),
        vastai=Rule(decision=Decision.REFUSED, by_adapter=True,
                    text="refused by the adapter (InvalidSpec) unless the provider option "
                         "command_mode is onstart, which runs command and args as the onstart "
                         "script"),
        salad="container.command, with args appended (replaces ENTRYPOINT and CMD)"),
    _hh(f"{_C0}.env",
        mock=_ENV + "env",
        runpod=_ENV + "env (plus VKPROVIDER_TAGS)",
        vastai=_ENV + "-e K=V flags (values with spaces or quotes need the provider option "
                      "env_format: dict)",
        salad=_ENV + "environment_variables (empty, multi-line or over 1000 characters: "
                     "refused by the adapter)"),
    _r(f"{_C0}.env[*]",
       "an entry without a name, a valueFrom without exactly one source, a Secret or "
       "ConfigMap ref without name or key, an unsupported downward API field or "
       "resourceFieldRef is refused",
       when="invalid or unsupported"),
    _r(f"{_C0}.env[*].valueFrom.resourceFieldRef.divisor",
       "the divisor must be a positive quantity", when="not a positive quantity",
       reason=REASON_INVALID_RESOURCES),
    _hh(f"{_C0}.envFrom",
        mock=_ENV_FROM + "env",
        runpod=_ENV_FROM + "env",
        vastai=_ENV_FROM + "-e K=V flags",
        salad=_ENV_FROM + "environment_variables"),
    _r(f"{_C0}.envFrom[*]", "an entry needs exactly one of secretRef and configMapRef, named",
       when="not exactly one named source"),
    _hh(f"{_C0}.image",
        mock="image",
        runpod="image (a private image needs the provider option registry_id)",
        vastai="image (a private image needs the provider option image_login)",
        salad="container.image (a private image needs the provider option "
              "registry_authentication)"),
    _r(f"{_C0}.image", "the image is missing, blank or holds whitespace",
       when="missing, blank or holding whitespace", reason=REASON_INVALID_IMAGE),
    _w(f"{_C0}.imagePullPolicy",
       "not passed to the cloud: the cloud pulls the image onto its host",
       quiet=("Always", "IfNotPresent")),
    _w(f"{_C0}.lifecycle", "hooks are not run and stopSignal is not sent: the cloud stops "
                           "the instance its own way"),
    _w(f"{_C0}.{_PROBES}",
       "run by the provider against the address the cloud publishes for the probed port, "
       "with the kubelet's rules (Ready and the EndpointSlices follow readiness; a liveness "
       "failure restarts the instance). Warned only where not run as written: an exec probe "
       "is dropped (OverflowPolicy execProbes: Ignore), a grpc probe runs as a TCP connect to "
       "its port (no gRPC health client yet)",
       when="exec (ignored by the policy) or grpc", warns_if=_not_run_as_written,
       also=("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "successThreshold",
             "failureThreshold", "terminationGracePeriodSeconds")),
    _r(f"{_C0}.{_PROBES}.exec",
       "an exec probe cannot run on a cloud instance (OverflowPolicy spec.execProbes: Ignore "
       "runs the pod without it, and warns)",
       when="set, unless the pod's OverflowPolicy says execProbes: Ignore"),
    _r(f"{_C0}.{_PROBES}.{{httpGet,tcpSocket,grpc}}.port",
       "a probe must name a port the container declares: a cloud publishes only declared "
       "ports", when="not a declared port (number or name)"),
    _h(f"{_C0}.name", "the container's name in the pod status (and for kubectl logs)"),
    _hh(f"{_C0}.ports",
        mock="ports (each gets an endpoint)",
        runpod="TCP ports, as port/http (named http...) or port/tcp; UDP and SCTP are "
               "refused by the adapter",
        vastai="-p P:P flags (TCP and UDP; SCTP is refused by the adapter); the host picks "
               "the public port",
        salad="one TCP port, behind Salad's HTTP gateway; more ports, or UDP, are refused by "
              "the adapter"),
    _r(f"{_C0}.ports[*].containerPort", "the port number must be 1-65535",
       when="not a port number"),
    _w(f"{_C0}.ports[*].{{hostIP,hostPort}}",
       "not applied: the cloud picks the public address and port (the pod's annotation "
       "vkprovider.io/ports shows them)"),
    _w(f"{_C0}.resizePolicy[*].restartPolicy",
       "in-place resize is not supported: the instance keeps its size",
       quiet=("NotRequired",)),
    _w(f"{_C0}.restartPolicy", "not passed to the cloud: the pod ends when its instance exits"),
    _w(f"{_C0}.restartPolicyRules",
       "not passed to the cloud: the pod ends when its instance exits"),
    _w(f"{_C0}.{{stdin,stdinOnce,tty}}", _NO_ATTACH, quiet=(False,)),
    _w(f"{_C0}.terminationMessagePath",
       "not read: the pod's message comes from the cloud's status",
       quiet=("/dev/termination-log",)),
    _w(f"{_C0}.terminationMessagePolicy",
       "not read: the pod's message comes from the cloud's status", quiet=("File",)),
    _r(f"{_C0}.volumeDevices", "volume devices are not supported",
       when="not empty", refuse_if="non-empty"),
    _w(f"{_C0}.volumeMounts[*]",
       "not mounted on the instance (only a service-account token volume is accepted, and "
       "it is not mounted)",
       warns_if=_not_the_admission_token,
       when="a mount of anything but the kube-api-access token that admission adds"),
    _w(f"{_C0}.workingDir", "not passed to the cloud: the image's WORKDIR applies"),
    # ---- Container resources -------------------------------------------------------------
    _hh(f"{_C0}.resources.limits[{GPU_RESOURCE}]",
        mock="gpu_count (at least 1: the mock cloud rents GPU machines)",
        runpod="gpu.count (0: a CPU pod, only with the provider option cpu_flavor)",
        vastai="num_gpus (at least 1: Vast.ai rents GPU machines)",
        salad="0 or 1 GPU class (more is refused by the adapter: a Salad node has one GPU)"),
    _hh(f"{_C0}.resources.requests[{GPU_RESOURCE}]",
        mock="gpu_count when there is no limit (else it must equal the limit)",
        runpod="gpu.count when there is no limit (else it must equal the limit)",
        vastai="num_gpus when there is no limit (else it must equal the limit)",
        salad="the GPU count when there is no limit (else it must equal the limit)"),
    _hh(f"{_C0}.resources.limits[cpu]",
        mock="cpu_millis",
        runpod=_warned("ignored for GPU pods: RunPod sizes vCPUs by the GPU type (only a "
                       "cpu_flavor CPU pod uses it)"),
        vastai="offers with at least that many cores (cpu_cores_effective)",
        salad="resources.cpu, whole vCPUs rounded up"),
    _hh(f"{_C0}.resources.requests[cpu]",
        mock="cpu_millis when there is no cpu limit",
        runpod=_warned("ignored for GPU pods: RunPod sizes vCPUs by the GPU type (only a "
                       "cpu_flavor CPU pod uses it)"),
        vastai="offers with at least that many cores, when there is no cpu limit",
        salad="resources.cpu, whole vCPUs rounded up, when there is no cpu limit"),
    _hh(f"{_C0}.resources.limits[memory]",
        mock="memory_bytes",
        runpod=_warned("ignored: RunPod sizes RAM by the GPU type"),
        vastai="offers with at least that much RAM (cpu_ram)",
        salad="resources.memory, MB rounded up, at least 1024"),
    _hh(f"{_C0}.resources.requests[memory]",
        mock="memory_bytes when there is no memory limit",
        runpod=_warned("ignored: RunPod sizes RAM by the GPU type"),
        vastai="offers with at least that much RAM, when there is no memory limit",
        salad="resources.memory, MB rounded up, at least 1024, when there is no memory limit"),
    _w(f"{_C0}.resources.{{limits,requests}}[*]",
       "not passed to the cloud: only cpu, memory and nvidia.com/gpu size the instance",
       warns_if=_other_resource, when="a resource other than cpu, memory, nvidia.com/gpu"),
    _r(f"{_C0}.resources.{{limits,requests}}[*]",
       "the quantity must parse, be non-negative and sane (at most 4096 cpu, 64Ti memory, "
       "1024 GPUs), a whole number of GPUs, and a GPU request must equal the GPU limit",
       when="invalid", reason=REASON_INVALID_RESOURCES),
    _w(f"{_C0}.resources.claims",
       "no DRA device is allocated on a cloud instance: GPUs come from nvidia.com/gpu"),
    # ---- Container securityContext -------------------------------------------------------
    _w(f"{_C0}.securityContext.allowPrivilegeEscalation", _CONFINEMENT, quiet=(True,)),
    _w(f"{_C0}.securityContext.appArmorProfile", _CONFINEMENT),
    _w(f"{_C0}.securityContext.capabilities",
       "not applied: the cloud grants its own capabilities"),
    _r(f"{_C0}.securityContext.privileged", "privileged containers are not supported",
       when="true", refuse_if="true"),
    _w(f"{_C0}.securityContext.procMount", _CONFINEMENT, quiet=("Default",)),
    _w(f"{_C0}.securityContext.readOnlyRootFilesystem",
       "not applied: the instance's root filesystem is writable", quiet=(False,)),
    _w(f"{_C0}.securityContext.runAsGroup", _run_as_group("the container's")),
    _w(f"{_C0}.securityContext.runAsNonRoot", _IDENTITY, quiet=(False,)),
    _w(f"{_C0}.securityContext.runAsUser", _run_as_user("the container's")),
    _w(f"{_C0}.securityContext.seLinuxOptions", _CONFINEMENT),
    _w(f"{_C0}.securityContext.seccompProfile", _CONFINEMENT),
    _w(f"{_C0}.securityContext.windowsOptions", _LINUX),
)

#: Refusals translate checks straight from the table (a value that is true, a list not empty).
SIMPLE_REFUSALS: tuple[Entry, ...] = tuple(e for e in ENTRIES if e.refuse_if is not None)

#: The schemas whose every property must have an entry (the OpenAPI schema test checks them).
COMPLETE_SCHEMAS: tuple[str, ...] = ("PodSpec", "PodSecurityContext", "Container",
                                     "SecurityContext", "ResourceRequirements", "Probe")

#: (schema, property) -> the schema of that property's value, for walking entry paths.
CHILD_SCHEMA: Mapping[tuple[str, str], str] = {
    ("PodSpec", "containers"): "Container",
    ("PodSpec", "securityContext"): "PodSecurityContext",
    ("PodSpec", "os"): "PodOS",
    ("PodSpec", "resources"): "ResourceRequirements",
    ("Container", "securityContext"): "SecurityContext",
    ("Container", "resources"): "ResourceRequirements",
    ("Container", "startupProbe"): "Probe",
    ("Container", "readinessProbe"): "Probe",
    ("Container", "livenessProbe"): "Probe",
    ("Container", "ports"): "ContainerPort",
    ("Container", "env"): "EnvVar",
    ("Container", "envFrom"): "EnvFromSource",
    ("Container", "resizePolicy"): "ContainerResizePolicy",
    ("Container", "volumeMounts"): "VolumeMount",
    ("Container", "lifecycle"): "Lifecycle",
    ("EnvVar", "valueFrom"): "EnvVarSource",
    ("EnvVarSource", "resourceFieldRef"): "ResourceFieldSelector",
    ("Probe", "httpGet"): "HTTPGetAction",
    ("Probe", "tcpSocket"): "TCPSocketAction",
    ("Probe", "grpc"): "GRPCAction",
}

# --------------------------------------------------------------------------------------------
# Schema coverage


def _walk(entry: Entry) -> tuple[set[tuple[str, str]], set[str]]:
    """The (schema, property) pairs an entry's path goes through, and its last schemas."""
    pairs: set[tuple[str, str]] = set()
    segments = _segments(entry.path)
    if segments[0][0] != ("spec",):
        raise FidelityError(f"{entry.path}: a pattern starts with spec")
    schemas = {"PodSpec"}
    for names, _ in segments[1:]:
        following: set[str] = set()
        for schema in schemas:
            for name in names:
                pairs.add((schema, name))
                child = CHILD_SCHEMA.get((schema, name))
                if child is not None:
                    following.add(child)
        if not following:
            return pairs, set()
        schemas = following
    return pairs, schemas


def coverage() -> dict[str, set[str]]:
    """Schema name -> the properties the table decides (walked from every entry's path)."""
    out: dict[str, set[str]] = {}
    for entry in ENTRIES:
        pairs, last = _walk(entry)
        pairs |= {(schema, prop) for schema in last for prop in entry.also}
        for schema, prop in pairs:
            out.setdefault(schema, set()).add(prop)
    return out


# --------------------------------------------------------------------------------------------
# Consistency of the table itself


def _check(entries: Sequence[Entry]) -> None:
    for entry in entries:
        _segments(entry.path)
        if set(entry.rules) != set(CLOUD_TYPES):
            raise FidelityError(f"{entry.path}: needs a rule for each of {CLOUD_TYPES}")
        texts = [entry.when, *(r.text for r in entry.rules.values())]
        if any("|" in t or "\n" in t for t in texts):
            raise FidelityError(f"{entry.path}: a text holds '|' or a line break")
        if any(not r.text for r in entry.rules.values()):
            raise FidelityError(f"{entry.path}: every rule needs a text")
        refused = [r for r in entry.rules.values()
                   if r.decision is Decision.REFUSED and not r.by_adapter]
        if refused:
            if len(refused) != len(CLOUD_TYPES) or len({r.text for r in refused}) != 1:
                raise FidelityError(f"{entry.path}: a refusal by translation happens before "
                                    "the cloud is chosen: the same on every cloud")
            if not entry.reason or not entry.when:
                raise FidelityError(f"{entry.path}: a refusal needs a reason and a when")
        elif entry.refuse_if is not None or entry.reason:
            raise FidelityError(f"{entry.path}: refuse_if and reason are for refusals")
        if any(r.by_adapter and r.decision is not Decision.REFUSED
               for r in entry.rules.values()):
            raise FidelityError(f"{entry.path}: by_adapter is for REFUSED rules")
        if any(r.honoured_if is not None and r.decision is not Decision.WARNED
               for r in entry.rules.values()):
            raise FidelityError(f"{entry.path}: honoured_if is for WARNED rules")
        if Decision.WARNED in entry.decisions and entry.refuse_if is not None:
            raise FidelityError(f"{entry.path}: WARNED and refused at once")


_check(ENTRIES)

"""Settings for every process, loaded once from YAML and passed explicitly.

Why it exists: a production component needs one place that says what can be configured, with
defaults and validation that names the wrong field. Settings are frozen pydantic models; there
is no module-level singleton, so tests build their own.

Secrets never live here: a provider names the environment variable or file holding its key.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from providers.addresses import AddressPolicy
from vkprovider.descheduler.fit import DEFAULT_HEALTH_TAINTS, parse_health_taint
from vkprovider.errors import ConfigError
from vkprovider.eventloop import EventLoopChoice
from vkprovider.semantics.selectors import label_problem


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


_M = TypeVar("_M", bound=BaseModel)


class NodeSettings(_Frozen):
    """The virtual node as the cluster sees it."""

    name: str = "vk-gpu-burst"
    internal_ip: str = "127.0.0.1"  # where the API server reaches the kubelet API
    kubelet_port: int = Field(default=10250, ge=1, le=65535)
    cpu: str = "1000"  # capacity figures the scheduler uses; GPUs come from the clouds
    memory: str = "8Ti"
    pods: int = Field(default=1000, ge=1)
    labels: dict[str, str] = Field(default_factory=dict)
    taint: bool = True  # virtual-kubelet.io/provider=<taint_value>:NoSchedule
    # The taint's value. Give each virtual node its own when OverflowPolicies name nodes
    # (spec.nodes): the companion tolerates exactly the named nodes' taints (docs/operations.md).
    taint_value: str = Field(default="vkprovider", min_length=1, max_length=63,
                             pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    lease_duration_seconds: int = Field(default=40, ge=10)
    lease_renew_seconds: float = Field(default=10.0, gt=0)
    status_interval_seconds: float = Field(default=60.0, gt=0)  # full status at least this often
    capacity_refresh_seconds: float = Field(default=30.0, gt=0)
    # Events written per second after a burst of event_burst (the kubelet's eventRecordQPS and
    # eventBurst), for an API server shared with many writers. 0: no limit (the default; the one
    # Event sender is bounded by the API server's latency anyway: kube/events.py).
    event_qps: float = Field(default=0.0, ge=0)
    event_burst: int = Field(default=100, ge=1)


def _checked_labels(value: dict[str, str]) -> dict[str, str]:
    for key, val in value.items():
        problem = label_problem(key=key, value=val)
        if problem:
            raise ValueError(problem)
    return value


class PodSettings(_Frozen):
    """How pods are driven to their cloud instances."""

    # Each worker holds one pod's reconcile, most of it waiting on a cloud call (0.2-2 s on a
    # real cloud), so they are cheap coroutines. 64: at 32 a 3,000-pod burst queued in the
    # provider itself (watch -> cloud create p99 2.3 s; 0.65 s at 64, bench/burst.py); each
    # cloud's 429/Retry-After still holds back that provider.
    workers: int = Field(default=64, ge=1, le=500)
    status_interval_seconds: float = Field(default=5.0, gt=0)  # one list per provider per tick
    resync_seconds: float = Field(default=60.0, gt=0)  # every pod reconciled at least this often
    orphan_grace_seconds: float = Field(default=30.0, ge=0)  # between the two sightings
    create_deadline_seconds: float = Field(default=900.0, gt=0)  # then fail the pod
    capacity_block_seconds: float = Field(default=180.0, ge=0)
    delete_retry_seconds: float = Field(default=30.0, gt=0)  # re-send an unheeded delete
    max_backoff_seconds: float = Field(default=60.0, gt=0)
    spend_record_seconds: float = Field(default=15.0, gt=0)  # persist the spend book this often
    require_policy: bool = False  # issue 6: only pods an OverflowPolicy selects
    # Only the OverflowPolicies that carry all these labels govern this node ({}: every policy):
    # another install's policies in the same cluster are not this node's (docs/policies.md)
    policy_labels: dict[str, str] = Field(default_factory=dict)
    # "minimal": one Normal Event per pod on the happy path (Started; ProviderCreated only while
    # an instance boots); "verbose" adds ProviderCreated always and Killing. Warnings: always.
    lifecycle_events: Literal["minimal", "verbose"] = "minimal"
    # A deleted Ready pod keeps its instance this long (at most its grace period) after its
    # endpoints turned not-ready, so load balancers stop sending before the server goes.
    drain_seconds: float = Field(default=5.0, ge=0)
    probe_concurrency: int = Field(default=64, ge=1, le=4096)  # probes in flight at once
    # restartPolicy: the first restart of an exited container waits this long, doubling per
    # restart up to 300 s (the kubelet's CrashLoopBackOff)
    crash_backoff_seconds: float = Field(default=10.0, gt=0)
    # Labs only: a directory of address maps (vkprovider.probing.dialing) that probes dial
    # through instead of the network, as the test harness's simulated DNAT. None: direct.
    probe_address_map: str | None = None

    @field_validator("policy_labels")
    @classmethod
    def _policy_labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _checked_labels(value)


class EndpointSettings(_Frozen):
    """Which addresses clouds publish are used (probed, written to EndpointSlices).

    Every published address passes one filter (``providers/addresses.py``): private, CGNAT,
    link-local, loopback, multicast, unspecified, reserved, ULA and cloud metadata addresses,
    in-cluster names and IP literals posing as host names are refused; so are the cluster's own
    pod and Service ranges listed here. Empty lists (the default) leave the fixed classes only,
    which cover clusters on RFC 1918 or CGNAT ranges; list your ranges when the cluster uses
    others. ``trusted_cidrs`` allows private, CGNAT or ULA ranges you route to on purpose (a
    tunnel); never metadata, loopback, link-local or the cluster's own ranges.
    """

    pod_cidrs: tuple[str, ...] = ()
    service_cidrs: tuple[str, ...] = ()
    trusted_cidrs: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"

    @model_validator(mode="after")
    def _parses(self) -> EndpointSettings:
        self.policy()  # a bad CIDR or domain names its list
        return self

    def policy(self) -> AddressPolicy:
        """The address filter these settings describe."""
        return AddressPolicy.build(pod_cidrs=self.pod_cidrs, service_cidrs=self.service_cidrs,
                                   trusted=self.trusted_cidrs,
                                   cluster_domain=self.cluster_domain)


class KubeletAPISettings(_Frozen):
    """The kubelet API (TLS on ``node.kubelet_port``): who may call it, and how often GPUs are read.

    Authentication: client certificates signed by ``client_ca_file`` (the API server's
    kubelet-client certificate), or bearer tokens checked with TokenReview; authorization with
    SubjectAccessReview on ``nodes/<subresource>``. The cache TTLs match the kubelet's defaults.
    """

    # Where the kubelet API and /metrics listen. "" (the default; null means the same): the
    # node's internal_ip when that is a loopback address (a local run: the API server reaches the
    # node there, nothing else should), else every interface ("0.0.0.0", or "::" when internal_ip
    # is IPv6; in a pod internal_ip is the pod IP). Set an address to listen there only.
    bind_address: str = ""
    client_ca_file: str | None = None  # None: client certificates are not accepted
    token_cache_ttl_seconds: float = Field(default=120.0, ge=0)  # a TokenReview that said yes
    token_deny_cache_ttl_seconds: float = Field(default=10.0, ge=0)  # ... that said no
    authz_allow_cache_ttl_seconds: float = Field(default=300.0, ge=0)  # SubjectAccessReview yes
    authz_deny_cache_ttl_seconds: float = Field(default=30.0, ge=0)  # ... no
    gpu_metrics_interval_seconds: float = Field(default=15.0, gt=0)  # per running instance
    # where a self-signed serving certificate is written when tls_cert_file/tls_key_file are not
    # set; None: a private directory under $TMPDIR (never the working directory)
    cert_dir: str | None = None

    @field_validator("bind_address", mode="before")
    @classmethod
    def _bind_address(cls, value: Any) -> Any:
        """null is the default ("": automatic); surrounding blanks are dropped."""
        if value is None:
            return ""
        return value.strip() if isinstance(value, str) else value


class ProviderSettings(_Frozen):
    """One cloud account. The API key comes from ``api_key_env`` or ``api_key_file``."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    type: Literal["mock", "runpod", "vastai", "salad"]
    url: str
    api_key_env: str | None = None
    api_key_file: str | None = None
    timeout_seconds: float = Field(default=15.0, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)

    def api_key(self) -> str | None:
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if value is None:
                raise ConfigError(
                    f"providers[{self.name}].api_key_env: environment variable "
                    f"{self.api_key_env} is not set"
                )
            return value
        if self.api_key_file:
            try:
                return Path(self.api_key_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"providers[{self.name}].api_key_file: cannot read {self.api_key_file}: "
                    f"{exc.strerror}"
                ) from exc
        return None


class GPUProviderSourceSettings(_Frozen):
    """Providers read from ``GPUProvider`` objects (in addition to ``providers:`` in this file).

    The credentials Secret of each object is read with a GET at most every
    ``secret_refresh_seconds`` (and when the object changes); a new resourceVersion rebuilds the
    adapter. ``status`` is patched only on change and at most every ``status_interval_seconds``
    per object.

    Whoever may write a GPUProvider must not be able to send a Secret to a server of their
    choice, nor make this process call addresses inside the cluster: a ``credentialsSecret`` is
    read only from this process's own namespace (``leader_election.namespace``) or one listed in
    ``secret_namespaces``, and ``spec.endpoint`` may name only the cloud's own public API host,
    a host listed in ``allowed_endpoint_hosts``, or (``type: mock`` without a key) any host but
    a link-local one (vkprovider/registry.py, ``trust_problems``).
    """

    enabled: bool = True
    # namespaces besides the provider's own whose Secrets a GPUProvider may name
    secret_namespaces: tuple[str, ...] = ()
    # hosts (names or IP addresses, no port) a GPUProvider's spec.endpoint may name besides the
    # cloud's public API host; a listed host may be private and use http (an operator's proxy)
    allowed_endpoint_hosts: tuple[str, ...] = ()
    secret_refresh_seconds: float = Field(default=30.0, gt=0, le=30.0)
    status_interval_seconds: float = Field(default=5.0, ge=1.0)
    resync_seconds: float = Field(default=2.0, gt=0)  # how often objects are re-examined
    timeout_seconds: float = Field(default=15.0, gt=0)  # HTTP timeout of the adapters built

    @field_validator("secret_namespaces")
    @classmethod
    def _namespaces(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, name in enumerate(value):
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):
                raise ValueError(f"[{i}]: {name!r} is not a namespace name")
        return value

    @field_validator("allowed_endpoint_hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for i, host in enumerate(value):
            norm = host.strip().lower().rstrip(".")
            if norm.startswith("[") and norm.endswith("]"):
                norm = norm[1:-1]
            if ":" in norm:  # only an IPv6 address has colons: "host:port" is refused
                try:
                    norm = str(ipaddress.IPv6Address(norm))
                except ValueError:
                    norm = ""
            if not norm or not re.fullmatch(r"[a-z0-9._:-]+", norm):
                raise ValueError(f"[{i}]: {host!r} is not a host name or IP address "
                                 "(no scheme, port or path)")
            out.append(norm)
        return tuple(out)


class LeaderElectionSettings(_Frozen):
    """Lease-based leader election so that two replicas of ``vkprovider run`` have one actor.

    Only the leader registers the node, runs the pod controller and calls clouds; a standby runs
    nothing but the elector. Losing the Lease exits the process at once (non-zero).
    """

    enabled: bool = False  # off for local development; on in manifests/base/config.yaml
    namespace: str = "vkprovider-system"
    lease_name: str | None = None  # None: vkprovider-<node name>
    identity: str | None = None  # None: $POD_NAME, else <hostname>-<pid>
    lease_duration_seconds: float = Field(default=15.0, gt=0)
    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    retry_period_seconds: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionSettings:
        if not (self.retry_period_seconds < self.renew_deadline_seconds
                < self.lease_duration_seconds):
            raise ValueError("need retry_period_seconds < renew_deadline_seconds < "
                             "lease_duration_seconds")
        return self

    def lease(self, *, node_name: str) -> str:
        return self.lease_name or f"vkprovider-{node_name}"

    def holder(self) -> str:
        if self.identity:
            return self.identity
        pod = os.environ.get("POD_NAME")
        if pod:
            return pod
        return f"{socket.gethostname()}-{os.getpid()}"


class GatewayInstanceSettings(_Frozen):
    """One gateway (HAProxy) pod: the address written into EndpointSlices and its Runtime API
    (a Unix socket path, or ``tcp://host:port``)."""

    address: str
    runtime: str


class GatewayRuntimeTLSSettings(_Frozen):
    """The provider's side of the gateway's mutual-TLS Runtime API (``tls://`` instances)."""

    cert_file: str  # the provider's client certificate, signed by the CA the gateway trusts
    key_file: str
    ca_file: str  # the CA that signs the gateway pods' Runtime API certificates
    server_name: str | None = None  # the name their certificates carry; None: the address


class GatewayPodsSettings(_Frozen):
    """Find the gateway pods by label (the chart's gateway Deployment): each Ready pod is an
    instance at its pod IP, its Runtime API at ``tls://<pod IP>:<runtime_port>``."""

    namespace: str = "vkprovider-system"
    selector: str = "app.kubernetes.io/component=gateway"
    runtime_port: int = Field(default=9999, ge=1, le=65535)


class GatewaySettings(_Frozen):
    """The traffic gateway for replicas kube-proxy cannot reach (docs/traffic.md).

    Disabled when ``instances`` is empty: a hostname-only replica then gets the
    ``EndpointNotRoutable`` warning whatever the policy's ``traffic`` says. The paths are the
    gateway's own (inside its pod), as its rendered configuration names them.
    """

    instances: tuple[GatewayInstanceSettings, ...] = ()
    first_port: int = Field(default=20000, ge=1024, le=65535)
    port_count: int = Field(default=256, ge=1, le=4096)
    ca_file: str = "/etc/ssl/certs/ca-certificates.crt"
    map_dir: str = "/var/lib/haproxy/maps"
    auth_headers: tuple[str, ...] = ("Salad-Api-Key",)
    reconcile_seconds: float = Field(default=1.0, gt=0)
    # how long one Runtime API command may take before the gateway pod counts as unreachable
    runtime_timeout_seconds: float = Field(default=5.0, gt=0)
    runtime_tls: GatewayRuntimeTLSSettings | None = None
    pods: GatewayPodsSettings | None = None  # discovered gateway pods (besides instances)

    @property
    def enabled(self) -> bool:
        return bool(self.instances) or self.pods is not None

    @model_validator(mode="after")
    def _range(self) -> GatewaySettings:
        if self.first_port + self.port_count - 1 > 65535:
            raise ValueError("first_port + port_count - 1 must be at most 65535")
        for i, inst in enumerate(self.instances):
            if inst.runtime.startswith("tls://") and self.runtime_tls is None:
                raise ValueError(f"instances[{i}].runtime is tls://: set gateway.runtime_tls")
        if self.pods is not None and self.runtime_tls is None:
            raise ValueError("pods: discovered gateway pods are reached over tls://: set "
                             "gateway.runtime_tls")
        return self


class Settings(_Frozen):
    kubeconfig: str | None = None  # None: in-cluster, else the default kubeconfig
    node: NodeSettings = Field(default_factory=NodeSettings)
    pods: PodSettings = Field(default_factory=PodSettings)
    endpoints: EndpointSettings = Field(default_factory=EndpointSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    providers: tuple[ProviderSettings, ...] = ()
    metrics_port: int = Field(default=9464, ge=0, le=65535)  # 0: no metrics server
    tls_cert_file: str | None = None  # kubelet API serving cert; generated when absent
    tls_key_file: str | None = None
    kubelet_api: KubeletAPISettings = Field(default_factory=KubeletAPISettings)
    gpu_providers: GPUProviderSourceSettings = Field(default_factory=GPUProviderSourceSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    # how long start-up waits for the API server to answer before giving up (exit 1)
    api_server_timeout_seconds: float = Field(default=60.0, gt=0)
    # auto: uvloop when installed, else the standard loop; uvloop: refuse to start without it;
    # asyncio: the standard loop (vkprovider/eventloop.py)
    event_loop: EventLoopChoice = "auto"

    @field_validator("providers")
    @classmethod
    def _unique_names(cls, value: tuple[ProviderSettings, ...]) -> tuple[ProviderSettings, ...]:
        names = [p.name for p in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"provider names must be unique; repeated: {', '.join(dupes)}")
        return value


def load_settings(path: str | Path | None, **overrides: Any) -> Settings:
    """Read YAML settings; every error names the field at fault."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read settings file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded or {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from exc


class CompanionLeaderElectionSettings(_Frozen):
    """Lease-based leader election between replicas of the companion."""

    enabled: bool = False
    namespace: str = "vkprovider-system"


class CompanionSettings(_Frozen):
    """Settings of ``vkprovider descheduler`` (the companion): ``--config FILE`` and flags.

    Each field has a flag (``--node-name``, ``--interval``, ...); a flag given on the command
    line wins over the file. The values are handed to ``run_companion`` unchanged.
    """

    kubeconfig: str | None = None  # None: in-cluster, else the default kubeconfig
    # the virtual node's name, or a list of names (one companion serving several nodes)
    node_name: str | tuple[str, ...] = "vk-gpu-burst"
    interval_seconds: float = Field(default=2.0, gt=0)  # between admission passes
    move_back_interval_seconds: float = Field(default=30.0, gt=0)  # between move-back passes
    headroom_gpus: int = Field(default=0, ge=0)  # GPUs kept free inside when judging a fit
    # Node taints that take a node's GPUs out of service (KEY[=VALUE][:EFFECT]): such a node, or
    # one with fewer allocatable than capacity nvidia.com/gpu, never counts as free GPUs for
    # move-back or pre-warm (descheduler/fit.py).
    gpu_health_taints: tuple[str, ...] = DEFAULT_HEALTH_TAINTS
    # A replica the scheduler preempted is replaced on the virtual node without waiting the
    # policy's overflowAfter (descheduler/preemption.py); false: every pod waits it out.
    preemption_fast_path: bool = True
    # Only the OverflowPolicies that carry all these labels are this companion's ({}: every
    # policy); the same labels as its providers' pods.policy_labels (docs/policies.md)
    policy_labels: dict[str, str] = Field(default_factory=dict)
    metrics_port: int = Field(default=0, ge=0, le=65535)  # Prometheus; 0: off
    api_server_timeout_seconds: float = Field(default=60.0, gt=0)  # start-up wait, then exit 1
    event_loop: EventLoopChoice = "auto"  # as the provider's event_loop
    leader_election: CompanionLeaderElectionSettings = Field(
        default_factory=CompanionLeaderElectionSettings)

    @field_validator("policy_labels")
    @classmethod
    def _policy_labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _checked_labels(value)

    @field_validator("node_name")
    @classmethod
    def _names(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        names = (value,) if isinstance(value, str) else value
        if not names or not all(names):
            raise ValueError("needs at least one non-empty node name")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"node names must be unique; repeated: {', '.join(dupes)}")
        return value

    @field_validator("gpu_health_taints")
    @classmethod
    def _health_taints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, text in enumerate(value):
            try:
                parse_health_taint(text)
            except ValueError as exc:
                raise ValueError(f"[{i}]: {exc}") from None
        return value

    def node_names(self) -> list[str]:
        return [self.node_name] if isinstance(self.node_name, str) else list(self.node_name)


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` on top (nested mappings merged; None values ignored)."""
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            below = out.get(key)
            merged = _merge(below if isinstance(below, dict) else {}, value)
            if merged or isinstance(below, dict):
                out[key] = merged
        else:
            out[key] = value
    return out


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML settings file; errors are one line naming file and line."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file ({exc.reason})") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML: {where}{problem}") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return loaded or {}


def validation_problems(exc: ValidationError) -> str:
    """``field.path: message; ...`` on one line."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {' '.join(err['msg'].split())}"
        for err in exc.errors()
    )


def load_model(model: type[_M], path: str | Path | None, *,
               overrides: Mapping[str, Any] | None = None) -> _M:
    """A settings model from a YAML file (optional) with ``overrides`` (flags) on top.

    Every error is one line that names the file and the field: ``FILE: invalid settings:
    pods.workers: Input should be greater than or equal to 1``.
    """
    data = read_yaml_mapping(path) if path is not None else {}
    data = _merge(data, overrides or {})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        prefix = f"{path}: " if path is not None else ""
        raise ConfigError(f"{prefix}invalid settings: {validation_problems(exc)}") from exc


def load_companion_settings(path: str | Path | None, *,
                            overrides: Mapping[str, Any] | None = None) -> CompanionSettings:
    """The companion's settings: ``--config`` (optional), flags on top."""
    return load_model(CompanionSettings, path, overrides=overrides)

"""The adapter for RunPod's REST API v2: :class:`RunPodProvider`.

Why it exists: RunPod runs one container per pod on rented GPUs, which is exactly what a virtual
kubelet needs, and REST v2 (``https://api.runpod.io/v2``) is the API RunPod keeps (v1 is retired
on 2026-11-15). This module maps :class:`~providers.base.InstanceSpec` onto ``POST /v2/pods`` and
RunPod's answers back onto :class:`~providers.base.Instance`, and turns every failure into one of
the typed errors of :mod:`providers.base`. Its HTTP edge is :mod:`providers.http` (shared with
the other adapters): httpx, tenacity retries only there, secrets never in messages or ``repr``.

Endpoints used: ``GET /v2/pods`` (list; the API does not paginate it), ``POST /v2/pods``
(create), ``GET /v2/pods/{id}`` (:meth:`RunPodProvider.get`), ``DELETE /v2/pods/{id}``,
``GET /v2/pods/{id}/logs`` (Server-Sent Events),
``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=...`` (capacity) and, for private
images, ``GET``/``POST /v2/registries`` and ``DELETE /v2/registries/{id}``.
:meth:`RunPodProvider.gpu_metrics_all` reads GPU utilization from the same ``GET /v2/pods`` as
``list`` (every pod carries ``runtime``; no extra parameter or call).

Ownership tags: RunPod pods have no labels, so the adapter stores the spec's tags plus
``vkprovider.io/node=<owner>`` as compact JSON in one environment variable, ``VKPROVIDER_TAGS``
(:data:`TAGS_ENV`), which ``GET /v2/pods`` returns with the pod. ``list`` keeps only pods whose
tags name this owner; pods without the variable are never ours. The container sees the
variable; it holds no secret. The pod's RunPod ``name`` is ``spec.name`` unchanged.

Idempotent create: RunPod names are not unique and the API has no idempotency key, so every
create attempt first lists the pods and adopts a live pod of this owner with ``spec.name``
(the oldest, if several); only if there is none does it POST. A retried attempt (after a
timeout or 5xx whose outcome is unknown) therefore lists again before posting again.

Mapping (see ``docs/providers/runpod.md`` for the tables):

* ``image`` -> ``image``; ``args`` -> ``args`` as one string (:func:`shlex.join`);
  ``command`` is refused with :class:`~providers.base.InvalidSpec` before any HTTP call, because
  v2 cannot override the image's ENTRYPOINT.
* ``env`` -> ``env`` (plus ``VKPROVIDER_TAGS``, which wins over a user variable of that name).
* ``ports`` -> ``ports`` as ``"<port>/http"`` when the port's name starts with ``http``
  (``http``, ``https``, ``http-metrics``...), else ``"<port>/tcp"``; UDP is refused (RunPod
  exposes only HTTP and TCP).
* ``gpu_type``/``gpu_count`` -> ``gpu: {id, count}`` (``id`` through option ``gpu_types``);
  ``gpu_count == 0`` makes a CPU pod only when option ``cpu_flavor`` is set.
* ``region`` -> ``dataCenterIds: [region]``; without one, option ``data_center_ids``.
* ``shm_bytes`` (a sized ``/dev/shm``) is refused with InvalidSpec: the create body has no
  field for it.
* ``run_as_user``/``run_as_group`` are left to the image (the create body has no user field).
* ``cpu_millis``/``memory_bytes`` are ignored for GPU pods (RunPod sizes vCPU and RAM by GPU);
  ``max_price_per_hour`` cannot be enforced (v2 has no bid or price cap, and no spot pods).
* ``interruptible`` (a spot pod) is refused with InvalidSpec: the REST v2 spec has no
  interruptible or spot field on create, so ``capacity()`` reports on-demand offers only and
  placement never asks for one; nor does it report a coming interruption (``interruption_at``
  is never set).

Published ports (:class:`~providers.base.PublishedPort`, only while the pod is ``RUNNING``): for
every declared ``Pod.ports`` entry ``"<port>/<kind>"``, in that order,

1. the direct mapping from ``runtime.ports`` (``PodRuntimePort``: ``private`` == the port,
   ``public`` the port on the host, ``ip`` the host's address) as kind ``"ip"``, when all
   three are set and ``ip`` is an address a client outside RunPod can dial (the spec does not
   say ``ip`` is public; what :func:`providers.addresses.refusal` refuses, e.g. private,
   carrier-grade NAT, loopback and link-local addresses, is skipped);
2. for ``http`` ports, RunPod's HTTP proxy ``<podId>-<port>.proxy.runpod.net`` on 443 with
   scheme ``https`` as kind ``"hostname"`` (a documented RunPod convention; the REST v2 spec
   has no field for it).

So an ``http`` port always has at least the proxy entry, a ``tcp`` port an entry only once
RunPod maps it; when both exist the direct mapping comes first. The v2 spec has no
``publicIp``/``portMappings`` fields (those are REST v1's); ``runtime.ports`` carries the same
facts per port.

Private images: a spec's ``registry_auth`` (the pod's ``imagePullSecrets``) becomes a RunPod
container registry credential (``/v2/registries``), whose id goes into the create body's
``registry``; it wins over the option ``registry_id`` (a node-wide default, as a node's own
credentials come after a pod's pull Secrets in the kubelet). RunPod's credentials hold only a
username and a password (no registry host; RunPod uses it for the pod's image), so both must be
non-empty, else the pod is refused (InvalidSpec naming ``imagePullSecrets``) before any call.
Because RunPod sends the credential to whatever registry the image names, ``registry_id`` goes
only with images whose registry the option ``registry_hosts`` names
(:mod:`providers.registryauth`); any other image is pulled anonymously. A pod's credential goes
only with an image of its own registry, too.

* Naming and reuse: the credential is named :meth:`RunPodProvider.registry_name`,
  ``vkp-<owner tag>-<digest>``: the owner tag is 8 hex digits of SHA-256(owner), the digest 24
  hex digits of HMAC-SHA-256 keyed with the API key over (registry, username, password). So a
  re-create (or another pod with the same credential) reuses the credential, a changed password
  makes a new one, and the name reveals nothing that could be guessed offline without the API
  key. Before a POST the adapter lists the credentials (``GET /v2/registries``) and reuses one
  with that name (the lowest id, if several). Only a create that has to POST a pod makes or
  reuses one (an adopted pod needs none).
* Cleanup: :meth:`RunPodProvider.sweep_registry_auth` deletes this owner's credentials (names
  starting ``vkp-<owner tag>-``) that no pod of the account references (``Pod.registry``) and no
  create in progress is about to use; RunPod refuses to delete one a pod still uses (400), which
  leaves it for the next sweep. ``delete`` does not clean up itself (RunPod may still report the
  terminating pod); it marks a sweep due, and the sweep is a no-op (no call) unless one is due or
  it is the first since start. The pod controller calls it through
  :func:`providers.base.sweep_registry_auth` after deletes and in its periodic sweep.
* Every password sent is scrubbed from the messages RunPod sends back.

Status mapping: ``PROVISIONING``/``STARTING`` -> PENDING, ``RUNNING`` -> RUNNING, ``EXITED`` and
``ERROR`` -> FAILED (v2 reports no exit code), ``TERMINATED`` -> FAILED from :meth:`get`; ``list``
leaves ``TERMINATED`` pods out, as RunPod does once the delete completes, so the service sees
them as gone.

Options (``options=`` mapping; read by :mod:`providers.options`, so a number may be a decimal
string, seconds may be written ``"30s"``, and an unknown key or a bad value is a ``ValueError``
naming the option):

``gpu_types`` (mapping, default ``{}``)
    The cluster's GPU name -> RunPod GPU type id, e.g. ``{"H100": "NVIDIA H100 80GB HBM3"}``;
    one-to-one. A name not in it is sent unchanged (so RunPod ids work as GPU types). When it
    is non-empty, :meth:`RunPodProvider.capacity` offers only the mapped types, under the
    cluster's names, and instances report their GPU type by the cluster's name.
``default_gpu_type`` (str, default none)
    The GPU type (a cluster name or a RunPod id) for specs without one. Without it such a spec
    is :class:`~providers.base.InvalidSpec`.
``cloud`` (``"SECURE"`` or ``"COMMUNITY"``, default ``"SECURE"``)
    The RunPod cloud tier for creates and for capacity and prices.
``data_center_ids`` (list of str, default ``[]``)
    Preferred data centers, in order, for specs without ``region``; when non-empty, capacity
    offers only these data centers.
``disk_gb`` (int >= 1, default none: RunPod's default)
    Container disk (ephemeral) in GB.
``volume_gb`` (int >= 10, default none) and ``volume_path`` (str, default ``/workspace``)
    A host-local persistent volume (GPU pods only).
``registry_id`` (str, default none)
    A RunPod container-registry credential id, for private images whose pod has no pull
    credential of its own (see "Private images"). Never deleted by the adapter.
``registry_hosts`` (list of ``host[:port][/path]``, ``*.`` wildcards; required with
``registry_id``)
    The registries ``registry_id`` is for: it is sent only with images of these registries.
``allowed_cuda_versions`` (list of ``"major.minor"``, default ``[]``) or ``min_cuda_version``
(``"major.minor"``, default none)
    CUDA constraints on the host, sent as ``gpu.allowedCudaVersions``/``gpu.minCudaVersion``;
    mutually exclusive.
``cpu_flavor`` (str, default none)
    A RunPod CPU flavor id (e.g. ``cpu3c``) for specs with ``gpu_count == 0``; vCPUs are
    ``cpu_millis`` rounded up to a power of two, at least 2.
``availability_gpus`` (mapping, default ``{"NONE": 0, "LOW": 1, "MEDIUM": 4, "HIGH": 8}``)
    RunPod reports stock as a level, not a count: how many GPUs each level counts as in an
    :class:`~providers.base.Offer` (capped at the type's largest machine, ``maxCount``).
``log_source`` (``"container"``, ``"system"`` or ``"all"``, default ``"container"``)
    Which RunPod log stream :meth:`RunPodProvider.logs` reads.
``logs_idle_seconds`` (float > 0, default 2.0)
    The SSE log stream never ends by itself; without ``follow``, logs end after this long
    without a new line (after the backfill).
``max_attempts`` (int >= 1, default 4), ``backoff_initial`` (default 0.1), ``backoff_max``
(default 2.0), ``retry_after_cap`` (default 5.0)
    Retries, as in :mod:`providers.http`: timeouts, connection errors and 5xx are
    retried with exponential backoff and jitter; a 429 is retried after its ``Retry-After``
    when that is at most ``retry_after_cap`` seconds, else raised at once.

Errors (RunPod answers RFC 9457 problem details ``{title, status, detail, errors?}``):
401/403 -> AuthError; 402, and a create 400 whose detail speaks of balance or quota ->
QuotaError; other create 400s -> CapacityError (the spec says a 400 on create means a broken
cross-field rule *or* no capacity for this GPU and data center, with no machine-readable code,
and tells clients to try the next candidate); other 400s and every 422 -> InvalidSpec; a create
404 (an unknown referenced object) -> InvalidSpec; other 404s -> NotFound; 429 -> RateLimited
(``Retry-After``, else the ``RateLimit`` header's reset of an exhausted window); 5xx, 408,
timeouts and connection errors -> TransientError; anything else -> ProviderError.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import hashlib
import hmac
import ipaddress
import json
import math
import re
import shlex
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx

from providers import options as opt
from providers.addresses import refusal
from providers.base import (
    TAG_NODE,
    CapacityError,
    Instance,
    InstanceSpec,
    InstanceState,
    InvalidSpec,
    LogOptions,
    NotFound,
    Offer,
    ProviderError,
    PublishedPort,
    QuotaError,
    RegistryAuth,
    TransientError,
)
from providers.http import (
    MAX_SERVER_MESSAGE,
    Answer,
    HTTPAdapter,
    RetryPolicy,
    parse_retry_after,
)
from providers.registryauth import (
    RegistryScope,
    RegistrySecrets,
    node_scope,
    pod_credential,
    refuse,
)

__all__ = [
    "ANY_REGION",
    "COMMAND_UNSUPPORTED",
    "DEFAULT_BASE_URL",
    "REGISTRY_PREFIX",
    "SHM_UNSUPPORTED",
    "STATUS_MAP",
    "TAGS_ENV",
    "RunPodProvider",
]

DEFAULT_BASE_URL = "https://api.runpod.io"
#: The environment variable that carries an instance's tags (RunPod pods have no labels).
TAGS_ENV = "VKPROVIDER_TAGS"
COMMAND_UNSUPPORTED = (
    "RunPod v2 cannot override the container entrypoint (command); use args or an image whose "
    "entrypoint does what you need"
)
INTERRUPTIBLE_UNSUPPORTED = (
    "RunPod's REST API v2 has no interruptible (spot) pods: its pod create takes no such field"
)
SHM_UNSUPPORTED = (
    "RunPod v2's pod create cannot size /dev/shm (the pod's memory-backed emptyDir at /dev/shm); "
    "drop the volume to run with RunPod's own /dev/shm"
)
#: RunPod v2 pod status -> instance state (``TERMINATED`` pods are also left out of ``list``).
STATUS_MAP: Mapping[str, InstanceState] = {
    "PROVISIONING": InstanceState.PENDING,
    "STARTING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "EXITED": InstanceState.FAILED,
    "ERROR": InstanceState.FAILED,
    "TERMINATED": InstanceState.FAILED,
}
_STATUS_MESSAGES = {
    "PROVISIONING": "RunPod is allocating a machine",
    "STARTING": "the container is starting",
    "EXITED": "the container exited (RunPod v2 reports no exit code)",
    "ERROR": "RunPod reports the container in an unrecoverable error state",
    "TERMINATED": "RunPod terminated the pod",
}
_PROXY_HOST = "{pod_id}-{port}.proxy.runpod.net"  # RunPod's documented proxy convention
_HTTP_PROXY = "https://" + _PROXY_HOST
_MAX_LOG_TAIL = 5000  # the API's maximum backfill
_QUOTA_WORDS = ("balance", "quota", "spend limit", "spending limit")
_CUDA_VERSION = re.compile(r"^\d+\.\d+$")
_LEVELS = ("NONE", "LOW", "MEDIUM", "HIGH")
_OPTION_KEYS = frozenset(
    {
        "gpu_types",
        "default_gpu_type",
        "cloud",
        "data_center_ids",
        "disk_gb",
        "volume_gb",
        "volume_path",
        "registry_id",
        "registry_hosts",
        "allowed_cuda_versions",
        "min_cuda_version",
        "cpu_flavor",
        "availability_gpus",
        "log_source",
        "logs_idle_seconds",
        "max_attempts",
        "backoff_initial",
        "backoff_max",
        "retry_after_cap",
    }
)
#: The region of an offer for a GPU type that no data center has in stock now.
ANY_REGION = "*"
#: Names of the container registry credentials the adapter makes start with this.
REGISTRY_PREFIX = "vkp-"


# -- options ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Options:
    gpu_types: Mapping[str, str] = field(default_factory=dict)
    default_gpu_type: str | None = None
    cloud: str = "SECURE"
    data_center_ids: tuple[str, ...] = ()
    disk_gb: int | None = None
    volume_gb: int | None = None
    volume_path: str = "/workspace"
    registry_id: str | None = None
    registry_scope: RegistryScope | None = None
    allowed_cuda_versions: tuple[str, ...] = ()
    min_cuda_version: str | None = None
    cpu_flavor: str | None = None
    availability_gpus: Mapping[str, int] = field(
        default_factory=lambda: {"NONE": 0, "LOW": 1, "MEDIUM": 4, "HIGH": 8}
    )
    log_source: str = "container"
    logs_idle_seconds: float = 2.0
    max_attempts: int = opt.DEFAULT_RETRY.max_attempts
    backoff_initial: float = opt.DEFAULT_RETRY.backoff_initial
    backoff_max: float = opt.DEFAULT_RETRY.backoff_max
    retry_after_cap: float = opt.DEFAULT_RETRY.retry_after_cap


def _parse_options(raw: Mapping[str, Any] | None) -> _Options:
    raw = raw or {}
    opt.reject_unknown(raw, _OPTION_KEYS)
    gpu_types = opt.mapping(raw, "gpu_types") or {}
    if not all(isinstance(v, str) and v for v in gpu_types.values()) or not all(gpu_types):
        raise opt.InvalidOption("gpu_types", "must map GPU names to RunPod GPU type ids (strings)")
    if len(set(gpu_types.values())) != len(gpu_types):
        raise opt.InvalidOption(
            "gpu_types", "must be one-to-one (two names map to one RunPod GPU type)")
    cuda = opt.strings(raw, "allowed_cuda_versions", pattern=_CUDA_VERSION,
                       hint='CUDA versions are "major.minor", e.g. "12.8"')
    min_cuda = opt.optional_string(raw, "min_cuda_version", pattern=_CUDA_VERSION,
                                   hint='CUDA versions are "major.minor", e.g. "12.8"')
    if cuda and min_cuda:
        raise opt.InvalidOption("min_cuda_version", "cannot be combined with allowed_cuda_versions")
    levels = dict(_Options().availability_gpus)
    given = opt.mapping(raw, "availability_gpus") or {}
    for level, count in given.items():
        if level not in _LEVELS:
            raise opt.InvalidOption("availability_gpus",
                                    "must map NONE/LOW/MEDIUM/HIGH to GPU counts")
        key = f"availability_gpus.{level}"
        levels[level] = opt.integer({key: count}, key, default=levels[level], minimum=0)
    retry = opt.retry_options(raw)
    return _Options(
        gpu_types=dict(gpu_types),
        default_gpu_type=opt.optional_string(raw, "default_gpu_type"),
        cloud=opt.choice(raw, "cloud", choices=("SECURE", "COMMUNITY"), default="SECURE"),
        data_center_ids=opt.strings(raw, "data_center_ids"),
        disk_gb=opt.optional_integer(raw, "disk_gb", minimum=1),
        volume_gb=opt.optional_integer(raw, "volume_gb", minimum=10),
        volume_path=opt.string(raw, "volume_path", default="/workspace"),
        registry_id=opt.optional_string(raw, "registry_id"),
        registry_scope=node_scope(raw, credential="registry_id"),
        allowed_cuda_versions=cuda,
        min_cuda_version=min_cuda,
        cpu_flavor=opt.optional_string(raw, "cpu_flavor"),
        availability_gpus=levels,
        log_source=opt.choice(raw, "log_source", choices=("container", "system", "all"),
                              default="container"),
        logs_idle_seconds=opt.duration(raw, "logs_idle_seconds", default=2.0, minimum=0,
                                       above=True),
        max_attempts=retry.max_attempts,
        backoff_initial=retry.backoff_initial,
        backoff_max=retry.backoff_max,
        retry_after_cap=retry.retry_after_cap,
    )


# -- small parsers ---------------------------------------------------------------------------


def _parse_ratelimit_reset(value: str | None) -> float | None:
    """The longest reset ``t`` among exhausted windows (``r=0``) of a ``RateLimit`` header.

    The header is a structured-field list such as ``"minute";r=0;t=12, "hour";r=2800;t=1812``.
    """
    if not value:
        return None
    waits: list[float] = []
    for member in value.split(","):
        params: dict[str, str] = {}
        for part in member.split(";")[1:]:
            key, _, val = part.strip().partition("=")
            params[key.strip()] = val.strip()
        try:
            if int(params.get("r", "1")) <= 0 and "t" in params:
                waits.append(max(0.0, float(params["t"])))
        except ValueError:
            continue
    return max(waits) if waits else None


def _opt_time(data: Mapping[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    if value is None:
        return None
    when = datetime.fromisoformat(str(value))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _decode_tags(env: Any) -> dict[str, str] | None:
    """The tags stored in a pod's env, or None when the pod carries none (it is not ours)."""
    if not isinstance(env, Mapping):
        return None
    raw = env.get(TAGS_ENV)
    if not isinstance(raw, str):
        return None
    try:
        tags = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(tags, dict):
        return None
    return {str(k): str(v) for k, v in tags.items()}


def _port_entry(port: int, name: str | None) -> str:
    kind = "http" if (name or "").lower().startswith("http") else "tcp"
    return f"{port}/{kind}"


def _port_number(value: Any) -> int | None:
    """A TCP/UDP port number (an int, or its decimal string), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and 1 <= value <= 65535 else None


def _reachable_ip(value: Any) -> str | None:
    """``value`` as an IP address a client outside RunPod can dial, else None.

    ``PodRuntimePort.ip`` is not documented as public, and RunPod's internal addresses (private,
    carrier-grade NAT, loopback, link-local) show up there routinely: a pod without a public IP,
    not a cloud lying. Such an address reaches nothing, so it is left out here quietly, judged
    by the same filter the service applies to every published address (providers/addresses.py)
    rather than a list of RunPod's own.
    """
    if not isinstance(value, str):
        return None
    try:
        address = str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None
    return None if refusal(address, kind="ip") is not None else address


def _published(
    pod_id: str, declared: Any, runtime_ports: Any
) -> tuple[PublishedPort, ...]:
    """How each declared port of a RUNNING pod is reached (see the module docstring)."""
    if not isinstance(declared, builtins.list):
        return ()
    direct: dict[int, PublishedPort] = {}
    for mapping in runtime_ports if isinstance(runtime_ports, builtins.list) else ():
        if not isinstance(mapping, Mapping):
            continue
        private, public = _port_number(mapping.get("private")), _port_number(mapping.get("public"))
        host = _reachable_ip(mapping.get("ip"))
        if private is None or public is None or host is None or private in direct:
            continue
        direct[private] = PublishedPort(container_port=private, host=host, port=public,
                                        kind="ip")
    published: builtins.list[PublishedPort] = []
    seen: set[int] = set()
    for entry in declared:
        port_text, _, kind = str(entry).partition("/")
        port = _port_number(port_text)
        if port is None or port in seen:
            continue
        seen.add(port)
        if port in direct:
            published.append(direct[port])
        if kind.lower() == "http":
            published.append(PublishedPort(
                container_port=port, host=_PROXY_HOST.format(pod_id=pod_id, port=port),
                port=443, kind="hostname", scheme="https",
            ))
    return tuple(published)


@dataclass(frozen=True, kw_only=True)
class _LogLine:
    ts: str
    line: str


class RunPodProvider(HTTPAdapter):
    """A :class:`~providers.base.Provider` for one RunPod account, scoped to ``owner``.

    ``transport`` replaces the network (e.g. ``httpx.ASGITransport(app=...)`` in tests). The API
    key goes into the client's default ``Authorization`` header and nowhere else; server text
    that echoes it is scrubbed before it reaches an error message.
    """

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        owner: str,
        api_key: str | None,
        timeout: float = 15.0,
        options: Mapping[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._opts = _parse_options(options)
        self._by_runpod_id = {v: k for k, v in self._opts.gpu_types.items()}
        super().__init__(
            name=name,
            # The API's paths start with /v2; accept a base URL given with or without it.
            base_url=(base_url or DEFAULT_BASE_URL).rstrip("/").removesuffix("/v2"),
            owner=owner,
            timeout=timeout,
            transport=transport,
            retry=RetryPolicy.of(self._opts),
            auth_headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            secret=api_key,
        )
        self._name_key = (api_key or "").encode()
        self._registry_owner_prefix = (
            f"{REGISTRY_PREFIX}{hashlib.sha256(owner.encode()).hexdigest()[:8]}-"
        )
        self._registry_lock = asyncio.Lock()
        self._registries_in_flight: collections.Counter[str] = collections.Counter()
        self._sweep_due = True  # the first sweep since start cleans up after an earlier run
        self._registry_secrets = RegistrySecrets()

    def _scrub(self, text: str) -> str:
        """``text`` without the API key or any registry password this adapter has sent."""
        return self._registry_secrets.scrub(super()._scrub(text))

    @property
    def runs_without_gpu(self) -> bool:
        """A GPU-less pod becomes a CPU pod only with option ``cpu_flavor``."""
        return self._opts.cpu_flavor is not None

    # -- the Provider protocol --------------------------------------------------------------

    async def create(self, spec: InstanceSpec) -> Instance:
        """Adopt this owner's live pod named ``spec.name``, or create it (list-before-create)."""
        body = self.create_body(spec)  # InvalidSpec before any HTTP call
        auth = pod_credential(spec)
        self._registry_secrets.remember(auth)
        what = f"create pod {spec.name!r}"

        async def attempt() -> Instance:
            existing = [i for i in await self._list_once(what=what) if i.name == spec.name]
            if existing:
                return min(existing, key=lambda i: i.created_at or datetime.max.replace(tzinfo=UTC))
            if auth is None:
                return await post(body)
            registry_id = await self._registry_for(spec, auth)
            try:
                return await post({**body, "registry": registry_id})
            finally:
                self._registries_in_flight[registry_id] -= 1
                if self._registries_in_flight[registry_id] <= 0:
                    del self._registries_in_flight[registry_id]

        async def post(data: Mapping[str, Any]) -> Instance:
            request = self._client.build_request("POST", "/v2/pods", json=data)
            response = await self._send(request, what=what, stream=False, op="create")
            return self._instance(self._json(response, what=what), what=what)

        return await self._retrying(attempt)

    def registry_name(self, auth: RegistryAuth) -> str:
        """The name of the RunPod credential for ``auth`` (see "Private images"); no secret."""
        message = "\0".join((auth.registry, auth.username, auth.password)).encode()
        digest = hmac.new(self._name_key, message, hashlib.sha256).hexdigest()[:24]
        return f"{self._registry_owner_prefix}{digest}"

    async def _registry_for(self, spec: InstanceSpec, auth: RegistryAuth) -> str:
        """The id of the credential named for ``auth``, made when missing; held as in flight.

        The caller releases it (``_registries_in_flight``) once its pod POST is answered.
        """
        name = self.registry_name(auth)
        async with self._registry_lock:
            try:
                found = [r["id"] for r in await self._registries(what="list registry credentials")
                         if r["name"] == name]
                if found:
                    registry_id = min(found)
                else:
                    what = f"create registry credential {name}"
                    payload = {"name": name, "username": auth.username, "password": auth.password}
                    request = self._client.build_request("POST", "/v2/registries", json=payload)
                    response = await self._send(request, what=what, stream=False,
                                                op="create-registry")
                    made = self._json(response, what=what).get("id")
                    if not isinstance(made, str) or not made:
                        raise self._malformed(what)
                    registry_id = made
            except InvalidSpec as exc:
                raise refuse(self.name, "RunPod", spec, auth,
                             f"was refused by RunPod: {exc}") from None
            self._registries_in_flight[registry_id] += 1
            return registry_id

    async def _registries(self, *, what: str) -> builtins.list[dict[str, str]]:
        """Every container registry credential of the account: ``[{id, name}]``."""
        request = self._client.build_request("GET", "/v2/registries")
        data = self._json(await self._send(request, what=what, stream=False, op="registries"),
                          what=what)
        items = data.get("registries")
        if not isinstance(items, builtins.list):
            raise self._malformed(what)
        out: builtins.list[dict[str, str]] = []
        for item in items:
            if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
                raise self._malformed(what)
            out.append({"id": item["id"], "name": str(item.get("name") or "")})
        return out

    async def sweep_registry_auth(self) -> int:
        """Delete this owner's registry credentials that no pod uses; how many were deleted.

        A no-op (no call) unless a ``delete`` happened since the last complete sweep, or it is
        the first since start. Credentials RunPod refuses to delete (a pod still uses one) are
        left for the next sweep. Errors other than that propagate (the sweep stays due).
        """
        if not self._sweep_due:
            return 0
        what = "sweep registry credentials"

        async def attempt() -> int:
            async with self._registry_lock:
                request = self._client.build_request("GET", "/v2/pods")
                pods = self._json(await self._send(request, what=what, stream=False, op="list"),
                                  what=what).get("pods")
                if not isinstance(pods, builtins.list):
                    raise self._malformed(what)
                used = {str(p.get("registry")) for p in pods
                        if isinstance(p, Mapping) and p.get("registry")}
                used.update(self._registries_in_flight)
                unused = [r["id"] for r in await self._registries(what=what)
                          if r["name"].startswith(self._registry_owner_prefix)
                          and r["id"] not in used]
                deleted, kept = 0, 0
                for registry_id in unused:
                    path = f"/v2/registries/{quote(registry_id, safe='')}"
                    request = self._client.build_request("DELETE", path)
                    try:
                        await self._send(request, what=f"delete registry credential "
                                         f"{registry_id}", stream=False, op="delete-registry")
                        deleted += 1
                    except NotFound:
                        continue  # gone already
                    except InvalidSpec:
                        kept += 1  # a pod still uses it (RunPod answers 400): next sweep
                self._sweep_due = kept > 0
                return deleted

        return await self._retrying(attempt)

    async def list(self) -> list[Instance]:
        """Every live pod tagged with our owner, from one ``GET /v2/pods``."""
        what = "list pods"
        return await self._retrying(lambda: self._list_once(what=what))

    async def gpu_metrics_all(self) -> dict[str, dict[str, Any]]:
        """GPU figures of every live pod of our owner, by pod id, from ONE ``GET /v2/pods``.

        The same call, owner filter and retries as :meth:`list` (whose ids are the keys). Each
        pod's ``runtime.gpus`` (``PodGpuUtilization``, one per GPU, in order) becomes
        ``{index, gpu_type, gpu_utilization}``. ``util`` is taken as a percentage (0-100):
        the spec gives ``PodGpuUtilization`` no unit, but its sibling ``Utilization`` (the
        pod's ``cpu``/``memory``) is documented as a percentage and the examples (94, 78)
        agree. ``memoryUtil`` is dropped: the pod does not report its GPUs' memory size
        (``gpu`` is only ``{id, count}``), so it cannot become bytes. RunPod reports no GPU
        UUID, temperature, power or tensor activity. ``runtime`` is null unless the pod is
        RUNNING; such pods, and running ones without ``runtime.gpus``, get ``gpus: []``.
        """
        what = "read GPU metrics"

        async def attempt() -> dict[str, dict[str, Any]]:
            pods = await self._owned_pods(what=what)
            return {instance.id: self._gpu_figures(instance, pod) for instance, pod in pods}

        return await self._retrying(attempt)

    async def get(self, instance_id: str) -> Instance:
        """One pod by id (not in the protocol); NotFound when it is gone."""
        what = f"get pod {instance_id}"

        async def attempt() -> Instance:
            request = self._client.build_request("GET", self._pod_path(instance_id))
            response = await self._send(request, what=what, stream=False, op="get")
            return self._instance(self._json(response, what=what), what=what)

        return await self._retrying(attempt)

    async def delete(self, instance_id: str) -> None:
        """Terminate the pod; a pod that is already gone (404) is not an error."""
        what = f"delete pod {instance_id}"

        async def attempt() -> None:
            request = self._client.build_request("DELETE", self._pod_path(instance_id))
            await self._send(request, what=what, stream=False, op="delete")

        try:
            await self._retrying(attempt)
        except NotFound:
            return
        finally:
            self._sweep_due = True  # its registry credential may be unused now

    async def logs(self, instance_id: str, opts: LogOptions) -> AsyncGenerator[bytes, None]:
        """The pod's log lines (``GET /v2/pods/{id}/logs``, SSE) as bytes, one line a chunk.

        ``tail_lines`` becomes ``tail`` (at most 5000, the API's limit; without it the adapter
        asks for 5000, as close to "everything" as the API allows); ``since_seconds`` becomes
        ``since`` (then RunPod ignores ``tail``, and without ``follow`` the adapter keeps the
        last ``tail_lines`` itself). Without ``follow`` the stream ends after
        ``logs_idle_seconds`` without a line. ``timestamps`` prefixes each line with the event's
        ``ts``; ``limit_bytes`` truncates the output.
        """
        if not opts.follow and opts.tail_lines == 0 and opts.since_seconds is None:
            return  # nothing to backfill and nothing to wait for
        params: dict[str, str | int] = {}
        if self._opts.log_source != "all":
            params["source"] = self._opts.log_source
        if opts.since_seconds is not None:
            since = datetime.now(UTC) - timedelta(seconds=max(0, opts.since_seconds))
            params["since"] = _rfc3339(since.replace(microsecond=0))
        else:
            tail = _MAX_LOG_TAIL if opts.tail_lines is None else opts.tail_lines
            params["tail"] = max(0, min(tail, _MAX_LOG_TAIL))
        what = f"logs of pod {instance_id}"
        timeout = httpx.Timeout(self._timeout, read=None)

        async def open_stream() -> httpx.Response:
            request = self._client.build_request(
                "GET",
                f"{self._pod_path(instance_id)}/logs",
                params=params,
                headers={"Accept": "text/event-stream"},
                timeout=timeout,
            )
            try:
                async with asyncio.timeout(self._timeout):
                    return await self._send(request, what=what, stream=True, op="logs")
            except TimeoutError:
                raise TransientError(
                    f"{self.name}: {what} failed: timed out waiting for the stream",
                    provider=self.name,
                ) from None

        response = await self._retrying(open_stream)
        keep: collections.deque[bytes] | None = None
        if not opts.follow and opts.tail_lines is not None and opts.since_seconds is not None:
            keep = collections.deque(maxlen=max(0, opts.tail_lines))
        budget = opts.limit_bytes
        events = self._sse_lines(response, follow=opts.follow, what=what)
        try:
            async for event in events:
                text = f"{event.ts} {event.line}\n" if opts.timestamps else f"{event.line}\n"
                chunk = text.encode()
                if keep is not None:
                    keep.append(chunk)
                    continue
                if budget is not None:
                    chunk = chunk[: max(0, budget)]
                    budget -= len(chunk)
                if chunk:
                    yield chunk
                if budget is not None and budget <= 0:
                    return
            for chunk in keep or ():
                if budget is not None:
                    chunk = chunk[: max(0, budget)]
                    budget -= len(chunk)
                if chunk:
                    yield chunk
                if budget is not None and budget <= 0:
                    return
        finally:
            await events.aclose()
            await response.aclose()

    async def capacity(self) -> builtins.list[Offer]:
        """One offer per (GPU type, data center) from ``GET /v2/catalog/gpus``.

        RunPod reports stock as a level per data center; ``availability_gpus`` turns it into a
        count, capped at the type's largest machine. A type stocked nowhere still gets one offer
        (region ``*``, 0 available) so that the service knows RunPod sells it.
        """
        what = "read the GPU catalog"
        cloud = self._opts.cloud.lower()
        params = {"include": "AVAILABILITY", "product": "POD", "cloud": self._opts.cloud}

        async def attempt() -> httpx.Response:
            request = self._client.build_request("GET", "/v2/catalog/gpus", params=params)
            return await self._send(request, what=what, stream=False, op="capacity")

        data = self._json(await self._retrying(attempt), what=what)
        wanted = set(self._opts.data_center_ids)
        offers: builtins.list[Offer] = []
        try:
            for gpu in data["gpus"]:
                runpod_id = str(gpu["id"])
                if self._opts.gpu_types and runpod_id not in self._by_runpod_id:
                    continue
                max_count = int(gpu["maxCount"][cloud])
                if not gpu.get(cloud) or max_count <= 0:
                    continue
                gpu_type = self._cluster_gpu_type(runpod_id)
                price = float(gpu["price"][cloud])
                found = False
                for dc in gpu.get("dataCenters") or ():
                    region = str(dc["id"])
                    if wanted and region not in wanted:
                        continue
                    level = str(dc["availability"])
                    available = min(max_count, self._opts.availability_gpus.get(level, 0))
                    offers.append(
                        Offer(
                            provider=self.name,
                            gpu_type=gpu_type,
                            region=region,
                            available=available,
                            price_per_gpu_hour=price,
                        )
                    )
                    found = True
                if not found:
                    offers.append(
                        Offer(
                            provider=self.name,
                            gpu_type=gpu_type,
                            region=ANY_REGION,
                            available=0,
                            price_per_gpu_hour=price,
                        )
                    )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed(what) from exc
        return offers

    # -- mapping ----------------------------------------------------------------------------

    def create_body(self, spec: InstanceSpec) -> dict[str, Any]:
        """The ``POST /v2/pods`` body for ``spec``; InvalidSpec for what RunPod v2 cannot run."""
        p = self.name
        if spec.command:
            raise InvalidSpec(COMMAND_UNSUPPORTED, provider=p)
        if spec.shm_bytes is not None:
            raise InvalidSpec(SHM_UNSUPPORTED, provider=p)
        if spec.interruptible:
            raise InvalidSpec(INTERRUPTIBLE_UNSUPPORTED, provider=p)
        if not spec.image:
            raise InvalidSpec("the pod has no image", provider=p)
        if not spec.name:
            raise InvalidSpec("the instance has no name", provider=p)
        env = {str(k): str(v) for k, v in spec.env.items()}
        tags = {**spec.tags, TAG_NODE: self.owner}
        env[TAGS_ENV] = json.dumps(tags, sort_keys=True, separators=(",", ":"))
        ports: builtins.list[str] = []
        for port in spec.ports:
            if port.protocol.upper() != "TCP":
                raise InvalidSpec(
                    f"port {port.container_port}/{port.protocol}: RunPod exposes only HTTP and "
                    "TCP ports",
                    provider=p,
                )
            if not 1 <= port.container_port <= 65535:
                raise InvalidSpec(f"port {port.container_port} is out of range", provider=p)
            entry = _port_entry(port.container_port, port.name)
            if entry not in ports:
                ports.append(entry)
        body: dict[str, Any] = {"name": spec.name, "image": spec.image, "env": env}
        if spec.args:
            body["args"] = shlex.join(spec.args)
        if ports:
            body["ports"] = ports
        body["cloud"] = self._opts.cloud
        if spec.gpu_count > 0:
            body["gpu"] = self._gpu_config(spec)
            if self._opts.volume_gb is not None:
                body["mounts"] = {
                    "persistent": {"size": self._opts.volume_gb, "path": self._opts.volume_path}
                }
        elif spec.gpu_count == 0 and self._opts.cpu_flavor:
            vcpus = max(2, math.ceil(spec.cpu_millis / 1000))
            body["cpu"] = {"id": self._opts.cpu_flavor, "vcpuCount": 1 << (vcpus - 1).bit_length()}
        else:
            raise InvalidSpec(
                f"{spec.gpu_count} GPUs requested; RunPod pods need at least one GPU unless "
                f"the provider option cpu_flavor is set",
                provider=p,
            )
        region = spec.region if spec.region and spec.region != ANY_REGION else None
        data_centers = [region] if region else list(self._opts.data_center_ids)
        if data_centers:
            body["dataCenterIds"] = data_centers
        if self._opts.disk_gb is not None:
            body["disk"] = self._opts.disk_gb
        auth = pod_credential(spec)
        if auth is not None:
            for what, value in (("username", auth.username), ("password", auth.password)):
                if not value:
                    raise refuse(p, "RunPod", spec, auth, f"has an empty {what}; RunPod's "
                                 "registry credentials need a username and a password")
            # the credential's id is added by create (it needs a call to find or make it)
        elif (self._opts.registry_id is not None and self._opts.registry_scope is not None
              and self._opts.registry_scope.covers(spec.image)):
            body["registry"] = self._opts.registry_id
        return body

    def _gpu_config(self, spec: InstanceSpec) -> dict[str, Any]:
        gpu_type = spec.gpu_type or self._opts.default_gpu_type
        if not gpu_type:
            raise InvalidSpec(
                "the pod names no GPU type and the provider option default_gpu_type is not set",
                provider=self.name,
            )
        gpu: dict[str, Any] = {
            "id": self._opts.gpu_types.get(gpu_type, gpu_type),
            "count": spec.gpu_count,
        }
        if self._opts.allowed_cuda_versions:
            gpu["allowedCudaVersions"] = list(self._opts.allowed_cuda_versions)
        if self._opts.min_cuda_version:
            gpu["minCudaVersion"] = self._opts.min_cuda_version
        return gpu

    def _pod_path(self, instance_id: str) -> str:
        if not instance_id:
            raise NotFound(f"{self.name}: an empty pod id names no pod", provider=self.name)
        return f"/v2/pods/{quote(instance_id, safe='')}"

    def _cluster_gpu_type(self, runpod_id: str) -> str:
        return self._by_runpod_id.get(runpod_id, runpod_id)

    def _instance(self, data: Any, *, what: str) -> Instance:
        try:
            status = str(data["status"])
            state = STATUS_MAP[status]
            pod_id = str(data["id"])
            gpu = data.get("gpu") or {}
            runtime = data.get("runtime") or {}
            endpoints: builtins.list[str] = []
            ip: str | None = None
            if status == "RUNNING":
                for entry in data.get("ports") or ():
                    port, _, kind = str(entry).partition("/")
                    if kind == "http":
                        endpoints.append(_HTTP_PROXY.format(pod_id=pod_id, port=port))
                for mapping in runtime.get("ports") or ():
                    host, public = mapping.get("ip"), mapping.get("public")
                    if host and ip is None:
                        ip = str(host)
                    if host and public and mapping.get("type") == "tcp":
                        endpoints.append(f"{host}:{public}")
            return Instance(
                id=pod_id,
                name=str(data["name"]),
                provider=self.name,
                state=state,
                tags=_decode_tags(data.get("env")) or {},
                gpu_type=self._cluster_gpu_type(str(gpu["id"])) if gpu.get("id") else None,
                gpu_count=int(gpu.get("count") or 0),
                region=None if data.get("dataCenterId") is None else str(data["dataCenterId"]),
                price_per_hour=float(data.get("cost") or 0.0),
                ip=ip,
                endpoints=tuple(endpoints),
                published=(
                    _published(pod_id, data.get("ports"),
                               runtime.get("ports") if isinstance(runtime, Mapping) else None)
                    if status == "RUNNING" else ()
                ),
                created_at=_opt_time(data, "createdAt"),
                started_at=_opt_time(data, "startedAt"),
                message=_STATUS_MESSAGES.get(status),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed(what) from exc

    async def _list_once(self, *, what: str) -> builtins.list[Instance]:
        return [instance for instance, _ in await self._owned_pods(what=what)]

    async def _owned_pods(
        self, *, what: str
    ) -> builtins.list[tuple[Instance, Mapping[str, Any]]]:
        """This owner's live pods, each with its raw JSON, from ONE ``GET /v2/pods``."""
        request = self._client.build_request("GET", "/v2/pods")
        response = await self._send(request, what=what, stream=False, op="list")
        data = self._json(response, what=what)
        pods = data.get("pods")
        if not isinstance(pods, builtins.list):
            raise self._malformed(what)
        mine: builtins.list[tuple[Instance, Mapping[str, Any]]] = []
        for pod in pods:
            if not isinstance(pod, Mapping):
                raise self._malformed(what)
            tags = _decode_tags(pod.get("env"))
            if tags is None or tags.get(TAG_NODE) != self.owner:
                continue  # not ours (another node's, or made by hand)
            if pod.get("status") == "TERMINATED":
                continue  # gone: the service must see it as deleted
            mine.append((self._instance(pod, what=what), pod))
        return mine

    @staticmethod
    def _gpu_figures(instance: Instance, pod: Mapping[str, Any]) -> dict[str, Any]:
        """One pod's ``gpu_metrics`` body, from its ``runtime.gpus`` (see gpu_metrics_all)."""
        runtime = pod.get("runtime")
        raw = runtime.get("gpus") if isinstance(runtime, Mapping) else None
        gpus: builtins.list[dict[str, Any]] = []
        for index, item in enumerate(raw if isinstance(raw, builtins.list) else ()):
            if not isinstance(item, Mapping):
                continue
            gpu: dict[str, Any] = {"index": index}
            if instance.gpu_type:
                gpu["gpu_type"] = instance.gpu_type
            util = item.get("util")
            if not isinstance(util, bool) and isinstance(util, int | float) and math.isfinite(util):
                gpu["gpu_utilization"] = float(util)
            gpus.append(gpu)
        return {"instance_id": instance.id, "state": instance.state.value, "gpus": gpus}

    # -- logs -------------------------------------------------------------------------------

    async def _sse_lines(
        self, response: httpx.Response, *, follow: bool, what: str
    ) -> AsyncGenerator[_LogLine, None]:
        """Parse the SSE stream into log lines; without ``follow``, stop when it goes idle."""
        lines = response.aiter_lines()
        data: builtins.list[str] = []
        while True:
            try:
                if follow:
                    raw = await anext(lines)
                else:
                    async with asyncio.timeout(self._opts.logs_idle_seconds):
                        raw = await anext(lines)
            except StopAsyncIteration:
                break
            except TimeoutError:
                return
            except httpx.TransportError as exc:
                raise self._transport_error(exc, what=what) from exc
            if raw == "":
                if data:
                    event = self._log_event("\n".join(data))
                    data = []
                    if event is not None:
                        yield event
                continue
            if raw.startswith(":"):
                continue  # an SSE comment (keep-alive)
            field_name, _, value = raw.partition(":")
            if field_name == "data":
                data.append(value[1:] if value.startswith(" ") else value)
        if data:
            event = self._log_event("\n".join(data))
            if event is not None:
                yield event

    @staticmethod
    def _log_event(payload: str) -> _LogLine | None:
        try:
            data = json.loads(payload)
        except ValueError:
            return _LogLine(ts="", line=payload)  # not the documented JSON: pass it through
        if not isinstance(data, dict) or "line" not in data:
            return None
        return _LogLine(ts=str(data.get("ts") or ""), line=str(data["line"]).rstrip("\n"))

    # -- the HTTP edge (the rest is providers.http.HTTPAdapter) ----------------------------

    def _problem(self, response: Answer) -> tuple[str, str, builtins.list[str]]:
        """``(title, detail, errors)`` of an RFC 9457 problem document (empty when absent)."""
        try:
            data = response.json()
        except ValueError:
            return "", "", []
        if not isinstance(data, dict):
            return "", "", []

        def clean(value: Any) -> str:
            return self._scrub(str(value))[:MAX_SERVER_MESSAGE]

        title = clean(data.get("title") or "")
        detail = clean(data.get("detail") or "")
        raw_errors = data.get("errors")
        errors = (
            [clean(e) for e in raw_errors[:5]] if isinstance(raw_errors, builtins.list) else []
        )
        return title, detail, errors

    def _retry_after(self, response: Answer) -> float | None:
        """``Retry-After``, else the ``RateLimit`` header's reset of an exhausted window."""
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        if retry_after is None:
            retry_after = _parse_ratelimit_reset(response.headers.get("RateLimit"))
        return retry_after

    def _status_error(self, response: Answer, *, what: str, op: str) -> ProviderError:
        status = response.status_code
        title, detail, errors = self._problem(response)
        message = self._status_message(what, status, label=title, detail=detail)
        if errors:
            message += f" ({'; '.join(errors)})"
        p = self.name
        if op == "create" and status == 400:
            if any(word in detail.lower() for word in _QUOTA_WORDS):
                return QuotaError(message, provider=p)
            return CapacityError(message, provider=p)
        if op == "create" and status == 404:
            return InvalidSpec(message, provider=p)
        if status == 408:
            return TransientError(message, provider=p)
        return self._classify(response, message)

"""The SaladCloud adapter: :class:`SaladProvider`.

Why it exists: SaladCloud runs containers as *container groups* (a spec plus a replica count) on
interruptible consumer GPUs. This module runs each instance as a one-replica container group in
one organization's project, and maps Salad's group states and RFC 7807 ProblemDetails errors onto
:mod:`providers.base`, so the service can treat SaladCloud like any other cloud. It follows
``tests/specs/salad/salad-cloud.yaml`` (SaladTechnologies/salad-cloud-docs, 0.9.0-alpha.17).

Names: a container group name must match ``^[a-z][a-z0-9-]{0,61}[a-z0-9]$`` (2-63 characters).
:func:`salad_name` derives it from ``spec.name`` deterministically:

1. if ``spec.name`` already matches, it is used as is;
2. otherwise it is lower-cased, every run of other characters becomes ``-``, leading characters
   up to the first letter and trailing ``-`` are dropped, the rest is cut to 52 characters
   (``"vk"`` if nothing is left) and ``-`` plus the first 10 hex digits of SHA-256(``spec.name``)
   is appended, so two different names never share a group by accident.

Tags: Salad has no labels or tags, so the instance's identity (``spec.name``, the cluster GPU type,
the quoted price and the tags, with ``vkprovider.io/node`` set to ``owner``) travels in the
container's environment variable ``VKPROVIDER_INSTANCE`` as compact JSON. ``list`` keeps the
groups of the project whose variable names our ``owner``; groups without it are never touched.
The container sees this variable; it holds no secret.

Idempotency: ``create`` first GETs the group by its derived name and adopts it when its
``VKPROVIDER_INSTANCE`` names the same ``spec.name`` (a name taken by anything else is an error,
never adopted). A create that races another answers 409, and the group is then read and adopted.
Groups are created with ``autostart_policy: true``; a group found ``stopped`` by ``create`` is
started (``POST .../start``).

Published ports (:class:`~providers.base.PublishedPort`): Salad exposes at most one port per
group, through its container gateway. The group's ``networking`` (``ContainerGroupNetworking``)
gives ``port`` (the container port) and ``dns`` (the access domain name); the adapter reports one
kind ``"hostname"`` entry: host ``dns``, port 443, scheme ``https`` (the gateway serves HTTPS
and speaks ``networking.protocol``, always ``http``, to the container). A group without
``networking``, ``dns`` or ``port`` reports none. The name is screened by the service like every
published address (:mod:`providers.addresses`: an in-cluster name or an IP literal is refused).
With ``networking.auth`` (option ``networking_auth``) callers must also send a Salad API key:
the entry's ``edge_auth`` is then ``Salad-Api-Key``, so the provider's probes and its traffic
gateway add the account's key (clients never see it).

Shared memory: a spec's ``shm_bytes`` (a pod's memory-backed emptyDir at ``/dev/shm``) becomes
``container.resources.shm_size`` in MB, rounded up, at most the container's ``memory`` (as the
kubelet bounds a memory-backed emptyDir by the memory limit) and at least Salad's minimum, 64;
``shm_bytes == 0`` (no size asked) is the container's ``memory``. Without it the field is left
out and Salad's default (64 MB) applies.

Interruptible nodes: every SaladCloud node is an interruptible consumer GPU, at any
``priority`` (the spec's ``ContainerGroupPriority``: high, medium, low, batch, the price tier and
scheduling precedence). Salad moves an interrupted replica to another node itself (the container
group keeps its replica count), and its spec has no field that announces an interruption or says
a replica was interrupted: so the adapter reports Salad's offers as ordinary ones (a policy with
``interruptible: Never`` uses Salad as before; Salad's reallocations show as the group pending
or restarting), accepts a spec asking for an interruptible instance (every node is one) at the
configured ``priority``, and never sets ``interruption_at`` or ``interrupted``.

Options (the ``options`` mapping; read by :mod:`providers.options`, so a boolean is
``true``/``false`` (also ``"true"``/``"false"``, ``"yes"``/``"no"``, ``1``/``0``), a number may be
a decimal string, seconds may be written ``"30s"``, and an unknown key or a bad value is a
``ValueError`` naming the option):

``organization``, ``project`` (str, required)
    Where the container groups live (both must already exist).
``gpu_types`` (mapping str -> str or list of str, default empty)
    Cluster GPU name -> Salad GPU class names or ids, e.g. ``{"RTX4090": ["RTX 4090 (24 GB)"]}``.
    Without an entry, a GPU type matches the classes named exactly like it, or named like it
    followed by a space (``"RTX 4090"`` matches ``"RTX 4090 (24 GB)"``). With a non-empty map,
    ``capacity()`` reports only mapped types, under their cluster names.
``priority`` (``"high"`` | ``"medium"`` | ``"low"`` | ``"batch"``, default ``"high"``)
    Container priority: the price tier (and how readily Salad interrupts the node).
``restart_policy`` (``"never"`` | ``"on_failure"`` | ``"always"``, default ``"never"``)
    With ``never``, a container that exits ends the group (``succeeded``/``failed``), which is
    what lets a pod finish.
``default_cpu`` (int vCPU, default 1), ``default_memory_mb`` (int, default 1024)
    Used when the pod requests no CPU/memory. Requests are rounded up to whole vCPUs and to at
    least 1024 MB (Salad's minimum).
``storage_gb`` (int, default none)
    Container storage (``storage_amount``; at least 1).
``country_codes`` (list of ISO 3166-1 alpha-2 codes, default none = anywhere)
    Where groups may run when the spec names no region.
``region`` (str, default ``"global"``)
    The region name ``capacity()`` reports; a spec with this region (or none) uses
    ``country_codes``; a spec with a two-letter region runs in that country.
``networking_auth`` (bool, default true)
    Whether Salad's container gateway requires a Salad API key from callers
    (``networking.auth``). On by default: the access domain is public, and the provider's
    probes and traffic gateway send the key themselves (the entry's ``edge_auth``).
``check_availability`` (bool, default true)
    Before creating a GPU group, ask ``sce-gpu-availability``; none free is a CapacityError
    (so placement can try elsewhere) instead of a group that waits for a node.
``registry_authentication`` (mapping, default none)
    Passed as ``container.registry_authentication`` for private images whose pod has no pull
    credential of its own; any kind the spec lists (``basic``, ``docker_hub``, ``aws_ecr``,
    ``gcp_gar``, ``gcp_gcr``). Secret.
``registry_hosts`` (list of ``host[:port][/path]``, ``*.`` wildcards; required with
``registry_authentication``)
    The registries ``registry_authentication`` is for: it is sent only with images of these
    registries; other images are pulled anonymously (:mod:`providers.registryauth`).
``gpu_classes_ttl`` (float seconds, default 300)
    How long the GPU class list is cached.
``log_poll_interval`` (float seconds, default 2.0)
    How often ``logs(follow=True)`` asks for new entries.
``max_attempts`` (int >= 1, default 4), ``backoff_initial`` (default 0.1), ``backoff_max``
(default 2.0), ``retry_after_cap`` (default 5.0)
    Retries at the HTTP edge: timeouts, connection errors and 5xx are retried; a 429 after its
    ``Retry-After`` when at most ``retry_after_cap`` (Salad documents no ``Retry-After``; without
    one, backoff is exponential).

Private images: a spec's ``registry_auth`` (the pod's ``imagePullSecrets``) becomes
``container.registry_authentication: {basic: {username, password}}`` and wins over the option
``registry_authentication``. Only ``basic`` is built from a pull Secret: a dockerconfigjson entry
holds a username and a password, which is what ``basic`` takes, while Salad's cloud-specific kinds
need what a pull Secret does not hold (``aws_ecr``: an access key pair, not ECR's 12-hour
token; ``gcp_gar``/``gcp_gcr``: a service account key; ``docker_hub``: the same username and
token as ``basic``). Those kinds are available through the option. The spec allows 1 to 10000
characters without a line break in each field; a credential outside that is refused
(InvalidSpec naming ``imagePullSecrets``) before any call. Salad keeps the credential with the
container group, which ``delete`` removes, so there is nothing else to clean up. Every password
sent is scrubbed from the messages Salad sends back. Salad sends the credential to whatever
registry the image names, so a pod's credential goes only with an image of its own registry and
the option only with images of its ``registry_hosts``.

Not supported, and said so (InvalidSpec, before any HTTP call) rather than ignored: more than one
GPU (one GPU per Salad node), ``args`` without ``command`` (Salad's ``command`` replaces the
image's ENTRYPOINT and CMD, so there is no way to pass arguments to the ENTRYPOINT), more than one
port or a UDP port (Salad's gateway exposes one HTTP port), environment values that are empty,
hold a line break or exceed 1000 characters (the spec's limits), and exit codes (Salad reports
none).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import hashlib
import json
import math
import re
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx

from providers import options as opt
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
)
from providers.http import MAX_SERVER_MESSAGE, Answer, HTTPAdapter, RetryPolicy
from providers.registryauth import RegistrySecrets, node_scope, pod_credential, refuse

__all__ = ["META_ENV", "SaladProvider", "map_status", "salad_name"]

#: The environment variable that carries an instance's identity and tags.
META_ENV = "VKPROVIDER_INSTANCE"
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,61}[a-z0-9]$")
_COUNTRY = re.compile(r"^[a-z]{2}$")
_ENV_MAX = 1000
_REGISTRY_FIELD_MAX = 10000  # ContainerRegistryAuthenticationBasic: maxLength, pattern ^.*$
_LINE_BREAK = re.compile("[\n\r\u2028\u2029]")
_ARG_MAX = 1000
_SHM_MIN_MB = 64  # CreateContainerResourceRequirements.shm_size: minimum (and its default)
_LOG_PAGE = 100
_PRICE_ROOM = 16  # the price in VKPROVIDER_INSTANCE is filled in after the spec is checked
_PRIORITIES = ("high", "medium", "low", "batch")
_RESTART_POLICIES = ("always", "on_failure", "never")
_TERMINAL = ("succeeded", "failed", "stopped")
_QUOTA_WORDS = ("quota", "limit exceeded", "insufficient", "balance", "payment")
_CAPACITY_WORDS = ("capacity", "no available", "not available", "unavailable")


#: The header SaladCloud's container gateway wants the account's API key in (networking.auth).
SALAD_EDGE_AUTH_HEADER = "Salad-Api-Key"


def _published(networking: Any) -> tuple[PublishedPort, ...]:
    """The group's one published port: ``networking.dns`` on 443 over https, for
    ``networking.port``; none when either is missing or malformed."""
    if not isinstance(networking, Mapping):
        return ()
    dns, port = networking.get("dns"), networking.get("port")
    if not isinstance(dns, str) or isinstance(port, bool) or not isinstance(port, int):
        return ()
    host = dns.strip().lower()
    if "://" in host:  # the spec says "format: url" (its pattern allows a bare name only)
        try:
            host = urlsplit(host).hostname or ""
        except ValueError:
            return ()
    if not host or not 1 <= port <= 65535:
        return ()
    auth = networking.get("auth") is True  # callers must send the account's key
    return (PublishedPort(container_port=port, host=host, port=443, kind="hostname",
                          scheme="https", edge_auth=SALAD_EDGE_AUTH_HEADER if auth else None),)


def salad_name(spec_name: str) -> str:
    """The container group name for ``spec_name`` (deterministic; see the module docstring)."""
    if _NAME.match(spec_name):
        return spec_name
    readable = re.sub(r"[^a-z0-9-]+", "-", spec_name.lower())
    readable = re.sub(r"^[^a-z]+", "", readable)[:52].rstrip("-") or "vk"
    digest = hashlib.sha256(spec_name.encode("utf-8")).hexdigest()[:10]
    return f"{readable}-{digest}"


def map_status(status: str, running_count: int) -> InstanceState:
    """Salad ``current_state.status`` (+ running instances) -> InstanceState.

    ``running`` counts as RUNNING only once an instance runs (Salad reports the group running
    while its one replica is still being allocated). ``stopped`` is FAILED: vkprovider never
    stops a group, so someone or something else did.
    """
    if status in ("pending", "deploying"):
        return InstanceState.PENDING
    if status == "running":
        return InstanceState.RUNNING if running_count >= 1 else InstanceState.PENDING
    if status == "succeeded":
        return InstanceState.SUCCEEDED
    if status in ("failed", "stopped"):
        return InstanceState.FAILED
    return InstanceState.PENDING


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _display_name(spec_name: str) -> str:
    text = re.sub(r"[^ ,\-.0-9A-Za-z]+", "-", spec_name)[:63]
    return text if len(text) >= 2 else f"vk-{text}"


@dataclass(frozen=True)
class _GpuClass:
    id: str
    name: str
    prices: Mapping[str, float]


class _Conflict(ProviderError):
    """HTTP 409: the name is taken (create raced another create)."""


_OPTION_KEYS = frozenset({
    "organization", "project", "gpu_types", "priority", "restart_policy", "default_cpu",
    "default_memory_mb", "storage_gb", "country_codes", "region", "networking_auth",
    "check_availability", "registry_authentication", "registry_hosts", "gpu_classes_ttl",
    "log_poll_interval",
    *opt.RETRY_KEYS,
})  # fmt: skip


class _Options:
    """The parsed, checked ``options``; a bad value is an :class:`~providers.options.InvalidOption`
    (a ValueError) naming the option."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        opt.reject_unknown(raw, _OPTION_KEYS, cloud="SaladCloud")
        names: dict[str, str] = {}
        for key in ("organization", "project"):
            value = opt.optional_string(raw, key, pattern=_NAME,
                                        hint=f"must match {_NAME.pattern}")
            if value is None:
                raise opt.InvalidOption(key, f"is required and must match {_NAME.pattern}")
            names[key] = value
        self.organization = names["organization"]
        self.project = names["project"]
        self.gpu_types: dict[str, tuple[str, ...]] = opt.name_map(raw, "gpu_types")
        self.priority = opt.choice(raw, "priority", choices=_PRIORITIES, default="high")
        self.restart_policy = opt.choice(raw, "restart_policy", choices=_RESTART_POLICIES,
                                         default="never")
        self.default_cpu = opt.integer(raw, "default_cpu", default=1, minimum=1)
        self.default_memory_mb = opt.integer(raw, "default_memory_mb", default=1024,
                                             minimum=1024)
        self.storage_gb = opt.optional_integer(raw, "storage_gb", minimum=1)
        codes = opt.strings(raw, "country_codes",
                            hint="must be a list of ISO 3166-1 alpha-2 codes (e.g. [us, de])")
        self.country_codes = tuple(c.lower() for c in codes)
        if not all(_COUNTRY.match(c) for c in self.country_codes):
            bad = next(c for c in codes if not _COUNTRY.match(c.lower()))
            raise opt.InvalidOption(
                "country_codes", f"must be ISO 3166-1 alpha-2 codes (got {bad!r} in the list)")
        self.region = opt.string(raw, "region", default="global")
        self.networking_auth = opt.boolean(raw, "networking_auth", default=True)
        self.check_availability = opt.boolean(raw, "check_availability", default=True)
        self.registry_authentication = opt.mapping(raw, "registry_authentication", secret=True)
        self.registry_scope = node_scope(raw, credential="registry_authentication")
        self.gpu_classes_ttl = opt.duration(raw, "gpu_classes_ttl", default=300.0, minimum=0)
        self.log_poll_interval = opt.duration(raw, "log_poll_interval", default=2.0, minimum=0)
        retry = opt.retry_options(raw)
        self.max_attempts = retry.max_attempts
        self.backoff_initial = retry.backoff_initial
        self.backoff_max = retry.backoff_max
        self.retry_after_cap = retry.retry_after_cap


class SaladProvider(HTTPAdapter):
    """A :class:`~providers.base.Provider` for one SaladCloud project, scoped to ``owner``.

    ``transport`` replaces the network (e.g. ``httpx.ASGITransport(app=fake)`` in tests). The API
    key goes into the client's ``Salad-Api-Key`` header and nowhere else.
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
        self._opts = _Options(options or {})
        super().__init__(
            name=name, base_url=base_url, owner=owner, timeout=timeout, transport=transport,
            retry=RetryPolicy.of(self._opts), secret=api_key,
            auth_headers={"Salad-Api-Key": api_key} if api_key else None,
            edge_key=api_key,  # the access domain's auth takes the account's key
        )
        org, project = self._opts.organization, self._opts.project
        self._org_path = f"/organizations/{org}"
        self.runs_without_gpu = True  # a container group with no GPU class runs on CPU nodes
        self._groups_path = f"/organizations/{org}/projects/{project}/containers"
        self._classes: tuple[float, builtins.list[_GpuClass]] | None = None
        self._registry_secrets = RegistrySecrets()

    def _scrub(self, text: str) -> str:
        """``text`` without the API key or any registry password this adapter has sent."""
        return self._registry_secrets.scrub(super()._scrub(text))

    def __repr__(self) -> str:
        return (
            f"SaladProvider(name={self.name!r}, base_url={self._base_url!r}, "
            f"owner={self.owner!r}, organization={self._opts.organization!r}, "
            f"project={self._opts.project!r})"
        )

    # -- the Provider protocol --------------------------------------------------------------

    async def create(self, spec: InstanceSpec) -> Instance:
        """Adopt the group named for ``spec.name``, or create (and start) it."""
        group_name = salad_name(spec.name)
        body = self._body(spec, group_name)  # InvalidSpec before any HTTP call
        self._registry_secrets.remember(pod_credential(spec))
        found = await self._get_group(group_name)
        if found is not None:
            return await self._adopt(spec, found)
        classes = await self._choose_classes(spec) if spec.gpu_count else []
        container = body["container"]
        container["resources"]["gpu_classes"] = [c.id for c in classes]
        price = max((c.prices[self._opts.priority] for c in classes), default=0.0)
        container["environment_variables"][META_ENV] = self._meta(spec, price)
        if classes and self._opts.check_availability:
            await self._check_available(spec, body, classes)
        what = f"create container group {group_name}"
        try:
            response = await self._request("POST", self._groups_path, what=what, json_body=body)
        except _Conflict:
            return await self._adopt(spec, await self._require_group(group_name))
        group = self._json(response, what=what)
        return await self._start_if_stopped(group, what=what)

    async def list(self) -> list[Instance]:
        """Every container group in the project whose identity names our ``owner``."""
        what = "list container groups"
        response = await self._request("GET", self._groups_path, what=what)
        items = self._json(response, what=what).get("items")
        if not isinstance(items, Sequence):
            raise self._malformed(what)
        found = []
        for item in items:
            instance = self._instance(item, what=what)
            if instance is not None and instance.tags.get(TAG_NODE) == self.owner:
                found.append(instance)
        return found

    async def delete(self, instance_id: str) -> None:
        """Delete the container group; one that is gone (or never was) is not an error."""
        if not _NAME.match(instance_id):
            return  # not a container group name, so nothing of ours can have it
        try:
            await self._request(
                "DELETE", f"{self._groups_path}/{instance_id}",
                what=f"delete container group {instance_id}",
            )
        except NotFound:
            return

    async def logs(self, instance_id: str, opts: LogOptions) -> AsyncGenerator[bytes, None]:
        """The container's log entries (``POST /log-entries``); with ``follow``, until it ends."""
        if not _NAME.match(instance_id):
            raise NotFound(f"{self.name}: no container group {instance_id}", provider=self.name)
        group = await self._require_group(instance_id)
        now = datetime.now(UTC)
        if opts.since_seconds is not None:
            start = now - timedelta(seconds=max(0, opts.since_seconds))
        else:
            start = _time(group.get("create_time")) or now - timedelta(days=1)
        query = (
            'resource.type = "container" AND '
            f'resource.labels.project_name = "{self._opts.project}" AND '
            f'resource.labels.container_group_name = "{instance_id}"'
        )
        seen: set[str] = set()
        if opts.tail_lines is not None:
            first = await self._tail(query, start, now, max(0, opts.tail_lines))
            cursor = _rfc3339(now)
        else:
            first, cursor = await self._forward(query, _rfc3339(start), now, seen)

        async def batches() -> AsyncGenerator[builtins.list[bytes], None]:
            nonlocal cursor
            yield self._render(first, opts, seen)
            while opts.follow:
                await asyncio.sleep(self._opts.log_poll_interval)
                ended = await self._ended(instance_id)
                entries, cursor = await self._forward(query, cursor, datetime.now(UTC), seen)
                yield self._render(entries, opts, seen)
                if ended:
                    return

        remaining = opts.limit_bytes
        async with contextlib.aclosing(batches()) as stream:
            async for batch in stream:
                for chunk in batch:
                    if remaining is not None:
                        chunk = chunk[: max(0, remaining)]
                        remaining -= len(chunk)
                    if chunk:
                        yield chunk
                    if remaining is not None and remaining <= 0:
                        return

    async def capacity(self) -> builtins.list[Offer]:
        """Per cluster GPU type: free nodes at our priority (one GPU each) and the GPU price.

        One call for the class list (cached) plus one availability call per reported type.
        """
        classes = await self._gpu_classes()
        wanted: dict[str, builtins.list[_GpuClass]] = {}
        if self._opts.gpu_types:
            for cluster in self._opts.gpu_types:
                wanted[cluster] = self._match(cluster, classes)
        else:
            for cls in classes:
                wanted.setdefault(cls.name, []).append(cls)
        offers = []
        for cluster, matched in sorted(wanted.items()):
            priced = [c for c in matched if self._opts.priority in c.prices]
            if not priced:
                continue
            body: dict[str, Any] = {"gpu_classes": [c.id for c in priced]}
            if self._opts.country_codes:
                body["country_codes"] = list(self._opts.country_codes)
            available = await self._availability(body, what=f"read availability of {cluster}")
            offers.append(
                Offer(
                    provider=self.name,
                    gpu_type=cluster,
                    region=self._opts.region,
                    available=available,
                    price_per_gpu_hour=min(c.prices[self._opts.priority] for c in priced),
                )
            )
        return offers

    # -- spec -> request body (pure; raises InvalidSpec) -------------------------------------

    def _invalid(self, spec: InstanceSpec, why: str) -> InvalidSpec:
        return InvalidSpec(f"{self.name}: cannot run {spec.name!r} on SaladCloud: {why}",
                           provider=self.name)

    def _body(self, spec: InstanceSpec, group_name: str) -> dict[str, Any]:
        if spec.gpu_count > 1:
            raise self._invalid(spec, f"{spec.gpu_count} GPUs requested; a Salad node has one")
        if spec.args is not None and spec.command is None:
            raise self._invalid(
                spec, "args without command: Salad's command replaces the image's ENTRYPOINT "
                "and CMD, so arguments cannot be passed to the ENTRYPOINT; set command too"
            )
        if len(spec.ports) > 1:
            raise self._invalid(spec, f"{len(spec.ports)} ports; Salad's gateway exposes one")
        for port in spec.ports:
            if port.protocol.upper() != "TCP":
                raise self._invalid(
                    spec, f"{port.protocol} port {port.container_port}; Salad's gateway only "
                    "carries HTTP (over TCP)"
                )
        if len(self._meta(spec, 0.0)) + _PRICE_ROOM > _ENV_MAX:
            raise self._invalid(
                spec, f"the identifying variable {META_ENV} would exceed {_ENV_MAX} characters "
                "(shorten the node/pod names)"
            )
        env: dict[str, str] = {}
        for key, value in spec.env.items():
            if key == META_ENV:
                raise self._invalid(spec, f"environment variable {META_ENV} is reserved")
            if not key:
                raise self._invalid(spec, "an environment variable has an empty name")
            if not value or len(value) > _ENV_MAX or "\n" in value or "\r" in value:
                raise self._invalid(
                    spec, f"the value of {key} is empty, longer than {_ENV_MAX} characters or "
                    "holds a line break, which SaladCloud does not accept"
                )
            env[key] = value
        cpu = math.ceil(spec.cpu_millis / 1000) if spec.cpu_millis > 0 else self._opts.default_cpu
        memory = (
            max(1024, math.ceil(spec.memory_bytes / 2**20))
            if spec.memory_bytes > 0
            else self._opts.default_memory_mb
        )
        if cpu > 1024 or memory > 1073741824:
            raise self._invalid(spec, f"{cpu} vCPU / {memory} MB is over Salad's limits")
        resources: dict[str, Any] = {"cpu": cpu, "memory": memory, "gpu_classes": []}
        if spec.shm_bytes is not None:
            # /dev/shm is memory: at most the container's, at least Salad's minimum
            asked = math.ceil(spec.shm_bytes / 2**20) if spec.shm_bytes > 0 else memory
            resources["shm_size"] = max(_SHM_MIN_MB, min(asked, memory))
        if self._opts.storage_gb is not None:
            resources["storage_amount"] = self._opts.storage_gb * 2**30
        container: dict[str, Any] = {
            "image": spec.image,
            "resources": resources,
            "environment_variables": env,
            "priority": self._opts.priority,
        }
        if spec.command is not None:
            command = [*spec.command, *(spec.args or ())]
            if len(command) > 100 or any(
                not part or len(part) > _ARG_MAX or "\n" in part or "\r" in part
                for part in command
            ):
                raise self._invalid(
                    spec, f"command + args must be at most 100 non-empty, single-line parts of "
                    f"at most {_ARG_MAX} characters"
                )
            container["command"] = command
        auth = pod_credential(spec)
        if auth is not None:
            container["registry_authentication"] = self._basic_auth(spec, auth)
        elif (self._opts.registry_authentication and self._opts.registry_scope is not None
              and self._opts.registry_scope.covers(spec.image)):
            container["registry_authentication"] = self._opts.registry_authentication
        body: dict[str, Any] = {
            "name": group_name,
            "display_name": _display_name(spec.name),
            "container": container,
            "autostart_policy": True,
            "replicas": 1,
            "restart_policy": self._opts.restart_policy,
        }
        countries = self._countries(spec)
        if countries:
            body["country_codes"] = countries
        if spec.ports:
            body["networking"] = {
                "protocol": "http",
                "port": spec.ports[0].container_port,
                "auth": self._opts.networking_auth,
            }
        return body

    def _basic_auth(self, spec: InstanceSpec, auth: RegistryAuth) -> dict[str, Any]:
        """``{basic: {username, password}}``, or InvalidSpec outside the spec's limits."""
        for what, value in (("username", auth.username), ("password", auth.password)):
            if not value or len(value) > _REGISTRY_FIELD_MAX or _LINE_BREAK.search(value):
                raise refuse(self.name, "SaladCloud", spec, auth, f"has a {what} that is "
                             f"empty, longer than {_REGISTRY_FIELD_MAX} characters or holds a "
                             "line break, which SaladCloud's registry_authentication does not "
                             "accept")
        return {"basic": {"username": auth.username, "password": auth.password}}

    def _countries(self, spec: InstanceSpec) -> builtins.list[str]:
        region = (spec.region or "").strip()
        if not region or region.lower() == self._opts.region.lower():
            return list(self._opts.country_codes)
        if _COUNTRY.match(region.lower()):
            return [region.lower()]
        raise self._invalid(
            spec, f"region {region!r} is neither {self._opts.region!r} nor a two-letter country "
            "code"
        )

    def _meta(self, spec: InstanceSpec, price: float) -> str:
        meta = {
            "name": spec.name,
            "gpu": spec.gpu_type,
            "price": round(price, 6),
            "tags": {**spec.tags, TAG_NODE: self.owner},
        }
        return json.dumps(meta, separators=(",", ":"), sort_keys=True)

    # -- GPU classes and availability --------------------------------------------------------

    async def _gpu_classes(self) -> builtins.list[_GpuClass]:
        now = time.monotonic()
        if self._classes is not None and now - self._classes[0] < self._opts.gpu_classes_ttl:
            return self._classes[1]
        what = "list GPU classes"
        response = await self._request("GET", f"{self._org_path}/gpu-classes", what=what)
        items = self._json(response, what=what).get("items")
        if not isinstance(items, Sequence):
            raise self._malformed(what)
        classes = []
        try:
            for item in items:
                prices: dict[str, float] = {}
                for entry in item.get("prices") or ():
                    if entry.get("priority") in _PRIORITIES:
                        prices[str(entry["priority"])] = float(entry["price"])
                classes.append(_GpuClass(id=str(item["id"]), name=str(item["name"]),
                                         prices=prices))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed(what) from exc
        self._classes = (now, classes)
        return classes

    def _match(self, gpu_type: str, classes: Sequence[_GpuClass]) -> builtins.list[_GpuClass]:
        wanted = self._opts.gpu_types.get(gpu_type)
        if wanted is not None:
            keys = {w.lower() for w in wanted}
            return [c for c in classes if c.id.lower() in keys or c.name.lower() in keys]
        lowered = gpu_type.strip().lower()
        exact = [c for c in classes if c.name.lower() == lowered or c.id.lower() == lowered]
        return exact or [c for c in classes if c.name.lower().startswith(lowered + " ")]

    async def _choose_classes(self, spec: InstanceSpec) -> builtins.list[_GpuClass]:
        classes = await self._gpu_classes()
        if spec.gpu_type:
            chosen = self._match(spec.gpu_type, classes)
        elif self._opts.gpu_types:
            chosen = [c for t in self._opts.gpu_types for c in self._match(t, classes)]
        else:
            chosen = list(classes)
        label = spec.gpu_type or "any GPU"
        if not chosen:
            raise CapacityError(f"{self.name}: SaladCloud sells no GPU class for {label}",
                                provider=self.name)
        priority = self._opts.priority
        chosen = [c for c in chosen if priority in c.prices]
        if spec.max_price_per_hour is not None:
            chosen = [c for c in chosen if c.prices[priority] <= spec.max_price_per_hour]
        if not chosen:
            raise CapacityError(
                f"{self.name}: no SaladCloud GPU class for {label} at {priority} priority"
                + (f" costs <= ${spec.max_price_per_hour}/h" if spec.max_price_per_hour else ""),
                provider=self.name,
            )
        unique = {c.id: c for c in chosen}
        return sorted(unique.values(), key=lambda c: c.id)

    async def _check_available(
        self, spec: InstanceSpec, body: Mapping[str, Any], classes: Sequence[_GpuClass]
    ) -> None:
        resources = body["container"]["resources"]
        query: dict[str, Any] = {
            "gpu_classes": [c.id for c in classes],
            "cpu": resources["cpu"],
            "memory": resources["memory"],
        }
        if "storage_amount" in resources:
            query["storage_amount"] = resources["storage_amount"]
        if body.get("country_codes"):
            query["country_codes"] = body["country_codes"]
        available = await self._availability(query, what=f"check availability for {spec.name!r}")
        if available < 1:
            raise CapacityError(
                f"{self.name}: no SaladCloud node free for {spec.gpu_type or 'any GPU'} at "
                f"{self._opts.priority} priority",
                provider=self.name,
            )

    async def _availability(self, body: Mapping[str, Any], *, what: str) -> int:
        response = await self._request(
            "POST", f"{self._org_path}/availability/sce-gpu-availability", what=what,
            json_body=body,
        )
        value = self._json(response, what=what).get(f"available_gpu_{self._opts.priority}", 0)
        if not isinstance(value, int):
            raise self._malformed(what)
        return max(0, value)

    # -- groups -> instances ------------------------------------------------------------------

    async def _get_group(self, group_name: str) -> dict[str, Any] | None:
        """The container group, or None when there is none of that name."""
        try:
            return await self._require_group(group_name)
        except NotFound:
            return None

    async def _require_group(self, group_name: str) -> dict[str, Any]:
        """The container group; NotFound when there is none of that name."""
        what = f"get container group {group_name}"
        response = await self._request("GET", f"{self._groups_path}/{group_name}", what=what)
        return self._json(response, what=what)

    async def _adopt(self, spec: InstanceSpec, group: Mapping[str, Any]) -> Instance:
        what = f"adopt container group {group.get('name')}"
        instance = self._instance(group, what=what)
        if instance is None or instance.name != spec.name:
            raise ProviderError(
                f"{self.name}: container group {group.get('name')!r} exists but was not made "
                f"for {spec.name!r}; refusing to adopt it",
                provider=self.name,
            )
        if instance.tags.get(TAG_NODE) != self.owner:
            raise ProviderError(
                f"{self.name}: container group {group.get('name')!r} belongs to node "
                f"{instance.tags.get(TAG_NODE)!r}, not {self.owner!r}",
                provider=self.name,
            )
        return await self._start_if_stopped(group, what=what)

    async def _start_if_stopped(self, group: Mapping[str, Any], *, what: str) -> Instance:
        state = group.get("current_state")
        status = state.get("status") if isinstance(state, Mapping) else None
        instance = self._instance(group, what=what)
        if instance is None:
            raise self._malformed(what)
        if status != "stopped":
            return instance
        group_name = instance.id
        try:
            await self._request(
                "POST", f"{self._groups_path}/{group_name}/start",
                what=f"start container group {group_name}",
            )
        except InvalidSpec:
            return instance  # Salad refused to start it (e.g. already starting): report as is
        return dataclasses.replace(
            instance, state=InstanceState.PENDING, message="starting", finished_at=None
        )

    def _instance(self, data: Any, *, what: str) -> Instance | None:
        """Our Instance for one container group; None when it carries no identity of ours."""
        if not isinstance(data, Mapping):
            raise self._malformed(what)
        try:
            container = data["container"]
            env = container.get("environment_variables") or {}
            raw_meta = env.get(META_ENV)
            if not isinstance(raw_meta, str):
                return None
            try:
                meta = json.loads(raw_meta)
                spec_name = str(meta["name"])
                tags = {str(k): str(v) for k, v in dict(meta.get("tags") or {}).items()}
            except (ValueError, KeyError, TypeError):
                return None
            current = data["current_state"]
            status = str(current["status"])
            counts = current.get("instance_status_counts") or {}
            running = int(counts.get("running_count") or 0)
            state = map_status(status, running)
            countries = [str(c) for c in data.get("country_codes") or ()]
            networking = data.get("networking")
            dns = networking.get("dns") if isinstance(networking, Mapping) else None
            terminal = status in _TERMINAL
            return Instance(
                id=str(data["name"]),
                name=spec_name,
                provider=self.name,
                state=state,
                tags=tags,
                gpu_type=None if meta.get("gpu") is None else str(meta["gpu"]),
                gpu_count=1 if (container.get("resources") or {}).get("gpu_classes") else 0,
                region=countries[0] if len(countries) == 1 else self._opts.region,
                price_per_hour=float(meta.get("price") or 0.0),
                endpoints=(f"https://{dns}",) if isinstance(dns, str) and dns else (),
                published=_published(networking),
                created_at=_time(data.get("create_time")),
                started_at=(
                    _time(current.get("start_time"))
                    if status == "running" or terminal else None
                ),
                finished_at=_time(current.get("finish_time")) if terminal else None,
                exit_code=0 if status == "succeeded" else None,
                message=self._message(status, current, counts),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed(what) from exc

    def _message(
        self, status: str, current: Mapping[str, Any], counts: Mapping[str, Any]
    ) -> str | None:
        description = current.get("description")
        text = (self._scrub(description.strip())[:MAX_SERVER_MESSAGE]
                if isinstance(description, str) else "")
        if status == "stopped":
            text = "stopped outside vkprovider" + (f": {text}" if text else "")
        elif status in ("pending", "deploying", "running") and not text:
            waiting = [
                f"{word} {int(counts.get(f'{word}_count') or 0)}"
                for word in ("allocating", "creating", "running", "stopping")
                if counts.get(f"{word}_count")
            ]
            text = f"{status}: " + ", ".join(waiting) if waiting else status
        return self._scrub(text) if text else None

    # -- logs -------------------------------------------------------------------------------

    async def _ended(self, group_name: str) -> bool:
        group = await self._get_group(group_name)
        if group is None:
            return True
        state = group.get("current_state")
        return isinstance(state, Mapping) and state.get("status") in _TERMINAL

    async def _query_logs(
        self, query: str, start: str, end: str, order: str, what: str
    ) -> builtins.list[Mapping[str, Any]]:
        body = {"start_time": start, "end_time": end, "query": query, "page_size": _LOG_PAGE,
                "sort_order": order}
        response = await self._request(
            "POST", f"{self._org_path}/log-entries", what=what, json_body=body
        )
        items = self._json(response, what=what).get("items")
        if not isinstance(items, Sequence) or not all(isinstance(i, Mapping) for i in items):
            raise self._malformed(what)
        return list(items)

    async def _forward(
        self, query: str, start: str, end: datetime, seen: set[str]
    ) -> tuple[builtins.list[Mapping[str, Any]], str]:
        """Entries from ``start`` to ``end``, oldest first, skipping ``seen``; and the cursor."""
        found: builtins.list[Mapping[str, Any]] = []
        cursor = start
        while True:
            page = await self._query_logs(query, cursor, _rfc3339(end), "asc", "read logs")
            fresh = [e for e in page if _entry_key(e) not in seen]
            found.extend(fresh)
            seen.update(_entry_key(e) for e in fresh)
            if page:
                cursor = str(page[-1].get("time") or cursor)
            if len(page) < _LOG_PAGE or not fresh:
                return found, cursor

    async def _tail(
        self, query: str, start: datetime, end: datetime, lines: int
    ) -> builtins.list[Mapping[str, Any]]:
        """The newest ``lines`` entries, oldest first."""
        found: builtins.list[Mapping[str, Any]] = []
        keys: set[str] = set()
        cursor = _rfc3339(end)
        while len(found) < lines:
            page = await self._query_logs(query, _rfc3339(start), cursor, "desc", "read logs")
            fresh = [e for e in page if _entry_key(e) not in keys]
            found.extend(fresh)
            keys.update(_entry_key(e) for e in fresh)
            if page:
                cursor = str(page[-1].get("time") or cursor)
            if len(page) < _LOG_PAGE or not fresh:
                break
        return list(reversed(found[:lines]))

    def _render(
        self, entries: Sequence[Mapping[str, Any]], opts: LogOptions, seen: set[str]
    ) -> builtins.list[bytes]:
        chunks = []
        for entry in entries:
            seen.add(_entry_key(entry))
            text = entry.get("text_log")
            if not isinstance(text, str):
                payload = entry.get("json_log")
                text = json.dumps(payload, separators=(",", ":")) if payload is not None else ""
            line = text if text.endswith("\n") else text + "\n"
            if opts.timestamps:
                line = f"{entry.get('time', '')} {line}"
            chunks.append(line.encode("utf-8"))
        return chunks

    # -- the HTTP edge (the rest is providers.http.HTTPAdapter) ----------------------------

    def _status_error(self, response: Answer, *, what: str, op: str) -> ProviderError:
        """A ProblemDetails answer (``{type, title, status, detail}``) -> a typed error."""
        status = response.status_code
        title, detail = "", ""
        try:
            data = response.json()
            if isinstance(data, Mapping):
                title = str(data.get("title") or "")
                detail = str(data.get("detail") or "")
        except ValueError:
            pass
        message = self._status_message(
            what, status, label=self._scrub(title)[:MAX_SERVER_MESSAGE],
            detail=self._scrub(detail)[:MAX_SERVER_MESSAGE],
        )
        p = self.name
        lowered = f"{title} {detail}".lower()
        if status in (400, 403, 422) and any(w in lowered for w in _QUOTA_WORDS):
            return QuotaError(message, provider=p)
        if status == 409:
            return _Conflict(message, provider=p)
        if status in (400, 422) and any(w in lowered for w in _CAPACITY_WORDS):
            return CapacityError(message, provider=p)
        return self._classify(response, message)


def _entry_key(entry: Mapping[str, Any]) -> str:
    return json.dumps(
        [entry.get("time"), entry.get("receive_time"), entry.get("text_log"),
         entry.get("json_log"), (entry.get("resource") or {}).get("labels")],
        sort_keys=True, default=str,
    )

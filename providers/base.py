"""The contract between the virtual kubelet and a GPU cloud.

Why it exists: the service must reason about many clouds with one vocabulary. Everything a cloud
adapter takes or returns is a frozen value type declared here, and every failure is one of the
typed errors below, so that placement can decide (try the next cloud, block an offer, fail the
pod, retry later) without knowing which cloud it talks to.

Rules for adapters:

* ``create`` is idempotent by ``spec.name``: if an instance with that name already exists, return
  it instead of making a second one (a retry after a timeout must never run a pod twice).
* ``list`` returns only instances tagged with this adapter's ``owner`` (the node name), in one
  call per sweep, never one call per pod.
* ``delete`` is idempotent: deleting an instance that is gone is not an error.
* Secrets (API keys, env values, the registry password of ``InstanceSpec.registry_auth``) never
  appear in ``repr``, logs, error messages, tags or the names of objects made in the cloud (a
  cloud-side name derived from a credential uses a keyed hash, never the credential). A message
  the cloud sends back is scrubbed of them before it becomes an error message.
* ``InstanceSpec.registry_auth`` (a pod's ``imagePullSecrets``, see :class:`RegistryAuth`) is
  either sent to the cloud as its registry authentication or refused with
  :class:`InvalidSpec` naming ``imagePullSecrets`` before any call; never silently dropped. An
  adapter that creates cloud-side credential objects for it deletes them once no instance uses
  them, in an optional ``sweep_registry_auth()`` (see :func:`sweep_registry_auth`).
* ``Instance.published`` says how each container port is reached from outside the cloud, built
  only from what the cloud reports (or documents as a fixed convention). A field the cloud
  leaves out gives fewer entries (none at worst), never an error. Entries for one container
  port come in order of preference. It is untrusted input: the service screens every entry
  with :mod:`providers.addresses` before it probes it or writes it anywhere (private, CGNAT,
  link-local, metadata addresses, the cluster's own ranges and in-cluster names are refused,
  with a Warning Event on the pod), so an adapter reports what its cloud says and need not
  filter. One whose cloud routinely reports internal addresses that are no attack (RunPod's
  runtime ports) may leave them out quietly, judged by that same filter.
* Interruptible (spot) capacity is opt-in. An adapter whose cloud sells it reports such offers
  with ``Offer.interruptible`` True (beside the on-demand ones; the same GPUs may appear in
  both), creates an interruptible instance only when ``InstanceSpec.interruptible`` asks for
  one, and reports what the cloud says: ``Instance.interruptible``, ``Instance.interruption_at``
  (a planned interruption the cloud announced) and ``Instance.interrupted`` (the cloud reclaimed
  it; its state is then FAILED). A cloud with no notice API never sets ``interruption_at``; its
  adapter says so in its docstring.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

#: Tag keys every instance carries so that a restart can adopt it and GC can find orphans.
TAG_NODE = "vkprovider.io/node"
TAG_NAMESPACE = "vkprovider.io/namespace"
TAG_POD = "vkprovider.io/pod"
TAG_UID = "vkprovider.io/uid"


class InstanceState(enum.StrEnum):
    """The lifecycle of a cloud instance, as every adapter must map it."""

    PENDING = "pending"  # accepted, not running yet (queued, pulling, booting)
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # container exited 0
    FAILED = "failed"  # exited non-zero, crashed, preempted or could not start
    TERMINATING = "terminating"  # a delete is in progress


@dataclass(frozen=True, kw_only=True, slots=True)
class Port:
    container_port: int
    protocol: str = "TCP"
    name: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedPort:
    """How one container port of an instance is reached from outside the cloud.

    ``host:port`` is what a client dials; ``port`` may differ from ``container_port`` (clouds
    map ports). ``kind`` says what ``host`` is: ``"ip"`` (an IP address, as the cloud reports
    it) or ``"hostname"`` (a DNS name, e.g. a cloud proxy or access domain). ``scheme`` is
    ``"https"`` when the cloud terminates TLS in front of the container (so the container speaks
    plain HTTP behind it), else None (a raw TCP/UDP mapping). ``protocol`` is the container
    port's protocol (``"TCP"``, ``"UDP"``). An instance may list several entries for one
    container port (e.g. a direct IP mapping and a TLS proxy); the preferred one comes first.
    """

    container_port: int
    protocol: str = "TCP"
    host: str
    port: int
    kind: Literal["ip", "hostname"]
    scheme: str | None = None
    # the header a hostname edge wants the account's API key in (SaladCloud's access domain
    # with authentication on: "Salad-Api-Key"); None when the edge has no auth
    edge_auth: str | None = None


@dataclass(frozen=True, kw_only=True)
class RegistryAuth:
    """Basic credentials to pull ``InstanceSpec.image`` from a private registry.

    Built by the service from the pod's (then its ServiceAccount's) ``imagePullSecrets``, picked
    for the image the way the kubelet's keyring picks one. ``registry`` is the image's registry
    host as Kubernetes matches it (``host`` or ``host:port``; ``docker.io`` for Docker Hub images,
    including those that name no registry); ``username``/``password`` are what the Secret holds
    for it. ``secret`` names the Secret it came from (for messages; never its content).
    ``repr``/``str`` show the registry, username and Secret name, never the password.
    """

    registry: str
    username: str
    password: str = field(repr=False)
    secret: str | None = None


@dataclass(frozen=True, kw_only=True)
class InstanceSpec:
    """What to run. Built from a pod by the service; adapters map it onto their API."""

    name: str  # deterministic: "<node>-<pod uid>"; the idempotency key
    image: str
    gpu_count: int
    gpu_type: str | None = None  # the cluster's GPU name (e.g. "H100"); adapters map it
    command: tuple[str, ...] | None = None
    args: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold secrets
    ports: tuple[Port, ...] = ()
    cpu_millis: int = 0
    memory_bytes: int = 0
    region: str | None = None  # the offer placement chose; None lets the cloud choose
    max_price_per_hour: float | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    #: Credentials for a private image (from imagePullSecrets); None for a public image.
    registry_auth: RegistryAuth | None = field(default=None, repr=False)
    #: The size of the container's ``/dev/shm`` (a pod's memory-backed emptyDir mounted there):
    #: None when the pod asks for none (the cloud's default applies); 0 for one without a size
    #: (as large as the instance's memory, as Kubernetes sizes it); else bytes. An adapter
    #: that cannot size ``/dev/shm`` refuses a spec that sets it (InvalidSpec), never drops it.
    shm_bytes: int | None = None
    #: The user and group the container runs as (``securityContext.runAsUser``/``runAsGroup``,
    #: the container's over the pod's); None: the image's. An adapter that cannot set them
    #: leaves them to the image (the fidelity table warns about it).
    run_as_user: int | None = None
    run_as_group: int | None = None
    #: The container's host name (``spec.hostnameOverride``, else ``spec.hostname``); None: the
    #: cloud names the host. An adapter that cannot set it leaves it to the cloud (warned).
    hostname: str | None = None
    #: Ask for an interruptible (spot, bid) instance: cheaper, and the cloud may reclaim it.
    #: Set by placement only when the pod's OverflowPolicy allows it (``spec.interruptible``)
    #: and the adapter reports interruptible offers; an adapter that sells none never gets it.
    #: ``max_price_per_hour`` is then the highest bid where the cloud takes bids.
    interruptible: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Instance:
    """What the cloud reports about one instance."""

    id: str
    name: str
    provider: str
    state: InstanceState
    tags: Mapping[str, str] = field(default_factory=dict)
    gpu_type: str | None = None
    gpu_count: int = 0
    region: str | None = None
    price_per_hour: float = 0.0  # for the whole instance
    ip: str | None = None
    endpoints: tuple[str, ...] = ()  # public URLs or host:port (free-form, for people)
    published: tuple[PublishedPort, ...] = ()  # per container port: how it is reached
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    message: str | None = None  # a human reason for FAILED/PENDING, free of secrets
    restart_count: int = 0
    #: An interruptible (spot, bid) instance: the cloud may reclaim it.
    interruptible: bool = False
    #: When the cloud plans to reclaim it (a notice it announced); None: nothing announced.
    interruption_at: datetime | None = None
    #: The cloud reclaimed it (state FAILED): not a crash of the container, nothing to restart.
    interrupted: bool = False


@dataclass(frozen=True, kw_only=True)
class Offer:
    """Capacity a cloud sells now: `available` GPUs of one type in one region.

    ``interruptible``: sold as spot/bid capacity the cloud may reclaim (cheaper); only placed
    when the pod's OverflowPolicy allows it. One GPU may be offered both ways.
    """

    provider: str
    gpu_type: str
    region: str
    available: int
    price_per_gpu_hour: float
    interruptible: bool = False


@dataclass(frozen=True, kw_only=True)
class LogOptions:
    follow: bool = False
    tail_lines: int | None = None
    since_seconds: int | None = None
    timestamps: bool = False
    limit_bytes: int | None = None


class ProviderError(Exception):
    """Base of every error an adapter raises. Messages never include secrets."""

    def __init__(self, message: str, *, provider: str = "") -> None:
        super().__init__(message)
        self.provider = provider


class CapacityError(ProviderError):
    """No capacity for this GPU type/region now: try the next candidate, block this offer."""


class QuotaError(ProviderError):
    """The account's quota or balance does not allow it: try elsewhere, do not retry here."""


class AuthError(ProviderError):
    """Credentials rejected: block the provider until its configuration changes."""


class InvalidSpec(ProviderError):
    """The cloud can never run this spec: fail the pod, never retry."""


class RateLimited(ProviderError):
    """Slow down; ``retry_after`` seconds (None when the cloud did not say)."""

    def __init__(self, message: str, *, provider: str = "", retry_after: float | None) -> None:
        super().__init__(message, provider=provider)
        self.retry_after = retry_after


class TransientError(ProviderError):
    """A timeout, 5xx or connection error: retry with backoff."""


class NotFound(ProviderError):
    """The instance does not exist (any more)."""


class Unsupported(ProviderError):
    """The cloud does not offer this operation (exec, previous logs, ...)."""


class ImagePullError(ProviderError):
    """The cloud cannot pull the image with the credentials it was given (none, or rejected).

    Like the kubelet's ImagePullBackOff: the pod waits and is retried with backoff, because the
    fix is usually outside the pod (a Secret corrected, a registry permission granted).
    ``registry`` is the image's registry host. The message never holds a credential."""

    def __init__(self, message: str, *, provider: str = "", registry: str = "") -> None:
        super().__init__(message, provider=provider)
        self.registry = registry


def runs_without_gpu(provider: object) -> bool:
    """Whether an adapter can run an instance with no GPU (``gpu_count == 0``).

    Optional for adapters: one that can sets a ``runs_without_gpu`` attribute (or property) to
    True. The pod controller sends a GPU-less pod only to such adapters, and refuses it before
    any cloud call when its policy names none, so no cloud is asked for what it cannot run.
    """
    return bool(getattr(provider, "runs_without_gpu", False))


def edge_api_key(provider: object) -> str | None:
    """The account's API key for the cloud's HTTPS edge, or None (no such edge auth).

    Optional for adapters: one whose cloud publishes replicas behind an edge that authenticates
    with the account's key (SaladCloud's access domain, ``Salad-Api-Key``; the mock cloud's
    hostname-only mode) implements ``edge_api_key() -> str | None``. The provider's probes and
    its traffic gateway use the key of the adapter that runs the pod, whether the account came
    from the settings file or a GPUProvider's Secret. Never log what it returns.
    """
    read = getattr(provider, "edge_api_key", None)
    if read is None:
        return None
    key = read()
    return key if isinstance(key, str) and key else None


async def sweep_registry_auth(provider: object) -> int:
    """Delete the cloud-side registry credentials of ``provider`` that no instance uses any more.

    Optional for adapters: one that stores a pod's :class:`RegistryAuth` as an object in the cloud
    (RunPod's container registry credentials) implements ``async sweep_registry_auth() -> int``
    (how many it deleted); others send the credentials with each create and have nothing to
    clean up, and this returns 0 for them. The pod controller calls it after deleting instances
    and in its periodic sweep; it is cheap when nothing was deleted since the last call.
    """
    sweep = getattr(provider, "sweep_registry_auth", None)
    if sweep is None:
        return 0
    return int(await sweep())


@runtime_checkable
class Provider(Protocol):
    """One GPU cloud account, scoped to one virtual node (``owner``)."""

    name: str

    async def create(self, spec: InstanceSpec) -> Instance: ...

    async def list(self) -> list[Instance]: ...

    async def delete(self, instance_id: str) -> None: ...

    def logs(self, instance_id: str, opts: LogOptions) -> AsyncIterator[bytes]: ...

    async def capacity(self) -> builtins.list[Offer]: ...

    async def aclose(self) -> None: ...

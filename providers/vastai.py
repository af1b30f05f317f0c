"""The Vast.ai adapter: :class:`VastAIProvider`.

Why it exists: Vast.ai is a GPU marketplace. There is no "run this container" call; a container
runs on a host after you rent one of its *offers*. This module turns the Provider contract into
that two-step dance (search ``POST /api/v0/bundles``, rent ``PUT /api/v0/asks/{offer id}``) and
maps Vast.ai's statuses and ``{success, error, msg}`` errors onto :mod:`providers.base`, so the
service can treat Vast.ai like any other cloud. It follows the spec in
``tests/specs/vastai/openapi.yaml`` (vast-ai/docs ``api-reference/openapi.yaml``).

Idempotency: Vast.ai has no idempotency key and no tags, only a free-text ``label``. Every
instance we rent carries the label ``vkp1?name=<spec.name>&<tag>=<value>...`` (URL-encoded,
tags sorted, ``vkprovider.io/node`` always set to ``owner``). ``create`` first lists instances
whose label equals that string (``select_filters``) and adopts a match; ``list`` pages through
all instances (25 per page, ``next_token``) and keeps those whose label decodes to our owner.
The rent call is never retried after a timeout or 5xx (it is not idempotent); the service's next
``create`` finds the instance by label if the rent did happen.

GPU figures: :meth:`VastAIProvider.gpu_metrics_all` reads ``gpu_util``, ``gpu_temp`` and
``gpu_totalram`` from the same instance list as ``list`` (no extra call); Vast.ai reports them
per instance, not per GPU, so each running instance gets one aggregate GPU entry.

Published ports (:class:`~providers.base.PublishedPort`): from the same instance list,
``public_ipaddr`` ("Public IP address of the instance") and ``ports`` (Docker's map, "Only
present on running instances": ``"8000/tcp" -> [{HostIp, HostPort}]``), one kind ``"ip"`` entry
per mapped container port and protocol: host ``public_ipaddr``, port ``HostPort``, no scheme
(Vast.ai has no TLS proxy). ``HostIp`` is Docker's bind address (``0.0.0.0``), not an address to
dial. Every port Vast.ai maps is reported, including ones it adds itself (such as ``22/tcp`` for
SSH). No ``public_ipaddr`` (or not an IP address) or no ``ports`` gives no entries.
``public_ipaddr`` is whatever the (third-party) host reports: reported as it is, it is screened
by the service (:mod:`providers.addresses`) before anything dials it or publishes it, and a
private, metadata or in-cluster address is refused there with a Warning Event on the pod.

Retries: timeouts, connection errors and 5xx are retried (except the rent, above) and a 429 is
retried after its ``Retry-After`` when at most ``retry_after_cap`` seconds, as in the mock
adapter. Vast.ai documents no ``Retry-After``; without one, backoff is exponential.

Options (the ``options`` mapping; every key is optional; read by :mod:`providers.options`, so a
boolean is ``true``/``false`` (also ``"true"``/``"false"``, ``"yes"``/``"no"``, ``1``/``0``), a
number may be a decimal string, seconds may be written ``"30s"``, and an unknown key or a bad value
is a ``ValueError`` naming the option):

``gpu_types`` (mapping str -> str or list of str, default empty)
    Cluster GPU name -> Vast.ai ``gpu_name`` value(s), e.g. ``{"H100": ["H100_SXM", "H100_PCIE"]}``.
    A GPU type without an entry is passed through with spaces replaced by underscores
    (``"RTX 4090"`` -> ``"RTX_4090"``). With a non-empty map, ``capacity()`` reports only mapped
    types, under their cluster names.
``disk_gb`` (float > 0, default 20)
    Local disk of every instance (create ``disk``; search ``disk_space >= disk_gb``).
``offer_type`` (``"ondemand"`` | ``"bid"``, default ``"ondemand"``)
    Search ``type``. With ``"bid"`` (interruptible) offers are ranked and capped by ``min_bid``
    instead of ``dph_total``, and the rent carries ``price``: the spec's ``max_price_per_hour``
    when set, else the offer's ``min_bid``. ``"bid"`` makes the account rent interruptible
    instances only: its offers are reported ``interruptible``, so a policy with
    ``interruptible: Never`` does not place pods on it.
``interruptible_offers`` (bool, default false)
    With ``offer_type: ondemand``, also sell bid (interruptible) capacity: ``capacity()`` makes
    a second search with ``type: bid`` and reports those offers ``interruptible`` (priced at
    ``min_bid``), and a spec asking for an interruptible instance is rented as a bid, as above.
``verified`` (bool, default true)
    Only verified machines (search ``verified``).
``min_reliability`` (float 0..1, default none)
    Search ``reliability >= min_reliability``.
``offer_filters`` (mapping, default empty)
    Raw search filters merged over the defaults above, e.g. ``{"cuda_max_good": {"gte": 12.1}}``;
    the filters the spec implies (GPU, count, region, ports, CPU, memory, price) still win.
``offer_limit`` (int >= 1, default 20)
    Offers fetched per create.
``max_offer_attempts`` (int >= 1, default 3)
    Offers tried (cheapest first) before giving up with CapacityError when they are taken.
``capacity_limit`` (int >= 1, default 200)
    Offers fetched by ``capacity()``.
``env_format`` (``"string"`` | ``"dict"``, default ``"string"``)
    How ``env`` is sent. The spec declares a Docker-flag string (``"-e K=V -p 8000:8000"``);
    Vast.ai's guide and CLI send a dict (``{"K": "V", "-p 8000:8000": "1"}``). In string mode
    values holding whitespace, quotes or backslashes cannot be represented and are rejected
    with InvalidSpec; dict mode has no such limit.
``command_mode`` (``"reject"`` | ``"onstart"``, default ``"reject"``)
    Vast.ai cannot replace an image's ENTRYPOINT. ``"reject"`` fails pods that set ``command``
    (InvalidSpec). ``"onstart"`` runs ``command + args`` as the ``onstart`` script with
    ``runtype: "ssh"``: the container then runs Vast.ai's SSH init, and the instance does not
    exit when the command does.
``image_login`` (str, default none)
    Registry credentials for private images (``image_login``, Docker login flags
    ``-u <username> -p <password> <registry>``), for instances whose pod has no pull credential
    of its own and whose image is on that registry (``docker.io``: Docker Hub); other images are
    pulled without it (:mod:`providers.registryauth`). Secret.
``log_poll_attempts`` (int >= 1, default 10), ``log_poll_interval`` (float seconds, default 1.0)
    How long ``logs()`` waits for the log file Vast.ai uploads to ``result_url``.
``max_attempts`` (int >= 1, default 4), ``backoff_initial`` (default 0.1), ``backoff_max``
(default 2.0), ``retry_after_cap`` (default 5.0)
    Retries at the HTTP edge (see above).

Private images: a spec's ``registry_auth`` (the pod's ``imagePullSecrets``) becomes the rent's
``image_login``, ``"-u <username> -p <password> <registry>"`` (the Docker login flags Vast.ai
documents; ``docker.io`` for Docker Hub), and wins over the option ``image_login``. Vast.ai splits
that string on spaces, so a username or password that is empty or holds whitespace, a quote or a
backslash cannot be sent: such a pod is refused (InvalidSpec naming ``imagePullSecrets``) before
any call. Vast.ai keeps nothing between rents, so there is nothing to clean up. Every password
sent is scrubbed from the messages Vast.ai sends back. A pod's credential goes only with an
image of its own registry; the option ``image_login`` only with an image of the registry it
names, so a pod cannot pull the organisation's private images of another registry with it.

Host name: a spec's ``hostname`` (the pod's ``hostnameOverride``, else ``hostname``) is sent as
the docker create option ``-h NAME`` in ``env`` (Vast.ai documents three kinds of docker create
options there: ``-e``, ``-p`` and ``-h``); in ``env_format: dict`` as the key ``-h``, as Vast.ai's
CLI reads it.

User: a spec's ``run_as_user`` (the pod's ``runAsUser``) is sent as the rent's ``user`` (what
``docker create --user`` takes), ``"<uid>"`` or, with ``run_as_group``, ``"<uid>:<gid>"``. A
group without a user cannot be written that way and is left to the image (the pod is warned).

Interruptible instances (``Offer.interruptible``, ``InstanceSpec.interruptible``): Vast.ai's
"bid" instances, from the spec's search ``type: bid`` ("interruptible: uses minimum bid price.
Lower cost but may be interrupted if outbid"), the offer's ``min_bid`` and the rent's ``price``
("Bid price per machine ... Only for interruptible instances"). A spec asking for one is
searched and rented as a bid; a listed instance is ``interruptible`` when its ``is_bid`` is true,
and ``interrupted`` when such an instance is ``stopped`` while Vast.ai meant it to run (outbid:
state FAILED, as before). Vast.ai publishes no notice of a coming interruption (no such field or
call in the spec), so ``interruption_at`` is never set: an outbid instance is handled as a crash.

Not supported, and said so rather than ignored: ``command`` in ``"reject"`` mode, a sized
``/dev/shm`` (``shm_bytes``: Vast.ai sizes shared memory itself, in proportion to the GPU share),
pods without GPUs (Vast.ai rents GPU machines), log ``follow``/``since_seconds``/``timestamps``
(Vast.ai only uploads a snapshot of the container log), exit codes (Vast.ai reports none).
"""

from __future__ import annotations

import asyncio
import builtins
import ipaddress
import json
import math
import re
import shlex
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx

from providers import options as opt
from providers.base import (
    TAG_NODE,
    AuthError,
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
    Unsupported,
)
from providers.http import MAX_SERVER_MESSAGE, Answer, HTTPAdapter, RetryPolicy
from providers.registryauth import (
    REGISTRY_HOSTS,
    RegistrySecrets,
    node_scope,
    pod_credential,
    refuse,
)

__all__ = ["LABEL_PREFIX", "VastAIProvider", "decode_label", "encode_label", "map_status"]

#: Every label we write starts with this; anything else is not ours.
LABEL_PREFIX = "vkp1?"
_LABEL_MAX = 1024  # the spec's maxLength for ``label`` (manage instance)
_PAGE_SIZE = 25  # the spec's maximum
_MAX_PAGES = 400
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNSAFE_IN_STRING = re.compile(r"[\s'\"\\]")
_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*")
_QUOTA_WORDS = ("credit", "balance", "insufficient_funds")
_UNKNOWN_REGION = "unknown"  # capacity's region for offers without a location


def encode_label(*, name: str, tags: Mapping[str, str]) -> str:
    """The label that identifies one instance: deterministic in ``name`` and ``tags``."""
    return LABEL_PREFIX + urlencode([("name", name), *sorted(tags.items())])


def decode_label(label: str | None) -> tuple[str, dict[str, str]] | None:
    """``(name, tags)`` from a label we wrote; None for any other label."""
    if not label or not label.startswith(LABEL_PREFIX):
        return None
    pairs = parse_qsl(label[len(LABEL_PREFIX) :], keep_blank_values=True)
    if not pairs or pairs[0][0] != "name":
        return None
    return pairs[0][1], dict(pairs[1:])


def _published(ip: str | None, ports: Any) -> tuple[PublishedPort, ...]:
    """``public_ipaddr`` + the first usable ``HostPort`` of each ``ports`` key, by container port.

    ``ports`` is Docker's map (``{"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41234"}]}``);
    ``HostIp`` is the bind address on the host (a wildcard), not an address to dial. Keys or
    bindings that do not parse are skipped; no IP or no map means no entries.
    """
    if ip is None or not isinstance(ports, Mapping):
        return ()
    try:
        host = str(ipaddress.ip_address(ip))
    except ValueError:
        return ()
    found: dict[tuple[int, str], PublishedPort] = {}
    for key, bindings in ports.items():
        port_text, _, proto = str(key).partition("/")
        container_port = _port_number(port_text)
        protocol = (proto or "tcp").strip().upper()
        if container_port is None or (container_port, protocol) in found:
            continue
        if not isinstance(bindings, Sequence) or isinstance(bindings, str):
            continue
        for binding in bindings:
            if not isinstance(binding, Mapping):
                continue
            host_port = _port_number(binding.get("HostPort"))
            if host_port is not None:
                found[(container_port, protocol)] = PublishedPort(
                    container_port=container_port, protocol=protocol, host=host,
                    port=host_port, kind="ip",
                )
                break
    return tuple(found[k] for k in sorted(found))


def _port_number(value: Any) -> int | None:
    """A port number (an int, or its decimal string as Vast.ai sends ``HostPort``), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and 1 <= value <= 65535 else None


def map_status(
    actual_status: str | None, intended_status: str | None
) -> tuple[InstanceState, str | None]:
    """Vast.ai ``actual_status`` (+ ``intended_status``) -> InstanceState and a reason.

    Vast.ai reports no exit code, so an exited container is FAILED. ``unknown`` and ``offline``
    are FAILED too: the spec warns such an instance never reaches ``running``.
    """
    status = (actual_status or "").strip().lower()
    if status in ("", "created", "loading", "scheduling"):
        return InstanceState.PENDING, "loading" if status == "loading" else None
    if status == "running":
        return InstanceState.RUNNING, None
    if status == "rebooting":
        return InstanceState.RUNNING, "rebooting"
    if status == "exited":
        return InstanceState.FAILED, "container exited (Vast.ai reports no exit code)"
    if status == "stopped":
        if (intended_status or "").lower() == "running":
            return InstanceState.FAILED, "stopped by the host or outbid (preempted)"
        return InstanceState.FAILED, "stopped outside vkprovider"
    if status == "frozen":
        return InstanceState.FAILED, "frozen outside vkprovider"
    if status in ("unknown", "offline"):
        return InstanceState.FAILED, f"host {status}: the instance will not reach running"
    return InstanceState.PENDING, f"unrecognized Vast.ai status {status!r}"


def _norm_gpu(name: str) -> str:
    return re.sub(r"[\s_]+", "_", name.strip()).lower()


def _country(item: Mapping[str, Any]) -> str | None:
    code = item.get("country_code")
    if isinstance(code, str) and code.strip():
        return code.strip().upper()
    geo = item.get("geolocation")
    if isinstance(geo, str) and geo.strip():
        return geo.rsplit(",", 1)[-1].strip().upper() or None
    return None


def _finite(value: Any) -> float | None:
    """A JSON number as a float; None for null, booleans, strings, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _epoch(value: Any) -> datetime | None:
    if isinstance(value, int | float) and value > 0:
        return datetime.fromtimestamp(float(value), UTC)
    return None


_OPTION_KEYS = frozenset({
    "gpu_types", "disk_gb", "offer_type", "verified", "min_reliability", "offer_filters",
    "offer_limit", "max_offer_attempts", "capacity_limit", "env_format", "command_mode",
    "image_login", "log_poll_attempts", "log_poll_interval", *opt.RETRY_KEYS, "regions",
    "interruptible_offers",
})  # fmt: skip


def _login_server(image_login: str) -> str:
    """The registry ``image_login`` logs in to: it must be ``-u <user> -p <password> <registry>``.

    That is the form Vast.ai documents, and the registry it names is the only one the credential
    is sent for. Anything else is an InvalidOption that never quotes the value (it holds the
    password).
    """
    words = image_login.split()
    if len(words) != 5 or words[0] != "-u" or words[2] != "-p" or words[4].startswith("-"):
        raise opt.InvalidOption("image_login", "must be '-u <username> -p <password> "
                                "<registry>' (the registry it is for, docker.io for Docker Hub)")
    return words[4]


class _Options:
    """The parsed, checked ``options``; a bad value is an :class:`~providers.options.InvalidOption`
    (a ValueError) naming the option."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        if raw.get(REGISTRY_HOSTS) is not None:
            raise opt.InvalidOption(REGISTRY_HOSTS, "is not a Vast.ai option: image_login "
                                    "applies to the registry it names")
        opt.reject_unknown(raw, _OPTION_KEYS, cloud="Vast.ai")
        self.gpu_types: dict[str, tuple[str, ...]] = opt.name_map(raw, "gpu_types")
        regions = opt.strings(raw, "regions",
                              hint="must be a list of country codes (e.g. [DE, FR])")
        # A GPUProvider's spec.regions: rent only in these countries (data residency)
        self.regions: tuple[str, ...] = tuple(r.strip().upper() for r in regions)
        self.disk_gb = opt.number(raw, "disk_gb", default=20.0, minimum=0, above=True)
        self.offer_type = opt.choice(raw, "offer_type", choices=("ondemand", "bid"),
                                     default="ondemand")
        self.interruptible_offers = opt.boolean(raw, "interruptible_offers", default=False)
        self.verified = opt.boolean(raw, "verified", default=True)
        self.min_reliability = opt.optional_number(raw, "min_reliability", minimum=0, maximum=1)
        self.offer_filters: dict[str, Any] = opt.mapping(raw, "offer_filters") or {}
        self.offer_limit = opt.integer(raw, "offer_limit", default=20, minimum=1)
        self.max_offer_attempts = opt.integer(raw, "max_offer_attempts", default=3, minimum=1)
        self.capacity_limit = opt.integer(raw, "capacity_limit", default=200, minimum=1)
        self.env_format = opt.choice(raw, "env_format", choices=("string", "dict"),
                                     default="string")
        self.command_mode = opt.choice(raw, "command_mode", choices=("reject", "onstart"),
                                       default="reject")
        self.image_login = opt.optional_string(raw, "image_login", secret=True)
        self.image_login_scope = node_scope(
            raw, credential="image_login",
            default=[_login_server(self.image_login)] if self.image_login else None)
        self.log_poll_attempts = opt.integer(raw, "log_poll_attempts", default=10, minimum=1)
        self.log_poll_interval = opt.duration(raw, "log_poll_interval", default=1.0, minimum=0)
        retry = opt.retry_options(raw)
        self.max_attempts = retry.max_attempts
        self.backoff_initial = retry.backoff_initial
        self.backoff_max = retry.backoff_max
        self.retry_after_cap = retry.retry_after_cap


class VastAIProvider(HTTPAdapter):
    """A :class:`~providers.base.Provider` for one Vast.ai account, scoped to ``owner``.

    ``transport`` replaces the network (e.g. ``httpx.ASGITransport(app=fake)`` in tests). The API
    key goes into the API client's ``Authorization`` header and nowhere else: the log file is
    fetched from ``result_url`` by a second client that carries no credentials.
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
            auth_headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        )
        self._blob_client = httpx.AsyncClient(timeout=timeout, transport=transport)
        self._registry_secrets = RegistrySecrets()

    def _scrub(self, text: str) -> str:
        """``text`` without the API key or any registry password this adapter has sent."""
        return self._registry_secrets.scrub(super()._scrub(text))

    async def aclose(self) -> None:
        await super().aclose()
        await self._blob_client.aclose()

    # -- the Provider protocol --------------------------------------------------------------

    async def create(self, spec: InstanceSpec) -> Instance:
        """Adopt the instance labelled for ``spec.name``, or rent the cheapest matching offer."""
        body, label = self._rent_body(spec)  # InvalidSpec before any HTTP call
        self._registry_secrets.remember(pod_credential(spec))
        kind = self._kind(spec)
        search = self._search_body(spec)
        existing = await self._list(select_filters={"label": {"eq": label}})
        if existing:
            return min(existing, key=lambda i: int(i.id))
        what = f"search offers for {spec.name!r}"
        response = await self._request(
            "POST", "/api/v0/bundles", what=what, json_body=search, op="search"
        )
        offers = self._offers(self._json(response, what=what), what=what)
        offers = [o for o in offers if self._offer_fits(o, spec)]
        price_field = "min_bid" if kind == "bid" else "dph_total"
        offers.sort(key=lambda o: (float(o[price_field]), -float(o.get("reliability") or 0)))
        if not offers:
            raise CapacityError(
                f"{self.name}: no Vast.ai offer for {self._wanted(spec)}", provider=self.name
            )
        last: ProviderError | None = None
        for offer in offers[: self._opts.max_offer_attempts]:
            what = f"rent offer {offer['id']} for {spec.name!r}"
            try:
                rent = dict(body)
                if kind == "bid":
                    rent["price"] = self._bid_price(spec, offer)
                price = float(rent.get("price", offer["dph_total"]))
                response = await self._request(
                    "PUT", f"/api/v0/asks/{int(offer['id'])}", what=what, json_body=rent,
                    op="rent", retry_transient=False,
                )
            except CapacityError as exc:
                last = exc  # taken since the search: try the next offer
                continue
            data = self._json(response, what=what)
            contract = data.get("new_contract")
            if not isinstance(contract, int) or data.get("success") is False:
                raise self._malformed(what)
            return self._rented(spec, offer, contract, price)
        raise CapacityError(
            f"{self.name}: every Vast.ai offer tried for {self._wanted(spec)} was taken"
            + (f" (last: {last})" if last is not None else ""),
            provider=self.name,
        )

    async def list(self) -> list[Instance]:
        """Every instance whose label says it belongs to ``owner`` (all pages)."""
        return await self._list(select_filters=None)

    async def gpu_metrics_all(self) -> dict[str, dict[str, Any]]:
        """GPU figures of every instance of our owner, by instance id, from the list call.

        The same ``GET /api/v1/instances`` pages, owner filter and retries as :meth:`list`
        (whose ids are the keys): one call when the account has at most 25 instances. Vast.ai
        reports one figure per *instance*, not per GPU, so a running instance gets ONE entry
        (``index`` 0; ``uuid`` ``all-<n>-gpus`` when it has n > 1 GPUs, so that nobody reads
        it as GPU 0 alone) rather than n copies of the same numbers:

        * ``gpu_util`` ("GPU utilization as a fraction", nullable) -> ``gpu_utilization`` in
          percent (x 100);
        * ``gpu_temp`` ("Current GPU temperature in Celsius", nullable) -> ``temperature_c``;
        * ``gpu_totalram`` ("Total GPU RAM in MB") -> ``memory_total_bytes`` (MB are MiB:
          24576 for a 24 GB card), only for a one-GPU instance: whether it counts one GPU or
          all of them is not said, and for one GPU it does not matter.

        Vast.ai reports no GPU memory in use (``gpu_ram`` is "Allocated GPU RAM", a size;
        ``vmem_usage`` is the container's virtual memory), power, UUID or tensor activity.
        Instances that are not running, and running ones without figures, get ``gpus: []``.
        """
        owned = await self._owned(select_filters=None, what="read GPU metrics")
        return {instance.id: self._gpu_figures(instance, item) for instance, item in owned}

    async def delete(self, instance_id: str) -> None:
        """Destroy the instance; one that is gone (or never was) is not an error."""
        if not instance_id.isdigit():
            return  # not a Vast.ai contract id, so nothing of ours can have it
        try:
            await self._request(
                "DELETE", f"/api/v0/instances/{instance_id}",
                what=f"destroy instance {instance_id}", op="destroy",
            )
        except NotFound:
            return

    async def logs(self, instance_id: str, opts: LogOptions) -> AsyncGenerator[bytes, None]:
        """A snapshot of the container log: Vast.ai uploads it to ``result_url``, we fetch it."""
        unsupported = [
            what
            for what, wanted in (
                ("follow", opts.follow),
                ("since_seconds", opts.since_seconds is not None),
                ("timestamps", opts.timestamps),
            )
            if wanted
        ]
        if unsupported:
            raise Unsupported(
                f"{self.name}: Vast.ai only uploads a snapshot of the container log; "
                f"{', '.join(unsupported)} cannot be honoured",
                provider=self.name,
            )
        if not instance_id.isdigit():
            raise NotFound(f"{self.name}: no instance {instance_id}", provider=self.name)
        what = f"logs of instance {instance_id}"
        body: dict[str, Any] = {}
        if opts.tail_lines is not None:
            body["tail"] = str(max(0, opts.tail_lines))
        response = await self._request(
            "PUT", f"/api/v0/instances/request_logs/{instance_id}", what=what, json_body=body,
            op="logs",
        )
        url = self._json(response, what=what).get("result_url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise self._malformed(what)
        text = await self._fetch_blob(url, what=what)
        if opts.limit_bytes is not None:
            text = text[: max(0, opts.limit_bytes)]
        for start in range(0, len(text), 65536):
            yield text[start : start + 65536]

    async def capacity(self) -> builtins.list[Offer]:
        """GPUs for sale now, per (GPU type, country), from one offer search (two with
        ``interruptible_offers``: on demand and bid).

        Vast.ai lists one machine as several offers (1, 2, 4... GPUs), so each machine counts
        once, with its largest offer; the price is the cheapest per-GPU price seen (``min_bid``
        for bid offers).
        """
        kinds = [self._opts.offer_type]
        if self._opts.offer_type == "ondemand" and self._opts.interruptible_offers:
            kinds.append("bid")
        out: builtins.list[Offer] = []
        for kind in kinds:
            out.extend(await self._capacity(kind))
        return out

    async def _capacity(self, kind: str) -> builtins.list[Offer]:
        body = self._base_filters(kind)
        body["limit"] = self._opts.capacity_limit
        if self._opts.gpu_types:
            names = sorted({n for ns in self._opts.gpu_types.values() for n in ns})
            body["gpu_name"] = {"in": names}
        what = "read capacity"
        response = await self._request(
            "POST", "/api/v0/bundles", what=what, json_body=body, op="search"
        )
        offers = self._offers(self._json(response, what=what), what=what)
        per_machine: dict[tuple[str, str, str], int] = {}
        price: dict[tuple[str, str], float] = {}
        try:
            for offer in offers:
                gpu = self._cluster_gpu(str(offer["gpu_name"]))
                if gpu is None:
                    continue
                region = _country(offer) or _UNKNOWN_REGION
                if self._opts.regions and region not in self._opts.regions:
                    continue  # a lax search: not where we may rent
                count = int(offer["num_gpus"])
                if count < 1:
                    continue
                machine = str(offer.get("machine_id", offer["id"]))
                key = (gpu, region, machine)
                per_machine[key] = max(per_machine.get(key, 0), count)
                per_gpu = float(offer["min_bid" if kind == "bid" else "dph_total"]) / count
                price[(gpu, region)] = min(price.get((gpu, region), math.inf), per_gpu)
        except (KeyError, TypeError, ValueError) as exc:
            raise self._malformed(what) from exc
        available: dict[tuple[str, str], int] = {}
        for (gpu, region, _), count in per_machine.items():
            available[(gpu, region)] = available.get((gpu, region), 0) + count
        return [
            Offer(
                provider=self.name,
                gpu_type=gpu,
                region=region,
                available=count,
                price_per_gpu_hour=round(price[(gpu, region)], 6),
                interruptible=kind == "bid",
            )
            for (gpu, region), count in sorted(available.items())
        ]

    # -- spec -> request bodies (pure; raise InvalidSpec) --------------------------------------

    def _invalid(self, spec: InstanceSpec, why: str) -> InvalidSpec:
        return InvalidSpec(f"{self.name}: cannot run {spec.name!r} on Vast.ai: {why}",
                           provider=self.name)

    def _rent_body(self, spec: InstanceSpec) -> tuple[dict[str, Any], str]:
        if spec.gpu_count < 1:
            raise self._invalid(spec, "Vast.ai rents GPU machines; the pod requests no GPU")
        label = encode_label(name=spec.name, tags=self._tags(spec))
        if len(label) > _LABEL_MAX:
            raise self._invalid(
                spec, f"the identifying label would be {len(label)} characters; Vast.ai "
                f"labels hold at most {_LABEL_MAX} (shorten the node/pod names)"
            )
        for port in spec.ports:
            if port.protocol.upper() not in ("TCP", "UDP"):
                raise self._invalid(spec, f"port protocol {port.protocol} (only TCP and UDP)")
        if spec.shm_bytes is not None:
            raise self._invalid(
                spec, "Vast.ai sizes /dev/shm itself (in proportion to the GPU share) and the "
                "rent cannot set it; drop the pod's memory-backed emptyDir at /dev/shm to run "
                "with Vast.ai's"
            )
        body: dict[str, Any] = {
            "image": spec.image,
            "label": label,
            "disk": self._opts.disk_gb,
            "target_state": "running",
            "cancel_unavail": True,
        }
        if spec.run_as_user is not None:
            body["user"] = str(spec.run_as_user) + (
                f":{spec.run_as_group}" if spec.run_as_group is not None else "")
        if spec.command is not None:
            if self._opts.command_mode == "reject":
                raise self._invalid(
                    spec, "Vast.ai cannot override the image ENTRYPOINT (command); use args "
                    "only, or set the provider option command_mode: onstart"
                )
            body["runtype"] = "ssh"
            body["onstart"] = shlex.join([*spec.command, *(spec.args or ())])
        else:
            body["runtype"] = "args"
            if spec.args is not None:
                body["args"] = list(spec.args)
        body["env"] = self._env(spec)
        auth = pod_credential(spec)
        if auth is not None:
            body["image_login"] = self._image_login(spec, auth)
        elif (self._opts.image_login and self._opts.image_login_scope is not None
              and self._opts.image_login_scope.covers(spec.image)):
            body["image_login"] = self._opts.image_login
        return body, label

    def _image_login(self, spec: InstanceSpec, auth: RegistryAuth) -> str:
        """``-u <username> -p <password> <registry>``, or InvalidSpec when it cannot carry them."""
        for what, value in (("username", auth.username), ("password", auth.password),
                            ("registry", auth.registry)):
            if not value:
                raise refuse(self.name, "Vast.ai", spec, auth, f"has an empty {what}, which "
                             "Vast.ai's image_login cannot carry")
            if _UNSAFE_IN_STRING.search(value):
                raise refuse(self.name, "Vast.ai", spec, auth, f"has a {what} holding "
                             "whitespace, quotes or backslashes, which Vast.ai's image_login "
                             "(docker login flags split on spaces) cannot carry")
        return f"-u {auth.username} -p {auth.password} {auth.registry}"

    def _env(self, spec: InstanceSpec) -> str | dict[str, str]:
        for key in spec.env:
            if not _ENV_NAME.match(key):
                raise self._invalid(spec, f"environment variable name {key!r} is not valid")
        ports = [
            f"-p {p.container_port}:{p.container_port}"
            + ("/udp" if p.protocol.upper() == "UDP" else "")
            for p in spec.ports
        ]
        hostname = spec.hostname or ""
        if hostname and not _HOSTNAME.fullmatch(hostname):
            raise self._invalid(spec, f"host name {hostname!r} is not a DNS name")
        if self._opts.env_format == "dict":
            env = dict(spec.env)
            env.update(dict.fromkeys(ports, "1"))
            if hostname:
                env["-h"] = hostname  # as Vast.ai's CLI reads "-h NAME" into its dict
            return env
        parts: builtins.list[str] = []
        for key, value in spec.env.items():
            if _UNSAFE_IN_STRING.search(value):
                raise self._invalid(
                    spec, f"the value of {key} holds whitespace, quotes or backslashes, which "
                    "the spec's Docker-flag env string cannot carry (set the provider option "
                    "env_format: dict)"
                )
            parts.append(f"-e {key}={value}")
        parts.extend(ports)
        if hostname:
            parts.append(f"-h {hostname}")
        return " ".join(parts)

    def _gpu_names(self, gpu_type: str) -> tuple[str, ...]:
        mapped = self._opts.gpu_types.get(gpu_type)
        return mapped if mapped is not None else (re.sub(r"\s+", "_", gpu_type.strip()),)

    def _cluster_gpu(self, vast_name: str) -> str | None:
        """The cluster name for a Vast.ai ``gpu_name`` (None: not one we sell)."""
        if not self._opts.gpu_types:
            return re.sub(r"\s+", "_", vast_name.strip())
        norm = _norm_gpu(vast_name)
        for cluster, names in self._opts.gpu_types.items():
            if any(_norm_gpu(n) == norm for n in names):
                return cluster
        return None

    def _kind(self, spec: InstanceSpec) -> str:
        """The search ``type`` for ``spec``: ``bid`` when it asks for an interruptible instance
        or the account rents bids only (``offer_type: bid``), else ``ondemand``."""
        return "bid" if spec.interruptible or self._opts.offer_type == "bid" else "ondemand"

    def _base_filters(self, kind: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": kind or self._opts.offer_type,
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "disk_space": {"gte": self._opts.disk_gb},
            # The spec wants exactly two sort directives (minItems/maxItems 2).
            "order": [["dph_total", "asc"], ["reliability", "desc"]],
        }
        if self._opts.verified:
            body["verified"] = {"eq": True}
        if self._opts.regions:
            body["geolocation"] = {"in": list(self._opts.regions)}
        if self._opts.min_reliability is not None:
            body["reliability"] = {"gte": self._opts.min_reliability}
        body.update(self._opts.offer_filters)
        return body

    def _search_body(self, spec: InstanceSpec) -> dict[str, Any]:
        body = self._base_filters(self._kind(spec))
        body["limit"] = self._opts.offer_limit
        body["num_gpus"] = {"eq": spec.gpu_count}
        if spec.gpu_type:
            body["gpu_name"] = {"in": list(self._gpu_names(spec.gpu_type))}
        if self._region(spec):
            body["geolocation"] = {"in": [self._region(spec)]}
        if spec.ports:
            body["direct_port_count"] = {"gte": len(spec.ports)}
        if spec.cpu_millis > 0:
            body["cpu_cores_effective"] = {"gte": spec.cpu_millis / 1000}
        if spec.memory_bytes > 0:
            body["cpu_ram"] = {"gte": math.ceil(spec.memory_bytes / 2**20)}
        if spec.max_price_per_hour is not None:
            price_field = "min_bid" if self._kind(spec) == "bid" else "dph_total"
            body[price_field] = {"lte": spec.max_price_per_hour}
        return body

    @staticmethod
    def _region(spec: InstanceSpec) -> str | None:
        """The country to search in; ``unknown`` (offers without a location) is no constraint."""
        region = (spec.region or "").strip().upper()
        return None if region in ("", _UNKNOWN_REGION.upper()) else region

    def _offer_fits(self, offer: Mapping[str, Any], spec: InstanceSpec) -> bool:
        """Check again what we searched for: a lax search must not rent the wrong machine."""
        try:
            if int(offer["num_gpus"]) != spec.gpu_count:
                return False
            if spec.gpu_type and _norm_gpu(str(offer["gpu_name"])) not in {
                _norm_gpu(n) for n in self._gpu_names(spec.gpu_type)
            }:
                return False
            if self._region(spec) and _country(offer) != self._region(spec):
                return False
            if self._opts.regions and _country(offer) not in self._opts.regions:
                return False  # a lax search must not rent outside the allowed countries
            price = float(offer["min_bid" if self._kind(spec) == "bid" else "dph_total"])
            int(offer["id"])
        except (KeyError, TypeError, ValueError):
            return False
        return spec.max_price_per_hour is None or price <= spec.max_price_per_hour

    def _bid_price(self, spec: InstanceSpec, offer: Mapping[str, Any]) -> float:
        if spec.max_price_per_hour is not None:
            return max(0.001, spec.max_price_per_hour)
        try:
            return max(0.001, float(offer["min_bid"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CapacityError(
                f"{self.name}: offer {offer.get('id')} has no min_bid to bid on",
                provider=self.name,
            ) from exc

    def _wanted(self, spec: InstanceSpec) -> str:
        text = f"{spec.gpu_count} x {spec.gpu_type or 'any GPU'}"
        if self._region(spec):
            text += f" in {self._region(spec)}"
        if spec.max_price_per_hour is not None:
            text += f" at <= ${spec.max_price_per_hour}/h"
        return text

    def _tags(self, spec: InstanceSpec) -> dict[str, str]:
        return {**spec.tags, TAG_NODE: self.owner}

    def _rented(
        self, spec: InstanceSpec, offer: Mapping[str, Any], contract: int, price: float
    ) -> Instance:
        return Instance(
            id=str(contract),
            name=spec.name,
            provider=self.name,
            state=InstanceState.PENDING,
            tags=self._tags(spec),
            gpu_type=spec.gpu_type or self._cluster_gpu(str(offer["gpu_name"])),
            gpu_count=spec.gpu_count,
            region=_country(offer),
            price_per_hour=price,
            message="rented; waiting for the host",
            interruptible=self._kind(spec) == "bid",
        )

    # -- listing ----------------------------------------------------------------------------

    async def _list(
        self, *, select_filters: Mapping[str, Any] | None
    ) -> builtins.list[Instance]:
        owned = await self._owned(select_filters=select_filters, what="list instances")
        return [instance for instance, _ in owned]

    async def _owned(
        self, *, select_filters: Mapping[str, Any] | None, what: str
    ) -> builtins.list[tuple[Instance, Mapping[str, Any]]]:
        """Our instances, each with its raw list item, from ``GET /api/v1/instances`` (all
        pages: one call per 25 instances of the account)."""
        found: builtins.list[tuple[Instance, Mapping[str, Any]]] = []
        token: str | None = None
        for _ in range(_MAX_PAGES):
            params: dict[str, str] = {"limit": str(_PAGE_SIZE)}
            if select_filters:
                params["select_filters"] = json.dumps(select_filters, separators=(",", ":"))
            if token is not None:
                params["after_token"] = token
            response = await self._request("GET", "/api/v1/instances", what=what, params=params)
            data = self._json(response, what=what)
            items = data.get("instances")
            if not isinstance(items, Sequence):
                raise self._malformed(what)
            for item in items:
                instance = self._instance(item, what=what)
                if instance is not None:
                    found.append((instance, item))
            next_token = data.get("next_token")
            if not next_token or not items:
                return found
            token = str(next_token)
        raise ProviderError(f"{self.name}: {what}: more than {_MAX_PAGES} pages",
                            provider=self.name)

    def _instance(self, item: Any, *, what: str) -> Instance | None:
        """Our Instance for one listed item; None when the label says it is not ours."""
        if not isinstance(item, Mapping):
            raise self._malformed(what)
        decoded = decode_label(item.get("label"))
        if decoded is None:
            return None
        name, tags = decoded
        if tags.get(TAG_NODE) != self.owner:
            return None
        try:
            state, reason = map_status(item.get("actual_status"), item.get("intended_status"))
            status_msg = item.get("status_msg")
            message = reason
            if isinstance(status_msg, str) and status_msg.strip():
                detail = self._scrub(status_msg.strip())[:MAX_SERVER_MESSAGE]
                message = f"{reason}: {detail}" if reason else detail
            ip = item.get("public_ipaddr")
            ip = ip.strip() if isinstance(ip, str) and ip.strip() else None
            gpu_name = item.get("gpu_name")
            bid = item.get("is_bid") is True
            outbid = bid and state == InstanceState.FAILED and str(
                item.get("actual_status") or "").lower() == "stopped" and str(
                item.get("intended_status") or "").lower() == "running"
            return Instance(
                id=str(int(item["id"])),
                name=name,
                provider=self.name,
                state=state,
                tags=tags,
                gpu_type=self._cluster_gpu(gpu_name) if isinstance(gpu_name, str) else None,
                gpu_count=int(item.get("num_gpus") or 0),
                region=_country(item),
                price_per_hour=float(item.get("dph_total") or 0.0),
                ip=ip,
                endpoints=self._endpoints(ip, item.get("ports")),
                published=_published(ip, item.get("ports")),
                created_at=_epoch(item.get("start_date")),
                # the rental contract starts billing ``dph_total`` at ``start_date`` (there is no
                # separate boot time): spend is counted from here (vkprovider/node/spend.py)
                started_at=_epoch(item.get("start_date")),
                message=self._scrub(message) if message else None,
                interruptible=bid,
                interrupted=outbid,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise self._malformed(what) from exc

    @staticmethod
    def _gpu_figures(instance: Instance, item: Mapping[str, Any]) -> dict[str, Any]:
        """One instance's ``gpu_metrics`` body (see :meth:`gpu_metrics_all`)."""
        body: dict[str, Any] = {"instance_id": instance.id, "state": instance.state.value,
                                "gpus": []}
        if instance.state is not InstanceState.RUNNING:
            return body
        figures: dict[str, Any] = {}
        util, temp = _finite(item.get("gpu_util")), _finite(item.get("gpu_temp"))
        if util is not None:
            figures["gpu_utilization"] = util * 100.0
        if temp is not None:
            figures["temperature_c"] = temp
        total = _finite(item.get("gpu_totalram"))
        if instance.gpu_count == 1 and total is not None and total > 0:
            figures["memory_total_bytes"] = int(total * 2**20)
        if not figures:
            return body
        gpu: dict[str, Any] = {"index": 0, **figures}
        if instance.gpu_count > 1:
            gpu["uuid"] = f"all-{instance.gpu_count}-gpus"
        if instance.gpu_type:
            gpu["gpu_type"] = instance.gpu_type
        body["gpus"] = [gpu]
        return body

    @staticmethod
    def _endpoints(ip: str | None, ports: Any) -> tuple[str, ...]:
        """``ip:host_port`` for each mapped container port, ordered by container port."""
        if ip is None or not isinstance(ports, Mapping):
            return ()
        found: builtins.list[tuple[int, str]] = []
        for key, bindings in ports.items():
            try:
                container_port = int(str(key).split("/", 1)[0])
            except ValueError:
                continue
            if not isinstance(bindings, Sequence):
                continue
            for binding in bindings:
                if isinstance(binding, Mapping) and binding.get("HostPort"):
                    found.append((container_port, f"{ip}:{binding['HostPort']}"))
                    break
        return tuple(endpoint for _, endpoint in sorted(found))

    def _offers(
        self, data: Mapping[str, Any], *, what: str
    ) -> builtins.list[Mapping[str, Any]]:
        offers = data.get("offers")
        if isinstance(offers, Mapping):  # the spec's example shows a single object
            offers = [offers]
        if not isinstance(offers, Sequence) or not all(isinstance(o, Mapping) for o in offers):
            raise self._malformed(what)
        return list(offers)

    # -- logs -------------------------------------------------------------------------------

    async def _fetch_blob(self, url: str, *, what: str) -> bytes:
        """GET ``result_url`` (no credentials), waiting while the upload is not there yet."""
        for attempt in range(self._opts.log_poll_attempts):
            if attempt:
                await asyncio.sleep(self._opts.log_poll_interval)
            try:
                response = await self._blob_client.get(url)
            except httpx.TransportError as exc:
                raise self._transport_error(exc, what=what) from exc
            if response.is_success:
                return response.content
            if response.status_code not in (403, 404) and response.status_code < 500:
                raise ProviderError(
                    f"{self.name}: {what} failed: the log file answered HTTP "
                    f"{response.status_code}",
                    provider=self.name,
                )
        raise TransientError(
            f"{self.name}: {what}: the log file was not uploaded after "
            f"{self._opts.log_poll_attempts} polls",
            provider=self.name,
        )

    # -- the HTTP edge (the rest is providers.http.HTTPAdapter) ----------------------------

    def _status_error(self, response: Answer, *, what: str, op: str) -> ProviderError:
        """Vast.ai's ``{success, error, msg}`` (or ``{detail}`` on 429) -> a typed error."""
        status = response.status_code
        code, detail = "", ""
        try:
            data = response.json()
            if isinstance(data, Mapping):
                code = str(data.get("error") or "")
                detail = str(data.get("msg") or data.get("detail") or "")
        except ValueError:
            pass
        message = self._status_message(
            what, status, label=self._scrub(code), detail=self._scrub(detail)[:MAX_SERVER_MESSAGE]
        )
        p = self.name
        lowered = f"{code} {detail}".lower()
        if status not in (401, 429):
            if op == "search" and status == 404:
                return AuthError(message, provider=p)  # the spec: 404 = invalid or missing key
            if status == 402 or any(word in lowered for word in _QUOTA_WORDS):
                return QuotaError(message, provider=p)
            if op == "rent" and (status in (403, 404, 410) or "no_such_ask" in lowered):
                # the spec: 404/410 = the offer is gone, 403 = "offer is not your own"
                return CapacityError(message, provider=p)
        return self._classify(response, message)

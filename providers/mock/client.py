"""The adapter for the mock GPU cloud: :class:`MockProvider`.

Why it exists: it is the reference adapter. It speaks the mock cloud's HTTP API
(:mod:`providers.mock.server`) the way a real adapter speaks a real cloud's: over httpx, with
retries only at the HTTP edge (:mod:`providers.http`, shared by every adapter), and with every
failure turned into one of the typed errors of :mod:`providers.base`. Tests of the service run
against it, so its behaviour is the contract made concrete.

Retries: timeouts, connection errors and 5xx (:class:`~providers.base.TransientError`) are
retried ``max_attempts`` times in all with short exponential backoff and jitter. A 429
(:class:`~providers.base.RateLimited`) is retried after its ``Retry-After`` when that is at most
``retry_after_cap`` seconds (with backoff when the cloud gave none), and raised at once when it
asks for longer, so that the caller can back off as a whole. Capacity, quota, auth and spec
errors are never retried. Create may be retried because the cloud is idempotent by name.

Published ports: create sends the spec's ``ports``; the cloud answers, per declared container
port, a ``public_port`` on the instance's ``public_ip`` (198.18.0.0/15, never the pod's
100.64.x.y ``ip``; the public port differs from the container port). Each becomes a
:class:`~providers.base.PublishedPort` of kind ``"ip"`` without a scheme.

Interruptible (spot) instances: ``capacity`` maps the cloud's ``interruptible`` offers; a spec
with ``interruptible`` is created with ``interruptible: true``; an instance reports
``interruptible``, ``interruption_at`` (a reclaim the cloud announced: the notice) and
``interrupted`` (reclaimed, state ``failed``), all mapped as they are.

Private images: a spec's ``registry_auth`` (the pod's ``imagePullSecrets``) is sent with the
create when it is for the image's registry. A node-wide credential (``registry_auth``:
``{username, password}``, with ``registry_hosts`` naming the registries it is for) is sent only
with images of those registries, as the real adapters do (:mod:`providers.registryauth`); any
other image is created without a credential (an anonymous pull).
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import httpx

from providers.base import (
    TAG_NODE,
    CapacityError,
    ImagePullError,
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
from providers.http import (
    MAX_SERVER_MESSAGE,
    Answer,
    HTTPAdapter,
    RetryPolicy,
    parse_retry_after,
)
from providers.listcache import ListingCache
from providers.options import InvalidOption
from providers.registryauth import node_scope, normalize_image, pod_credential

__all__ = ["MockProvider"]

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "terminating": InstanceState.TERMINATING,
    "failed": InstanceState.FAILED,
}
#: Kept under its old name: callers (and tests) import it from here.
_parse_retry_after = parse_retry_after


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return None if value is None else int(value)


def _opt_time(data: Mapping[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    return None if value is None else datetime.fromisoformat(str(value))


def _port_number(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= 65535 else None


def _published(data: Mapping[str, Any]) -> tuple[PublishedPort, ...]:
    """``public_ip:public_port`` per entry of the instance's ``ports``, and in hostname-only
    mode each entry of ``edges`` (an HTTPS edge by name, maybe wanting the API key in a
    header); what is missing or malformed is left out, never an error."""
    return _edges(data) + _ip_ports(data)


def _edges(data: Mapping[str, Any]) -> tuple[PublishedPort, ...]:
    edges = data.get("edges")
    if not isinstance(edges, list):
        return ()
    out = []
    for entry in edges:
        if not isinstance(entry, Mapping):
            continue
        container_port = _port_number(entry.get("container_port"))
        port = _port_number(entry.get("port"))
        host, protocol, auth = entry.get("host"), entry.get("protocol", "TCP"), \
            entry.get("auth_header")
        if container_port is None or port is None or not isinstance(host, str) or not host \
                or not isinstance(protocol, str) or not (auth is None or isinstance(auth, str)):
            continue
        out.append(PublishedPort(container_port=container_port, protocol=protocol, host=host,
                                 port=port, kind="hostname", scheme="https", edge_auth=auth))
    return tuple(out)


def _ip_ports(data: Mapping[str, Any]) -> tuple[PublishedPort, ...]:
    host, ports = data.get("public_ip"), data.get("ports")
    if not isinstance(host, str) or not host or not isinstance(ports, list):
        return ()
    published = []
    for entry in ports:
        if not isinstance(entry, Mapping):
            continue
        container_port = _port_number(entry.get("container_port"))
        public_port = _port_number(entry.get("public_port"))
        protocol = entry.get("protocol", "TCP")
        if container_port is None or public_port is None or not isinstance(protocol, str):
            continue
        published.append(PublishedPort(container_port=container_port, protocol=protocol,
                                       host=host, port=public_port, kind="ip"))
    return tuple(published)


class MockProvider(HTTPAdapter):
    """A :class:`~providers.base.Provider` for one mock cloud account, scoped to ``owner``.

    ``transport`` replaces the network (e.g. ``httpx.ASGITransport(app=create_app(...))`` in
    tests). The API key goes into the client's default headers and nowhere else.
    """

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        owner: str,
        api_key: str | None = None,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_attempts: int = 4,
        backoff_initial: float = 0.1,
        backoff_max: float = 2.0,
        retry_after_cap: float = 5.0,
        regions: Sequence[str] = (),
        registry_auth: Mapping[str, Any] | None = None,
        registry_hosts: Sequence[str] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if isinstance(regions, str) or not all(isinstance(r, str) and r for r in regions):
            raise ValueError("regions must be a list of region names")
        self.regions = tuple(regions)  # a GPUProvider's spec.regions: sell and create only there
        self._node_scope = node_scope({"registry_auth": registry_auth,
                                       "registry_hosts": registry_hosts},
                                      credential="registry_auth")
        self._node_auth: RegistryAuth | None = None  # repr hides the password
        if registry_auth is not None:
            username, password = registry_auth.get("username"), registry_auth.get("password")
            if (set(registry_auth) - {"username", "password"} or not isinstance(username, str)
                    or not isinstance(password, str) or not username or not password):
                raise InvalidOption("registry_auth", "must be {username, password} (strings)")
            self._node_auth = RegistryAuth(registry="", username=username, password=password)
        self._listed = ListingCache()  # instances listed unchanged are not parsed again
        super().__init__(
            name=name,
            base_url=base_url,
            owner=owner,
            timeout=timeout,
            transport=transport,
            retry=RetryPolicy(
                max_attempts=max_attempts,
                backoff_initial=backoff_initial,
                backoff_max=backoff_max,
                retry_after_cap=retry_after_cap,
            ),
            auth_headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            edge_key=api_key,  # hostname-only mode: the edge wants the account's key
        )

    # -- the Provider protocol --------------------------------------------------------------

    async def create(self, spec: InstanceSpec) -> Instance:
        """Create (or find, by ``spec.name``) the instance; always tagged with our owner."""
        body: dict[str, Any] = {
            "name": spec.name,
            "image": spec.image,
            "gpu_type": spec.gpu_type,
            "gpu_count": spec.gpu_count,
            "region": spec.region,
            "command": list(spec.command) if spec.command is not None else None,
            "args": list(spec.args) if spec.args is not None else None,
            "env": dict(spec.env),
            "ports": [
                {"container_port": p.container_port, "protocol": p.protocol, "name": p.name}
                for p in spec.ports
            ],
            "cpu_millis": spec.cpu_millis,
            "memory_bytes": spec.memory_bytes,
            "max_price_per_hour": spec.max_price_per_hour,
            "tags": {**spec.tags, TAG_NODE: self.owner},
        }
        if spec.interruptible:
            body["interruptible"] = True  # rent as spot: only offers with a spot price
        if self.regions and spec.region is None:
            body["regions"] = list(self.regions)
        auth = self._credential(spec)
        if auth is not None:
            body["registry_auth"] = {"registry": auth.registry, "username": auth.username,
                                     "password": auth.password}
        what = f"create instance {spec.name!r}"
        response = await self._request("POST", "/instances", what=what, json_body=body)
        return self._instance(self._json(response, what=what), what=what)

    def _credential(self, spec: InstanceSpec) -> RegistryAuth | None:
        """The pod's credential for its image, else the node-wide one if its registries cover
        the image, else None: a credential never goes with an image of another registry."""
        auth = pod_credential(spec)
        if auth is not None or self._node_auth is None or self._node_scope is None:
            return auth
        normal = normalize_image(spec.image)
        if normal is None or not self._node_scope.covers(spec.image):
            return None
        return replace(self._node_auth, registry=normal[0])

    async def list(self) -> list[Instance]:
        """Every live instance tagged with our owner, in one call."""
        what = "list instances"
        response = await self._request(
            "GET", "/instances", what=what, params={"tag": f"{TAG_NODE}={self.owner}"}
        )
        data = self._json(response, what=what)
        try:
            instances = self._listed.parse_all(
                data["instances"], key=lambda item: str(item["id"]),
                parse=lambda item: self._instance(item, what=what))
        except (KeyError, TypeError) as exc:
            raise self._malformed(what) from exc
        # The cloud filters by tag already; checking again keeps a lax cloud from handing us
        # another node's instances (which our GC would then delete).
        return [i for i in instances if i.tags.get(TAG_NODE) == self.owner]

    async def get(self, instance_id: str) -> Instance:
        """One instance by id (not in the protocol); NotFound when it is gone."""
        what = f"get instance {instance_id}"
        response = await self._request("GET", f"/instances/{instance_id}", what=what)
        return self._instance(self._json(response, what=what), what=what)

    async def delete(self, instance_id: str) -> None:
        """Start deleting the instance; deleting one that is gone is not an error."""
        try:
            await self._request(
                "DELETE", f"/instances/{instance_id}", what=f"delete instance {instance_id}"
            )
        except NotFound:
            return

    async def restart(self, instance_id: str) -> None:
        """Restart the instance's container (``restart_count`` goes up). Errors are typed as
        for any call: :class:`~providers.base.NotFound` when it is gone, a
        :class:`~providers.base.ProviderError` (409) once it stopped. Not retried on timeouts
        or 5xx: a lost answer may hide a restart that was done."""
        await self._request(
            "POST", f"/instances/{instance_id}/restart", what=f"restart instance {instance_id}",
            retry_transient=False,
        )

    async def logs(self, instance_id: str, opts: LogOptions) -> AsyncGenerator[bytes, None]:
        """The container's output as raw byte chunks; with ``follow``, until it stops."""
        params: dict[str, str | int] = {}
        if opts.tail_lines is not None:
            params["tail_lines"] = opts.tail_lines
        if opts.since_seconds is not None:
            params["since_seconds"] = opts.since_seconds
        if opts.limit_bytes is not None:
            params["limit_bytes"] = opts.limit_bytes
        if opts.timestamps:
            params["timestamps"] = "true"
        if opts.follow:
            params["follow"] = "true"
        what = f"logs of instance {instance_id}"
        timeout = httpx.Timeout(self._timeout, read=None) if opts.follow else None

        async def open_stream() -> httpx.Response:
            request = self._client.build_request(
                "GET",
                f"/instances/{instance_id}/logs",
                params=params,
                timeout=timeout if timeout is not None else self._timeout,
            )
            return await self._send(request, what=what, stream=True)

        response = await self._retrying(open_stream)
        try:
            async for chunk in response.aiter_bytes():
                if chunk:
                    yield chunk
        except httpx.TransportError as exc:
            raise self._transport_error(exc, what=what) from exc
        finally:
            await response.aclose()

    async def capacity(self) -> builtins.list[Offer]:
        """Every (gpu_type, region) the cloud sells, with the GPUs free now (possibly 0)."""
        what = "read capacity"
        response = await self._request("GET", "/capacity", what=what)
        data = self._json(response, what=what)
        try:
            return [
                Offer(
                    provider=self.name,
                    gpu_type=str(item["gpu_type"]),
                    region=str(item["region"]),
                    available=int(item["available"]),
                    price_per_gpu_hour=float(item["price_per_gpu_hour"]),
                    interruptible=bool(item.get("interruptible", False)),
                )
                for item in data["offers"]
                if not self.regions or str(item["region"]) in self.regions
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._malformed(what) from exc

    # -- extras -----------------------------------------------------------------------------

    async def gpu_metrics(self, instance_id: str) -> dict[str, Any]:
        """Per-GPU utilization, tensor activity, memory, temperature and power of an instance.

        The mock cloud's JSON as is: ``{instance_id, state, at, gpus: [{index, uuid, gpu_type,
        gpu_utilization (percent), tensor_active (0-1), memory_used_bytes, memory_total_bytes,
        temperature_c, power_w}]}``.
        """
        what = f"read GPU metrics of instance {instance_id}"
        response = await self._request("GET", f"/instances/{instance_id}/metrics", what=what)
        return self._json(response, what=what)

    async def gpu_metrics_all(self) -> dict[str, dict[str, Any]]:
        """``gpu_metrics`` of every instance of our owner, by instance id, in ONE call."""
        what = "read GPU metrics"
        response = await self._request("GET", "/gpu-metrics", what=what,
                                       params={"tag": f"{TAG_NODE}={self.owner}"})
        data = self._json(response, what=what)
        try:
            return {str(item["instance_id"]): item for item in data["instances"]}
        except (KeyError, TypeError) as exc:
            raise self._malformed(what) from exc

    # -- the HTTP edge (the rest is providers.http.HTTPAdapter) ----------------------------

    def _status_error(self, response: Answer, *, what: str, op: str) -> ProviderError:
        """The mock cloud's ``{"error": {code, message}}`` -> a typed error; codes win."""
        status = response.status_code
        code, detail = "", ""
        try:
            error = response.json()["error"]
            code = str(error.get("code", ""))
            detail = str(error.get("message", ""))[:MAX_SERVER_MESSAGE]
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        message = self._status_message(what, status, label=code, detail=detail)
        p = self.name
        if status not in (401, 402, 403):
            if code == "quota_exceeded":
                return QuotaError(message, provider=p)
            if code == "capacity_unavailable":
                return CapacityError(message, provider=p)
            if code == "invalid_spec" and status != 429:
                return InvalidSpec(message, provider=p)
            if code == "image_pull_denied":
                registry = detail.partition("registry ")[2].partition(" ")[0]
                return ImagePullError(message, provider=p, registry=registry)
        return self._classify(response, message)

    def _instance(self, data: Any, *, what: str) -> Instance:
        try:
            raw_state = str(data["state"])
            exit_code = _opt_int(data, "exit_code")
            if raw_state == "exited":
                state = InstanceState.SUCCEEDED if exit_code == 0 else InstanceState.FAILED
            else:
                state = _STATES[raw_state]
            return Instance(
                id=str(data["id"]),
                name=str(data["name"]),
                provider=self.name,
                state=state,
                tags={str(k): str(v) for k, v in (data.get("tags") or {}).items()},
                gpu_type=_opt_str(data, "gpu_type"),
                gpu_count=int(data.get("gpu_count") or 0),
                region=_opt_str(data, "region"),
                price_per_hour=float(data.get("price_per_hour") or 0.0),
                ip=_opt_str(data, "ip"),
                endpoints=tuple(str(e) for e in data.get("endpoints") or ()),
                published=_published(data),
                created_at=_opt_time(data, "created_at"),
                started_at=_opt_time(data, "started_at"),
                finished_at=_opt_time(data, "finished_at"),
                exit_code=exit_code,
                message=_opt_str(data, "message"),
                restart_count=int(data.get("restart_count") or 0),
                interruptible=bool(data.get("interruptible", False)),
                interruption_at=_opt_time(data, "interruption_at"),
                interrupted=bool(data.get("interrupted", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed(what) from exc

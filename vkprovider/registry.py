"""Build cloud adapters from configuration or from ``GPUProvider`` objects.

Why it exists: ``vkprovider`` chooses providers by configuration and never hard-wires one; this is
the single place that maps a provider ``type`` to its adapter class, so adding a cloud is one
entry here plus a module in ``providers/``. Providers come from two places (``providers:`` in the
settings file, and GPUProvider objects in the cluster); both go through :func:`build_adapter`, so
an account behaves the same whichever way it was declared.

It is also where a GPUProvider is judged worth trusting (:func:`trust_problems`) before any of
it is used: the object is written by whoever RBAC lets write GPUProviders, while the Secret it
names is read with this process's own rights and sent as a bearer key to its endpoint.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Collection, Mapping
from typing import Any

from providers.base import Provider
from vkprovider.config import GPUProviderSourceSettings, ProviderSettings, Settings
from vkprovider.errors import ConfigError
from vkprovider.placement.policy import GPUProviderSpec, Problem

#: The public API of each cloud, used when a GPUProvider has no ``spec.endpoint``.
DEFAULT_ENDPOINTS: dict[str, str] = {
    "runpod": "https://api.runpod.io",
    "vastai": "https://console.vast.ai",
    "salad": "https://api.salad.com/api/public",
}

#: ``Valid=False`` reasons of a GPUProvider this process refuses to trust.
REASON_SECRET_NAMESPACE = "SecretNamespaceNotAllowed"
REASON_ENDPOINT = "EndpointNotAllowed"

#: scheme://host[:port][/rest]: a host of letters, digits, dots and dashes or a bracketed IPv6
#: address, nothing else (no user information, no percent-encoding, no backslash), so that every
#: URL parser (ours here, the adapters' httpx) reads the same host from it.
_URL = re.compile(r"(?P<scheme>https?)://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])"
                  r"(?::(?P<port>[0-9]{1,5}))?(?P<rest>/[^\s\\]*)?")
_IN_CLUSTER_SUFFIXES = (".svc", ".cluster.local", ".local", ".internal", ".localdomain")

#: Where ``spec.gpuTypes`` and ``spec.regions`` of a GPUProvider go in each adapter's options
#: (``None``: the adapter has no such option; the field is then only enforced by vkprovider).
_OPTION_KEYS: dict[str, tuple[str | None, str | None]] = {
    "mock": (None, "regions"),
    "runpod": ("gpu_types", "data_center_ids"),
    "vastai": ("gpu_types", "regions"),
    "salad": ("gpu_types", "country_codes"),
}


def adapter_options(spec: GPUProviderSpec) -> dict[str, Any]:
    """The adapter options for a GPUProvider: ``spec.options`` plus the typed fields it maps.

    ``gpuTypes`` and ``regions`` fill the adapter's own option (RunPod: ``gpu_types`` and
    ``data_center_ids``; Vast.ai: ``gpu_types`` and ``regions``; Salad: ``gpu_types`` and
    ``country_codes``; mock: ``regions``) unless ``spec.options`` already sets it: the explicit
    option wins.
    """
    out = dict(spec.options)
    gpu_key, region_key = _OPTION_KEYS.get(spec.type, (None, None))
    if gpu_key and spec.gpu_types and gpu_key not in out:
        out[gpu_key] = dict(spec.gpu_types)
    if region_key and spec.regions and region_key not in out:
        out[region_key] = list(spec.regions)
    return out


#: The mock adapter's options: its retry knobs, regions and a node-wide pull credential
#: (``registry_auth: {username, password}`` for the ``registry_hosts`` it names); the other
#: adapters parse their own.
_MOCK_OPTIONS: dict[str, Any] = {"max_attempts": int, "backoff_initial": float,
                                 "backoff_max": float, "retry_after_cap": float,
                                 "regions": list, "registry_auth": dict, "registry_hosts": list}


def build_adapter(
    *, type_: str, name: str, url: str, api_key: str | None, timeout: float,
    options: Mapping[str, Any], owner: str, field: str,
) -> Provider:
    """One adapter; a bad option raises :class:`ConfigError` whose message starts with ``field``."""
    if type_ == "mock":
        from providers.mock.client import MockProvider

        unknown = sorted(set(options) - set(_MOCK_OPTIONS))
        if unknown:
            raise ConfigError(f"{field}.options: unknown mock option(s) {', '.join(unknown)}; "
                              f"known: {', '.join(_MOCK_OPTIONS)}")
        try:
            knobs = {k: conv(options[k]) for k, conv in _MOCK_OPTIONS.items() if k in options}
            return MockProvider(name=name, base_url=url, owner=owner, api_key=api_key,
                                timeout=timeout, **knobs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{field}.options: a value is not valid ({exc})") from exc
    try:
        if type_ == "runpod":
            from providers.runpod import RunPodProvider

            return RunPodProvider(name=name, base_url=url, owner=owner, api_key=api_key,
                                  timeout=timeout, options=options)
        if type_ == "vastai":
            from providers.vastai import VastAIProvider

            return VastAIProvider(name=name, base_url=url, owner=owner, api_key=api_key,
                                  timeout=timeout, options=options)
        if type_ == "salad":
            from providers.salad import SaladProvider

            return SaladProvider(name=name, base_url=url, owner=owner, api_key=api_key,
                                 timeout=timeout, options=options)
    except ImportError as exc:
        raise ConfigError(f"{field}.type: the {type_!r} adapter is not available in this build"
                          ) from exc
    except ValueError as exc:  # adapters name the option: "options.<key> ..."
        raise ConfigError(f"{field}.{exc}") from exc
    except TypeError as exc:  # int([1]) and the like: a value of the wrong type
        raise ConfigError(f"{field}.options: a value has the wrong type ({exc})") from exc
    raise ConfigError(f"{field}.type: the {type_!r} adapter is not available in this build")


def build_provider(*, settings: ProviderSettings, owner: str) -> Provider:
    return build_adapter(type_=settings.type, name=settings.name, url=settings.url,
                         api_key=settings.api_key(), timeout=settings.timeout_seconds,
                         options=settings.options, owner=owner,
                         field=f"providers[{settings.name}]")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address ``host`` stands for without a DNS lookup, if it is one.

    Numeric forms the C resolver also accepts count (``2130706433``, ``127.1``, ``0x7f.1``):
    they are all 127.0.0.1 to the socket that dials them.
    """
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if not re.fullmatch(r"[0-9a-fA-FxX.]+", host) or not re.match(r"[0-9]", host):
            return None
        try:
            addr = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _inside(host: str) -> str | None:
    """Why ``host`` is not a public host on the internet (None: nothing says it is not)."""
    addr = _address(host)
    if addr is not None:
        if addr.is_link_local:
            return "a link-local address (cloud metadata services live there)"
        if addr.is_loopback:
            return "a loopback address"
        if addr.is_unspecified or addr.is_multicast or addr.is_reserved:
            return "not a unicast address"
        if addr.is_private or not addr.is_global:
            return "a private address (inside the cluster or its network)"
        return None
    if host == "localhost" or "." not in host or host.endswith(_IN_CLUSTER_SUFFIXES):
        return "a name inside the cluster or its network"
    return None


def endpoint_refusal(*, spec: GPUProviderSpec, allowed_hosts: Collection[str]) -> str | None:
    """Why this process will not call ``spec.endpoint`` (None: it may).

    * no endpoint: the cloud's own public API (:data:`DEFAULT_ENDPOINTS`);
    * a host in ``allowed_hosts`` (``gpu_providers.allowed_endpoint_hosts``): allowed, http
      and private addresses included: the operator listed it;
    * ``runpod``, ``vastai``, ``salad``: only ``https`` to the cloud's own public API host;
    * ``mock``: any host but a link-local one while it names no ``credentialsSecret``; with one
      (a key would be sent there) only a listed host.
    """
    if spec.endpoint is None:
        return None
    match = _URL.fullmatch(spec.endpoint)
    if match is None:
        return ("not a plain http(s)://host[:port][/path] URL (user information, "
                "percent-encoded or unusual hosts are refused)")
    host = match["host"].lower().rstrip(".")
    addr = _address(host)
    if addr is not None:
        host = str(addr)
    if host in allowed_hosts:
        return None
    listed = "list the host in the provider's gpu_providers.allowed_endpoint_hosts to allow it"
    if spec.type == "mock":
        if spec.credentials_secret is not None:
            return (f"host {host} would receive the API key of spec.credentialsSecret; "
                    f"{listed}")
        if addr is not None and addr.is_link_local:
            return f"host {host} is a link-local address (cloud metadata services live there)"
        return None
    if match["scheme"] != "https":
        return f"only https is allowed for type {spec.type}; {listed}"
    public = _public_host(spec.type)
    if host == public:
        return None
    why = _inside(host) or f"not the {spec.type} API host ({public})"
    return f"host {host} is {why}; {listed}"


def _public_host(type_: str) -> str | None:
    default = DEFAULT_ENDPOINTS.get(type_)
    return None if default is None else default.split("/")[2]


def trust_problems(*, spec: GPUProviderSpec, own_namespace: str,
                   settings: GPUProviderSourceSettings) -> list[Problem]:
    """What makes a GPUProvider untrusted here; judged before its Secret is read or a cloud
    called (no I/O). Each problem names the field: ``spec.credentialsSecret.namespace`` (a
    Secret outside ``own_namespace`` and ``settings.secret_namespaces``) or ``spec.endpoint``
    (see :func:`endpoint_refusal`)."""
    problems = []
    ref = spec.credentials_secret
    allowed = (own_namespace, *settings.secret_namespaces)
    if ref is not None and ref.namespace not in allowed:
        problems.append(Problem(
            field="spec.credentialsSecret.namespace",
            message=f"Secrets are read only in {', '.join(allowed)}, not {ref.namespace} "
                    "(the provider's gpu_providers.secret_namespaces lists more)",
            reason=REASON_SECRET_NAMESPACE))
    refusal = endpoint_refusal(spec=spec, allowed_hosts=settings.allowed_endpoint_hosts)
    if refusal is not None:
        problems.append(Problem(field="spec.endpoint", message=refusal, reason=REASON_ENDPOINT))
    return problems


def build_from_spec(
    *, name: str, spec: GPUProviderSpec, api_key: str | None, owner: str, timeout: float,
) -> Provider:
    """The adapter for a GPUProvider object (errors name ``spec.<field>``)."""
    url = spec.endpoint or DEFAULT_ENDPOINTS.get(spec.type)
    if url is None:
        raise ConfigError(f"spec.endpoint: required for type {spec.type}")
    return build_adapter(type_=spec.type, name=name, url=url, api_key=api_key, timeout=timeout,
                         options=adapter_options(spec), owner=owner, field="spec")


def build_providers(*, settings: Settings) -> dict[str, Provider]:
    """The providers of the settings file (may be none when GPUProvider objects are used)."""
    if not settings.providers and not settings.gpu_providers.enabled:
        raise ConfigError("providers: at least one provider must be configured "
                          "(or enable gpu_providers)")
    return {p.name: build_provider(settings=p, owner=settings.node.name)
            for p in settings.providers}

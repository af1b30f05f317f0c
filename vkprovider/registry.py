"""Build cloud adapters from configuration or from ``GPUProvider`` objects.

Why it exists: ``vkprovider`` chooses providers by configuration and never hard-wires one; this is
the single place that maps a provider ``type`` to its adapter class, so adding a cloud is one
entry here plus a module in ``providers/``. Providers come from two places (``providers:`` in the
settings file, and GPUProvider objects in the cluster); both go through :func:`build_adapter`, so
an account behaves the same whichever way it was declared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.base import Provider
from vkprovider.config import ProviderSettings, Settings
from vkprovider.errors import ConfigError
from vkprovider.placement.policy import GPUProviderSpec

#: The public API of each cloud, used when a GPUProvider has no ``spec.endpoint``.
DEFAULT_ENDPOINTS: dict[str, str] = {
    "runpod": "https://api.runpod.io",
    "vastai": "https://console.vast.ai",
    "salad": "https://api.salad.com/api/public",
}

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

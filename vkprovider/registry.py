"""Build cloud adapters from configuration.

Why it exists: ``vkprovider`` chooses providers by configuration and never hard-wires one; this is
the single place that maps a provider ``type`` to its adapter class, so adding a cloud is one
entry here plus a module in ``providers/``.
"""

from __future__ import annotations

from typing import Any

from providers.base import Provider
from vkprovider.config import ProviderSettings, Settings
from vkprovider.errors import ConfigError


def build_provider(*, settings: ProviderSettings, owner: str) -> Provider:
    key = settings.api_key()
    if settings.type == "mock":
        from providers.mock.client import MockProvider

        return MockProvider(name=settings.name, base_url=settings.url, owner=owner, api_key=key,
                            timeout=settings.timeout_seconds)
    adapter: type[Any] | None = None
    if settings.type == "runpod":
        from providers.runpod import RunPodProvider as adapter
    elif settings.type == "vastai":
        from providers.vastai import VastAIProvider as adapter
    elif settings.type == "salad":
        from providers.salad import SaladProvider as adapter
    if adapter is not None:
        try:
            built: Provider = adapter(name=settings.name, base_url=settings.url, owner=owner,
                                      api_key=key, timeout=settings.timeout_seconds,
                                      options=settings.options)
        except ValueError as exc:
            raise ConfigError(f"providers[{settings.name}].{exc}") from exc
        return built
    raise ConfigError(
        f"providers[{settings.name}].type: the {settings.type!r} adapter is not available in "
        f"this build"
    )


def build_providers(*, settings: Settings) -> dict[str, Provider]:
    if not settings.providers:
        raise ConfigError("providers: at least one provider must be configured")
    return {p.name: build_provider(settings=p, owner=settings.node.name)
            for p in settings.providers}

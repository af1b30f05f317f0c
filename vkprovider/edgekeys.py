"""Which API key a cloud's HTTPS edge gets: the key of the adapter that runs the pod.

Why it exists: a hostname-only cloud's edge may authenticate with the account's key (SaladCloud's
access domain, ``Salad-Api-Key``). The provider's probes and its traffic gateway add it, and the
account may come from the settings file (``providers:``) or from a GPUProvider object whose key
is in a Secret; the Secret's value is never kept outside the adapter built from it. So the key is
asked of the adapter serving that cloud now (:func:`providers.base.edge_api_key`), with the
settings file's key as the fallback for an adapter that offers none. Read at each use, never
kept here, never logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from providers.base import Provider, edge_api_key

__all__ = ["EdgeKeys"]


class EdgeKeys:
    """``edge_keys(provider name) -> key or None``, over the pod controller's live adapters.

    ``adapters`` is the pod controller's provider map (adapters built from GPUProvider objects
    join it, and a rotated Secret replaces its adapter there); set it once the controller exists.
    """

    def __init__(self, *, settings_keys: Mapping[str, Callable[[], str | None]]) -> None:
        self.adapters: Mapping[str, Provider] = {}
        self._settings_keys = settings_keys

    def __call__(self, provider: str) -> str | None:
        adapter = self.adapters.get(provider)
        key = edge_api_key(adapter) if adapter is not None else None
        if key is None:
            read = self._settings_keys.get(provider)
            key = read() if read is not None else None
        return key

    def __repr__(self) -> str:  # never the keys
        return f"EdgeKeys(clouds={sorted(set(self.adapters) | set(self._settings_keys))})"

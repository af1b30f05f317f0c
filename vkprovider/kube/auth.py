"""Credentials for the API server, loaded by the official ``kubernetes`` package.

Why it exists: the official package knows every kubeconfig and in-cluster variant (exec plugins,
token rotation, client certificates), but its models are slow; we borrow only its credential
loading and hand the result to httpx.
"""

from __future__ import annotations

import ssl
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import httpx

from vkprovider.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """Where the API server is and how to prove who we are. ``repr`` hides nothing secret."""

    host: str
    ssl_context: ssl.SSLContext
    _configuration: Any  # kubernetes.client.Configuration; asked for a fresh token per request

    def bearer_token(self) -> str | None:
        """The current token (refreshed by the official loader when it rotates), if any."""
        cfg = self._configuration
        value = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
            "authorization"
        )
        if not value:
            return None
        text = str(value)
        return text[len("Bearer ") :] if text.startswith("Bearer ") else text


def load_credentials(*, kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """Kubeconfig when a path is given, else in-cluster, else the default kubeconfig."""
    from kubernetes import client as kclient  # imported lazily: ~0.5 s, needed once
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    try:
        if kubeconfig is None:
            try:
                kconfig.load_incluster_config(client_configuration=cfg)
            except kconfig.ConfigException:
                kconfig.load_kube_config(context=context, client_configuration=cfg)
        else:
            kconfig.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
    except (kconfig.ConfigException, OSError) as exc:
        raise ConfigError(f"cannot load Kubernetes credentials: {exc}") from exc

    ctx = (
        ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.ssl_ca_cert
        else (ssl.create_default_context())
    )
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file and cfg.key_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return Credentials(host=str(cfg.host).rstrip("/"), ssl_context=ctx, _configuration=cfg)


class BearerAuth(httpx.Auth):
    """Sets the current bearer token on every request (no-op for certificate auth)."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self._credentials.bearer_token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request

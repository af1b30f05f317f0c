"""Credentials for the API server: where it is, how to trust it, how to prove who we are.

Why it exists: the common cases (in-cluster, a kubeconfig with client certificates or a token)
are read by kube/kubeconfig.py; the official ``kubernetes`` package, which knows every variant
(exec plugins, auth providers, merged kubeconfigs), loads the rest. Its models are slow and its
import is heavy, so we borrow only its credential loading, and only when needed, and hand the
result to our HTTP clients.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import httpx

from vkprovider.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """Where the API server is and how to prove who we are. ``repr`` hides nothing secret."""

    host: str
    ssl_context: ssl.SSLContext
    #: The current bearer token, None for none (certificate auth): asked anew by
    #: :class:`BearerAuth` every few seconds, so a rotated token is picked up.
    token: Callable[[], str | None] = field(repr=False)

    def bearer_token(self) -> str | None:
        """The current token, if any."""
        return self.token()


def configuration_token(cfg: Any) -> Callable[[], str | None]:
    """The token source of an official-client ``Configuration`` (refreshed by its loader)."""

    def token() -> str | None:
        value = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
            "authorization"
        )
        if not value:
            return None
        text = str(value)
        return text[len("Bearer ") :] if text.startswith("Bearer ") else text

    return token


def load_credentials(*, kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """Kubeconfig when a path is given, else in-cluster, else the default kubeconfig.

    The common cases are read directly (kube/kubeconfig.py: the official client costs 7.4 MiB
    of memory for the process's life); the rest goes through the official loader."""
    from vkprovider.kube import kubeconfig as kubeconfig_file  # it builds our Credentials

    try:
        simple = kubeconfig_file.load(kubeconfig=kubeconfig, context=context)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load Kubernetes credentials: {exc}") from exc
    return simple or _official(kubeconfig=kubeconfig, context=context)


def _official(*, kubeconfig: str | None, context: str | None) -> Credentials:
    from kubernetes import client as kclient  # imported lazily: ~0.5 s and 7.4 MiB
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
    return Credentials(host=str(cfg.host).rstrip("/"), ssl_context=ctx,
                       token=configuration_token(cfg))


class BearerAuth(httpx.Auth):
    """Sets the current bearer token on every request (no-op for certificate auth).

    The token is asked of its source at most every ``max_age`` seconds: asking the official
    loader re-applies the whole kubeconfig to its Configuration (about 5% of the CPU of a request
    when done per request), while it re-reads a rotated token only once a minute (in-cluster)
    or when an exec token has expired, so a few seconds of caching change nothing; our own
    sources (kube/kubeconfig.py) read a token file each time they are asked.
    """

    def __init__(self, credentials: Credentials, *, max_age: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._credentials = credentials
        self._max_age = max_age
        self._clock = clock
        self._header: str | None = None
        self._read_at: float | None = None

    def header(self) -> str | None:
        """The ``Authorization`` value to send now (None: no token)."""
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._max_age:
            token = self._credentials.bearer_token()
            self._header = f"Bearer {token}" if token else None
            self._read_at = now
        return self._header

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        header = self.header()
        if header:
            request.headers["Authorization"] = header
        yield request

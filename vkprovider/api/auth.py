"""Authentication and authorization of kubelet API callers, as the kubelet does them.

Why it exists: the kubelet API hands out container logs and pod specs, so it must refuse anyone
the cluster would refuse. It follows the kubelet's rules:

* a client certificate verified against the client CA (the TLS layer checks the signature; this
  module reads the subject as the ``ssl`` module decoded it, ``SSLSocket.getpeercert()``):
  user = CN, groups = the O values;
* else a bearer token, checked with a TokenReview (cached: 2 min when valid, 10 s when not);
* else the caller is anonymous: **401**;
* every authenticated caller is then authorized with a SubjectAccessReview on
  ``nodes/<node>`` with subresource ``stats`` (``/stats/*``), ``metrics`` (``/metrics/*``),
  ``log`` (``/logs/*``) or ``proxy`` (everything else), verb from the HTTP method (cached: 5 min
  when allowed, 30 s when denied): **403** when denied.

When the API server cannot answer a review the request fails (401 for authentication, 500 for
authorization, like the kubelet) and nothing is cached. Tokens are kept only as SHA-256 digests
in the cache and are never logged.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from vkprovider.config import KubeletAPISettings
from vkprovider.kube.authn import (
    AccessDecision,
    ResourceAttributes,
    TokenReviewResult,
    UserInfo,
)
from vkprovider.kube.errors import APIError
from vkprovider.logs import kv
from vkprovider.metrics import Metrics

log = logging.getLogger(__name__)

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")

_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
          "DELETE": "delete"}


class Reviewer(Protocol):
    """Who answers TokenReviews and SubjectAccessReviews (``kube.authn.KubeReviewer``)."""

    async def review_token(self, *, token: str) -> TokenReviewResult: ...

    async def review_access(self, *, user: UserInfo,
                            attributes: ResourceAttributes) -> AccessDecision: ...


class TTLCache(Generic[_K, _V]):
    """A small cache whose entries each carry their own expiry; the oldest go first when full."""

    def __init__(self, *, max_entries: int = 4096, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._max = max_entries
        self._clock = clock
        self._items: dict[_K, tuple[float, _V]] = {}

    def get(self, key: _K) -> _V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        expires, value = hit
        if self._clock() >= expires:
            del self._items[key]
            return None
        return value

    def put(self, key: _K, value: _V, *, ttl: float) -> None:
        if ttl <= 0:
            return
        self._items.pop(key, None)
        while len(self._items) >= self._max:
            del self._items[next(iter(self._items))]
        self._items[key] = (self._clock() + ttl, value)

    def __len__(self) -> int:
        return len(self._items)


class AuthFailure(Exception):
    """The request cannot proceed; ``status`` and ``message`` are what the caller gets."""

    def __init__(self, *, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, kw_only=True)
class Caller:
    user: UserInfo
    method: str  # "cert" or "token"


def subresource_for(path: str) -> str:
    """The ``nodes`` subresource a kubelet path is authorized against."""
    for prefix, sub in (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log")):
        if path == prefix or path.startswith(prefix + "/"):
            return sub
    return "proxy"


def verb_for(method: str) -> str:
    return _VERBS.get(method.upper(), method.lower())


#: A certificate subject as ``ssl`` decodes it: relative distinguished names, each a tuple of
#: (attribute, value) pairs, e.g. ``((("commonName", "admin"),), (("organizationName", "x"),))``.
Subject = tuple[tuple[tuple[str, str], ...], ...]


def user_from_subject(subject: Subject) -> UserInfo | None:
    """User = CN, groups = every O of a (verified) client certificate's subject."""
    cns = [value for rdn in subject for key, value in rdn if key == "commonName"]
    if not cns:
        return None
    orgs = tuple(value for rdn in subject for key, value in rdn if key == "organizationName")
    return UserInfo(name=cns[0], groups=orgs)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    return value or None


class KubeletAuth:
    """Authenticate, then authorize, one request at a time; answers are cached per the TTLs."""

    def __init__(
        self,
        *,
        reviewer: Reviewer,
        node_name: str,
        settings: KubeletAPISettings,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reviewer = reviewer
        self.node_name = node_name
        self.settings = settings
        self.metrics = metrics
        self.tokens: TTLCache[bytes, TokenReviewResult] = TTLCache(clock=clock)
        self.decisions: TTLCache[tuple[Any, ...], AccessDecision] = TTLCache(clock=clock)

    async def authenticate(self, *, client_subject: Subject | None,
                           authorization: str | None) -> Caller:
        if client_subject:
            user = user_from_subject(client_subject)
            if user is not None:
                return Caller(user=user, method="cert")
        token = bearer_token(authorization)
        if token is None:
            self._outcome("none", "unauthenticated")
            raise AuthFailure(status=401, message="Unauthorized")
        digest = hashlib.sha256(token.encode()).digest()
        result = self.tokens.get(digest)
        if result is None:
            try:
                result = await self.reviewer.review_token(token=token)
            except APIError as exc:
                self.metrics.kubelet_api_reviews.labels("token", "error").inc()
                self._outcome("token", "error")
                log.warning("token review failed", extra=kv(error=str(exc)))
                raise AuthFailure(status=401, message="Unauthorized") from None
            self.metrics.kubelet_api_reviews.labels(
                "token", "authenticated" if result.authenticated else "rejected").inc()
            ttl = (self.settings.token_cache_ttl_seconds if result.authenticated
                   else self.settings.token_deny_cache_ttl_seconds)
            self.tokens.put(digest, result, ttl=ttl)
        if not result.authenticated or result.user is None:
            self._outcome("token", "unauthenticated")
            raise AuthFailure(status=401, message="Unauthorized")
        return Caller(user=result.user, method="token")

    async def authorize(self, *, caller: Caller, http_method: str, path: str) -> None:
        attributes = ResourceAttributes(verb=verb_for(http_method), resource="nodes",
                                        subresource=subresource_for(path), name=self.node_name)
        user = caller.user
        key = (user.name, user.uid, user.groups, tuple(sorted(user.extra.items())), attributes)
        decision = self.decisions.get(key)
        if decision is None:
            try:
                decision = await self.reviewer.review_access(user=user, attributes=attributes)
            except APIError as exc:
                self.metrics.kubelet_api_reviews.labels("access", "error").inc()
                self._outcome(caller.method, "error")
                log.warning("subject access review failed",
                            extra=kv(user=user.name, error=str(exc)))
                raise AuthFailure(
                    status=500,
                    message=f"Authorization error (user={user.name}, verb={attributes.verb}, "
                            f"resource=nodes, subresource={attributes.subresource}): "
                            f"the API server could not be asked") from None
            self.metrics.kubelet_api_reviews.labels(
                "access", "allowed" if decision.allowed else "denied").inc()
            ttl = (self.settings.authz_allow_cache_ttl_seconds if decision.allowed
                   else self.settings.authz_deny_cache_ttl_seconds)
            self.decisions.put(key, decision, ttl=ttl)
        if not decision.allowed:
            self._outcome(caller.method, "forbidden")
            log.info("kubelet API request forbidden",
                     extra=kv(user=user.name, verb=attributes.verb,
                              subresource=attributes.subresource, path=path))
            raise AuthFailure(
                status=403,
                message=f"Forbidden (user={user.name}, verb={attributes.verb}, resource=nodes, "
                        f"subresource={attributes.subresource})")
        self._outcome(caller.method, "allowed")

    def _outcome(self, method: str, outcome: str) -> None:
        self.metrics.kubelet_api_auth.labels(method, outcome).inc()

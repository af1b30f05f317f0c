"""TokenReview and SubjectAccessReview: ask the API server who a caller is and what they may do.

Why it exists: the kubelet API must authenticate and authorize its callers exactly as a kubelet
does (webhook token authentication and webhook authorization against the API server), and only
``vkprovider.kube`` may talk to the API server. This module makes the two calls and returns plain
value types; caching and the HTTP answers (401/403) live in :mod:`vkprovider.api.auth`.

Tokens are sent in the request body only; they never appear in a log line, an error message or
a ``repr`` of anything here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vkprovider.kube.client import KubeClient

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True, kw_only=True)
class UserInfo:
    """An authenticated caller, as Kubernetes describes users."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TokenReviewResult:
    authenticated: bool
    user: UserInfo | None = None
    error: str = ""  # why the API server said no (never contains the token)


@dataclass(frozen=True, kw_only=True)
class ResourceAttributes:
    """What a request wants to do, in SubjectAccessReview terms (e.g. get nodes/proxy)."""

    verb: str
    resource: str
    subresource: str = ""
    name: str = ""
    namespace: str = ""
    group: str = ""


@dataclass(frozen=True, kw_only=True)
class AccessDecision:
    allowed: bool
    reason: str = ""


def _user(status_user: Any) -> UserInfo | None:
    if not isinstance(status_user, dict) or not status_user.get("username"):
        return None
    extra_raw = status_user.get("extra") or {}
    extra = {str(k): tuple(str(v) for v in (vals or ())) for k, vals in extra_raw.items()}
    return UserInfo(name=str(status_user["username"]), uid=str(status_user.get("uid") or ""),
                    groups=tuple(str(g) for g in status_user.get("groups") or ()), extra=extra)


class KubeReviewer:
    """Sends TokenReviews and SubjectAccessReviews with the service's own credentials.

    The ServiceAccount needs ``create`` on ``tokenreviews`` and ``subjectaccessreviews``
    (manifests/base/rbac.yaml). Raises :class:`vkprovider.kube.errors.APIError` when the API
    server cannot answer.
    """

    def __init__(self, *, client: KubeClient) -> None:
        self._client = client

    async def review_token(self, *, token: str) -> TokenReviewResult:
        body = await self._client.request(
            "POST", TOKEN_REVIEWS, retry=False,
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token}})
        status = body.get("status") or {}
        user = _user(status.get("user"))
        if status.get("authenticated") and user is not None:
            return TokenReviewResult(authenticated=True, user=user)
        return TokenReviewResult(authenticated=False, error=str(status.get("error") or ""))

    async def review_access(self, *, user: UserInfo,
                            attributes: ResourceAttributes) -> AccessDecision:
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "resourceAttributes": {
                "verb": attributes.verb,
                "group": attributes.group,
                "resource": attributes.resource,
                "subresource": attributes.subresource,
                "name": attributes.name,
                "namespace": attributes.namespace,
            },
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        body = await self._client.request(
            "POST", ACCESS_REVIEWS, retry=False,
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": spec})
        status = body.get("status") or {}
        allowed = bool(status.get("allowed")) and not status.get("denied")
        reason = str(status.get("reason") or status.get("evaluationError") or "")
        return AccessDecision(allowed=allowed, reason=reason)

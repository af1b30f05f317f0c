"""The only code that talks to the Kubernetes API server.

Why it exists: one place owns credentials, HTTP, error mapping, patches and watch semantics, so the
rest of the service works with plain dicts and typed errors. import-linter keeps it that way.
"""

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import (
    APIError,
    ConflictError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    TooManyRequestsError,
    UnauthorizedError,
)

__all__ = [
    "APIError",
    "ConflictError",
    "ForbiddenError",
    "GoneError",
    "KubeClient",
    "NotFoundError",
    "TooManyRequestsError",
    "UnauthorizedError",
]

"""The service's own error classes.

Why it exists: callers decide by type (retry, fail the pod, wait) and never by parsing messages;
every error from a library is wrapped into one of these at the edge that caught it.
"""

from __future__ import annotations


class VKError(Exception):
    """Base of every error vkprovider raises on purpose."""


class ConfigError(VKError):
    """The service's own configuration is wrong; the message names the setting."""


class APIServerUnreachable(VKError):
    """The API server did not answer within the start-up timeout (exit status 1)."""


class PodRejected(VKError):
    """The pod asks for something no cloud can do; it is failed and never sent to a cloud.

    ``reason`` is a CamelCase word for the pod status and the Event; ``field`` is the pod field at
    fault (for example ``spec.containers[0].securityContext.privileged``).
    """

    def __init__(self, *, reason: str, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.reason = reason
        self.field = field
        self.message = message


class PodConfigPending(VKError):
    """A referenced Secret/ConfigMap (or key) is missing and not optional.

    Like the kubelet, the pod waits in ``CreateContainerConfigError`` and starts once it appears.
    """

    def __init__(self, *, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.reason = "CreateContainerConfigError"
        self.field = field
        self.message = message


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())

"""What every adapter does with a pod's registry credentials (``RegistryAuth``).

Why it exists: three adapters send a pod's pull credentials to their cloud, each in its own
format, but the rules around them are the same for all: a credential a cloud cannot take is
refused with one message shape that names ``imagePullSecrets`` (never the password), and every
password an adapter has sent is scrubbed from any text the cloud sends back before that text
becomes an error or instance message. One copy keeps those rules the same everywhere.
"""

from __future__ import annotations

import base64
import re

from providers.base import InstanceSpec, InvalidSpec, RegistryAuth

__all__ = ["MAX_REMEMBERED", "RegistrySecrets", "refuse"]

#: How many distinct registry passwords one adapter remembers for scrubbing (oldest forgotten).
MAX_REMEMBERED = 256
_MIN_SCRUBBED = 4  # shorter passwords would scrub ordinary words out of messages


def refuse(provider: str, cloud: str, spec: InstanceSpec, auth: RegistryAuth,
           why: str) -> InvalidSpec:
    """The InvalidSpec for a credential ``cloud`` cannot take; names the Secret, not its content."""
    source = f" (Secret {auth.secret!r})" if auth.secret else ""
    return InvalidSpec(
        f"{provider}: cannot run {spec.name!r} on {cloud}: imagePullSecrets: the credential for "
        f"registry {auth.registry!r}{source} {why}",
        provider=provider,
    )


class RegistrySecrets:
    """The registry passwords an adapter has sent, to scrub from what the cloud says back.

    :meth:`remember` is called before a credential leaves the adapter; :meth:`scrub` replaces each
    remembered password (and the ``user:password`` base64 a registry may echo) with ``***``.
    """

    def __init__(self) -> None:
        self._words: dict[str, None] = {}  # insertion-ordered set
        self._pattern: re.Pattern[str] | None = None

    def remember(self, auth: RegistryAuth | None) -> None:
        if auth is None:
            return
        pair = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
        for word in (auth.password, pair):
            if len(word) < _MIN_SCRUBBED or word in self._words:
                continue
            self._words[word] = None
            while len(self._words) > 2 * MAX_REMEMBERED:
                del self._words[next(iter(self._words))]
            self._pattern = None

    def scrub(self, text: str) -> str:
        if not self._words or not text:
            return text
        if self._pattern is None:
            longest_first = sorted(self._words, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(w) for w in longest_first))
        return self._pattern.sub("***", text)

"""Which registry a credential belongs to, and what every adapter does with one.

Why it exists: a registry credential must reach only the registry it is for. A pod names its
image, and the image names the registry the cloud will dial; a credential sent with an image of
another registry is handed to whoever runs that registry (``image: attacker.example/x`` would
collect the organisation's password). So the same matching rule guards every credential on its
way out: a pod's ``imagePullSecrets`` (:mod:`vkprovider.node.pullsecrets` picks one with it) and
each adapter's node-wide credential (RunPod ``registry_id``, Salad ``registry_authentication``,
Vast.ai ``image_login``, the mock's ``registry_auth``), which applies only to images whose
registry its ``registry_hosts`` names. It lives in ``providers`` (pure, standard library only)
because the adapters need it and may not import ``vkprovider``.

The rule is the kubelet's credential keyring (``pkg/credentialprovider``), re-implemented:

* An image is normalized first (:func:`normalize_image`): no registry means Docker Hub
  (``busybox`` is ``docker.io/library/busybox``); a first path component holding ``.`` or ``:``,
  or ``localhost``, or an upper-case letter, is the registry. Tag and digest take no part. An
  image that is not a valid reference matches nothing (it is pulled anonymously, if at all).
* A location (a ``registry_hosts`` entry, or a dockerconfigjson ``auths`` key) is
  ``host[:port][/path]``; an ``http(s)://`` scheme and a leading ``/v1/`` or ``/v2/`` are
  dropped (:func:`keyring_location`).
* A location matches an image when the ports are equal (``reg:5000`` never matches ``reg``),
  the hosts have as many dot-separated parts and each part matches as a glob (``*.example.com``
  matches ``eu.example.com``, not ``a.eu.example.com`` nor ``example.com``), and the location's
  path is a string prefix of the image's path (``quay.io/acme`` covers ``quay.io/acme/app`` and
  ``quay.io/acme-labs/app``; ``quay.io/acme/`` only the first).

Two deliberate departures from the kubelet, both within one registry: host names compare
without regard to case (DNS does), and Docker Hub's names ``docker.io``, ``index.docker.io`` and
``registry-1.docker.io`` are one registry (the kubelet treats ``registry-1.docker.io`` as an
ordinary host, which only ever withheld a Docker Hub credential from Docker Hub).

The rest of the module is what the three adapters share about credentials they send: a
credential a cloud cannot take is refused with one message shape that names
``imagePullSecrets`` (never the password), and every password an adapter has sent is scrubbed
from any text the cloud sends back before that text becomes an error or instance message.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.base import InstanceSpec, InvalidSpec, RegistryAuth
from providers.options import InvalidOption

__all__ = [
    "DOCKER_HUB",
    "DOCKER_HUB_NAMES",
    "MAX_REMEMBERED",
    "REGISTRY_HOSTS",
    "RegistryScope",
    "RegistrySecrets",
    "image_matches",
    "keyring_location",
    "location_matches",
    "node_scope",
    "normalize_image",
    "pod_credential",
    "refuse",
    "same_registry",
]

#: Docker Hub as a normalized image names it.
DOCKER_HUB = "docker.io"
#: Every name of Docker Hub's registry; one registry for matching.
DOCKER_HUB_NAMES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
#: The option naming where an adapter's node-wide credential applies.
REGISTRY_HOSTS = "registry_hosts"

# -- image references (the distribution reference grammar) -------------------------------------

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*)(?::{_TAG})?(?:@{_DIGEST})?",
    re.ASCII,
)


def normalize_image(image: str) -> tuple[str, str] | None:
    """``(registry, repository)`` of an image reference as the kubelet reads it; None if invalid.

    ``busybox:1.36`` -> ``("docker.io", "library/busybox")``, ``ghcr.io/acme/app@sha256:...`` ->
    ``("ghcr.io", "acme/app")``, ``localhost:5000/x`` -> ``("localhost:5000", "x")``. The host
    is lower-cased and ``index.docker.io`` is ``docker.io``, as Docker names it.
    """
    found = _REFERENCE.fullmatch(image)
    if found is None:
        return None
    name = found.group("name")
    first, slash, rest = name.partition("/")
    if slash and (any(c in first for c in ".:") or first == "localhost"
                  or first.lower() != first):
        registry, path = first.lower(), rest
    else:
        registry, path = DOCKER_HUB, name
    if registry == "index.docker.io":
        registry = DOCKER_HUB
    if registry in DOCKER_HUB_NAMES and "/" not in path:
        path = "library/" + path
    return registry, path


# -- locations ---------------------------------------------------------------------------------


def keyring_location(place: str) -> str | None:
    """The keyring key of a location: ``host[:port][/path]``; None when it has no host.

    A scheme and a leading ``/v1/`` or ``/v2/`` are dropped (``https://index.docker.io/v1/`` is
    ``index.docker.io``). Split by hand as Go's ``net/url`` does (a ``?`` or ``#`` ends the
    path; brackets may appear in a host, where they are globs), since Python's parser refuses
    such hosts.
    """
    value = place.strip()
    for scheme in ("https://", "http://"):
        if value.lower().startswith(scheme):
            value = value[len(scheme):]
            break
    value = re.split(r"[?#]", value, maxsplit=1)[0]
    authority, slash, path = value.partition("/")
    host = authority.rpartition("@")[2]  # a URL's user info is not part of the host
    if not host:
        return None
    if host.startswith("["):  # an IPv6 literal: "]" then nothing or ":port"
        after = host.partition("]")[2]
        if "]" not in host or not re.fullmatch(r"(:[0-9]*)?", after):
            return None
    path = slash + path
    if path.startswith(("/v1/", "/v2/")):
        path = path[3:]
    return host + path if path not in ("", "/") else host


def _split_host(host: str) -> tuple[list[str], str]:
    """The host's dot-separated parts (lower case, Docker Hub's names as one) and its port."""
    if host.startswith("["):
        inside, bracket, after = host[1:].partition("]")
        if bracket and after.startswith(":"):
            name, port = inside, after[1:]
        else:
            name, port = host, ""
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
    else:
        name, port = host, ""
    name = name.lower()
    if not port and name in DOCKER_HUB_NAMES:
        name = DOCKER_HUB
    return name.split("."), port


_GLOB_CACHE: dict[str, re.Pattern[str] | None] = {}


def _glob(pattern: str) -> re.Pattern[str] | None:
    """``pattern`` (Go ``path/filepath.Match`` syntax) as a regex; None when malformed."""
    if pattern in _GLOB_CACHE:
        return _GLOB_CACHE[pattern]
    out: list[str] = []
    i, n = 0, len(pattern)

    def escaped(at: int) -> tuple[str, int]:
        if pattern[at] != "\\":
            return pattern[at], at
        if at + 1 >= n:
            raise ValueError("trailing backslash")
        return pattern[at + 1], at + 1

    compiled: re.Pattern[str] | None = None
    try:
        while i < n:
            c = pattern[i]
            if c == "*":
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "\\":
                char, i = escaped(i)
                out.append(re.escape(char))
            elif c == "[":
                i += 1
                negate = i < n and pattern[i] == "^"
                if negate:
                    i += 1
                ranges: list[str] = []
                while True:
                    if i >= n:
                        raise ValueError("unclosed class")
                    if pattern[i] == "]" and ranges:
                        break
                    if pattern[i] in "-]":
                        raise ValueError("bad class")
                    lo, i = escaped(i)
                    i += 1
                    hi = lo
                    if i < n and pattern[i] == "-":
                        i += 1
                        if i >= n or pattern[i] in "-]":
                            raise ValueError("bad range")
                        hi, i = escaped(i)
                        i += 1
                        if hi < lo:
                            raise ValueError("bad range")
                    ranges.append(re.escape(lo) + ("-" + re.escape(hi) if hi != lo else ""))
                out.append(("[^/" if negate else "[") + "".join(ranges) + "]")
            else:
                out.append(re.escape(c))
            i += 1
        compiled = re.compile("".join(out), re.DOTALL)
    except (ValueError, re.error):
        compiled = None
    if len(_GLOB_CACHE) < 4096:
        _GLOB_CACHE[pattern] = compiled
    return compiled


def location_matches(location: str, *, registry: str, path: str) -> bool:
    """Whether a keyring location covers a normalized image (see the module docstring)."""
    glob_host, _, glob_path = location.partition("/")
    glob_parts, glob_port = _split_host(glob_host)
    parts, port = _split_host(registry)
    if glob_port != port or len(glob_parts) != len(parts):
        return False
    if glob_path and not ("/" + path).startswith("/" + glob_path):
        return False
    for pattern, part in zip(glob_parts, parts, strict=True):
        regex = _glob(pattern)
        if regex is None or regex.fullmatch(part) is None:
            return False
    return True


def image_matches(place: str, image: str) -> bool:
    """Whether a location (as written: scheme and ``/v1/`` allowed) covers ``image``; an invalid
    image or location matches nothing."""
    normal, location = normalize_image(image), keyring_location(place)
    return (normal is not None and location is not None
            and location_matches(location, registry=normal[0], path=normal[1]))


def same_registry(registry: str, image: str) -> bool:
    """Whether ``registry`` (``host[:port]``) is the registry ``image`` is pulled from."""
    normal = normalize_image(image)
    if normal is None or "/" in registry or any(c in registry for c in "*?[\\"):
        return False
    return _split_host(registry.strip()) == _split_host(normal[0])


# -- where a node-wide credential applies ------------------------------------------------------


@dataclass(frozen=True)
class RegistryScope:
    """The locations a node-wide credential is for (the option ``registry_hosts``)."""

    locations: tuple[str, ...]

    def covers(self, image: str) -> bool:
        """Whether the credential may be sent with ``image``."""
        normal = normalize_image(image)
        if normal is None:
            return False
        return any(location_matches(loc, registry=normal[0], path=normal[1])
                   for loc in self.locations)

    @classmethod
    def of(cls, places: Iterable[str], *, option: str = REGISTRY_HOSTS,
           secret: bool = False) -> RegistryScope:
        """The scope of these locations; :class:`InvalidOption` naming ``option`` if one is bad
        (quoting it unless ``secret``: a location taken from a credential option is not shown)."""
        locations: list[str] = []
        for place in places:
            shown = "a location" if secret else repr(place)
            location = keyring_location(place) if isinstance(place, str) else None
            if location is None:
                raise InvalidOption(option, f"{shown} names no registry host")
            glob_host = location.partition("/")[0]
            parts, _ = _split_host(glob_host)
            if any(_glob(part) is None or not part for part in parts):
                raise InvalidOption(option, f"{shown} is not a host, a host:port or a "
                                    "*.wildcard host")
            locations.append(location)
        if not locations:
            raise InvalidOption(option, "must list at least one registry host")
        return cls(tuple(locations))


def node_scope(raw: Mapping[str, Any], *, credential: str,
               default: Iterable[str] | None = None) -> RegistryScope | None:
    """The scope of an adapter's node-wide credential option ``credential``; None without one.

    The credential applies only to images whose registry ``registry_hosts`` names (a list of
    locations), or ``default`` (Vast.ai: the registry its ``image_login`` logs in to) when that
    option is not given. A credential with neither, or ``registry_hosts`` without a credential,
    is :class:`InvalidOption`: a credential with no registry would go to every registry.
    """
    given = raw.get(credential) is not None
    hosts = raw.get(REGISTRY_HOSTS)
    if hosts is None:
        if not given:
            return None
        if default is None:
            raise InvalidOption(REGISTRY_HOSTS, f"required with {credential}: the registries "
                                "(host[:port][/path], *.wildcards) the credential is for; it "
                                "is never sent with images of other registries")
        return RegistryScope.of(default, option=credential, secret=True)
    if not given:
        raise InvalidOption(REGISTRY_HOSTS, f"is set but {credential} is not (there is no "
                            "credential to scope)")
    if isinstance(hosts, str):
        hosts = [hosts]
    if not isinstance(hosts, list | tuple) or not all(isinstance(h, str) for h in hosts):
        raise InvalidOption(REGISTRY_HOSTS, "must be a list of registry hosts")
    return RegistryScope.of(hosts)


def pod_credential(spec: InstanceSpec) -> RegistryAuth | None:
    """``spec.registry_auth`` when it is for the registry of ``spec.image``, else None.

    The service picks a pod's credential for its image already; this keeps the rule where the
    credential leaves, so no path can send a credential to another registry.
    """
    auth = spec.registry_auth
    if auth is None or not same_registry(auth.registry, spec.image):
        return None
    return auth


# -- what adapters share about credentials they send -------------------------------------------

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

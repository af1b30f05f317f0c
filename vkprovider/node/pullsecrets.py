"""Pick the registry credential for a pod's image from its ``imagePullSecrets``, like the kubelet.

Why it exists: a private image pulls on a cloud only if the cloud gets the credential the kubelet
would have used. This module is the pure half of that (no I/O): it reads pull Secrets
(``kubernetes.io/dockerconfigjson`` and the legacy ``kubernetes.io/dockercfg``) and chooses the
credential for one image with the kubelet's keyring rules, so a pod that pulls on a real node
pulls the same way on a cloud, and one that would not, does not. The result is a
:class:`providers.base.RegistryAuth` for ``InstanceSpec.registry_auth``; each adapter maps it
onto its cloud (``docs/private-images.md``).

How the choice is made (the kubelet's ``pkg/credentialprovider`` keyring, re-implemented):

* The image is normalized first, as the kubelet does before its lookup: ``busybox`` is
  ``docker.io/library/busybox``, ``acme/app:1`` is ``docker.io/acme/app``, ``index.docker.io/x``
  is ``docker.io/x``; a first path component holding ``.`` or ``:`` (or ``localhost``, or an
  upper-case letter) is the registry. Tag and digest do not take part.
* Every entry of every Secret is indexed under its location with any ``http://``/``https://``
  scheme and a leading ``/v1/`` or ``/v2/`` removed: ``https://index.docker.io/v1/`` becomes
  ``index.docker.io``, ``quay.io/acme`` stays ``quay.io/acme``.
* An entry matches the image when the ports are equal (``registry:5000`` never matches
  ``registry``), the hosts have the same number of dot-separated parts, each part matches as a
  glob (``*.example.com`` matches ``eu.example.com`` but not ``a.eu.example.com`` nor
  ``example.com``), and the entry's path is a string prefix of the image's path.
* Matches come most specific first: the locations sorted in reverse (so ``quay.io/acme`` before
  ``quay.io``); credentials of one location in the order their Secrets were given. The pod's
  own ``imagePullSecrets`` come before its ServiceAccount's (:func:`pull_secret_names`).
* With no match, an image on Docker Hub uses the entry for ``index.docker.io`` (written
  ``https://index.docker.io/v1/`` by ``docker login``). An entry for ``docker.io`` matches Docker
  Hub images directly. As in the kubelet, ``registry-1.docker.io`` is an ordinary host: it
  matches only images that name it.

Where this differs from the kubelet, on purpose: the kubelet tries every matching credential in
turn; a cloud takes one, so the first one holding a username or a password is used (entries with
neither, an anonymous pull, are skipped). Like the kubelet, a Secret of another type, or of the
right type without its key, is ignored; a Secret whose content cannot be parsed is an error
(:class:`MalformedPullSecret`), because the kubelet fails the pull for it too. Errors name the
Secret and the key, never the content.

For the pod controller: read the pod's ``spec.imagePullSecrets`` and then its ServiceAccount's
``imagePullSecrets`` (:func:`pull_secret_names`), fetch each Secret (a missing one is skipped, as
the kubelet does, with a warning), wrap them as :class:`PullSecret` and call
:func:`registry_auth_for_image`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from providers.base import RegistryAuth
from vkprovider.errors import VKError

__all__ = [
    "DOCKERCFG_KEY",
    "DOCKERCONFIGJSON_KEY",
    "TYPE_DOCKERCFG",
    "TYPE_DOCKERCONFIGJSON",
    "Keyring",
    "MalformedPullSecret",
    "PullSecret",
    "PullSecretError",
    "RegistryCredential",
    "normalize_image",
    "parse_pull_secret",
    "pull_secret_names",
    "registry_auth_for_image",
]

TYPE_DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"
TYPE_DOCKERCFG = "kubernetes.io/dockercfg"
DOCKERCONFIGJSON_KEY = ".dockerconfigjson"
DOCKERCFG_KEY = ".dockercfg"

#: Docker Hub as image references name it once normalized, and as docker login names it.
DOCKER_HUB = "docker.io"
_LEGACY_DOCKER_HUB = "index.docker.io"  # the keyring's fallback location for Docker Hub images


class PullSecretError(VKError):
    """A pull Secret cannot be used. ``secret`` and ``key`` say which; never its content."""

    def __init__(self, message: str, *, secret: str, key: str | None = None) -> None:
        super().__init__(message)
        self.secret = secret
        self.key = key


class MalformedPullSecret(PullSecretError):
    """The Secret's ``.dockerconfigjson``/``.dockercfg`` is unparsable (the kubelet fails too)."""


@dataclass(frozen=True, kw_only=True)
class PullSecret:
    """One Secret named by ``imagePullSecrets``, its values already base64-decoded.

    ``type`` is the Secret's ``type``; None when the caller does not know it (then the data key,
    ``.dockerconfigjson`` or ``.dockercfg``, decides).
    """

    name: str
    data: Mapping[str, str | bytes] = field(repr=False)
    type: str | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PullSecret:
        """A Secret as the API server returns it (``data`` values base64-encoded)."""
        metadata = obj.get("metadata")
        name = str(metadata.get("name") or "") if isinstance(metadata, Mapping) else ""
        raw = obj.get("data") or {}
        if not isinstance(raw, Mapping):
            raise MalformedPullSecret(
                f"imagePullSecrets: Secret {name!r}: data is not a map", secret=name)
        data: dict[str, str | bytes] = {}
        for key, value in raw.items():
            try:
                data[str(key)] = base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                raise MalformedPullSecret(
                    f"imagePullSecrets: Secret {name!r} key {key!r} is not base64",
                    secret=name, key=str(key)) from None
        kind = obj.get("type")
        return cls(name=name, data=data, type=str(kind) if kind is not None else None)


@dataclass(frozen=True, kw_only=True)
class RegistryCredential:
    """One entry of a pull Secret: where it applies, and the credentials (password hidden)."""

    location: str  # host[:port][/path], scheme and /v1/ or /v2/ removed (the keyring's key)
    username: str
    password: str = field(repr=False)
    secret: str  # the Secret it came from


# -- reading Secrets ---------------------------------------------------------------------------


def pull_secret_names(
    pod: Mapping[str, Any], service_account: Mapping[str, Any] | None = None
) -> list[str]:
    """The Secret names to read, in the order they count: the pod's, then its ServiceAccount's.

    ``pod`` is the pod object (``spec.imagePullSecrets``), ``service_account`` the ServiceAccount
    object (``imagePullSecrets``) or None. Empty names are skipped; a name given twice counts
    where it first appears. (In a cluster the ServiceAccount admission plugin copies the
    ServiceAccount's list into a pod that has none, so most pods carry it already.)
    """
    spec = pod.get("spec")
    lists = [spec.get("imagePullSecrets") if isinstance(spec, Mapping) else None]
    if service_account is not None:
        lists.append(service_account.get("imagePullSecrets"))
    names: list[str] = []
    for refs in lists:
        for ref in refs if isinstance(refs, list) else ():
            name = ref.get("name") if isinstance(ref, Mapping) else None
            if isinstance(name, str) and name and name not in names:
                names.append(name)
    return names


def parse_pull_secret(secret: PullSecret) -> tuple[RegistryCredential, ...]:
    """Every credential ``secret`` holds, in the order the Secret lists them.

    A ``kubernetes.io/dockerconfigjson`` Secret is read from ``.dockerconfigjson``
    (``{"auths": {location: entry}}``), a ``kubernetes.io/dockercfg`` one from ``.dockercfg``
    (``{location: entry}``); an entry has ``auth`` (base64 of ``user:password``, which wins) or
    ``username``/``password``. A Secret of another type, or without its key, or with an empty
    one, holds none (the kubelet ignores it). Anything unparsable is
    :class:`MalformedPullSecret`.
    """
    kind = secret.type
    if kind is None:
        if secret.data.get(DOCKERCONFIGJSON_KEY):
            kind = TYPE_DOCKERCONFIGJSON
        elif secret.data.get(DOCKERCFG_KEY):
            kind = TYPE_DOCKERCFG
    if kind == TYPE_DOCKERCONFIGJSON:
        key = DOCKERCONFIGJSON_KEY
    elif kind == TYPE_DOCKERCFG:
        key = DOCKERCFG_KEY
    else:
        return ()
    raw = secret.data.get(key)
    if not raw:
        return ()

    def bad(why: str) -> MalformedPullSecret:
        return MalformedPullSecret(
            f"imagePullSecrets: Secret {secret.name!r} key {key!r} {why}",
            secret=secret.name, key=key)

    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        document = json.loads(text)
    except UnicodeDecodeError:
        raise bad("is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise bad(f"is not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    if key == DOCKERCONFIGJSON_KEY:
        if not isinstance(document, dict):
            raise bad("is not a JSON object")
        auths = document.get("auths")
        if auths is None:
            return ()
    else:
        auths = document
    if not isinstance(auths, dict):
        raise bad("holds no map of registries" if key == DOCKERCFG_KEY else "has an 'auths' "
                  "that is not a map of registries")
    found: list[RegistryCredential] = []
    for index, (place, entry) in enumerate(auths.items()):
        where = f"entry {index + 1}"
        if not isinstance(entry, dict):
            raise bad(f"{where} is not an object")
        values: dict[str, str] = {}
        for name in ("username", "password", "email", "auth"):
            value = entry.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise bad(f"{where}: {name} is not a string")
            values[name] = value
        username, password = values.get("username", ""), values.get("password", "")
        if values.get("auth"):
            decoded = _decode_auth(values["auth"])
            if decoded is None:
                raise bad(f"{where}: auth is not base64 of 'username:password'")
            username, password = decoded
        location = _location(str(place))
        if location is None:
            continue  # the kubelet ignores an entry whose location it cannot parse
        found.append(RegistryCredential(location=location, username=username, password=password,
                                        secret=secret.name))
    return tuple(found)


def _decode_auth(field_value: str) -> tuple[str, str] | None:
    """``auth`` -> (username, password): base64, padded or not, of ``username:password``."""
    text = field_value.replace("\r", "").replace("\n", "")
    if not text.strip().endswith("="):
        text += "=" * (-len(text) % 4)
    try:
        decoded = base64.b64decode(text, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    username, sep, password = decoded.partition(":")
    return (username, password) if sep else None


def _location(place: str) -> str | None:
    """The keyring key of a Secret entry: ``host[:port][/path]``; None when it has no host.

    Split by hand as Go's ``net/url`` does (a ``?`` or ``#`` ends the path; brackets may appear
    in a host, where they are globs), since Python's parser refuses such hosts.
    """
    value = place
    for scheme in ("https://", "http://"):
        if value.startswith(scheme):
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


# -- matching ----------------------------------------------------------------------------------


def normalize_image(image: str) -> tuple[str, str]:
    """``(registry, repository)`` of an image reference, as the kubelet normalizes it.

    ``busybox:1.36`` -> ``("docker.io", "library/busybox")``, ``ghcr.io/acme/app@sha256:...`` ->
    ``("ghcr.io", "acme/app")``, ``localhost:5000/x`` -> ``("localhost:5000", "x")``.
    """
    name = image.strip().partition("@")[0]
    first, slash, rest = name.partition("/")
    if not slash or (
        not any(c in first for c in ".:") and first != "localhost" and first.lower() == first
    ):
        registry, path = DOCKER_HUB, name
    else:
        registry, path = first, rest
    if registry == _LEGACY_DOCKER_HUB:
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in path:
        path = "library/" + path
    head, colon, tag = path.rpartition(":")
    if colon and "/" not in tag:
        path = head
    return registry, path


def _split_host(host: str) -> tuple[list[str], str]:
    """The host's dot-separated parts and its port ("" when none), as Go's SplitHostPort."""
    if host.startswith("["):
        inside, bracket, after = host[1:].partition("]")
        if bracket and after.startswith(":"):
            return inside.split("."), after[1:]
        return host.split("."), ""
    if host.count(":") == 1:
        name, _, port = host.partition(":")
        return name.split("."), port
    return host.split("."), ""


_GLOB_CACHE: dict[str, re.Pattern[str] | None] = {}


def _glob(pattern: str) -> re.Pattern[str] | None:
    """``pattern`` (Go ``path/filepath.Match`` syntax) as a regex; None when malformed."""
    if pattern in _GLOB_CACHE:
        return _GLOB_CACHE[pattern]
    out: list[str] = []
    i, n = 0, len(pattern)
    compiled: re.Pattern[str] | None = None
    try:
        while i < n:
            c = pattern[i]
            if c == "*":
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "\\":
                i += 1
                if i >= n:
                    raise ValueError("trailing backslash")
                out.append(re.escape(pattern[i]))
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
                    lo = pattern[i]
                    if lo == "\\":
                        i += 1
                        if i >= n:
                            raise ValueError("trailing backslash")
                        lo = pattern[i]
                    elif lo in "-]":
                        raise ValueError("bad class")
                    i += 1
                    hi = lo
                    if i < n and pattern[i] == "-":
                        i += 1
                        if i >= n:
                            raise ValueError("unclosed range")
                        hi = pattern[i]
                        if hi == "\\":
                            i += 1
                            if i >= n:
                                raise ValueError("trailing backslash")
                            hi = pattern[i]
                        elif hi in "-]":
                            raise ValueError("bad range")
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
    _GLOB_CACHE[pattern] = compiled
    return compiled


def _matches(location: str, image_name: str) -> bool:
    """Whether a keyring location (a glob in its host) covers a normalized image name."""
    glob_host, _, glob_path = location.partition("/")
    host, _, path = image_name.partition("/")
    glob_parts, glob_port = _split_host(glob_host)
    parts, port = _split_host(host)
    if glob_port != port or len(glob_parts) != len(parts):
        return False
    if not ("/" + path).startswith("/" + glob_path if glob_path else ""):
        return False
    for pattern, part in zip(glob_parts, parts, strict=True):
        regex = _glob(pattern)
        if regex is None or regex.fullmatch(part) is None:
            return False
    return True


class Keyring:
    """The credentials of some pull Secrets, indexed the way the kubelet's keyring is."""

    def __init__(self, credentials: Iterable[RegistryCredential]) -> None:
        self._by_location: dict[str, list[RegistryCredential]] = {}
        for credential in credentials:
            self._by_location.setdefault(credential.location, []).append(credential)
        self._index = sorted(self._by_location, reverse=True)  # most specific first

    @classmethod
    def of(cls, secrets: Iterable[PullSecret]) -> Keyring:
        """A keyring of every credential in ``secrets``, in the order given."""
        return cls(credential for secret in secrets for credential in parse_pull_secret(secret))

    def lookup(self, image: str) -> list[RegistryCredential]:
        """Every credential that applies to ``image``, most specific first."""
        registry, path = normalize_image(image)
        name = f"{registry}/{path}"
        found = [c for location in self._index if _matches(location, name)
                 for c in self._by_location[location]]
        if not found and registry == DOCKER_HUB:
            found = list(self._by_location.get(_LEGACY_DOCKER_HUB, ()))
        return found


def registry_auth_for_image(image: str, secrets: Sequence[PullSecret]) -> RegistryAuth | None:
    """The credential a cloud should pull ``image`` with, or None (pull anonymously).

    ``secrets`` are the pod's pull Secrets, then its ServiceAccount's, in that order (see
    :func:`pull_secret_names`); missing Secrets are left out by the caller. The first matching
    credential with a username or a password wins (see the module docstring). Raises
    :class:`MalformedPullSecret` when a Secret cannot be parsed.
    """
    if not image.strip():
        return None
    unique: dict[str, PullSecret] = {}
    for secret in secrets:
        unique.setdefault(secret.name, secret)  # a name given twice counts where it first is
    for credential in Keyring.of(unique.values()).lookup(image):
        if credential.username or credential.password:
            return RegistryAuth(
                registry=normalize_image(image)[0],
                username=credential.username,
                password=credential.password,
                secret=credential.secret,
            )
    return None

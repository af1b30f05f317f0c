"""Pick the registry credential for a pod's image from its ``imagePullSecrets``, like the kubelet.

Why it exists: a private image pulls on a cloud only if the cloud gets the credential the kubelet
would have used. This module is the pure half of that (no I/O): it reads pull Secrets
(``kubernetes.io/dockerconfigjson`` and the legacy ``kubernetes.io/dockercfg``) and chooses the
credential for one image with the kubelet's keyring rules, so a pod that pulls on a real node
pulls the same way on a cloud, and one that would not, does not. The result is a
:class:`providers.base.RegistryAuth` for ``InstanceSpec.registry_auth``; each adapter maps it
onto its cloud (``docs/private-images.md``).

How the choice is made (the kubelet's ``pkg/credentialprovider`` keyring, re-implemented; the
matching rule itself is :mod:`providers.registryauth`, shared with the adapters' node-wide
credentials, so a credential reaches only the registry it is for):

* The image is normalized first (:func:`providers.registryauth.normalize_image`): ``busybox`` is
  ``docker.io/library/busybox``, ``acme/app:1`` is ``docker.io/acme/app``. Tag and digest do not
  take part; an image that is not a valid reference gets no credential.
* Every entry of every Secret is indexed under its location (its ``auths`` key) with any
  ``http://``/``https://`` scheme and a leading ``/v1/`` or ``/v2/`` removed:
  ``https://index.docker.io/v1/`` becomes ``index.docker.io``, ``quay.io/acme`` stays
  ``quay.io/acme``.
* An entry matches the image when the ports are equal, the hosts match part by part as globs
  (``*.example.com`` matches ``eu.example.com`` only) without regard to case, and the entry's
  path is a string prefix of the image's path. Docker Hub's names (``docker.io``,
  ``index.docker.io``, ``registry-1.docker.io``) are one registry.
* Matches come most specific first: the locations sorted in reverse (so ``quay.io/acme`` before
  ``quay.io``); credentials of one location in the order their Secrets were given. The pod's
  own ``imagePullSecrets`` come before its ServiceAccount's (:func:`pull_secret_names`).
* An entry for exactly ``index.docker.io`` (written ``https://index.docker.io/v1/`` by ``docker
  login``) is used for a Docker Hub image only when nothing else matched, as in the kubelet.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from providers.base import RegistryAuth
from providers.registryauth import DOCKER_HUB, keyring_location, location_matches, normalize_image
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
        location = keyring_location(str(place))
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


# -- matching (providers.registryauth holds the rule) ------------------------------------------


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
        """Every credential that applies to ``image``, most specific first (none if invalid).

        As in the kubelet, an entry for exactly ``index.docker.io`` (what ``docker login``
        writes) is the fallback for Docker Hub images that nothing else matched.
        """
        normal = normalize_image(image)
        if normal is None:
            return []
        registry, path = normal
        found = [c for location in self._index if location.lower() != _LEGACY_DOCKER_HUB
                 and location_matches(location, registry=registry, path=path)
                 for c in self._by_location[location]]
        if not found and registry == DOCKER_HUB:
            found = [c for location in self._index if location.lower() == _LEGACY_DOCKER_HUB
                     for c in self._by_location[location]]
        return found


def registry_auth_for_image(image: str, secrets: Sequence[PullSecret]) -> RegistryAuth | None:
    """The credential a cloud should pull ``image`` with, or None (pull anonymously).

    ``secrets`` are the pod's pull Secrets, then its ServiceAccount's, in that order (see
    :func:`pull_secret_names`); missing Secrets are left out by the caller. The first matching
    credential with a username or a password wins (see the module docstring). Raises
    :class:`MalformedPullSecret` when a Secret cannot be parsed.
    """
    normal = normalize_image(image)
    if normal is None:
        return None
    unique: dict[str, PullSecret] = {}
    for secret in secrets:
        unique.setdefault(secret.name, secret)  # a name given twice counts where it first is
    for credential in Keyring.of(unique.values()).lookup(image):
        if credential.username or credential.password:
            return RegistryAuth(
                registry=normal[0],
                username=credential.username,
                password=credential.password,
                secret=credential.secret,
            )
    return None

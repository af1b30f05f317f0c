"""Kubernetes credentials for the common cases, read without the official client.

Why it exists: the provider needs its credentials once, at start: a server URL, a CA, a client
certificate or a token (re-read when it rotates). Importing the ``kubernetes`` package to read
them keeps its generated API client, requests, urllib3 and oauthlib in memory for the life of
the process: 7.4 MiB resident and 260 modules more (bench/steady.py counts every MiB at 5,000
pods).
This module reads what nearly every deployment uses:

* in-cluster: ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the service account's token and CA; the
  token file is read again whenever :class:`~vkprovider.kube.auth.BearerAuth` asks (every few
  seconds: the kubelet rotates projected tokens; the official loader re-reads once a minute);
* a kubeconfig (the path given, else a single ``KUBECONFIG`` path, else ``~/.kube/config``)
  whose context's cluster has a ``server``, a CA as a file or data or
  ``insecure-skip-tls-verify``, and whose user has a client certificate and key (files or
  data), a ``token`` or a ``tokenFile`` (read again as the in-cluster token is). Relative
  paths are relative to the kubeconfig's folder, as in client-go.

Anything else (exec plugins, auth providers, basic auth, a proxy, a TLS server name, several
``KUBECONFIG`` files to merge, a key this module does not know, a malformed file) is left to the
official loader: :func:`load` answers None, and the caller falls back to it with the behaviour
and error messages it always had.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from vkprovider.kube.auth import Credentials

__all__ = ["SA_DIR", "load"]

#: Where a pod's service account token and CA are mounted.
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

_CLUSTER_KEYS = frozenset({"server", "certificate-authority", "certificate-authority-data",
                           "insecure-skip-tls-verify", "extensions"})
_USER_KEYS = frozenset({"client-certificate", "client-certificate-data", "client-key",
                        "client-key-data", "token", "tokenFile", "extensions"})


class _FileToken:
    """A token read from its file each time it is asked for (BearerAuth asks every few
    seconds), so a rotated token is used at once; a failed read keeps the last one."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._value: str | None = None
        self._read = False

    def __call__(self) -> str | None:
        try:
            self._value = self._path.read_text().strip() or None
            self._read = True
        except OSError:
            if not self._read:
                raise
            # a rotation mid-write or a brief glitch: keep the last token, try next time
        return self._value


def load(*, kubeconfig: str | None, context: str | None,
         environ: Mapping[str, str] | None = None, sa_dir: Path = SA_DIR) -> Credentials | None:
    """Credentials as :func:`vkprovider.kube.auth.load_credentials` would find them, or None
    when the case is one for the official loader. Raises OSError or ssl.SSLError for files
    that are named but cannot be read or used."""
    env = os.environ if environ is None else environ
    if kubeconfig is None:
        in_cluster = _in_cluster(env=env, sa_dir=sa_dir)
        if in_cluster is not None:
            return in_cluster
        named = env.get("KUBECONFIG", "")
        if os.pathsep in named.strip(os.pathsep):
            return None  # several files to merge: the official loader's job
        kubeconfig = named.strip(os.pathsep) or str(Path.home() / ".kube" / "config")
    path = Path(kubeconfig).expanduser()
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None  # the official loader says what is wrong, as it always did
    return _from_kubeconfig(doc, path=path, context=context)


def _in_cluster(*, env: Mapping[str, str], sa_dir: Path) -> Credentials | None:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token_file, ca_file = sa_dir / "token", sa_dir / "ca.crt"
    if not host or not port or not token_file.is_file() or not ca_file.is_file():
        return None
    shown = f"[{host}]" if ":" in host else host
    ctx = ssl.create_default_context(cafile=str(ca_file))
    token = _FileToken(token_file)
    token()  # unreadable now: fail at start, not on the first request
    return Credentials(host=f"https://{shown}:{port}", ssl_context=ctx, token=token)


class _NotOurs(Exception):
    """A kubeconfig value this module will not guess about: the official loader's case."""


def _named(items: Any, name: Any, field: str) -> dict[str, Any] | None:
    if not isinstance(items, list):
        return None
    for item in items:
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get(field)
            return body if isinstance(body, dict) else None
    return None


def _from_kubeconfig(doc: Any, *, path: Path, context: str | None) -> Credentials | None:
    if not isinstance(doc, dict):
        return None
    ctx_name = context or doc.get("current-context")
    ctx = _named(doc.get("contexts"), ctx_name, "context") if ctx_name else None
    if ctx is None:
        return None
    cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster")
    user = _named(doc.get("users"), ctx.get("user"), "user") if ctx.get("user") else {}
    if cluster is None or user is None:
        return None
    if set(cluster) - _CLUSTER_KEYS or set(user) - _USER_KEYS:
        return None  # exec, auth-provider, proxy-url, tls-server-name, ...: not ours
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        return None
    base = path.parent

    def file_of(key: str, holder: Mapping[str, Any]) -> Path | None:
        value = holder.get(key)
        if not isinstance(value, str) or not value:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() else base / p

    def data_of(key: str, holder: Mapping[str, Any]) -> bytes | None:
        value = holder.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise _NotOurs(key)
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            # never fall back to another trust or identity: the official loader reports it
            raise _NotOurs(key) from exc

    try:
        ca_data = data_of("certificate-authority-data", cluster)
        cert_data = data_of("client-certificate-data", user)
        key_data = data_of("client-key-data", user)
    except _NotOurs:
        return None
    ca_file = file_of("certificate-authority", cluster)
    if ca_data is not None:
        tls = ssl.create_default_context(cadata=ca_data.decode("ascii", "replace"))
    elif ca_file is not None:
        tls = ssl.create_default_context(cafile=str(ca_file))
    else:
        tls = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify") is True:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE

    cert_file, key_file = file_of("client-certificate", user), file_of("client-key", user)
    if (cert_data or cert_file) and (key_data or key_file):
        _load_chain(tls, cert=cert_data or cert_file, key=key_data or key_file)
    elif cert_data or cert_file or key_data or key_file:
        return None  # half a pair: the official loader decides what that means

    token = user.get("token")
    token_file = file_of("tokenFile", user)
    source: Callable[[], str | None]
    if isinstance(token, str) and token:
        fixed = token
        source = lambda: fixed  # noqa: E731 - one line, no state
    elif token_file is not None:
        source = _FileToken(token_file)
        source()  # unreadable now: fail at start
    else:
        source = lambda: None  # noqa: E731
    return Credentials(host=server.rstrip("/"), ssl_context=tls, token=source)


def _load_chain(tls: ssl.SSLContext, *, cert: bytes | Path | None,
                key: bytes | Path | None) -> None:
    """``load_cert_chain`` takes file names only: key material given inline goes through a
    private temporary folder that is gone when this returns."""
    if isinstance(cert, Path) and isinstance(key, Path):
        tls.load_cert_chain(str(cert), str(key))
        return
    with tempfile.TemporaryDirectory(prefix="vkp-creds-") as tmp:
        names = []
        for stem, value in (("cert.pem", cert), ("key.pem", key)):
            if isinstance(value, Path):
                names.append(str(value))
                continue
            target = Path(tmp) / stem
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(value or b"")
            names.append(str(target))
        tls.load_cert_chain(names[0], names[1])

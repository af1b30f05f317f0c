"""The kubelet API's TLS: its serving certificate and the client-certificate check.

Why it exists: the API server reaches the kubelet API over HTTPS and proves itself with a client
certificate (``--kubelet-client-certificate``). The serving certificate comes from
``tls_cert_file``/``tls_key_file`` when configured (e.g. a cert-manager Certificate's Secret,
mounted), and is re-read when those files change, without a restart (:class:`ReloadingCertificate`).
Otherwise a self-signed one is generated at start (the API server does not verify kubelet serving
certificates unless it is given ``--kubelet-certificate-authority``) and written only to
``kubelet_api.cert_dir`` or a private directory under ``$TMPDIR`` (:func:`self_signed_files`),
never to the working directory or the package, so a read-only root filesystem works. Client
certificates are requested (not required: bearer tokens are the other way in) and, when
presented, verified against ``client_ca_file`` during the handshake, so a certificate the
application sees is one the CA signed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import logging
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vkprovider.errors import ConfigError
from vkprovider.logs import kv

log = logging.getLogger(__name__)


def self_signed_certificate(*, common_name: str, hosts: tuple[str, ...],
                            days: int = 365) -> tuple[bytes, bytes]:
    """A self-signed serving certificate and its key, both PEM.

    ``cryptography`` is imported here, not at the top: the provider makes its certificate in a
    child process (:func:`_generate`), so its own process never loads it (9 MiB of RSS, a second
    OpenSSL, for one call at start)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    sans: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


#: Names of the files a self-signed certificate is written to (in its directory).
SELF_SIGNED_CERT = "tls.crt"
SELF_SIGNED_KEY = "tls.key"


@dataclass(frozen=True, kw_only=True)
class ServingFiles:
    """Where a serving certificate and key are; ``created_dir`` is ours to remove at exit."""

    cert_file: str
    key_file: str
    created_dir: str | None = None

    def remove(self) -> None:
        """Remove the directory this process created for a self-signed pair (if any)."""
        if self.created_dir:
            shutil.rmtree(self.created_dir, ignore_errors=True)


def _generate(*, common_name: str, hosts: tuple[str, ...]) -> tuple[bytes, bytes]:
    """:func:`self_signed_certificate` run by a child Python (``python -m vkprovider.api.tls``),
    so that ``cryptography`` is never mapped into the long-running provider; in this process
    when a child cannot run (the result is the same, the process only keeps 9 MiB more)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run([sys.executable, "-m", __name__, common_name, *hosts],
                              capture_output=True, env=env, timeout=60, check=True)
        cert, sep, key = done.stdout.partition(b"\n\n")
        if sep and cert.startswith(b"-----BEGIN CERTIFICATE") and key.startswith(b"-----BEGIN"):
            return cert + b"\n", key
        why = "unexpected output"
    except (OSError, subprocess.SubprocessError) as exc:
        why = type(exc).__name__  # never the output: it may hold the key
    log.info("serving certificate made in this process", extra=kv(child=why))
    return self_signed_certificate(common_name=common_name, hosts=hosts)


def _where(cert_dir: str | None) -> tuple[str, str]:
    """The directory to write into and how an error names it (never the CWD or the package)."""
    if cert_dir:
        return cert_dir, f"kubelet_api.cert_dir={cert_dir}"
    tmp = os.environ.get("TMPDIR")
    if tmp:
        return tmp, f"TMPDIR={tmp}"
    return "/tmp", "TMPDIR (unset, so /tmp)"


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by this user only; replace an earlier file atomically."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def self_signed_files(*, cert_dir: str | None, common_name: str,
                      hosts: tuple[str, ...]) -> ServingFiles:
    """Generate a self-signed serving certificate and write it, 0600, where it may be written.

    ``cert_dir`` (``kubelet_api.cert_dir``) receives ``tls.crt``/``tls.key``; without it a new
    private directory under ``$TMPDIR`` (else ``/tmp``) does, and :meth:`ServingFiles.remove`
    removes it. Nothing is ever written to the working directory or the package, so a read-only
    root filesystem works with ``TMPDIR`` on a writable mount (an emptyDir). A directory that
    cannot be written is one :class:`ConfigError` line naming it.
    """
    base, label = _where(cert_dir)
    cert_pem, key_pem = _generate(common_name=common_name, hosts=hosts)
    created: str | None = None
    try:
        if cert_dir:
            folder = Path(cert_dir)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        else:
            created = tempfile.mkdtemp(prefix="vkp-tls-", dir=base)  # mode 0700
            folder = Path(created)
        _write_private(folder / SELF_SIGNED_CERT, cert_pem)
        _write_private(folder / SELF_SIGNED_KEY, key_pem)
    except OSError as exc:
        if created:
            shutil.rmtree(created, ignore_errors=True)
        raise ConfigError(
            f"{label}: cannot write the kubelet API's self-signed serving certificate there "
            f"({exc.strerror or exc}); point TMPDIR (or kubelet_api.cert_dir) at a writable "
            f"directory such as an emptyDir, or set tls_cert_file/tls_key_file"
        ) from exc
    return ServingFiles(cert_file=str(folder / SELF_SIGNED_CERT),
                        key_file=str(folder / SELF_SIGNED_KEY), created_dir=created)


def _base_context(client_ca_file: str | None) -> ssl.SSLContext:
    """TLS 1.2+, and client certificates checked against ``client_ca_file`` when given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca_file:
        try:
            ctx.load_verify_locations(cafile=client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"kubelet_api.client_ca_file: cannot load {client_ca_file}: {exc}"
                              ) from exc
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


Signature = tuple[tuple[str, int, int, int, int], ...]


def _signature(*paths: str) -> Signature | None:
    """What identifies the files' current content: the resolved path (a Secret volume swaps the
    ``..data`` symlink) and device, inode, mtime and size of what it points to."""
    try:
        out = []
        for path in paths:
            st = os.stat(path)
            out.append((os.path.realpath(path), st.st_dev, st.st_ino, st.st_mtime_ns,
                        st.st_size))
        return tuple(out)
    except OSError:
        return None


class ReloadingCertificate:
    """A serving certificate read from files and re-read when they change, without a restart.

    uvicorn (asyncio) holds one :class:`ssl.SSLContext` for the listening socket. Its SNI
    callback runs during every TLS handshake (also when the client sends no server name, as
    for an IP address); there the files' :func:`_signature` is compared with the one loaded,
    and after a change a fresh context with the new chain is built and set on that
    connection (``SSLObject.context``), which is how OpenSSL serves another certificate. Open
    connections keep theirs. A pair that does not load (a key that does not match while files
    are being replaced one by one) is logged once and the previous certificate kept; the
    next handshake after the files change again tries again. cert-manager/Kubernetes Secret
    volumes replace both files at once by swapping a symlink, which the resolved path in the
    signature notices.
    """

    def __init__(self, *, cert_file: str, key_file: str, client_ca_file: str | None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._client_ca_file = client_ca_file
        self.context = _base_context(client_ca_file)  # the one uvicorn serves with
        signature = _signature(cert_file, key_file)
        try:
            self.context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_cert_file/tls_key_file: cannot load {cert_file}: {exc}"
                              ) from exc
        self._current = self.context
        self._loaded = signature
        self._refused: Signature | None = None
        self.reloads = 0
        self.context.sni_callback = self._on_client_hello

    def current(self) -> ssl.SSLContext:
        """The context of the files as they are now (reloaded if they changed)."""
        signature = _signature(self.cert_file, self.key_file)
        if signature is None or signature in (self._loaded, self._refused):
            return self._current  # unreadable right now (mid-swap?): keep serving
        try:
            fresh = _base_context(self._client_ca_file)
            fresh.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError, ConfigError) as exc:
            self._refused = signature
            log.warning("serving certificate changed but does not load; keeping the previous one",
                        extra=kv(cert_file=self.cert_file, key_file=self.key_file,
                                 error=str(exc)))
            return self._current
        self._current, self._loaded, self._refused = fresh, signature, None
        self.reloads += 1
        log.info("serving certificate reloaded", extra=kv(cert_file=self.cert_file,
                                                          reloads=self.reloads))
        return fresh

    def _on_client_hello(self, conn: ssl.SSLSocket | ssl.SSLObject, server_name: str | None,
                         ctx: ssl.SSLContext) -> None:
        try:
            chosen = self.current()
            if chosen is not conn.context:
                conn.context = chosen
        except Exception:  # never fail a handshake over a reload; the old cert still serves
            log.exception("serving certificate check failed")


def server_context(
    *,
    cert_file: str | None,
    key_file: str | None,
    client_ca_file: str | None,
    common_name: str,
    hosts: tuple[str, ...],
    cert_dir: str | None = None,
) -> ssl.SSLContext:
    """The TLS context of the kubelet API (TLS 1.2 or newer).

    With ``cert_file``/``key_file``, they are served and re-read when they change (see
    :class:`ReloadingCertificate`). Without them, a self-signed certificate is generated, loaded
    from a private directory under ``cert_dir`` or ``$TMPDIR`` and the files removed at once
    (``vkprovider run`` writes it with :func:`self_signed_files` at start instead, so that
    ``kubelet_api.cert_dir`` applies).
    """
    if bool(cert_file) != bool(key_file):
        raise ConfigError("tls_cert_file and tls_key_file must be given together")
    if cert_file and key_file:
        return ReloadingCertificate(cert_file=cert_file, key_file=key_file,
                                    client_ca_file=client_ca_file).context
    ctx = _base_context(client_ca_file)
    files = self_signed_files(cert_dir=cert_dir, common_name=common_name, hosts=hosts)
    try:
        ctx.load_cert_chain(files.cert_file, files.key_file)
    finally:
        if files.created_dir:
            files.remove()
        else:
            for path in (files.cert_file, files.key_file):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return ctx


if __name__ == "__main__":  # the child of _generate: certificate, blank line, key on stdout
    _cert, _key = self_signed_certificate(common_name=sys.argv[1], hosts=tuple(sys.argv[2:]))
    sys.stdout.buffer.write(_cert.rstrip(b"\n") + b"\n\n" + _key)

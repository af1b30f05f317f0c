"""The kubelet API's TLS: its serving certificate and the client-certificate check.

Why it exists: the API server reaches the kubelet API over HTTPS and proves itself with a client
certificate (``--kubelet-client-certificate``). The serving certificate comes from
``tls_cert_file``/``tls_key_file`` when configured; otherwise a self-signed one is generated at
start (the API server does not verify kubelet serving certificates unless it is given
``--kubelet-certificate-authority``). Client certificates are requested (not required: bearer
tokens are the other way in) and, when presented, verified against ``client_ca_file`` during the
handshake, so a certificate the application sees is one the CA signed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vkprovider.errors import ConfigError


def self_signed_certificate(*, common_name: str, hosts: tuple[str, ...],
                            days: int = 365) -> tuple[bytes, bytes]:
    """A self-signed serving certificate and its key, both PEM."""
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


def _load_pem_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """``SSLContext`` reads only files: write both to a private temp dir (0600), load, remove."""
    with tempfile.TemporaryDirectory(prefix="vkp-tls-") as folder:
        paths = []
        for stem, data in (("tls.crt", cert_pem), ("tls.key", key_pem)):
            path = Path(folder) / stem
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            paths.append(path)
        ctx.load_cert_chain(paths[0], paths[1])


def server_context(
    *,
    cert_file: str | None,
    key_file: str | None,
    client_ca_file: str | None,
    common_name: str,
    hosts: tuple[str, ...],
) -> ssl.SSLContext:
    """The TLS context of the kubelet API (TLS 1.2 or newer)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if bool(cert_file) != bool(key_file):
        raise ConfigError("tls_cert_file and tls_key_file must be given together")
    if cert_file and key_file:
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_cert_file/tls_key_file: cannot load {cert_file}: {exc}"
                              ) from exc
    else:
        cert_pem, key_pem = self_signed_certificate(common_name=common_name, hosts=hosts)
        _load_pem_pair(ctx, cert_pem, key_pem)
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

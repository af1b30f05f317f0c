"""Certificates and keys for a local control plane, generated in-process.

Why it exists: the API server needs a CA, a serving certificate, client certificates (admin,
apiserver-to-kubelet) and a service-account signing key; generating them with ``cryptography``
needs no openssl invocations and works the same on every machine.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True, kw_only=True)
class CertPair:
    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL
            if isinstance(key, rsa.RSAPrivateKey)
            else serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class CertificateAuthority:
    """A CA that signs serving and client certificates for the local cluster."""

    def __init__(self, *, directory: Path, name: str = "vkprovider-local-ca") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = directory / "ca.crt"
        self.key_path = directory / "ca.key"
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.key_path, self._key)

    @classmethod
    def load(cls, *, directory: Path) -> CertificateAuthority:
        """The CA another process made in ``directory`` (``ca.crt``/``ca.key``), to sign more
        certificates with it: an xdist worker that adopts the run's shared cluster."""
        ca = cls.__new__(cls)
        ca.directory = directory
        ca.cert_path = directory / "ca.crt"
        ca.key_path = directory / "ca.key"
        key = serialization.load_pem_private_key(ca.key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{ca.key_path} is not the EC key this module writes")
        ca._key = key
        ca._cert = x509.load_pem_x509_certificate(ca.cert_path.read_bytes())
        return ca

    def issue(
        self,
        *,
        stem: str,
        common_name: str,
        organization: str | None = None,
        server: bool = False,
        client: bool = False,
        hosts: tuple[str, ...] = (),
    ) -> CertPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = CertPair(cert=self.directory / f"{stem}.crt", key=self.directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


def service_account_keys(*, directory: Path) -> CertPair:
    """An RSA key pair for signing service-account tokens (``sa.key``/``sa.pub``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = directory / "sa.pub"
    priv = directory / "sa.key"
    _write_key(priv, key)
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return CertPair(cert=pub, key=priv)

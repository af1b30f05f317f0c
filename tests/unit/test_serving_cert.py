"""The kubelet API's serving certificate: from files, reloaded when they change, written safely.

No control plane: the service's own TLS context is served by uvicorn (vkprovider.api.server) on
loopback, and a plain ``ssl`` client reads which certificate it gets. The files are laid out as a
mounted Kubernetes Secret is (``tls.crt -> ..data/tls.crt``, ``..data -> ..<timestamp>``), and
replaced the way the kubelet does it for cert-manager: a new timestamped directory, then an atomic
rename of the ``..data`` symlink.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vkprovider.api.server import bind, serve
from vkprovider.api.tls import self_signed_files, server_context
from vkprovider.errors import ConfigError
from vkprovider.testing.pki import CertificateAuthority


def make_pair(common_name: str) -> tuple[bytes, bytes]:
    """A self-signed serving certificate for 127.0.0.1 and its key (PEM), via cryptography."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class SecretVolume:
    """A directory laid out like a mounted Secret, updated atomically like the kubelet does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)

    @property
    def cert_file(self) -> str:
        return str(self.root / "tls.crt")

    @property
    def key_file(self) -> str:
        return str(self.root / "tls.key")

    def publish(self, cert_pem: bytes, key_pem: bytes) -> None:
        self.generation += 1
        version = self.root / f"..2025_01_01_00_00_0{self.generation}.{os.getpid()}"
        version.mkdir()
        (version / "tls.crt").write_bytes(cert_pem)
        (version / "tls.key").write_bytes(key_pem)
        data = self.root / "..data"
        old = data.resolve() if data.is_symlink() else None
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(version.name)
        os.replace(tmp_link, data)  # the atomic swap
        for stem in ("tls.crt", "tls.key"):
            link = self.root / stem
            if not link.is_symlink():
                link.symlink_to(f"..data/{stem}")
        if old is not None:
            for child in old.iterdir():
                child.unlink()
            old.rmdir()


async def _wait_listening(port: int) -> None:
    for _ in range(100):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise AssertionError("server did not listen")


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with the number of verified client certificates the TLS layer saw."""
    chain = ((scope.get("extensions") or {}).get("tls") or {}).get("client_cert_chain") or []
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(len(chain)).encode()})


@contextlib.asynccontextmanager
async def serving(ctx: ssl.SSLContext) -> AsyncIterator[int]:
    sock = bind(host="127.0.0.1", port=0)
    port = int(sock.getsockname()[1])
    task = asyncio.create_task(serve(app=_app, sock=sock, name="test", ssl_context=ctx))
    await _wait_listening(port)
    try:
        yield port
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def served_common_name(port: int) -> str:
    """Connect with ssl to 127.0.0.1 (no SNI: it is an IP) and read the certificate's CN."""
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    cert = x509.load_der_x509_certificate(der)
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


async def test_a_symlink_swapped_secret_is_served_without_a_restart(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "secret")
    volume.publish(*make_pair("cert-one"))
    ctx = server_context(cert_file=volume.cert_file, key_file=volume.key_file,
                         client_ca_file=None, common_name="ignored", hosts=())
    async with serving(ctx) as port:
        assert await served_common_name(port) == "cert-one"
        assert await served_common_name(port) == "cert-one"
        volume.publish(*make_pair("cert-two"))
        assert await served_common_name(port) == "cert-two"
        assert await served_common_name(port) == "cert-two"


async def test_a_half_replaced_pair_keeps_the_old_certificate_until_it_matches(
        tmp_path: Path) -> None:
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    one_cert, one_key = make_pair("cert-one")
    cert_file.write_bytes(one_cert)
    key_file.write_bytes(one_key)
    ctx = server_context(cert_file=str(cert_file), key_file=str(key_file),
                         client_ca_file=None, common_name="ignored", hosts=())
    async with serving(ctx) as port:
        assert await served_common_name(port) == "cert-one"
        two_cert, two_key = make_pair("cert-two")
        cert_file.write_bytes(two_cert)  # in place, one file at a time: the key is still old
        assert await served_common_name(port) == "cert-one", "a mismatched pair is not served"
        key_file.write_bytes(two_key)
        assert await served_common_name(port) == "cert-two"
        key_file.unlink()  # gone for a moment: keep serving what we have
        assert await served_common_name(port) == "cert-two"


async def test_client_certificates_are_still_verified_after_a_reload(tmp_path: Path) -> None:
    ca = CertificateAuthority(directory=tmp_path)
    client_pair = ca.issue(stem="client", common_name="kube-apiserver-kubelet-client",
                           organization="system:masters", client=True)
    volume = SecretVolume(tmp_path / "secret")
    volume.publish(*make_pair("cert-one"))
    ctx = server_context(cert_file=volume.cert_file, key_file=volume.key_file,
                         client_ca_file=str(ca.cert_path), common_name="ignored", hosts=())
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    client.load_cert_chain(client_pair.cert, client_pair.key)
    async with serving(ctx) as port:
        volume.publish(*make_pair("cert-two"))
        assert await served_common_name(port) == "cert-two"
        async with httpx.AsyncClient(verify=client, timeout=10) as http:
            resp = await http.get(f"https://127.0.0.1:{port}/")
        assert resp.text == "1", "the client certificate was verified against the CA"
        (tmp_path / "other").mkdir()
        other = CertificateAuthority(directory=tmp_path / "other", name="someone-else")
        forged = other.issue(stem="forged", common_name="x", client=True)
        bad = ssl.create_default_context()
        bad.check_hostname = False
        bad.verify_mode = ssl.CERT_NONE
        bad.load_cert_chain(forged.cert, forged.key)
        async with httpx.AsyncClient(verify=bad, timeout=10) as http:
            with pytest.raises(httpx.TransportError):
                await http.get(f"https://127.0.0.1:{port}/")


# -- where the self-signed default is written ------------------------------------------------


@pytest.fixture
def unwritable_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TMPDIR nobody can create anything in (a regular file: even root gets ENOTDIR)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("TMPDIR", str(blocker))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return blocker


def test_unwritable_tmpdir_is_one_line_naming_tmpdir(unwritable_tmpdir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        server_context(cert_file=None, key_file=None, client_ca_file=None,
                       common_name="vk", hosts=("127.0.0.1",))
    text = str(info.value)
    assert "\n" not in text
    assert f"TMPDIR={unwritable_tmpdir}" in text
    assert list(Path.cwd().iterdir()) == [], "nothing falls back to the working directory"


def test_unwritable_tmpdir_with_a_writable_cert_dir_works(unwritable_tmpdir: Path,
                                                          tmp_path: Path) -> None:
    cert_dir = tmp_path / "certs"
    files = self_signed_files(cert_dir=str(cert_dir), common_name="vk",
                              hosts=("vk", "127.0.0.1"))
    assert Path(files.cert_file).parent == cert_dir
    assert (Path(files.key_file).stat().st_mode & 0o777) == 0o600
    ctx = server_context(cert_file=files.cert_file, key_file=files.key_file,
                         client_ca_file=None, common_name="vk", hosts=())
    assert ctx.verify_mode == ssl.CERT_NONE
    ctx = server_context(cert_file=None, key_file=None, client_ca_file=None, common_name="vk",
                         hosts=(), cert_dir=str(cert_dir))
    assert isinstance(ctx, ssl.SSLContext)
    assert list(Path.cwd().iterdir()) == [], "nothing falls back to the working directory"


def test_self_signed_default_goes_to_a_private_dir_under_tmpdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    files = self_signed_files(cert_dir=None, common_name="vk", hosts=("127.0.0.1",))
    assert files.created_dir is not None
    created = Path(files.created_dir)
    assert created.parent == tmp
    assert (created.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in created.iterdir()) == ["tls.crt", "tls.key"]
    files.remove()
    assert list(tmp.iterdir()) == []


def _names_in(cert_file: str) -> tuple[str, list[str]]:
    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return str(cn), [str(n.value) for n in sans]


def test_the_self_signed_pair_is_made_by_a_child_and_matches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_here(**_: Any) -> tuple[bytes, bytes]:
        raise AssertionError("made in the provider's process")

    monkeypatch.setattr("vkprovider.api.tls.self_signed_certificate", not_here)
    files = self_signed_files(cert_dir=str(tmp_path), common_name="vk-node",
                              hosts=("vk-node", "127.0.0.1"))
    assert _names_in(files.cert_file) == ("vk-node", ["vk-node", "127.0.0.1"])
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(files.cert_file, files.key_file)  # the key is the certificate's


def test_without_a_child_the_pair_is_made_here(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    files = self_signed_files(cert_dir=str(tmp_path), common_name="vk", hosts=("127.0.0.1",))
    assert _names_in(files.cert_file) == ("vk", ["127.0.0.1"])


def test_the_provider_process_never_loads_a_certificate_parser() -> None:
    """cryptography maps a second OpenSSL (9 MiB of RSS): only tools and tests may load it."""
    code = ("import sys, vkprovider.cli, vkprovider.service, vkprovider.api.tls, "
            "vkprovider.api.server, vkprovider.api.kubelet, vkprovider.api.auth; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"

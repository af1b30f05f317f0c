"""vkprovider/kube/kubeconfig.py: the common credential cases read without the official client
(same server, same trust, same identity as it would find), the rest left to it."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vkprovider.kube import kubeconfig
from vkprovider.testing.pki import CertificateAuthority


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "pki").mkdir()
    ca = CertificateAuthority(directory=tmp_path / "pki")
    client = ca.issue(stem="admin", common_name="admin", organization="system:masters",
                      client=True)
    return {"ca": ca.cert_path, "cert": client.cert, "key": client.key}


def _write(path: Path, *, cluster: dict[str, Any], user: dict[str, Any],
           current: str | None = "c") -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}},
                     {"name": "other", "context": {"cluster": "k", "user": "u"}}],
    }
    if current is not None:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def _subjects(tls: ssl.SSLContext) -> list[Any]:
    return [c["subject"] for c in tls.get_ca_certs()]


def test_client_certificates_by_relative_path(tmp_path: Path, pki: dict[str, Path]) -> None:
    rel = {k: str(v.relative_to(tmp_path)) for k, v in pki.items()}
    path = _write(tmp_path / "config", cluster={"server": "https://127.0.0.1:6443/",
                                                "certificate-authority": rel["ca"]},
                  user={"client-certificate": rel["cert"], "client-key": rel["key"]})
    got = kubeconfig.load(kubeconfig=str(path), context=None, environ={})
    assert got is not None
    assert got.host == "https://127.0.0.1:6443" and got.token() is None
    assert len(_subjects(got.ssl_context)) == 1, "trusts the named CA only"
    assert got.ssl_context.verify_mode == ssl.CERT_REQUIRED and got.ssl_context.check_hostname
    assert "127.0.0.1" in repr(got) and "key" not in repr(got)


def test_inline_data_leaves_no_key_file_behind(tmp_path: Path, pki: dict[str, Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    b64 = {k: base64.b64encode(v.read_bytes()).decode() for k, v in pki.items()}
    path = _write(tmp_path / "config", cluster={"server": "https://10.0.0.1",
                                                "certificate-authority-data": b64["ca"]},
                  user={"client-certificate-data": b64["cert"], "client-key-data": b64["key"]})
    got = kubeconfig.load(kubeconfig=str(path), context=None, environ={})
    assert got is not None and len(_subjects(got.ssl_context)) == 1
    assert list((tmp_path / "tmp").iterdir()) == []


def test_tokens_fixed_and_from_a_file_read_again(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", cluster={"server": "https://h:1",
                                                "insecure-skip-tls-verify": True},
                  user={"token": "t-1"})
    got = kubeconfig.load(kubeconfig=str(path), context=None, environ={})
    assert got is not None and got.token() == "t-1"
    assert got.ssl_context.verify_mode == ssl.CERT_NONE
    (tmp_path / "tok").write_text("t-2\n")
    path = _write(tmp_path / "config", cluster={"server": "https://h:1"},
                  user={"tokenFile": "tok"})
    got = kubeconfig.load(kubeconfig=str(path), context="other", environ={})
    assert got is not None and got.token() == "t-2"
    (tmp_path / "tok").write_text("t-3")
    assert got.token() == "t-3", "a token file is read again"


@pytest.mark.parametrize("user", [
    {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}},
    {"auth-provider": {"name": "oidc"}},
    {"username": "a", "password": "b"},
    {"client-certificate": "only-half.crt"},
])
def test_what_only_the_official_loader_knows_is_left_to_it(tmp_path: Path,
                                                          user: dict[str, Any]) -> None:
    path = _write(tmp_path / "config", cluster={"server": "https://h:1"}, user=user)
    assert kubeconfig.load(kubeconfig=str(path), context=None, environ={}) is None


@pytest.mark.parametrize("field", ["certificate-authority-data", "client-certificate-data"])
def test_undecodable_inline_data_is_left_to_the_official_loader(tmp_path: Path,
                                                                field: str) -> None:
    # Never trust the system's CAs, or go without a client certificate, in its place.
    cluster: dict[str, Any] = {"server": "https://h:1"}
    user: dict[str, Any] = {"token": "t"}
    path = _write(tmp_path / "config", cluster=cluster, user=user)
    assert kubeconfig.load(kubeconfig=str(path), context=None, environ={}) is not None
    (cluster if field.startswith("certificate") else user)[field] = "not base64!"
    path = _write(tmp_path / "config", cluster=cluster, user=user)
    assert kubeconfig.load(kubeconfig=str(path), context=None, environ={}) is None


def test_unclear_files_and_merges_are_left_to_the_official_loader(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", cluster={"server": "https://h:1", "proxy-url": "x"},
                  user={})
    assert kubeconfig.load(kubeconfig=str(path), context=None, environ={}) is None
    path = _write(tmp_path / "config", cluster={"server": "https://h:1"}, user={},
                  current=None)
    assert kubeconfig.load(kubeconfig=str(path), context=None, environ={}) is None
    assert kubeconfig.load(kubeconfig=str(path), context="nope", environ={}) is None
    assert kubeconfig.load(kubeconfig=str(tmp_path / "missing"), context=None,
                           environ={}) is None
    (tmp_path / "bad").write_text(": : :")
    assert kubeconfig.load(kubeconfig=str(tmp_path / "bad"), context=None, environ={}) is None
    two = f"{path}:{path}"
    assert kubeconfig.load(kubeconfig=None, context="c", environ={"KUBECONFIG": two},
                           sa_dir=tmp_path / "none") is None
    one = kubeconfig.load(kubeconfig=None, context="c", environ={"KUBECONFIG": f"{path}:"},
                          sa_dir=tmp_path / "none")
    assert one is not None and one.host == "https://h:1"


def test_in_cluster_with_the_token_read_again(tmp_path: Path, pki: dict[str, Path]) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(pki["ca"].read_bytes())
    (sa / "token").write_text("sa-1")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    got = kubeconfig.load(kubeconfig=None, context=None, environ=env, sa_dir=sa)
    assert got is not None and got.host == "https://[fd00::1]:443"
    assert got.token() == "sa-1" and len(_subjects(got.ssl_context)) == 1
    (sa / "token").write_text("sa-2")
    assert got.token() == "sa-2", "a rotated token is used at once"
    (sa / "token").unlink()
    assert got.token() == "sa-2", "a failed read keeps the last token"


def test_load_credentials_reads_the_common_case_without_the_official_client(
        tmp_path: Path, pki: dict[str, Path]) -> None:
    path = _write(tmp_path / "config", cluster={"server": "https://127.0.0.1:6443",
                                                "certificate-authority": str(pki["ca"])},
                  user={"client-certificate": str(pki["cert"]), "client-key": str(pki["key"])})
    code = ("import sys; from vkprovider.kube.auth import load_credentials; "
            "c = load_credentials(kubeconfig=sys.argv[1]); "
            "print(c.host, c.bearer_token(), 'kubernetes' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.split() == ["https://127.0.0.1:6443", "None", "False"]
    exec_user = _write(tmp_path / "exec", cluster={"server": "https://127.0.0.1:6443"},
                       user={"exec": {"command": "true",
                                      "apiVersion": "client.authentication.k8s.io/v1"}})
    done = subprocess.run([sys.executable, "-c", code, str(exec_user)], capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.split()[-1] == "True", "an exec user goes through the official loader"

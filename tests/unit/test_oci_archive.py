"""tools/node/oci_archive.py: the offline image packer the real node imports its images from.

ctr refuses an archive whose blobs do not match their digests, and the kubelet runs what the
config says; these check the layout's invariants without containerd: every descriptor's digest
and size are its blob's, the config's diff_id is the layer's, the name annotation is the
reference, and the same inputs give the same bytes (so digests are stable across runs).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def packer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("oci_archive", ROOT / "tools/node/oci_archive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("oci_archive", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def build(tmp_path: Path, name: str = "example.invalid/tool:2") -> bytes:
    (tmp_path / "tool").write_bytes(b"#!/bin/sh\necho tool\n")
    out = tmp_path / "image.tar"
    assert packer().main([f"--out={out}", f"--name={name}", f"--file={tmp_path / 'tool'}:bin/tool",
                          "--link=bin/alias:tool", "--dir=tmp:1777",
                          '--entrypoint=["/bin/tool"]', '--cmd=["--flag"]']) == 0
    return out.read_bytes()


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def blob(files: dict[str, bytes], desc: dict[str, Any]) -> bytes:
    data = files[f"blobs/sha256/{desc['digest'].removeprefix('sha256:')}"]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == desc["digest"]
    assert len(data) == desc["size"]
    return data


def test_every_blob_matches_its_descriptor_and_the_config_describes_the_layer(
        tmp_path: Path) -> None:
    files = members(build(tmp_path))
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "example.invalid/tool:2"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "2"
    manifest = json.loads(blob(files, entry))
    config = json.loads(blob(files, manifest["config"]))
    (layer_desc,) = manifest["layers"]
    layer = blob(files, layer_desc)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    assert config["config"]["Cmd"] == ["--flag"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        entries = {m.name: m for m in tar.getmembers()}
    assert entries["bin/tool"].mode == 0o755 and entries["bin/tool"].isfile()
    assert entries["bin/alias"].issym() and entries["bin/alias"].linkname == "tool"
    assert entries["tmp"].isdir() and entries["tmp"].mode == 0o1777
    assert entries["bin"].isdir()  # parents are listed before their children
    assert list(entries).index("bin") < list(entries).index("bin/tool")
    assert {m.mtime for m in entries.values()} == {0} and {m.uid for m in entries.values()} == {0}


def test_the_same_inputs_give_the_same_bytes(tmp_path: Path) -> None:
    first = build(tmp_path)
    assert build(tmp_path) == first
    assert build(tmp_path, name="example.invalid/tool:3") != first


def test_a_root_filesystem_is_packed_whole_with_numeric_owners_and_no_device_nodes(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "opt/app/bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    (root / "dev").mkdir()
    os.mkfifo(root / "dev/fifo")
    (root / "opt/app/bin/app").write_bytes(b"#!/bin/sh\n")
    (root / "opt/app/bin/app").chmod(0o755)
    os.link(root / "opt/app/bin/app", root / "opt/app/bin/same")
    (root / "opt/app/bin/alias").symlink_to("app")
    os.chown(root / "opt/app/bin/app", 4242, 4343, follow_symlinks=False)
    out = tmp_path / "image.tar"

    def pack() -> bytes:
        assert packer().main([f"--out={out}", "--name=example.invalid/app:1", f"--rootfs={root}",
                              "--mtime=315532800", "--user=65532:65532", "--workdir=/srv",
                              "--label=org.opencontainers.image.title=app", "--expose=8080/tcp",
                              '--entrypoint=["app"]', "--env=PATH=/opt/app/bin:/bin"]) == 0
        return out.read_bytes()

    first = pack()
    assert pack() == first  # reproducible
    files = members(first)
    (entry,) = json.loads(files["index.json"])["manifests"]
    manifest = json.loads(blob(files, entry))
    config = json.loads(blob(files, manifest["config"]))
    assert config["config"] == {
        "Entrypoint": ["app"], "Cmd": None, "Env": ["PATH=/opt/app/bin:/bin"],
        "User": "65532:65532", "WorkingDir": "/srv",
        "Labels": {"org.opencontainers.image.title": "app"},
        "ExposedPorts": {"8080/tcp": {}}}
    with tarfile.open(fileobj=io.BytesIO(blob(files, manifest["layers"][0]))) as tar:
        entries = {m.name: m for m in tar.getmembers()}
    assert set(entries) == {"dev", "opt", "opt/app", "opt/app/bin", "opt/app/bin/alias",
                            "opt/app/bin/app", "opt/app/bin/same", "tmp"}  # no dev/fifo
    app = entries["opt/app/bin/app"]
    assert (app.uid, app.gid, app.uname, app.mode) == (4242, 4343, "", 0o755)
    assert entries["opt/app/bin/same"].islnk()
    assert entries["opt/app/bin/same"].linkname == "opt/app/bin/app"
    assert entries["opt/app/bin/alias"].issym() and entries["tmp"].mode == 0o1777
    assert {m.mtime for m in entries.values()} == {315532800}
    names = list(entries)
    assert names.index("opt") < names.index("opt/app") < names.index("opt/app/bin/app")


def test_a_gzip_layer_is_named_by_its_bytes_and_described_by_its_content(tmp_path: Path) -> None:
    (tmp_path / "tool").write_bytes(b"tool\n" * 1000)
    out = tmp_path / "image.tar"
    assert packer().main([f"--out={out}", "--name=example.invalid/tool:1", "--gzip",
                          f"--file={tmp_path / 'tool'}:bin/tool"]) == 0
    files = members(out.read_bytes())
    (entry,) = json.loads(files["index.json"])["manifests"]
    manifest = json.loads(blob(files, entry))
    config = json.loads(blob(files, manifest["config"]))
    (desc,) = manifest["layers"]
    assert desc["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    plain = gzip.decompress(blob(files, desc))
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(plain).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        assert tar.extractfile("bin/tool").read() == b"tool\n" * 1000  # type: ignore[union-attr]

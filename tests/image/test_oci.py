"""The image built offline (tools/image/oci.sh) is the Dockerfile's image.

``docker build`` is how users build it; CI has no Docker engine, so tools/image/oci.sh packs the
root filesystem of tools/image/rootfs.sh into an OCI archive (tools/node/oci_archive.py) whose
config it reads from the Dockerfile. These tests read the Dockerfile independently
(tests/image/imagespec.py) and the archive as a runtime would (index -> manifest -> config and
layer, every digest checked), and hold the two together: USER, ENTRYPOINT, CMD, ENV, WORKDIR,
EXPOSE and the LABELs; the layer is the root filesystem, with nothing the read-only root (the
chart's ``readOnlyRootFilesystem``) would need to write but the ``/tmp`` mount point.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from .imagespec import VALUES, parse_dockerfile

pytestmark = [pytest.mark.rootfs, pytest.mark.timeout(900)]

IMAGE = parse_dockerfile()


def _sha256(stream: IO[bytes]) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    while chunk := stream.read(1 << 20):
        sha.update(chunk)
        size += len(chunk)
    return "sha256:" + sha.hexdigest(), size


class Archive:
    """An OCI archive opened as ``ctr import`` reads it."""

    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path)  # noqa: SIM115 - closed by the fixture
        self.index = self.json("index.json")
        (self.entry,) = self.index["manifests"]
        self.manifest = self.blob_json(self.entry)
        self.config = self.blob_json(self.manifest["config"])
        (self.layer_desc,) = self.manifest["layers"]

    def file(self, name: str) -> IO[bytes]:
        member = self.tar.extractfile(name)
        assert member is not None, name
        return member

    def json(self, name: str) -> Any:
        return json.load(self.file(name))

    def blob(self, desc: dict[str, Any]) -> IO[bytes]:
        name = f"blobs/sha256/{desc['digest'].removeprefix('sha256:')}"
        digest, size = _sha256(self.file(name))
        assert (digest, size) == (desc["digest"], desc["size"]), desc
        return self.file(name)

    def blob_json(self, desc: dict[str, Any]) -> Any:
        return json.load(self.blob(desc))

    def layer(self) -> tarfile.TarFile:
        return tarfile.open(fileobj=self.blob(self.layer_desc), mode="r|*")


@pytest.fixture(scope="module")
def archive(image_archive: Path) -> Any:
    opened = Archive(image_archive)
    yield opened
    opened.tar.close()


def test_the_archive_is_an_oci_layout_named_as_the_chart_runs_it(archive: Archive) -> None:
    assert archive.json("oci-layout") == {"imageLayoutVersion": "1.0.0"}
    values = yaml.safe_load(VALUES.read_text())
    version = IMAGE.labels()["org.opencontainers.image.version"]
    name = archive.entry["annotations"]["io.containerd.image.name"]
    assert name == f"{values['image']['repository']}:{version}"
    assert archive.entry["annotations"]["org.opencontainers.image.ref.name"] == version
    assert archive.config["os"] == "linux"
    assert archive.entry["platform"]["architecture"] == archive.config["architecture"]
    # the config's diff_id is the digest of the layer as unpacked (it is stored uncompressed or
    # gzip'd: the uncompressed bytes are what the diff_id names)
    with archive.blob(archive.layer_desc) as raw:
        if archive.layer_desc["mediaType"].endswith("+gzip"):
            diff_id, _ = _sha256(gzip.GzipFile(fileobj=raw))
        else:
            diff_id, _ = _sha256(raw)
    assert archive.config["rootfs"] == {"type": "layers", "diff_ids": [diff_id]}


def test_the_config_is_the_dockerfiles(archive: Archive) -> None:
    config = archive.config["config"]
    user = IMAGE.final.all("USER")[-1]
    assert config["User"] == user and tuple(map(int, user.split(":"))) == IMAGE.user()
    assert config["Entrypoint"] == IMAGE.entrypoint()
    assert (config.get("Cmd") or []) == IMAGE.cmd()
    assert dict(e.split("=", 1) for e in config["Env"]) == IMAGE.env()
    assert config["WorkingDir"] == IMAGE.workdir()
    assert set(config.get("ExposedPorts") or {}) == IMAGE.exposed()
    assert config.get("Labels") == IMAGE.labels()
    assert set(IMAGE.labels()) >= {f"org.opencontainers.image.{k}" for k in
                                   ("title", "source", "licenses", "version")}


def test_the_layer_is_the_root_filesystem_and_read_only_ready(archive: Archive,
                                                               rootfs: Path) -> None:
    entries: dict[str, tarfile.TarInfo] = {}
    with archive.layer() as layer:
        for member in layer:
            entries[member.name] = member
    expected: dict[str, os.stat_result] = {}
    for folder, dirs, files in os.walk(rootfs):
        for name in [*dirs, *files]:
            full = Path(folder, name)
            st = full.lstat()
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                expected[str(full.relative_to(rootfs))] = st
    assert set(entries) == set(expected), (set(entries) ^ set(expected))
    for path, st in expected.items():
        got = entries[path]
        assert (got.uid, got.gid, got.mode) == (st.st_uid, st.st_gid,
                                                stat.S_IMODE(st.st_mode)), path
    # the entrypoint, found on the config's PATH, is an executable of the layer
    env = dict(e.split("=", 1) for e in archive.config["config"]["Env"])
    command = IMAGE.entrypoint()[0]
    found = [d for d in env["PATH"].split(":") if f"{d.strip('/')}/{command}" in entries]
    assert found, f"{command} is on no PATH folder of the layer"
    assert entries[f"{found[0].strip('/')}/{command}"].mode & 0o111
    # a read-only root: /tmp (the emptyDir's mount point, TMPDIR) is there; the USER owns
    # nothing and no file is writable by everyone
    uid, _ = IMAGE.user()
    assert entries["tmp"].isdir() and entries["tmp"].mode == 0o1777
    assert not [p for p, m in entries.items() if m.uid == uid]
    assert not [p for p, m in entries.items()
                if (m.isreg() or m.isdir()) and m.mode & 0o002 and not m.mode & 0o1000]
    assert not [m for m in entries.values() if m.ischr() or m.isblk() or m.isfifo()]

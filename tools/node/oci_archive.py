#!/usr/bin/env python3
"""Packs files, or a whole root filesystem, into a one-layer OCI image archive, offline.

Why it exists: the real-node tests run containers from images that must come from this machine
(nothing can be pulled), and the project's own image is built without a Docker engine.
``ctr -n k8s.io images import`` (and ``docker load``, ``skopeo copy oci-archive:...``) take an
OCI image layout as a tar (``oci-layout``, ``index.json``, ``blobs/sha256/...``); this writes one
from local files with a reproducible layer (sorted entries, one fixed mtime, numeric owners, no
device nodes), so the same inputs give the same digests. The image config carries what a
Dockerfile's final stage sets (USER, WORKDIR, ENV, ENTRYPOINT, CMD, EXPOSE, LABEL):
tools/image/oci.sh reads those from the Dockerfile and passes them here. The layer and the
archive are streamed through files, so a 400 MB root filesystem needs no 400 MB of memory.
Standard library only, so it runs from any Python 3.11+.

Usage::

    oci_archive.py --out busybox.tar --name vkprovider.invalid/busybox:1 \\
        --file /bin/busybox:bin/busybox:755 --link bin/sh:busybox --dir tmp:1777 \\
        --entrypoint '["/bin/sh"]' [--cmd '["-c", "echo hi"]'] [--env K=V ...]
    oci_archive.py --out image.tar --name example.invalid/app:1 --rootfs /path/to/root \\
        --user 65532:65532 --workdir / --label K=V --expose 8080/tcp --gzip ...
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import stat
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

_LAYER = "application/vnd.oci.image.layer.v1.tar"
_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_INDEX = "application/vnd.oci.image.index.v1+json"
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_CHUNK = 1 << 20


@dataclass
class Layer:
    """Entries of the image's one layer, keyed by their path inside the image; ``rootfs``: a
    directory whose whole tree comes first (the other entries are added after it)."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)
    rootfs: Path | None = None
    mtime: int = 0

    def write(self, out: IO[bytes]) -> None:
        """The layer's tar, streamed to ``out`` (only ``write`` is called on it)."""
        parents: set[str] = set()
        for path in [*self.files, *self.links, *self.dirs]:
            parts = path.split("/")[:-1]
            parents.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            tree = set(_add_tree(tar, self.rootfs, self.mtime)) if self.rootfs else set()
            for path in sorted((parents | set(self.dirs)) - tree):
                tar.addfile(_info(path, tarfile.DIRTYPE, self.dirs.get(path, 0o755), self.mtime))
            for path in sorted(self.files):
                data, mode = self.files[path]
                info = _info(path, tarfile.REGTYPE, mode, self.mtime)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            for path in sorted(self.links):
                info = _info(path, tarfile.SYMTYPE, 0o777, self.mtime)
                info.linkname = self.links[path]
                tar.addfile(info)

    def tar(self) -> bytes:
        out = io.BytesIO()
        self.write(out)
        return out.getvalue()


def _add_tree(tar: tarfile.TarFile, root: Path, mtime: int) -> list[str]:
    """Every entry under ``root``, parents first, in sorted order; returns their paths.

    Owners stay numeric (the image's users are the root filesystem's, not this host's), every
    mtime is ``mtime``, hard links stay links to the first path of their inode, and device
    nodes, FIFOs and sockets are left out: a runtime mounts its own /dev.
    """
    paths: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(folder, root)
        paths.extend(os.path.normpath(os.path.join(rel, n)) for n in [*dirs, *sorted(files)])
    added: list[str] = []
    for path in sorted(paths):
        full = root / path
        st = full.lstat()
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            continue
        info = tar.gettarinfo(str(full), arcname=path)
        info.mtime = mtime
        info.uname = info.gname = ""
        info.pax_headers = {}
        if info.isreg():
            with full.open("rb") as data:
                tar.addfile(info, data)
        else:
            tar.addfile(info)
        added.append(path)
    return added


def _info(path: str, kind: bytes, mode: int, mtime: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type = kind
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


class _Digest:
    """A write-only file that hashes and counts what passes through to ``out``."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


@dataclass
class ImageConfig:
    """The runtime part of the image config (what a Dockerfile's final stage sets)."""

    entrypoint: list[str]
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=lambda: [_PATH])
    user: str = ""
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)
    exposed: list[str] = field(default_factory=list)

    def as_oci(self) -> dict[str, Any]:
        config: dict[str, Any] = {"Entrypoint": self.entrypoint, "Cmd": self.cmd or None,
                                  "Env": self.env, "WorkingDir": self.workdir}
        if self.user:
            config["User"] = self.user
        if self.labels:
            config["Labels"] = self.labels
        if self.exposed:
            config["ExposedPorts"] = {port: {} for port in self.exposed}
        return config


def write_archive(*, out: Path, name: str, layer: Layer, config: ImageConfig,
                  arch: str = "amd64", compress: bool = False) -> None:
    """Writes the OCI layout tar for image ``name`` (``host/repo:tag``) with one layer to
    ``out`` (atomically: a ``.tmp`` beside it, then renamed)."""
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as tmp:
        layer_path = Path(tmp) / "layer"
        with layer_path.open("wb") as raw:
            stored = _Digest(raw)
            if compress:  # mtime 0 and no name in the gzip header: reproducible
                with gzip.GzipFile(fileobj=stored, mode="wb", mtime=0, filename="",  # type: ignore[arg-type]
                                   compresslevel=6) as zipped:
                    plain = _Digest(zipped)  # type: ignore[arg-type]
                    layer.write(plain)  # type: ignore[arg-type]
            else:
                plain = stored
                layer.write(plain)  # type: ignore[arg-type]
        blobs: dict[str, bytes | Path] = {stored.digest: layer_path}
        layer_desc = {"mediaType": _LAYER_GZIP if compress else _LAYER, "digest": stored.digest,
                      "size": stored.size}
        image = {
            "architecture": arch,
            "os": "linux",
            "config": config.as_oci(),
            "rootfs": {"type": "layers", "diff_ids": [plain.digest]},
            "history": [{"created_by": "tools/node/oci_archive.py"}],
        }
        config_desc = _blob(blobs, _json(image), _CONFIG)
        manifest = {"schemaVersion": 2, "mediaType": _MANIFEST, "config": config_desc,
                    "layers": [layer_desc]}
        manifest_desc = _blob(blobs, _json(manifest), _MANIFEST)
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
        manifest_desc["annotations"] = {"io.containerd.image.name": name,
                                        "org.opencontainers.image.ref.name": tag}
        manifest_desc["platform"] = {"architecture": arch, "os": "linux"}
        index = {"schemaVersion": 2, "mediaType": _INDEX, "manifests": [manifest_desc]}
        entries: dict[str, bytes | Path] = {
            "oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index)}
        for digest, data in blobs.items():
            entries[f"blobs/sha256/{digest.removeprefix('sha256:')}"] = data
        part = out.with_name(out.name + ".tmp")
        with part.open("wb") as raw, tarfile.open(fileobj=raw, mode="w|",
                                                  format=tarfile.PAX_FORMAT) as tar:
            for path in ("blobs", "blobs/sha256"):
                tar.addfile(_info(path, tarfile.DIRTYPE, 0o755))
            for path in sorted(entries):
                data = entries[path]
                info = _info(path, tarfile.REGTYPE, 0o644)
                if isinstance(data, Path):
                    info.size = data.stat().st_size
                    with data.open("rb") as src:
                        tar.addfile(info, src)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        part.replace(out)


def archive(*, name: str, layer: Layer, entrypoint: list[str], cmd: list[str],
            env: list[str]) -> bytes:
    """The OCI layout tar for image ``name`` with one small layer, in memory."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "image.tar"
        write_archive(out=out, name=name, layer=layer,
                      config=ImageConfig(entrypoint=entrypoint, cmd=cmd, env=env))
        return out.read_bytes()


def _blob(blobs: dict[str, bytes | Path], data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _mode(text: str) -> int:
    return int(text, 8)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--name", required=True, help="image reference, e.g. example.invalid/x:1")
    parser.add_argument("--rootfs", type=Path, help="a directory: its whole tree is the layer")
    parser.add_argument("--file", action="append", default=[],
                        help="SOURCE:PATH[:MODE] (octal mode, default 755)")
    parser.add_argument("--link", action="append", default=[], help="PATH:TARGET (symlink)")
    parser.add_argument("--dir", action="append", default=[], help="PATH[:MODE]")
    parser.add_argument("--entrypoint", default="[]", help="JSON list")
    parser.add_argument("--cmd", default="[]", help="JSON list")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--user", default="", help="UID[:GID] (the config's User)")
    parser.add_argument("--workdir", default="/", help="the config's WorkingDir")
    parser.add_argument("--label", action="append", default=[], type=_pair, help="KEY=VALUE")
    parser.add_argument("--expose", action="append", default=[], help="PORT/PROTO, e.g. 8080/tcp")
    parser.add_argument("--mtime", type=int, default=0, help="every entry's mtime (seconds)")
    parser.add_argument("--arch", default=_ARCH.get(platform.machine(), platform.machine()),
                        help="the image's architecture (default: this machine's)")
    parser.add_argument("--gzip", action="store_true", help="compress the layer")
    args = parser.parse_args(argv)
    if args.rootfs is not None and not args.rootfs.is_dir():
        parser.error(f"--rootfs {args.rootfs} is not a directory")
    layer = Layer(rootfs=args.rootfs, mtime=args.mtime)
    for spec in args.file:
        source, path, *mode = spec.split(":")
        layer.files[path.strip("/")] = (Path(source).read_bytes(),
                                        _mode(mode[0]) if mode else 0o755)
    for spec in args.link:
        path, target = spec.split(":", 1)
        layer.links[path.strip("/")] = target
    for spec in args.dir:
        path, *mode = spec.split(":")
        layer.dirs[path.strip("/")] = _mode(mode[0]) if mode else 0o755
    config = ImageConfig(entrypoint=json.loads(args.entrypoint), cmd=json.loads(args.cmd),
                         env=args.env or [_PATH], user=args.user, workdir=args.workdir,
                         labels=dict(args.label), exposed=args.expose)
    write_archive(out=args.out, name=args.name, layer=layer, config=config, arch=args.arch,
                  compress=args.gzip)
    return 0


if __name__ == "__main__":
    sys.exit(main())

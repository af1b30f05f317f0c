#!/usr/bin/env python3
"""Packs files into a one-layer OCI image archive, offline: no Docker engine, no registry.

Why it exists: the real-node tests run containers from images that must come from this machine
(nothing can be pulled). ``ctr -n k8s.io images import`` takes an OCI image layout as a tar
(``oci-layout``, ``index.json``, ``blobs/sha256/...``); this writes one from local files, with a
reproducible layer (sorted entries, mtime 0, owner root), so the same inputs give the same
digests. Standard library only, so it runs from any Python 3.11+.

Usage::

    oci_archive.py --out busybox.tar --name vkprovider.invalid/busybox:1 \\
        --file /bin/busybox:bin/busybox:755 --link bin/sh:busybox --dir tmp:1777 \\
        --entrypoint '["/bin/sh"]' [--cmd '["-c", "echo hi"]'] [--env K=V ...]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

_LAYER = "application/vnd.oci.image.layer.v1.tar"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_INDEX = "application/vnd.oci.image.index.v1+json"
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Layer:
    """Entries of the image's one layer, keyed by their path inside the image."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)

    def tar(self) -> bytes:
        out = io.BytesIO()
        parents: set[str] = set()
        for path in [*self.files, *self.links, *self.dirs]:
            parts = path.split("/")[:-1]
            parents.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(parents | set(self.dirs)):
                tar.addfile(_info(path, tarfile.DIRTYPE, self.dirs.get(path, 0o755)))
            for path in sorted(self.files):
                data, mode = self.files[path]
                info = _info(path, tarfile.REGTYPE, mode)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            for path in sorted(self.links):
                info = _info(path, tarfile.SYMTYPE, 0o777)
                info.linkname = self.links[path]
                tar.addfile(info)
        return out.getvalue()


def _info(path: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type = kind
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def archive(*, name: str, layer: Layer, entrypoint: list[str], cmd: list[str],
            env: list[str]) -> bytes:
    """The OCI layout tar for image ``name`` (``host/repo:tag``) with one layer."""
    blobs: dict[str, bytes] = {}
    layer_tar = layer.tar()
    layer_desc = _blob(blobs, layer_tar, _LAYER)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd or None, "Env": env,
                   "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        "history": [{"created_by": "tools/node/oci_archive.py"}],
    }
    config_desc = _blob(blobs, _json(config), _CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": _MANIFEST, "config": config_desc,
                "layers": [layer_desc]}
    manifest_desc = _blob(blobs, _json(manifest), _MANIFEST)
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    manifest_desc["annotations"] = {"io.containerd.image.name": name,
                                    "org.opencontainers.image.ref.name": tag}
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": _INDEX, "manifests": [manifest_desc]}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index)}
        for digest, data in blobs.items():
            entries[f"blobs/sha256/{digest.removeprefix('sha256:')}"] = data
        for path in ("blobs", "blobs/sha256"):
            tar.addfile(_info(path, tarfile.DIRTYPE, 0o755))
        for path in sorted(entries):
            info = _info(path, tarfile.REGTYPE, 0o644)
            info.size = len(entries[path])
            tar.addfile(info, io.BytesIO(entries[path]))
    return out.getvalue()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _mode(text: str) -> int:
    return int(text, 8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--name", required=True, help="image reference, e.g. example.invalid/x:1")
    parser.add_argument("--file", action="append", default=[],
                        help="SOURCE:PATH[:MODE] (octal mode, default 755)")
    parser.add_argument("--link", action="append", default=[], help="PATH:TARGET (symlink)")
    parser.add_argument("--dir", action="append", default=[], help="PATH[:MODE]")
    parser.add_argument("--entrypoint", default="[]", help="JSON list")
    parser.add_argument("--cmd", default="[]", help="JSON list")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    args = parser.parse_args(argv)
    layer = Layer()
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
    data = archive(name=args.name, layer=layer, entrypoint=json.loads(args.entrypoint),
                   cmd=json.loads(args.cmd), env=args.env or [_PATH])
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

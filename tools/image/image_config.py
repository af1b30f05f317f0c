#!/usr/bin/env python3
"""The image config the Dockerfile's final stage describes, as tools/node/oci_archive.py flags.

Why it exists: tools/image/oci.sh builds the project's image without a Docker engine (the root
filesystem from tools/image/rootfs.sh, packed by oci_archive.py); its config (USER, WORKDIR,
ENV, ENTRYPOINT, CMD, EXPOSE, LABEL) must be the Dockerfile's, not a copy that could drift, so
it is read from the Dockerfile here. ARG defaults are substituted as ``docker build`` would
without ``--build-arg``; ``$PATH`` in ENV extends the base image's PATH (Debian's default, as in
python:3.11-slim-bookworm's Debian base). tests/image/test_oci.py checks the archive's config
against its own, independent reading of the Dockerfile.

Usage: ``image_config.py DOCKERFILE`` prints one flag a line (NUL-free text), e.g.
``--user=65532:65532``, ``--entrypoint=["vkprovider"]``, ``--label=KEY=VALUE``.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import sys
from pathlib import Path

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class DockerfileError(Exception):
    """The Dockerfile says something this reader cannot turn into an image config."""


def logical_lines(text: str) -> list[str]:
    """Instructions, continuation lines joined, comments and blank lines dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def _expand(value: str, names: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: names.get(m.group(1), m.group(0)), value)


def _pairs(rest: str) -> list[tuple[str, str]]:
    words = shlex.split(rest)
    if len(words) >= 2 and "=" not in words[0]:  # legacy `ENV KEY value with spaces`
        return [(words[0], " ".join(words[1:]))]
    out = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise DockerfileError(f"{word!r} is not KEY=VALUE")
        out.append((key, value))
    return out


def _exec_form(rest: str) -> list[str]:
    if rest.startswith("["):
        value = json.loads(rest)
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise DockerfileError(f"{rest!r} is not a JSON list of strings")
        return value
    return ["/bin/sh", "-c", rest]


def flags(text: str) -> list[str]:
    """oci_archive.py flags for the final stage of the Dockerfile ``text``."""
    global_args: dict[str, str] = {}
    stage: list[tuple[str, str]] | None = None
    for line in logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            stage = []
        elif stage is None:
            if keyword == "ARG":
                name, _, default = rest.partition("=")
                global_args[name] = default
        else:
            stage.append((keyword, rest))
    if stage is None:
        raise DockerfileError("no FROM")
    args: dict[str, str] = {}
    env: dict[str, str] = {"PATH": BASE_PATH}
    user, workdir = "", "/"
    labels: dict[str, str] = {}
    exposed: list[str] = []
    entrypoint: list[str] = []
    cmd: list[str] = []
    for keyword, rest in stage:
        names = {**args, **env}
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default or global_args.get(name, "")
        elif keyword == "ENV":
            for key, value in _pairs(rest):
                env[key] = _expand(value, {**args, **env})
        elif keyword == "LABEL":
            for key, value in _pairs(rest):
                labels[key] = _expand(value, names)
        elif keyword == "USER":
            user = _expand(rest, names)
        elif keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, _expand(rest, names)))
        elif keyword == "EXPOSE":
            for port in _expand(rest, names).split():
                exposed.append(port if "/" in port else f"{port}/tcp")
        elif keyword == "ENTRYPOINT":
            entrypoint, cmd = _exec_form(rest), []  # a new ENTRYPOINT resets CMD
        elif keyword == "CMD":
            cmd = _exec_form(rest)
    out = [f"--user={user}", f"--workdir={workdir}",
           f"--entrypoint={json.dumps(entrypoint)}", f"--cmd={json.dumps(cmd)}"]
    out += [f"--env={k}={v}" for k, v in env.items()]
    out += [f"--label={k}={v}" for k, v in labels.items()]
    out += [f"--expose={p}" for p in exposed]
    if any("\n" in f for f in out):
        raise DockerfileError("a value spans lines")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: image_config.py DOCKERFILE\n")
        return 2
    try:
        sys.stdout.write("\n".join(flags(Path(args[0]).read_text())) + "\n")
    except (OSError, ValueError, DockerfileError) as exc:
        sys.stderr.write(f"image_config.py: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

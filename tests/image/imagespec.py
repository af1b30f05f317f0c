"""What the image promises, read from the files that make the promise.

The Dockerfile (its final stage: ENV, USER, ENTRYPOINT, CMD, labels), .dockerignore, and the two
Deployments (their securityContext, volumes, env and args) are parsed here, so the tests run what
those files say rather than a copy of it that could drift.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOYMENTS = {
    "vkprovider": REPO / "manifests/base/deployment.yaml",
    "companion": REPO / "manifests/base/companion.yaml",
}
CONFIG_MAPS = REPO / "manifests/base/config.yaml"
ROOTFS_SH = REPO / "tools/image/rootfs.sh"
OCI_SH = REPO / "tools/image/oci.sh"
VALUES = REPO / "charts/vkprovider/values.yaml"
SANDBOX_SH = REPO / "tools/image/sandbox.sh"
# PATH in python:3.11-slim-bookworm (what `$PATH` in the Dockerfile's ENV extends)
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def args(self, stage: Stage) -> dict[str, str]:
        """ARG defaults visible in ``stage`` (global ARGs are re-declared by name there)."""
        found: dict[str, str] = {}
        for rest in stage.all("ARG"):
            name, _, default = rest.partition("=")
            found[name] = default or self.global_args.get(name, "")
        return found

    def env(self) -> dict[str, str]:
        """The final stage's ENV, ``$PATH`` expanded against the base image's PATH."""
        env: dict[str, str] = {}
        for rest in self.final.all("ENV"):
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                env[name] = expand(value, {"PATH": env.get("PATH", BASE_PATH)})
        return env

    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        args = self.args(self.final)
        for rest in self.final.all("LABEL"):
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                labels[name] = expand(value, args)
        return labels

    def user(self) -> tuple[int, int]:
        users = self.final.all("USER")
        assert users, "the final stage has no USER"
        uid, _, gid = users[-1].partition(":")
        return int(uid), int(gid or uid)  # int(): numeric, or this raises

    def workdir(self) -> str:
        """The final stage's WORKDIR (absolute ones only here), else the base image's ``/``."""
        dirs = self.final.all("WORKDIR")
        assert all(d.startswith("/") for d in dirs), dirs
        return dirs[-1] if dirs else "/"

    def exposed(self) -> set[str]:
        return {p if "/" in p else f"{p}/tcp" for rest in self.final.all("EXPOSE")
                for p in rest.split()}

    def entrypoint(self) -> list[str]:
        return list(json.loads(self.final.all("ENTRYPOINT")[-1]))

    def cmd(self) -> list[str]:
        cmds = self.final.all("CMD")
        return list(json.loads(cmds[-1])) if cmds else []


def expand(value: str, names: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: names.get(m.group(1), m.group(0)), value)


def parse_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    text = path.read_text()
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            base = expand(words[0], global_args)
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            global_args[name] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(global_args=global_args, stages=stages)


def context_allowlist(path: Path = DOCKERIGNORE) -> list[str]:
    """The paths a ``*``-first .dockerignore lets back in (its ``!`` lines)."""
    lines = [x.strip() for x in path.read_text().splitlines()]
    assert "*" in lines, ".dockerignore is expected to be an allowlist (`*` first)"
    return [x[1:].rstrip("/") for x in lines if x.startswith("!")]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def deployment(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(DEPLOYMENTS[name].read_text()) if d]
    (found,) = [d for d in docs if d.get("kind") == "Deployment"]
    return dict(found)


def config_map(name: str) -> dict[str, str]:
    for doc in yaml.safe_load_all(CONFIG_MAPS.read_text()):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == name:
            return dict(doc["data"])
    raise AssertionError(f"no ConfigMap {name} in {CONFIG_MAPS}")


def container(dep: dict[str, Any]) -> dict[str, Any]:
    (only,) = dep["spec"]["template"]["spec"]["containers"]
    return dict(only)

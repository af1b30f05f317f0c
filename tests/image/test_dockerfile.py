"""The image's promises on paper: the Dockerfile, .dockerignore and the two Deployments agree
with each other and with pyproject.toml (no Docker needed; tests/image/test_rootfs.py runs them).
"""

from __future__ import annotations

import re

import pytest

from .imagespec import (
    DEPLOYMENTS,
    REPO,
    ROOTFS_SH,
    container,
    context_allowlist,
    deployment,
    parse_dockerfile,
    pyproject,
)

OCI = ("title", "description", "source", "licenses", "version")


def test_multi_stage_from_the_slim_python_311_base() -> None:
    image = parse_dockerfile()
    assert len(image.stages) >= 2, "a builder stage and a final stage"
    assert image.final.base == "python:3.11-slim-bookworm"
    assert image.stages[0].name, "the builder stage is named"
    builder = f"--from={image.stages[0].name}"
    assert any(rest.startswith(builder) for rest in image.final.all("COPY"))


def test_the_final_stage_builds_nothing() -> None:
    """No compilers, no package installs, no pip: it only copies the builder's venv in."""
    runs = " ".join(parse_dockerfile().final.all("RUN"))
    for word in ("apt-get", "apt ", "pip", "gcc", "build-essential", "make "):
        assert word not in runs, f"the final stage runs {word!r}: {runs}"


def test_entrypoint_is_the_console_script_and_user_is_numeric_non_root() -> None:
    image = parse_dockerfile()
    assert image.entrypoint() == ["vkprovider"]
    assert "vkprovider" in pyproject()["project"]["scripts"]
    uid, gid = image.user()  # parses as numbers, or raises
    assert uid != 0 and gid != 0


def test_python_env() -> None:
    env = parse_dockerfile().env()
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].split(":")[0] == "/opt/vkprovider/bin"


def test_oci_labels_match_pyproject() -> None:
    labels = parse_dockerfile().labels()
    project = pyproject()["project"]
    for key in OCI:
        assert labels.get(f"org.opencontainers.image.{key}"), f"no {key} label"
    assert labels["org.opencontainers.image.version"] == project["version"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]  # PEP 639
    assert labels["org.opencontainers.image.title"] == project["name"]


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_manifests_run_this_image_version(name: str) -> None:
    image = container(deployment(name))["image"]
    assert image.rsplit(":", 1)[1] == pyproject()["project"]["version"], image


def test_build_context_holds_what_the_wheel_and_the_copies_need() -> None:
    allowed = set(context_allowlist())
    data = pyproject()
    needed = {"pyproject.toml", data["project"]["readme"]}
    for pattern in data["tool"]["setuptools"]["packages"]["find"]["include"]:
        needed.add(pattern.split(".")[0].rstrip("*"))
    assert needed <= allowed, f".dockerignore lets in {sorted(allowed)}, the wheel needs {needed}"
    for rest in parse_dockerfile().stages[0].all("COPY"):
        sources = [s.rstrip("/") for s in rest.split()[:-1] if not s.startswith("--")]
        for source in sources:
            assert source in allowed, f"COPY {source}: not in the build context"
    for source in allowed:
        assert (REPO / source).exists(), f".dockerignore lets in {source}, which does not exist"


def test_rootfs_script_builds_from_the_same_context_and_user() -> None:
    """rootfs.sh reads .dockerignore's allowlist and the Dockerfile's useradd line itself."""
    script = ROOTFS_SH.read_text()
    assert ".dockerignore" in script
    assert "useradd" in script and "Dockerfile" in script
    uid, _ = parse_dockerfile().user()
    useradd = " ".join(r for r in parse_dockerfile().final.all("RUN") if "useradd" in r)
    assert re.search(rf"--uid {uid}\b", useradd), "the USER is the user useradd creates"


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_deployment_security_context(name: str) -> None:
    dep = deployment(name)
    pod = dep["spec"]["template"]["spec"]
    spec = container(dep)
    uid, _ = parse_dockerfile().user()
    sc = spec["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == uid, "the manifests run the image's user"
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    tmp = [m for m in spec["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1 and tmp[0]["name"] in empty_dirs, "an emptyDir at /tmp"
    env = {e["name"]: e.get("value") for e in spec.get("env", [])}
    assert env.get("TMPDIR") == "/tmp"

"""What a release is made of, checked on paper (no build): the licence, the changelog, the
pinned and hashed runtime dependencies the image and CI install, the pinned build backend.

Why it exists: a user consumes a release through these files; each one drifting (a dependency
added to pyproject.toml but not locked, a Dockerfile that stops checking hashes, a version
without its changelog section) breaks the release silently, long before anyone builds one.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = ROOT / "requirements" / "runtime.lock"


def _locked() -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, its hashes), from the lock's ``name==version \\`` entries."""
    out: dict[str, tuple[Version, list[str]]] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        head = entry.split("\n", 1)[0]
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", head)
        if match:
            out[canonicalize_name(match.group(1))] = (
                Version(match.group(2)), re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
    return out


def test_every_runtime_dependency_is_pinned_with_hashes_within_its_range() -> None:
    locked = _locked()
    assert locked, f"{LOCK} pins nothing"
    for name, (version, hashes) in locked.items():
        assert hashes, f"{name}=={version} has no --hash in {LOCK.name}"
    for text in PYPROJECT["project"]["dependencies"]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is a dependency but not in {LOCK.name}: make lock"
        assert req.specifier.contains(locked[name][0], prereleases=True), (
            f"{LOCK.name} pins {req.name}=={locked[name][0]}, outside {req.specifier}: make lock")


def test_the_image_and_the_venv_install_from_the_lock_checking_hashes() -> None:
    dockerfile = " ".join((ROOT / "Dockerfile").read_text().replace("\\\n", " ").split())
    assert re.search(r"pip .*install [^&]*--require-hashes [^&]*-r requirements/runtime\.lock",
                     dockerfile), "the Dockerfile does not install the lock with --require-hashes"
    assert "!requirements" in (ROOT / ".dockerignore").read_text().split()
    rootfs = (ROOT / "tools/image/rootfs.sh").read_text()
    assert "--require-hashes" in rootfs and "requirements/runtime.lock" in rootfs
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements/runtime.lock" in makefile


def test_the_build_backend_is_pinned_to_versions_that_read_pep_639_metadata() -> None:
    (requirement,) = (Requirement(r) for r in PYPROJECT["build-system"]["requires"])
    assert canonicalize_name(requirement.name) == "setuptools"
    spec: SpecifierSet = requirement.specifier
    assert not spec.contains("77.0.2") and spec.contains("77.0.3"), spec  # PEP 639: >= 77.0.3
    assert any(s.operator == "<" for s in spec), f"no upper bound: {spec}"


def test_the_licence_is_declared_the_pep_639_way_and_shipped() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "!LICENSE" in (ROOT / ".dockerignore").read_text().split()  # the wheel needs it


def test_the_changelog_has_a_section_for_this_version_with_upgrade_notes() -> None:
    version = PYPROJECT["project"]["version"]
    text = (ROOT / "CHANGELOG.md").read_text()
    section = text.split(f"## [{version}]", 1)
    assert len(section) == 2, f"CHANGELOG.md has no '## [{version}]' section"
    body = section[1].split("\n## ", 1)[0]
    assert "Upgrade notes" in body
    assert "manifests/crds" in body  # Helm never upgrades crds/: the notes must say so


def test_make_release_packages_the_chart_with_the_built_helm() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^release:", makefile, re.M)
    script = (ROOT / "tools/release.sh").read_text()
    assert "tools/setup.sh" in script and "helm package" in script
    for check in ("appVersion", "ARG VERSION", "CHANGELOG.md"):
        assert check in script, f"release.sh does not check {check}"

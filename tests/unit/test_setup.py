"""`make test` sets itself up as CI does (tools/setup.sh), and says what is missing in words.

Why it exists: a fresh clone's `make test` once ended with 7 errors because only .ci/run set up
the image's root filesystem; and a missing Go showed as "exit code 127" after minutes of
silence. These tests hold the wiring (CI = lint + `make test`, `make test` = setup + pytest) and
run the real script for the checks it makes before any build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "tools" / "setup.sh"


def _bin(tmp_path: Path, *, go: str | None = None) -> str:
    """A PATH with only what setup.sh calls before a build (and a fake ``go`` if given)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("date", "dirname"):
        found = shutil.which(tool)
        assert found, tool
        (folder / tool).symlink_to(found)
    if go is not None:
        (folder / "go").write_text(f"#!/bin/sh\necho {go}\n")
        (folder / "go").chmod(0o755)
    return str(folder)


def _setup(*steps: str, path: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C"}
    bash = shutil.which("bash")
    assert bash
    return subprocess.run([bash, str(SETUP), *steps], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_ci_installs_nothing_of_its_own_and_runs_make_test() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in commands and "make lint" in commands
    for own in ("build.sh", "rootfs.sh", "apt-get", "export VKP_"):
        assert not any(own in c for c in commands), f".ci/run does {own!r} itself"


def test_make_test_and_demo_set_up_through_setup_sh() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test", "demo"):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)
        assert recipe, f"no {target} target"
        assert "tools/setup.sh" in recipe.group(1), f"make {target} does not run tools/setup.sh"
    assert not re.search(r"build\.sh\S* >/dev/null", makefile), "a build's output is hidden"


def test_every_step_the_tests_need_is_a_default_step() -> None:
    """Every prebuilt thing the code reads from the environment (``VKP_<X>_BIN``, ``VKP_ROOTFS``,
    ``VKP_IMAGE_ARCHIVE``, ``VKP_GATEWAY_IMAGE_ARCHIVE``) is exported by a default step: a new
    one that only CI or a developer's shell set would leave a fresh clone's `make test`
    building it inside a test (or failing)."""
    script = SETUP.read_text()
    steps = re.search(r"^ALL=\((.*)\)$", script, re.M)
    assert steps
    assert steps.group(1).split() == ["system", "venv", "controlplane", "kubectl", "helm",
                                      "kueue", "node", "rootfs", "image", "gateway-image"]
    read = set()
    for tree in ("vkprovider", "tests"):
        for path in (ROOT / tree).rglob("*.py"):
            read |= set(re.findall(
                r'(?:environ(?:\.get\(|\[)|_archive\()"(VKP_(?:[A-Z]+_BIN|ROOTFS|[A-Z_]*IMAGE_ARCHIVE))"',
                path.read_text()))
    assert {"VKP_CONTROLPLANE_BIN", "VKP_NODE_BIN", "VKP_ROOTFS", "VKP_IMAGE_ARCHIVE",
            "VKP_GATEWAY_IMAGE_ARCHIVE"} <= read, read
    for var in sorted(read | {"VKP_HELM_BIN"}):
        assert f"emit {var} " in script, f"setup.sh does not export {var}"


def test_no_go_says_which_go_is_required(tmp_path: Path) -> None:
    done = _setup("controlplane", path=_bin(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "Go >= 1.26 is required" in done.stderr and done.stdout == ""


def test_an_old_go_says_which_go_is_required(tmp_path: Path) -> None:
    done = _setup("kueue", path=_bin(tmp_path, go="go1.24.3"))
    assert done.returncode == 1, done.stderr
    assert "Go >= 1.26 is required, this machine has go1.24.3" in done.stderr


def test_an_unknown_step_is_named(tmp_path: Path) -> None:
    done = _setup("controlplan", path=_bin(tmp_path))
    assert done.returncode == 1 and "unknown step 'controlplan'" in done.stderr

"""Fixtures for the image tests: the image's root filesystem, and a runner that executes
commands in it the way the Deployments run the container (tools/image/sandbox.sh).

Tests marked ``rootfs`` need that root filesystem. They are never skipped: without
``VKP_ROOTFS`` the fixture builds it (tools/image/rootfs.sh: root, mmdebstrap and the package
registries; ~1 min cold, ~2 s cached), and if it cannot, the tests fail with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from .imagespec import OCI_SH, ROOTFS_SH, SANDBOX_SH, parse_dockerfile

Run = Callable[..., subprocess.CompletedProcess[str]]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "rootfs: runs the image's root filesystem (tools/image/rootfs.sh builds it if "
        "VKP_ROOTFS is unset; needs root and mmdebstrap; fails, never skips, without them)",
    )


@pytest.fixture(scope="session")
def rootfs() -> Path:
    given = os.environ.get("VKP_ROOTFS")
    if given:
        path = Path(given)
        if not (path / "opt/vkprovider/bin/vkprovider").is_file():
            pytest.fail(f"VKP_ROOTFS={given} is not a root filesystem from tools/image/rootfs.sh")
        return path
    missing = [t for t in ("mmdebstrap", "unshare", "chroot", "setpriv") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        pytest.fail("the image's root filesystem is needed and cannot be built here: "
                    + ("not root; " if os.geteuid() != 0 else "")
                    + (f"missing {', '.join(missing)} (apt-get install -y mmdebstrap)"
                       if missing else "")
                    + f" (or point VKP_ROOTFS at one built by {ROOTFS_SH})")
    done = subprocess.run(["bash", str(ROOTFS_SH)], capture_output=True, text=True,
                          timeout=840, check=False)
    if done.returncode != 0:
        pytest.fail(f"{ROOTFS_SH} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def sandbox(rootfs: Path) -> Run:
    """``sandbox(argv, env=..., tmpfs=..., volumes=..., user=...)``: run ``argv`` in the rootfs.

    By default as the Dockerfile's USER, with exactly the Dockerfile's ENV (plus ``env``), the
    root read-only and a tmpfs at /tmp only (the Deployments' emptyDir, ``TMPDIR=/tmp``).
    """
    image = parse_dockerfile()
    uid, gid = image.user()

    def run(argv: Sequence[str], *, env: dict[str, str] | None = None,
            tmpfs: Sequence[str] = ("/tmp",), volumes: Sequence[str] = (),
            user: tuple[int, int] = (uid, gid), timeout: float = 60,
            ) -> subprocess.CompletedProcess[str]:
        cmd = ["bash", str(SANDBOX_SH), "-u", f"{user[0]}:{user[1]}"]
        for name, value in {**image.env(), **(env or {})}.items():
            cmd += ["-e", f"{name}={value}"]
        for path in tmpfs:
            cmd += ["-t", path]
        for volume in volumes:
            cmd += ["-v", volume]
        cmd += [str(rootfs), *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)

    return run


@pytest.fixture(scope="session")
def image_archive(rootfs: Path) -> Path:
    """The image as an OCI archive (tools/image/oci.sh, from ``rootfs``): ``VKP_IMAGE_ARCHIVE``
    if set, else built here (~10 s from a root filesystem, cached)."""
    given = os.environ.get("VKP_IMAGE_ARCHIVE")
    if given:
        if not Path(given).is_file():
            pytest.fail(f"VKP_IMAGE_ARCHIVE={given} is no file (tools/image/oci.sh builds one)")
        return Path(given)
    done = subprocess.run(["bash", str(OCI_SH)], capture_output=True, text=True, timeout=600,
                          check=False, env={**os.environ, "VKP_ROOTFS": str(rootfs)})
    if done.returncode != 0:
        pytest.fail(f"{OCI_SH} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])

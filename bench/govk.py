"""The upstream Go virtual-kubelet as a yardstick: build ``tools/govk`` and run it as a process.

``tools/govk`` is one virtual node on ``github.com/virtual-kubelet/virtual-kubelet`` v1.14.1's
``node/nodeutil`` with an in-memory provider that runs every pod at once. ``--lift-limits``
swaps the pod controller's work-queue rate limiters for unlimited ones and raises the client's
QPS/burst; without it the library's defaults stand. ``--cloud-url`` puts vkprovider's mock cloud
behind that provider: an instance rented per pod before it is Running, deleted with it
(``tools/govk/cloud.go``), so both nodes make the same cloud calls.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vkprovider.testing.cluster import REPO_ROOT, Component

BUILD_SCRIPT = REPO_ROOT / "tools" / "govk" / "build.sh"
# The taint our provider puts on its node, so the same pods (same toleration) go to either.
TAINT = "virtual-kubelet.io/provider=vkprovider:NoSchedule"


def govk_binary() -> Path:
    """``VKP_GOVK_BIN`` (a folder holding ``govk``), else ``tools/govk/build.sh`` (cached)."""
    env = os.environ.get("VKP_GOVK_BIN")
    if env:
        folder = Path(env)
    else:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.PIPE,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{BUILD_SCRIPT} failed with exit code {done.returncode}")
        folder = Path(done.stdout.strip().splitlines()[-1])
    binary = folder / "govk"
    if not binary.is_file():
        raise RuntimeError(f"{folder} has no govk binary")
    return binary


def govk_argv(*, binary: Path, kubeconfig: Path, node: str, lift_limits: bool,
              workers: int, cloud_url: str | None = None) -> list[str]:
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--node-name={node}", f"--taint={TAINT}",
            f"--workers={workers}", *(["--lift-limits"] if lift_limits else []),
            *([f"--cloud-url={cloud_url}"] if cloud_url else [])]


class GoVKProcess:
    """One ``govk`` process (one virtual node), its log in ``work_dir``."""

    def __init__(self, *, binary: Path, work_dir: Path, kubeconfig: Path, node: str,
                 lift_limits: bool, workers: int, cloud_url: str | None = None) -> None:
        self.node = node
        self.component = Component(
            name=f"govk-{node}",
            argv=govk_argv(binary=binary, kubeconfig=kubeconfig, node=node,
                           lift_limits=lift_limits, workers=workers, cloud_url=cloud_url),
            log_path=work_dir / f"govk-{node}.log")

    def start(self) -> None:
        self.component.start()

    def alive(self) -> bool:
        return self.component.alive()

    def stop(self) -> None:
        self.component.stop()

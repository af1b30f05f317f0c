"""A real HAProxy process for tests: the gateway (vkprovider/gateway/) standing as its pod.

Why it exists: the gateway's unit and e2e tests program a real HAProxy through its Runtime API
(a fake would prove nothing about HAProxy's grammar, TLS origination or header rewriting). This
renders the gateway's configuration for a block of free loopback ports, runs ``haproxy -db`` in
the foreground and waits for its Runtime API socket; :meth:`HAProxyProcess.restart` kills it and
starts a fresh one (empty memory), as a restarted gateway pod. HAProxy comes from Debian's
``haproxy`` package (tools/setup.sh, ``system`` step).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

from vkprovider.gateway.haproxycfg import GatewayLayout, RuntimeTLS, write
from vkprovider.gateway.runtime import RuntimeClient, RuntimeUnavailable
from vkprovider.testing import workers

__all__ = ["HAProxyProcess", "free_port_block"]


def free_port_block(count: int, *, low: int = 20000, high: int = 32000) -> int:
    """The first of ``count`` consecutive loopback ports free now (below the ephemeral range,
    at a random place so parallel test runs do not collide, in this pytest-xdist worker's
    slice of the range)."""
    low, high = workers.port_range(low=low, high=high)
    for _ in range(200):
        first = random.randrange(low, high - count)
        for port in range(first, first + count):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    break
        else:
            return first
    raise RuntimeError(f"no {count} consecutive free ports in {low}..{high}")


class HAProxyProcess:
    """``haproxy -db`` with the gateway's configuration, in ``work_dir``."""

    def __init__(self, *, work_dir: Path, ca_file: Path, count: int = 4,
                 auth_headers: tuple[str, ...] = ("Salad-Api-Key",),
                 runtime_tls: RuntimeTLS | None = None, health_bind: str | None = None
                 ) -> None:
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(binary).exists():
            raise RuntimeError("haproxy is not installed: run 'bash tools/setup.sh system'")
        self.binary = binary
        work_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir = work_dir
        self.layout = GatewayLayout(
            bind_host="127.0.0.1", first_port=free_port_block(count), count=count,
            socket=work_dir / "runtime.sock", ca_file=ca_file, map_dir=work_dir / "maps",
            auth_headers=auth_headers, runtime_tls=runtime_tls, health_bind=health_bind)
        self.config = work_dir / "haproxy.cfg"
        write(self.layout, self.config)
        self.client = RuntimeClient(address=str(self.layout.socket))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = work_dir / "haproxy.log"
        self.starts = 0

    async def start(self) -> None:
        self.layout.socket.unlink(missing_ok=True)
        self.starts += 1
        self.proc = self._spawn()
        deadline = time.monotonic() + 30
        while True:
            try:
                await self.client.info()
                return
            except RuntimeUnavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("haproxy did not start:\n"
                                       + self.log_path.read_text(errors="replace")[-3000:]
                                       ) from None
                await asyncio.sleep(0.05)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            return subprocess.Popen([self.binary, "-db", "-f", str(self.config)],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    async def restart(self) -> None:
        """A gateway pod replaced: the new HAProxy knows no server and no map entry."""
        self.stop()
        await self.start()

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

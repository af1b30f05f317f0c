"""docs/quickstart.md, run as written: its shell blocks, in order, as a new user runs them.

Why it exists: a quickstart that drifts from the code fails the first person who tries it. This
test reads the page's ```bash blocks and runs them with the real kubectl against what the page's
own ``vkprovider dev up`` starts: nothing is translated, rewritten or started by the test.

The page says which terminal a block belongs to with an HTML comment before it (invisible when
rendered):

* ``<!-- quickstart-test: skip: WHY -->``: not run here; WHY names what covers it.
* ``<!-- quickstart-test: terminal 1, runs until Ctrl-C, ready when a line matches "RE" -->``:
  the block runs in its own shell (the first terminal) and keeps running; the page goes on once a
  line of its output matches ``RE``. The next such block first sends the one running a SIGINT to
  its process group (Ctrl-C), as does the end of the page; it must then exit 0 with every process
  it started gone and its kubeconfig removed.
* any other ``bash`` block runs in one persistent bash (the second terminal: ``export`` and
  background jobs carry over from block to block), with ``set -e``: a failing command fails.

The blocks run in a fresh directory holding symlinks to the checkout's ``.venv`` and
``manifests``, so what the page writes (``dev.kubeconfig``, ``vk.yaml``, ``vk.log``; a user's
checkout ignores them through .gitignore) stays out of the checkout, and without
``KUBECONFIG`` in the environment (the page must set it). On top of
the exit statuses the test checks what the page promises, after the blocks that promise it: the
nodes, the GPUProvider's columns read with a server-side Table request (``kubectl get gpup``'s
own request), cloud pods and their logs, where the provider listens, and the mock cloud's
start-up line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from vkprovider.kube.auth import BearerAuth, load_credentials
from vkprovider.testing.cluster import REPO_ROOT
from vkprovider.testing.waiting import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster, pytest.mark.timeout(600)]

PAGE = REPO_ROOT / "docs" / "quickstart.md"
DIRECTIVE = re.compile(r"^<!--\s*quickstart-test:\s*(?P<body>.*?)\s*-->$")
BACKGROUND = re.compile(r'^terminal 1, runs until Ctrl-C, ready when a line matches "(?P<re>.+)"$')
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
BLOCK_TIMEOUT = 240.0


@dataclass
class Block:
    line: int  # where it starts on the page (for messages)
    lang: str
    text: str
    directive: str | None


def blocks(page: str) -> list[Block]:
    """The page's fenced code blocks, each with the quickstart-test comment just before it."""
    out: list[Block] = []
    lines = page.splitlines()
    i = 0
    previous = ""
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        match = DIRECTIVE.match(previous)
        out.append(Block(line=start + 1, lang=fence.group(1), text="\n".join(body) + "\n",
                         directive=match.group("body") if match else None))
        previous = ""
        i += 1
    return out


# ---- the two terminals ---------------------------------------------------------------------------


class _Lines:
    """Lines of a process's merged stdout/stderr, read by a thread, kept and queued."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self.queue: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stream = proc.stdout

        def pump() -> None:
            for line in stream:
                self.seen.append(line.rstrip("\n"))
                self.queue.put(line.rstrip("\n"))
            self.queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def text(self) -> str:
        return "\n".join(self.seen)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc), to prove they are gone after a Ctrl-C."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class FirstTerminal:
    """A block that runs until Ctrl-C, in its own session (so the SIGINT reaches only it)."""

    def __init__(self, *, block: Block, cwd: Path, env: dict[str, str]) -> None:
        self.block = block
        self.proc = subprocess.Popen(["bash", "-c", block.text], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.out = _Lines(self.proc)

    def wait_ready(self, pattern: str, *, timeout: float = BLOCK_TIMEOUT) -> None:
        ready = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.out.queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None:
                pytest.fail(f"page line {self.block.line}: exited with {self.proc.wait()} before "
                            f"it was ready:\n{self.out.text()}")
            if line and ready.search(line):
                return
            if time.monotonic() > deadline:
                pytest.fail(f"page line {self.block.line}: not ready after {timeout:.0f}s:\n"
                            f"{self.out.text()}")

    def ctrl_c(self, *, timeout: float = 60.0) -> None:
        """SIGINT to its process group, as Ctrl-C does; it must stop everything it started."""
        started = _descendants(self.proc.pid)
        assert started, "it started no process"
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()  # ends what is left
            pytest.fail(f"page line {self.block.line}: still running {timeout:.0f}s after Ctrl-C:"
                        f"\n{self.out.text()}")
        time.sleep(0.2)  # the reader drains the pipe
        assert code == 0, f"exit status {code} after Ctrl-C:\n{self.out.text()}"
        left = sorted(pid for pid in started if _alive(pid))
        assert not left, f"still running after Ctrl-C: {left}"
        assert self.out.seen[-1] == "stopped; nothing left running.", self.out.text()

    def kill(self) -> None:
        """After a failure: Ctrl-C first (dev up stops what it started), then SIGKILL whatever
        is left, each process group (dev up starts every process in its own session)."""
        started = _descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        for pid in [self.proc.pid, *sorted(started)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


class SecondTerminal:
    """One bash for every other block: exports and background jobs carry over, as in a terminal.

    Each block is sourced (with ``set -e`` and stdin from /dev/null); a failing command ends the
    shell, which fails the test with the block's output.
    """

    def __init__(self, *, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env,
                                     text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.out = _Lines(self.proc)
        self.count = 0

    def run(self, block: Block, *, timeout: float = BLOCK_TIMEOUT) -> str:
        self.count += 1
        script = self.cwd / f".block-{self.count}.sh"
        script.write_text(block.text)
        return self.send(f"set -e\nsource {script} < /dev/null\n", what=f"page line {block.line}",
                         timeout=timeout)

    def send(self, commands: str, *, what: str, timeout: float = BLOCK_TIMEOUT) -> str:
        marker = f"@@done-{uuid.uuid4().hex}"
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{commands}echo {marker}\n")
        self.proc.stdin.flush()
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.out.queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None:
                pytest.fail(f"{what}: a command failed (the shell exited with "
                            f"{self.proc.wait()}):\n" + "\n".join(got))
            if line == marker:
                return "\n".join(got)
            if line:
                got.append(line)
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not done after {timeout:.0f}s:\n" + "\n".join(got))

    def env(self, name: str) -> str:
        return self.send(f'printf "%s\\n" "${{{name}:-}}"\n', what=f"${name}").strip()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # the shell and its background jobs
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


# ---- what the page promises ----------------------------------------------------------------------


def table(kubeconfig: str, path: str) -> dict[str, dict[str, Any]]:
    """GET ``path`` as a server-side Table (what kubectl get prints): {name: {column: cell}}."""

    async def get() -> dict[str, Any]:
        creds = load_credentials(kubeconfig=kubeconfig)
        async with httpx.AsyncClient(base_url=creds.host, verify=creds.ssl_context,
                                     auth=BearerAuth(creds), timeout=10) as http:
            resp = await http.get(path, headers={"Accept": TABLE})
            resp.raise_for_status()
            body: dict[str, Any] = resp.json()
            return body

    body = asyncio.run(get())
    assert body["kind"] == "Table", body
    names = [c["name"] for c in body["columnDefinitions"]]
    return {row["object"]["metadata"]["name"]: dict(zip(names, row["cells"], strict=True))
            for row in body["rows"]}


def until_table(kubeconfig: str, path: str, *, what: str,
                until: Callable[[dict[str, dict[str, Any]]], bool]) -> dict[str, dict[str, Any]]:
    async def probe() -> dict[str, dict[str, Any]]:
        return await asyncio.to_thread(table, kubeconfig, path)

    return asyncio.run(eventually(probe, until=until, timeout=60, interval=0.5, what=what))


GPUP = "/apis/vkprovider.io/v1alpha1/gpuproviders"
OFP = "/apis/vkprovider.io/v1alpha1/overflowpolicies"
NODE = "vk-gpu-burst"


@dataclass
class Run:
    """What the page's run has shown so far, for the checks."""

    workdir: Path
    second: SecondTerminal
    first: FirstTerminal | None = None
    dev_ups: int = 0

    def kubeconfig(self) -> str:
        return self.second.env("KUBECONFIG")


def check_after(block: Block, output: str, run: Run) -> None:
    """The page's promises about the block just run (matched by its text)."""
    text = block.text
    if "kubectl get nodes" in text:
        for name in ("gpu-node-0", "gpu-node-1", NODE):
            assert re.search(rf"^{name}\s+Ready\b", output, re.M), output
        # dev up printed the export line the page uses
        path = Path(run.kubeconfig()).resolve()
        assert path == (run.workdir / "dev.kubeconfig").resolve()
        assert run.first is not None
        assert f"    export KUBECONFIG={path}" in run.first.out.seen, run.first.out.text()
        columns = table(str(path), GPUP)["mock"]
        assert columns["Health"] == "Healthy" and columns["Instances"] == 0, columns
        assert re.search(r"^gpuprovider\.vkprovider\.io/mock\s+mock\s+Healthy\s+0\s", output,
                         re.M), output
    if "rollout status deployment/llm --timeout=120s" in text:
        assert len(re.findall(rf"\bRunning\b.*\s{NODE}\s", output)) == 2, output
        assert len(re.findall(r"\bRunning\b.*\sgpu-node-\d\s", output)) == 8, output
    if "kubectl -n dev logs" in text:
        assert "[mock] started" in output, output
        rows = until_table(run.kubeconfig(), GPUP, what="gpup mock: Healthy, 2 instances",
                           until=lambda t: t["mock"]["Instances"] == 2)
        assert rows["mock"]["Health"] == "Healthy" and rows["mock"]["$/h"] > 0, rows
        policies = until_table(run.kubeconfig(), OFP, what="ofp dev-mock: 2 pods",
                               until=lambda t: t["dev-mock"]["Pods"] == 2)
        assert policies["dev-mock"]["GPUs"] == 2, policies
    if "OverflowAdmitted" in text:
        assert len(re.findall(r"\bOverflowAdmitted\b", output)) >= 2, output
    if "--replicas=8" in text:  # home, make-before-break: 8 inside, no instance left
        assert "MovedBack" in output, output
        # "All eight replicas run inside again" holds when the block ends, not a while later:
        # the page's own wait covers the cloud pods' Terminating seconds
        pods = table(run.kubeconfig(), "/api/v1/namespaces/dev/pods")
        assert len(pods) == 8 and all(r["Node"].startswith("gpu-node-") and
                                      r["Status"] == "Running" for r in pods.values()), pods
        until_table(run.kubeconfig(), GPUP, what="gpup mock: 0 instances",
                    until=lambda t: t["mock"]["Instances"] == 0)
    if "dev curl dev/web/" in text:  # the try-it: cloud replicas, published ports, an answer
        rows = [line.split() for line in output.splitlines() if line.startswith("web-")]
        assert len(rows) == 2, output
        # IP <none>, 8000 at 198.18.x.y:30000 and up (198.19.x.y on the second xdist worker:
        # its share of 198.18.0.0/15, vkprovider.testing.workers)
        for _, node, ip, published in rows:
            assert (node, ip) == (NODE, "<none>"), output
            assert re.fullmatch(r"8000/TCP=198\.1[89]\.\d+\.\d+:3\d{4}", published), output
        said = re.search(r"^200 from (198\.1[89]\.\d+\.\d+:3\d{4}) \(via 127\.0\.0\.1:\d+\)$",
                         output, re.M)
        assert said, output
        assert re.search(r'"pod": "web-[a-z0-9]+-[a-z0-9]+"', output), output
    if "vkprovider run --config vk.yaml" in text:
        assert ("mock cloud listening on http://127.0.0.1:18080, selling 16 H100 in us-east at "
                "$2.49/GPU-h; no API key needed") in output, output
        log = (run.workdir / "vk.log").read_text()
        for address in ("127.0.0.1:10350", "127.0.0.1:19464"):  # loopback only, as documented
            assert f"address={address}" in log or f'"address": "{address}"' in log, log
        assert "0.0.0.0" not in log, log
    if "kubectl logs llm" in text:
        assert "vkprovider.io/instance-id" in output and "[mock] started" in output, output
        # describe shows Started; ProviderCreated only for a slow boot or verbose events
        assert re.search(r"Normal\s+Started\s", output), output
        assert "ProviderCreated" not in output, output


def check_stopped(run: Run) -> None:
    """After a Ctrl-C of dev up: its kubeconfig is gone too."""
    assert not (run.workdir / "dev.kubeconfig").exists()


def kubectl_dir() -> str:
    """The folder of tools/kubectl's build (``$VKP_KUBECTL_BIN`` when set)."""
    given = os.environ.get("VKP_KUBECTL_BIN")
    if given:
        return given
    built = subprocess.run(["bash", str(REPO_ROOT / "tools" / "kubectl" / "build.sh")],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, f"tools/kubectl/build.sh failed:\n{built.stderr[-2000:]}"
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    for name in (".venv", "manifests"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    yield tmp_path


def test_every_shell_block_of_the_quickstart_runs_as_written(workdir: Path) -> None:
    assert (REPO_ROOT / ".venv" / "bin" / "vkprovider").exists(), "make venv first"
    page = PAGE.read_text()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    # The real kubectl of the control plane's version, built from its Go module
    # (tools/kubectl/build.sh; cached): never skipped for want of one on the machine.
    env["PATH"] = f"{kubectl_dir()}{os.pathsep}{env.get('PATH', '')}"
    run = Run(workdir=workdir, second=SecondTerminal(cwd=workdir, env=env))
    ran = 0
    try:
        for block in blocks(page):
            if block.lang != "bash":
                continue
            if block.directive and block.directive.startswith("skip:"):
                continue
            if block.directive:
                background = BACKGROUND.match(block.directive)
                assert background, f"page line {block.line}: unknown directive {block.directive!r}"
                if run.first is not None:
                    run.first.ctrl_c()
                    check_stopped(run)
                run.first = FirstTerminal(block=block, cwd=workdir, env=env)
                run.first.wait_ready(background.group("re"))
                run.dev_ups += 1
            else:
                output = run.second.run(block)
                check_after(block, output, run)
            ran += 1
        assert run.first is not None, "the page never starts dev up"
        run.first.ctrl_c()
        check_stopped(run)
        run.first = None
    finally:
        if run.first is not None:
            run.first.kill()
        run.second.close()
    assert run.dev_ups == 2 and ran >= 9, (run.dev_ups, ran)

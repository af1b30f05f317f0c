"""``vkprovider dev up --real-node``, run as a user runs it, and Ctrl-C leaving nothing behind.

Why it exists: ``dev up --real-node`` joins a real worker node (:mod:`vkprovider.testing.realnode`)
to its local control plane so a user can ``kubectl run`` a real container beside the virtual
node. This runs the command as a subprocess (its own session, as in a terminal), waits for it
to say it is ready, runs the ``kubectl run`` it prints (busybox, from the image archive imported
offline into the node's containerd), then sends Ctrl-C and checks that nothing of the node is
left on the machine: no process (the tree of ``dev up``, the node's containers by their cgroups,
containerd's shims by the node's folder), no mount, no network namespace, no link or route to
the node's pods, no iptables rule for them on the host. Each of those is first seen to exist
while the node is up, so the check after Ctrl-C cannot pass by looking in the wrong place.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vkprovider.devenv import REAL_NODE, real_pod_command
from vkprovider.testing.realnode import find_kubectl

from .test_quickstart import Block, FirstTerminal

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide, pytest.mark.timeout(600)]

READY = r"^\[ *[0-9.]+s\] ready$"
NODE_LINE = re.compile(r"real node (?P<name>\S+) Ready in [0-9.]+s: network namespace "
                       r"(?P<netns>\S+) \(link (?P<link>\S+), pods (?P<pods>\S+)\), cgroups "
                       r"under (?P<cgroups>\S+), its files in (?P<files>[^;]+);")


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120,
                          env=env)


def node_processes(*, files: str, cgroups: str) -> set[int]:
    """Processes in the node's cgroups (its containers) or naming its folder (kubelet,
    containerd, its shims)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if files in cmdline or f"{cgroups}/" in cgroup or cgroup.rstrip().endswith(cgroups):
            found.add(int(entry.name))
    return found


def traces(node: dict[str, str]) -> dict[str, list[str]]:
    """What of the node the host shows: each kind of trace, the lines that name the node."""
    marks = (node["netns"], node["link"], node["pods"], node["files"])
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if any(m in line for m in marks)]
    rules = [line for table in ("nat", "filter")
             for line in run(["iptables-save", "-t", table]).stdout.splitlines()
             if any(m in line for m in marks)]
    return {
        "processes": [str(p) for p in sorted(node_processes(files=node["files"],
                                                            cgroups=node["cgroups"]))],
        "mounts": mounts,
        "network namespaces": [n for n in run(["ip", "netns", "list"]).stdout.splitlines()
                               if n.split()[0] == node["netns"]],
        "links": [line for line in run(["ip", "-o", "link", "show"]).stdout.splitlines()
                  if f" {node['link']}@" in line or f" {node['link']}:" in line],
        "routes": [line for line in run(["ip", "-4", "route", "show"]).stdout.splitlines()
                   if line.startswith(node["pods"])],
        "host iptables rules": rules,
        "cgroups": [str(p) for p in (Path("/sys/fs/cgroup"),
                                     *Path("/sys/fs/cgroup").iterdir())
                    if (p / node["cgroups"].lstrip("/")).is_dir()],
        "files": [node["files"]] if Path(node["files"]).exists() else [],
    }


def test_dev_up_real_node_runs_a_real_pod_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "dev.kubeconfig"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PATH"] = f"{find_kubectl().parent}{os.pathsep}{env.get('PATH', '')}"
    argv = [sys.executable, "-m", "vkprovider", "dev", "up", "--real-node",
                  "--gpu-nodes=1", f"--kubeconfig-out={kubeconfig}"]
    up = FirstTerminal(block=Block(line=0, lang="bash", text=" ".join(argv),
                                   directive=None), cwd=tmp_path, env=env)
    try:
        up.wait_ready(READY)
        up.wait_ready(r"^Ctrl-C stops everything\.$")  # what to try is printed in full
        text = up.out.text()
        found = NODE_LINE.search(text)
        assert found, text
        node = found.groupdict()
        assert node["name"] == REAL_NODE
        # what dev up prints for a real pod, run as printed
        shell = {**env, "KUBECONFIG": str(kubeconfig)}
        command = real_pod_command()
        assert f"    {command}" in text, text
        made = run(["bash", "-c", command], env=shell)
        assert made.returncode == 0, made.stderr
        waited = run(["kubectl", "wait", "--for=condition=Ready", "pod/hello", "--timeout=90s"],
                     env=shell)
        assert waited.returncode == 0, waited.stdout + waited.stderr + up.out.text()
        where = run(["kubectl", "get", "pod", "hello", "-o",
                     "jsonpath={.spec.nodeName} {.status.containerStatuses[0].containerID}"],
                    env=shell)
        name, container = where.stdout.split()
        assert name == REAL_NODE and container.startswith("containerd://"), where.stdout
        ready = run(["kubectl", "get", "node", REAL_NODE, "-o",
                     "jsonpath={.status.conditions[?(@.type=='Ready')].status}"], env=shell)
        assert ready.stdout == "True", ready
        inside = run(["kubectl", "exec", "hello", "--", "uname", "-n"], env=shell)
        assert inside.stdout.strip() == "hello", inside
        while_up = traces(node)
        # every kind of trace is seen while the node runs (host iptables rules excepted: the
        # node keeps its rules in its own namespace, so the host has none even now)
        assert all(while_up[kind] for kind in while_up if kind != "host iptables rules"), \
            while_up
        assert while_up["host iptables rules"] == [], while_up
        up.ctrl_c()  # exit 0, every process of its tree gone, "stopped; nothing left running."
    except BaseException:
        up.kill()
        raise
    after = traces(node)
    assert after == {kind: [] for kind in after}, after
    assert not kubeconfig.exists()

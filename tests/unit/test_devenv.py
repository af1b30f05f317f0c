"""``vkprovider dev up`` without a cluster, and the two small changes that came with it.

What tests/e2e/test_quickstart.py (which runs ``dev up`` for real) cannot pin cheaply: what
``dev up`` prints is what docs/quickstart.md runs (and its example Deployment is the page's), its
flags and their one-line errors, a failed start that leaves nothing behind, a process that dies
while up. Also here: where the kubelet API and ``/metrics`` listen by default
(``kubelet_api.bind_address``), and the mock cloud's start-up line.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from providers.mock.server import InventoryOffer, MockCloudState, serve, startup_line
from vkprovider import cli
from vkprovider.api import listen_address
from vkprovider.config import Settings, load_settings
from vkprovider.devenv import (
    DEFAULT_INVENTORY,
    NODE,
    REAL_NODE,
    DevEnv,
    DevEnvError,
    DevOptions,
    example_deployment,
    offers,
    real_pod_command,
    run_dev_up,
    shown_path,
    try_it,
    write_private,
)
from vkprovider.storyreport import Narrator
from vkprovider.testing import realnode, workers
from vkprovider.testing.cluster import REPO_ROOT, Component
from vkprovider.testing.harness import MockCloudProcess

PAGE = (REPO_ROOT / "docs" / "quickstart.md").read_text()


def printed_commands(text: str) -> list[str]:
    """The commands of ``try_it``'s text (indented lines), without their trailing comments."""
    return [line.strip().split("   #")[0].strip() for line in text.splitlines()
            if line.startswith("    ")]


# ---- what dev up prints is what the quickstart runs --------------------------------------------


def test_every_command_dev_up_prints_is_on_the_quickstart_page_in_the_same_order() -> None:
    text = try_it(kubeconfig="/somewhere/dev.kubeconfig", options=DevOptions(),
                  deployment="/tmp/vkp-cluster-x/try/llm-deployment.yaml",
                  policy="manifests/examples/overflowpolicy-dev-mock.yaml")
    commands = printed_commands(text)
    assert commands[0] == "export KUBECONFIG=/somewhere/dev.kubeconfig"
    # the page applies the same Deployment from a heredoc, and exports its own path
    shared = [c for c in commands[1:] if "llm-deployment.yaml" not in c]
    assert len(shared) == len(commands) - 2
    where = -1
    for command in shared:
        found = PAGE.find(f"\n{command}\n", where + 1)
        assert found > where, f"not on the page (after the previous one): {command}"
        where = found
    assert "Ctrl-C stops everything." in text


def test_the_pages_deployment_is_the_one_dev_up_writes() -> None:
    heredocs = re.findall(r"kubectl apply -f - <<'YAML'\n(.*?)\nYAML\n", PAGE, re.S)
    deployments = [d for h in heredocs for d in yaml.safe_load_all(h)
                   if d["kind"] == "Deployment" and d["metadata"]["name"] == "llm"]
    assert deployments == [yaml.safe_load(example_deployment(replicas=10))]
    # 10 replicas on the default 2 x 4 internal GPUs: two burst
    assert DevOptions().gpu_nodes * DevOptions().gpus_per_node == 8


def test_the_numbers_follow_the_flags_and_cluster_only_offers_no_cloud() -> None:
    text = try_it(kubeconfig="k", options=DevOptions(gpu_nodes=1, gpus_per_node=2),
                  deployment="d.yaml", policy="p.yaml")
    assert "kubectl apply -f d.yaml   # 4 x 1 GPU; 2 fit inside" in text
    assert "kubectl -n dev scale deployment llm --replicas=2" in text
    assert f"--field-selector spec.nodeName={NODE}" in text
    only = try_it(kubeconfig="k", options=DevOptions(cluster_only=True), deployment="d.yaml",
                  policy="p.yaml")
    assert printed_commands(only) == ["export KUBECONFIG=k", "kubectl get nodes"]
    assert "--cluster-only" in only and "gpup" not in only


def test_the_clouds_offers_read_as_the_mock_cloud_says_them() -> None:
    assert offers(DEFAULT_INVENTORY) == ("8 H100 in us-east at $2.49/GPU-h, 8 H100 in eu-west at "
                                         "$2.19/GPU-h, 8 A100 in us-east at $1.29/GPU-h")


def test_paths_are_shown_relative_below_the_working_directory(tmp_path: Path) -> None:
    assert shown_path(tmp_path / "a" / "b.yaml", cwd=tmp_path) == "a/b.yaml"
    assert shown_path(Path("/etc/hosts"), cwd=tmp_path) == "/etc/hosts"


def test_the_kubeconfig_copy_is_private_and_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dev.kubeconfig"
    write_private(path=path, text="one")
    write_private(path=path, text="two")
    assert path.read_text() == "two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["dev.kubeconfig"]


# ---- flags --------------------------------------------------------------------------------------


def test_dev_up_flags() -> None:
    args = cli.build_parser().parse_args(["dev", "up", "--cluster-only", "--kubeconfig-out",
                                          "x.kubeconfig", "--gpu-nodes", "0", "--gpus", "2"])
    assert (args.cluster_only, args.kubeconfig_out, args.gpu_nodes, args.gpus) == \
        (True, "x.kubeconfig", 0, 2)
    args = cli.build_parser().parse_args(["dev", "up"])
    assert (args.cluster_only, args.kubeconfig_out, args.inventory) == (False, None, None)
    assert cli.parse_inventory(DEFAULT_INVENTORY)


@pytest.mark.parametrize(("argv", "words"), [
    (["dev", "up", "--inventory", "H100:us-east:lots:2"], ["--inventory", "'H100:us-east:lots:2'"]),
    (["dev", "up", "--kubeconfig-out", "."], ["--kubeconfig-out", "directory"]),
    (["dev", "up", "--gpus", "0"], ["--gpus", "less than 1"]),
])
def test_bad_dev_up_flags_are_one_line_before_anything_starts(
        argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with contextlib.suppress(SystemExit):
        assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_real_node_flag_and_the_real_pod_it_offers() -> None:
    assert cli.build_parser().parse_args(["dev", "up", "--real-node"]).real_node is True
    assert cli.build_parser().parse_args(["dev", "up"]).real_node is False
    plain = try_it(kubeconfig="k", options=DevOptions(), deployment="d.yaml", policy="p.yaml")
    assert "kubectl run" not in plain
    text = try_it(kubeconfig="k", options=DevOptions(real_node=True, cluster_only=True),
                  deployment="d.yaml", policy="p.yaml")
    assert printed_commands(text) == [
        "export KUBECONFIG=k", "kubectl get nodes", real_pod_command(),
        "kubectl wait --for=condition=Ready pod/hello --timeout=60s",
        "kubectl exec hello -- uname -n", "kubectl delete pod hello --wait=false"]
    # the imported image, never pulled, on the real node by name
    assert f"--image={realnode.BUSYBOX_IMAGE} --image-pull-policy=Never" in real_pod_command()
    assert f'"nodeName": "{REAL_NODE}"' in real_pod_command()


@pytest.mark.parametrize(("root", "words"), [
    (False, ["needs root", "sudo"]),
    (True, ["lacks kubelet, kube-proxy, pause"]),
])
async def test_dev_up_real_node_without_root_or_a_piece_is_one_line_before_anything_starts(
        root: bool, words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 0 if root else 1000)
    monkeypatch.setattr(realnode, "_missing_host_tools", lambda: [])
    monkeypatch.setenv("VKP_NODE_BIN", str(tmp_path))  # an empty folder: no node binaries
    code = await run_dev_up(options=DevOptions(real_node=True), signals=())
    assert code == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("vkprovider dev up: error: --real-node: ")
    assert captured.err.count("\n") == 1, captured.err
    for word in words:
        assert word in captured.err, captured.err
    assert "control plane" not in captured.out  # nothing started
    assert captured.out.splitlines()[-1] == "stopped; nothing left running."


# ---- a start that fails, a process that dies ----------------------------------------------------


async def test_a_failed_start_says_why_leaves_nothing_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VKP_CONTROLPLANE_BIN", str(tmp_path / "no-binaries"))
    (tmp_path / "no-binaries").mkdir()
    out = tmp_path / "dev.kubeconfig"
    out.write_text("stale")  # from an earlier run: removed, never left pointing nowhere
    code = await run_dev_up(options=DevOptions(kubeconfig_out=out), signals=())
    assert code == 1
    captured = capsys.readouterr()
    assert "lacks etcd" in captured.err and captured.err.startswith("vkprovider dev up: error:")
    assert captured.out.splitlines()[-1] == "stopped; nothing left running."
    assert not out.exists()


def died(comp: Component, *, last_words: str) -> None:
    """``comp`` as a process that logged ``last_words`` and exited with status 3."""
    comp.log_path.write_text(f"{last_words}\n")
    comp.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    comp.process.wait()


@pytest.mark.parametrize("which", ["mock cloud", "real node's kubelet"])
def test_a_process_that_dies_while_up_is_reported_with_its_log(which: str,
                                                                tmp_path: Path) -> None:
    env = DevEnv(options=DevOptions(real_node=which != "mock cloud"),
                 narrator=Narrator(quiet=True))
    node = None
    try:
        if which == "mock cloud":
            cloud = env.cloud = MockCloudProcess(work_dir=tmp_path, name="mock")
            comp, name = cloud.component, "mock-cloud-mock"
        else:
            node = env.node = realnode.RealNode(cluster=env.cluster, name=REAL_NODE)  # not started
            comp = node.components["kubelet"] = Component(
                name="node-kubelet", argv=["kubelet"], log_path=tmp_path / "kubelet.log")
            name = f"{REAL_NODE}'s node-kubelet"
        died(comp, last_words="boom: the last words")
        with pytest.raises(DevEnvError, match=rf"{re.escape(name)} exited with status 3"
                                              r"(?s:.*)boom: the last words"):
            env.check()
    finally:
        env.stop()
    assert not env.work.exists()
    assert node is None or not node.work_dir.exists()


# ---- the lab network: one address map for the fake kubelet, the mock cloud and the provider ----


def test_every_process_that_serves_or_dials_a_replica_shares_the_clusters_address_map(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (workers.WORKER_VAR, workers.COUNT_VAR):  # as a user runs it, not an xdist worker
        monkeypatch.delenv(var, raising=False)
    env = DevEnv(options=DevOptions(), narrator=Narrator(quiet=True))
    try:
        network = env.cluster.address_map_dir
        assert env.network == network and network.parent == env.work
        started: list[list[str]] = []
        monkeypatch.setattr(env.cluster, "start_component",
                            lambda *, name, argv: started.append(argv))
        env._start_fake_kubelet()
        (kubelet,) = started
        assert f"--address-map-dir={network}" in kubelet

        argv = env.cloud_process(index=0).component.argv
        assert argv[argv.index("--address-map-dir") + 1] == str(network)
        assert argv[argv.index("--name") + 1] == "mock"
        assert argv[argv.index("--public-block") + 1] == "0"
        other = env.cloud_process(index=1).component.argv  # a second cloud: its own block
        assert other[other.index("--public-block") + 1] == "1"

        monkeypatch.setattr(env.cluster, "ca_path", env.work / "pki" / "ca.crt", raising=False)
        provider = env.provider_process(kubeconfig=env.work / "provider.kubeconfig")
        config = load_settings(provider.config_path)
        assert config.pods.probe_address_map == str(network)
        assert config.node.name == NODE and config.node.internal_ip == "127.0.0.1"
    finally:
        env.stop()


async def test_dev_up_says_where_the_address_map_is(monkeypatch: pytest.MonkeyPatch) -> None:
    env = DevEnv(options=DevOptions(cluster_only=True, gpu_nodes=0), narrator=Narrator())

    def no_client() -> None:
        raise DevEnvError("stop here")  # the line is said before the first API call

    said: list[str] = []
    monkeypatch.setattr(env.cluster, "start", lambda: asyncio.sleep(0))
    monkeypatch.setattr(env, "_start_fake_kubelet", lambda: None)
    monkeypatch.setattr(env.cluster, "client", no_client)
    monkeypatch.setattr(env.n, "say", said.append)
    try:
        with pytest.raises(DevEnvError, match="stop here"):
            await env.start()
    finally:
        env.stop()
    line = next(s for s in said if "address map" in s)
    assert str(env.network) in line and f"export VKP_ADDRESS_MAP={env.network}" in line


# ---- kubelet_api.bind_address -------------------------------------------------------------------


@pytest.mark.parametrize(("bind_address", "internal_ip", "listens"), [
    ("", "127.0.0.1", "127.0.0.1"),  # the quickstart: loopback only
    ("", "127.0.0.2", "127.0.0.2"),
    ("", "::1", "::1"),
    ("", "10.244.1.7", "0.0.0.0"),  # in a pod: the pod IP, every interface as before
    ("", "fd00::7", "::"),
    ("", "vk.example.internal", "0.0.0.0"),
    ("0.0.0.0", "127.0.0.1", "0.0.0.0"),  # set: exactly that
    ("10.0.0.5", "10.0.0.5", "10.0.0.5"),
])
def test_the_ports_listen_where_the_api_server_reaches_the_node(
        bind_address: str, internal_ip: str, listens: str) -> None:
    assert listen_address(bind_address=bind_address, internal_ip=internal_ip) == listens


def test_bind_address_defaults_to_automatic_and_null_means_the_same(tmp_path: Path) -> None:
    assert Settings().kubelet_api.bind_address == ""
    path = tmp_path / "vk.yaml"
    path.write_text("kubelet_api: {bind_address: null}\n")
    assert load_settings(path).kubelet_api.bind_address == ""
    path.write_text("kubelet_api: {bind_address: ' 0.0.0.0 '}\n")
    assert load_settings(path).kubelet_api.bind_address == "0.0.0.0"


def test_the_in_cluster_override_of_internal_ip_still_listens_everywhere() -> None:
    """``vkprovider run`` applies VKP_NODE_INTERNAL_IP after loading (the file's internal_ip is
    the default 127.0.0.1); the address is chosen when the ports are bound, from the result."""
    settings = Settings()
    node = settings.node.model_copy(update={"internal_ip": "10.244.1.7"})
    settings = settings.model_copy(update={"node": node})
    assert listen_address(bind_address=settings.kubelet_api.bind_address,
                          internal_ip=settings.node.internal_ip) == "0.0.0.0"


# ---- the mock cloud's start-up line ------------------------------------------------------------


def test_the_mock_clouds_start_up_line_says_where_and_what() -> None:
    state = MockCloudState(inventory=[InventoryOffer(gpu_type="H100", region="us-east", count=16,
                                                     price_per_gpu_hour=2.49)])
    assert startup_line(url="http://127.0.0.1:18080", state=state) == (
        "mock cloud listening on http://127.0.0.1:18080, selling 16 H100 in us-east at "
        "$2.49/GPU-h; no API key needed")
    keyed = MockCloudState(inventory=[], api_key="k")
    assert startup_line(url="http://[::1]:1", state=keyed) == (
        "mock cloud listening on http://[::1]:1, selling nothing; an API key is required")


async def test_serve_announces_once_it_listens() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    lines: list[str] = []
    task = asyncio.create_task(serve(host="127.0.0.1", port=port, state=MockCloudState(),
                                     announce=lines.append))
    try:
        for _ in range(200):
            if lines:
                break
            await asyncio.sleep(0.02)
        assert len(lines) == 1 and lines[0].startswith(
            f"mock cloud listening on http://127.0.0.1:{port}, selling 16 H100 in us-east"), lines
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # it really listens
        writer.close()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""The ``vkprovider`` command line: every bad input is one line on stderr, exit 2, no traceback.

Most cases run :func:`vkprovider.cli.main` in-process (fast); a few run the real command as a
subprocess to prove what a user sees (exit status, stderr, no ``Traceback``). No cluster: an
API server is only ever "reached" through a patched check, or is a closed port.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from vkprovider import __version__, cli, logs
from vkprovider.kube import startup


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No ambient credentials; the root logger as it was (main() installs its handler)."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("VKP_NODE_INTERNAL_IP", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _is_file(path: str) -> bool:
    return os.path.isfile(path)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_kubeconfig(path: Path, *, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server,
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "sekrit-token-value"}}],
    }))
    return path


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``vkprovider ARGV`` in-process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse: --version, usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Settings files and kubeconfigs, good and bad."""
    made = {
        "ok.yaml": "node: {name: vk-cli}\n",
        "bad-yaml.yaml": "node: {name: vk\npods: [\n",
        "bad-field.yaml": "node: {name: vk}\npods:\n  workers: 0\n",
        "bad-port.yaml": "node: {kubelet_port: 70000}\n",
        "unknown-key.yaml": "nodes: {}\n",
        "list.yaml": "- a\n- b\n",
        "companion-bad.yaml": "interval_seconds: -1\n",
        "companion-bad-port.yaml": "metrics_port: 99999\n",
        "companion-unknown.yaml": "intervall_seconds: 3\n",
        "kc-bad-yaml": "apiVersion: v1\nusers:\n- name: u\n  user: {token: sekrit-value\n",
        "kc-list": "- a\n- b\n",
        "kc-no-context": "apiVersion: v1\nkind: Config\n",
        "kc-empty": "",
    }
    out = {}
    for name, text in made.items():
        out[name] = tmp_path / name
        out[name].write_text(text)
    out["kc-binary"] = tmp_path / "kc-binary"
    out["kc-binary"].write_bytes(b"\x00\xff\xfe")
    return out


# -- --version and where global flags go -------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["--version"], capsys)
    assert (code, out.strip(), err) == (0, f"vkprovider {__version__}", "")


@pytest.mark.parametrize("argv", [
    ["--log-level", "loud", "run", "--config", "x.yaml"],
    ["run", "--config", "x.yaml", "--log-level", "loud"],
    ["descheduler", "--log-level=LOUD"],
    ["mock-cloud", "--log-level", "verbose"],
])
def test_bad_log_level_before_or_after_the_command(argv: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(argv, capsys)
    assert code == 2
    assert_one_line(err, "--log-level", "is not a log level")


def test_global_flags_after_the_command(files: dict[str, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    seen: dict[str, Any] = {}

    async def fake_run(*, settings: Any) -> int:
        seen["settings"] = settings
        seen["level"] = logging.getLogger().level
        seen["handler"] = logging.getLogger().handlers[0].formatter
        seen["cert_exists"] = _is_file(settings.tls_cert_file)
        return 0

    async def reachable(**_: Any) -> None:
        return None

    import vkprovider.service

    monkeypatch.setattr(vkprovider.service, "run_virtual_kubelet", fake_run)
    monkeypatch.setattr(startup, "wait_for_api_server", reachable)
    kubeconfig = write_kubeconfig(tmp_path / "kc", server="https://127.0.0.1:1")
    code, _, err = run_main(["run", "--config", str(files["ok.yaml"]), "--log-level", "debug",
                             "--log-format", "json", "--kubeconfig", str(kubeconfig)], capsys)
    assert code == 0
    assert all(line.startswith('{"ts":') for line in err.splitlines()), err  # json logs
    assert seen["settings"].kubeconfig == str(kubeconfig)
    assert seen["level"] == logging.DEBUG
    assert isinstance(seen["handler"], logs.JSONFormatter)
    # the self-signed serving certificate was written under $TMPDIR, served from files, and
    # removed at exit
    cert = Path(seen["settings"].tls_cert_file)
    assert seen["cert_exists"] and cert.parent.parent == tmp_path
    assert not cert.exists()


def test_kubeconfig_before_a_command_that_takes_none(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["--kubeconfig", "x", "mock-cloud"], capsys)
    assert code == 2
    assert_one_line(err, "--kubeconfig", "mock-cloud")


# -- every bad input: one line naming it, exit 2 ---------------------------------------------------


@pytest.mark.parametrize(("argv", "needles"), [
    (["mock-cloud", "--port", "70000"], ["--port", "70000", "out of range"]),
    (["mock-cloud", "--port", "http"], ["--port", "'http'"]),
    (["descheduler", "--metrics-port", "65536"], ["--metrics-port", "65536", "out of range"]),
    (["descheduler", "--metrics-port=-1"], ["--metrics-port", "-1", "out of range"]),
    (["descheduler", "--interval", "-1"], ["--interval", "-1", "not a positive number"]),
    (["descheduler", "--interval", "0"], ["--interval", "not a positive number"]),
    (["descheduler", "--move-back-interval=-30"], ["--move-back-interval", "-30"]),
    (["descheduler", "--interval", "soon"], ["--interval", "'soon' is not a number"]),
    (["descheduler", "--headroom-gpus", "-2"], ["--headroom-gpus", "-2"]),
    (["descheduler", "--api-server-timeout", "-5"], ["--api-server-timeout", "-5"]),
    (["run", "--config", "x.yaml", "--api-server-timeout", "0"], ["--api-server-timeout"]),
    (["mock-cloud", "--boot-delay", "-1"], ["--boot-delay", "-1", "negative"]),
    (["descheduler", "--log-format", "xml"], ["--log-format", "'xml'"]),
    (["run"], ["--config"]),
    (["frobnicate"], ["frobnicate"]),
    ([], ["command"]),
])
def test_bad_flags(argv: list[str], needles: list[str],
                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(argv, capsys)
    assert code == 2
    assert_one_line(err, *needles)


@pytest.mark.parametrize(("command", "name", "needles"), [
    ("run", "bad-yaml.yaml", ["bad-yaml.yaml", "not valid YAML", "line 2, column 5"]),
    ("run", "bad-field.yaml", ["bad-field.yaml", "pods.workers", "greater than or equal to 1"]),
    ("run", "bad-port.yaml", ["node.kubelet_port", "less than or equal to 65535"]),
    ("run", "unknown-key.yaml", ["nodes", "Extra inputs are not permitted"]),
    ("run", "list.yaml", ["list.yaml", "top level must be a mapping"]),
    ("run", "missing.yaml", ["missing.yaml", "No such file"]),
    ("descheduler", "bad-yaml.yaml", ["bad-yaml.yaml", "not valid YAML"]),
    ("descheduler", "companion-bad.yaml", ["interval_seconds", "greater than 0"]),
    ("descheduler", "companion-bad-port.yaml", ["metrics_port", "less than or equal to 65535"]),
    ("descheduler", "companion-unknown.yaml", ["intervall_seconds", "Extra inputs"]),
])
def test_bad_config_files(command: str, name: str, needles: list[str], files: dict[str, Path],
                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = files.get(name, tmp_path / name)
    code, _, err = run_main([command, "--config", str(path)], capsys)
    assert code == 2
    assert_one_line(err, *needles)


@pytest.mark.parametrize("command", ["run", "descheduler"])
@pytest.mark.parametrize(("name", "needles"), [
    ("kc-bad-yaml", ["not a valid kubeconfig", "not valid YAML at line"]),
    ("kc-list", ["not a valid kubeconfig"]),
    ("kc-no-context", ["current-context"]),
    ("kc-empty", ["empty"]),
    ("kc-binary", ["not a valid kubeconfig"]),
])
def test_malformed_kubeconfig(command: str, name: str, needles: list[str],
                              files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, "--kubeconfig", str(files[name])]
    if command == "run":
        argv += ["--config", str(files["ok.yaml"])]
    code, _, err = run_main(argv, capsys)
    assert code == 2
    assert_one_line(err, f"--kubeconfig {files[name]}", *needles)
    assert "sekrit" not in err, "a kubeconfig's content is never quoted"


@pytest.mark.parametrize("command", ["run", "descheduler"])
def test_missing_kubeconfig_names_the_path(command: str, files: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere" / "kubeconfig"
    argv = [command, "--kubeconfig", str(missing)]
    if command == "run":
        argv += ["--config", str(files["ok.yaml"])]
    code, _, err = run_main(argv, capsys)
    assert code == 2
    assert_one_line(err, str(missing), "no such file")


def test_missing_kubeconfig_from_the_config_file(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "companion.yaml"
    config.write_text(f"kubeconfig: {tmp_path / 'gone'}\n")
    code, _, err = run_main(["descheduler", "--config", str(config)], capsys)
    assert code == 2
    assert_one_line(err, "companion.yaml: kubeconfig", str(tmp_path / "gone"), "no such file")


def test_missing_default_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["descheduler"], capsys)
    assert code == 2
    assert_one_line(err, "no Kubernetes credentials")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    code, _, err = run_main(["descheduler"], capsys)
    assert code == 2
    assert_one_line(err, f"KUBECONFIG={tmp_path / 'absent'}", "no such file")


def test_unwritable_tmpdir_names_tmpdir(files: dict[str, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("TMPDIR", str(blocker))
    code, _, err = run_main(["run", "--config", str(files["ok.yaml"])], capsys)
    assert code == 2
    assert_one_line(err, f"TMPDIR={blocker}", "kubelet_api.cert_dir")


def test_a_port_taken_by_another_process(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", server="https://127.0.0.1:1")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run_main(["descheduler", "--kubeconfig", str(kubeconfig),
                                 "--metrics-port", str(port)], capsys)
    assert code == 2
    assert_one_line(err, f"--metrics-port {port}", "cannot listen")


# -- the companion's settings file and its flags ------------------------------------------------


def test_descheduler_reads_a_config_file_and_flags_win(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    seen: dict[str, Any] = {}

    async def fake_companion(**kwargs: Any) -> int:
        seen.update(kwargs)
        return 0

    async def reachable(**_: Any) -> None:
        return None

    import vkprovider.descheduler.service

    monkeypatch.setattr(vkprovider.descheduler.service, "run_companion", fake_companion)
    monkeypatch.setattr(startup, "wait_for_api_server", reachable)
    kubeconfig = write_kubeconfig(tmp_path / "kc", server="https://127.0.0.1:1")
    config = tmp_path / "companion.yaml"
    config.write_text(yaml.safe_dump({
        "kubeconfig": str(kubeconfig), "node_name": "vk-file", "interval_seconds": 7,
        "move_back_interval_seconds": 70, "headroom_gpus": 3,
        "leader_election": {"enabled": True, "namespace": "ns-file"},
    }))
    code, _, err = run_main(["descheduler", "--config", str(config)], capsys)
    assert (code, err) == (0, "")
    assert seen == {"kubeconfig": str(kubeconfig), "node_name": "vk-file", "interval": 7.0,
                    "move_back_interval": 70.0, "headroom_gpus": 3, "metrics_port": 0,
                    "leader_elect": True, "leader_namespace": "ns-file",
                    "preemption_fast_path": True,
                    "gpu_health_taints": ("AggregatedNodeHealth", "GPUHealth",
                                          "node.kubernetes.io/out-of-service"),
                    "policy_labels": {}}
    code, _, err = run_main(["descheduler", "--config", str(config), "--interval", "1.5",
                             "--node-name", "vk-flag", "--no-leader-elect",
                             "--leader-namespace", "ns-flag"], capsys)
    assert (code, err) == (0, "")
    assert (seen["interval"], seen["node_name"], seen["leader_elect"], seen["leader_namespace"],
            seen["move_back_interval"]) == (1.5, "vk-flag", False, "ns-flag", 70.0)
    code, _, err = run_main(["descheduler", "--kubeconfig", str(kubeconfig)], capsys)
    assert (code, err) == (0, "")
    assert (seen["node_name"], seen["interval"], seen["move_back_interval"],
            seen["leader_elect"]) == ("vk-gpu-burst", 2.0, 30.0, False), "the defaults"
    code, _, err = run_main(["descheduler", "--kubeconfig", str(kubeconfig),
                             "--gpu-health-taint", "example.com/gpu=bad:NoSchedule",
                             "--gpu-health-taint", "AggregatedNodeHealth"], capsys)
    assert (code, err) == (0, "")
    assert seen["gpu_health_taints"] == ("example.com/gpu=bad:NoSchedule", "AggregatedNodeHealth")
    code, _, err = run_main(["descheduler", "--kubeconfig", str(kubeconfig),
                             "--gpu-health-taint", "bad key"], capsys)
    assert code != 0 and "gpu_health_taints" in err and "'bad key' is not a taint key" in err
    code, _, err = run_main(["descheduler", "--kubeconfig", str(kubeconfig), "--node-name", "a",
                             "--node-name", "b"], capsys)
    assert (code, err, seen["node_name"]) == (0, "", ["a", "b"]), "several virtual nodes"
    config.write_text(yaml.safe_dump({"kubeconfig": str(kubeconfig), "node_name": ["x", "y"]}))
    code, _, err = run_main(["descheduler", "--config", str(config)], capsys)
    assert (code, err, seen["node_name"]) == (0, "", ["x", "y"])
    config.write_text(yaml.safe_dump({"node_name": ["x", "x"]}))
    code, _, err = run_main(["descheduler", "--config", str(config)], capsys)
    assert code == 2
    assert_one_line(err, "node_name", "repeated: x")


# -- the API server at start ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "descheduler"])
def test_unreachable_api_server_gives_up_in_bounded_time(command: str, files: dict[str, Path],
                                                         tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    server = f"https://127.0.0.1:{closed_port()}"
    kubeconfig = write_kubeconfig(tmp_path / "kc", server=server)
    argv = [command, "--kubeconfig", str(kubeconfig), "--api-server-timeout", "0.5"]
    if command == "run":
        argv += ["--config", str(files["ok.yaml"])]
    code, _, err = run_main(argv, capsys)
    assert code == 1
    assert_one_line(err, server, "did not answer within 0.5s", "giving up")


# -- timestamps ----------------------------------------------------------------------------------


def test_text_logs_carry_a_timestamp() -> None:
    record = logging.LogRecord("vkprovider.x", logging.INFO, __file__, 1, "hello", None, None)
    record.__dict__.update(logs.kv(pod="ns/a"))
    line = logs.TextFormatter().format(record)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z I vkprovider\.x: hello pod=ns/a",
                        line), line


# -- as a user sees it: the real command ---------------------------------------------------------


def _command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vkprovider", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


def test_subprocess_version() -> None:
    done = _command("--version")
    assert (done.returncode, done.stdout.strip(), done.stderr) == (
        0, f"vkprovider {__version__}", "")


@pytest.mark.parametrize("case", ["kubeconfig", "config", "log-level", "unreachable"])
def test_subprocess_bad_inputs(case: str, files: dict[str, Path], tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    args, code, needle = {
        "kubeconfig": (["descheduler", "--kubeconfig", str(files["kc-list"])], 2,
                       "not a valid kubeconfig"),
        "config": (["run", "--config", str(files["bad-field.yaml"])], 2, "pods.workers"),
        "log-level": (["descheduler", "--log-level", "loud"], 2, "--log-level"),
        "unreachable": (["descheduler", "--api-server-timeout", "0.3", "--kubeconfig",
                         str(write_kubeconfig(tmp_path / "kc",
                                              server=f"https://127.0.0.1:{closed_port()}"))],
                        1, "did not answer"),
    }[case]
    done = _command(*args, env=env)
    assert done.returncode == code, done.stderr
    assert_one_line(done.stderr, needle)


# -- what a newcomer types first ----------------------------------------------------------------


def test_dev_without_a_command_names_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["dev"], capsys)
    assert code == 2
    assert_one_line(err, "vkprovider dev: error:", "up or curl")
    assert "dev_command" not in err  # argparse's internal name for it


@pytest.mark.parametrize("argv", [["--help"], ["dev", "--help"], ["demo", "--help"]])
def test_help_is_plain_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(argv, capsys)
    assert code == 0 and "usage: vkprovider" in out
    assert "``" not in out and ":class:" not in out and ":mod:" not in out, out


def test_demo_without_pytest_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    """The image ships no pytest (runtime dependencies only): ``vkprovider demo`` there must not
    die on an import; without the Go-built control plane it says so in one line."""
    empty = tmp_path / "nothing-built"
    empty.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           "VKP_CONTROLPLANE_BIN": str(empty), "VKP_KUEUE_BIN": str(empty)}
    code = ("import sys; sys.modules['pytest'] = sys.modules['pytest_asyncio'] = None; "
            "from vkprovider.cli import main; sys.exit(main(['demo']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    assert done.returncode == 1, done.stderr
    assert_one_line(done.stderr, "vkprovider demo: error:", "kube-apiserver", "make demo")


def test_mock_cloud_exits_0_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM (kill, a supervisor, the quickstart's ``kill %1``) stops the mock cloud cleanly:
    exit status 0, not death by the signal uvicorn re-raised (143)."""
    import signal
    import time

    port = closed_port()
    out = tmp_path / "mock.out"
    with out.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "vkprovider", "mock-cloud", "--port",
                                 str(port)], stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "listening" not in out.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        assert proc.poll() is None, out.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in out.read_text()

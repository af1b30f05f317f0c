"""The image starts, proven without Docker or a registry.

tools/image/rootfs.sh builds the image's root filesystem from Debian bookworm's packages plus the
project's wheel; tools/image/sandbox.sh runs it as the Deployments run the container: the
Dockerfile's USER (65532) with no capabilities and no_new_privs, the Dockerfile's ENV and
ENTRYPOINT, the root read-only, and nothing writable but a tmpfs at /tmp standing in for the
manifests' emptyDir (TMPDIR=/tmp). These tests need that root filesystem (marker ``rootfs``):
they build it when it is missing and fail, never skip, when they cannot.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .conftest import Run
from .imagespec import DEPLOYMENTS, config_map, container, deployment, parse_dockerfile, pyproject

pytestmark = [pytest.mark.rootfs, pytest.mark.timeout(900)]  # a cold rootfs build: ~1 min

IMAGE = parse_dockerfile()
ENTRYPOINT = IMAGE.entrypoint()
UID, GID = IMAGE.user()
VERSION = pyproject()["project"]["version"]
# what the kubelet would put in a fieldRef
FIELD_REFS = {"status.podIP": "127.0.0.1", "metadata.name": "vkprovider-0"}
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def pod_env(name: str = "vkprovider") -> dict[str, str]:
    """The container's env from its Deployment, fieldRefs filled in as the kubelet would."""
    env: dict[str, str] = {}
    for item in container(deployment(name)).get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            env[item["name"]] = FIELD_REFS[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def one_line_error(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert lines, "nothing on stderr"
    assert "Traceback" not in stderr, stderr
    return lines[-1]


def test_version_as_the_image_user(sandbox: Run) -> None:
    done = sandbox([*ENTRYPOINT, "--version"], env=pod_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"vkprovider {VERSION}"
    assert done.stderr == ""


def test_help_and_run_help(sandbox: Run) -> None:
    done = sandbox([*ENTRYPOINT, *IMAGE.cmd()], env=pod_env())  # `docker run IMAGE`
    assert done.returncode == 0, done.stderr
    for command in ("run", "descheduler", "mock-cloud"):
        assert command in done.stdout
    done = sandbox([*ENTRYPOINT, "run", "--help"], env=pod_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: vkprovider run")
    assert "--config" in done.stdout and "--api-server-timeout" in done.stdout
    assert done.stderr == ""


def test_sandbox_is_what_the_manifests_ask_for(sandbox: Run) -> None:
    """User, capabilities, no_new_privs, read-only root, writable TMPDIR, nothing else."""
    probe = textwrap.dedent("""
        import json, os, sys
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        writable = {}
        for d in ["/", "/opt/vkprovider", "/opt/vkprovider/lib", "/etc", "/var/tmp", "/run",
                  "/dev", os.path.expanduser("~"), os.environ["TMPDIR"]]:
            try:
                with open(os.path.join(d, ".probe"), "w"):
                    pass
                writable[d] = True
            except OSError as exc:
                writable[d] = exc.strerror
        print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                          "capeff": status["CapEff"].strip(), "capprm": status["CapPrm"].strip(),
                          "nnp": status["NoNewPrivs"].strip(), "pid": os.getpid(),
                          "home": os.environ.get("HOME"), "writable": writable,
                          "python": sys.executable}))
    """)
    done = sandbox(["python", "-c", probe], env=pod_env())
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout)
    assert (seen["uid"], seen["gid"]) == (UID, GID)
    assert set(seen["groups"]) <= {GID}
    assert seen["capeff"] == seen["capprm"] == "0000000000000000"
    assert seen["nnp"] == "1"
    assert seen["python"] == "/opt/vkprovider/bin/python"
    tmp = pod_env()["TMPDIR"]
    assert seen["writable"].pop(tmp) is True, "TMPDIR (the emptyDir) is writable"
    assert all(v is not True for v in seen["writable"].values()), seen["writable"]


def test_imports_write_no_bytecode(sandbox: Run) -> None:
    """With the image's ENV, importing the whole package tries to write nothing at all.

    A read-only root turns a .pyc write into a failed attempt on every start. PYTHONPYCACHEPREFIX
    points at nothing, so no .pyc is found anywhere (as in an image built without them) and
    every module is compiled; an audit hook sees every attempt to open a file for writing or to
    make a directory, wherever.
    """
    probe = textwrap.dedent("""
        import os, pkgutil, importlib, json, sys
        attempts = []
        def hook(event, args):
            if event == "open" and args[2] is not None and args[2] & (os.O_WRONLY | os.O_RDWR):
                attempts.append(str(args[0]))
            elif event == "open" and isinstance(args[1], str) and any(m in args[1] for m in "wax+"):
                attempts.append(str(args[0]))
            elif event in ("os.mkdir", "os.rename", "os.replace"):
                attempts.append(f"{event} {args[0]}")
        sys.addaudithook(hook)
        failed = {}
        for top in ("vkprovider", "providers"):
            package = importlib.import_module(top)
            for info in pkgutil.walk_packages(package.__path__, top + "."):
                if info.name.startswith("vkprovider.testing") or info.name.endswith("__main__"):
                    continue  # test helpers (need pytest); `python -m` entry points (run main)
                try:
                    importlib.import_module(info.name)
                except Exception as exc:
                    failed[info.name] = repr(exc)
        print(json.dumps({"dont_write_bytecode": sys.dont_write_bytecode,
                          "attempts": attempts, "failed": failed,
                          "modules": len(sys.modules)}))
    """)
    env = {**pod_env(), "PYTHONPYCACHEPREFIX": "/nonexistent/pycache"}
    done = sandbox(["python", "-c", probe], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    seen: dict[str, Any] = json.loads(done.stdout)
    assert seen["dont_write_bytecode"] is True, "PYTHONDONTWRITEBYTECODE=1 is in the image's ENV"
    assert seen["attempts"] == [], "writes while importing"
    assert seen["failed"] == {}, "modules that do not import in the image"
    assert seen["modules"] > 100


def _pod_files(tmp_path: Path, rootfs: Path) -> dict[str, Path]:
    """The host side of the Deployments' configMaps and the in-cluster credentials."""
    config = tmp_path / "config"
    config.mkdir()
    for key, text in config_map("vkprovider").items():
        (config / key).write_text(text)
    ca = rootfs / "etc/ssl/certs/ca-certificates.crt"  # any CA file will do
    cluster_ca = tmp_path / "cluster-ca"
    cluster_ca.mkdir()
    (cluster_ca / "ca.crt").write_bytes(ca.read_bytes())
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("not-a-real-token")
    (account / "namespace").write_text("vkprovider-system")
    (account / "ca.crt").write_bytes(ca.read_bytes())
    return {"vkprovider": config, "kube-root-ca.crt": cluster_ca, "serviceaccount": account}


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_deployment_command_starts_up_to_the_api_server(
        name: str, sandbox: Run, rootfs: Path, tmp_path: Path) -> None:
    """Each Deployment's own args, volumes and env, in-cluster credentials, no API server.

    The process gets through everything it does before talking to the cluster (settings,
    the kubelet API's self-signed certificate written under TMPDIR, the client CA, in-cluster
    credentials) and then gives up waiting for the API server: exit 1, one line, no traceback,
    nothing refused for being read-only.
    """
    files = _pod_files(tmp_path, rootfs)
    dep = deployment(name)
    spec = container(dep)
    sources = {}
    tmpfs = []
    for volume in dep["spec"]["template"]["spec"].get("volumes", []):
        if "configMap" in volume:
            sources[volume["name"]] = files[volume["configMap"]["name"]]
        elif "emptyDir" in volume:
            sources[volume["name"]] = None
    volumes = [f"{files['serviceaccount']}:{SA_DIR}"]
    for mount in spec.get("volumeMounts", []):
        source = sources[mount["name"]]
        if source is None:
            tmpfs.append(mount["mountPath"])
        else:
            host = source / mount["subPath"] if "subPath" in mount else source
            volumes.append(f"{host}:{mount['mountPath']}")
    env = {**pod_env(name), "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": "6443"}
    argv = [*ENTRYPOINT, *spec.get("command", []), *spec["args"], "--api-server-timeout=2"]
    done = sandbox(argv, env=env, tmpfs=tmpfs, volumes=volumes, timeout=60)
    line = one_line_error(done.stderr)
    assert done.returncode == 1, done.stderr
    assert line.startswith("vkprovider: error: the API server at https://127.0.0.1:6443 did not "
                           "answer within 2s"), line
    assert "Read-only file system" not in done.stderr and "Permission denied" not in done.stderr


def test_mock_cloud_serves_http(sandbox: Run) -> None:
    """A server process (uvicorn + FastAPI) listens and answers as the non-root user."""
    script = textwrap.dedent(f"""
        {' '.join(ENTRYPOINT)} mock-cloud --host 127.0.0.1 --port 8080 &
        python - <<'EOF'
        import time, urllib.request
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8080/healthz", timeout=2) as r:
                    print(r.status, r.read().decode())
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        EOF
        status=$?
        kill %1
        exit $status
    """)
    done = sandbox(["sh", "-c", script], env=pod_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    # two processes share stdout: the server's start-up line and the probe's answer may come in
    # either order (the line is printed once uvicorn reports it listens, polled)
    lines = done.stdout.splitlines()
    assert any(x.startswith("mock cloud listening on http://127.0.0.1:8080") for x in lines), \
        done.stdout
    assert any(x.startswith("200 ") for x in lines), done.stdout

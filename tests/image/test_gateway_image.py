"""The traffic gateway's image (tools/image/gateway.sh) is what the chart's gateway pods expect.

The chart runs it as ``haproxy -db -f /run/haproxy/haproxy.cfg`` (no entrypoint of its own), as
uid 99 on a read-only root, and points ``gateway.edgeCAFile`` at Debian's CA bundle in it by
default. These tests read the archive as a runtime would (:class:`.test_oci.Archive`, every
digest checked): named as the chart's default, USER 99, HAProxy of the major version the
gateway tests run (Debian's 2.6), the CA bundle present, and none of what the provider's image
holds (Python) nor what the image builder must purge (perl, pulled in by usrmerge).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .imagespec import VALUES
from .test_oci import Archive

pytestmark = [pytest.mark.rootfs, pytest.mark.timeout(900)]

GATEWAY_SH = Path(__file__).resolve().parents[2] / "tools" / "image" / "gateway.sh"


@pytest.fixture(scope="module")
def gateway_archive() -> Iterator[Archive]:
    given = os.environ.get("VKP_GATEWAY_IMAGE_ARCHIVE")
    if given:
        path = Path(given)
    else:
        done = subprocess.run(["bash", str(GATEWAY_SH)], capture_output=True, text=True,
                              timeout=840, check=False)
        assert done.returncode == 0, f"{GATEWAY_SH} failed:\n{done.stderr[-4000:]}"
        path = Path(done.stdout.strip().splitlines()[-1])
    opened = Archive(path)
    yield opened
    opened.tar.close()


def test_named_as_the_chart_runs_it_as_uid_99_with_the_charts_command(
        gateway_archive: Archive) -> None:
    values = yaml.safe_load(VALUES.read_text())
    chart = yaml.safe_load((VALUES.parent / "Chart.yaml").read_text())
    image = values["gateway"]["image"]
    name = gateway_archive.entry["annotations"]["io.containerd.image.name"]
    assert name == f"{image['repository']}:{image['tag'] or chart['appVersion']}"
    config = gateway_archive.config["config"]
    assert config["User"] == "99:99"
    assert not config.get("Entrypoint")  # the chart's args are the whole command
    assert config["Cmd"] == ["haproxy", "-db", "-f", "/run/haproxy/haproxy.cfg"]
    assert config["Labels"]["org.opencontainers.image.version"] == chart["appVersion"]


def test_the_layer_holds_haproxy_2_6_and_the_ca_bundle_and_no_python_or_perl(
        gateway_archive: Archive) -> None:
    names: set[str] = set()
    with gateway_archive.layer() as layer:
        for member in layer:
            names.add(member.name)
    assert "usr/sbin/haproxy" in names
    assert "etc/ssl/certs/ca-certificates.crt" in names  # gateway.edgeCAFile's default
    assert "usr/share/doc/haproxy/copyright" in names
    # Debian's package of the major version the gateway tests run (dpkg's record of it)
    assert "var/lib/dpkg/info/haproxy.list" in names
    assert not any(n.startswith(("usr/bin/python3", "opt/vkprovider")) for n in names)
    # perl-base (Essential) stays; the whole of perl that usrmerge pulls in does not
    assert not any(n.startswith("usr/share/perl/") or "/libperl" in n for n in names)


def test_its_haproxy_is_debians_2_6(gateway_archive: Archive) -> None:
    with gateway_archive.layer() as layer:
        for member in layer:
            if member.name == "var/lib/dpkg/status":
                stream = layer.extractfile(member)
                assert stream is not None
                status = stream.read().decode()
                break
        else:
            pytest.fail("no var/lib/dpkg/status in the layer")
    block = status.split("Package: haproxy\n", 1)[1].split("\n\n", 1)[0]
    version = next(line.split(": ", 1)[1] for line in block.splitlines()
                   if line.startswith("Version: "))
    assert version.startswith("2.6."), version

"""tools/image/image_config.py: the OCI config flags a Dockerfile's final stage stands for.

tools/image/oci.sh builds the image without Docker from these flags; a misreading would ship an
image whose USER, ENTRYPOINT or LABELs differ from what ``docker build`` makes. The project's own
Dockerfile is checked against the archive in tests/image/test_oci.py; these hold the reading
rules on a Dockerfile that uses what ours does not (yet).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def reader() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_config",
                                                  ROOT / "tools/image/image_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("image_config", module)
    spec.loader.exec_module(module)
    return module


DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE=debian:12
ARG VERSION=9.9
FROM ${BASE} AS build
ENV NOT_IN_FINAL=1
USER 1:1
LABEL stage=build
FROM ${BASE}
ARG VERSION
ARG SOURCE=https://example.invalid/src
LABEL a.version="${VERSION}" \\
      a.source="${SOURCE}" a.title="two words"
ENV PATH=/app/bin:$PATH \\
    HOME=/home/app
ENV LEGACY some value
WORKDIR /srv
WORKDIR data
EXPOSE 8080 9090/udp
CMD ["ignored"]
ENTRYPOINT ["app", "serve"]
USER 65532:65532
"""


def test_the_final_stage_becomes_the_flags() -> None:
    flags = reader().flags(DOCKERFILE)
    assert flags == [
        "--user=65532:65532", "--workdir=/srv/data",
        '--entrypoint=["app", "serve"]', "--cmd=[]",  # a later ENTRYPOINT resets CMD
        "--env=PATH=/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--env=HOME=/home/app", "--env=LEGACY=some value",
        "--label=a.version=9.9", "--label=a.source=https://example.invalid/src",
        "--label=a.title=two words",
        "--expose=8080/tcp", "--expose=9090/udp",
    ]


def test_shell_form_runs_through_sh_and_garbage_is_refused() -> None:
    module = reader()
    flags = module.flags("FROM x\nENTRYPOINT exec app --flag\n")
    assert '--entrypoint=["/bin/sh", "-c", "exec app --flag"]' in flags
    with pytest.raises(module.DockerfileError):
        module.flags("ENV A=1\n")
    with pytest.raises(module.DockerfileError):
        module.flags("FROM x\nLABEL a=1 b\n")
    assert module.main([str(ROOT / "Dockerfile")]) == 0

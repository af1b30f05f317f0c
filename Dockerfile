# syntax=docker/dockerfile:1
# The vkprovider image: one image for every process (virtual kubelet `run`, companion
# `descheduler`, `mock-cloud`); the Deployment's args pick the command.
#
#   docker build -t vkprovider .
#
# It runs as user 65532 on a read-only root filesystem: the app writes only under $TMPDIR, which
# the manifests mount as an emptyDir at /tmp. CI proves this without Docker or a registry:
# tools/image/lint.sh (hadolint) and tests/image/ (tools/image/rootfs.sh builds the same root
# filesystem from Debian's packages and runs this file's ENTRYPOINT/USER/ENV in it, read-only).
# Keep the two in step: what the final stage installs, rootfs.sh installs too.

# The base, by tag. A release build pins it by digest (docs/releasing.md), e.g.
#   digest=$(docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}' | tr -d '"')
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@$digest -t vkprovider .
# (or `crane digest python:3.11-slim-bookworm`). The digest is not written here because nothing in
# this repository's CI can pull the image to check it; refresh it for every release.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- builder: the project's wheel, installed with its dependencies into a venv ------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    SOURCE_DATE_EPOCH=315532800
WORKDIR /src
# the build context is only what the wheel needs (.dockerignore lists it)
COPY pyproject.toml README.md LICENSE ./
COPY requirements/ requirements/
COPY vkprovider/ vkprovider/
COPY providers/ providers/
# the venv has no pip/setuptools of its own: the base image's pip installs into it. The
# dependencies are exactly requirements/runtime.lock's, each checked against its hashes; the
# project's own wheel (built here) goes in after them, with no further resolution.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/vkprovider \
 && python -m pip --python /opt/vkprovider/bin/python install --no-deps --require-hashes \
      -r requirements/runtime.lock \
 && python -m pip --python /opt/vkprovider/bin/python install --no-deps /wheels/vkprovider-*.whl

# -- final: the slim base, the venv, a numeric non-root user; no compilers, nothing writable -----
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG SOURCE=https://github.com/vkprovider/vkprovider
LABEL org.opencontainers.image.title="vkprovider" \
      org.opencontainers.image.description="A Virtual Kubelet provider that bursts Kubernetes GPU workloads onto external GPU clouds" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
RUN groupadd --system --gid 65532 vkprovider \
 && useradd --system --no-log-init --uid 65532 --gid 65532 --home-dir /nonexistent \
      --no-create-home --shell /usr/sbin/nologin vkprovider
COPY --from=builder /opt/vkprovider /opt/vkprovider
ENV PATH=/opt/vkprovider/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["vkprovider"]
CMD ["--help"]

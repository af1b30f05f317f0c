#!/usr/bin/env bash
# `make release`: one version's artefacts in DIST (default dist/), built here, pushed nowhere
# (docs/releasing.md says how to publish them):
#
#   vkprovider-VERSION.tgz                      the Helm chart (helm package, helm from tools/helm)
#   vkprovider-VERSION-py3-none-any.whl         the Python package
#   vkprovider-rootfs-VERSION-ARCH.tar.gz       the image's root filesystem (tools/image/rootfs.sh:
#                                               what the Dockerfile's final stage holds)
#   vkprovider-image-VERSION-ARCH.oci.tar       the image itself, built without Docker
#                                               (tools/image/oci.sh --gzip: that root filesystem
#                                               and the Dockerfile's USER, ENTRYPOINT, CMD, ENV,
#                                               LABELs), an OCI image layout as a tar named
#                                               <chart's image.repository>:VERSION: `docker load`,
#                                               `ctr images import`, or `skopeo copy oci-archive:`
#   vkprovider-gateway-image-VERSION-ARCH.oci.tar
#                                               the traffic gateway's image (tools/image/gateway.sh
#                                               --gzip: Debian's HAProxy 2.6, USER 99), named
#                                               <chart's gateway.image.repository>:VERSION
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

rm -f "$dist"/vkprovider-"$version"* "$dist"/vkprovider-rootfs-"$version"-* \
  "$dist"/vkprovider-image-"$version"-* "$dist"/vkprovider-gateway-image-"$version"-* \
  "$dist/SHA256SUMS"
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

image_tar="$dist/vkprovider-image-$version-$arch.oci.tar"
say "the image as an OCI archive (tools/image/oci.sh --gzip) -> $(basename "$image_tar")"
built=$(VKP_ROOTFS="$VKP_ROOTFS" bash tools/image/oci.sh --gzip) || die "tools/image/oci.sh failed (above)"
cp "$built" "$image_tar"

gateway_tar="$dist/vkprovider-gateway-image-$version-$arch.oci.tar"
say "the traffic gateway's image (tools/image/gateway.sh --gzip) -> $(basename "$gateway_tar")"
built=$(bash tools/image/gateway.sh --gzip) || die "tools/image/gateway.sh failed (above)"
cp "$built" "$gateway_tar"

artefacts=(vkprovider-"$version".tgz vkprovider-"$version"-py3-none-any.whl
           "$(basename "$rootfs_tar")" "$(basename "$image_tar")" "$(basename "$gateway_tar")")
(cd "$dist" && sha256sum -- "${artefacts[@]}" >SHA256SUMS)
say "done; in $dist:"
(cd "$dist" && ls -l -- "${artefacts[@]}" SHA256SUMS) >&2
say "nothing was pushed: docs/releasing.md says how"

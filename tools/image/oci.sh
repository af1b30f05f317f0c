#!/usr/bin/env bash
# Builds the project's image as an OCI archive without a Docker engine or a registry, and prints
# its path. The Dockerfile stays the recipe for users (`docker build .`); this is the same image
# built offline:
#
#   the root filesystem   tools/image/rootfs.sh (what the Dockerfile's final stage holds, from
#                         Debian's packages + the project's wheel); $VKP_ROOTFS if set
#   the config            the Dockerfile's final stage: USER, WORKDIR, ENV, ENTRYPOINT, CMD,
#                         EXPOSE, LABEL (tools/image/image_config.py reads them)
#   the archive           tools/node/oci_archive.py: an OCI image layout as a tar, one layer,
#                         reproducible (sorted entries, mtime 315532800, numeric owners)
#
#   tools/image/oci.sh [--gzip]     --gzip: a compressed layer (the release's; ~25 s more)
#
# The image is named <chart's image.repository>:<the Dockerfile's VERSION>, e.g.
# ghcr.io/vkprovider/vkprovider:0.1.0, the reference the chart's defaults run (VKP_IMAGE_NAME
# overrides it). Load it with `ctr -n k8s.io images import FILE`, `docker load -i FILE` or
# `skopeo copy oci-archive:FILE docker://REGISTRY/...`.
#
# Cached by a hash of its inputs (the root filesystem's folder, itself named by a hash of its
# inputs; the flags; the name; this script; the packer) at
# ${VKP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/vkprovider}/image-<hash>/vkprovider-oci.tar.
# stdout: only the archive's path; stderr: what is being done.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${VKP_PYTHON:-$repo/.venv/bin/python}"
say() { printf 'oci: %s\n' "$*" >&2; }
die() { printf 'oci: error: %s\n' "$*" >&2; exit 1; }
gzip_flag=()
for arg in "$@"; do
  case "$arg" in
    --gzip) gzip_flag=(--gzip) ;;
    *) die "unknown argument '$arg' (usage: tools/image/oci.sh [--gzip])" ;;
  esac
done
[ -x "$py" ] || die "$py is missing: run 'make venv' (or set VKP_PYTHON)"
t0=$(date +%s)

if [ -n "${VKP_ROOTFS:-}" ]; then
  rootfs="$VKP_ROOTFS"
else
  rootfs=$(bash "$repo/tools/image/rootfs.sh") || die "tools/image/rootfs.sh failed (above)"
fi
[ -x "$rootfs/opt/vkprovider/bin/vkprovider" ] || die "$rootfs is no root filesystem from tools/image/rootfs.sh"

mapfile -t config < <("$py" "$repo/tools/image/image_config.py" "$repo/Dockerfile") \
  || die "tools/image/image_config.py could not read the Dockerfile"
[ "${#config[@]}" -gt 0 ] || die "tools/image/image_config.py printed nothing"
version=$(printf '%s\n' "${config[@]}" | sed -n 's/^--label=org\.opencontainers\.image\.version=//p')
[ -n "$version" ] || die "the Dockerfile has no org.opencontainers.image.version label"
repository=$("$py" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["image"]["repository"])' \
  "$repo/charts/vkprovider/values.yaml") || die "no image.repository in the chart's values.yaml"
name="${VKP_IMAGE_NAME:-$repository:$version}"

packer="$repo/tools/node/oci_archive.py"
args=(--name="$name" --rootfs="$rootfs" --mtime=315532800 "${config[@]}" "${gzip_flag[@]+"${gzip_flag[@]}"}")
key=$(printf '%s\n' "${args[@]}" "$(sha256sum <"$packer")" "$(sha256sum <"${BASH_SOURCE[0]}")" \
  | sha256sum | cut -c1-16)
cache_root="${VKP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vkprovider}"
out="$cache_root/image-$key"
archive="$out/vkprovider-oci.tar"
if [ -f "$archive" ]; then  # written under a .tmp name, then renamed: complete if present
  touch "$out"
  say "cached: $archive"
  echo "$archive"
  exit 0
fi
mkdir -p "$out"
say "packing $name from $rootfs"
"$py" "$packer" --out="$archive" "${args[@]}" >&2 || die "tools/node/oci_archive.py failed"
# keep the 3 most recently used archives (~400 MB each)
find "$cache_root" -mindepth 1 -maxdepth 1 -name 'image-*' -printf '%T@ %p\n' \
  | sort -rn | tail -n +4 | cut -d' ' -f2- | xargs -r rm -rf
say "built $archive ($(du -h "$archive" | cut -f1)) in $(( $(date +%s) - t0 ))s"
echo "$archive"

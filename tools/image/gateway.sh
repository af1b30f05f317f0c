#!/usr/bin/env bash
# Builds the traffic gateway's image (HAProxy from Debian) as an OCI archive, offline, and prints
# its path.
#
# The chart's gateway Deployment (charts/vkprovider/templates/gateway.yaml) runs HAProxy: an init
# container of the project's image renders its configuration (`vkprovider gateway-config`) and
# this image runs it. It is a separate image, not HAProxy added to the project's: the provider,
# the companion and the mock cloud never run HAProxy, and the gateway never runs Python, so each
# image holds only what its pods run (docs/traffic.md, "The gateway's image").
#
#   root filesystem   mmdebstrap bookworm, variant essential + haproxy (2.6, the version the
#                     gateway tests run as local processes: Debian's, from bookworm and its
#                     security updates) + ca-certificates (the CAs the gateway checks the clouds'
#                     edges against: gateway.edgeCAFile), no Recommends, no docs
#   config            USER 99:99 (the uid the chart runs HAProxy as), no ENTRYPOINT, CMD
#                     `haproxy -db -f /run/haproxy/haproxy.cfg` (the chart's layout), the
#                     project's LABELs
#   archive           tools/node/oci_archive.py: one reproducible layer (as tools/image/oci.sh)
#
#   tools/image/gateway.sh [--gzip]     --gzip: a compressed layer (the release's)
#
# Named <chart's gateway.image.repository>:<the Dockerfile's VERSION> (the chart's default when
# gateway.image.tag is empty), e.g. ghcr.io/vkprovider/vkprovider-gateway:0.1.0; VKP_GATEWAY_IMAGE_NAME
# overrides it. Load it with `ctr -n k8s.io images import FILE`, `docker load -i FILE` or `skopeo
# copy oci-archive:FILE docker://REGISTRY/...`.
#
# Cached by a hash of its inputs (the mmdebstrap command and mirrors, this script, the packer,
# the name, the flags) at ${VKP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/vkprovider}/gateway-<hash>/
# (rootfs/ and vkprovider-gateway-oci.tar). Needs root (mmdebstrap --mode=root), mmdebstrap
# (installed with apt-get when missing), the project venv (make venv) and the Debian mirrors.
# stdout: only the archive's path; stderr: what is being done.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${VKP_PYTHON:-$repo/.venv/bin/python}"
say() { printf 'gateway-image: %s\n' "$*" >&2; }
die() { printf 'gateway-image: error: %s\n' "$*" >&2; exit 1; }
gzip_flag=()
for arg in "$@"; do
  case "$arg" in
    --gzip) gzip_flag=(--gzip) ;;
    *) die "unknown argument '$arg' (usage: tools/image/gateway.sh [--gzip])" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap --mode=root)"
[ -x "$py" ] || die "$py is missing: run 'make venv' (or set VKP_PYTHON)"
if ! command -v mmdebstrap >/dev/null; then  # an install step, not a reason to skip
  say "installing mmdebstrap (apt-get)"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap; } >&2 \
    || die "mmdebstrap is missing and apt-get could not install it"
fi
t0=$(date +%s)

SUITE=bookworm
# usr-is-merged: satisfies init-system-helpers (a haproxy dependency) once usrmerge is purged
PACKAGES=haproxy,ca-certificates,usr-is-merged
MIRRORS=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
debootstrap=(mmdebstrap --mode=root --variant=essential --include="$PACKAGES"
  --aptopt='Acquire::Retries "3"' --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
  "$SUITE")

version=$(sed -n 's/^ARG VERSION=\(.*\)$/\1/p' "$repo/Dockerfile")
[ -n "$version" ] || die "the Dockerfile has no 'ARG VERSION='"
read -r repository tag < <("$py" -c '
import sys, yaml
image = yaml.safe_load(open(sys.argv[1]))["gateway"]["image"]
print(image["repository"], image.get("tag") or "-")' "$repo/charts/vkprovider/values.yaml") \
  || die "no gateway.image in the chart's values.yaml"
[ "$tag" != "-" ] || tag=$version
name="${VKP_GATEWAY_IMAGE_NAME:-$repository:$tag}"
source=$(sed -n 's/^ARG SOURCE=\(.*\)$/\1/p' "$repo/Dockerfile")
config=(--name="$name" --user=99:99 --workdir=/ --mtime=315532800
  --cmd='["haproxy", "-db", "-f", "/run/haproxy/haproxy.cfg"]'
  --label=org.opencontainers.image.title=vkprovider-gateway
  --label="org.opencontainers.image.description=The vkprovider traffic gateway: Debian's HAProxy, programmed by the provider at runtime"
  --label="org.opencontainers.image.source=$source"
  --label=org.opencontainers.image.licenses=Apache-2.0
  --label="org.opencontainers.image.version=$version"
  "${gzip_flag[@]+"${gzip_flag[@]}"}")

packer="$repo/tools/node/oci_archive.py"
root_key=$(printf '%s\n' "${debootstrap[@]}" "${MIRRORS[@]}" "$(sha256sum <"${BASH_SOURCE[0]}")" | sha256sum | cut -c1-16)
key=$(printf '%s\n' "$root_key" "${config[@]}" "$(sha256sum <"$packer")" \
  "$(sha256sum <"${BASH_SOURCE[0]}")" | sha256sum | cut -c1-16)
cache_root="${VKP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vkprovider}"
mkdir -p "$cache_root"
exec 9>"$cache_root/gateway.lock"
flock 9  # one build at a time per cache
out="$cache_root/gateway-$key"
archive="$out/vkprovider-gateway-oci.tar"
if [ -f "$archive" ]; then  # written under a .tmp name, then renamed: complete if present
  touch "$out"
  say "cached: $archive"
  echo "$archive"
  exit 0
fi

# the root filesystem, shared by every config of the same Debian inputs
rootfs="$cache_root/gateway-rootfs-$root_key"
if [ ! -d "$rootfs" ]; then
  rm -rf "$cache_root"/gateway-rootfs-*.tmp
  say "mmdebstrap $SUITE (essential + $PACKAGES)"
  "${debootstrap[@]}" "$rootfs.tmp" "${MIRRORS[@]}" >&2
  # mmdebstrap installs usrmerge for bookworm, and with it the whole of perl (~50 MB): the root
  # is merged already and usr-is-merged satisfies init-system-helpers, so they go
  chroot "$rootfs.tmp" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl \
    libtext-glob-perl perl perl-modules-5.36 libperl5.36 >&2
  # what no container of it runs: the package manager's caches and lists
  rm -rf "$rootfs.tmp"/var/cache/apt/* "$rootfs.tmp"/var/lib/apt/lists/*
  mv "$rootfs.tmp" "$rootfs"
fi
touch "$rootfs"
[ -x "$rootfs/usr/sbin/haproxy" ] || die "$rootfs has no /usr/sbin/haproxy"
got=$(chroot "$rootfs" /usr/sbin/haproxy -v | head -n 1)
case "$got" in
  "HAProxy version 2.6."*) ;;
  *) die "expected HAProxy 2.6 (the version the tests run), the root has: $got" ;;
esac
[ -s "$rootfs/etc/ssl/certs/ca-certificates.crt" ] || die "$rootfs has no CA bundle"

mkdir -p "$out"
say "packing $name ($got) from $rootfs"
"$py" "$packer" --out="$archive.tmp" --rootfs="$rootfs" "${config[@]}" >&2 \
  || die "tools/node/oci_archive.py failed"
mv "$archive.tmp" "$archive"
# keep the 2 most recently used archives and roots ('gateway-<hex>' never matches 'gateway-rootfs-')
for kind in 'gateway-[0-9a-f]*' 'gateway-rootfs-*'; do
  find "$cache_root" -mindepth 1 -maxdepth 1 -name "$kind" ! -name '*.tmp' -printf '%T@ %p\n' \
    | sort -rn | tail -n +3 | cut -d' ' -f2- | xargs -r rm -rf
done
say "built $archive ($(du -h "$archive" | cut -f1)) in $(( $(date +%s) - t0 ))s"
echo "$archive"

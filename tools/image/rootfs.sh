#!/usr/bin/env bash
# Builds the image's root filesystem without Docker or a container registry and prints its path.
#
# The Dockerfile's final stage is python:3.11-slim-bookworm + a venv at /opt/vkprovider holding
# the project's wheel and its dependencies + user 65532. This builds the equivalent from Debian
# bookworm's own packages (python3 is 3.11 there) with mmdebstrap, then installs the same wheel
# (built from the files .dockerignore lets into the build context) with pip, inside a chroot,
# into a venv at the same path, and creates the same user with the Dockerfile's own commands.
# tests/image/ then runs the Dockerfile's ENTRYPOINT/USER/ENV in it, read-only.
#
# Cached by a hash of its inputs (the package list, the mirrors, this script, the wheel's
# sha256, the Dockerfile's useradd line) under
# ${VKP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/vkprovider}/rootfs-<hash>. The Debian part alone is
# cached as base-<hash> (by the mmdebstrap command and mirrors), so a source change only
# reinstalls the venv (~15 s); a warm run only builds the wheel (~2 s). Dependencies are
# requirements/runtime.lock's, checked against its hashes, as the Dockerfile installs them; the
# lock is part of the hash. Needs root (mmdebstrap --mode=root, chroot), mmdebstrap
# (apt-get install mmdebstrap), the project venv (make venv) and the package registries.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
self="$repo/tools/image/rootfs.sh"
py="${VKP_PYTHON:-$repo/.venv/bin/python}"

SUITE=bookworm
VARIANT=essential
# python3 (3.11), python3-venv (venv + Debian's pip wheel to install with), the slim base's
# runtime extras (CA bundle, /etc/services & co, zoneinfo) and passwd (useradd, as the Dockerfile)
PACKAGES=python3,python3-venv,ca-certificates,netbase,tzdata,passwd
MIRRORS=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
VENV=/opt/vkprovider

say() { printf 'rootfs: %s\n' "$*" >&2; }
die() { printf 'rootfs: error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap --mode=root and chroot)"
if ! command -v mmdebstrap >/dev/null; then  # an install step, not a reason to skip
  say "installing mmdebstrap (apt-get)"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap; } >&2 \
    || die "mmdebstrap is missing and apt-get could not install it"
fi
[ -x "$py" ] || die "$py is missing: run 'make venv' (or set VKP_PYTHON)"

cache_root="${VKP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vkprovider}"
mkdir -p "$cache_root"
exec 9>"$cache_root/rootfs.lock"
flock 9  # one build at a time per cache
t0=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. the wheel, from exactly the files the Docker build context holds, reproducibly
mkdir "$work/src" "$work/dist"
mapfile -t context < <(sed -n 's/^!\([^[:space:]]*\).*/\1/p' "$repo/.dockerignore")
[ "${#context[@]}" -gt 0 ] || die ".dockerignore lists no '!' entries"
tar -C "$repo" --exclude=__pycache__ --exclude='*.py[co]' --exclude='*.egg-info' \
  -cf - "${context[@]}" | tar -C "$work/src" -xf -
SOURCE_DATE_EPOCH=315532800 "$py" -m pip wheel -q --disable-pip-version-check --no-deps \
  --wheel-dir "$work/dist" "$work/src" >&2
wheel="$(ls "$work"/dist/vkprovider-*.whl)"
# the user: the Dockerfile's final-stage RUN that calls useradd, verbatim
user_cmds=$("$py" - "$repo/Dockerfile" <<'PY'
import sys
final = open(sys.argv[1]).read().replace("\\\n", " ").split("\nFROM ")[-1]
print(next(line[4:] for line in final.splitlines() if line.startswith("RUN ") and "useradd" in line))
PY
) || die "the Dockerfile's final stage has no RUN that calls useradd"

debootstrap=(mmdebstrap --mode=root --variant="$VARIANT" --include="$PACKAGES"
  --aptopt='Acquire::Retries "3"'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright' "$SUITE")
base_key=$(printf '%s\n' "${debootstrap[@]}" "${MIRRORS[@]}" | sha256sum | cut -c1-16)
lock="$repo/requirements/runtime.lock"
[ -f "$lock" ] || die "$lock is missing (make lock)"
key=$(printf '%s\n' "$base_key" "$(sha256sum <"$self")" "$(sha256sum <"$wheel")" "$user_cmds" \
  "$(sha256sum <"$lock")" | sha256sum | cut -c1-16)
base="$cache_root/base-$base_key"
out="$cache_root/rootfs-$key"
if [ -d "$out" ]; then  # a directory of that name is only ever made by the final mv
  touch "$out"
  say "cached: $out"
  echo "$out"
  exit 0
fi

# 2. the Debian part (mmdebstrap, root mode: no user namespaces needed)
# a killed build's leftovers: this script's only (the cache is shared with other tools' builds)
rm -rf "$cache_root"/rootfs-*.tmp "$cache_root"/base-*.tmp
if [ ! -d "$base" ]; then
  say "mmdebstrap $SUITE ($VARIANT + $PACKAGES)"
  rm -rf "$base.tmp"
  "${debootstrap[@]}" "$base.tmp" "${MIRRORS[@]}" >&2
  mv "$base.tmp" "$base"
fi
touch "$base"

# 3. the venv: the wheel + its dependencies, installed by pip inside the root, from a wheelhouse
rm -rf "$out.tmp"
cp -a "$base" "$out.tmp"
root="$out.tmp"
host_ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
root_ver=$(chroot "$root" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$host_ver" = "$root_ver" ] || die "the host venv is Python $host_ver, the root's $root_ver:" \
  "the wheelhouse would not fit (set VKP_PYTHON to a Python $root_ver)"
say "wheelhouse (requirements/runtime.lock, hash-checked, for Python $root_ver)"
mkdir "$root/tmp/wheels"
cp "$lock" "$root/tmp/runtime.lock"
"$py" -m pip wheel -q --disable-pip-version-check --wheel-dir "$root/tmp/wheels" \
  --require-hashes -r "$lock" >&2
pip_whl=$(cd "$root" && ls usr/share/python-wheels/pip-*.whl)
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_root /usr/bin/python3 -m venv --without-pip "$VENV"
# as the Dockerfile: the locked dependencies (hashes checked), then the project's wheel alone
in_root "$VENV/bin/python" "/$pip_whl/pip" install -q --disable-pip-version-check \
  --no-cache-dir --no-index --find-links /tmp/wheels --no-deps --require-hashes \
  -r /tmp/runtime.lock >&2
cp "$wheel" "$root/tmp/wheels/"
in_root "$VENV/bin/python" "/$pip_whl/pip" install -q --disable-pip-version-check \
  --no-cache-dir --no-index --no-deps "/tmp/wheels/$(basename "$wheel")" >&2
rm -rf "$root/tmp/wheels" "$root/tmp/runtime.lock" "$root/root/.cache"
in_root /bin/sh -c "$user_cmds"
[ -x "$root$VENV/bin/vkprovider" ] || die "no $VENV/bin/vkprovider after the install"

mv "$root" "$out"
# keep the 3 most recently used rootfs (~400 MB each) and the bases used in the last week
find "$cache_root" -mindepth 1 -maxdepth 1 -name 'rootfs-*' ! -name '*.tmp' \
  -printf '%T@ %p\n' | sort -rn | tail -n +4 | cut -d' ' -f2- | xargs -r rm -rf
find "$cache_root" -mindepth 1 -maxdepth 1 -name 'base-*' ! -path "$base" -mtime +7 \
  -exec rm -rf {} +
say "built $out ($(du -sh "$out" | cut -f1)) in $(( $(date +%s) - t0 ))s"
echo "$out"

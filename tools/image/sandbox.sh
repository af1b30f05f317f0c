#!/usr/bin/env bash
# Runs a command in a root filesystem (tools/image/rootfs.sh) the way the manifests run the
# container, without Docker: root filesystem read-only, a numeric non-root user with no
# capabilities and no_new_privs, new mount/pid/net/ipc/uts namespaces (the command is pid 1, the
# network is loopback only), a clean environment, and nothing writable but what -t/-v mount.
#
#   sandbox.sh [-u UID:GID] [-e NAME=VALUE]... [-t PATH]... [-v HOST:PATH[:rw]]... ROOTFS CMD...
#
#   -u  user and group (default 65532:65532); HOME defaults to the user's /etc/passwd entry
#   -e  an environment variable (nothing else is passed; PATH defaults to Debian's)
#   -t  a tmpfs at PATH, writable by anyone (the stand-in for an emptyDir)
#   -v  a bind mount of a host file or directory, read-only unless :rw (a configMap, a secret)
#
# How: an overlay whose upper layer is a private tmpfs takes the mount points (so ROOTFS itself
# is never changed), /proc, a minimal /dev and the volumes are mounted, then the overlay and /dev
# are remounted read-only and `chroot --userspec` drops to the user. Needs root, util-linux
# (unshare, setpriv), coreutils (chroot, env); iproute2 (ip) to bring loopback up, if present.
# The exit status is the command's; 125 is this script's own failure.
set -euo pipefail
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
die() { printf 'sandbox: error: %s\n' "$*" >&2; exit 125; }
usage="usage: sandbox.sh [-u UID:GID] [-e N=V]... [-t PATH]... [-v HOST:PATH[:rw]]... ROOTFS CMD..."

if [ "${1:-}" != --inside ]; then
  [ "$(id -u)" = 0 ] || die "needs root (mount namespaces, chroot)"
  stage="$(mktemp -d)"
  rc=0
  unshare --mount --propagation private --pid --net --ipc --uts --fork --kill-child \
    -- bash "$self" --inside "$stage" "$@" || rc=$?
  rmdir "$stage" 2>/dev/null || true
  exit "$rc"
fi
stage="$2"
shift 2

user=65532:65532
envs=() tmpfs=() vols=()
while getopts "u:e:t:v:" opt; do
  case "$opt" in
    u) user="$OPTARG" ;;
    e) envs+=("$OPTARG") ;;
    t) tmpfs+=("$OPTARG") ;;
    v) vols+=("$OPTARG") ;;
    *) die "$usage" ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || die "$usage"
[ -x "$1/bin/sh" ] || die "$1 is not a root filesystem"
root="$(cd "$1" && pwd)"
shift
uid="${user%%:*}" gid="${user#*:}"
case "$uid$gid" in *[!0-9]*|"") die "-u takes numeric UID:GID, not $user" ;; esac

# the root: an overlay (lower: ROOTFS, read-only; upper: a tmpfs gone with this namespace)
mount -t tmpfs -o mode=0700 sandbox "$stage"
mkdir "$stage/upper" "$stage/work" "$stage/root"
r="$stage/root"
mount -t overlay overlay -o "lowerdir=$root,upperdir=$stage/upper,workdir=$stage/work" "$r"

mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
mkdir -p "$r/dev"
mount -t tmpfs -o mode=0755,nosuid,noexec dev "$r/dev"
for node in null zero full random urandom tty; do
  touch "$r/dev/$node"
  mount --bind "/dev/$node" "$r/dev/$node"
done
ln -s /proc/self/fd "$r/dev/fd"
ln -s /proc/self/fd/0 "$r/dev/stdin"
ln -s /proc/self/fd/1 "$r/dev/stdout"
ln -s /proc/self/fd/2 "$r/dev/stderr"
mount -o remount,ro,bind "$r/dev"

# a container path as a host path under $r, its symlinks resolved inside the root (/var/run is
# a link to /run: followed on the host it would leave the root)
inside() {
  case "$1" in /*) ;; *) die "$1: not an absolute path" ;; esac
  printf '%s%s' "$r" "$(chroot "$r" /usr/bin/realpath -m -- "$1")"
}
for path in "${tmpfs[@]+"${tmpfs[@]}"}"; do
  at="$(inside "$path")"
  mkdir -p "$at"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$at"
done
for vol in "${vols[@]+"${vols[@]}"}"; do
  IFS=: read -r host path mode <<<"$vol"
  [ -e "$host" ] || die "-v $vol: $host does not exist"
  at="$(inside "$path")"
  if [ -d "$host" ]; then mkdir -p "$at"; else mkdir -p "$(dirname "$at")"; touch "$at"; fi
  mount --bind "$host" "$at"
  [ "${mode:-ro}" = rw ] || mount -o remount,ro,bind "$at"
done
mount -o remount,ro "$r"  # from here on nothing but the tmpfs/rw mounts is writable

if command -v ip >/dev/null; then ip link set lo up; fi
home=$(awk -F: -v u="$uid" '$3 == u { print $6; exit }' "$r/etc/passwd")
base_env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "HOME=${home:-/}")
exec "$(command -v env)" -i "${base_env[@]}" "${envs[@]+"${envs[@]}"}" \
  "$(command -v setpriv)" --no-new-privs \
  "$(command -v chroot)" --userspec="$uid:$gid" --groups="$gid" "$r" "$@"

#!/usr/bin/env bash
# Sets up everything the tests (and the demo) need on this machine, the same way for a newcomer's
# `make test` and for CI (.ci/run calls `make test`, which calls this): so CI cannot be green where
# a fresh clone is red. Each step is cached; a warm run takes a few seconds.
#
#   tools/setup.sh [STEP...]      default: every step, in this order
#
#   system        Debian packages the steps and tests call, installed with apt-get when missing
#                 (as root; otherwise it stops and prints the apt-get command): mmdebstrap (the
#                 image's root filesystem), util-linux (unshare, setpriv, flock: the image sandbox
#                 and Kueue's private /etc), haproxy (the traffic gateway's tests run it for real),
#                 python3-venv (make venv). Go >= 1.26 is checked, not
#                 installed (Debian's is older): see go.dev/doc/install.
#   venv          .venv with the dev extras (make venv)
#   controlplane  etcd, kube-apiserver, kube-controller-manager, kube-scheduler (tools/controlplane)
#   kubectl       kubectl v1.37.2 (tools/kubectl; the quickstart test runs the page with it)
#   helm          helm v4 (tools/helm; the chart tests)
#   kueue         the Kueue v0.17.0 manager and its CRDs (tools/kueue; the way-out tests, the demo)
#   node          a real worker node's parts (tools/node): containerd, runc, CNI plugins, iptables,
#                 conntrack, busybox-static from Debian (install-deps.sh), kubelet, kube-proxy
#                 v1.37.2 and pause from their Go modules (build.sh; the real-node e2e)
#   rootfs        the image's root filesystem (tools/image/rootfs.sh; tests/image)
#   image         the image as an OCI archive, built from that root filesystem and the
#                 Dockerfile's config without Docker (tools/image/oci.sh; tests/image, the
#                 real-node install e2e)
#   gateway-image the traffic gateway's image (Debian's HAProxy 2.6 + CA certificates) as an OCI
#                 archive (tools/image/gateway.sh, as root with mmdebstrap; cached; the real-node
#                 gateway e2e installs the chart's gateway Deployment from it)
#
# stdout: only `export NAME=VALUE` lines (VKP_CONTROLPLANE_BIN, VKP_KUBECTL_BIN, VKP_HELM_BIN,
# VKP_KUEUE_BIN, VKP_NODE_BIN, VKP_ROOTFS, VKP_IMAGE_ARCHIVE, VKP_GATEWAY_IMAGE_ARCHIVE), for `eval "$(bash tools/setup.sh)"`;
# the Makefile does exactly that.
# stderr: what is being done. A cold Go build is narrated (what, roughly how long, and every 20 s
# how long so far, how many modules were downloaded and which package is being compiled), so
# that the first run's ~15 minutes are never silent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
t0=$(date +%s)
say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }
ALL=(system venv controlplane kubectl helm kueue node rootfs image gateway-image)
steps=("$@")
[ "${#steps[@]}" -gt 0 ] || steps=("${ALL[@]}")
for s in "${steps[@]}"; do
  case " ${ALL[*]} " in *" $s "*) ;; *) die "unknown step '$s' (steps: ${ALL[*]})" ;; esac
done
want() { case " ${steps[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
needs_go() { want controlplane || want kubectl || want helm || want kueue || want node; }

# ---- system: Go, Python, Debian packages --------------------------------------------------------
GO_MIN=1.26
check_go() {
  local v
  command -v go >/dev/null || die "Go >= $GO_MIN is required (no 'go' on PATH): the control plane," \
    "kubectl, helm and Kueue are built from their Go modules; install it from https://go.dev/doc/install"
  v=$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null) || die "Go >= $GO_MIN is required ('go env' failed)"
  v=${v#go}
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%[!0-9]*}
  if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "${minor:-0}" -lt "${GO_MIN#1.}" ]; }; then
    die "Go >= $GO_MIN is required, this machine has go$v (install from https://go.dev/doc/install)"
  fi
}

# command -> the Debian package that ships it
# (haproxy: the traffic gateway the gateway tests run for real, vkprovider/testing/haproxy.py)
declare -A PKG=([mmdebstrap]=mmdebstrap [unshare]=util-linux [setpriv]=util-linux
                [flock]=util-linux [chroot]=coreutils [haproxy]=haproxy)
system() {
  local -a missing=() pkgs=()
  local cmd
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || die "Python >= 3.11 is required as python3"
  for cmd in "${!PKG[@]}"; do
    want rootfs || want image || want gateway-image || [ "$cmd" != mmdebstrap ] || continue
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  if ! [ -x .venv/bin/python ] && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    missing+=("python3 -m venv")
    pkgs+=(python3-venv)
  fi
  for cmd in "${missing[@]+"${missing[@]}"}"; do
    [ -n "${PKG[$cmd]:-}" ] && pkgs+=("${PKG[$cmd]}")
  done
  if [ "${#pkgs[@]}" -gt 0 ]; then
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    local install="apt-get install -y ${pkgs[*]}"
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}: run '$install' as root, then again"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install ${pkgs[*]}"
    say "installing Debian packages ${pkgs[*]} (for ${missing[*]}): apt-get update && $install"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}"; } >&2 \
      || die "apt-get could not install ${pkgs[*]}"
  fi
  if needs_go; then check_go; fi
}

# ---- a build, narrated --------------------------------------------------------------------------
# The package the go build under PID is compiling now (its `compile -p PKG` child), if any.
compiling() {
  ps -e -o pid=,ppid=,args= 2>/dev/null | awk -v root="$1" '
    { parent[$1] = $2; line[$1] = $0 }
    END {
      for (p in line) {
        q = p; hops = 0
        while (q in parent && q != root && hops < 20) { q = parent[q]; hops++ }
        if (q != root) continue
        n = split(line[p], w, " ")
        if (w[3] ~ /\/compile$/) { for (i = 3; i < n; i++) if (w[i] == "-p") { print w[i+1]; exit } }
        if (w[3] ~ /\/link$/) { print "(linking)"; exit }
      }
    }'
}

# build VAR LABEL ESTIMATE SCRIPT: runs SCRIPT (a tools/*/build.sh: prints its cache folder),
# narrating a cold build; sets VAR to the folder.
build() {
  local var=$1 label=$2 estimate=$3 script=$4
  local log out pid start now next=20 rc=0 pkg downloads
  log=$(mktemp) out=$(mktemp)
  start=$(date +%s)
  # its own session, so that a Ctrl-C or kill of this script ends the whole build (the trap)
  setsid bash "$script" >"$out" 2>"$log" &
  pid=$!
  trap 'kill -TERM -- "-$pid" 2>/dev/null; exit 130' INT TERM
  for _ in 1 2 3 4 5 6 7 8 9 10; do  # a warm build prints its folder at once
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "building $label from its Go module: about $estimate on 2 cores the first time, cached" \
      "afterwards (progress every 20 s; the full output is in $log)"
    while kill -0 "$pid" 2>/dev/null; do
      sleep 1
      now=$(( $(date +%s) - start ))
      if [ "$now" -ge "$next" ]; then
        next=$(( now + 20 ))
        downloads=$(grep -c '^go: downloading' "$log" || true)
        pkg=$(compiling "$pid")
        say "  still building $label (${now}s; $downloads modules downloaded${pkg:+; compiling $pkg})"
      fi
    done
  fi
  wait "$pid" || rc=$?
  trap - INT TERM
  if [ "$rc" -ne 0 ]; then
    tail -n 30 "$log" >&2
    die "building $label failed (exit $rc; $script): the last lines of its output are above"
  fi
  printf -v "$var" '%s' "$(tail -n 1 "$out")"
  now=$(( $(date +%s) - start ))
  if [ "$now" -ge 2 ]; then say "built $label in ${now}s: ${!var}"; else say "$label: cached, ${!var}"; fi
  rm -f "$log" "$out"
}

emit() { printf 'export %s=%q\n' "$1" "$2"; }

want system && system
if ! want system && needs_go; then check_go; fi
if want venv; then
  say "python environment: .venv with the dev extras (make venv)"
  make -s venv >&2
fi
if want controlplane; then
  build VKP_CONTROLPLANE_BIN "the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.37.2)" \
    "8 minutes" tools/controlplane/build.sh
  emit VKP_CONTROLPLANE_BIN "$VKP_CONTROLPLANE_BIN"
fi
if want kubectl; then
  build VKP_KUBECTL_BIN "kubectl v1.37.2" "3 minutes" tools/kubectl/build.sh
  emit VKP_KUBECTL_BIN "$VKP_KUBECTL_BIN"
fi
if want helm; then
  build VKP_HELM_BIN "helm v4" "2 minutes" tools/helm/build.sh
  emit VKP_HELM_BIN "$VKP_HELM_BIN"
fi
if want kueue; then
  build VKP_KUEUE_BIN "Kueue v0.17.0" "4 minutes" tools/kueue/build.sh
  emit VKP_KUEUE_BIN "$VKP_KUEUE_BIN"
fi
if want node; then
  say "a real worker node's Debian packages (tools/node/install-deps.sh: containerd, runc, CNI plugins, iptables; apt-get when missing)"
  bash tools/node/install-deps.sh >&2 || die "tools/node/install-deps.sh failed (its output is above)"
  build VKP_NODE_BIN "kubelet, kube-proxy v1.37.2 and pause" "4 minutes" tools/node/build.sh
  emit VKP_NODE_BIN "$VKP_NODE_BIN"
fi
if want rootfs; then
  [ -x .venv/bin/python ] || die "the image's root filesystem needs .venv: run 'make venv' (or add the venv step)"
  say "the image's root filesystem (tools/image/rootfs.sh: 2-4 minutes the first time, as root, with mmdebstrap and the Debian mirrors; cached)"
  VKP_ROOTFS=$(bash tools/image/rootfs.sh) || die "tools/image/rootfs.sh failed (its output is above)"
  emit VKP_ROOTFS "$VKP_ROOTFS"
fi
if want image; then
  [ -x .venv/bin/python ] || die "the image needs .venv: run 'make venv' (or add the venv step)"
  say "the image as an OCI archive (tools/image/oci.sh: ~10 s the first time for a root filesystem; cached)"
  # the root filesystem of this run's rootfs step, else oci.sh asks rootfs.sh (never a stale one)
  own_rootfs=""
  if want rootfs; then own_rootfs=$VKP_ROOTFS; fi
  VKP_IMAGE_ARCHIVE=$(VKP_ROOTFS="$own_rootfs" bash tools/image/oci.sh) \
    || die "tools/image/oci.sh failed (its output is above)"
  emit VKP_IMAGE_ARCHIVE "$VKP_IMAGE_ARCHIVE"
fi
if want gateway-image; then
  [ -x .venv/bin/python ] || die "the gateway image needs .venv: run 'make venv' (or add the venv step)"
  say "the traffic gateway's image as an OCI archive (tools/image/gateway.sh: ~30 s the first time, as root, with mmdebstrap and the Debian mirrors; cached)"
  VKP_GATEWAY_IMAGE_ARCHIVE=$(bash tools/image/gateway.sh) \
    || die "tools/image/gateway.sh failed (its output is above)"
  emit VKP_GATEWAY_IMAGE_ARCHIVE "$VKP_GATEWAY_IMAGE_ARCHIVE"
fi
say "ready in $(( $(date +%s) - t0 ))s"

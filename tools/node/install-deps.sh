#!/usr/bin/env bash
# Installs what a real worker node needs from Debian's packages, when missing: containerd and runc
# (the container runtime), containernetworking-plugins (bridge/host-local/loopback CNI plugins in
# /usr/lib/cni), iptables (kube-proxy's iptables mode and the kubelet's own chains), conntrack
# (kube-proxy clears stale UDP entries with it), busybox-static (the one binary of the test image,
# see images.py) and iproute2/util-linux (ip netns, nsenter: the node lives in its own network
# namespace). Idempotent and quiet when everything is present; needs root (apt-get). The Go-built
# parts (kubelet, kube-proxy) come from tools/node/build.sh instead.
set -euo pipefail
# command or file that proves each package is installed -> the package
declare -A need=(
  [containerd]=containerd
  [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins
  [iptables]=iptables
  [conntrack]=conntrack
  [/bin/busybox]=busybox-static
  [ip]=iproute2
  [nsenter]=util-linux
)
missing=()
for probe in "${!need[@]}"; do
  if [[ $probe == /* ]]; then [ -e "$probe" ] && continue
  else command -v "$probe" >/dev/null && continue; fi
  missing+=("${need[$probe]}")
done
# busybox (dynamic) also provides /bin/busybox; the image needs the static one
if [ -e /bin/busybox ] && ! dpkg -s busybox-static >/dev/null 2>&1; then missing+=(busybox-static); fi
[ "${#missing[@]}" -eq 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "install-deps: needs root to install: ${missing[*]}" >&2; exit 1; }
echo "tools/node: installing ${missing[*]} (apt-get)" >&2
{
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
} >&2

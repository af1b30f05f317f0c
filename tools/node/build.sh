#!/usr/bin/env bash
# Builds the node agents, kubelet and kube-proxy (k8s.io/kubernetes/cmd/kubelet and cmd/kube-proxy
# at the control plane's version, pinned in go.mod/go.sum through tools.go), into a cache folder
# keyed by a hash of this module's inputs, like tools/controlplane/build.sh. A warm run (same hash,
# binaries present) does nothing. Prints the folder; the binaries are "<folder>/kubelet",
# "<folder>/kube-proxy" and "<folder>/pause" (the sandbox image's one binary, from pause/).
# Kept apart from tools/controlplane so the control plane's cache key (and its ten-minute cold
# build) does not change when the node's pins do. Built cgo-free (CGO_ENABLED=0) like the
# control plane: the real-node e2e needs no cgo-only kubelet feature.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
K8S=v1.37.2
MINOR=$(echo "$K8S" | cut -d. -f2)
key=$(cat go.mod go.sum tools.go pause/main.go build.sh | sha256sum | cut -c1-16)
cache="${VKP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vkprovider}/node-$key"
if [ -f "$cache/.complete" ]; then
  echo "$cache"
  exit 0
fi
LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X $p.gitVersion=$K8S -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
done
rm -rf "$cache.tmp"
mkdir -p "$cache.tmp"
start=$(date +%s)
echo "tools/node: building kubelet and kube-proxy $K8S into $cache" \
  "(about 2 min with a warm Go build cache, 10 min or more cold on 2 cores)" >&2
go build -mod=readonly -trimpath -ldflags "$LD" -o "$cache.tmp/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy >&2
go build -mod=readonly -trimpath -ldflags "-s -w" -o "$cache.tmp/pause" ./pause >&2
echo "tools/node: built in $(( $(date +%s) - start )) s" >&2
rm -rf "$cache"
mv "$cache.tmp" "$cache"
touch "$cache/.complete"
echo "$cache"

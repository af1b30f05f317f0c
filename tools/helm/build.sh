#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v4/cmd/helm, pinned in go.mod/go.sum through tools.go) into a cache
# folder keyed by a hash of this module's inputs, like tools/controlplane/build.sh. A warm run
# (same hash, binary present) does nothing. Prints the folder; the binary is "<folder>/helm".
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
cache="${VKP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vkprovider}/helm-$key"
if [ -f "$cache/.complete" ]; then
  echo "$cache"
  exit 0
fi
V=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
LD="-s -w -X helm.sh/helm/v4/internal/version.version=$V"
LD="$LD -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
rm -rf "$cache.tmp"
mkdir -p "$cache.tmp"
go build -mod=readonly -trimpath -ldflags "$LD" -o "$cache.tmp/helm" helm.sh/helm/v4/cmd/helm >&2
rm -rf "$cache"
mv "$cache.tmp" "$cache"
touch "$cache/.complete"
echo "$cache"

#!/usr/bin/env bash
# Builds govk (one virtual node on the upstream Go virtual-kubelet library with an in-memory
# provider, the yardstick of bench/burst.py --compare-go) into a cache folder keyed by a hash of
# this module's inputs, like tools/controlplane/build.sh. A warm run (same hash, binary present)
# does nothing. Prints the folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
key=$(cat go.mod go.sum ./*.go build.sh | sha256sum | cut -c1-16)
cache="${VKP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vkprovider}/govk-$key"
if [ -f "$cache/.complete" ]; then
  echo "$cache"
  exit 0
fi
rm -rf "$cache.tmp"
mkdir -p "$cache.tmp"
go build -mod=readonly -trimpath -ldflags "-s -w" -o "$cache.tmp/govk" . >&2
rm -rf "$cache"
mv "$cache.tmp" "$cache"
touch "$cache/.complete"
echo "$cache"

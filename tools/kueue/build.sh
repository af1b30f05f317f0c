#!/usr/bin/env bash
# Builds the Kueue manager (sigs.k8s.io/kueue/cmd/kueue v0.17.0, pinned in go.mod/go.sum through
# tools.go; a module of its own because Kueue pins other k8s.io versions than tools/controlplane)
# into a cache folder keyed by a hash of this module's inputs, like tools/controlplane/build.sh.
# A warm run (same hash, folder complete) does nothing. Prints the folder:
#   <folder>/kueue                    the manager binary
#   <folder>/config/crd/              the module's config/components/crd (bases/*.yaml, the
#                                     conversion-webhook patches/ and kustomization.yaml)
#   <folder>/config/webhook/          the module's config/components/webhook (manifests.yaml,
#                                     kustomization.yaml with its namespaceSelector patches)
# The YAML is copied from the Go module cache at the pinned version, so the CRDs always match the
# binary. vkprovider/testing/kueue.py installs them and points the webhooks at loopback.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
key=$(cat go.mod go.sum tools.go build.sh | sha256sum | cut -c1-16)
cache="${VKP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vkprovider}/kueue-$key"
if [ -f "$cache/.complete" ]; then
  echo "$cache"
  exit 0
fi
V=$(go list -m -f '{{.Version}}' sigs.k8s.io/kueue)
LD="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$V"
LD="$LD -X sigs.k8s.io/kueue/pkg/version.GitCommit=$V -X sigs.k8s.io/kueue/pkg/version.BuildDate=-"
rm -rf "$cache.tmp"
mkdir -p "$cache.tmp/config"
go build -mod=readonly -trimpath -ldflags "$LD" -o "$cache.tmp/kueue" sigs.k8s.io/kueue/cmd/kueue >&2
src=$(go list -mod=readonly -m -f '{{.Dir}}' sigs.k8s.io/kueue)
cp -R "$src/config/components/crd" "$cache.tmp/config/crd"
cp -R "$src/config/components/webhook" "$cache.tmp/config/webhook"
chmod -R u+w "$cache.tmp"
rm -rf "$cache"
mv "$cache.tmp" "$cache"
touch "$cache/.complete"
echo "$cache"

#!/usr/bin/env bash
# One-off: (re)generates go.mod/go.sum from the k8s release's own go.mod. Run by a developer when
# bumping versions, never by CI (CI uses the committed go.mod/go.sum).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export GOTOOLCHAIN=local CGO_ENABLED=0
K8S=${K8S:-v1.37.2}; STG=v0.${K8S#v1.}
rm -f go.mod go.sum
go mod init vkprovider.invalid/controlplane
GM=$(go mod download -json "k8s.io/kubernetes@$K8S" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
for m in $(awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\//{print $1}' "$GM"); do go mod edit -replace="$m=$m@$STG"; done
go mod edit -require="k8s.io/kubernetes@$K8S"
go get -tool k8s.io/kubernetes/cmd/kube-apiserver@$K8S k8s.io/kubernetes/cmd/kube-controller-manager@$K8S k8s.io/kubernetes/cmd/kube-scheduler@$K8S
EV=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3 2>/dev/null || go list -m -f '{{.Version}}' go.etcd.io/etcd/client/v3)
go get -tool "go.etcd.io/etcd/server/v3@$EV"
go mod tidy

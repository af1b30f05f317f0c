//go:build tools

// Package tools pins helm.sh/helm/v4 in go.mod/go.sum: build.sh builds its cmd/helm with
// `go build helm.sh/helm/v4/cmd/helm` from this module, so the requirement must stay.
package tools

import _ "helm.sh/helm/v4/cmd/helm"

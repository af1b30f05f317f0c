//go:build tools

// Package tools pins sigs.k8s.io/kueue in go.mod/go.sum: build.sh builds its cmd/kueue with
// `go build sigs.k8s.io/kueue/cmd/kueue` from this module, so the requirement must stay.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"

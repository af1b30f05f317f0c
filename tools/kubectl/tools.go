//go:build tools

// Package tools pins kubectl (k8s.io/kubernetes/cmd/kubectl) at the control plane's version, so
// the quickstart test runs the real kubectl a user would; build.sh builds it from here.
package tools

import _ "k8s.io/kubernetes/cmd/kubectl"

//go:build tools

// Package tools pins the node agents (k8s.io/kubernetes/cmd/kubelet and cmd/kube-proxy) at the
// control plane's version, so the real-node e2e runs the kubelet and kube-proxy a user's node
// would; build.sh builds them from here.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)

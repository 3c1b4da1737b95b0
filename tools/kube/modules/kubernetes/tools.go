//go:build tools

// The main packages this module exists to build; the build tag keeps the file out of every
// build, while `go mod tidy` still records the modules they need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)

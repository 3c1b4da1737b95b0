// The wrapper module kube-apiserver, kube-controller-manager and kube-scheduler are built in.
// real_kube.sh copies it, adds `require k8s.io/kubernetes <version>` and one replace per staging
// module that version requires at v0.0.0 (read from its own go.mod), then tidies and builds.
module nodeflow.local/kube-build/kubernetes

go 1.26.0

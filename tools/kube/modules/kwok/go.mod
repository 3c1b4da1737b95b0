// The wrapper module kwok is built in; real_kube.sh adds the pinned
// `require sigs.k8s.io/kwok <version>` to a copy before building.
module nodeflow.local/kube-build/kwok

go 1.26.0

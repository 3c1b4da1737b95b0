// The wrapper module etcd is built in; real_kube.sh adds the pinned
// `require go.etcd.io/etcd/server/v3 <version>` to a copy before building.
module nodeflow.local/kube-build/etcd

go 1.26.0

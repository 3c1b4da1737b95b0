#!/usr/bin/env bash
# A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and KWOK (fake nodes, no kubelet, no containers), built from their Go modules.
#
#   tools/kube/real_kube.sh build   # build (or reuse) the binaries
#   tools/kube/real_kube.sh start   # build if needed, start, print `export NODEFLOW_KUBE_...` lines
#   tools/kube/real_kube.sh nodes 16  # add the simulator's 16 GPU nodes as KWOK nodes
#   tools/kube/real_kube.sh stop
#
# Needs Go (1.26) and the Go module proxy. The binaries are cached by version under $KUBE_CACHE,
# so only the first build on a machine is slow; `build` prints how long each one took.
# Everything listens on 127.0.0.1 on free ports; the state (certificates, etcd data, logs,
# kubeconfig) lives in $KUBE_STATE and is removed by `stop`.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
KUBE_CACHE="${KUBE_CACHE:-/var/tmp/nodeflow-kube}"
KUBE_STATE="${KUBE_STATE:-/var/tmp/nodeflow-kube/run}"
# The machine is shared: a low priority and two parallel compile jobs at most.
BUILD_JOBS="${KUBE_BUILD_JOBS:-2}"
# The fake GPU nodes: as many, and shaped, as the simulator's for the same NODES/TOPOLOGY.
KUBE_NODES="${KUBE_NODES:-16}"
KUBE_TOPOLOGY="${KUBE_TOPOLOGY:-}"
# KUBE_SCHEDULER=0 and KUBE_CRDS=0 start the bare API machinery the emulator's conformance
# fixture is (no scheduler to mark pods Unschedulable, no CRD installed yet); `scheduler` and
# `crds` add them later.
KUBE_SCHEDULER="${KUBE_SCHEDULER:-1}"
KUBE_CRDS="${KUBE_CRDS:-1}"
# KUBE_POD_STAGES=0: KWOK keeps its nodes Ready but leaves pods alone, as the emulator's bare
# API server does (the conformance suite binds pods and sets their status itself).
KUBE_POD_STAGES="${KUBE_POD_STAGES:-1}"
# The client rate limit of kube-controller-manager and kube-scheduler (their own defaults, 20
# and 50 QPS, when empty). Clusters of thousands of nodes raise it, as `make bench` does: at 20
# QPS the node lifecycle controller takes minutes to lift the not-ready taint of new nodes and
# at 50 the scheduler binds at most 50 pods a second.
KUBE_CLIENT_QPS="${KUBE_CLIENT_QPS:-}"
# KWOK's node lease, renewed every quarter of it as a kubelet does (40 s: 100 renewals a second
# per 1,000 nodes). With thousands of nodes on a small machine the renewals fall behind and the
# nodes flap NotReady; a longer lease (the node lifecycle controller's grace follows it) keeps
# the heartbeat load where a larger control plane would carry it.
KUBE_NODE_LEASE_SECONDS="${KUBE_NODE_LEASE_SECONDS:-40}"
# KUBE_AUDIT=1: the API server logs every write request it answered (who, user agent, verb,
# resource; never a body) to $KUBE_STATE/audit.log, so a benchmark can count each client's
# writes (`make bench`'s nodeset_real_kube compares the DaemonSet controller's with ours).
KUBE_AUDIT="${KUBE_AUDIT:-0}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KUBE_BIN="$KUBE_CACHE/kubernetes-$KUBE_VERSION/bin"
ETCD_BIN="$KUBE_CACHE/etcd-$ETCD_VERSION/bin"
KWOK_BIN="$KUBE_CACHE/kwok-$KWOK_VERSION/bin"
KUBE_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)
# The Workload API (scheduling.k8s.io/v1alpha2: PodGroup with its disruptionMode, KEP-4671), an
# alpha API Kubernetes 1.36 serves only when enabled: topology-placer reads its PodGroups'
# disruption mode. The controller manager removes a PodGroup's protection finalizer with the
# same gates; kube-scheduler keeps its defaults (it schedules such pods one by one).
WORKLOAD_API_GATES=GenericWorkload=true,GangScheduling=true,WorkloadAwarePreemption=true
# The fake nodes are rendered by the simulator's own code (clustersim.cluster.spec).
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

log() { echo "real_kube: $*" >&2; }

# -trimpath and -s -w: reproducible paths, and no symbol tables for the linker to hold in memory.
go_build() {
    nice -n 10 env GOFLAGS=-trimpath CGO_ENABLED=0 GOTOOLCHAIN=local \
        go build -p "$BUILD_JOBS" "$@"
}

# A copy of a committed wrapper module, in a scratch directory of the cache.
wrapper_copy() {
    local name="$1" dir="$KUBE_CACHE/build/$1"
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$HERE/modules/$name/go.mod" "$HERE/modules/$name/tools.go" "$dir/"
    echo "$dir"
}

timed() {
    local what="$1" start=$SECONDS
    shift
    "$@"
    log "built $what in $((SECONDS - start)) s"
}

# The staging modules (k8s.io/api, k8s.io/client-go, ...) that k8s.io/kubernetes requires at
# v0.0.0 and maps to ./staging/src in its own go.mod, read from the go.mod of that version.
staging_modules() {
    local gomod="$1"
    go mod edit -json "$gomod" | python3 -c '
import json, sys
mod = json.load(sys.stdin)
local = {r["Old"]["Path"] for r in mod.get("Replace") or [] if r["New"]["Path"].startswith("./staging/")}
for req in mod.get("Require") or []:
    if req["Version"] == "v0.0.0" and req["Path"] in local:
        print(req["Path"])
'
}

build_kubernetes() {
    if [[ -x "$KUBE_BIN/kube-scheduler" ]]; then
        return
    fi
    local dir gomod staging_version minor ldflags pkg component
    dir="$(wrapper_copy kubernetes)"
    gomod="$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["GoMod"])')"
    # v1.36.3 of k8s.io/kubernetes publishes its staging modules as v0.36.3.
    staging_version="v0.${KUBE_VERSION#v1.}"
    minor="${KUBE_VERSION#v1.}"
    minor="${minor%%.*}"
    (
        cd "$dir"
        go mod edit -require="k8s.io/kubernetes@$KUBE_VERSION"
        for pkg in $(staging_modules "$gomod"); do
            go mod edit -replace="$pkg=$pkg@$staging_version"
        done
        log "tidying the kubernetes wrapper module ($(grep -c '=>' go.mod) staging replaces)"
        nice -n 10 go mod tidy
    )
    # The module proxy does not carry the commit a version was tagged at: gitCommit stays empty
    # rather than made up. The version itself drives feature gates and --version.
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean"
        ldflags+=" -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    mkdir -p "$KUBE_BIN.tmp"
    for component in "${KUBE_COMPONENTS[@]}"; do
        (cd "$dir" && timed "$component $KUBE_VERSION" go_build -ldflags="$ldflags" \
            -o "$KUBE_BIN.tmp/$component" "k8s.io/kubernetes/cmd/$component")
    done
    rm -rf "$KUBE_BIN"
    mv "$KUBE_BIN.tmp" "$KUBE_BIN"
}

build_etcd() {
    if [[ -x "$ETCD_BIN/etcd" ]]; then
        return
    fi
    local dir
    dir="$(wrapper_copy etcd)"
    (
        cd "$dir"
        go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
        nice -n 10 go mod tidy
        mkdir -p "$ETCD_BIN"
        timed "etcd $ETCD_VERSION" go_build -ldflags="-s -w" -o "$ETCD_BIN/etcd.tmp" \
            go.etcd.io/etcd/server/v3
        mv "$ETCD_BIN/etcd.tmp" "$ETCD_BIN/etcd"
    )
}

build_kwok() {
    if [[ -x "$KWOK_BIN/kwok" ]]; then
        return
    fi
    local dir
    dir="$(wrapper_copy kwok)"
    (
        cd "$dir"
        go mod edit -require="sigs.k8s.io/kwok@$KWOK_VERSION"
        nice -n 10 go mod tidy
        mkdir -p "$KWOK_BIN"
        timed "kwok $KWOK_VERSION" go_build \
            -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
            -o "$KWOK_BIN/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
        mv "$KWOK_BIN/kwok.tmp" "$KWOK_BIN/kwok"
    )
}

build() {
    command -v go >/dev/null || {
        log "go not found: the real control plane is built from Go modules (Go 1.26)"
        exit 1
    }
    build_etcd
    build_kwok
    kwok_stages
    build_kubernetes
    log "binaries: $KUBE_BIN $ETCD_BIN $KWOK_BIN"
}

# KWOK runs no kubelet and ships no stage by default outside kwokctl: the stages kwokctl enables
# (node-initialize, node heartbeat with a lease, pod-ready, pod-complete, pod-delete) are copied
# from the same kwok version's module, so they always match the binary.
kwok_stages() {
    local dir file stages="$KWOK_BIN/stages.yaml"
    [[ -s "$stages" ]] && return
    dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
    {
        for file in node/fast/node-initialize.yaml \
            node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
            pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
            echo "---"
            cat "$dir/kustomize/stage/$file"
        done
    } >"$stages.tmp"
    mv "$stages.tmp" "$stages"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

random_token() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# Run a component in its own session, its output in a log, its pid in a file for `stop`.
launch() {
    local name="$1"
    shift
    setsid "$@" </dev/null >"$KUBE_STATE/logs/$name.log" 2>&1 &
    echo $! >"$KUBE_STATE/pids/$name"
}

# Wait until a command succeeds (every half second, `tries` times); else show the log, fail.
wait_for() {
    local what="$1" log="$2" tries="$3"
    shift 3
    for _ in $(seq 1 "$tries"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    log "$what not ready; last lines of $KUBE_STATE/logs/$log.log:"
    tail -n 30 "$KUBE_STATE/logs/$log.log" >&2 || true
    return 1
}

write_kubeconfig() {
    local user="$1" token="$2" file="$3"
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodeflow-real
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $KUBE_STATE/pki/ca.crt
users:
- name: $user
  user:
    token: $token
contexts:
- name: $user@nodeflow-real
  context: {cluster: nodeflow-real, user: $user}
current-context: $user@nodeflow-real
EOF
    chmod 0600 "$file"
}

# The simulator's nodes for this count and topology, as KWOK nodes; back once KWOK has made
# every one Ready.
add_nodes() {
    local count="$1" topology="$2" kubectl=(kubectl --kubeconfig="$KUBE_STATE/kubeconfig")
    "$PYTHON" "$HERE/fake_nodes.py" --nodes "$count" --topology "$topology" |
        "${kubectl[@]}" create -f - >/dev/null
    all_nodes_ready "$((120 + count / 10))" || {
        log "KWOK did not make every node Ready; last lines of $KUBE_STATE/logs/kwok.log:"
        tail -n 30 "$KUBE_STATE/logs/kwok.log" >&2
        return 1
    }
}

# Every node Ready, and rid of the not-ready taint it was created with (nothing schedules there
# before), within $1 seconds. One list a second: `kubectl wait node --all` waits for the nodes
# one at a time and takes minutes for thousands that are all Ready already.
all_nodes_ready() {
    local deadline=$((SECONDS + $1)) states total ready
    local jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}{"\n"}{end}'
    while ((SECONDS < deadline)); do
        states="$(kubectl --kubeconfig="$KUBE_STATE/kubeconfig" get nodes -o jsonpath="$jsonpath")"
        total="$(grep -c '' <<<"$states" || true)"
        ready="$(grep '^True' <<<"$states" | grep -vc 'node.kubernetes.io/not-ready' || true)"
        if [[ -n "$states" && "$ready" == "$total" ]]; then
            return 0
        fi
        sleep 1
    done
    return 1
}

install_crds() {
    local kubectl=(kubectl --kubeconfig="$KUBE_STATE/kubeconfig")
    "${kubectl[@]}" apply -k "$REPO/k8s/crds" >/dev/null
    "${kubectl[@]}" wait --for=condition=Established --timeout=120s crd --all >/dev/null
}

# Plain KWOK nodes of these names (no GPU, no topology): pods bound to a node that does not
# exist are deleted by the pod garbage collector, so tests that bind pods by name get real ones.
named_nodes() {
    local name kubectl=(kubectl --kubeconfig="$KUBE_STATE/kubeconfig")
    for name in "$@"; do
        "${kubectl[@]}" create -f - >/dev/null <<EOF
{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "$name",
 "annotations": {"kwok.x-k8s.io/node": "fake"}, "labels": {"kubernetes.io/hostname": "$name"}}}
EOF
    done
    "${kubectl[@]}" wait --for=condition=Ready --timeout=120s "${@/#/node/}" >/dev/null
}

# KWOK with every stage, or (pod_stages=0) with the node stages only. With the pod stages come
# ours (stages/fates.yaml: ImagePullBackOff and a failing container, chosen by KWOK_FATE), and
# KWOK's pod-ready and pod-complete stay off the pods those take.
start_kwok() {
    local pod_stages="$1" stages="$KUBE_STATE/stages.yaml"
    python3 - "$KWOK_BIN/stages.yaml" "$HERE/stages/fates.yaml" "$pod_stages" >"$stages" <<'PY'
import sys
upstream, fates, with_pods = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
docs = [d for d in upstream.split("\n---\n") if d.strip()]
if with_pods != "1":
    print("\n---\n".join(d for d in docs if "kind: Pod\n" not in d))
    raise SystemExit
fate = "'.spec.initContainers.[].env.[] | select( .name == \"KWOK_FATE\" ) | .value'"
unless = {
    "name: pod-ready\n": f"    - key: {fate}\n      operator: 'NotIn'\n      values:\n      - 'image-pull-backoff'\n",
    "name: pod-complete\n": f"    - key: {fate}\n      operator: 'DoesNotExist'\n",
}
kept = []
for doc in docs:
    for name, expression in unless.items():
        if name in doc:
            assert "    matchExpressions:\n" in doc, name
            doc = doc.replace("    matchExpressions:\n", "    matchExpressions:\n" + expression, 1)
    kept.append(doc)
print("\n---\n".join([*kept, fates]))
PY
    launch kwok "$KWOK_BIN/kwok" --config="$stages" \
        --kubeconfig="$KUBE_STATE/kubeconfig" \
        --manage-nodes-with-annotation-selector="kwok.x-k8s.io/node=fake" \
        --node-lease-duration-seconds="$KUBE_NODE_LEASE_SECONDS" --cidr=10.128.0.0/12
}

# Restart KWOK with its pod stages (after a run with KUBE_POD_STAGES=0).
kwok_with_pods() {
    stop_component kwok
    start_kwok 1
}

# --kube-api-qps/--kube-api-burst when KUBE_CLIENT_QPS is set.
client_rate_flags() {
    if [[ -n "$KUBE_CLIENT_QPS" ]]; then
        echo "--kube-api-qps=$KUBE_CLIENT_QPS" "--kube-api-burst=$((2 * ${KUBE_CLIENT_QPS%.*}))"
    fi
}

# The audit flags when KUBE_AUDIT=1: write requests at level Metadata, logged once answered.
audit_flags() {
    if [[ "$KUBE_AUDIT" != 1 ]]; then
        return
    fi
    cat >"$KUBE_STATE/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
EOF
    echo "--audit-policy-file=$KUBE_STATE/audit-policy.yaml" \
        "--audit-log-path=$KUBE_STATE/audit.log" "--audit-log-format=json" \
        "--audit-log-maxsize=0" "--audit-log-mode=batch"
}

start_scheduler() {
    # shellcheck disable=SC2046  # zero or two flags
    launch kube-scheduler "$KUBE_BIN/kube-scheduler" \
        --kubeconfig="$KUBE_STATE/scheduler.kubeconfig" --secure-port=0 --leader-elect=false \
        $(client_rate_flags)
}

start() {
    build
    if compgen -G "$KUBE_STATE/pids/*" >/dev/null; then
        log "stopping the control plane left in $KUBE_STATE"
        stop
    fi
    rm -rf "$KUBE_STATE"
    mkdir -p "$KUBE_STATE"/{pki,logs,pids,etcd}
    local etcd_port peer_port admin_token kcm_token sched_token
    etcd_port="$(free_port)"
    peer_port="$(free_port)"
    API_PORT="$(free_port)"
    admin_token="$(random_token)"
    kcm_token="$(random_token)"
    sched_token="$(random_token)"
    # The controller manager and the scheduler authenticate as the users the bootstrap RBAC
    # policy grants their roles to; the admin is in system:masters.
    cat >"$KUBE_STATE/tokens.csv" <<EOF
$admin_token,nodeflow-admin,nodeflow-admin,"system:masters"
$kcm_token,system:kube-controller-manager,system:kube-controller-manager
$sched_token,system:kube-scheduler,system:kube-scheduler
EOF
    chmod 0600 "$KUBE_STATE/tokens.csv"
    openssl genrsa -out "$KUBE_STATE/pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$KUBE_STATE/pki/sa.key" -pubout -out "$KUBE_STATE/pki/sa.pub" 2>/dev/null

    # No fsync: the data dies with `stop`, and the disks are shared.
    launch etcd "$ETCD_BIN/etcd" --name=nodeflow --data-dir="$KUBE_STATE/etcd" \
        --listen-client-urls="http://127.0.0.1:$etcd_port" \
        --advertise-client-urls="http://127.0.0.1:$etcd_port" \
        --listen-peer-urls="http://127.0.0.1:$peer_port" \
        --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
        --initial-cluster="nodeflow=http://127.0.0.1:$peer_port" \
        --unsafe-no-fsync --log-level=warn
    wait_for etcd etcd 60 curl -sf "http://127.0.0.1:$etcd_port/health"

    launch kube-apiserver "$KUBE_BIN/kube-apiserver" \
        --etcd-servers="http://127.0.0.1:$etcd_port" \
        --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
        --cert-dir="$KUBE_STATE/pki" \
        --token-auth-file="$KUBE_STATE/tokens.csv" \
        --authorization-mode=Node,RBAC \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$KUBE_STATE/pki/sa.pub" \
        --service-account-signing-key-file="$KUBE_STATE/pki/sa.key" \
        --service-cluster-ip-range=10.96.0.0/16 \
        --allow-privileged=true --profiling=false $(audit_flags) \
        --runtime-config=scheduling.k8s.io/v1alpha2=true --feature-gates="$WORKLOAD_API_GATES"
    wait_for kube-apiserver kube-apiserver 240 curl -sfk \
        -H "Authorization: Bearer $admin_token" "https://127.0.0.1:$API_PORT/readyz"
    # --cert-dir holds the self-signed serving certificate followed by the CA that signed it.
    awk '/BEGIN CERTIFICATE/ {n++} n == 2' "$KUBE_STATE/pki/apiserver.crt" >"$KUBE_STATE/pki/ca.crt"

    write_kubeconfig nodeflow-admin "$admin_token" "$KUBE_STATE/kubeconfig"
    write_kubeconfig system:kube-controller-manager "$kcm_token" \
        "$KUBE_STATE/controller-manager.kubeconfig"
    write_kubeconfig system:kube-scheduler "$sched_token" "$KUBE_STATE/scheduler.kubeconfig"
    local kubectl=(kubectl --kubeconfig="$KUBE_STATE/kubeconfig")
    "${kubectl[@]}" get --raw /readyz >/dev/null || {
        log "the kubeconfig does not reach the API server (certificate or token)"
        return 1
    }

    # Every controller a cluster runs by default (Job, garbage collector, disruption, node
    # lifecycle, namespace, service accounts and their tokens, ...), each with its own service
    # account as kubeadm sets it up. No serving port: nothing here scrapes it.
    launch kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
        --kubeconfig="$KUBE_STATE/controller-manager.kubeconfig" \
        --secure-port=0 --leader-elect=false --controllers='*' \
        --use-service-account-credentials=true $(client_rate_flags) \
        --node-monitor-grace-period="$((KUBE_NODE_LEASE_SECONDS > 40 ? KUBE_NODE_LEASE_SECONDS + 30 : 50))s" \
        --service-account-private-key-file="$KUBE_STATE/pki/sa.key" \
        --root-ca-file="$KUBE_STATE/pki/ca.crt" \
        --service-cluster-ip-range=10.96.0.0/16 --feature-gates="$WORKLOAD_API_GATES"
    if [[ "$KUBE_SCHEDULER" == 1 ]]; then
        start_scheduler
    fi
    start_kwok "$KUBE_POD_STAGES"

    # A namespace's default service account (the service account controller) is what pods need
    # before they can be created.
    wait_for kube-controller-manager kube-controller-manager 240 \
        "${kubectl[@]}" -n default get serviceaccount default
    if [[ "$KUBE_CRDS" == 1 ]]; then
        install_crds
    fi
    # KUBE_NODES=0: no node at all, so the scheduler leaves every pod alone (the conformance
    # suite binds its pods itself); `nodes` adds them later.
    if [[ "$KUBE_NODES" != 0 ]]; then
        add_nodes "$KUBE_NODES" "$KUBE_TOPOLOGY"
    fi
    log "control plane ready on https://127.0.0.1:$API_PORT ($KUBE_NODES KWOK nodes)"
    cat <<EOF
export NODEFLOW_KUBE_KUBECONFIG=$KUBE_STATE/kubeconfig
export NODEFLOW_KUBE_URL=https://127.0.0.1:$API_PORT
export NODEFLOW_KUBE_TOKEN=$admin_token
export NODEFLOW_KUBE_CA=$KUBE_STATE/pki/ca.crt
EOF
}

stop_component() {
    local name="$1" pid
    pid="$(cat "$KUBE_STATE/pids/$name" 2>/dev/null)" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$KUBE_STATE/pids/$name"
}

# TERM every component (in the reverse order of start), KILL what is left after 10 s; then
# remove the state: tokens, keys and etcd data belong to this one run.
stop() {
    local name
    for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
        stop_component "$name"
    done
    rm -rf "$KUBE_STATE"
}

case "${1:-}" in
build) build ;;
start) start ;;
stop) stop ;;
nodes) add_nodes "${2:-$KUBE_NODES}" "${3:-$KUBE_TOPOLOGY}" ;;
scheduler) start_scheduler ;;
kwok-pods) kwok_with_pods ;;
named-nodes)
    shift
    named_nodes "$@"
    ;;
crds) install_crds ;;
*)
    echo "usage: $0 build|start|stop|nodes [count [topology]]|named-nodes name...|scheduler|kwok-pods|crds" >&2
    exit 2
    ;;
esac

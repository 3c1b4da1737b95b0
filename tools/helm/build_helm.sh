#!/usr/bin/env bash
# The helm v3 CLI, built from its Go module and cached by version, for the chart tests.
#
#   tools/helm/build_helm.sh          # build (or reuse) helm, print the path of the binary
#
# Needs Go (1.26) and the Go module proxy. The binary is cached under $HELM_CACHE, so only the
# first build on a machine is slow (it prints how long it took); later runs print the path at once.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
HELM_CACHE="${HELM_CACHE:-/var/tmp/nodeflow-helm}"
# The machine is shared: a low priority and two parallel compile jobs at most.
BUILD_JOBS="${HELM_BUILD_JOBS:-2}"
HELM_BIN="$HELM_CACHE/helm-$HELM_VERSION/bin"

log() { echo "build_helm: $*" >&2; }

# The minor version of k8s.io/client-go that helm's go.mod requires: helm reports it as the
# Kubernetes version it renders for (.Capabilities.KubeVersion) and lints against, as its own
# Makefile sets it.
kube_modules_minor() {
    local gomod="$1"
    go mod edit -json "$gomod" | python3 -c '
import json, sys
mod = json.load(sys.stdin)
for req in mod.get("Require") or []:
    if req["Path"] == "k8s.io/client-go":
        print(req["Version"].split(".")[1])
'
}

build_helm() {
    if [[ -x "$HELM_BIN/helm" ]]; then
        return
    fi
    local gomod kube_minor ldflags start=$SECONDS
    gomod="$(GOTOOLCHAIN=local go mod download -json "helm.sh/helm/v3@$HELM_VERSION" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["GoMod"])')"
    kube_minor="$(kube_modules_minor "$gomod")"
    # The module proxy does not carry the commit a version was tagged at: gitCommit stays empty
    # rather than made up.
    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    local pkg
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
    done
    rm -rf "$HELM_BIN.tmp"
    mkdir -p "$HELM_BIN.tmp"
    # helm's go.mod has no replace directives, so `go install pkg@version` builds it as released.
    nice -n 10 env GOBIN="$HELM_BIN.tmp" GOFLAGS=-trimpath CGO_ENABLED=0 GOTOOLCHAIN=local \
        go install -p "$BUILD_JOBS" -ldflags="$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    rm -rf "$HELM_BIN"
    mv "$HELM_BIN.tmp" "$HELM_BIN"
    log "built helm $HELM_VERSION in $((SECONDS - start)) s"
}

build_helm
echo "$HELM_BIN/helm"

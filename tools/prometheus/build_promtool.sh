#!/usr/bin/env bash
# promtool (Prometheus' rule checker and rule unit-test runner), built from its Go module and
# cached by version, for the alert rule tests.
#
#   tools/prometheus/build_promtool.sh          # build (or reuse) promtool, print its path
#
# Needs Go (1.26) and the Go module proxy. The binary is cached under $PROMTOOL_CACHE, so only
# the first build on a machine is slow (it prints how long it took); later runs print the path
# at once.
set -euo pipefail

# Prometheus 3.x is published as Go module versions v0.3xx.y of github.com/prometheus/prometheus.
PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"
PROMTOOL_CACHE="${PROMTOOL_CACHE:-/var/tmp/nodeflow-promtool}"
# The machine is shared: a low priority and two parallel compile jobs at most.
BUILD_JOBS="${PROMTOOL_BUILD_JOBS:-2}"
PROMTOOL_BIN="$PROMTOOL_CACHE/promtool-$PROMETHEUS_MODULE_VERSION/bin"

log() { echo "build_promtool: $*" >&2; }

build_promtool() {
    if [[ -x "$PROMTOOL_BIN/promtool" ]]; then
        return
    fi
    local start=$SECONDS
    rm -rf "$PROMTOOL_BIN.tmp"
    mkdir -p "$PROMTOOL_BIN.tmp"
    # prometheus' go.mod has no replace directives, so `go install pkg@version` builds it as
    # released.
    nice -n 10 env GOBIN="$PROMTOOL_BIN.tmp" GOFLAGS=-trimpath CGO_ENABLED=0 GOTOOLCHAIN=local \
        go install -p "$BUILD_JOBS" -ldflags="-s -w" \
        "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION" >&2
    rm -rf "$PROMTOOL_BIN"
    mv "$PROMTOOL_BIN.tmp" "$PROMTOOL_BIN"
    log "built promtool $PROMETHEUS_MODULE_VERSION in $((SECONDS - start)) s"
}

build_promtool
echo "$PROMTOOL_BIN/promtool"

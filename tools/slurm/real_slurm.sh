#!/usr/bin/env bash
# A real Slurm on loopback, from a Debian release's packages in a debootstrapped root.
#
#   tools/slurm/real_slurm.sh start [SUITE]         # prints `export NODEFLOW_SLURM_...` lines
#   tools/slurm/real_slurm.sh stop [SUITE]
#   tools/slurm/real_slurm.sh openapi [SUITE] DIR   # (running) one OpenAPI document per version
#
# SUITE (or $SLURM_SUITE) is the Debian suite whose Slurm runs: trixie (the default, Slurm
# 24.11, data_parser v0.0.40-v0.0.42) or forky (Slurm 26.05, data_parser v0.0.42-v0.0.45; sid
# ships the same). start prints the Slurm release (NODEFLOW_SLURM_RELEASE=26.05.5,
# NODEFLOW_SLURM_VERSION=26.05) and the data_parser versions the running slurmrestd serves, read
# from its own OpenAPI document (NODEFLOW_SLURM_API_VERSIONS=v0.0.42,v0.0.43,...).
#
# Needs root (debootstrap, chroot, bind mounts). Each suite's root is cached in its own
# $SLURM_ROOT (/var/tmp/nodeflow-slurm/<suite>/root) so only the first start of a suite downloads
# anything, and both can stay on one machine. slurmctld, four slurmd (a-000-[001-004]) and
# slurmrestd (JWT, as an unprivileged user) all listen on 127.0.0.1.
#
# The nodes are named as NodeSet pods are, <prefix>-<octet 3>-<octet 4> of the Kubernetes
# node's InternalIP (10.x.0.1 -> a-000-001), so a NodeSet can own them in the tests.
set -euo pipefail

COMMAND="${1:-}"
SUITE="${SLURM_SUITE:-trixie}"
if [[ $# -ge 2 && ( "$COMMAND" != openapi || $# -ge 3 ) ]]; then
    SUITE="$2"
fi
case "$SUITE" in
trixie | forky | sid) ;;
*) echo "real_slurm: unknown suite '$SUITE' (trixie, forky or sid)" >&2; exit 2 ;;
esac
SLURM_ROOT="${SLURM_ROOT:-/var/tmp/nodeflow-slurm/$SUITE/root}"
REST_PORT="${SLURM_REST_PORT:-6820}"
CTLD_PORT="${SLURM_CTLD_PORT:-6817}"
# The four slurmd listen on NODE_PORT..NODE_PORT+3. With another SLURM_ROOT and other ports a
# second, independent Slurm can run beside the first (parallel test sessions on one machine).
NODE_PORT="${SLURM_NODE_PORT:-17001}"
NODES=(a-000-001 a-000-002 a-000-003 a-000-004)
NONADMIN=nodeflow-user
# The key id of the RS256 key slurmctld takes through jwks= (see configure).
JWKS_KID=nodeflow-rs256
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Debian names the JWT auth plugin's package slurm-wlm-jwt-plugin in every release that has
# slurmrestd's rest_auth/jwt; curl is what start reads slurmrestd's own document with.
PACKAGES=(slurmctld slurmd slurmrestd slurm-client munge slurm-wlm-jwt-plugin curl)

log() { echo "real_slurm: $*" >&2; }
in_root() { chroot "$SLURM_ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

missing_packages() {
    local package
    for package in "${PACKAGES[@]}"; do
        [[ -f "$SLURM_ROOT/var/lib/dpkg/info/$package.list" ]] || echo "$package"
    done
}

ensure_root() {
    [[ -z "$(missing_packages)" ]] && return
    command -v debootstrap >/dev/null || {
        apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
    }
    # debootstrap removes $SLURM_ROOT/debootstrap when it has finished: a root that still has it
    # was interrupted and is bootstrapped again from scratch (never while anything is mounted
    # in it).
    if [[ -d "$SLURM_ROOT/debootstrap" ]] && ! mounted_any; then
        log "removing the unfinished root $SLURM_ROOT"
        rm -rf --one-file-system "$SLURM_ROOT"
    fi
    if [[ ! -x "$SLURM_ROOT/bin/bash" ]]; then
        mkdir -p "$SLURM_ROOT"
        # An older debootstrap has no script for a newer suite: Debian's testing suites
        # bootstrap as sid does.
        local script=/usr/share/debootstrap/scripts/$SUITE
        [[ -e "$script" ]] || script=/usr/share/debootstrap/scripts/sid
        log "debootstrap --variant=minbase $SUITE $SLURM_ROOT ($script)"
        debootstrap --variant=minbase "$SUITE" "$SLURM_ROOT" "$MIRROR" "$script" >&2
    fi
    cp /etc/resolv.conf "$SLURM_ROOT/etc/resolv.conf" 2>/dev/null || true
    log "installing $(missing_packages | tr '\n' ' ')in the $SUITE root"
    # A testing suite's Release is valid for a week only: a mirror that lags behind (or a
    # snapshot) would otherwise refuse the index debootstrap has just verified. The signatures
    # are still checked.
    in_root /bin/bash -c "export DEBIAN_FRONTEND=noninteractive
        apt-get -o Acquire::Check-Valid-Until=false update -qq && apt-get install -y -qq --no-install-recommends ${PACKAGES[*]}" >&2
}

mounted_any() {
    local fs
    for fs in proc dev sys; do
        mountpoint -q "$SLURM_ROOT/$fs" && return 0
    done
    return 1
}

mount_all() {
    cp /etc/hosts "$SLURM_ROOT/etc/hosts"
    for fs in proc dev sys; do
        mountpoint -q "$SLURM_ROOT/$fs" || mount --bind "/$fs" "$SLURM_ROOT/$fs"
    done
}

configure() {
    local etc="$SLURM_ROOT/etc/slurm" host
    host="$(hostname -s)"
    mkdir -p "$etc" "$SLURM_ROOT/var/spool/slurmctld" "$SLURM_ROOT/var/log/slurm" \
        "$SLURM_ROOT/run/munge" "$SLURM_ROOT/var/spool/slurmd"
    in_root id slurmrestd >/dev/null 2>&1 || in_root useradd -r -M -s /usr/sbin/nologin slurmrestd
    in_root id "$NONADMIN" >/dev/null 2>&1 || in_root useradd -M -s /usr/sbin/nologin "$NONADMIN"
    [[ -s "$SLURM_ROOT/etc/munge/munge.key" ]] || in_root mungekey --create --force
    in_root chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    [[ -s "$SLURM_ROOT/var/spool/slurmctld/jwt_hs256.key" ]] ||
        dd if=/dev/urandom of="$SLURM_ROOT/var/spool/slurmctld/jwt_hs256.key" bs=32 count=1 \
            status=none
    in_root chown -R slurm:slurm /var/spool/slurmctld /var/log/slurm
    chmod 0600 "$SLURM_ROOT/var/spool/slurmctld/jwt_hs256.key"
    # jwks=: slurmctld also accepts RS256 tokens signed by this key (standing in for an
    # identity provider's), whose public half it reads from a JWKS file; the private key
    # stays outside the chroot's Slurm config, for the tests that issue such tokens.
    local rs256="$SLURM_ROOT/var/spool/slurmctld/jwks_rs256.pem"
    [[ -s "$rs256" ]] || openssl genrsa -out "$rs256" 2048 2>/dev/null
    chmod 0600 "$rs256"
    local modulus
    modulus="$(openssl rsa -in "$rs256" -noout -modulus | sed 's/^Modulus=//' | xxd -r -p |
        base64 -w0 | tr '+/' '-_' | tr -d '=')"
    printf '{"keys":[{"kty":"RSA","alg":"RS256","use":"sig","kid":"%s","n":"%s","e":"AQAB"}]}\n' \
        "$JWKS_KID" "$modulus" >"$etc/jwks.json"
    cat >"$etc/slurm.conf" <<EOF
ClusterName=nodeflow
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=slurm
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/var/spool/slurmctld/jwt_hs256.key,jwks=/etc/slurm/jwks.json
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=30
MinJobAge=300
NodeName=a-000-[001-004] NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Port=[$NODE_PORT-$((NODE_PORT + 3))] State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    echo "CgroupPlugin=disabled" >"$etc/cgroup.conf"
}

# Every node registered and answering. sinfo marks a node slurmctld has not heard from with
# `*` (a restart restores the saved states before the slurmd register again, and an UNDRAIN
# or RESUME makes slurmctld ping the node afresh, so `idle*` is briefly normal then).
nodes_ready() {
    local states
    states="$(in_root sinfo -h -N -o %T 2>/dev/null)" || return 1
    [[ -n "$states" ]] && ! grep -qE '[*~#%]|down|unk|fail|not_resp' <<<"$states"
}

start() {
    ensure_root
    mount_all
    configure
    in_root /usr/sbin/munged --force
    # -c: no jobs, drains or reasons left over from an earlier run (or a crashed test), and no
    # saved state of nodes slurm.conf no longer names (the nodes were renamed once).
    in_root /usr/sbin/slurmctld -c
    for node in "${NODES[@]}"; do
        mkdir -p "$SLURM_ROOT/var/spool/slurmd/$node"
        in_root /usr/sbin/slurmd -N "$node"
    done
    in_root /bin/bash -c "cd /tmp && SLURM_JWT=daemon setsid /usr/sbin/slurmrestd \
        -u slurmrestd -g slurmrestd -a rest_auth/jwt -s openapi/slurmctld \
        127.0.0.1:$REST_PORT >/var/log/slurm/slurmrestd.log 2>&1 &" </dev/null >/dev/null 2>&1
    for _ in $(seq 1 60); do
        nodes_ready && break
        sleep 0.5
    done
    nodes_ready || log "not every node is ready: $(in_root sinfo -h -N -o '%N=%T' | tr '\n' ' ')"
    local admin nonadmin versions release
    admin="$(in_root scontrol token username=root lifespan=7200 | sed 's/^SLURM_JWT=//')"
    nonadmin="$(in_root scontrol token username="$NONADMIN" lifespan=7200 | sed 's/^SLURM_JWT=//')"
    versions="$(served_api_versions "$admin" || true)"
    [[ -n "$versions" ]] || {
        log "slurmrestd serves no API (see $SLURM_ROOT/var/log/slurm/slurmrestd.log)"
        exit 1
    }
    release="$(slurm_release)"
    log "Slurm $release ($SUITE), slurmrestd serves data_parser $versions"
    cat <<EOF
export NODEFLOW_SLURM_SUITE=$SUITE
export NODEFLOW_SLURM_RELEASE=$release
export NODEFLOW_SLURM_VERSION=${release%.*}
export NODEFLOW_SLURM_API_VERSIONS=$versions
export NODEFLOW_SLURM_URL=http://127.0.0.1:$REST_PORT
export NODEFLOW_SLURM_USER=root
export NODEFLOW_SLURM_TOKEN=$admin
export NODEFLOW_SLURM_NONADMIN_USER=$NONADMIN
export NODEFLOW_SLURM_NONADMIN_TOKEN=$nonadmin
export NODEFLOW_SLURM_NODES=$(IFS=,; echo "${NODES[*]}")
export NODEFLOW_SLURM_JWT_KEY=$SLURM_ROOT/var/spool/slurmctld/jwt_hs256.key
export NODEFLOW_SLURM_JWKS_PRIVATE_KEY=$SLURM_ROOT/var/spool/slurmctld/jwks_rs256.pem
export NODEFLOW_SLURM_JWKS_KID=$JWKS_KID
export NODEFLOW_SLURM_ROOT=$SLURM_ROOT
EOF
}

# The Slurm release installed in the root, e.g. 26.05.5.
slurm_release() {
    in_root /usr/bin/sinfo -V | awk '{print $2}'
}

# The data_parser versions an OpenAPI document of slurmrestd's covers (each has its
# /slurm/<version>/ping), comma separated, oldest first.
document_versions() {
    # The document escapes its slashes (`\/slurm\/v0.0.42\/ping\/`).
    sed 's|\\/|/|g' | grep -oE '"/slurm/v[0-9]+\.[0-9]+\.[0-9]+/ping/?"' |
        sed -E 's|"/slurm/([^/]+)/ping/?"|\1|' | sort -uV | paste -sd,
}

# GET /openapi/v3 of the slurmrestd on port $1 with token $2, waiting for it to answer.
served_document() {
    local port="$1" token="$2" document
    for _ in $(seq 1 40); do
        document="$(in_root curl -sf -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $token" \
            "http://127.0.0.1:$port/openapi/v3")" && break
        sleep 0.25
    done
    echo "$document"
}

# The data_parser versions the running slurmrestd serves, from its own OpenAPI document.
served_api_versions() {
    served_document "$REST_PORT" "$1" | document_versions
}

# One OpenAPI document per data_parser version this root's slurmrestd has, exactly as a
# slurmrestd that loads only that data_parser (and the slurmctld OpenAPI plugin, as start runs
# it) serves it at GET /openapi/v3: $dir/slurm-<release>-<version>.json.gz (gzip -n, so the same
# document gives the same bytes). `slurmrestd --generate-openapi-spec` would not do: it leaves
# out the YAML media types, and 24.11's v0.0.41 inlines every schema there instead of the $refs
# it serves. Needs the Slurm of this suite started (the token comes from its slurmctld).
openapi() {
    local dir="$1" release token plugin version port=$((REST_PORT + 1)) pid document
    release="$(slurm_release)"
    token="$(in_root scontrol token username=root lifespan=600 | sed 's/^SLURM_JWT=//')" || {
        log "start the $SUITE Slurm first ($0 start $SUITE)"
        exit 1
    }
    mkdir -p "$dir"
    for plugin in "$SLURM_ROOT"/usr/lib/*/slurm-wlm/data_parser_v*.so; do
        version="$(basename "$plugin" .so | sed -E 's/^data_parser_//; s/_/./g')"
        # chroot itself in the background (not in_root, a function: its subshell would be $!).
        chroot "$SLURM_ROOT" /usr/bin/env -i PATH=/usr/bin:/bin /bin/bash -c \
            "cd /tmp && SLURM_JWT=daemon exec /usr/sbin/slurmrestd \
            -u slurmrestd -g slurmrestd -a rest_auth/jwt -s openapi/slurmctld -d $version \
            127.0.0.1:$port 2>/var/log/slurm/slurmrestd-openapi.log" </dev/null >/dev/null 2>&1 &
        pid=$!
        document="$(served_document "$port" "$token")"
        kill "$pid"
        wait "$pid" || true
        # Only this version's: never a document of another slurmrestd left on the port.
        [[ "$(document_versions <<<"$document")" == "$version" ]] || {
            log "slurmrestd -d $version did not serve a $version document"
            exit 1
        }
        gzip -9n <<<"$document" >"$dir/slurm-$release-$version.json.gz"
        log "$dir/slurm-$release-$version.json.gz"
    done
}

stop() {
    # slurmctld saves its state on SIGTERM: wait for every daemon to exit (SIGKILL after 8 s),
    # so a start right after a stop never meets the old daemons or their ports.
    local pid root signal=TERM alive
    for attempt in $(seq 1 40); do
        alive=0
        for pid in $(ls /proc | grep -E '^[0-9]+$'); do
            root="$(readlink "/proc/$pid/root" 2>/dev/null || true)"
            [[ "$root" == "$SLURM_ROOT" ]] || continue
            alive=1
            [[ -n "$signal" ]] && kill "-$signal" "$pid" 2>/dev/null || true
        done
        [[ $alive == 0 ]] && break
        signal=""
        ((attempt == 32)) && signal=KILL
        sleep 0.25
    done
    for fs in sys dev proc; do
        mountpoint -q "$SLURM_ROOT/$fs" && umount -l "$SLURM_ROOT/$fs" || true
    done
}

case "$COMMAND" in
start) start ;;
stop) stop ;;
openapi) openapi "${@: -1}" ;;
*) echo "usage: $0 start|stop [SUITE] | openapi [SUITE] DIR" >&2; exit 2 ;;
esac

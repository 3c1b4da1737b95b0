#!/usr/bin/env bash
# A real Slurm 24.11 on loopback, from Debian trixie packages in a debootstrapped root.
#
#   tools/slurm/real_slurm.sh start   # prints `export NODEFLOW_SLURM_...` lines
#   tools/slurm/real_slurm.sh stop
#
# Needs root (debootstrap, chroot, bind mounts). The root is cached in $SLURM_ROOT so only
# the first start downloads anything. slurmctld, four slurmd (a-000-[001-004]) and slurmrestd
# (JWT, as an unprivileged user) all listen on 127.0.0.1.
#
# The nodes are named as NodeSet pods are, <prefix>-<octet 3>-<octet 4> of the Kubernetes
# node's InternalIP (10.x.0.1 -> a-000-001), so a NodeSet can own them in the tests.
set -euo pipefail

SLURM_ROOT="${SLURM_ROOT:-/var/tmp/nodeflow-slurm/root}"
REST_PORT="${SLURM_REST_PORT:-6820}"
CTLD_PORT="${SLURM_CTLD_PORT:-6817}"
# The four slurmd listen on NODE_PORT..NODE_PORT+3. With another SLURM_ROOT and other ports a
# second, independent Slurm can run beside the first (parallel test sessions on one machine).
NODE_PORT="${SLURM_NODE_PORT:-17001}"
NODES=(a-000-001 a-000-002 a-000-003 a-000-004)
NONADMIN=nodeflow-user
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

log() { echo "real_slurm: $*" >&2; }
in_root() { chroot "$SLURM_ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

ensure_root() {
    if [[ ! -f "$SLURM_ROOT/var/lib/dpkg/info/slurmctld.list" ]]; then
        command -v debootstrap >/dev/null || {
            apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
        }
        if [[ ! -x "$SLURM_ROOT/bin/bash" ]]; then
            mkdir -p "$SLURM_ROOT"
            log "debootstrap --variant=minbase trixie $SLURM_ROOT"
            debootstrap --variant=minbase trixie "$SLURM_ROOT" "$MIRROR" >&2
        fi
        cp /etc/resolv.conf "$SLURM_ROOT/etc/resolv.conf" 2>/dev/null || true
        log "installing Slurm packages in the root"
        in_root /bin/bash -c 'export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq && apt-get install -y -qq --no-install-recommends \
                slurmctld slurmd slurmrestd slurm-client munge slurm-wlm-jwt-plugin' >&2
    fi
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
    cat >"$etc/slurm.conf" <<EOF
ClusterName=nodeflow
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=slurm
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/var/spool/slurmctld/jwt_hs256.key
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
        127.0.0.1:$REST_PORT >/var/log/slurm/slurmrestd.log 2>&1 &"
    for _ in $(seq 1 60); do
        nodes_ready && break
        sleep 0.5
    done
    nodes_ready || log "not every node is ready: $(in_root sinfo -h -N -o '%N=%T' | tr '\n' ' ')"
    local admin nonadmin
    admin="$(in_root scontrol token username=root lifespan=7200 | sed 's/^SLURM_JWT=//')"
    nonadmin="$(in_root scontrol token username="$NONADMIN" lifespan=7200 | sed 's/^SLURM_JWT=//')"
    cat <<EOF
export NODEFLOW_SLURM_URL=http://127.0.0.1:$REST_PORT
export NODEFLOW_SLURM_USER=root
export NODEFLOW_SLURM_TOKEN=$admin
export NODEFLOW_SLURM_NONADMIN_USER=$NONADMIN
export NODEFLOW_SLURM_NONADMIN_TOKEN=$nonadmin
export NODEFLOW_SLURM_NODES=$(IFS=,; echo "${NODES[*]}")
export NODEFLOW_SLURM_JWT_KEY=$SLURM_ROOT/var/spool/slurmctld/jwt_hs256.key
EOF
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

case "${1:-}" in
start) start ;;
stop) stop ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

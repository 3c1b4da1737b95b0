#!/bin/sh
# Starts munged, then runs slurmd in the foreground with the pod's arguments, adding the GPUs
# the pod was given as the node's GRES.
#
# The pod passes slurmd's own arguments (k8s/examples/nodeset.yaml):
#   -Z --conf-server <slurmctld host[:port]> -N $(POD_NAME)
# -Z registers a dynamic node, --conf-server fetches slurm.conf (and gres.conf, cgroup.conf)
# from slurmctld (configless), and -N names the Slurm node after the pod (POD_NAME from the
# downward API), which is how slurm-syncer and nodeset-controller find a pod's Slurm node.
#
# GRES: the GPUs the device plugin gave this container appear as /dev/nvidia<N>; their count
# becomes `Gres=gpu:<count>` in the node's --conf, with SLURMD_NODE_CONF (e.g. "Features=h100")
# added. The cluster's gres.conf says which files they are (`Name=gpu File=/dev/nvidia[0-7]`,
# or AutoDetect=nvml with a slurmd built with NVML, which Debian's is not).
#
# MUNGE_KEY_FILE (default /etc/munge-key/munge.key, a mounted Secret) is copied to munged's
# key, which must be owned by munge and not readable by others (a Secret's files are not).
set -eu

: "${MUNGE_KEY_FILE:=/etc/munge-key/munge.key}"
if [ ! -r "$MUNGE_KEY_FILE" ]; then
    echo "slurmd-entrypoint: no munge key at $MUNGE_KEY_FILE (MUNGE_KEY_FILE)" >&2
    exit 1
fi
install -o munge -g munge -m 0400 "$MUNGE_KEY_FILE" /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- /usr/sbin/munged

gpus=0
for device in /dev/nvidia[0-9]*; do
    [ -e "$device" ] && gpus=$((gpus + 1))
done
node_conf="${SLURMD_NODE_CONF:-}"
if [ "$gpus" -gt 0 ]; then
    node_conf="Gres=gpu:$gpus${node_conf:+ $node_conf}"
fi

mkdir -p /var/spool/slurmd /var/log/slurm
if [ -n "$node_conf" ]; then
    exec /usr/sbin/slurmd -D "$@" --conf "$node_conf"
fi
exec /usr/sbin/slurmd -D "$@"

"""Prometheus metrics of slurm-syncer. Labels are configured cluster names and fixed words."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SLURM_REQUESTS = Counter(
    "nodeflow_slurm_requests_total",
    "slurmrestd requests by call and result (ok, unreachable, api, auth, malformed)",
    ["cluster", "call", "result"],
)
POLLS = Counter(
    "nodeflow_slurm_polls_total", "Node polls of a Slurm cluster by result", ["cluster", "result"]
)
POLL_SECONDS = Histogram(
    "nodeflow_slurm_poll_seconds",
    "Time of one poll cycle: read every node, publish changes, reconcile pods",
    ["cluster"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
NODES = Gauge(
    "nodeflow_slurm_syncer_polled_nodes", "Slurm nodes seen in the last poll", ["cluster"]
)
MALFORMED_NODES = Counter(
    "nodeflow_slurm_malformed_nodes_total",
    "Node entries that could not be read (reported as Unknown)",
    ["cluster"],
)
NODE_CHANGES = Counter(
    "nodeflow_slurm_node_changes_total", "Slurm node state changes published", ["cluster"]
)
NODE_UPDATES = Counter(
    "nodeflow_slurm_node_updates_total",
    "Drains and undrains sent to Slurm, by origin (cordon, delete, command) and result",
    ["cluster", "op", "origin", "result"],
)
RESERVATION_CHANGES = Counter(
    "nodeflow_slurm_reservation_changes_total",
    "Scheduled-update reservations created and deleted in Slurm, by result",
    ["cluster", "op", "result"],
)
POD_PATCHES = Counter(
    "nodeflow_slurm_pod_patches_total",
    "Pod commands sent to k8s-watcher (conditions, pod-cordon, pod-uncordon)",
    ["kind"],
)
CLUSTER_REACHABLE = Gauge(
    "nodeflow_slurm_cluster_reachable", "1 when the last poll of the cluster succeeded", ["cluster"]
)

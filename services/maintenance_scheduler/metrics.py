"""Prometheus metrics of maintenance-scheduler. Labels are bounded: phases, reasons, outcomes
(a request's namespace/name would grow without bound)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Gauge(
    "nodeflow_maintenance_requests",
    "NodeMaintenance requests by phase",
    ["phase"],
)
SLOTS = Gauge(
    "nodeflow_maintenance_available_slots",
    "Requests that may start now: maxParallelOperations minus nodes under maintenance",
)
CAN_BECOME_UNAVAILABLE = Gauge(
    "nodeflow_maintenance_can_become_unavailable",
    "Nodes that may still become unavailable: maxUnavailable minus unavailable nodes",
)
UNAVAILABLE_NODES = Gauge(
    "nodeflow_maintenance_unavailable_nodes",
    "Nodes cordoned, not Ready or under maintenance",
)
SCHEDULED = Counter("nodeflow_maintenance_scheduled_total", "Requests scheduled")
SKIPPED = Counter(
    "nodeflow_maintenance_skipped_total",
    "Pending requests left for a later round, by reason",
    ["reason"],
)
DRAIN_PODS_REMAINING = Gauge(
    "nodeflow_maintenance_drain_pods_remaining",
    "Pods still to be evicted, over all draining requests",
)
DRAIN_PODS_WAITING_FOR_SLURM = Gauge(
    "nodeflow_maintenance_drain_pods_waiting_for_slurm",
    "NodeSet pods whose Slurm node still runs (or may run) a job",
)
DRAINS_TIMED_OUT = Gauge(
    "nodeflow_maintenance_drains_timed_out",
    "Draining requests past drainSpec.timeoutSeconds (still retrying)",
)
DRAIN_TIMEOUTS = Counter(
    "nodeflow_maintenance_drain_timeouts_total", "Drains that went past their timeout"
)
EVICTIONS = Counter("nodeflow_maintenance_evictions_total", "Evictions sent")
PHASE_SECONDS = Histogram(
    "nodeflow_maintenance_phase_seconds",
    "Time a request spent in a phase, observed when it leaves it",
    ["phase"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
)
ROUND_SECONDS = Histogram(
    "nodeflow_maintenance_round_seconds",
    "Time of one round (scheduling and every request's step)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
MESSAGES = Counter(
    "nodeflow_maintenance_messages_total", "Commands, decisions and Events published"
)
OUTCOMES = Counter(
    "nodeflow_maintenance_command_outcomes_total",
    "Outcomes of the service's commands",
    ["op", "outcome"],
)

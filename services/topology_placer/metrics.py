"""Prometheus metrics of topology-placer. Labels are bounded: gang states, attempt results,
topology layer names."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

GANGS = Gauge(
    "nodeflow_topology_placer_gangs",
    "GangGroups with pods of ours, by state in the last planning pass",
    ["state"],
)
ATTEMPTS = Counter(
    "nodeflow_topology_placer_placement_attempts_total",
    "Placement attempts of GangGroups with pending pods (one per gang per planning pass), "
    "by result",
    ["result"],
)
PLACEMENT_SECONDS = Histogram(
    "nodeflow_topology_placer_placement_seconds",
    "Time of one planning pass over every gang (the placement decision)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
PREEMPTIONS = Counter(
    "nodeflow_topology_placer_preemptions_total",
    "Job-level preemptions decided (one per preempting GangGroup)",
)
VICTIMS = Counter(
    "nodeflow_topology_placer_preemption_victims_total",
    "Pods evicted to make room for a higher-priority gang",
)
DOMAINS = Gauge(
    "nodeflow_topology_placer_topology_domains",
    "Topology domains in the ClusterNetworkTopology tree, by layer",
    ["layer"],
)
MESSAGES = Counter(
    "nodeflow_topology_placer_messages_total",
    "Commands, decisions and Events published",
)
OUTCOMES = Counter(
    "nodeflow_topology_placer_command_outcomes_total",
    "Outcomes of the placer's commands",
    ["outcome"],
)

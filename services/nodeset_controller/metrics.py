"""Prometheus metrics of nodeset-controller's own work (the NodeSet figures themselves are the
metrics-exporter's, read from status). Labels are bounded: command outcomes only."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PLANS = Counter("nodeflow_nodeset_controller_plans_total", "NodeSet plans made")
PLAN_SECONDS = Histogram(
    "nodeflow_nodeset_controller_round_seconds",
    "Time of one planning round over the NodeSets that changed",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
MESSAGES = Counter(
    "nodeflow_nodeset_controller_messages_total",
    "Commands, decisions and Events published",
)
DEFERRED = Counter(
    "nodeflow_nodeset_controller_deferred_changes_total",
    "Pod and claim changes left for a later round because the in-flight window was full",
)
IN_FLIGHT = Gauge(
    "nodeflow_nodeset_controller_commands_in_flight",
    "Commands sent whose effect is not yet visible in KV",
)
OUTCOMES = Counter(
    "nodeflow_nodeset_controller_command_outcomes_total",
    "Outcomes of the controller's commands",
    ["outcome"],
)

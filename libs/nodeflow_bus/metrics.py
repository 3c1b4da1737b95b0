"""Prometheus metrics of the bus, module-level so every service exposes the same names.

Labels are stream, consumer, bucket or lease names: bounded sets from the topology table,
never anything taken from a message.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PUBLISHED = Counter(
    "nodeflow_bus_published_total", "Messages published and acknowledged by JetStream", ["stream"]
)
PUBLISH_FAILURES = Counter(
    "nodeflow_bus_publish_failures_total",
    "Publishes that failed after every retry",
    ["stream"],
)
PUBLISH_RETRIES = Counter(
    "nodeflow_bus_publish_retries_total", "Publish attempts retried after a timeout", ["stream"]
)
CONSUMED = Counter(
    "nodeflow_bus_consumed_total", "Messages fetched by a consumer", ["stream", "consumer"]
)
ACKED = Counter("nodeflow_bus_acked_total", "Messages handled and acked", ["stream", "consumer"])
NAKED = Counter(
    "nodeflow_bus_naked_total", "Messages nak'd for a later redelivery", ["stream", "consumer"]
)
TERMED = Counter(
    "nodeflow_bus_termed_total", "Messages terminated (never redelivered)", ["stream", "consumer"]
)
DEAD_LETTERED = Counter(
    "nodeflow_bus_dead_lettered_total",
    "Messages copied to the dead-letter stream",
    ["stream", "consumer", "error_kind"],
)
HANDLER_SECONDS = Histogram(
    "nodeflow_bus_handler_seconds",
    "Time spent in a message handler",
    ["stream", "consumer"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
IN_FLIGHT = Gauge(
    "nodeflow_bus_in_flight", "Messages held by a consumer, not yet settled", ["stream", "consumer"]
)
KV_VIEW_KEYS = Gauge("nodeflow_bus_kv_view_keys", "Keys held by a KV materialized view", ["bucket"])
KV_VIEW_RESYNCS = Counter(
    "nodeflow_bus_kv_view_resyncs_total",
    "Full re-snapshots of a KV view (after a reconnect or a requested resync)",
    ["bucket"],
)
KV_VIEW_UNDECODABLE = Counter(
    "nodeflow_bus_kv_view_undecodable_total",
    "KV values that did not decode and were left out of the view",
    ["bucket"],
)
LEASE_IS_LEADER = Gauge(
    "nodeflow_bus_lease_is_leader", "1 while this replica holds the lease", ["lease"]
)
LEASE_TRANSITIONS = Counter(
    "nodeflow_bus_lease_transitions_total", "Leadership gained or lost", ["lease", "transition"]
)
CONNECTED = Gauge("nodeflow_bus_connected", "1 while the NATS connection is up")
LEDGER_HELD = Gauge(
    "nodeflow_bus_ledger_entries",
    "Commands a controller's ledger holds (sent, and possibly still landing)",
    ["ledger"],
)
LEDGER_READY = Gauge(
    "nodeflow_bus_ledger_ready",
    "1 while the leader's command ledger is rebuilt and it may plan",
    ["ledger"],
)
LEDGER_REBUILDS = Counter(
    "nodeflow_bus_ledger_rebuilds_total",
    "Ledger rebuilds on taking the lead, by result (ok, failed)",
    ["ledger", "result"],
)
LEDGER_UNDECODABLE_OUTCOMES = Counter(
    "nodeflow_bus_ledger_undecodable_outcomes_total",
    "Command outcomes that did not decode (logged; they settle nothing)",
    ["ledger"],
)

"""Prometheus gauges of the Skyhook controller, with the anchor operator's names and labels,
so its dashboards and alerts read them unchanged. Every gauge is rebuilt each round (a gone
Skyhook leaves no stale series)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from prometheus_client import Gauge

from maintenance_scheduler.skyhook.plan import SkyhookRound
from maintenance_scheduler.skyhook.rollout import (
    BLOCKED,
    COMPLETE,
    DISABLED,
    ERRORING,
    IN_PROGRESS,
    PAUSED,
    UNKNOWN,
    WAITING,
)

STATUSES = (COMPLETE, BLOCKED, WAITING, DISABLED, PAUSED, IN_PROGRESS, ERRORING, UNKNOWN)
ROLLOUT_LABELS = ["skyhook_name", "policy_name", "compartment_name", "strategy"]

STATUS = Gauge("skyhook_status", "1 for the Skyhook's current status", ["skyhook_name", "status"])
NODE_STATUS_COUNT = Gauge(
    "skyhook_node_status_count", "Nodes by their status", ["skyhook_name", "status"]
)
NODE_TARGET_COUNT = Gauge(
    "skyhook_node_target_count", "Nodes the Skyhook selects", ["skyhook_name"]
)
PACKAGE_STATE_COUNT = Gauge(
    "skyhook_package_state_count",
    "Nodes by package state",
    ["skyhook_name", "package_name", "package_version", "state"],
)
PACKAGE_STAGE_COUNT = Gauge(
    "skyhook_package_stage_count",
    "Nodes by package stage",
    ["skyhook_name", "package_name", "package_version", "stage"],
)
ROLLOUT_MATCHED = Gauge("skyhook_rollout_matched_nodes", "Nodes in the compartment", ROLLOUT_LABELS)
ROLLOUT_CEILING = Gauge(
    "skyhook_rollout_ceiling", "The compartment's budget ceiling", ROLLOUT_LABELS
)
ROLLOUT_IN_PROGRESS = Gauge("skyhook_rollout_in_progress", "Nodes in progress", ROLLOUT_LABELS)
ROLLOUT_COMPLETED = Gauge("skyhook_rollout_completed", "Nodes complete", ROLLOUT_LABELS)
ROLLOUT_PROGRESS = Gauge(
    "skyhook_rollout_progress_percent", "Complete nodes, percent of matched", ROLLOUT_LABELS
)
ROLLOUT_BATCH = Gauge("skyhook_rollout_current_batch", "Current batch number", ROLLOUT_LABELS)
ROLLOUT_FAILURES = Gauge(
    "skyhook_rollout_consecutive_failures", "Consecutive failed batches", ROLLOUT_LABELS
)
ROLLOUT_STOP = Gauge("skyhook_rollout_should_stop", "1 when the rollout stopped", ROLLOUT_LABELS)
PACKAGE_RESTARTS = Gauge(
    "skyhook_package_restarts_count",
    "Stage retries of the package, summed over its nodes",
    ["skyhook_name", "package_name", "package_version"],
)

_ALL = (
    STATUS,
    NODE_STATUS_COUNT,
    NODE_TARGET_COUNT,
    PACKAGE_STATE_COUNT,
    PACKAGE_STAGE_COUNT,
    ROLLOUT_MATCHED,
    ROLLOUT_CEILING,
    ROLLOUT_IN_PROGRESS,
    ROLLOUT_COMPLETED,
    ROLLOUT_PROGRESS,
    ROLLOUT_BATCH,
    ROLLOUT_FAILURES,
    ROLLOUT_STOP,
    PACKAGE_RESTARTS,
)


def report(rounds: Sequence[SkyhookRound]) -> None:
    """A Skyhook without a DeploymentPolicy reports policy_name="legacy" and
    strategy="fixed" (the fixed strategy its interruptionBudget rolls out with)."""
    for gauge in _ALL:
        gauge.clear()
    for summary in rounds:
        name = summary.name
        for status in STATUSES:
            STATUS.labels(name, status).set(1 if summary.status == status else 0)
        counts = Counter(summary.node_status.values())
        for status in STATUSES:
            NODE_STATUS_COUNT.labels(name, status).set(counts.get(status, 0))
        NODE_TARGET_COUNT.labels(name).set(len(summary.node_status))
        for (package, version, state), count in summary.package_states.items():
            PACKAGE_STATE_COUNT.labels(name, package, version, state).set(count)
        for (package, version, stage), count in summary.package_stages.items():
            PACKAGE_STAGE_COUNT.labels(name, package, version, stage).set(count)
        for (package, version), restarts in summary.package_restarts.items():
            PACKAGE_RESTARTS.labels(name, package, version).set(restarts)
        for plan in summary.compartments:
            strategy = plan.strategy.kind if plan.strategy is not None else "none"
            labels = (name, summary.policy, plan.name, strategy)
            ROLLOUT_MATCHED.labels(*labels).set(plan.matched)
            ROLLOUT_CEILING.labels(*labels).set(plan.ceiling)
            ROLLOUT_IN_PROGRESS.labels(*labels).set(plan.in_progress)
            ROLLOUT_COMPLETED.labels(*labels).set(plan.completed)
            ROLLOUT_PROGRESS.labels(*labels).set(plan.progress_percent)
            ROLLOUT_BATCH.labels(*labels).set(plan.state.current_batch)
            ROLLOUT_FAILURES.labels(*labels).set(plan.state.consecutive_failures)
            ROLLOUT_STOP.labels(*labels).set(1 if plan.state.should_stop else 0)

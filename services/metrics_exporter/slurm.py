"""Slurm gauges: nodes by cluster and state, drains, and how fresh each cluster's poll is.

Node counts are computed from the KV view of SlurmNodeState at scrape time, so a removed node
leaves the counts at once. Poll results arrive as events; `PollTracker` keeps the latest per
cluster and the age is computed at scrape time from the clock.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from metrics_exporter.labels import OTHER, slurm_flag
from nodeflow_contracts.slurm import BASE_STATES, FLAGS, SlurmNodeState, SlurmPollResult

log = structlog.get_logger("metrics_exporter")


class NodeSource(Protocol):
    def items(self) -> list[tuple[str, SlurmNodeState]]: ...


@dataclass
class ClusterNodeCounts:
    states: Counter[str] = field(default_factory=Counter)
    flags: Counter[str] = field(default_factory=Counter)
    drained: int = 0
    draining: int = 0
    unreadable: int = 0
    total: int = 0


def count_nodes(states: Iterable[SlurmNodeState]) -> dict[str, ClusterNodeCounts]:
    """Per cluster: nodes by base state, by flag (unknown flags as `other`), drained and
    draining (the derived fields slurm-syncer computed), and nodes it could not read."""
    clusters: dict[str, ClusterNodeCounts] = {}
    for state in states:
        counts = clusters.get(state.cluster)
        if counts is None:
            counts = clusters[state.cluster] = ClusterNodeCounts()
        counts.total += 1
        counts.states[state.base_state] += 1
        for flag in set(state.flags):
            counts.flags[slurm_flag(flag)] += 1
        counts.drained += state.drained
        counts.draining += state.draining
        counts.unreadable += not state.known
    return clusters


@dataclass
class ClusterPolls:
    last_success_at: float | None = None
    last_ok: bool = False
    last_finished_at: float = float("-inf")
    last_duration: float = 0.0
    succeeded: int = 0
    failed: int = 0


class PollTracker:
    """The latest poll result of each Slurm cluster, for at most `max_clusters` clusters.

    Results are ordered by when the poll finished, so a redelivered old result never hides a
    newer one.
    """

    def __init__(self, max_clusters: int = 256) -> None:
        self.max_clusters = max_clusters
        self.clusters: dict[str, ClusterPolls] = {}

    def record(self, result: SlurmPollResult) -> bool:
        """Apply one poll result; False when it was refused (one cluster too many)."""
        polls = self.clusters.get(result.cluster)
        if polls is None:
            if len(self.clusters) >= self.max_clusters:
                log.warning(
                    "slurm_polls.too_many_clusters",
                    cluster=result.cluster,
                    limit=self.max_clusters,
                )
                return False
            polls = self.clusters[result.cluster] = ClusterPolls()
        finished_at = result.started_at + max(0.0, result.duration_seconds)
        if result.ok:
            polls.succeeded += 1
            if polls.last_success_at is None or finished_at > polls.last_success_at:
                polls.last_success_at = finished_at
        else:
            polls.failed += 1
        if finished_at >= polls.last_finished_at:
            polls.last_finished_at = finished_at
            polls.last_ok = result.ok
            polls.last_duration = result.duration_seconds
        return True


class SlurmCollector(Collector):
    """Renders the Slurm gauges from the node view and the poll tracker at every scrape."""

    def __init__(
        self,
        nodes: NodeSource,
        polls: PollTracker,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nodes = nodes
        self._polls = polls
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        return list(_SlurmFamilies().all())

    def collect(self) -> Iterable[Metric]:
        out = _SlurmFamilies()
        counts = count_nodes(state for _, state in self._nodes.items())
        for cluster, cluster_counts in sorted(counts.items()):
            for state in BASE_STATES:
                out.nodes.add_metric([cluster, state], cluster_counts.states[state])
            for flag in FLAGS:
                out.flags.add_metric([cluster, flag], cluster_counts.flags[flag])
            if cluster_counts.flags[OTHER]:
                out.flags.add_metric([cluster, OTHER], cluster_counts.flags[OTHER])
            out.drained.add_metric([cluster], cluster_counts.drained)
            out.draining.add_metric([cluster], cluster_counts.draining)
            out.unreadable.add_metric([cluster], cluster_counts.unreadable)
        now = self._clock()
        for cluster, polls in sorted(self._polls.clusters.items()):
            if polls.last_success_at is not None:
                out.poll_age.add_metric([cluster], max(0.0, now - polls.last_success_at))
            out.poll_success.add_metric([cluster], 1.0 if polls.last_ok else 0.0)
            out.poll_duration.add_metric([cluster], polls.last_duration)
            out.polls.add_metric([cluster, "success"], polls.succeeded)
            out.polls.add_metric([cluster, "failure"], polls.failed)
        return list(out.all())


class _SlurmFamilies:
    """The metric families of one scrape (fresh each time: nothing carries over)."""

    def __init__(self) -> None:
        self.nodes = GaugeMetricFamily(
            "nodeflow_slurm_nodes",
            "Slurm nodes by cluster and base state.",
            labels=("cluster", "state"),
        )
        self.flags = GaugeMetricFamily(
            "nodeflow_slurm_node_flags",
            "Slurm nodes carrying each state flag, by cluster.",
            labels=("cluster", "flag"),
        )
        self.drained = GaugeMetricFamily(
            "nodeflow_slurm_nodes_drained",
            "Slurm nodes drained (drain flag, nothing running), by cluster.",
            labels=("cluster",),
        )
        self.draining = GaugeMetricFamily(
            "nodeflow_slurm_nodes_draining",
            "Slurm nodes draining (drain flag, jobs still running), by cluster.",
            labels=("cluster",),
        )
        self.unreadable = GaugeMetricFamily(
            "nodeflow_slurm_nodes_unreadable",
            "Slurm nodes whose state could not be read, by cluster.",
            labels=("cluster",),
        )
        self.poll_age = GaugeMetricFamily(
            "nodeflow_slurm_last_successful_poll_age_seconds",
            "Seconds since the last successful poll of the cluster finished.",
            labels=("cluster",),
        )
        self.poll_success = GaugeMetricFamily(
            "nodeflow_slurm_last_poll_success",
            "1 if the latest poll of the cluster succeeded, else 0.",
            labels=("cluster",),
        )
        self.poll_duration = GaugeMetricFamily(
            "nodeflow_slurm_last_poll_duration_seconds",
            "Duration of the latest poll of the cluster.",
            labels=("cluster",),
        )
        self.polls = CounterMetricFamily(
            "nodeflow_slurm_polls",
            "Poll results received from slurm-syncer, by cluster and result.",
            labels=("cluster", "result"),
        )

    def all(self) -> Iterable[Metric]:
        return (
            self.nodes,
            self.flags,
            self.drained,
            self.draining,
            self.unreadable,
            self.poll_age,
            self.poll_success,
            self.poll_duration,
            self.polls,
        )

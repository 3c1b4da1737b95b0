"""The NodeSet metrics, one gauge per status field (see docs/metrics-exporter.md).

They are rendered from the KV view of NodeSet objects at scrape time, so a value is always the
status currently stored, and a deleted NodeSet has no series at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeflow_contracts import subjects

# metric name -> (status field, help text); names and meanings in docs/metrics-exporter.md.
NODESET_METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "kube_sunk_nodeset_current",
        "currentNumberScheduled",
        "Number of Nodes that the NodeSet is scheduled on.",
    ),
    (
        "kube_sunk_nodeset_misscheduled",
        "numberMisscheduled",
        "Number of Nodes having the NodeSet's Pods that should no longer be scheduled on.",
    ),
    (
        "kube_sunk_nodeset_desired",
        "desiredNumberScheduled",
        "Desired number of Nodes to schedule on.",
    ),
    (
        "kube_sunk_nodeset_up_to_date",
        "updatedNumberScheduled",
        "Number of Nodes having scheduled the latest version of the NodeSet's Pod.",
    ),
    (
        "kube_sunk_nodeset_feasible",
        "numberFeasible",
        "Number of Nodes the NodeSet could schedule on (inclusive of those already scheduled).",
    ),
    (
        "kube_sunk_nodeset_ready",
        "numberReady",
        "Number of Nodes having the NodeSet's Pod in a Ready state.",
    ),
    (
        "kube_sunk_nodeset_unavailable",
        "numberUnavailable",
        "Number of Nodes scheduled but do not have the NodeSet's Pod in a Ready state.",
    ),
    (
        "kube_sunk_nodeset_running",
        "numberRunning",
        "Number of Nodes actively running Slurm jobs.",
    ),
    (
        "kube_sunk_nodeset_drained",
        "numberDrain",
        "Number of Nodes that are drained in Slurm.",
    ),
)

NODESET_LABELS = ("namespace", "nodeset")


class ObjectSource(Protocol):
    """What the collector reads: a KVView[dict] of NodeSet objects, or any mapping-like."""

    def items(self) -> list[tuple[str, dict[str, Any]]]: ...


@dataclass(frozen=True)
class NodeSetStatusRow:
    namespace: str
    name: str
    # status field -> value; a field the status omits is 0 (Kubernetes omits zero counts).
    values: dict[str, float]


def status_value(status: dict[str, Any], field: str) -> float | None:
    """The numeric value of one status field; None when it holds something else."""
    value = status.get(field, 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def nodeset_rows(objects: Iterable[tuple[str, dict[str, Any]]]) -> Iterator[NodeSetStatusRow]:
    """One row per NodeSet object (key `<namespace>.<name>`), its names from metadata."""
    for key, obj in objects:
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        key_namespace, key_name = subjects.split_object_key(key)
        namespace = metadata.get("namespace") or key_namespace or ""
        name = metadata.get("name") or key_name
        status = obj.get("status")
        status = status if isinstance(status, dict) else {}
        values: dict[str, float] = {}
        for _, field, _ in NODESET_METRICS:
            value = status_value(status, field)
            if value is not None:
                values[field] = value
        yield NodeSetStatusRow(namespace=str(namespace), name=str(name), values=values)


class NodeSetCollector(Collector):
    """Renders the NodeSet gauges from the current objects of `source` at every scrape."""

    def __init__(self, source: ObjectSource) -> None:
        self._source = source

    def describe(self) -> Iterable[Metric]:
        return [
            GaugeMetricFamily(name, help_text, labels=NODESET_LABELS)
            for name, _, help_text in NODESET_METRICS
        ]

    def collect(self) -> Iterable[Metric]:
        families = {
            field: GaugeMetricFamily(name, help_text, labels=NODESET_LABELS)
            for name, field, help_text in NODESET_METRICS
        }
        for row in nodeset_rows(self._source.items()):
            labels = [row.namespace, row.name]
            for field, value in row.values.items():
                families[field].add_metric(labels, value)
        return list(families.values())

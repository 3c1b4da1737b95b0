"""The Grafana dashboard is valid JSON and only queries series that Nodeflow exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

import nodeflow_bus.metrics  # noqa: F401  (registers the bus metrics every service exposes)
from metrics_exporter.control_plane import ControlPlaneMetrics
from metrics_exporter.nodesets import NodeSetCollector
from metrics_exporter.slurm import PollTracker, SlurmCollector

DASHBOARD = Path(__file__).resolve().parents[3] / "k8s" / "grafana" / "nodeflow-dashboard.json"
SERIES = re.compile(r"\b(?:kube_sunk|nodeflow)_[a-z0-9_]+")


class Empty:
    def items(self) -> list[tuple[str, Any]]:
        return []


def exposed_sample_names() -> set[str]:
    registry = CollectorRegistry()
    ControlPlaneMetrics(registry)
    registry.register(NodeSetCollector(Empty()))
    registry.register(SlurmCollector(Empty(), PollTracker()))
    names: set[str] = set()
    for source in (registry, REGISTRY):
        for family in source.collect():
            names.add(family.name)
            kind_suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
            }.get(family.type, ())
            names.update(family.name + suffix for suffix in kind_suffixes)
    return names


def expressions(dashboard: dict[str, Any]) -> list[str]:
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    found += [
        variable["query"]["query"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return found


def test_dashboard_queries_only_exposed_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exposed = exposed_sample_names()
    queried = {name for expr in expressions(dashboard) for name in SERIES.findall(expr)}
    assert queried, "the dashboard queries nothing"
    assert queried - exposed == set()


def test_dashboard_covers_the_issue_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    text = " ".join(expressions(dashboard))
    for needed in (
        "kube_sunk_nodeset_ready",
        "nodeflow_slurm_nodes",
        "nodeflow_slurm_nodes_draining",
        "histogram_quantile(0.5, sum by (le, op) (rate(nodeflow_k8s_command_latency_seconds_bucket",
        "histogram_quantile(0.99,",
        "nodeflow_k8s_command_outcomes_total",
        "nodeflow_dead_letters_total",
    ):
        assert needed in text
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))

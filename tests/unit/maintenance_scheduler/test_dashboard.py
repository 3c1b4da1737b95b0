"""The maintenance Grafana dashboard is valid JSON and queries only series the
maintenance-scheduler exposes, covering the issue's figures."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

import maintenance_scheduler.metrics  # noqa: F401  (registers the series)

DASHBOARD = (
    Path(__file__).resolve().parents[3] / "k8s" / "grafana" / "nodeflow-maintenance-dashboard.json"
)
SERIES = re.compile(r"\bnodeflow_maintenance_[a-z0-9_]+")


def exposed() -> set[str]:
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        names.update(family.name + s for s in suffixes.get(family.type, ()))
    return names


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_rule_maintenance_dashboard_queries_exposed_series_for_every_figure() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {name for expr in expressions(dashboard) for name in SERIES.findall(expr)}
    assert queried - exposed() == set()
    for needed in (
        "nodeflow_maintenance_requests",
        "nodeflow_maintenance_available_slots",
        "nodeflow_maintenance_can_become_unavailable",
        "nodeflow_maintenance_drain_pods_remaining",
        "nodeflow_maintenance_phase_seconds_bucket",
    ):
        assert needed in queried
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


SKYHOOK_SERIES = re.compile(r"\bskyhook_[a-z0-9_]+")
# Grouping clauses and label matchers name labels (skyhook_name, ...), not series.
LABEL_CLAUSES = re.compile(r"\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}")


def test_rule_skyhook_dashboard_panels_query_every_skyhook_series_it_exports() -> None:
    from maintenance_scheduler.skyhook import metrics as skyhook_metrics

    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for expr in expressions(dashboard)
        for name in SKYHOOK_SERIES.findall(LABEL_CLAUSES.sub("", expr))
    }
    exported = {
        gauge._name
        for gauge in vars(skyhook_metrics).values()
        if getattr(gauge, "_name", "").startswith("skyhook_")
    }
    assert "skyhook_rollout_should_stop" in exported
    assert queried - exposed() == set()  # only series the service registers
    assert exported - queried == set()  # and a panel for every one of them

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

"""The placement Grafana dashboard is valid JSON, is shipped by k8s/grafana's kustomization,
and has a panel for every series topology-placer exports, querying only exported ones."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY

import topology_placer.metrics  # noqa: F401  (registers the series)

GRAFANA = Path(__file__).resolve().parents[3] / "k8s" / "grafana"
DASHBOARD = GRAFANA / "nodeflow-placement-dashboard.json"
SERIES = re.compile(r"\bnodeflow_topology_placer_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def placer_families() -> dict[str, str]:
    """Every topology-placer family registered, with its type."""
    return {
        family.name: family.type
        for family in REGISTRY.collect()
        if family.name.startswith("nodeflow_topology_placer_")
    }


def exposed() -> set[str]:
    names: set[str] = set()
    for name, kind in placer_families().items():
        names.add(name)
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ()))
    return names


def panel_queries(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    return {
        panel["title"]: [target["expr"] for target in panel.get("targets", [])]
        for panel in dashboard["panels"]
    }


def test_placement_dashboard_has_a_panel_for_every_exported_placer_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = panel_queries(dashboard)
    queried = {
        name for exprs in queries.values() for expr in exprs for name in SERIES.findall(expr)
    }
    assert queried - exposed() == set(), "the dashboard queries series the placer does not export"
    families = placer_families()
    assert set(families) >= {
        "nodeflow_topology_placer_gangs",
        "nodeflow_topology_placer_placement_attempts",
        "nodeflow_topology_placer_placement_seconds",
        "nodeflow_topology_placer_preemptions",
        "nodeflow_topology_placer_preemption_victims",
        "nodeflow_topology_placer_topology_domains",
    }
    for family, kind in families.items():
        sample = family + ("_bucket" if kind == "histogram" else SUFFIXES.get(kind, ("",))[0])
        assert sample in queried, f"no panel queries {sample}"
    assert "sum by (state) (nodeflow_topology_placer_gangs)" in queries["Gangs by state"]
    assert any("by (result)" in e for e in queries["Placement attempts by result"])
    assert any("histogram_quantile" in e for e in queries["Planning pass latency"])
    assert any("by (layer)" in e for e in queries["Topology domains by layer"])
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_placement_dashboard_is_shipped_by_the_grafana_kustomization() -> None:
    kustomization = yaml.safe_load((GRAFANA / "kustomization.yaml").read_text())
    files = [f for generator in kustomization["configMapGenerator"] for f in generator["files"]]
    assert DASHBOARD.name in files

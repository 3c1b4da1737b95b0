"""Small builders of raw pod specs and nodes for the nodeflow_kube predicate tests."""

from __future__ import annotations

from typing import Any


def node(
    name: str = "n1",
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    allocatable: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }


def required(*terms: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A pod spec whose required node affinity has these terms."""
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": list(terms)
                },
            }
        },
        **spec,
    }


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    """One matchExpressions term."""
    entry: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        entry["values"] = list(values)
    return {"matchExpressions": [entry]}

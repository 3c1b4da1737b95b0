"""Kubernetes resource quantities for the simulator: the shared implementation in
`nodeflow_kube.quantity`, under the names the simulator's modules import."""

from __future__ import annotations

from nodeflow_kube.quantity import (
    QuantityError,
    ResourceList,
    add_resources,
    format_quantity,
    parse_quantity,
    parse_resources,
)

__all__ = [
    "QuantityError",
    "ResourceList",
    "add_resources",
    "format_quantity",
    "parse_quantity",
    "parse_resources",
]

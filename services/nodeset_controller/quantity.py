"""Kubernetes resource quantities for nodeset-controller: the shared implementation in
`nodeflow_kube.quantity`, read leniently because the controller reads objects from KV."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from nodeflow_kube import quantity as _quantity
from nodeflow_kube.quantity import QuantityError, ResourceList, add_resources, parse_quantity

__all__ = ["QuantityError", "ResourceList", "add", "parse_quantity", "parse_resources"]


def parse_resources(raw: object) -> ResourceList:
    """A resource list; a non-mapping reads as empty and entries that do not parse are left
    out (the API server validated them; one odd entry must not stop a reconcile)."""
    return _quantity.parse_resources(raw, skip_invalid=True)


def add(total: ResourceList, more: Mapping[str, Fraction]) -> None:
    """Add `more` into `total` in place (for running sums)."""
    total.update(add_resources(total, more))

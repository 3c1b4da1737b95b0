"""Kubernetes scheduling semantics as pure functions over raw API objects (decoded JSON).

One implementation shared by the cluster simulator's default scheduler and by services that
must predict where a pod may run (nodeset-controller):

- `quantity`: resource quantities ("500m", "64Gi") as exact fractions, resource lists.
- `resources`: a pod's effective requests and the NodeResourcesFit check.
- `affinity`: nodeSelector and required node affinity (the NodeAffinity filter).
- `taints`: taints and tolerations (TaintToleration and NodeUnschedulable filters).

No I/O, no logging, no clocks: every function answers from its arguments alone.
"""

from __future__ import annotations

from nodeflow_kube.affinity import (
    node_affinity_matches,
    node_selector_matches,
    required_node_affinity_matches,
    requirement_matches,
    term_matches,
)
from nodeflow_kube.quantity import (
    QuantityError,
    ResourceList,
    add_resources,
    format_quantity,
    parse_quantity,
    parse_resources,
)
from nodeflow_kube.resources import insufficient_resources, node_allocatable, pod_requests
from nodeflow_kube.taints import (
    FILTER_EFFECTS,
    UNSCHEDULABLE_TAINT,
    tolerates,
    tolerates_unschedulable,
    unschedulable_blocks,
    untolerated_taint,
)

__all__ = [
    "FILTER_EFFECTS",
    "UNSCHEDULABLE_TAINT",
    "QuantityError",
    "ResourceList",
    "add_resources",
    "format_quantity",
    "insufficient_resources",
    "node_affinity_matches",
    "node_allocatable",
    "node_selector_matches",
    "parse_quantity",
    "parse_resources",
    "pod_requests",
    "required_node_affinity_matches",
    "requirement_matches",
    "term_matches",
    "tolerates",
    "tolerates_unschedulable",
    "unschedulable_blocks",
    "untolerated_taint",
]

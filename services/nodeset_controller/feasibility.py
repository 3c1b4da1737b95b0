"""Rule 1, node selection: may this NodeSet place (or keep) its pod on this node?

Only the *required* node affinity counts (preferred terms and pod affinity are ignored, as
the reference says), plus the nodeSelector, taints against the template's tolerations, the
pod's requests against the node's allocatable minus what other pods request, a usable IPv4
InternalIP (the pod name comes from it) and the one-NodeSet-per-node claim. The Kubernetes
semantics (affinity, taints, resource fit) come from `nodeflow_kube`, shared with the
simulator's scheduler; this module adds the NodeSet rules on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodeflow_kube.affinity import node_affinity_matches
from nodeflow_kube.quantity import ResourceList
from nodeflow_kube.resources import insufficient_resources, node_allocatable
from nodeflow_kube.taints import (
    NO_EXECUTE,
    UNSCHEDULABLE_TAINT,
    pod_tolerations,
    unschedulable_blocks,
    untolerated_taint,
)
from nodeset_controller.objects import claim_of, internal_ipv4

# Taints the node lifecycle controller puts on NotReady/unreachable/cordoned nodes. A pod
# already running there stays (the node may come back; scale-down removes not-ready pods
# first); only a new pod is kept away.
LIFECYCLE_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        UNSCHEDULABLE_TAINT,
    }
)
# A running pod is kept as if it tolerated them. Tolerations, not a filter on the first
# untolerated taint: a lifecycle taint listed first must not hide another NoExecute taint.
_LIFECYCLE_TOLERATIONS: tuple[dict[str, str], ...] = tuple(
    {"key": key, "operator": "Exists"} for key in LIFECYCLE_TAINTS
)


@dataclass(frozen=True)
class Verdict:
    feasible: bool
    reason: str = ""


FEASIBLE = Verdict(True)


def required_affinity_matches(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """nodeSelector and requiredDuringSchedulingIgnoredDuringExecution (terms are ORed)."""
    return node_affinity_matches(pod_spec, node)


def claim_verdict(node: Mapping[str, Any], nodeset_key: str) -> Verdict:
    holder = claim_of(node)
    if holder is not None and holder != nodeset_key:
        return Verdict(False, f"node is used by NodeSet {holder}")
    return FEASIBLE


def _identity_verdict(
    pod_spec: Mapping[str, Any],
    node: Mapping[str, Any],
    nodeset_key: str,
    *,
    no_ipv4: str,
    mismatch: str,
) -> Verdict:
    """The checks placing and keeping share: an IPv4 InternalIP, the claim, the required
    affinity (the reasons differ: a new pod is refused, a running one is misscheduled)."""
    if internal_ipv4(node) is None:
        return Verdict(False, no_ipv4)
    claim = claim_verdict(node, nodeset_key)
    if not claim.feasible:
        return claim
    if not required_affinity_matches(pod_spec, node):
        return Verdict(False, mismatch)
    return FEASIBLE


def can_place(
    pod_spec: Mapping[str, Any],
    pod_requests: ResourceList,
    node: Mapping[str, Any],
    requested_by_others: ResourceList,
    nodeset_key: str,
) -> Verdict:
    """May a new pod of this NodeSet go to `node`? The first failing check is the reason."""
    verdict = _identity_verdict(
        pod_spec,
        node,
        nodeset_key,
        no_ipv4="node has no IPv4 InternalIP to name the pod after",
        mismatch="node does not match the required node affinity/selector",
    )
    if not verdict.feasible:
        return verdict
    if unschedulable_blocks(pod_spec, node):
        return Verdict(False, "node is cordoned (unschedulable)")
    taint = untolerated_taint(pod_spec, node)
    if taint is not None:
        return Verdict(
            False,
            f"untolerated taint {taint.get('key')}={taint.get('value') or ''}:"
            f"{taint.get('effect')}",
        )
    short = insufficient_resources(pod_requests, node_allocatable(node), requested_by_others)
    if short:
        return Verdict(False, f"insufficient {', '.join(short)}")
    return FEASIBLE


def may_keep(pod_spec: Mapping[str, Any], node: Mapping[str, Any], nodeset_key: str) -> Verdict:
    """May an existing pod of this NodeSet stay on `node`? A pod that may not is
    misscheduled. Cordons, NotReady taints and resources do not evict a running pod; a
    changed label, an untolerated NoExecute taint or another NodeSet's claim do."""
    verdict = _identity_verdict(
        pod_spec,
        node,
        nodeset_key,
        no_ipv4="node lost its IPv4 InternalIP",
        mismatch="node no longer matches the required node affinity/selector",
    )
    if not verdict.feasible:
        return verdict
    kept = {**pod_spec, "tolerations": [*pod_tolerations(pod_spec), *_LIFECYCLE_TOLERATIONS]}
    taint = untolerated_taint(kept, node, effects=(NO_EXECUTE,))
    if taint is not None:
        return Verdict(False, f"untolerated taint {taint.get('key')}:NoExecute")
    return FEASIBLE

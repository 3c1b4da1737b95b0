"""Rule 1, node selection: may this NodeSet place (or keep) its pod on this node?

Only the *required* node affinity counts (preferred terms and pod affinity are ignored, as
the reference says), plus the nodeSelector, taints against the template's tolerations, the
pod's requests against the node's allocatable minus what other pods request, a usable IPv4
InternalIP (the pod name comes from it) and the one-NodeSet-per-node claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from nodeset_controller.objects import (
    claim_of,
    internal_ipv4,
    labels_of,
    mapping,
    name_of,
    node_allocatable,
    sequence,
)
from nodeset_controller.quantity import ResourceList

# Taints the node lifecycle controller puts on NotReady/unreachable/cordoned nodes. A pod
# already running there stays (the node may come back; scale-down removes not-ready pods
# first); only a new pod is kept away.
LIFECYCLE_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
    }
)
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


@dataclass(frozen=True)
class Verdict:
    feasible: bool
    reason: str = ""


FEASIBLE = Verdict(True)


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def requirement_matches(expression: Mapping[str, Any], value: str | None) -> bool:
    """One node selector requirement against one label (or field) value."""
    operator = expression.get("operator")
    values = [str(v) for v in sequence(expression.get("values"))]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        have, bound = _int_or_none(value), _int_or_none(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """A node selector term: all its expressions and fields hold. An empty term matches
    nothing (as in Kubernetes)."""
    expressions = sequence(term.get("matchExpressions"))
    fields = sequence(term.get("matchFields"))
    if not expressions and not fields:
        return False
    labels = labels_of(node)
    for expression in expressions:
        entry = mapping(expression)
        raw = labels.get(str(entry.get("key")))
        if not requirement_matches(entry, None if raw is None else str(raw)):
            return False
    for field in fields:
        entry = mapping(field)
        # metadata.name is the only field Kubernetes supports in node selector terms.
        value = name_of(node) if entry.get("key") == "metadata.name" else None
        if not requirement_matches(entry, value):
            return False
    return True


def required_affinity_matches(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """nodeSelector and requiredDuringSchedulingIgnoredDuringExecution (terms are ORed)."""
    labels = labels_of(node)
    for key, value in mapping(pod_spec.get("nodeSelector")).items():
        if labels.get(key) != value:
            return False
    affinity = mapping(mapping(pod_spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    terms = sequence(mapping(required).get("nodeSelectorTerms"))
    return any(term_matches(mapping(term), node) for term in terms)


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if (toleration.get("operator") or "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(
    pod_spec: Mapping[str, Any], node: Mapping[str, Any], *, effects: Sequence[str]
) -> Mapping[str, Any] | None:
    tolerations = [mapping(t) for t in sequence(pod_spec.get("tolerations"))]
    for raw in sequence(mapping(node.get("spec")).get("taints")):
        taint = mapping(raw)
        if taint.get("effect") not in effects:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def insufficient(requests: ResourceList, free: ResourceList) -> list[str]:
    """Resources the pod asks for beyond what is free (sorted, for stable messages)."""
    short: list[str] = []
    for name in sorted(requests):
        if requests[name] > 0 and requests[name] > free.get(name, Fraction(0)):
            short.append(name)
    return short


def free_resources(node: Mapping[str, Any], requested_by_others: ResourceList) -> ResourceList:
    allocatable = node_allocatable(node)
    return {
        name: amount - requested_by_others.get(name, Fraction(0))
        for name, amount in allocatable.items()
    }


def claim_verdict(node: Mapping[str, Any], nodeset_key: str) -> Verdict:
    holder = claim_of(node)
    if holder is not None and holder != nodeset_key:
        return Verdict(False, f"node is used by NodeSet {holder}")
    return FEASIBLE


def can_place(
    pod_spec: Mapping[str, Any],
    pod_requests: ResourceList,
    node: Mapping[str, Any],
    requested_by_others: ResourceList,
    nodeset_key: str,
) -> Verdict:
    """May a new pod of this NodeSet go to `node`? The first failing check is the reason."""
    if internal_ipv4(node) is None:
        return Verdict(False, "node has no IPv4 InternalIP to name the pod after")
    claim = claim_verdict(node, nodeset_key)
    if not claim.feasible:
        return claim
    if not required_affinity_matches(pod_spec, node):
        return Verdict(False, "node does not match the required node affinity/selector")
    if mapping(node.get("spec")).get("unschedulable"):
        cordon = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
        tolerations = [mapping(t) for t in sequence(pod_spec.get("tolerations"))]
        if not any(tolerates(t, cordon) for t in tolerations):
            return Verdict(False, "node is cordoned (unschedulable)")
    taint = untolerated_taint(pod_spec, node, effects=("NoSchedule", "NoExecute"))
    if taint is not None:
        return Verdict(
            False,
            f"untolerated taint {taint.get('key')}={taint.get('value') or ''}:"
            f"{taint.get('effect')}",
        )
    short = insufficient(pod_requests, free_resources(node, requested_by_others))
    if short:
        return Verdict(False, f"insufficient {', '.join(short)}")
    return FEASIBLE


def may_keep(pod_spec: Mapping[str, Any], node: Mapping[str, Any], nodeset_key: str) -> Verdict:
    """May an existing pod of this NodeSet stay on `node`? A pod that may not is
    misscheduled. Cordons, NotReady taints and resources do not evict a running pod; a
    changed label, an untolerated NoExecute taint or another NodeSet's claim do."""
    if internal_ipv4(node) is None:
        return Verdict(False, "node lost its IPv4 InternalIP")
    claim = claim_verdict(node, nodeset_key)
    if not claim.feasible:
        return claim
    if not required_affinity_matches(pod_spec, node):
        return Verdict(False, "node no longer matches the required node affinity/selector")
    taint = untolerated_taint(pod_spec, node, effects=("NoExecute",))
    if taint is not None and taint.get("key") not in LIFECYCLE_TAINTS:
        return Verdict(False, f"untolerated taint {taint.get('key')}:NoExecute")
    return FEASIBLE

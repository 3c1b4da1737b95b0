"""Taints and tolerations (kube-scheduler's TaintToleration and NodeUnschedulable filters).

`tolerates` is core/v1 Toleration.ToleratesTaint: an empty effect matches every effect; an
empty key matches every key; operator Exists matches any value, Equal (or empty) needs the
same value; any other operator tolerates nothing. Only NoSchedule and NoExecute taints keep a
pod off a node; PreferNoSchedule only lowers the node's score.
"""

from __future__ import annotations

from collections.abc import Collection

from nodeflow_kube.fields import Obj, mapping, sequence, text

NO_SCHEDULE = "NoSchedule"
PREFER_NO_SCHEDULE = "PreferNoSchedule"
NO_EXECUTE = "NoExecute"
EXISTS = "Exists"
EQUAL = "Equal"
# The effects the TaintToleration filter enforces.
FILTER_EFFECTS: tuple[str, ...] = (NO_SCHEDULE, NO_EXECUTE)
# What a cordon (spec.unschedulable) amounts to for the NodeUnschedulable filter.
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_CORDON: Obj = {"key": UNSCHEDULABLE_TAINT, "effect": NO_SCHEDULE}


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Whether one toleration tolerates one taint (Toleration.ToleratesTaint)."""
    effect = text(toleration.get("effect"))
    if effect and effect != text(taint.get("effect")):
        return False
    key = text(toleration.get("key"))
    if key and key != text(taint.get("key")):
        return False
    operator = text(toleration.get("operator"))
    if operator in ("", EQUAL):
        return text(toleration.get("value")) == text(taint.get("value"))
    return operator == EXISTS


def pod_tolerations(pod_spec: Obj) -> list[Obj]:
    return [mapping(t) for t in sequence(pod_spec.get("tolerations"))]


def node_taints(node: Obj) -> list[Obj]:
    return [mapping(t) for t in sequence(mapping(node.get("spec")).get("taints"))]


def tolerated(tolerations: Collection[Obj], taint: Obj) -> bool:
    """Whether any of the tolerations tolerates the taint."""
    return any(tolerates(toleration, taint) for toleration in tolerations)


def untolerated_taint(
    pod_spec: Obj, node: Obj, *, effects: Collection[str] = FILTER_EFFECTS
) -> Obj | None:
    """The node's first taint with one of `effects` that no toleration of the pod tolerates,
    or None."""
    tolerations = pod_tolerations(pod_spec)
    for taint in node_taints(node):
        if text(taint.get("effect")) in effects and not tolerated(tolerations, taint):
            return taint
    return None


def tolerates_unschedulable(pod_spec: Obj) -> bool:
    """Whether the pod tolerates a cordon (node.kubernetes.io/unschedulable:NoSchedule)."""
    return tolerated(pod_tolerations(pod_spec), _CORDON)


def unschedulable_blocks(pod_spec: Obj, node: Obj) -> bool:
    """The NodeUnschedulable filter: a cordoned node takes only pods that tolerate it."""
    return bool(mapping(node.get("spec")).get("unschedulable")) and not tolerates_unschedulable(
        pod_spec
    )

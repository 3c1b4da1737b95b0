"""Does a node satisfy a pod's nodeSelector and required node affinity (kube-scheduler's
NodeAffinity filter)?

Only `requiredDuringSchedulingIgnoredDuringExecution` counts for feasibility; preferred terms
only score. Terms are ORed, the requirements of one term ANDed. A term that is empty, or that
holds a requirement the API server would reject (for example In without values, Exists with
values, Gt with a non-integer bound, a matchFields key other than metadata.name), matches no
node, as a term that fails to parse does in the scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nodeflow_kube.fields import Obj, labels_of, mapping, name_of, sequence, text

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
NODE_NAME_FIELD = "metadata.name"

# strconv.ParseInt(s, 10, 64): optional sign, ASCII digits, within int64.
_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def parse_int64(value: str) -> int | None:
    """The integer Go's strconv.ParseInt(value, 10, 64) reads, or None when it fails."""
    if _INT.fullmatch(value) is None:
        return None
    number = int(value)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def requirement_is_valid(requirement: Obj) -> bool:
    """Whether a matchExpressions entry is one the API server accepts (operator and values)."""
    operator = requirement.get("operator")
    values = sequence(requirement.get("values"))
    if operator in (IN, NOT_IN):
        return bool(values)
    if operator in (EXISTS, DOES_NOT_EXIST):
        return not values
    if operator in (GT, LT):
        return len(values) == 1 and parse_int64(text(values[0])) is not None
    return False


def requirement_matches(requirement: Obj, value: str | None) -> bool:
    """One matchExpressions entry against the node's value for its key (None: no such label).

    NotIn and DoesNotExist hold for an absent label; Gt and Lt compare integers and fail
    when the label is absent or not an integer. An invalid requirement matches nothing.
    """
    if not requirement_is_valid(requirement):
        return False
    operator = requirement.get("operator")
    values = [text(v) for v in sequence(requirement.get("values"))]
    if operator == IN:
        return value is not None and value in values
    if operator == NOT_IN:
        return value is None or value not in values
    if operator == EXISTS:
        return value is not None
    if operator == DOES_NOT_EXIST:
        return value is None
    actual = None if value is None else parse_int64(value)
    if actual is None:
        return False
    bound = int(values[0])
    return actual > bound if operator == GT else actual < bound


def field_requirement_matches(requirement: Obj, node: Obj) -> bool:
    """One matchFields entry: only metadata.name with In or NotIn and exactly one value is
    valid (anything else matches nothing)."""
    values = sequence(requirement.get("values"))
    if requirement.get("key") != NODE_NAME_FIELD or len(values) != 1:
        return False
    operator = requirement.get("operator")
    if operator == IN:
        return name_of(node) == text(values[0])
    if operator == NOT_IN:
        return name_of(node) != text(values[0])
    return False


def term_matches(term: Obj, node: Obj) -> bool:
    """One nodeSelectorTerm: every matchExpressions and matchFields entry holds. An empty
    term matches no node."""
    expressions = sequence(term.get("matchExpressions"))
    fields = sequence(term.get("matchFields"))
    if not expressions and not fields:
        return False
    labels = labels_of(node)
    for raw in expressions:
        requirement = mapping(raw)
        label = labels.get(text(requirement.get("key")))
        if not requirement_matches(requirement, None if label is None else text(label)):
            return False
    return all(field_requirement_matches(mapping(raw), node) for raw in fields)


def selector_terms_match(terms: Sequence[object], node: Obj) -> bool:
    """A NodeSelector: any of its terms matches (no terms: no node)."""
    return any(term_matches(mapping(term), node) for term in terms)


def required_node_affinity_matches(pod_spec: Obj, node: Obj) -> bool:
    """The pod's requiredDuringSchedulingIgnoredDuringExecution node affinity, if it has one.

    A required selector that is present but has no terms matches no node (the scheduler
    matches each term; with none, nothing matches).
    """
    affinity = mapping(mapping(pod_spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return selector_terms_match(sequence(mapping(required).get("nodeSelectorTerms")), node)


def node_selector_matches(pod_spec: Obj, node: Obj) -> bool:
    """The pod's nodeSelector: every key=value is a label of the node."""
    labels = labels_of(node)
    for key, value in mapping(pod_spec.get("nodeSelector")).items():
        label = labels.get(key)
        if label is None or text(label) != text(value):
            return False
    return True


def node_affinity_matches(pod_spec: Obj, node: Obj) -> bool:
    """The whole NodeAffinity filter: nodeSelector and required node affinity."""
    return node_selector_matches(pod_spec, node) and required_node_affinity_matches(pod_spec, node)

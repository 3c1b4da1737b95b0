"""Default-scheduler predicates and node choice, as pure functions over API dicts.

Mirrors kube-scheduler's filter plugins that matter to this project: NodeUnschedulable,
NodeName, NodeAffinity (required terms + nodeSelector), TaintToleration (NoSchedule and
NoExecute), and NodeResourcesFit (requests vs allocatable minus non-terminated pods).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from clustersim.cluster.quantity import ResourceList, add_resources, parse_resources

DEFAULT_SCHEDULER = "default-scheduler"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

Obj = Mapping[str, Any]

AFFINITY_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE_NODE = "node(s) were unschedulable"
NODE_NAME_MISMATCH = "node(s) didn't match the requested node name"
TOO_MANY_PODS = "Too many pods"


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def match_expression(expression: Obj, value: str | None) -> bool:
    """One NodeSelectorRequirement against the node's value for its key (None = absent)."""
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or ()]
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
        actual, bound = _int_or_none(value), _int_or_none(values[0])
        if actual is None or bound is None:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def node_selector_term_matches(term: Obj, node: Obj) -> bool:
    """A term matches when all its expressions and fields match; an empty term matches none."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = node.get("metadata", {}).get("labels") or {}
    if not all(match_expression(e, labels.get(e.get("key"))) for e in expressions):
        return False
    for requirement in fields:
        # metadata.name is the only field the scheduler supports in matchFields.
        if requirement.get("key") != "metadata.name":
            return False
        if not match_expression(requirement, node.get("metadata", {}).get("name")):
            return False
    return True


def required_affinity_matches(pod: Obj, node: Obj) -> bool:
    required = (
        (pod.get("spec", {}).get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or []
    return any(node_selector_term_matches(term, node) for term in terms)


def node_selector_matches(pod: Obj, node: Obj) -> bool:
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    labels = node.get("metadata", {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def toleration_tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    if operator == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    """The first NoSchedule/NoExecute taint no toleration covers, or None."""
    tolerations = pod.get("spec", {}).get("tolerations") or []
    taint: Obj
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(toleration_tolerates(t, taint) for t in tolerations):
            return taint
    return None


def tolerates_unschedulable(pod: Obj) -> bool:
    taint = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    return any(toleration_tolerates(t, taint) for t in pod.get("spec", {}).get("tolerations") or [])


def pod_requests(pod: Obj) -> ResourceList:
    """Effective requests: max(sum of containers, any init container) + overhead, plus 1 pod.

    A container with limits but no requests requests its limits (API defaulting).
    """
    spec = pod.get("spec", {})

    def container_requests(container: Obj) -> ResourceList:
        resources = container.get("resources") or {}
        requests = parse_resources(resources.get("limits"))
        requests.update(parse_resources(resources.get("requests")))
        return requests

    total: ResourceList = {}
    for container in spec.get("containers") or []:
        total = add_resources(total, container_requests(container))
    for container in spec.get("initContainers") or []:
        for name, value in container_requests(container).items():
            total[name] = max(total.get(name, Fraction(0)), value)
    total = add_resources(total, parse_resources(spec.get("overhead")))
    total["pods"] = total.get("pods", Fraction(0)) + 1
    return total


def pod_occupies_node(pod: Obj) -> bool:
    """Pods count against a node until they reach a terminal phase (or are removed)."""
    return bool(pod.get("spec", {}).get("nodeName")) and (
        pod.get("status", {}).get("phase") not in TERMINAL_PHASES
    )


def requested_by_node(pods: Iterable[Obj]) -> dict[str, ResourceList]:
    used: dict[str, ResourceList] = {}
    for pod in pods:
        if pod_occupies_node(pod):
            node = pod["spec"]["nodeName"]
            used[node] = add_resources(used.get(node, {}), pod_requests(pod))
    return used


def insufficient_resources(
    requests: Mapping[str, Fraction],
    allocatable: Mapping[str, Fraction],
    used: Mapping[str, Fraction],
) -> list[str]:
    """Names of resources whose request does not fit in allocatable minus used."""
    short = []
    for name, amount in sorted(requests.items()):
        if amount <= 0:
            continue
        free = allocatable.get(name, Fraction(0)) - used.get(name, Fraction(0))
        if amount > free:
            short.append(name)
    return short


def infeasibility_reasons(
    pod: Obj,
    node: Obj,
    used: Mapping[str, Fraction],
    requests: Mapping[str, Fraction] | None = None,
    allocatable: Mapping[str, Fraction] | None = None,
) -> list[str]:
    """Why `pod` cannot go on `node` (scheduler message fragments); empty means it fits."""
    reasons: list[str] = []
    node_spec = node.get("spec", {})
    if node_spec.get("unschedulable") and not tolerates_unschedulable(pod):
        reasons.append(UNSCHEDULABLE_NODE)
    if not (node_selector_matches(pod, node) and required_affinity_matches(pod, node)):
        reasons.append(AFFINITY_MISMATCH)
    taint = untolerated_taint(pod, node)
    if taint is not None:
        reasons.append(
            f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
        )
    if allocatable is None:
        allocatable = node_allocatable(node)
    for name in insufficient_resources(
        requests if requests is not None else pod_requests(pod), allocatable, used
    ):
        reasons.append(TOO_MANY_PODS if name == "pods" else f"Insufficient {name}")
    return reasons


# kube-scheduler scores pods without requests as if they asked for 100m CPU and 200Mi memory,
# so such pods still spread across nodes instead of piling onto the first one.
_NON_ZERO_DEFAULTS = {"cpu": Fraction(1, 10), "memory": Fraction(200 * 2**20)}


def _scoring_request(requests: Mapping[str, Fraction], name: str) -> Fraction:
    value = requests.get(name, Fraction(0))
    return value if value > 0 else _NON_ZERO_DEFAULTS.get(name, Fraction(0))


def _allocated_fraction(
    requests: Mapping[str, Fraction],
    allocatable: Mapping[str, Fraction],
    used: Mapping[str, Fraction],
) -> Fraction:
    """Mean share of cpu/memory/gpu in use after placing the pod (LeastAllocated scoring)."""
    shares = []
    for name in ("cpu", "memory", "nvidia.com/gpu"):
        capacity = allocatable.get(name, Fraction(0))
        if capacity > 0:
            after = used.get(name, Fraction(0)) + _scoring_request(requests, name)
            shares.append(after / capacity)
    return sum(shares, Fraction(0)) / len(shares) if shares else Fraction(0)


def unschedulable_message(total_nodes: int, reasons_per_node: Sequence[Sequence[str]]) -> str:
    """kube-scheduler's FitError text: "0/3 nodes are available: 1 Insufficient cpu, ..."."""
    counts = Counter(reason for reasons in reasons_per_node for reason in set(reasons))
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(counts.items()))
    message = f"0/{total_nodes} nodes are available"
    if parts:
        message += f": {parts}"
    return message + "."


def node_allocatable(node: Obj) -> ResourceList:
    return parse_resources(node.get("status", {}).get("allocatable"))


def choose_node(
    pod: Obj,
    nodes: Sequence[Obj],
    used_by_node: Mapping[str, Mapping[str, Fraction]],
    allocatable_by_node: Mapping[str, Mapping[str, Fraction]] | None = None,
) -> tuple[str | None, str]:
    """Pick the least-allocated feasible node (ties by fewest pods, then name); else None and
    the FitError text. `allocatable_by_node` saves re-parsing quantities for every pod."""
    requests = pod_requests(pod)
    best: tuple[Fraction, Fraction, str] | None = None
    all_reasons: list[list[str]] = []
    for node in nodes:
        name = node["metadata"]["name"]
        used = used_by_node.get(name, {})
        allocatable = (
            allocatable_by_node[name]
            if allocatable_by_node is not None and name in allocatable_by_node
            else node_allocatable(node)
        )
        reasons = infeasibility_reasons(pod, node, used, requests, allocatable)
        if reasons:
            all_reasons.append(reasons)
            continue
        pods_there = used.get("pods", Fraction(0))
        score = (_allocated_fraction(requests, allocatable, used), pods_there, name)
        if best is None or score < best:
            best = score
    if best is not None:
        return best[2], ""
    return None, unschedulable_message(len(nodes), all_reasons)


def wants_default_scheduler(pod: Obj) -> bool:
    return (pod.get("spec", {}).get("schedulerName") or DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER


def needs_scheduling(pod: Obj) -> bool:
    """Unbound, not being deleted, not finished, and meant for the default scheduler."""
    metadata = pod.get("metadata", {})
    return (
        not pod.get("spec", {}).get("nodeName")
        and not metadata.get("deletionTimestamp")
        and pod.get("status", {}).get("phase") not in TERMINAL_PHASES
        and wants_default_scheduler(pod)
        and not pod.get("spec", {}).get("schedulingGates")
    )

"""The simulated default scheduler's decisions, as pure functions over API dicts.

The filters are kube-scheduler's that matter to this project: NodeUnschedulable,
NodeAffinity (required terms + nodeSelector), TaintToleration (NoSchedule and NoExecute) and
NodeResourcesFit (requests vs allocatable minus non-terminated pods). Their semantics live in
`nodeflow_kube` (shared with nodeset-controller); this module adds what only a scheduler
needs: which pods it handles, the FitError text, and least-allocated node choice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from nodeflow_kube.affinity import node_affinity_matches
from nodeflow_kube.quantity import ResourceList, add_resources
from nodeflow_kube.resources import insufficient_resources
from nodeflow_kube.resources import node_allocatable as node_allocatable
from nodeflow_kube.resources import pod_requests as spec_requests
from nodeflow_kube.taints import unschedulable_blocks, untolerated_taint

DEFAULT_SCHEDULER = "default-scheduler"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

Obj = Mapping[str, Any]

AFFINITY_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE_NODE = "node(s) were unschedulable"
TOO_MANY_PODS = "Too many pods"


def pod_requests(pod: Obj) -> ResourceList:
    """What the pod charges its node (nodeflow_kube.resources.pod_requests of its spec)."""
    return spec_requests(pod.get("spec") or {})


def pod_occupies_node(pod: Obj) -> bool:
    """Pods count against a node until they reach a terminal phase (or are removed)."""
    return bool(pod.get("spec", {}).get("nodeName")) and (
        pod.get("status", {}).get("phase") not in TERMINAL_PHASES
    )


def requested_by_node(
    pods: Iterable[Obj], requests_of: Callable[[Obj], ResourceList] = pod_requests
) -> dict[str, ResourceList]:
    """Summed requests of the pods on each node; `requests_of` may be a cached pod_requests."""
    used: dict[str, ResourceList] = {}
    for pod in pods:
        if pod_occupies_node(pod):
            node = pod["spec"]["nodeName"]
            used[node] = add_resources(used.get(node, {}), requests_of(pod))
    return used


def infeasibility_reasons(
    pod: Obj,
    node: Obj,
    used: Mapping[str, Fraction],
    requests: Mapping[str, Fraction] | None = None,
    allocatable: Mapping[str, Fraction] | None = None,
) -> list[str]:
    """Why `pod` cannot go on `node` (scheduler message fragments); empty means it fits."""
    reasons: list[str] = []
    spec = pod.get("spec") or {}
    if unschedulable_blocks(spec, node):
        reasons.append(UNSCHEDULABLE_NODE)
    if not node_affinity_matches(spec, node):
        reasons.append(AFFINITY_MISMATCH)
    taint = untolerated_taint(spec, node)
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


def choose_node(
    pod: Obj,
    nodes: Sequence[Obj],
    used_by_node: Mapping[str, Mapping[str, Fraction]],
    allocatable_by_node: Mapping[str, Mapping[str, Fraction]] | None = None,
) -> tuple[str | None, str]:
    """Pick the least-allocated feasible node (ties by fewest pods, then name); else None and
    the FitError text. `allocatable_by_node` saves re-parsing quantities for every pod."""
    requests = pod_requests(pod)
    feasible: list[tuple[str, Mapping[str, Fraction], Mapping[str, Fraction]]] = []
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
        else:
            feasible.append((name, used, allocatable))
    if len(feasible) == 1:
        return feasible[0][0], ""  # nothing to choose between (a pinned pod): no scoring
    if feasible:
        best = min(
            (_allocated_fraction(requests, allocatable, used), used.get("pods", Fraction(0)), name)
            for name, used, allocatable in feasible
        )
        return best[2], ""
    return None, unschedulable_message(len(nodes), all_reasons)


def named_nodes(pod: Obj) -> frozenset[str] | None:
    """Node names a pod's required affinity allows at most, when every term names them.

    kube-scheduler's NodeAffinity PreFilter does the same: when each nodeSelectorTerm has a
    `matchFields metadata.name In [...]` requirement, only the union of those nodes can fit,
    so the others are not evaluated. None: any node may fit.
    """
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return None
    names: set[str] = set()
    for term in terms:
        fields = [
            requirement
            for requirement in term.get("matchFields") or []
            if requirement.get("key") == "metadata.name" and requirement.get("operator") == "In"
        ]
        if not fields:
            return None
        # Requirements of one term are ANDed: the term allows the intersection.
        allowed = set(fields[0].get("values") or [])
        for requirement in fields[1:]:
            allowed &= set(requirement.get("values") or [])
        names |= allowed
    return frozenset(names)


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

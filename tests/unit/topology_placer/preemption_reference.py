"""The preemption search as it was before issue #31 item 11, kept as the oracle of the
fast one: every class of victims tried one by one, and for each, a full gather per domain of
the dry run's layer and the victims given back one unit at a time with every node checked
again (quadratic in the cluster's size). test_preemption_search.py checks that the fast
search in topology_placer.preemption makes the same plan on random clusters.

A gang of several pod shapes (a launcher and its workers) is searched the same way, with
each member placed by gather_mixed on its own shape's nodes and a node's victims given back
while it holds what every member placed on it asks, summed resource by resource.

Only the search lives here; the rules on pods (which are never victims, the unit and job of a
pod) are the service's own, read fresh from each pod (no memo).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from nodeflow_kube import fields
from nodeflow_kube.labels import LabelSelector, SelectorError
from topology_placer import pods as podfacts
from topology_placer.fit import NodeCapacity
from topology_placer.gang import GatherRule
from topology_placer.gather import NoFit, Placement, PodShape, gather, gather_mixed
from topology_placer.network import TopologyTree
from topology_placer.preemption import (
    ChargedPod,
    NotHelpful,
    Obj,
    PreemptionPlan,
    VictimUnit,
    _unit_of,
    is_protected_from_preemption,
    is_slurm_node_pod,
)


def victim_units(
    charged: Sequence[ChargedPod], gang_priority: int, usable_nodes: AbstractSet[str]
) -> list[VictimUnit]:
    """Phase 2: the victim units with a pod on a usable node."""
    by_key: dict[str, VictimUnit] = {}
    guards: dict[str, str] = {}
    blocked: set[str] = set()
    for item in charged:
        if item.nominated_only or podfacts.is_deleting(item.pod):
            continue
        key, job, guard = _unit_of(item.pod)
        priority = podfacts.priority_of(item.pod)
        if (
            priority >= gang_priority
            or is_slurm_node_pod(item.pod)
            or is_protected_from_preemption(item.pod)
        ):
            # A unit (or gang) with any pod at or above the gang's priority, or protected, is
            # not a victim: evicting the rest of it would leave the protected pod idle.
            blocked.add(guard)
            continue
        guards[key] = guard
        unit = by_key.setdefault(key, VictimUnit(key=key, priority=priority, job=job))
        unit.priority = max(unit.priority, priority)
        unit.pods.append(item)
    return [
        unit
        for key, unit in sorted(by_key.items())
        if guards[key] not in blocked and any(p.node in usable_nodes for p in unit.pods)
    ]


def _slots_after(
    capacity: NodeCapacity, request: Mapping[str, int], freed: Sequence[Mapping[str, int]]
) -> int:
    used = dict(capacity.used)
    for extra in freed:
        for resource, amount in extra.items():
            used[resource] = used.get(resource, 0) - amount
    trial = NodeCapacity(
        name=capacity.name, node=capacity.node, allocatable=capacity.allocatable, used=used
    )
    return trial.slots(request)


def _selector_matches(selector: Obj, labels: Obj) -> bool:
    """A PodDisruptionBudget's selector: in policy/v1 an empty one ({}) selects every pod of
    its namespace (a null one, none: the caller skips it); one that does not read selects
    none."""
    try:
        return LabelSelector.from_match(selector).matches(labels)
    except SelectorError:
        return False


def broken_budgets(victims: Sequence[Obj], budgets: Sequence[Obj]) -> int:
    """How many PodDisruptionBudgets evicting `victims` would break."""
    broken = 0
    for budget in budgets:
        selector = podfacts.spec(budget).get("selector")
        if not isinstance(selector, Mapping):
            continue
        allowed = podfacts.status(budget).get("disruptionsAllowed", 0)
        allowed = allowed if isinstance(allowed, int) else 0
        namespace = fields.namespace_of(budget)
        hits = sum(
            1
            for pod in victims
            if fields.namespace_of(pod) == namespace
            and _selector_matches(selector, fields.labels_of(pod))
        )
        if hits > allowed:
            broken += 1
    return broken


def _free_after(capacity: NodeCapacity, freed: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Every resource the node has free once `freed` is given back."""
    free = dict(capacity.allocatable)
    for resource, amount in capacity.used.items():
        free[resource] = free.get(resource, 0) - amount
    for extra in freed:
        for resource, amount in extra.items():
            free[resource] = free.get(resource, 0) + amount
    return free


def _holds(free: Mapping[str, int], requests: Sequence[Mapping[str, int]]) -> bool:
    """Whether `free` holds every one of `requests` at once (what they ask, summed)."""
    asked: dict[str, int] = {}
    for request in requests:
        for resource, amount in request.items():
            if amount > 0:
                asked[resource] = asked.get(resource, 0) + amount
    return all(free.get(resource, 0) >= amount for resource, amount in asked.items())


def _minimal_victims(
    placement: Placement,
    units: Sequence[VictimUnit],
    capacities: Mapping[str, NodeCapacity],
    request_of: Mapping[str, Mapping[str, int]],
    cleared: Mapping[str, list[ChargedPod]],
) -> list[VictimUnit] | None:
    """Phase 4: the victims this placement needs after giving back every unit it can
    (`request_of`: what each member asks)."""
    wanted: dict[str, list[Mapping[str, int]]] = {}
    for name, node in placement.assignments:
        wanted.setdefault(node, []).append(request_of[name])
    involved = [u for u in units if any(p.node in wanted for p in u.pods)]
    victims = list(involved)

    def fits(current: Sequence[VictimUnit]) -> bool:
        for node, requests in wanted.items():
            freed = [p.request for u in current for p in u.pods if p.node == node]
            freed.extend(p.request for p in cleared.get(node, []))
            if not _holds(_free_after(capacities[node], freed), requests):
                return False
        return True

    if not fits(victims):
        return None
    for unit in sorted(involved, key=lambda u: (-u.priority, u.key)):
        trial = [v for v in victims if v is not unit]
        if fits(trial):
            victims = trial
    return victims


def plan_preemption(
    *,
    tree: TopologyTree,
    pods_in_rank_order: Sequence[str],
    rules: Sequence[GatherRule],
    capacities: Mapping[str, NodeCapacity],
    usable_nodes: AbstractSet[str],
    request: Mapping[str, int],
    charged: Sequence[ChargedPod],
    gang_priority: int,
    budgets: Sequence[Obj],
    shapes: Sequence[PodShape] = (),
    shape_of: Mapping[str, int] | None = None,
) -> PreemptionPlan | NotHelpful:
    """Phases 2-5: the least-cost plan that places the whole gang, or why there is none.

    Plans are searched cheapest class first: units protected by a disruption budget only
    when nothing else helps, and within that, evicting only jobs up to a priority ceiling
    that rises one priority at a time, so the gather itself only sees room that the
    cheapest jobs free. With several `shapes`, each member (`shape_of`) asks its shape's
    request and goes on its shape's usable nodes that are within `usable_nodes`.
    """
    units = victim_units(charged, gang_priority, usable_nodes)
    cleared: dict[str, list[ChargedPod]] = {}
    for item in charged:
        if item.nominated_only and podfacts.priority_of(item.pod) < gang_priority:
            cleared.setdefault(item.node, []).append(item)
    ranks = {priority: rank for rank, priority in enumerate(sorted({u.priority for u in units}))}
    protected = {u.key for u in units if broken_budgets([p.pod for p in u.pods], budgets)}
    last_failure = "no lower-priority pods to evict"
    for allow_protected in (False, True):
        for ceiling in sorted(ranks):
            allowed = [
                u
                for u in units
                if u.priority <= ceiling and (allow_protected or u.key not in protected)
            ]
            outcome = _best_plan(
                tree,
                pods_in_rank_order,
                rules,
                capacities,
                usable_nodes,
                request,
                allowed,
                cleared,
                ranks,
                budgets,
                shapes if len(shapes) > 1 else (),
                shape_of or {},
            )
            if isinstance(outcome, PreemptionPlan):
                return outcome
            last_failure = outcome
    return NotHelpful(f"preemption not helpful: even without lower-priority pods, {last_failure}")


def _best_plan(
    tree: TopologyTree,
    pods_in_rank_order: Sequence[str],
    rules: Sequence[GatherRule],
    capacities: Mapping[str, NodeCapacity],
    usable_nodes: AbstractSet[str],
    request: Mapping[str, int],
    units: Sequence[VictimUnit],
    cleared: Mapping[str, list[ChargedPod]],
    ranks: Mapping[int, int],
    budgets: Sequence[Obj],
    shapes: Sequence[PodShape],
    shape_of: Mapping[str, int],
) -> PreemptionPlan | str:
    dry_slots: dict[str, int] = {}
    dry_free: dict[str, dict[str, int]] = {}
    for node in usable_nodes:
        freed = [p.request for u in units for p in u.pods if p.node == node]
        freed.extend(p.request for p in cleared.get(node, []))
        dry_free[node] = _free_after(capacities[node], freed)
        count = _slots_after(capacities[node], request, freed)
        if count > 0:
            dry_slots[node] = count
    members = [(name, shape_of[name]) for name in pods_in_rank_order] if shapes else []
    within_usable = [PodShape(s.request, s.usable & usable_nodes) for s in shapes]

    def place(within: tuple[str, ...] | None = None) -> Placement | NoFit:
        if shapes:
            return gather_mixed(tree, members, within_usable, dry_free, rules, within=within)
        return gather(tree, pods_in_rank_order, rules, dry_slots, within=within)

    request_of = {
        name: (shapes[shape_of[name]].request if shapes else request) for name in pods_in_rank_order
    }
    dry = place()
    if isinstance(dry, NoFit):
        return dry.message
    depth = tree.spec.depth_of(dry.layer)
    assert depth is not None  # gather names only layers of the tree
    best: tuple[tuple[int, int, int, tuple[str, ...]], PreemptionPlan] | None = None
    for domain in tree.domains_at(depth):
        placement = place(domain.path)
        if isinstance(placement, NoFit):
            continue
        victims = _minimal_victims(placement, units, capacities, request_of, cleared)
        if victims is None:
            continue
        nodes = {node for _, node in placement.assignments}
        job_priority: dict[str, int] = {}
        for unit in victims:
            job_priority[unit.job] = max(job_priority.get(unit.job, unit.priority), unit.priority)
        cost = sum(ranks[priority] + 1 for priority in job_priority.values())
        victim_pods = [p.pod for u in victims for p in u.pods]
        breaks = broken_budgets(victim_pods, budgets)
        plan = PreemptionPlan(
            placement=placement,
            victims=tuple(victims),
            cost=cost,
            broken_budgets=breaks,
            cleared_nominations=tuple(
                p.pod for node in sorted(nodes) for p in cleared.get(node, [])
            ),
        )
        key = (breaks, cost, len(victim_pods), domain.path)
        if best is None or key < best[0]:
            best = (key, plan)
    if best is None:
        return f"no {dry.layer} domain fits after eviction"
    return best[1]

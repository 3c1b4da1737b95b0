"""Job-level preemption: make room for a whole gang by evicting lower-priority jobs.

Phases, as Koordinator's PostFilter, with two of its gaps closed:

1. Eligibility: no member has `preemptionPolicy: Never`, and no lower-priority pod is still
   terminating on a node a member is nominated to (an earlier preemption is still taking
   effect; preempting again would evict more than needed).
2. Victim units: bound lower-priority pods on nodes the gang may use, grouped by job. A pod of
   a PodGroup brings its whole gang (every bound member, wherever it runs): evicting part of
   a gang leaves the rest idle, so the whole gang is the unit that is costed and evicted
   (Koordinator evicts single pods of victim gangs). A replica of a ReplicaSet, DaemonSet or
   StatefulSet is a unit of its own: the plan takes only the replicas on the nodes it
   chooses, never every replica cluster-wide. Other pods group by their owner.
   Lower-priority nominations are reservations only: the dry run ignores them and the
   plan clears them on the nodes it takes. A NodeSet pod (slurmd) is never a victim,
   whatever its priority: the Slurm jobs on it are invisible here, and only the NodeSet
   protocol (drain in Slurm first) may take it away. Nor is a pod its owner protects with
   Koordinator's labels (`scheduling.koordinator.sh/disable-preemptible: "true"`,
   `quota.scheduling.koordinator.sh/preemptible: "false"`); either protects its whole job.
3. Dry run: with the allowed units removed, the gather picks the winning layer; every domain
   of that layer that then fits the gang is costed. Units are allowed cheapest first: up to
   a priority ceiling raised one priority at a time, budget-protected units last.
4. Per domain: start from every unit on its nodes as a victim, then give units back in the
   order priority desc, unit key while the gang still fits; cost = sum over the remaining
   distinct victim jobs of their priority rank (1 for the lowest priority present).
5. PodDisruptionBudgets: a plan that evicts more pods matching a budget than its
   `status.disruptionsAllowed` breaks it; such a plan is chosen only when every plan breaks
   one (fewest broken budgets first), then least cost, then fewest pods, then domain path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nodeflow_contracts.pod_protocol import NODESET_LABEL
from nodeflow_kube import fields
from nodeflow_kube.labels import LabelSelector, SelectorError
from topology_placer import pods as podfacts
from topology_placer.fit import NodeCapacity
from topology_placer.gang import GatherRule, pod_group_of
from topology_placer.gather import NoFit, Placement, gather
from topology_placer.network import TopologyTree

Obj = Mapping[str, Any]

PREEMPTION_REASON = "PreemptionByScheduler"
# Koordinator's opt-outs (apis/extension/preemption.go, elastic_quota.go): a pod carrying
# either is never a victim (coscheduling/core/preemption.go, IsEligiblePod).
DISABLE_PREEMPTIBLE_LABEL = "scheduling.koordinator.sh/disable-preemptible"
QUOTA_PREEMPTIBLE_LABEL = "quota.scheduling.koordinator.sh/preemptible"

PodKey = tuple[str, str]
# Controllers whose pods are interchangeable replicas, each evicted on its own.
REPLICA_CONTROLLERS = frozenset({"ReplicaSet", "DaemonSet", "StatefulSet"})


class ChargedPod(NamedTuple):
    """A pod counted against a node: bound to it, or nominated to it. (A tuple: a pass makes
    one for every pod in the cluster, and a frozen dataclass costs several times more.)"""

    pod: Obj
    node: str
    # Shared with the request memo: read only.
    request: Mapping[str, int]
    nominated_only: bool


@dataclass
class VictimUnit:
    """One job that is evicted whole or not at all."""

    key: str
    priority: int
    pods: list[ChargedPod] = field(default_factory=list)
    # The job the unit belongs to (a replica's controller): a plan is costed per job.
    job: str = ""


@dataclass(frozen=True)
class PreemptionPlan:
    placement: Placement
    victims: tuple[VictimUnit, ...]
    cost: int
    broken_budgets: int
    # Lower-priority pods nominated to the plan's nodes whose nomination is cleared.
    cleared_nominations: tuple[Obj, ...]

    @property
    def victim_pods(self) -> list[Obj]:
        return [charged.pod for unit in self.victims for charged in unit.pods]

    @property
    def victim_jobs(self) -> int:
        return len({unit.job for unit in self.victims})


@dataclass(frozen=True)
class NotHelpful:
    message: str


@dataclass(frozen=True)
class Ineligible:
    message: str
    # Victims this gang marked whose delete never landed: their DisruptionTarget and delete
    # are sent again, so the gang is not left waiting for a deletion nobody makes.
    resend: tuple[Obj, ...] = ()


def is_protected_from_preemption(pod: Obj) -> bool:
    """Labelled by its owner as no victim, with Koordinator's exact values (any other value
    of either label leaves the pod preemptible, as upstream reads them)."""
    labels = fields.labels_of(pod)
    return (
        labels.get(DISABLE_PREEMPTIBLE_LABEL) == "true"
        or labels.get(QUOTA_PREEMPTIBLE_LABEL) == "false"
    )


def _still_a_victim(pod: Obj, gang_priority: int) -> bool:
    """A pod marked earlier that may still be evicted now: a mark never outweighs the rules
    that keep a pod from being a victim (its priority, a NodeSet, its owner's opt-out)."""
    return (
        podfacts.priority_of(pod) < gang_priority
        and not is_slurm_node_pod(pod)
        and not is_protected_from_preemption(pod)
    )


def _marked_by(pod: Obj, marker: str) -> bool:
    disruption = fields.condition(pod, podfacts.DISRUPTION_TARGET)
    return (
        disruption is not None
        and disruption.get("reason") == PREEMPTION_REASON
        and marker in str(disruption.get("message") or "")
    )


def preemption_message(scheduler: str, preemptor: str, trigger_pod: str) -> str:
    """The reference's DisruptionTarget message of a victim."""
    return (
        f"{scheduler}: preempting to accommodate higher priority pods, "
        f"preemptor: {preemptor}, triggerpod: {trigger_pod}"
    )


def eligibility(
    members: Sequence[Obj],
    gang_priority: int,
    all_pods: Sequence[Obj],
    preemptor: str = "",
    in_flight: AbstractSet[PodKey] = frozenset(),
) -> Ineligible | None:
    """Phase 1: why the gang may not preempt now, or None.

    Besides the reference's two rules, a victim this gang already preempted (its
    DisruptionTarget names the preemptor) that still holds its node also blocks a new
    preemption: the evictions may land before the members' nominations do, and a second
    plan made in between would evict more jobs than needed. Such a victim blocks only while
    its eviction may still happen: it is being deleted, or a command of ours on it may still
    land (`in_flight`). One whose delete expired or failed is sent again (`resend`) rather
    than waited for forever; one that is no victim any more (since protected, or of a
    priority raised to the gang's) does not block and is not deleted: a new plan leaves it
    alone."""
    for member in members:
        if podfacts.spec(member).get("preemptionPolicy") == "Never":
            return Ineligible(
                f"pod {fields.name_of(member)} has preemptionPolicy Never: no preemption"
            )
    nominated = {podfacts.nominated_node_of(m) for m in members} - {""}
    marker = f"preemptor: {preemptor}, " if preemptor else None
    waiting: str | None = None
    resend: list[Obj] = []
    for pod in all_pods:
        where = f"{fields.namespace_of(pod)}/{fields.name_of(pod)}"
        if (
            marker is not None
            and podfacts.occupies_node(pod)
            and _marked_by(pod, marker)
            and _still_a_victim(pod, gang_priority)
        ):
            node = podfacts.node_name_of(pod)
            if podfacts.is_deleting(pod):
                waiting = waiting or (
                    f"victim {where} of this gang's preemption is still terminating on {node}"
                )
            elif (fields.namespace_of(pod), fields.name_of(pod)) in in_flight:
                waiting = waiting or (
                    f"victim {where} of this gang's preemption is still terminating on "
                    f"{node} (its delete is on its way)"
                )
            else:
                resend.append(pod)
            continue
        node = podfacts.node_name_of(pod)
        if (
            node in nominated
            and podfacts.is_deleting(pod)
            and podfacts.priority_of(pod) < gang_priority
        ):
            waiting = waiting or (f"victim {where} is still terminating on nominated node {node}")
    if resend:
        names = ", ".join(f"{fields.namespace_of(p)}/{fields.name_of(p)}" for p in resend[:3]) + (
            f" and {len(resend) - 3} more" if len(resend) > 3 else ""
        )
        return Ineligible(
            f"victims of this gang's preemption are still terminating: the delete of {names} "
            "did not land and is sent again",
            resend=tuple(resend),
        )
    return Ineligible(waiting) if waiting is not None else None


def _controller_kind(pod: Obj) -> str:
    for owner in fields.meta(pod).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("name"):
            return str(owner.get("kind") or "")
    return ""


def _unit_key(pod: Obj) -> tuple[str, str]:
    """The victim unit of a pod and the job it belongs to."""
    group = pod_group_of(pod)
    if group is not None:
        key = f"podgroup {group}"
        return key, key
    job = f"job {fields.namespace_of(pod)}/{podfacts.owner_name(pod)}"
    if _controller_kind(pod) in REPLICA_CONTROLLERS:
        return f"pod {fields.namespace_of(pod)}/{fields.name_of(pod)}", job
    return job, job


def is_slurm_node_pod(pod: Obj) -> bool:
    """A NodeSet's slurmd pod: deleting it would kill the Slurm jobs running on its node."""
    return NODESET_LABEL in fields.labels_of(pod)


def victim_units(
    charged: Sequence[ChargedPod], gang_priority: int, usable_nodes: AbstractSet[str]
) -> list[VictimUnit]:
    """Phase 2: bound lower-priority jobs with a pod on a usable node, each whole."""
    by_key: dict[str, VictimUnit] = {}
    blocked: set[str] = set()
    for item in charged:
        if item.nominated_only or podfacts.is_deleting(item.pod):
            continue
        key, job = _unit_key(item.pod)
        priority = podfacts.priority_of(item.pod)
        if (
            priority >= gang_priority
            or is_slurm_node_pod(item.pod)
            or is_protected_from_preemption(item.pod)
        ):
            # A job with any member at or above the gang's priority, or protected, is not a
            # victim: evicting the rest of it would leave the protected pod idle.
            blocked.add(key)
            continue
        unit = by_key.setdefault(key, VictimUnit(key=key, priority=priority, job=job))
        unit.priority = max(unit.priority, priority)
        unit.pods.append(item)
    return [
        unit
        for key, unit in sorted(by_key.items())
        if key not in blocked and any(p.node in usable_nodes for p in unit.pods)
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


def _minimal_victims(
    placement: Placement,
    units: Sequence[VictimUnit],
    capacities: Mapping[str, NodeCapacity],
    request: Mapping[str, int],
    cleared: Mapping[str, list[ChargedPod]],
) -> list[VictimUnit] | None:
    """Phase 4: the victims this placement needs after giving back every unit it can."""
    wanted: dict[str, int] = {}
    for _, node in placement.assignments:
        wanted[node] = wanted.get(node, 0) + 1
    involved = [u for u in units if any(p.node in wanted for p in u.pods)]
    victims = list(involved)

    def fits(current: Sequence[VictimUnit]) -> bool:
        for node, count in wanted.items():
            freed = [p.request for u in current for p in u.pods if p.node == node]
            freed.extend(p.request for p in cleared.get(node, []))
            if _slots_after(capacities[node], request, freed) < count:
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
) -> PreemptionPlan | NotHelpful:
    """Phases 2-5: the least-cost plan that places the whole gang, or why there is none.

    Plans are searched cheapest class first: units protected by a disruption budget only
    when nothing else helps, and within that, evicting only jobs up to a priority ceiling
    that rises one priority at a time, so the gather itself only sees room that the
    cheapest jobs free.
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
) -> PreemptionPlan | str:
    dry_slots: dict[str, int] = {}
    for node in usable_nodes:
        freed = [p.request for u in units for p in u.pods if p.node == node]
        freed.extend(p.request for p in cleared.get(node, []))
        count = _slots_after(capacities[node], request, freed)
        if count > 0:
            dry_slots[node] = count
    dry = gather(tree, pods_in_rank_order, rules, dry_slots)
    if isinstance(dry, NoFit):
        return dry.message
    depth = tree.spec.depth_of(dry.layer)
    assert depth is not None  # gather names only layers of the tree
    best: tuple[tuple[int, int, int, tuple[str, ...]], PreemptionPlan] | None = None
    for domain in tree.domains_at(depth):
        placement = gather(tree, pods_in_rank_order, rules, dry_slots, within=domain.path)
        if isinstance(placement, NoFit):
            continue
        victims = _minimal_victims(placement, units, capacities, request, cleared)
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

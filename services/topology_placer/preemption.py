"""Job-level preemption: make room for a whole gang by evicting lower-priority jobs.

Phases, as Koordinator's PostFilter, with two of its gaps closed:

1. Eligibility: no member has `preemptionPolicy: Never`, and no lower-priority pod is still
   terminating on a node a member is nominated to (an earlier preemption is still taking
   effect; preempting again would evict more than needed).
2. Victim units: bound lower-priority pods on nodes the gang may use. As kube-scheduler's
   DefaultPreemption and Koordinator choose victims pod by pod, a pod of a PodGroup (a victim
   gang's disruption mode is KEP-4671's default, Pod), of a batch Job, ReplicaSet,
   DaemonSet or StatefulSet is a unit of its own: the plan takes only the pods on the nodes
   it chooses, never every pod of the job cluster-wide. The pods of a scheduling.k8s.io
   PodGroup (the Workload API's, `spec.schedulingGroup`) whose `disruptionMode` is PodGroup
   are one unit: all of them, wherever they run, or none. Pods of other owners (custom
   controllers, whose pods may depend on each other in ways not read here) group by owner.
   A plan is costed per job (a gang, a controller) all the same.
   Lower-priority nominations are reservations only: the dry run ignores them and the
   plan clears them on the nodes it takes. A NodeSet pod (slurmd) is never a victim,
   whatever its priority: the Slurm jobs on it are invisible here, and only the NodeSet
   protocol (drain in Slurm first) may take it away. Nor is a pod its owner protects with
   Koordinator's labels (`scheduling.koordinator.sh/disable-preemptible: "true"`,
   `quota.scheduling.koordinator.sh/preemptible: "false"`). Either protects the pod alone,
   but a gang member so protected (or of the preemptor's priority or higher) protects its
   whole gang: its members run one job together.
3. Dry run: with the allowed units removed, the gather picks the winning layer; every domain
   of that layer that then fits the gang is costed. Units are allowed cheapest first: up to
   a priority ceiling raised one priority at a time, budget-protected units last. A gang of
   several pod shapes (a CPU-only launcher and its 8-GPU workers) is placed as placement
   places it (gather.gather_mixed): each member with its own request, on the nodes its own
   filters pass; victims are looked for on the nodes any member may use.
4. Per domain: start from every unit on its nodes as a victim, then give units back in the
   order priority desc, unit key while the gang still fits (every node still holds what the
   members placed on it ask, each by its own request); cost = sum over the remaining
   distinct victim jobs of their priority rank (1 for the lowest priority present).
5. PodDisruptionBudgets: a plan that evicts more pods matching a budget than its
   `status.disruptionsAllowed` breaks it; such a plan is chosen only when every plan breaks
   one (fewest broken budgets first), then least cost, then fewest pods, then domain path.

One pass stays near-linear in the cluster's size (issue #31: a full cluster of 16k nodes):
each pod is read once per version, the units are indexed by node, the cheapest class that
fits is found by bisection, the slots are summed up the tree once for every domain costed
(gather.gather_within_each), and giving a unit back re-checks only the nodes it is on. The
plans are those of the plain class-by-class, domain-by-domain search, kept as the oracle of
tests/unit/topology_placer/test_preemption_search.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nodeflow_contracts.pod_protocol import NODESET_LABEL
from nodeflow_kube import fields
from nodeflow_kube.labels import LabelSelector, SelectorError
from topology_placer import pods as podfacts
from topology_placer.fit import NodeCapacity, largest_request, slots_in
from topology_placer.gang import GatherRule, pod_group_of
from topology_placer.gather import (
    NoFit,
    Placement,
    PodShape,
    gather,
    gather_mixed,
    gather_mixed_within_each,
    gather_within_each,
)
from topology_placer.memo import FactsByVersion
from topology_placer.network import Domain, TopologyTree

Obj = Mapping[str, Any]

PREEMPTION_REASON = "PreemptionByScheduler"
# Koordinator's opt-outs (apis/extension/preemption.go, elastic_quota.go): a pod carrying
# either is never a victim (coscheduling/core/preemption.go, IsEligiblePod).
DISABLE_PREEMPTIBLE_LABEL = "scheduling.koordinator.sh/disable-preemptible"
QUOTA_PREEMPTIBLE_LABEL = "quota.scheduling.koordinator.sh/preemptible"

PodKey = tuple[str, str]
# Controllers whose pods are each evicted on their own, as kube-scheduler evicts any pod: the
# replicas of a ReplicaSet, DaemonSet or StatefulSet, and the pods of a batch Job (not part of
# a gang: a gang's pods are read first), which the Job recreates as it does for a failed pod.
PER_POD_CONTROLLERS = frozenset({"ReplicaSet", "DaemonSet", "StatefulSet", "Job"})
# KEP-4671's disruption modes (scheduling.k8s.io/v1alpha2 PodGroup spec.disruptionMode): its
# pods are disrupted one by one (Pod, the default) or only all together (PodGroup).
DISRUPTION_MODE_POD_GROUP = "PodGroup"


def workload_group_of(pod: Obj) -> str | None:
    """`namespace/name` of the scheduling.k8s.io PodGroup a pod belongs to
    (`spec.schedulingGroup.podGroupName`, Kubernetes 1.36), or None."""
    group = fields.mapping(fields.mapping(pod.get("spec")).get("schedulingGroup"))
    name = group.get("podGroupName")
    if not isinstance(name, str) or not name:
        return None
    return f"{fields.namespace_of(pod)}/{name}"


def _workload_group_job(group: str) -> str:
    return f"podgroup.scheduling.k8s.io {group}"


def evicted_whole(workload_pod_groups: Iterable[Obj]) -> frozenset[str]:
    """The jobs of the scheduling.k8s.io PodGroups whose `spec.disruptionMode` is PodGroup:
    a preemption takes all of their pods or none. A group not read (the alpha API not served,
    or not mirrored yet) is read in the default mode, Pod."""
    return frozenset(
        _workload_group_job(f"{fields.namespace_of(group)}/{fields.name_of(group)}")
        for group in workload_pod_groups
        if fields.mapping(group.get("spec")).get("disruptionMode") == DISRUPTION_MODE_POD_GROUP
    )


class ChargedPod(NamedTuple):
    """A pod counted against a node: bound to it, or nominated to it. (A tuple: a pass makes
    one for every pod in the cluster, and a frozen dataclass costs several times more.)"""

    pod: Obj
    node: str
    # Shared with the request memo: read only.
    request: Mapping[str, int]
    nominated_only: bool


@dataclass(slots=True)
class VictimUnit:
    """What is evicted whole or not at all: one pod, or every pod of an owner."""

    key: str
    priority: int
    pods: list[ChargedPod] = field(default_factory=list)
    # The job the unit belongs to (a replica's controller): a plan is costed per job.
    job: str = ""
    # What a budget selects by, besides each pod's labels: the unit's namespace (its key
    # names it, so every pod of the unit is in it).
    namespace: str = ""
    # Each pod's labels, in the order of `pods` (read with the pod's facts, so a pass does
    # not look each pod up again to match the budgets).
    labels: list[Obj] = field(default_factory=list)


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


class _PodFacts(NamedTuple):
    """What a preemption pass reads of one pod version, read once (see memo.py): a pass over
    a full cluster asks it of every pod."""

    namespace: str
    labels: Obj
    # The node it is bound to, and whether it holds it (bound, not finished).
    node: str
    occupies: bool
    deleting: bool
    priority: int
    # Its victim unit, the job that unit belongs to, and what a protected pod protects
    # (_unit_of).
    key: str
    job: str
    guard: str
    # A NodeSet pod, or one its owner opted out of preemption: never a victim.
    never_a_victim: bool
    # The message of its DisruptionTarget condition when a preemption set it, else None.
    preemption_mark: str | None


def _read_pod_facts(pod: Obj) -> _PodFacts:
    key, job, guard = _unit_of(pod)
    disruption = fields.condition(pod, podfacts.DISRUPTION_TARGET)
    mark = (
        str(disruption.get("message") or "")
        if disruption is not None and disruption.get("reason") == PREEMPTION_REASON
        else None
    )
    return _PodFacts(
        namespace=fields.namespace_of(pod),
        labels=fields.labels_of(pod),
        node=podfacts.node_name_of(pod),
        occupies=podfacts.occupies_node(pod),
        deleting=podfacts.is_deleting(pod),
        priority=podfacts.priority_of(pod),
        key=key,
        job=job,
        guard=guard,
        never_a_victim=is_slurm_node_pod(pod) or is_protected_from_preemption(pod),
        preemption_mark=mark,
    )


_POD_FACTS: FactsByVersion[_PodFacts] = FactsByVersion(_read_pod_facts, limit=400_000)


def _still_a_victim(facts: _PodFacts, gang_priority: int) -> bool:
    """A pod marked earlier that may still be evicted now: a mark never outweighs the rules
    that keep a pod from being a victim (its priority, a NodeSet, its owner's opt-out)."""
    return facts.priority < gang_priority and not facts.never_a_victim


def _marked_by(facts: _PodFacts, marker: str) -> bool:
    return facts.preemption_mark is not None and marker in facts.preemption_mark


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
    # Every pod's facts; the memo then holds just the versions in the cluster now.
    for pod, facts in zip(all_pods, _POD_FACTS.of_all(all_pods), strict=True):
        if (
            marker is not None
            and facts.occupies
            and _marked_by(facts, marker)
            and _still_a_victim(facts, gang_priority)
        ):
            where = f"{facts.namespace}/{fields.name_of(pod)}"
            if facts.deleting:
                waiting = waiting or (
                    f"victim {where} of this gang's preemption is still terminating on {facts.node}"
                )
            elif (facts.namespace, fields.name_of(pod)) in in_flight:
                waiting = waiting or (
                    f"victim {where} of this gang's preemption is still terminating on "
                    f"{facts.node} (its delete is on its way)"
                )
            else:
                resend.append(pod)
            continue
        if (
            waiting is None
            and facts.node in nominated
            and facts.deleting
            and facts.priority < gang_priority
        ):
            waiting = (
                f"victim {facts.namespace}/{fields.name_of(pod)} is still terminating on "
                f"nominated node {facts.node}"
            )
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


class UnitOf(NamedTuple):
    """Where a pod stands as a possible victim."""

    # The victim unit it is evicted with.
    key: str
    # The job a plan is costed by.
    job: str
    # What it keeps from being a victim when it may not be one: a gang member its whole gang,
    # any other pod its own unit.
    guard: str


def _unit_of(pod: Obj) -> UnitOf:
    own = f"pod {fields.namespace_of(pod)}/{fields.name_of(pod)}"
    workload_group = workload_group_of(pod)
    if workload_group is not None:
        # KEP-4671's PodGroup, in its default disruption mode (Pod): pod by pod. Its mode
        # PodGroup makes the group one unit (victim_units): it is a property of the group,
        # not of the pod read here.
        job = _workload_group_job(workload_group)
        return UnitOf(own, job, job)
    group = pod_group_of(pod)
    if group is not None:
        # Disruption mode `single` (KEP-4671's default, and Koordinator's only behaviour).
        job = f"podgroup {group}"
        return UnitOf(own, job, job)
    job = f"job {fields.namespace_of(pod)}/{podfacts.owner_name(pod)}"
    if _controller_kind(pod) in PER_POD_CONTROLLERS:
        return UnitOf(own, job, own)
    return UnitOf(job, job, job)


def is_slurm_node_pod(pod: Obj) -> bool:
    """A NodeSet's slurmd pod: deleting it would kill the Slurm jobs running on its node."""
    return NODESET_LABEL in fields.labels_of(pod)


def victim_units(
    charged: Sequence[ChargedPod],
    gang_priority: int,
    usable_nodes: AbstractSet[str],
    whole_jobs: AbstractSet[str] = frozenset(),
) -> list[VictimUnit]:
    """Phase 2: the victim units (pods, or owners' pods whole) with a pod on a usable node.
    The pods of a job in `whole_jobs` (evicted_whole) are one unit, wherever they run."""
    by_key: dict[str, VictimUnit] = {}
    guards: dict[str, str] = {}
    blocked: set[str] = set()
    # The units with a pod on a usable node, noted as their pods are read (not by walking
    # every unit's pods again afterwards).
    usable_keys: set[str] = set()
    for item, facts in zip(charged, _POD_FACTS.of_each(c.pod for c in charged), strict=True):
        if item.nominated_only or facts.deleting:
            continue
        key = facts.job if facts.job in whole_jobs else facts.key
        if facts.priority >= gang_priority or facts.never_a_victim:
            # A unit (or gang) with any pod at or above the gang's priority, or protected, is
            # not a victim: evicting the rest of it would leave the protected pod idle.
            blocked.add(facts.guard)
            continue
        guards[key] = facts.guard
        if item.node in usable_nodes:
            usable_keys.add(key)
        unit = by_key.get(key)
        if unit is None:
            by_key[key] = VictimUnit(
                key, facts.priority, [item], facts.job, facts.namespace, [facts.labels]
            )
        else:
            if facts.priority > unit.priority:
                unit.priority = facts.priority
            unit.pods.append(item)
            unit.labels.append(facts.labels)
    # (Sorting the keys alone: a pair per unit would be one more object per victim pod.)
    return [by_key[key] for key in sorted(usable_keys) if guards[key] not in blocked]


class _Budget(NamedTuple):
    namespace: str
    # None: its selector does not read, so it selects no pod.
    selector: LabelSelector | None
    allowed: int


def _budgets(budgets: Sequence[Obj]) -> list[_Budget]:
    """The PodDisruptionBudgets that guard pods (a null selector guards none), each selector
    parsed once."""
    read: list[_Budget] = []
    for budget in budgets:
        selector = podfacts.spec(budget).get("selector")
        if not isinstance(selector, Mapping):
            continue
        allowed = podfacts.status(budget).get("disruptionsAllowed", 0)
        try:
            parsed: LabelSelector | None = LabelSelector.from_match(selector)
        except SelectorError:
            parsed = None
        read.append(
            _Budget(fields.namespace_of(budget), parsed, allowed if isinstance(allowed, int) else 0)
        )
    return read


def _hits(namespace: str, labels: Sequence[Obj], budgets: Sequence[_Budget]) -> tuple[int, ...]:
    """How many pods of `namespace` with these labels each budget selects."""
    return tuple(
        0
        if budget.selector is None or budget.namespace != namespace
        else sum(1 for each in labels if budget.selector.matches(each))
        for budget in budgets
    )


def _broken(hits: Sequence[int], budgets: Sequence[_Budget]) -> int:
    return sum(1 for hit, budget in zip(hits, budgets, strict=True) if hit > budget.allowed)


def broken_budgets(victims: Sequence[Obj], budgets: Sequence[Obj]) -> int:
    """How many PodDisruptionBudgets evicting `victims` would break."""
    read = _budgets(budgets)
    hits = [0] * len(read)
    for pod in victims:
        for index, hit in enumerate(_hits(fields.namespace_of(pod), [fields.labels_of(pod)], read)):
            hits[index] += hit
    return _broken(hits, read)


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
    workload_pod_groups: Sequence[Obj] = (),
) -> PreemptionPlan | NotHelpful:
    """Phases 2-5: the least-cost plan that places the whole gang, or why there is none.

    Plans are searched cheapest class first: units protected by a disruption budget only
    when nothing else helps, and within that, evicting only jobs up to a priority ceiling
    that rises one priority at a time, so the gather itself only sees room that the
    cheapest jobs free.

    The first class whose dry run fits is found by bisection: allowing more units only
    frees more room, and more room never makes a gang that fitted stop fitting, so within
    each half (without, then with budget-protected units) the classes that fit are a
    suffix. When even every unit allowed does not fit, no class does, and that class's
    reason is the answer (the last one tried, as in a class-by-class search).

    Every member asks `request` and may go on any of `usable_nodes`, unless the gang has
    several pod shapes (a CPU-only launcher and its 8-GPU workers): then `shapes` lists
    them, `shape_of` names each member's, and each member is placed with its own shape's
    request on its own shape's usable nodes (those within `usable_nodes`, where victims are
    looked for), as placement does (gather.gather_mixed); `request` is not read. Such a
    gang's dry run packs with a search bounded in steps, and more room can make a search
    reach its bound where less did not, so its classes are tried one by one, cheapest first,
    without bisection.

    `workload_pod_groups` are the scheduling.k8s.io PodGroups: those whose disruptionMode is
    PodGroup lose all their pods or none.
    """
    mixed = _MixedGang.of(pods_in_rank_order, shapes, shape_of, usable_nodes)
    if mixed is not None:
        request = largest_request(shape.request for shape in mixed.shapes)
    units = victim_units(charged, gang_priority, usable_nodes, evicted_whole(workload_pod_groups))
    if not units:
        return NotHelpful(
            "preemption not helpful: even without lower-priority pods, "
            "no lower-priority pods to evict"
        )
    search = _Search(
        tree=tree,
        pods_in_rank_order=pods_in_rank_order,
        rules=rules,
        capacities=capacities,
        usable_nodes=usable_nodes,
        request=request,
        charged=charged,
        gang_priority=gang_priority,
        units=units,
        budgets=_budgets(budgets),
        mixed=mixed,
    )
    protected = {u.key for u in units if search.broken(search.hits_of(u))}
    ceilings = sorted(search.ranks)
    halves = [
        [
            [
                u
                for u in units
                if u.priority <= ceiling and (allow_protected or u.key not in protected)
            ]
            for ceiling in ceilings
        ]
        for allow_protected in (False, True)
    ]
    last_failure = ""
    if mixed is not None:
        for classes in halves:
            for allowed in classes:
                outcome = search.best_plan(allowed)
                if isinstance(outcome, PreemptionPlan):
                    return outcome
                last_failure = outcome
        return NotHelpful(
            f"preemption not helpful: even without lower-priority pods, {last_failure}"
        )
    for classes in halves:
        # Most often the cheapest class fits already; else the whole half is ruled out at
        # once, or the cheapest class that fits is bisected for.
        if isinstance(search.dry(classes[0]), Placement):
            fits = 0
        else:
            top = search.dry(classes[-1])
            if isinstance(top, NoFit):
                last_failure = top.message
                continue
            fits = len(classes) - 1
        # classes[fits] fits, every class before classes[low] does not.
        low = 1
        while low < fits:
            middle = (low + fits) // 2
            if isinstance(search.dry(classes[middle]), NoFit):
                low = middle + 1
            else:
                fits = middle
        for allowed in classes[fits:]:
            # The dry run's domain itself takes the gang, so the first costing succeeds; the
            # rest of the half is tried as the class-by-class search would, should it not.
            outcome = search.best_plan(allowed)
            if isinstance(outcome, PreemptionPlan):
                return outcome
            last_failure = outcome
    return NotHelpful(f"preemption not helpful: even without lower-priority pods, {last_failure}")


class _MixedGang(NamedTuple):
    """A gang of several pod shapes, as the search places it: each member with its shape,
    in rank order, and each shape's usable nodes kept within the nodes preemption may use."""

    members: tuple[tuple[str, int], ...]
    shapes: tuple[PodShape, ...]

    @classmethod
    def of(
        cls,
        pods_in_rank_order: Sequence[str],
        shapes: Sequence[PodShape],
        shape_of: Mapping[str, int] | None,
        usable_nodes: AbstractSet[str],
    ) -> _MixedGang | None:
        if len(shapes) <= 1:
            return None
        if shape_of is None:
            raise ValueError("a gang of several pod shapes needs each member's shape")
        return cls(
            tuple((name, shape_of[name]) for name in pods_in_rank_order),
            tuple(PodShape(s.request, s.usable & usable_nodes) for s in shapes),
        )


class _Search:
    """One preemption search: the victim units indexed by node, so each class's dry run and
    each domain's plan read only the nodes they concern (one pass stays linear in the
    cluster's size)."""

    def __init__(
        self,
        *,
        tree: TopologyTree,
        pods_in_rank_order: Sequence[str],
        rules: Sequence[GatherRule],
        capacities: Mapping[str, NodeCapacity],
        usable_nodes: AbstractSet[str],
        request: Mapping[str, int],
        charged: Sequence[ChargedPod],
        gang_priority: int,
        units: Sequence[VictimUnit],
        budgets: Sequence[_Budget],
        mixed: _MixedGang | None = None,
    ) -> None:
        self.tree = tree
        self.pods_in_rank_order = pods_in_rank_order
        self.rules = rules
        self.capacities = capacities
        self.usable_nodes = usable_nodes
        self.request = request
        self.budgets = budgets
        # Lower-priority pods only nominated: their nominations are cleared on taken nodes.
        self.cleared: dict[str, list[ChargedPod]] = {}
        for item in charged:
            if item.nominated_only and podfacts.priority_of(item.pod) < gang_priority:
                self.cleared.setdefault(item.node, []).append(item)
        self.ranks = {
            priority: rank for rank, priority in enumerate(sorted({u.priority for u in units}))
        }
        # The resources the gang asks for, and how much of each a member takes: a node's
        # room is worked out as these few integers.
        self.resources = tuple(r for r, amount in request.items() if amount > 0)
        self.amounts = tuple(request[r] for r in self.resources)
        # A gang of several shapes (for one shape, None): what each member takes of those
        # resources, by name.
        self.mixed = mixed
        self.member_amounts: dict[str, tuple[int, ...]] = {}
        if mixed is not None:
            of_shape = [tuple(s.request.get(r, 0) for r in self.resources) for s in mixed.shapes]
            self.member_amounts = {name: of_shape[index] for name, index in mixed.members}
        # The units with a pod on each node (in unit order), each with what its pods there
        # take of those resources, summed; and per unit its nodes, worked out only for the
        # few units a plan gives back (unit_nodes). (Pairs of a unit and a tuple, no dict
        # per unit: a pass over a full cluster keeps one per unit and node.)
        self.on_node: dict[str, list[tuple[VictimUnit, tuple[int, ...]]]] = {}
        self._unit_nodes: dict[str, dict[str, tuple[int, ...]]] = {}
        resources = self.resources
        # Pods asking alike share one request dict (fit.pod_request_shared): each distinct
        # one is read once. (Tuples, not lists: the collector stops tracking tuples of ints.)
        asks_of: dict[int, tuple[int, ...]] = {}

        def asks(request: Mapping[str, int]) -> tuple[int, ...]:
            found = asks_of.get(id(request))
            if found is None:
                found = asks_of[id(request)] = tuple(request.get(r, 0) for r in resources)
            return found

        on_node = self.on_node
        for unit in units:
            if len(unit.pods) == 1:
                # Most units are one pod (rule 7c): nothing to sum.
                item = unit.pods[0]
                listed = on_node.get(item.node)
                if listed is None:
                    on_node[item.node] = [(unit, asks(item.request))]
                else:
                    listed.append((unit, asks(item.request)))
                continue
            held: dict[str, tuple[int, ...]] = {}
            for item in unit.pods:
                taken = asks(item.request)
                before = held.get(item.node)
                held[item.node] = (
                    taken
                    if before is None
                    else tuple(a + b for a, b in zip(before, taken, strict=True))
                )
            for node, amounts in held.items():
                entry = (unit, amounts)
                listed = on_node.get(node)
                if listed is None:
                    on_node[node] = [entry]
                else:
                    listed.append(entry)
        self._base: dict[str, tuple[int, ...]] = {}
        self._hits: dict[str, tuple[int, ...]] = {}
        self._no_hits = (0,) * len(budgets)
        self._hit_values: dict[tuple[int, ...], tuple[int, ...]] = {self._no_hits: self._no_hits}
        self._broken_of: dict[tuple[int, ...], int] = {}
        self._hits_by_labels: dict[tuple[Any, ...], tuple[int, ...]] = {}
        # The budgets that may select a pod, by namespace (a budget selects only its own).
        self._selectors_in: dict[str, list[tuple[int, LabelSelector]]] = {}
        for index, budget in enumerate(budgets):
            if budget.selector is not None:
                self._selectors_in.setdefault(budget.namespace, []).append((index, budget.selector))
        self._dry: dict[tuple[str, ...], tuple[dict[str, int], Placement | NoFit]] = {}
        self._dry_mixed: dict[
            tuple[str, ...], tuple[dict[str, Mapping[str, int]], Placement | NoFit]
        ] = {}

    def hits_of(self, unit: VictimUnit) -> tuple[int, ...]:
        """How many of the unit's pods each budget selects (read once per unit). Only the
        budgets of the unit's namespace are matched, against the labels its pods' facts
        hold: a pass asks this of every unit of a full cluster."""
        found = self._hits.get(unit.key)
        if found is None:
            if unit.namespace not in self._selectors_in:
                found = self._no_hits
            else:
                # (A unit made elsewhere, without its pods' labels, has them read here.)
                each = unit.labels or [fields.labels_of(item.pod) for item in unit.pods]
                if len(each) == 1:
                    found = self._pod_hits(unit.namespace, each[0])
                else:
                    per_pod = [self._pod_hits(unit.namespace, one) for one in each]
                    summed = tuple(map(sum, zip(*per_pod, strict=True)))
                    # Most units are hit alike (by no budget): one tuple serves them all.
                    found = self._hit_values.setdefault(summed, summed)
            self._hits[unit.key] = found
        return found

    def _pod_hits(self, namespace: str, labels: Obj) -> tuple[int, ...]:
        """Whether each budget selects a pod of `namespace` with these labels (1 or 0). Pods of
        one template carry the same labels: each distinct set is matched once."""
        key = (namespace, *labels.items())
        found = self._hits_by_labels.get(key)
        if found is None:
            selecting = {
                index
                for index, selector in self._selectors_in.get(namespace, ())
                if selector.matches(labels)
            }
            hits = tuple(int(index in selecting) for index in range(len(self.budgets)))
            found = self._hits_by_labels[key] = self._hit_values.setdefault(hits, hits)
        return found

    def broken(self, hits: tuple[int, ...]) -> int:
        """How many budgets these hits break (worked out once per distinct hits)."""
        count = self._broken_of.get(hits)
        if count is None:
            count = self._broken_of[hits] = _broken(hits, self.budgets)
        return count

    def unit_nodes(self, unit: VictimUnit) -> dict[str, tuple[int, ...]]:
        """The nodes the unit has pods on, each with what they take there (see on_node)."""
        found = self._unit_nodes.get(unit.key)
        if found is None:
            found = self._unit_nodes[unit.key] = {}
            for node in dict.fromkeys(item.node for item in unit.pods):
                for listed, amounts in self.on_node[node]:
                    if listed is unit:
                        found[node] = amounts
                        break
        return found

    def _free_after(self, node: str, allowed_keys: AbstractSet[str]) -> list[int]:
        """What the node would have free of each resource the gang asks for, with the allowed
        units' pods on it evicted and the lower-priority nominations on it cleared."""
        base = self._base.get(node)
        if base is None:
            capacity = self.capacities[node]
            allocatable, used = capacity.allocatable, capacity.used
            room = [allocatable.get(r, 0) - used.get(r, 0) for r in self.resources]
            for item in self.cleared.get(node, ()):
                for index, resource in enumerate(self.resources):
                    room[index] += item.request.get(resource, 0)
            base = self._base[node] = tuple(room)
        free = list(base)
        for unit, amounts in self.on_node.get(node, ()):
            if unit.key in allowed_keys:
                for index, amount in enumerate(amounts):
                    free[index] += amount
        return free

    def _slots(self, free: Sequence[int]) -> int:
        """How many members fit in `free`."""
        return slots_in(dict(zip(self.resources, free, strict=True)), {}, self.request)

    def _dry_run(self, allowed: Sequence[VictimUnit]) -> tuple[dict[str, int], Placement | NoFit]:
        keys = tuple(u.key for u in allowed)
        found = self._dry.get(keys)
        if found is not None:
            return found
        allowed_keys = set(keys)
        slots: dict[str, int] = {}
        for node in self.usable_nodes:
            count = self._slots(self._free_after(node, allowed_keys))
            if count > 0:
                slots[node] = count
        outcome = gather(self.tree, self.pods_in_rank_order, self.rules, slots)
        found = self._dry[keys] = (slots, outcome)
        return found

    def _dry_run_mixed(
        self, allowed: Sequence[VictimUnit]
    ) -> tuple[dict[str, Mapping[str, int]], Placement | NoFit]:
        """The dry run of a gang of several shapes: what every usable node has free with
        `allowed` evicted (nodes alike share one dict, as gather_mixed expects), and where
        gather_mixed puts each member by its own request and usable nodes."""
        assert self.mixed is not None
        keys = tuple(u.key for u in allowed)
        found = self._dry_mixed.get(keys)
        if found is not None:
            return found
        allowed_keys = set(keys)
        free: dict[str, Mapping[str, int]] = {}
        alike: dict[tuple[int, ...], Mapping[str, int]] = {}
        for node in self.usable_nodes:
            room = tuple(self._free_after(node, allowed_keys))
            shared = alike.get(room)
            if shared is None:
                shared = alike[room] = dict(zip(self.resources, room, strict=True))
            free[node] = shared
        outcome = gather_mixed(self.tree, self.mixed.members, self.mixed.shapes, free, self.rules)
        found = self._dry_mixed[keys] = (free, outcome)
        return found

    def dry(self, allowed: Sequence[VictimUnit]) -> Placement | NoFit:
        """Phase 3's dry run: where the gather puts the gang with `allowed` evicted (a gang
        of one shape: the bisection over classes asks this)."""
        return self._dry_run(allowed)[1]

    def _domain_placements(
        self, allowed: Sequence[VictimUnit]
    ) -> tuple[Placement | NoFit, Iterator[tuple[Domain, Placement]]]:
        """The dry run, and the gang placed within each domain of its layer that takes it."""
        if self.mixed is not None:
            dry_free, dry = self._dry_run_mixed(allowed)
            if isinstance(dry, NoFit):
                return dry, iter(())
            depth = self.tree.spec.depth_of(dry.layer)
            assert depth is not None  # gather names only layers of the tree
            return dry, gather_mixed_within_each(
                self.tree,
                self.mixed.members,
                self.mixed.shapes,
                dry_free,
                self.rules,
                self.tree.domains_at(depth),
            )
        dry_slots, dry = self._dry_run(allowed)
        if isinstance(dry, NoFit):
            return dry, iter(())
        depth = self.tree.spec.depth_of(dry.layer)
        assert depth is not None  # gather names only layers of the tree
        return dry, gather_within_each(
            self.tree,
            self.pods_in_rank_order,
            self.rules,
            dry_slots,
            self.tree.domains_at(depth),
        )

    def best_plan(self, allowed: Sequence[VictimUnit]) -> PreemptionPlan | str:
        """Phases 4-5 over every domain of the dry run's layer that takes the gang."""
        dry, placements = self._domain_placements(allowed)
        if isinstance(dry, NoFit):
            return dry.message
        allowed_keys = {u.key for u in allowed}
        best: tuple[tuple[int, int, int, tuple[str, ...]], Placement, list[VictimUnit]] | None
        best = None
        for domain, placement in placements:
            victims = self.minimal_victims(placement, allowed_keys)
            if victims is None:
                continue
            job_priority: dict[str, int] = {}
            hits = [0] * len(self.budgets)
            pod_count = 0
            for unit in victims:
                job_priority[unit.job] = max(
                    job_priority.get(unit.job, unit.priority), unit.priority
                )
                pod_count += len(unit.pods)
                if self.budgets:
                    hits = [a + b for a, b in zip(hits, self.hits_of(unit), strict=True)]
            cost = sum(self.ranks[priority] + 1 for priority in job_priority.values())
            key = (self.broken(tuple(hits)), cost, pod_count, domain.path)
            if best is None or key < best[0]:
                best = (key, placement, victims)
        if best is None:
            return f"no {dry.layer} domain fits after eviction"
        (breaks, cost, _, _), placement, victims = best
        nodes = {node for _, node in placement.assignments}
        return PreemptionPlan(
            placement=placement,
            victims=tuple(victims),
            cost=cost,
            broken_budgets=breaks,
            cleared_nominations=tuple(
                p.pod for node in sorted(nodes) for p in self.cleared.get(node, [])
            ),
        )

    def minimal_victims(
        self, placement: Placement, allowed_keys: AbstractSet[str]
    ) -> list[VictimUnit] | None:
        """Phase 4: start from every allowed unit on the placement's nodes, then give units
        back (priority desc, key) while every node still takes its pods: what the members
        placed there ask, summed (each by its own shape's request). Giving a unit back
        changes only the nodes it has pods on, so only those are checked again."""
        wanted: dict[str, tuple[int, ...]] = {}
        amounts = self.amounts
        for name, node in placement.assignments:
            if self.mixed is not None:
                amounts = self.member_amounts[name]
            before = wanted.get(node)
            wanted[node] = (
                amounts
                if before is None
                else tuple(a + b for a, b in zip(before, amounts, strict=True))
            )
        involved_by_key: dict[str, VictimUnit] = {}
        for node in wanted:
            for unit, _ in self.on_node.get(node, ()):
                if unit.key in allowed_keys:
                    involved_by_key[unit.key] = unit
        # Units are ordered by key (victim_units), and the plan keeps that order.
        involved = [involved_by_key[key] for key in sorted(involved_by_key)]
        free: dict[str, list[int]] = {}
        for node, need in wanted.items():
            free[node] = self._free_after(node, allowed_keys)
            if not _covers(free[node], need):
                return None
        given_back: set[str] = set()
        for unit in sorted(involved, key=lambda u: (-u.priority, u.key)):
            held = self.unit_nodes(unit)
            touched = (
                [n for n in held if n in wanted]
                if len(held) <= len(wanted)
                else [n for n in wanted if n in held]
            )
            after: dict[str, list[int]] = {}
            for node in touched:
                back = [have - amount for have, amount in zip(free[node], held[node], strict=True)]
                if not _covers(back, wanted[node]):
                    break
                after[node] = back
            else:
                free.update(after)
                given_back.add(unit.key)
        return [u for u in involved if u.key not in given_back]


def _covers(free: Sequence[int], need: Sequence[int]) -> bool:
    """Whether what a node has free holds what its members ask, resource by resource. (For
    members alike, the same as slots_in(free, request) >= their count: every resource here
    is one the gang asks a positive amount of.)"""
    return all(have >= amount for have, amount in zip(free, need, strict=True))

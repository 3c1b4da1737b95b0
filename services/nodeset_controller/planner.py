"""The whole NodeSet reconciliation as one pure function: cluster state in, actions out.

`plan(view)` reads a NodeSet, the nodes, the NodeSet's pods, their Slurm states and its
NodeSlices, and returns what should change. It never remembers anything between calls:
every decision is re-derived from the objects, whose durable state (node claims, SlurmDelete
conditions and their timestamps, revision labels) lives in Kubernetes. That is what makes
a restart safe: the next plan after a restart is the plan the killed process would have made.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from nodeflow_contracts.slurm import SlurmNodeState
from nodeflow_kube.quantity import ResourceList
from nodeset_controller import deletion, feasibility, ranking
from nodeset_controller.naming import Collision, assign_names
from nodeset_controller.objects import (
    ROLLING_DELETE,
    SCALING_DELETE,
    claim_of,
    internal_ipv4,
    mapping,
    name_of,
    pod_is_terminal,
    pod_requests,
    resource_version_of,
    rfc3339,
    sequence,
    uid_of,
)
from nodeset_controller.podspec import build_pod, placement_spec, revision_hash, selector
from nodeset_controller.podstate import PodState, pod_state
from nodeset_controller.slices import SliceChange, plan_slices
from nodeset_controller.spec import (
    Defaults,
    NodeSetSpec,
    SpecProblem,
    parse,
    resolve_max_unavailable,
    validate,
)
from nodeset_controller.status import (
    INVALID_SPEC,
    NAME_COLLISION,
    Counts,
    WantedCondition,
    build_status,
    status_differs,
)

Obj = Mapping[str, Any]


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """Record in Kubernetes that this NodeSet uses `node` (resourceVersion precondition)."""

    node: str
    node_uid: str
    node_rv: str
    why: str


@dataclass(frozen=True)
class Release:
    node: str
    node_uid: str
    node_rv: str
    pod_name: str
    why: str


@dataclass(frozen=True)
class CreatePod:
    node: str
    node_uid: str
    node_rv: str
    name: str
    revision: str
    nodeset: NodeSetSpec
    why: str

    @property
    def pod(self) -> dict[str, Any]:
        """The pod to create, built only when the create is sent: a scale-up plans creates
        for every claimed node each round, and most wait for a free slot."""
        return build_pod(self.nodeset, self.node, self.name, self.revision)


@dataclass(frozen=True)
class ScheduleDelete:
    pod: PodState
    reason: Literal["ScalingDeleteScheduled", "RollingDeleteScheduled"]
    decision: Literal["delete-scheduled", "rolling-replace"]
    why: str


@dataclass(frozen=True)
class CancelDelete:
    pod: PodState
    why: str


@dataclass(frozen=True)
class DeletePod:
    pod: PodState
    forced: bool
    reason: str
    why: str


@dataclass(frozen=True)
class WriteSlice:
    change: SliceChange
    resource_version: str | None
    uid: str | None


@dataclass(frozen=True)
class Notice:
    """A decision that changes no object: a name collision or an invalid spec."""

    decision: Literal["name-collision", "invalid-spec"]
    reason: str
    why: str
    node: str = ""
    pod: str = ""


Action = (
    Claim | Release | CreatePod | ScheduleDelete | CancelDelete | DeletePod | WriteSlice | Notice
)


@dataclass
class Plan:
    nodeset: NodeSetSpec | None
    revision: str
    actions: list[Action] = field(default_factory=list)
    status: dict[str, Any] | None = None  # to write; None when unchanged
    wanted_status: dict[str, Any] = field(default_factory=dict)
    # Earliest time a plan would differ without any change in the cluster (forced deletion).
    wake_at: float | None = None
    problems: list[SpecProblem] = field(default_factory=list)


@dataclass
class PlanMemo:
    """Results of the per-object checks of earlier plans, reused while the object is the same.

    A KV view hands out the same dict for an object until the object changes, so identity
    (`is`) proves a result still holds; anything else is recomputed. This keeps a plan over
    thousands of nodes cheap without remembering anything a restart would miss: an empty
    memo gives the same plan.
    """

    pod_states: dict[str, tuple[Obj, SlurmNodeState | None, PodState]] = field(default_factory=dict)
    # Node name -> (node, its IPv4 InternalIP, its claim).
    facts: dict[str, tuple[Obj, ipaddress.IPv4Address | None, str | None]] = field(
        default_factory=dict
    )
    keep: dict[str, tuple[Obj, str, feasibility.Verdict]] = field(default_factory=dict)
    place: dict[str, tuple[Obj, tuple[Any, ...], feasibility.Verdict]] = field(default_factory=dict)

    def forget_absent(self, nodes: Collection[str], pods: Collection[str]) -> None:
        """Drop what belongs to objects that no longer exist (bounded memory)."""
        for table in (self.facts, self.keep, self.place):
            for name in [n for n in table if n not in nodes]:
                del table[name]
        for name in [n for n in self.pod_states if n not in pods]:
            del self.pod_states[name]


@dataclass(frozen=True)
class ClusterView:
    nodeset: Obj
    nodes: Mapping[str, Obj]
    # The NodeSet's pods (its namespace, label nodeflow.dev/nodeset=<name>).
    pods: Collection[Obj]
    # Requests of every non-terminal pod by node (this NodeSet's pods included).
    requested: Mapping[str, ResourceList]
    # Names of pods in the namespace that are not this NodeSet's (a name clash).
    foreign_pod_names: Collection[str]
    # Slurm node state by Slurm node (= pod) name, for the NodeSet's cluster.
    slurm: Mapping[str, SlurmNodeState]
    # The NodeSet's NodeSlices by name.
    slices: Mapping[str, Obj]
    defaults: Defaults
    now: float
    # Reuse of per-object checks across plans (never changes the plan, only its cost).
    memo: PlanMemo | None = None


# --- helpers -------------------------------------------------------------------------------


def _minus(total: ResourceList, less: ResourceList) -> ResourceList:
    return {name: amount - less.get(name, Fraction(0)) for name, amount in total.items()}


def _condition_message(status: Obj, kind: str) -> str | None:
    for entry in sequence(status.get("conditions")):
        if mapping(entry).get("type") == kind and mapping(entry).get("status") == "True":
            return str(mapping(entry).get("message") or "")
    return None


def _spec_conditions(problems: list[SpecProblem]) -> WantedCondition:
    if not problems:
        return WantedCondition(INVALID_SPEC, "False", "SpecValid", "the spec is valid")
    return WantedCondition(
        INVALID_SPEC,
        "True",
        problems[0].reason,
        "; ".join(problem.describe() for problem in problems),
    )


def _collision_condition(collisions: list[Collision]) -> WantedCondition:
    if not collisions:
        return WantedCondition(NAME_COLLISION, "False", "NoCollision", "every pod name is unique")
    return WantedCondition(
        NAME_COLLISION,
        "True",
        "PodNameCollision",
        "; ".join(c.describe() for c in sorted(collisions, key=lambda c: c.node)),
    )


def _finish_status(
    plan: Plan,
    view: ClusterView,
    counts: Counts | None,
    conditions: list[WantedCondition],
    spec_selector: str,
) -> None:
    existing = mapping(view.nodeset.get("status"))
    generation = mapping(view.nodeset.get("metadata")).get("generation")
    wanted = build_status(
        existing,
        counts=counts,
        observed_generation=generation if isinstance(generation, int) else 0,
        selector=spec_selector,
        conditions=conditions,
        now=rfc3339(view.now),
    )
    plan.wanted_status = wanted
    if status_differs(existing, wanted):
        plan.status = wanted


def _pod_state(view: ClusterView, pod: Obj) -> PodState:
    slurm = view.slurm.get(name_of(pod))
    if view.memo is None:
        return pod_state(pod, slurm)
    name = name_of(pod)
    cached = view.memo.pod_states.get(name)
    if cached is not None and cached[0] is pod and cached[1] is slurm:
        return cached[2]
    state = pod_state(pod, slurm)
    view.memo.pod_states[name] = (pod, slurm, state)
    return state


def _node_facts(
    view: ClusterView, node_name: str, node: Obj
) -> tuple[ipaddress.IPv4Address | None, str | None]:
    """The node's IPv4 InternalIP and claim."""
    if view.memo is None:
        return internal_ipv4(node), claim_of(node)
    cached = view.memo.facts.get(node_name)
    if cached is not None and cached[0] is node:
        return cached[1], cached[2]
    address, claim = internal_ipv4(node), claim_of(node)
    view.memo.facts[node_name] = (node, address, claim)
    return address, claim


def _may_keep(
    view: ClusterView, placement: Obj, node_name: str, node: Obj, spec_key: str, revision: str
) -> feasibility.Verdict:
    if view.memo is None:
        return feasibility.may_keep(placement, node, spec_key)
    basis = f"{spec_key}\x1f{revision}"
    cached = view.memo.keep.get(node_name)
    if cached is not None and cached[0] is node and cached[1] == basis:
        return cached[2]
    verdict = feasibility.may_keep(placement, node, spec_key)
    view.memo.keep[node_name] = (node, basis, verdict)
    return verdict


def _can_place(
    view: ClusterView,
    placement: Obj,
    requests: ResourceList,
    node_name: str,
    node: Obj,
    others: ResourceList,
    spec_key: str,
    revision: str,
) -> feasibility.Verdict:
    if view.memo is None:
        return feasibility.can_place(placement, requests, node, others, spec_key)
    # The placement (and so the requests) is a function of the template: the revision.
    basis = (spec_key, revision, tuple(sorted(others.items())))
    cached = view.memo.place.get(node_name)
    if cached is not None and cached[0] is node and cached[1] == basis:
        return cached[2]
    verdict = feasibility.can_place(placement, requests, node, others, spec_key)
    view.memo.place[node_name] = (node, basis, verdict)
    return verdict


# --- the plan ------------------------------------------------------------------------------


def plan(view: ClusterView) -> Plan:
    problems = validate(view.nodeset)
    existing_status = mapping(view.nodeset.get("status"))
    if problems:
        result = Plan(nodeset=None, revision="", problems=problems)
        spec_condition = _spec_conditions(problems)
        if _condition_message(existing_status, INVALID_SPEC) != spec_condition.message:
            result.actions.append(
                Notice("invalid-spec", problems[0].reason, spec_condition.message)
            )
        kept_collision = WantedCondition(
            NAME_COLLISION, "False", "NoCollision", "every pod name is unique"
        )
        for entry in sequence(existing_status.get("conditions")):
            if mapping(entry).get("type") == NAME_COLLISION:
                kept_collision = WantedCondition(
                    NAME_COLLISION,
                    str(mapping(entry).get("status") or "False"),
                    str(mapping(entry).get("reason") or "NoCollision"),
                    str(mapping(entry).get("message") or ""),
                )
        name = name_of(view.nodeset)
        _finish_status(
            result, view, None, [spec_condition, kept_collision], f"nodeflow.dev/nodeset={name}"
        )
        return result

    spec = parse(view.nodeset, view.defaults)
    revision = revision_hash(spec.template_spec)
    result = Plan(nodeset=spec, revision=revision)
    placement = placement_spec(spec)
    requests = pod_requests(placement)

    # Our pods, by what is to become of them.
    states = [_pod_state(view, p) for p in view.pods]
    raw_by_name = {name_of(p): p for p in view.pods}
    occupied: dict[str, list[PodState]] = {}  # node -> our pods there (terminating included)
    for pod in states:
        if pod.node is not None:
            occupied.setdefault(pod.node, []).append(pod)

    kept: list[PodState] = []
    misscheduled: list[tuple[PodState, str]] = []
    terminating_in_place: list[PodState] = []
    for pod in sorted(states, key=lambda p: p.name):
        node = view.nodes.get(pod.node) if pod.node else None
        if pod.terminating:
            if (
                node is not None
                and pod.node is not None
                and _may_keep(view, placement, pod.node, node, spec.key, revision).feasible
            ):
                terminating_in_place.append(pod)
            continue
        if pod_is_terminal(raw_by_name[pod.name]):
            result.actions.append(
                DeletePod(pod, False, "PodFinished", f"pod {pod.phase}: replaced by a new pod")
            )
            continue
        if node is None:
            result.actions.append(
                DeletePod(pod, False, "NodeGone", f"node {pod.node or '?'} no longer exists")
            )
            continue
        assert pod.node is not None  # a node was found by this name
        verdict = _may_keep(view, placement, pod.node, node, spec.key, revision)
        if verdict.feasible:
            kept.append(pod)
        else:
            misscheduled.append((pod, verdict.reason))

    # Names: a node keeps the name of the pod already on it; others compete by node name.
    addresses: dict[str, ipaddress.IPv4Address] = {}
    claims: dict[str, str | None] = {}
    for node_name, node in view.nodes.items():
        address, claims[node_name] = _node_facts(view, node_name, node)
        if address is not None:
            addresses[node_name] = address
    existing_names = {
        pod.node: pod.name for pod in states if pod.node is not None and pod.node in view.nodes
    }
    naming = assign_names(spec.pod_name_prefix, addresses, existing_names)
    collisions = list(naming.collisions)

    # Feasible nodes: those keeping a pod of ours, and those a new pod may go to.
    kept_nodes = {pod.node for pod in kept if pod.node}
    placeable: list[str] = []
    for node_name in sorted(view.nodes):
        if node_name in kept_nodes:
            continue
        node = view.nodes[node_name]
        ours_there = occupied.get(node_name)
        requested_there = view.requested.get(node_name)
        if ours_there:
            others = _minus(
                dict(requested_there or {}),
                _sum_requests(raw_by_name[p.name] for p in ours_there if p.name in raw_by_name),
            )
        else:
            others = dict(requested_there) if requested_there else {}
        verdict = _can_place(view, placement, requests, node_name, node, others, spec.key, revision)
        if not verdict.feasible:
            continue
        new_name = naming.names.get(node_name)
        if new_name is None:
            continue  # a name collision, reported below
        if new_name in view.foreign_pod_names:
            collisions.append(Collision(node_name, new_name, "a pod of another owner"))
            continue
        placeable.append(node_name)
    number_feasible = len(kept_nodes) + len(placeable)
    desired = spec.replicas if spec.replicas is not None else number_feasible

    # Scale down: the lowest-ranked pods beyond `desired` get SlurmDelete; others lose it.
    excess = len(kept) - desired
    removing: list[PodState] = []
    if excess > 0:
        order = ranking.scale_down_order(kept, priority_ordering=spec.scale_down_priority_ordering)
        removing = order[:excess]
    removing_names = {pod.name for pod in removing}
    for pod in removing:
        if pod.delete_reason is None:
            result.actions.append(
                ScheduleDelete(
                    pod,
                    SCALING_DELETE,
                    "delete-scheduled",
                    f"scale down to {desired}: "
                    + ranking.scale_down_reason(
                        pod, priority_ordering=spec.scale_down_priority_ordering
                    ),
                )
            )
    staying = [pod for pod in kept if pod.name not in removing_names]
    for pod in staying:
        if pod.delete_reason == SCALING_DELETE:
            result.actions.append(
                CancelDelete(pod, f"scaled back up to {desired}: deletion cancelled, pod kept")
            )
        elif pod.delete_reason == ROLLING_DELETE and pod.revision == revision:
            result.actions.append(
                CancelDelete(pod, "the pod matches the template again: replacement cancelled")
            )
    for pod, why in misscheduled:
        if pod.delete_reason is None:
            result.actions.append(
                ScheduleDelete(pod, SCALING_DELETE, "delete-scheduled", f"misscheduled: {why}")
            )

    # Rolling update of the pods that stay.
    if spec.update_strategy == "RollingUpdate":
        target = min(desired, number_feasible)
        # Pods that should exist but are not live (terminating, or gone and not yet
        # recreated) are unavailable too: the budget counts nodes, not pod objects.
        missing = target - len(staying)
        budget = resolve_max_unavailable(spec.max_unavailable, desired)
        choice = ranking.choose_rolling_replacements(staying, revision, budget, missing)
        for pod in choice.replace:
            tier = ranking.ROLLING_TEXT[ranking.rolling_tier(pod)]
            result.actions.append(
                ScheduleDelete(
                    pod,
                    ROLLING_DELETE,
                    "rolling-replace",
                    f"{tier} (revision {pod.revision or '?'} -> {revision}); "
                    f"unavailable {choice.unavailable} of at most {choice.budget}",
                )
            )

    # Deletion of pods whose SlurmDelete is set and still wanted.
    cancelled = {a.pod.name for a in result.actions if isinstance(a, CancelDelete)}
    doomed = (
        [p for p in removing if p.delete_reason]
        + [p for p in staying if p.delete_reason and p.name not in cancelled]
        + [p for p, _ in misscheduled if p.delete_reason]
    )
    for pod in doomed:
        decision = deletion.decide_deletion(
            pod, view.now, spec.force_delete_known_timeout, spec.force_delete_unknown_timeout
        )
        if decision.verdict == "wait":
            deadline = deletion.forced_deadline(
                pod, spec.force_delete_known_timeout, spec.force_delete_unknown_timeout
            )
            if deadline is not None:
                result.wake_at = (
                    deadline if result.wake_at is None else min(result.wake_at, deadline)
                )
            continue
        result.actions.append(
            DeletePod(pod, decision.verdict == "forced-delete", decision.reason, decision.message)
        )

    # Scale up: claimed-by-us nodes first (a replaced pod comes back on its node), then by name.
    need = desired - len(kept) - len(terminating_in_place)
    chosen: list[str] = []
    if need > 0:
        ordered = sorted(placeable, key=lambda n: (claims[n] != spec.key, n))
        chosen = ordered[:need]
    for node_name in chosen:
        node = view.nodes[node_name]
        if claims[node_name] == spec.key:
            name = naming.names[node_name]
            result.actions.append(
                CreatePod(
                    node=node_name,
                    node_uid=uid_of(node),
                    node_rv=resource_version_of(node),
                    name=name,
                    revision=revision,
                    nodeset=spec,
                    why=f"node {node_name} is feasible and claimed; "
                    f"{len(kept) + len(terminating_in_place)} of {desired} pods exist",
                )
            )
        else:
            result.actions.append(
                Claim(node_name, uid_of(node), resource_version_of(node), "scale up")
            )
    chosen_set = set(chosen)
    for node_name, node in sorted(view.nodes.items()):
        if claims[node_name] != spec.key:
            # A pod of ours on a node nobody claimed (a release raced a create): claim it.
            if claims[node_name] is None and node_name in kept_nodes:
                result.actions.append(
                    Claim(
                        node_name,
                        uid_of(node),
                        resource_version_of(node),
                        "repair: pod without claim",
                    )
                )
            continue
        if node_name in chosen_set or occupied.get(node_name):
            continue
        result.actions.append(
            Release(
                node_name,
                uid_of(node),
                resource_version_of(node),
                naming.names.get(node_name, ""),
                "no pod of this NodeSet on the node any more",
            )
        )

    # NodeSlices list the nodes that have one of our pods.
    members = {pod.node for pod in states if pod.node and pod.node in view.nodes}
    current_slices = {
        name: [str(n) for n in sequence(mapping(obj.get("spec")).get("nodes"))]
        for name, obj in view.slices.items()
    }
    for change in plan_slices(spec.name, current_slices, members):
        existing = view.slices.get(change.name)
        result.actions.append(
            WriteSlice(
                change,
                resource_version_of(existing) if existing is not None else None,
                uid_of(existing) if existing is not None else None,
            )
        )

    # Name collisions are reported once (when the condition changes), with a decision.
    collision_condition = _collision_condition(collisions)
    if (
        collisions
        and _condition_message(existing_status, NAME_COLLISION) != collision_condition.message
    ):
        for collision in collisions:
            result.actions.append(
                Notice(
                    "name-collision",
                    "PodNameCollision",
                    collision.describe(),
                    node=collision.node,
                    pod=collision.name,
                )
            )

    counted = kept
    counts = Counts(
        current_number_scheduled=len(counted),
        number_misscheduled=len(misscheduled),
        desired_number_scheduled=desired,
        updated_number_scheduled=sum(1 for p in counted if p.revision == revision),
        number_feasible=number_feasible,
        number_ready=sum(1 for p in counted if p.ready),
        number_unavailable=sum(1 for p in counted if not p.ready),
        number_running=sum(
            1 for p in counted if p.slurm_known and p.slurm is not None and p.slurm.busy
        ),
        number_drain=sum(1 for p in counted if p.drain),
    )
    _finish_status(
        result,
        view,
        counts,
        [_spec_conditions([]), collision_condition],
        selector(spec),
    )
    return result


def _sum_requests(pods: Any) -> ResourceList:
    total: ResourceList = {}
    for pod in pods:
        if pod_is_terminal(pod):
            continue
        for name, amount in pod_requests(mapping(pod.get("spec"))).items():
            total[name] = total.get(name, Fraction(0)) + amount
    return total

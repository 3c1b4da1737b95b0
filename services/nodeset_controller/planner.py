"""The whole NodeSet reconciliation as one pure function: cluster state in, actions out.

`plan(view)` reads a NodeSet, the nodes, the NodeSet's pods, their Slurm states (with the
freshness of their cluster's view), its NodeSlices and the pod changes already sent but not
yet visible, and returns what should change. It never remembers anything between calls:
every decision is re-derived from the objects, whose durable state (node claims, SlurmDelete
conditions and their timestamps, revision labels, the syncer's NodeNotRegistered condition)
lives in Kubernetes. That is what makes a restart safe: the next plan after a restart is the
plan the killed process would have made.

`plan` reads as its table of contents: one phase per rule, each a function below it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from nodeflow_contracts.nodeset import RESERVATIONS_UNSUPPORTED
from nodeflow_contracts.pod_protocol import (
    MISSCHEDULED_DELETE,
    REVISION_LABEL,
    ROLLING_DELETE,
    SCALING_DELETE,
    DeleteReason,
)
from nodeflow_contracts.slurm import STALE_AFTER_POLLS, SlurmClusterStatus, SlurmNodeState
from nodeflow_contracts.slurm_api import API_VERSIONS, RESERVATIONS_SINCE
from nodeflow_kube.fields import (
    labels_of,
    mapping,
    name_of,
    resource_version_of,
    rfc3339,
    sequence,
    uid_of,
)
from nodeflow_kube.quantity import ResourceList
from nodeset_controller import deletion, feasibility, protection, ranking
from nodeset_controller.history import CreateRevision, DeleteRevision, plan_history
from nodeset_controller.naming import Collision, assign_names
from nodeset_controller.objects import (
    claim_of,
    internal_ipv4,
    pod_is_terminal,
    pod_requests,
)
from nodeset_controller.podspec import build_pod, placement_spec, revision_hash, selector
from nodeset_controller.podstate import (
    PodState,
    available_at,
    pod_state,
    scale_down_message,
    with_availability,
)
from nodeset_controller.protection import (
    CreateDisruptionBudget,
    DeleteDisruptionBudget,
    ProtectPod,
)
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
    DISRUPTION_BUDGET_CONFLICT,
    INVALID_SPEC,
    NAME_COLLISION,
    ROLLOUT_WAITING,
    SCALE_DOWN_WAITING,
    SCHEDULED_UPDATE,
    SLURM_STATE_UNKNOWN,
    Counts,
    PodWait,
    WantedCondition,
    build_status,
    last_known_slurm_counts,
    most_blocking,
    pod_wait_condition,
    status_differs,
    waiting_condition,
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
    """Set SlurmDelete=True with `reason` (or change the reason of a set one). `wait`: the
    pod's wait condition once marked, written in the same patch (`plan_pod_waits`)."""

    pod: PodState
    reason: DeleteReason
    decision: Literal["delete-scheduled", "rolling-replace"]
    why: str
    wait: WantedCondition | None = None


@dataclass(frozen=True)
class CancelDelete:
    """Clear SlurmDelete. `wait`: the pod's wait condition once unmarked (None: it waits for
    nothing, and a written one is removed), in the same patch (`plan_pod_waits`)."""

    pod: PodState
    why: str
    wait: WantedCondition | None = None


@dataclass(frozen=True)
class SetPodWait:
    """Write the pod's wait condition (`wait`), or remove it (None): its cause changed."""

    pod: PodState
    wait: WantedCondition | None


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

    decision: Literal["name-collision", "invalid-spec", "protection-disabled"]
    reason: str
    why: str
    node: str = ""
    pod: str = ""


Action = (
    Claim
    | Release
    | CreatePod
    | ScheduleDelete
    | CancelDelete
    | DeletePod
    | SetPodWait
    | WriteSlice
    | Notice
    | ProtectPod
    | CreateDisruptionBudget
    | DeleteDisruptionBudget
    | CreateRevision
    | DeleteRevision
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
    # A pod waits for a Slurm poll after this time (its SlurmDelete's): the plan differs once
    # the cluster's last successful poll is a second past it (`PodState.read_since_delete`).
    awaits_slurm_read_after: float | None = None
    problems: list[SpecProblem] = field(default_factory=list)
    # An invalid spec's lenient parse, for its protection actions alone (rule 4a: the labels
    # keep following Slurm while the spec is fixed); None otherwise.
    protection_spec: NodeSetSpec | None = None
    # The pods the scale-down and the rollout want gone and cannot remove yet, and why
    # (ScaleDownWaiting and RolloutWaiting are made from them); `rollout_budget` the
    # rollout's maxUnavailable figures while pods wait for it ("" otherwise).
    scale_down_waits: list[PodWait] = field(default_factory=list)
    rollout_waits: list[PodWait] = field(default_factory=list)
    rollout_budget: str = ""
    # Pods marked for another reason (misscheduled, on a lost node) that wait: named on the
    # pods alone (`plan_pod_waits`).
    other_waits: list[PodWait] = field(default_factory=list)


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
class PodChangeSent:
    """A change of a pod sent and not yet visible in the view: the plan counts it as done
    (a SlurmDelete being set is a pod pending deletion; a delete makes it terminating), so
    no budget is spent twice on changes still in flight."""

    kind: Literal["schedule-delete", "delete"]
    sent_at: float
    reason: DeleteReason | None = None


@dataclass(frozen=True)
class SlurmTrust:
    """How far the plan may believe the NodeSet's Slurm cluster at `now`."""

    # The cluster's node states are current (its status exists and is fresh).
    fresh: bool
    # ... and its last poll succeeded: a node absent from it is not registered.
    reachable: bool
    # When the states go stale without a new poll (None: stale already).
    stale_at: float | None
    absence_grace: float
    # When the states were last confirmed (the last successful poll); None: stale already, or
    # the view of the node states may not hold that poll's yet (no evidence of when read).
    read_at: float | None = None
    # Until when a node missing from the view counts as missing from Slurm's listing (not
    # registered): the view holds every node state of a successful poll (the last, or an
    # earlier one while the last one's states are still arriving), or that poll listed no
    # node at all, and that poll is fresh. None: no such poll, or the last poll failed.
    absence_read_until: float | None = None


def slurm_trust(
    status: SlurmClusterStatus | None,
    now: float,
    max_age: float,
    absence_grace: float,
    nodes_revision: int = 0,
    held_poll_at: float | None = None,
) -> SlurmTrust:
    """A cluster whose status is missing or not fresh is unknown: none of its states count.
    `nodes_revision`: the `slurm_nodes` stream sequence the reader's view has applied; the
    status's poll time counts as when the states were read only once the view holds that
    poll's states (`SlurmClusterStatus.nodes_read_at`): the two buckets arrive on separate
    consumers, and a poll's status may come before its node states. `held_poll_at`: when the
    newest poll whose states the view was seen to hold whole was read (an earlier status's
    `nodes_read_at`), for the absence evidence while the last poll's states arrive."""
    if status is None or not status.fresh(now, max_age):
        return SlurmTrust(False, False, None, absence_grace)
    # The limit SlurmClusterStatus.fresh applies: past it, the states go stale.
    limit = max_age if max_age > 0 else STALE_AFTER_POLLS * status.poll_interval_seconds
    read_at = status.nodes_read_at(nodes_revision)
    absence_read_at = status.absence_read_at(nodes_revision)
    held = absence_read_at if absence_read_at is not None else held_poll_at
    absence_read_until = (
        held + limit if status.reachable and held is not None and now - held <= limit else None
    )
    return SlurmTrust(
        True,
        status.reachable,
        status.last_success_at + limit,
        absence_grace,
        read_at=read_at,
        absence_read_until=absence_read_until,
    )


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
    # slurm-syncer's status of that cluster (KV slurm_clusters); None: unknown.
    slurm_cluster: SlurmClusterStatus | None
    # The NodeSet's NodeSlices by name.
    slices: Mapping[str, Obj]
    defaults: Defaults
    now: float
    # Pod changes sent and not yet visible, by pod name.
    in_flight: Mapping[str, PodChangeSent] = field(default_factory=dict)
    # Slurm states older than this are unknown (0: the cluster status's default age).
    slurm_max_age: float = 0.0
    # A node absent from the successful polls for this long runs no job.
    absence_grace: float = 300.0
    # An unbound pod Pending this long on a node it no longer fits is replaced on a free node.
    pending_replace_after: float = 120.0
    # Reuse of per-object checks across plans (never changes the plan, only its cost).
    memo: PlanMemo | None = None
    # The `slurm_nodes` stream sequence the view of `slurm` has applied (0: unknown): the
    # cluster status's poll time is evidence of when `slurm` was read only from there on.
    slurm_nodes_revision: int = 0
    # The NodeSet's PodDisruptionBudget (`protection.budget_name`) as k8s-watcher mirrors it;
    # None: there is none.
    disruption_budget: Obj | None = None
    # When the newest poll whose node states the view of `slurm` was seen to hold whole was
    # read (see `slurm_trust`); None: none seen.
    slurm_held_poll_at: float | None = None
    # The ControllerRevisions labelled with the NodeSet in its namespace (`history`).
    revisions: Collection[Obj] = ()


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


def _pod_state(view: ClusterView, trust: SlurmTrust, pod: Obj) -> PodState:
    """The pod as the rules see it: its Slurm state only if its cluster's view is fresh,
    absence past the grace marked, and the changes still in flight applied."""
    name = name_of(pod)
    slurm = view.slurm.get(name) if trust.fresh else None
    state: PodState | None = None
    if view.memo is not None:
        cached = view.memo.pod_states.get(name)
        if cached is not None and cached[0] is pod and cached[1] is slurm:
            state = cached[2]
    if state is None:
        state = pod_state(pod, slurm)
        if view.memo is not None:
            view.memo.pod_states[name] = (pod, slurm, state)
    if (
        state.not_registered_since is not None
        and trust.fresh
        and trust.reachable
        and view.now - state.not_registered_since >= trust.absence_grace
    ):
        state = dataclasses.replace(state, no_job="NodeNotRegistered")
    sent = view.in_flight.get(name)
    if sent is not None and not state.terminating:
        if sent.kind == "delete":
            state = dataclasses.replace(state, terminating=True)
        elif sent.reason is not None and state.delete_reason != sent.reason:
            state = dataclasses.replace(state, delete_reason=sent.reason, delete_since=sent.sent_at)
    if trust.read_at is not None and state.delete_reason is not None:
        # Only a pod on its way out needs to know when Slurm was read (see deletion).
        state = dataclasses.replace(state, slurm_read_at=trust.read_at)
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
    if problems:
        return _invalid_spec_plan(view, problems)
    round_ = _start_round(view)
    pods = classify_pods(round_)
    naming = name_nodes(round_, pods)
    feasible = find_feasible_nodes(round_, pods, naming)
    pods, feasible = move_stuck_pending_pods(round_, pods, feasible)
    # First: a busy pod's protect label is sent before the pod changes of this plan.
    plan_disruption_protection(round_, pods)
    desired = round_.spec.replicas if round_.spec.replicas is not None else feasible.count
    scale_down = plan_scale_down(round_, pods, desired)
    cancelled = plan_leaving(round_, pods, scale_down)
    cancelled |= plan_rolling_update(round_, pods, scale_down, desired, feasible)
    plan_deletions(round_, pods, scale_down, cancelled)
    chosen = plan_scale_up(round_, pods, scale_down, feasible, naming, desired)
    plan_pod_waits(round_, pods)
    plan_claims_and_releases(round_, pods, feasible, naming, chosen)
    plan_nodeslices(round_, pods)
    collision_condition = report_collisions(round_, feasible.collisions)
    plan_status(round_, pods, desired, feasible.count, collision_condition)
    plan_revision_history(round_, pods)
    return round_.result


@dataclass
class _Round:
    """What every phase of one plan shares: the view, the parsed spec and the result."""

    view: ClusterView
    spec: NodeSetSpec
    revision: str
    placement: Obj
    requests: ResourceList
    trust: SlurmTrust
    result: Plan
    # Conditions a phase reports besides those of `plan_status` (present only while true).
    conditions: list[WantedCondition] = field(default_factory=list)
    # ScheduledUpdate, window open: pods whose Slurm node does not read as held by the
    # window's reservation, and why. A rolling mark of one of them is kept (the node may read
    # so again) but the pod is not deleted (`plan_deletions`): the reservation, not the
    # mark, is the evidence that the window holds its node.
    outside_reservation: dict[str, str] = field(default_factory=dict)

    def act(self, action: Action) -> None:
        self.result.actions.append(action)

    def wake(self, at: float) -> None:
        """The plan would differ at `at` without any change in the cluster."""
        if at > self.view.now:
            wake_at = self.result.wake_at
            self.result.wake_at = at if wake_at is None else min(wake_at, at)


def _start_round(view: ClusterView) -> _Round:
    spec = parse(view.nodeset, view.defaults)
    revision = revision_hash(spec.template_spec)
    placement = placement_spec(spec)
    trust = slurm_trust(
        view.slurm_cluster,
        view.now,
        view.slurm_max_age,
        view.absence_grace,
        view.slurm_nodes_revision,
        view.slurm_held_poll_at,
    )
    return _Round(
        view=view,
        spec=spec,
        revision=revision,
        placement=placement,
        requests=pod_requests(placement),
        trust=trust,
        result=Plan(nodeset=spec, revision=revision),
    )


def _invalid_spec_plan(view: ClusterView, problems: list[SpecProblem]) -> Plan:
    """An invalid spec touches no pod: only the InvalidSpec condition and a notice."""
    existing_status = mapping(view.nodeset.get("status"))
    result = Plan(nodeset=None, revision="", problems=problems)
    spec_condition = _spec_conditions(problems)
    if _condition_message(existing_status, INVALID_SPEC) != spec_condition.message:
        result.actions.append(Notice("invalid-spec", problems[0].reason, spec_condition.message))
    # The controller did not look at the pods or Slurm: the other conditions stay as they were.
    kept: dict[str, WantedCondition] = {
        NAME_COLLISION: WantedCondition(
            NAME_COLLISION, "False", "NoCollision", "every pod name is unique"
        )
    }
    for entry in sequence(existing_status.get("conditions")):
        kind = str(mapping(entry).get("type") or "")
        if kind in (
            NAME_COLLISION,
            SLURM_STATE_UNKNOWN,
            DISRUPTION_BUDGET_CONFLICT,
            SCALE_DOWN_WAITING,
            ROLLOUT_WAITING,
        ):
            kept[kind] = WantedCondition(
                kind,
                str(mapping(entry).get("status") or "Unknown"),
                str(mapping(entry).get("reason") or "Unknown"),
                str(mapping(entry).get("message") or ""),
            )
    name = name_of(view.nodeset)
    _finish_status(
        result, view, None, [spec_condition, *kept.values()], f"nodeflow.dev/nodeset={name}"
    )
    _protect_under_invalid_spec(view, result)
    return result


def _protect_under_invalid_spec(view: ClusterView, result: Plan) -> None:
    """Rule 4a goes on while the spec is invalid: frozen labels would leave a pod whose node
    takes a job evictable, and keep an idle pod's drain blocked, until the spec is fixed. The
    protection reads only the NodeSet's name, namespace, uid, generation and
    workloadDisruptionProtection (anything but `false` is on: fail closed), which `parse` takes
    leniently from any spec."""
    spec = parse(view.nodeset, view.defaults)
    trust = slurm_trust(
        view.slurm_cluster,
        view.now,
        view.slurm_max_age,
        view.absence_grace,
        view.slurm_nodes_revision,
        view.slurm_held_poll_at,
    )
    round_ = _Round(view, spec, "", {}, {}, trust, result)
    states = [_pod_state(view, trust, raw) for raw in view.pods]
    raw_by_name = {name_of(raw): raw for raw in view.pods}
    pods = PodClasses(states, raw_by_name, {}, [], [], [], [])
    plan_disruption_protection(round_, pods)
    result.protection_spec = spec


# --- phase: classify pods --------------------------------------------------------------------


@dataclass(frozen=True)
class PodClasses:
    states: list[PodState]
    raw_by_name: dict[str, Obj]
    # Node -> our pods there (terminating included).
    occupied: dict[str, list[PodState]]
    # Live pods on feasible nodes: the NodeSet's running replicas.
    kept: list[PodState]
    # Live pods that must leave without a scale-down: their node no longer fits the template
    # (misscheduled), or it is missing from the view (see `classify_pods`). With the why.
    leaving: list[tuple[PodState, str]]
    # Those of `leaving` on a node of the view (the reference's misscheduled).
    misscheduled: list[PodState]
    # Terminating pods on nodes that remain feasible: replaced there once gone.
    terminating_in_place: list[PodState]


def classify_pods(round_: _Round) -> PodClasses:
    """Sort the NodeSet's pods by what is to become of them.

    A pod whose node is missing from the view is not deleted for that alone: a view misses a
    node that a label selector filters out or that was relabelled, and that node may well be
    running a job. What proves a pod runs no job is Slurm's own word, read fresh: the node is
    drained and idle, DOWN, or absent from every successful poll for the absence grace; or the
    pod's phase says it never started; or the pod is already terminal or terminating. So such
    a pod leaves like a misscheduled one (SlurmDelete with MisscheduledDeleteScheduled, never
    forced) and the deletion rules decide when, on that proof.
    """
    view = round_.view
    states = [_available(round_, _pod_state(view, round_.trust, p)) for p in view.pods]
    raw_by_name = {name_of(p): p for p in view.pods}
    occupied: dict[str, list[PodState]] = {}
    for pod in states:
        if pod.node is not None:
            occupied.setdefault(pod.node, []).append(pod)
    kept: list[PodState] = []
    leaving: list[tuple[PodState, str]] = []
    misscheduled: list[PodState] = []
    terminating_in_place: list[PodState] = []
    for pod in sorted(states, key=lambda p: p.name):
        node = view.nodes.get(pod.node) if pod.node else None
        if pod.not_registered_since is not None and pod.no_job is None:
            # The absence grace runs out without any change in the cluster.
            round_.wake(pod.not_registered_since + round_.trust.absence_grace)
        if pod.terminating:
            if node is not None and pod.node is not None and _keeps(round_, pod.node, node):
                terminating_in_place.append(pod)
            continue
        if pod_is_terminal(raw_by_name[pod.name]):
            round_.act(
                DeletePod(pod, False, "PodFinished", f"pod {pod.phase}: replaced by a new pod")
            )
            continue
        if node is None or pod.node is None:
            leaving.append((pod, f"node {pod.node or '?'} is missing from the view"))
            continue
        verdict = _may_keep(
            view, round_.placement, pod.node, node, round_.spec.key, round_.revision
        )
        if verdict.feasible:
            kept.append(pod)
        else:
            leaving.append((pod, verdict.reason))
            misscheduled.append(pod)
    return PodClasses(
        states, raw_by_name, occupied, kept, leaving, misscheduled, terminating_in_place
    )


def _available(round_: _Round, pod: PodState) -> PodState:
    """minReadySeconds: a pod Ready for less than that is not yet available; the plan wakes
    when it becomes so (the rollout goes on without any change in the cluster)."""
    min_ready = round_.spec.min_ready_seconds
    pod = with_availability(pod, min_ready, round_.view.now)
    if pod.not_yet_available:
        at = available_at(pod, min_ready)
        if at is not None:
            round_.wake(at)
    return pod


def _keeps(round_: _Round, node_name: str, node: Obj) -> bool:
    view = round_.view
    return _may_keep(
        view, round_.placement, node_name, node, round_.spec.key, round_.revision
    ).feasible


# --- phase: name nodes -----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeNames:
    names: Mapping[str, str]  # node -> pod name
    collisions: list[Collision]
    claims: dict[str, str | None]  # node -> the NodeSet claiming it


def name_nodes(round_: _Round, pods: PodClasses) -> NodeNames:
    """A node keeps the name of the pod already on it; others compete by node name."""
    view = round_.view
    addresses: dict[str, ipaddress.IPv4Address] = {}
    claims: dict[str, str | None] = {}
    for node_name, node in view.nodes.items():
        address, claims[node_name] = _node_facts(view, node_name, node)
        if address is not None:
            addresses[node_name] = address
    existing_names = {
        pod.node: pod.name for pod in pods.states if pod.node is not None and pod.node in view.nodes
    }
    naming = assign_names(round_.spec.pod_name_prefix, addresses, existing_names)
    return NodeNames(naming.names, list(naming.collisions), claims)


# --- phase: feasibility ----------------------------------------------------------------------


@dataclass(frozen=True)
class FeasibleNodes:
    kept_nodes: set[str]
    # Feasible nodes without a live pod of ours, by name.
    placeable: list[str]
    collisions: list[Collision]

    @property
    def count(self) -> int:
        return len(self.kept_nodes) + len(self.placeable)


def _new_pod_fits(round_: _Round, pods: PodClasses, node_name: str) -> feasibility.Verdict:
    """Whether a pod of the current revision may go to the node, with what our own pods there
    request given back (they are gone, going, or the pod it would replace)."""
    view = round_.view
    ours_there = pods.occupied.get(node_name)
    requested_there = view.requested.get(node_name)
    if ours_there:
        others = _minus(
            dict(requested_there or {}),
            _sum_requests(
                pods.raw_by_name[p.name] for p in ours_there if p.name in pods.raw_by_name
            ),
        )
    else:
        others = dict(requested_there) if requested_there else {}
    return _can_place(
        view,
        round_.placement,
        round_.requests,
        node_name,
        view.nodes[node_name],
        others,
        round_.spec.key,
        round_.revision,
    )


def find_feasible_nodes(round_: _Round, pods: PodClasses, naming: NodeNames) -> FeasibleNodes:
    """Nodes keeping a pod of ours, and those a new pod may go to (numberFeasible)."""
    view = round_.view
    kept_nodes = {pod.node for pod in pods.kept if pod.node}
    collisions = list(naming.collisions)
    placeable: list[str] = []
    for node_name in sorted(view.nodes):
        if node_name in kept_nodes:
            continue
        if not _new_pod_fits(round_, pods, node_name).feasible:
            continue
        new_name = naming.names.get(node_name)
        if new_name is None:
            continue  # a name collision, reported below
        if new_name in view.foreign_pod_names:
            collisions.append(Collision(node_name, new_name, "a pod of another owner"))
            continue
        placeable.append(node_name)
    return FeasibleNodes(kept_nodes, placeable, collisions)


# --- phase: pods stuck Pending on a full node --------------------------------------------------


def move_stuck_pending_pods(
    round_: _Round, pods: PodClasses, feasible: FeasibleNodes
) -> tuple[PodClasses, FeasibleNodes]:
    """A pod no kubelet has (unbound, Pending) on a node that can no longer take it (other
    pods took its room after it was created), for `pending_replace_after` seconds, while a
    feasible node is free beyond those the scale-up needs, leaves like a misscheduled pod
    (MisscheduledDeleteScheduled; never bound, it goes at once, see `PodState.never_started`)
    and the scale-up puts its replacement on the free node. A pod already marked so stays
    leaving while it is still stuck, so a free node taken meanwhile does not make the
    decision flap; once bound it is kept (its mark cancelled). Oldest first."""
    view = round_.view
    wait = view.pending_replace_after
    candidates: list[tuple[PodState, str]] = []
    for pod in pods.kept:
        if pod.bound or pod.phase != "Pending" or pod.ready or pod.node is None:
            continue
        if pod.delete_reason not in (None, MISSCHEDULED_DELETE):
            continue
        verdict = _new_pod_fits(round_, pods, pod.node)
        if verdict.feasible:
            continue
        if view.now - pod.created_at < wait:
            round_.wake(pod.created_at + wait)
            continue
        candidates.append((pod, verdict.reason))
    if not candidates:
        return pods, feasible
    existing = len(pods.kept) + len(pods.terminating_in_place)
    desired = round_.spec.replicas if round_.spec.replicas is not None else feasible.count
    spare = len(feasible.placeable) - max(0, desired - existing)
    stuck: list[tuple[PodState, str]] = []
    for pod, reason in sorted(candidates, key=lambda c: (c[0].created_at, c[0].name)):
        if pod.delete_reason == MISSCHEDULED_DELETE:
            stuck.append((pod, reason))
        elif spare > 0:
            spare -= 1
            stuck.append((pod, reason))
    if not stuck:
        return pods, feasible
    names = {pod.name for pod, _ in stuck}
    moved = [
        (
            pod,
            f"pending unbound on {pod.node} for {view.now - pod.created_at:.0f}s ({reason}) "
            "while another feasible node is free: replaced there",
        )
        for pod, reason in stuck
    ]
    pods = dataclasses.replace(
        pods,
        kept=[pod for pod in pods.kept if pod.name not in names],
        leaving=[*pods.leaving, *moved],
        misscheduled=[*pods.misscheduled, *(pod for pod, _ in stuck)],
    )
    stuck_nodes = {pod.node for pod, _ in stuck}
    feasible = dataclasses.replace(feasible, kept_nodes=feasible.kept_nodes - stuck_nodes)
    return pods, feasible


# --- phase: scale-down -----------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleDown:
    # Pods beyond `desired`, to delete (marked already or marked by this plan).
    removing: list[PodState]
    # Pods that stay: the rolling update works on these.
    staying: list[PodState]
    # Pods whose scale-down mark this plan cancels.
    cancelled: set[str]


def plan_scale_down(round_: _Round, pods: PodClasses, desired: int) -> ScaleDown:
    """The pods beyond `desired` get SlurmDelete (ScalingDeleteScheduled), lowest rank first.

    Once chosen, a pod stays chosen until it is deleted or the desired count really rises:
    pods marked for scale-down stay marked and only the rest is ranked, so another pod
    turning into a better pick cancels nothing and restarts no forced-deletion timer, and a
    pod lost meanwhile is replaced rather than a marked one kept. The desired count rose by
    what `desired` exceeds the NodeSet's last written desiredNumberScheduled, or by the
    number of marks made for a count below `desired` (each mark's message names its count:
    durable on the pod, in the same write); that many marks, the best pods to keep, are
    cancelled. (So a mark left from a scale-down the desired count has since outgrown is
    cancelled, its pod kept, when another pod is lost meanwhile: the lost one is not
    replaced while a running pod can be kept instead.) A pod marked
    for a rolling update and picked here becomes a scale-down: its reason changes and the
    forced timer applies.
    """
    spec = round_.spec
    excess = max(0, len(pods.kept) - desired)
    order = ranking.scale_down_order(pods.kept, priority_ordering=spec.scale_down_priority_ordering)
    marked = [p for p in order if p.delete_reason == SCALING_DELETE]
    surplus = max(0, len(marked) - excess)
    reported = mapping(round_.view.nodeset.get("status")).get("desiredNumberScheduled")
    if surplus and isinstance(reported, int) and not isinstance(reported, bool):
        # Marks made for a count below today's were outgrown, whatever the status says: the
        # status write that would have recorded the lower count may have been refused (the
        # scale back up changed the NodeSet under it), or the cancel lost after it landed.
        outgrown = sum(
            1 for pod in marked if pod.delete_target is not None and pod.delete_target < desired
        )
        surplus = min(surplus, max(desired - reported, outgrown, 0))
    cancelling = marked[len(marked) - surplus :] if surplus else []
    removing = marked[: len(marked) - surplus]
    removing += [p for p in order if p.delete_reason != SCALING_DELETE][
        : max(0, excess - len(removing))
    ]
    removing_names = {pod.name for pod in removing}
    for pod in removing:
        if pod.delete_reason == SCALING_DELETE:
            continue
        why = scale_down_message(
            desired,
            ranking.scale_down_reason(pod, priority_ordering=spec.scale_down_priority_ordering),
        )
        if pod.delete_reason is not None:
            why += f" (was {pod.delete_reason}: now a scale-down)"
        round_.act(ScheduleDelete(pod, SCALING_DELETE, "delete-scheduled", why))
    for pod in cancelling:
        round_.act(CancelDelete(pod, f"scaled back up to {desired}: deletion cancelled, pod kept"))
    staying = [pod for pod in pods.kept if pod.name not in removing_names]
    return ScaleDown(removing, staying, {pod.name for pod in cancelling})


# --- phase: pods that leave without a scale-down ---------------------------------------------


def plan_leaving(round_: _Round, pods: PodClasses, scale_down: ScaleDown) -> set[str]:
    """A misscheduled pod (or one whose node is missing) is drained and deleted once it runs
    no job: its own reason, never forced. A pod already marked keeps its mark; a pod marked
    misscheduled that fits its node again loses it. Returns the names whose mark this plan
    cancels."""
    for pod, why in pods.leaving:
        if pod.delete_reason is None:
            round_.act(
                ScheduleDelete(pod, MISSCHEDULED_DELETE, "delete-scheduled", f"misscheduled: {why}")
            )
    cancelled: set[str] = set()
    for pod in scale_down.staying:
        if pod.delete_reason == MISSCHEDULED_DELETE:
            round_.act(CancelDelete(pod, "the pod fits its node again: deletion cancelled"))
            cancelled.add(pod.name)
    return cancelled


# --- phase: rolling update -------------------------------------------------------------------


def plan_rolling_update(
    round_: _Round, pods: PodClasses, scale_down: ScaleDown, desired: int, feasible: FeasibleNodes
) -> set[str]:
    """Outdated pods that stay get RollingDeleteScheduled within maxUnavailable; a pod that
    matches the template again, or any under OnDelete, loses its mark. Returns the names
    whose mark this plan cancels (scale-down's included).

    The budget is a share of the pods the NodeSet can really run, min(desiredNumberScheduled,
    numberFeasible), rounded up; unavailable counts each of those that is not Ready or is
    pending deletion (for scaling or rolling, visible or still in flight), each that should
    exist but does not, and each still terminating on a node its replacement cannot go to yet
    (a cordon, a taint: once gone it would leave numberFeasible and free its share of the
    budget for another pod). A Ready pod is replaced only where its replacement can run: one
    on a node the new template does not fit (more than the node has, a taint it does not
    tolerate, a cordon) keeps its revision until it does (its rolling mark, if any, is
    cancelled), so a template no node can take stops the rollout instead of deleting the
    NodeSet pod by pod.
    """
    cancelled = set(scale_down.cancelled)
    # Ready pods whose node cannot take their replacement. (One not Ready costs the budget
    # nothing to replace and is replaced as before: on a dead node it is gone anyway.)
    unfit: dict[str, str] = {}
    for pod in scale_down.staying:
        if pod.revision == round_.revision or pod.delete_reason not in (None, ROLLING_DELETE):
            continue
        if not pod.ready or pod.terminating:
            continue
        if pod.node is not None and pod.node in round_.view.nodes:
            verdict = _new_pod_fits(round_, pods, pod.node)
            if not verdict.feasible:
                unfit[pod.name] = verdict.reason
    spec = round_.spec
    # ScheduledUpdate: why no pod is replaced now (None: the window is open), and the pods
    # whose Slurm node does not read as held by the window's reservation.
    closed, not_reserved = scheduled_update_holds(round_, scale_down.staying)
    round_.outside_reservation = not_reserved
    for pod in scale_down.staying:
        if pod.delete_reason != ROLLING_DELETE:
            continue
        if pod.revision == round_.revision:
            why = "the pod matches the template again: replacement cancelled"
        elif closed is not None:
            why = f"scheduled update: {closed}: replacement cancelled"
        elif spec.update_strategy == "OnDelete":
            # A mark left from a RollingUpdate: under OnDelete only a deletion by someone
            # else replaces a pod, so its drain is undone rather than finished.
            why = "updateStrategy is OnDelete: replacement cancelled"
        elif pod.name in unfit:
            why = f"its node cannot take the replacement ({unfit[pod.name]}): replacement cancelled"
        else:
            continue
        round_.act(CancelDelete(pod, why))
        cancelled.add(pod.name)
    outdated = [p for p in scale_down.staying if p.revision != round_.revision]
    if closed is not None:
        round_.result.rollout_waits.extend(
            PodWait(pod.name, "WindowClosed", "update window closed") for pod in outdated
        )
    if spec.update_strategy == "OnDelete" or closed is not None:
        return cancelled
    placeable = set(feasible.placeable)
    leaving_unplaceable = sum(
        1 for pod in pods.terminating_in_place if pod.node is not None and pod.node not in placeable
    )
    can_run = feasible.count + leaving_unplaceable
    # Without replicas the NodeSet wants a pod on every feasible node: `desired` is
    # feasible.count, which the pods still leaving must not shrink either.
    target = can_run if spec.replicas is None else min(desired, can_run)
    missing = target - len(scale_down.staying)
    budget = resolve_max_unavailable(spec.max_unavailable, target)
    # A pod whose mark this plan cancels still counts as pending deletion until it lands.
    choice = ranking.choose_rolling_replacements(
        scale_down.staying, round_.revision, budget, missing, {*unfit, *not_reserved}
    )
    _note_rollout_holds(round_, outdated, choice, unfit, not_reserved, cancelled)
    for pod in choice.replace:
        tier = ranking.ROLLING_TEXT[ranking.rolling_tier(pod)]
        round_.act(
            ScheduleDelete(
                pod,
                ROLLING_DELETE,
                "rolling-replace",
                f"{tier} (revision {pod.revision or '?'} -> {round_.revision}); "
                f"unavailable {choice.unavailable} of at most {choice.budget}",
            )
        )
    return cancelled


def _note_rollout_holds(
    round_: _Round,
    outdated: list[PodState],
    choice: ranking.RollingChoice,
    unfit: Mapping[str, str],
    not_reserved: Mapping[str, str],
    cancelled: Collection[str],
) -> None:
    """Record why each outdated pod that is not marked for replacement (nor marked by this
    plan) waits: its node cannot take the replacement, its Slurm node is not in the window's
    reservation, or maxUnavailable is spent. Marked pods wait for their deletion
    (`plan_deletions`), unless this plan cancels their mark; a pod chosen now waits as it
    will once marked."""
    chosen = {pod.name for pod in choice.replace}
    held_by_budget = False
    for pod in outdated:
        if pod.pending_deletion and pod.name not in cancelled:
            continue
        if pod.name in chosen:
            marked = dataclasses.replace(
                pod, delete_reason=ROLLING_DELETE, delete_since=round_.view.now
            )
            _note_wait(round_.result.rollout_waits, marked, _decide(round_, marked))
        elif pod.name in unfit:
            round_.result.rollout_waits.append(
                PodWait(
                    pod.name,
                    "ReplacementUnplaceable",
                    f"node cannot take the replacement: {unfit[pod.name]}",
                )
            )
        elif pod.name in not_reserved:
            round_.result.rollout_waits.append(
                PodWait(pod.name, "ReservationPending", "Slurm node not held by the reservation")
            )
        else:
            held_by_budget = True
            round_.result.rollout_waits.append(
                PodWait(pod.name, "BudgetExhausted", "held by maxUnavailable")
            )
    if held_by_budget:
        round_.result.rollout_budget = (
            f"unavailable {choice.unavailable} of at most {choice.budget} (maxUnavailable)"
        )


def scheduled_update_holds(
    round_: _Round, pods: list[PodState]
) -> tuple[str | None, dict[str, str]]:
    """Under ScheduledUpdate (nodeflow_contracts.nodeset states the contract): why no pod is
    replaced now, or None inside the window on a slurmrestd that holds it with a reservation;
    and, of `pods`, those whose Slurm node does not read as held by that reservation (known,
    MAINTENANCE, in it), which are not replaced (fail closed: an unknown state is not
    evidence). Reports the ScheduledUpdate condition, and wakes at the window's edges. Other
    strategies: (None, {})."""
    spec, view = round_.spec, round_.view
    if spec.update_strategy != "ScheduledUpdate":
        return None, {}
    window = spec.update_window
    if window is None:  # validate() refuses such a spec; never replace on a guess
        return "no window", {}
    status = view.slurm_cluster
    spoken = status.api_version if status is not None else ""
    version = API_VERSIONS.get(spoken)
    reservation = window.reservation
    if version is None:
        closed = (
            (
                f"slurm-syncer reports slurmrestd {spoken} for Slurm cluster "
                f"{spec.slurm_cluster}, a version this controller does not know"
            )
            if spoken
            else (
                "slurm-syncer has not said which slurmrestd version Slurm cluster "
                f"{spec.slurm_cluster} speaks"
            )
        )
        condition = WantedCondition(SCHEDULED_UPDATE, "False", "SlurmApiVersionUnknown", closed)
    elif not version.writes_reservations:
        closed = (
            f"slurmrestd of Slurm cluster {spec.slurm_cluster} speaks {version.name}, which cannot "
            f"create reservations ({RESERVATIONS_SINCE} or newer, Slurm 25.05+, is needed to "
            "hold the window): no pod is replaced by the schedule"
        )
        condition = WantedCondition(SCHEDULED_UPDATE, "False", RESERVATIONS_UNSUPPORTED, closed)
    elif view.now < window.start:
        closed = f"the window opens at {rfc3339(window.start)}"
        condition = WantedCondition(
            SCHEDULED_UPDATE, "False", "WindowPending", f"{closed} (reservation {reservation})"
        )
    elif window.over_at(view.now):
        closed = f"the window closed at {rfc3339(window.end)}"
        condition = WantedCondition(SCHEDULED_UPDATE, "False", "WindowOver", closed)
    else:
        closed = None
        condition = WantedCondition(
            SCHEDULED_UPDATE,
            "True",
            "WindowOpen",
            f"outdated pods are replaced as their Slurm nodes empty, under reservation "
            f"{reservation}, until {rfc3339(window.end)}",
        )
    round_.conditions.append(condition)
    round_.wake(window.start)
    round_.wake(window.end)
    if closed is not None:
        return closed, {}
    not_reserved = {
        pod.name: f"its Slurm node is not read as held by reservation {reservation}"
        for pod in pods
        if not (
            pod.slurm is not None
            and pod.slurm.known
            and "Maintenance" in pod.slurm.flags
            and pod.slurm.reservation == reservation
        )
    }
    return None, not_reserved


# --- phase: deletion -------------------------------------------------------------------------


def plan_deletions(
    round_: _Round, pods: PodClasses, scale_down: ScaleDown, cancelled: set[str]
) -> None:
    """Delete the pods whose SlurmDelete is set and still wanted, once the deletion rules
    allow it (see `deletion`); wake up when a forced timeout or the staleness of the Slurm
    states would change that. Under ScheduledUpdate a pod marked for replacement is deleted
    only while its Slurm node reads as held by the window's reservation."""
    spec = round_.spec
    doomed = (
        [p for p in scale_down.removing if p.delete_reason]
        + [p for p in scale_down.staying if p.delete_reason and p.name not in cancelled]
        + [p for p, _ in pods.leaving if p.delete_reason]
    )
    if doomed and round_.trust.stale_at is not None:
        round_.wake(round_.trust.stale_at)
    removing = {pod.name for pod in scale_down.removing}
    for pod in scale_down.removing:
        if pod.delete_reason is None:
            # Marked by this plan: it waits as it will once the mark lands (same words, so the
            # condition does not change when it does).
            marked = dataclasses.replace(
                pod, delete_reason=SCALING_DELETE, delete_since=round_.view.now
            )
            _note_wait(round_.result.scale_down_waits, marked, _decide(round_, marked))
    for pod in doomed:
        if (
            pod.delete_reason == ROLLING_DELETE
            and pod.name not in removing
            and pod.name in round_.outside_reservation
        ):
            round_.result.rollout_waits.append(
                PodWait(pod.name, "ReservationPending", "Slurm node not held by the reservation")
            )
            continue
        decision = _decide(round_, pod)
        if pod.name in removing:
            _note_wait(round_.result.scale_down_waits, pod, decision)
        elif pod.delete_reason == ROLLING_DELETE:
            _note_wait(round_.result.rollout_waits, pod, decision)
        else:
            _note_wait(round_.result.other_waits, pod, decision)
        if decision.reason == deletion.AWAITING_SLURM_READ and pod.delete_since is not None:
            waiting = round_.result.awaits_slurm_read_after
            round_.result.awaits_slurm_read_after = (
                pod.delete_since if waiting is None else min(waiting, pod.delete_since)
            )
        if decision.verdict == "wait":
            deadline = deletion.forced_deadline(
                pod, spec.force_delete_known_timeout, spec.force_delete_unknown_timeout
            )
            if deadline is not None:
                round_.wake(deadline)
            continue
        round_.act(
            DeletePod(pod, decision.verdict == "forced-delete", decision.reason, decision.message)
        )


def _decide(round_: _Round, pod: PodState) -> deletion.DeletionDecision:
    spec = round_.spec
    return deletion.decide_deletion(
        pod, round_.view.now, spec.force_delete_known_timeout, spec.force_delete_unknown_timeout
    )


def _note_wait(waits: list[PodWait], pod: PodState, decision: deletion.DeletionDecision) -> None:
    """Record why a pod marked for deletion is not deleted yet (nothing when it is deleted
    now, or already going)."""
    if decision.verdict != "wait":
        return
    if decision.reason == "SlurmStateUnknown":
        waits.append(PodWait(pod.name, "SlurmStateUnknown", "Slurm state unknown"))
    elif decision.reason == "Busy":
        drain = "draining" if pod.drain else "not draining yet"
        waits.append(PodWait(pod.name, "PodsBusy", f"node busy with jobs, {drain}"))
    elif decision.reason == "NotDrained":
        waits.append(PodWait(pod.name, "DrainPending", "not drained yet"))
    elif decision.reason == deletion.AWAITING_SLURM_READ:
        waits.append(
            PodWait(
                pod.name,
                "AwaitingSlurmRead",
                "runs no job, waiting for a Slurm read after its mark",
            )
        )


# --- phase: the pods' own wait conditions --------------------------------------------------


def plan_pod_waits(round_: _Round, pods: PodClasses) -> None:
    """Rule 8b: each pod the NodeSet wants gone and cannot remove yet carries its own cause
    (POD_WAIT_CONDITION), written only when it differs from the pod's (never a write that
    changes nothing), removed once the pod no longer waits. A pod deleted by this plan gets
    none; a pod marked or unmarked by this plan gets it in that same patch, so the condition
    costs no write of its own there; a pod whose mark or delete is still in flight is left
    until that lands (it carries the condition, or the pod is gone)."""
    result = round_.result
    max_unavailable = round_.spec.max_unavailable
    waits = most_blocking([*result.scale_down_waits, *result.rollout_waits, *result.other_waits])
    wanted = {name: pod_wait_condition(wait, max_unavailable) for name, wait in waits.items()}
    deleted = {action.pod.name for action in result.actions if isinstance(action, DeletePod)}
    settled = set(deleted)
    for index, action in enumerate(result.actions):
        if isinstance(action, ScheduleDelete | CancelDelete) and action.pod.name not in deleted:
            settled.add(action.pod.name)
            wait = wanted.get(action.pod.name)
            if wait is None and isinstance(action, ScheduleDelete):
                # A mark no phase noted (a misscheduled pod's): it waits as it will once the
                # mark lands.
                marked = dataclasses.replace(
                    action.pod, delete_reason=action.reason, delete_since=round_.view.now
                )
                noted: list[PodWait] = []
                _note_wait(noted, marked, _decide(round_, marked))
                wait = pod_wait_condition(noted[0], max_unavailable) if noted else None
            result.actions[index] = dataclasses.replace(action, wait=wait)
    for pod in pods.states:
        if pod.terminating or pod.name in settled or pod.name in round_.view.in_flight:
            continue
        wait = wanted.get(pod.name)
        if (None if wait is None else (wait.reason, wait.message)) != pod.wait:
            round_.act(SetPodWait(pod, wait))


# --- phase: scale-up -------------------------------------------------------------------------


def plan_scale_up(
    round_: _Round,
    pods: PodClasses,
    scale_down: ScaleDown,
    feasible: FeasibleNodes,
    naming: NodeNames,
    desired: int,
) -> list[str]:
    """Pods for the missing replicas: the pods that stay (those being scaled down do not
    count) and the terminating ones that will be replaced where they are. Claimed-by-us
    nodes first (a replaced pod comes back on its node), then by name. Returns the nodes
    chosen."""
    view, spec = round_.view, round_.spec
    existing = len(scale_down.staying) + len(pods.terminating_in_place)
    need = desired - existing
    if need <= 0:
        return []
    ordered = sorted(feasible.placeable, key=lambda n: (naming.claims[n] != spec.key, n))
    chosen = ordered[:need]
    for node_name in chosen:
        node = view.nodes[node_name]
        if naming.claims[node_name] == spec.key:
            round_.act(
                CreatePod(
                    node=node_name,
                    node_uid=uid_of(node),
                    node_rv=resource_version_of(node),
                    name=naming.names[node_name],
                    revision=round_.revision,
                    nodeset=spec,
                    why=f"node {node_name} is feasible and claimed; "
                    f"{existing} of {desired} pods exist",
                )
            )
        else:
            round_.act(Claim(node_name, uid_of(node), resource_version_of(node), "scale up"))
    return chosen


# --- phase: claims and releases --------------------------------------------------------------


def plan_claims_and_releases(
    round_: _Round,
    pods: PodClasses,
    feasible: FeasibleNodes,
    naming: NodeNames,
    chosen: list[str],
) -> None:
    """Release claimed nodes with no pod of ours; claim a node a pod of ours runs on
    unclaimed (a release raced a create)."""
    chosen_set = set(chosen)
    for node_name, node in sorted(round_.view.nodes.items()):
        claim = naming.claims[node_name]
        if claim != round_.spec.key:
            if claim is None and node_name in feasible.kept_nodes:
                round_.act(
                    Claim(
                        node_name,
                        uid_of(node),
                        resource_version_of(node),
                        "repair: pod without claim",
                    )
                )
            continue
        if node_name in chosen_set or pods.occupied.get(node_name):
            continue
        round_.act(
            Release(
                node_name,
                uid_of(node),
                resource_version_of(node),
                naming.names.get(node_name, ""),
                "no pod of this NodeSet on the node any more",
            )
        )


# --- phase: NodeSlices -----------------------------------------------------------------------


def plan_nodeslices(round_: _Round, pods: PodClasses) -> None:
    """NodeSlices list the nodes that have one of our pods."""
    view = round_.view
    members = {pod.node for pod in pods.states if pod.node and pod.node in view.nodes}
    current_slices = {
        name: [str(n) for n in sequence(mapping(obj.get("spec")).get("nodes"))]
        for name, obj in view.slices.items()
    }
    for change in plan_slices(round_.spec.name, current_slices, members):
        existing = view.slices.get(change.name)
        round_.act(
            WriteSlice(
                change,
                resource_version_of(existing) if existing is not None else None,
                uid_of(existing) if existing is not None else None,
            )
        )


# --- phase: protection from eviction ---------------------------------------------------------


def plan_disruption_protection(round_: _Round, pods: PodClasses) -> None:
    """workloadDisruptionProtection (see `protection`): the protect label follows each pod's
    Slurm state as this plan trusts it, and the NodeSet's PodDisruptionBudget exists exactly
    while the option is on. A pod left unprotected on a fresh Slurm view is protected again
    when that view goes stale without a change: the plan wakes up then."""
    spec = round_.spec
    trust = round_.trust
    # A node missing from the view is missing from Slurm's listing only while the view holds
    # a fresh, successful poll whole (see `protection.needs_protection`).
    absence_read = trust.absence_read_until is not None
    actions = protection.plan_protection(
        spec,
        ((pod, pods.raw_by_name[pod.name]) for pod in pods.states),
        round_.view.disruption_budget,
        absence_read,
    )
    for action in actions:
        round_.act(action)
    budget = round_.view.disruption_budget
    enabled = spec.workload_disruption_protection
    if enabled and budget is not None and not protection.owned_by(budget, spec):
        report_foreign_budget(round_, budget)
    # An unprotected pod is protected again once its evidence goes stale: the Slurm states,
    # or (sooner, when the last poll's states are still arriving) the poll held whole.
    stale_at = trust.absence_read_until if absence_read else trust.stale_at
    if spec.workload_disruption_protection and stale_at is not None:
        unprotected = (
            pod
            for pod in pods.states
            if pod.bound
            and not pod.terminating
            and not protection.needs_protection(
                pod,
                labelled=protection.is_labelled(pods.raw_by_name[pod.name]),
                absence_read=absence_read,
            )
        )
        if next(unprotected, None) is not None:
            round_.wake(stale_at)


def report_foreign_budget(round_: _Round, budget: Obj) -> None:
    """A budget of our budget's name that the NodeSet does not own is never touched, and the
    NodeSet is then unprotected: a condition says so while it lasts, and a Warning Event once
    (when the condition's message changes)."""
    message = (
        f"PodDisruptionBudget {name_of(budget)} exists and is not owned by this NodeSet: its "
        "pods running Slurm jobs are not protected from eviction until it is removed"
    )
    round_.conditions.append(
        WantedCondition(DISRUPTION_BUDGET_CONFLICT, "True", "BudgetNotOwned", message)
    )
    existing_status = mapping(round_.view.nodeset.get("status"))
    if _condition_message(existing_status, DISRUPTION_BUDGET_CONFLICT) != message:
        round_.act(Notice("protection-disabled", "DisruptionBudgetNotOwned", message))


# --- phase: status ---------------------------------------------------------------------------


def report_collisions(round_: _Round, collisions: list[Collision]) -> WantedCondition:
    """Name collisions are reported once (when the condition changes), with a decision."""
    condition = _collision_condition(collisions)
    existing_status = mapping(round_.view.nodeset.get("status"))
    if collisions and _condition_message(existing_status, NAME_COLLISION) != condition.message:
        for collision in collisions:
            round_.act(
                Notice(
                    "name-collision",
                    "PodNameCollision",
                    collision.describe(),
                    node=collision.node,
                    pod=collision.name,
                )
            )
    return condition


def plan_status(
    round_: _Round,
    pods: PodClasses,
    desired: int,
    number_feasible: int,
    collision_condition: WantedCondition,
) -> None:
    """The nine fields. numberRunning and numberDrain count every pod of ours on a node,
    misscheduled ones included; numberDrain counts nodes drained (Drain and not Busy).
    Without a fresh Slurm view those two keep their last known values (`last_known_slurm_counts`)
    and the SlurmStateUnknown condition says so, since when (`slurm_condition`)."""
    counted = pods.kept
    on_nodes = pods.kept + pods.misscheduled
    revision = round_.revision
    counts = Counts(
        current_number_scheduled=len(counted),
        number_misscheduled=len(pods.misscheduled),
        desired_number_scheduled=desired,
        updated_number_scheduled=sum(1 for p in counted if p.revision == revision),
        number_feasible=number_feasible,
        number_ready=sum(1 for p in counted if p.ready),
        # Not available: not Ready, or Ready for less than minReadySeconds.
        number_unavailable=sum(1 for p in counted if not p.available),
        number_running=sum(1 for p in on_nodes if p.reported_busy),
        number_drain=sum(1 for p in on_nodes if p.drained),
    )
    if not round_.trust.fresh:
        counts = last_known_slurm_counts(
            counts, mapping(round_.view.nodeset.get("status")), len(on_nodes)
        )
    _finish_status(
        round_.result,
        round_.view,
        counts,
        [
            _spec_conditions([]),
            collision_condition,
            slurm_condition(round_),
            *waiting_conditions(round_.result),
            *round_.conditions,
        ],
        selector(round_.spec),
    )


def waiting_conditions(result: Plan) -> tuple[WantedCondition, WantedCondition]:
    """ScaleDownWaiting and RolloutWaiting from the waits the phases recorded."""
    return (
        waiting_condition(
            SCALE_DOWN_WAITING,
            result.scale_down_waits,
            idle="no pod waits to be removed by a scale-down",
        ),
        waiting_condition(
            ROLLOUT_WAITING,
            result.rollout_waits,
            idle="no outdated pod waits for its replacement",
            context=result.rollout_budget,
        ),
    )


def plan_revision_history(round_: _Round, pods: PodClasses) -> None:
    """Rule 7e (see `history`): the template's ControllerRevision made (again, on a rollback), the
    history beyond revisionHistoryLimit pruned, currentRevision and updateRevision reported."""
    view = round_.view
    result = round_.result
    history = plan_history(
        round_.spec,
        round_.revision,
        view.revisions,
        [p.revision for p in pods.kept],
        mapping(view.nodeset.get("status")),
        live_hashes=[str(labels_of(p).get(REVISION_LABEL) or "") for p in view.pods],
    )
    result.actions.extend(history.actions)
    result.wanted_status["currentRevision"] = history.current_revision
    result.wanted_status["updateRevision"] = history.update_revision
    existing = mapping(view.nodeset.get("status"))
    result.status = result.wanted_status if status_differs(existing, result.wanted_status) else None


def slurm_condition(round_: _Round) -> WantedCondition:
    """SlurmStateUnknown: True while the cluster's view is stale or missing (its
    lastTransitionTime: since when), False while it is fresh. The message holds only what
    stays the same while an outage lasts (the last successful read, reachable or not): the
    syncer's error text changes from poll to poll and would rewrite the status each time
    (the controller logs it when the view turns stale)."""
    cluster = round_.spec.slurm_cluster
    if round_.trust.fresh:
        return WantedCondition(
            SLURM_STATE_UNKNOWN, "False", "SlurmStateFresh", f"Slurm cluster {cluster} is read"
        )
    status = round_.view.slurm_cluster
    if status is None:
        detail = "slurm-syncer has reported no status for it"
    elif status.last_success_at <= 0:
        detail = "slurm-syncer has not read it yet"
    else:
        detail = f"last read at {rfc3339(status.last_success_at)}"
        if not status.reachable:
            detail += "; slurm-syncer cannot reach it"
    return WantedCondition(
        SLURM_STATE_UNKNOWN,
        "True",
        "SlurmStateStale",
        f"no fresh view of Slurm cluster {cluster} ({detail}): numberRunning and numberDrain "
        "are the last known counts",
    )


def _sum_requests(pods: Any) -> ResourceList:
    total: ResourceList = {}
    for pod in pods:
        if pod_is_terminal(pod):
            continue
        for name, amount in pod_requests(mapping(pod.get("spec"))).items():
            total[name] = total.get(name, Fraction(0)) + amount
    return total

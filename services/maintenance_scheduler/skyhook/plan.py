"""One round of the Skyhook controller: every Skyhook's state in, actions out (pure).

Per Skyhook, in priority order (lower first, then name): its target nodes (nodeSelectors,
minus nodes labelled skyhook.nvidia.com/ignore) fall into the policy's compartments; each
compartment evaluates its finished batch and picks the nodes that may work; on each of
those the packages advance stage by stage (dependsOn first, one at a time when serial),
each stage one Job, an interrupt stage only once the node's NodeMaintenance is Ready.

Fail closed: a node whose state annotation is unreadable is left alone (status unknown);
a paused or disabled Skyhook, a stopped rollout or a missing policy starts no new stage.

A Skyhook works only once it carries SKYHOOK_FINALIZER, so nothing it writes on a node can
outlive it: deleted, it removes its nodeState_/status_ annotations and status_ label from
every node and waits for its NodeMaintenances (so their cordons) to be gone before dropping
the finalizer; its Jobs go with it through their ownerReference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from maintenance_scheduler.skyhook import stages
from maintenance_scheduler.skyhook.api import (
    DEFAULT_COMPARTMENT,
    IGNORE_NODE_LABEL,
    POLICY_FINALIZER,
    SKYHOOK_FINALIZER,
    DeploymentPolicy,
    Package,
    Skyhook,
    node_state_annotation,
    policy_for,
    status_key,
)
from maintenance_scheduler.skyhook.jobs import job_name, maintenance_name
from maintenance_scheduler.skyhook.rollout import (
    BLOCKED,
    COMPLETE,
    DISABLED,
    ERRORING,
    IN_PROGRESS,
    PAUSED,
    UNKNOWN,
    WAITING,
    BatchState,
    CompartmentPlan,
    RolloutNode,
    assign_compartments,
    compartment_of,
    plan_compartment,
)
from maintenance_scheduler.skyhook.stages import (
    JobFacts,
    PackageState,
    parse_node_state,
    render_node_state,
    step_package,
)
from nodeflow_kube.fields import (
    rfc3339,
)

MAINTENANCE_READY = "Ready"


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    created: float


# --- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateJob:
    skyhook: Skyhook
    package: Package
    stage: str
    node: str
    name: str
    # The stage's retries so far: a retried stage's create is a new command.
    attempt: int = 0


@dataclass(frozen=True)
class FailJob:
    """End a Job whose image never pulled (activeDeadlineSeconds brought to now)."""

    skyhook: str
    name: str
    message: str


@dataclass(frozen=True)
class KeepFailedJob:
    """Drop a failed Job's ttlSecondsAfterFinished: it stays, with its logs, until the
    controller or a person deletes it (deleting it retries the stage)."""

    skyhook: str
    name: str
    attempt: int = 0


@dataclass(frozen=True)
class PatchNode:
    skyhook: str
    node: NodeView
    node_state: str
    status: str


@dataclass(frozen=True)
class CreateMaintenance:
    skyhook: Skyhook
    node: str
    name: str
    # The interrupts it is for (`package|version` ...): a later interrupt is a new request.
    purpose: str = ""


@dataclass(frozen=True)
class DeleteMaintenance:
    skyhook: str
    node: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class SetSkyhookStatus:
    skyhook: Skyhook
    status: Mapping[str, Any]


@dataclass(frozen=True)
class SetPolicyFinalizer:
    policy: DeploymentPolicy
    present: bool


@dataclass(frozen=True)
class SetSkyhookFinalizer:
    skyhook: Skyhook
    present: bool


@dataclass(frozen=True)
class ForgetNode:
    """Remove what a deleted Skyhook wrote on the node (its state and status marks)."""

    skyhook: str
    node: NodeView


@dataclass(frozen=True)
class SkyhookDecisionNote:
    """An audit line on maintenance.v1.skyhook.<name>.decision."""

    skyhook: str
    kind: Literal["stage", "batch", "fail-job", "maintenance"]
    message: str
    reason: str = ""
    node: str = ""
    package: str = ""
    stage: str = ""
    compartment: str = ""


SkyhookAction = (
    CreateJob
    | FailJob
    | KeepFailedJob
    | PatchNode
    | CreateMaintenance
    | DeleteMaintenance
    | SetSkyhookStatus
    | SetPolicyFinalizer
    | SetSkyhookFinalizer
    | ForgetNode
)


@dataclass(frozen=True)
class World:
    skyhooks: Sequence[Skyhook]
    policies: Mapping[str, DeploymentPolicy]
    nodes: Sequence[NodeView]
    # Skyhook Jobs by name.
    jobs: Mapping[str, JobFacts]
    # NodeMaintenance phase (Ready condition reason) by name; absent: no request.
    maintenances: Mapping[str, str]
    # NodeMaintenance uid by name (for a delete that cannot hit a newer request).
    maintenance_uids: Mapping[str, str] = field(default_factory=dict)
    # The (skyhook, node) each of our NodeMaintenances is for, by name (from its labels).
    maintenance_owners: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # Nodes whose last patch is not yet visible: left as they are this round.
    settling: frozenset[str] = frozenset()


@dataclass
class SkyhookRound:
    """What one Skyhook's round decided, for metrics and the bench."""

    name: str
    status: str
    node_status: dict[str, str] = field(default_factory=dict)
    compartments: list[CompartmentPlan] = field(default_factory=list)
    package_states: dict[tuple[str, str, str], int] = field(default_factory=dict)
    package_stages: dict[tuple[str, str, str], int] = field(default_factory=dict)


@dataclass
class RoundPlan:
    actions: list[SkyhookAction] = field(default_factory=list)
    decisions: list[SkyhookDecisionNote] = field(default_factory=list)
    rounds: list[SkyhookRound] = field(default_factory=list)
    # NodeMaintenances an interrupt still needs (or may need: the node could not be read).
    kept_maintenances: set[str] = field(default_factory=set)


# --- node status -----------------------------------------------------------------------------


Wanted = tuple[dict[str, str], frozenset[str]]


def wanted_versions(skyhook: Skyhook) -> Wanted:
    return {p.name: p.version for p in skyhook.packages}, frozenset(
        p.name for p in skyhook.packages
    )


def node_status(
    skyhook: Skyhook,
    entries: Mapping[str, PackageState],
    readable: bool,
    wanted_names: Wanted | None = None,
) -> str:
    """complete: every package complete at its version and nothing left to uninstall."""
    if not readable:
        return UNKNOWN
    wanted, names = wanted_names or wanted_versions(skyhook)
    if not entries:
        return COMPLETE if not wanted else WAITING
    in_progress = False
    for present in entries.values():
        if present.state == stages.ERRORING:
            return ERRORING
        if present.state == stages.IN_PROGRESS:
            in_progress = True
    if not in_progress and entries.keys() <= names:
        done = True
        for name, version in wanted.items():
            entry = entries.get(name)
            if entry is None or entry.version != version or entry.state != stages.COMPLETE:
                done = False
                break
        if done:
            return COMPLETE
    return IN_PROGRESS if in_progress else WAITING


def _package_order(skyhook: Skyhook) -> list[Package]:
    """dependsOn first (the spec has no cycle), then by name."""
    by_name = {p.name: p for p in skyhook.packages}
    ordered: list[Package] = []
    seen: set[str] = set()

    def visit(package: Package) -> None:
        if package.name in seen:
            return
        seen.add(package.name)
        for dependency, _ in package.depends_on:
            if dependency in by_name:
                visit(by_name[dependency])
        ordered.append(package)

    for name in sorted(by_name):
        visit(by_name[name])
    return ordered


# --- one node --------------------------------------------------------------------------------


@dataclass
class NodeStep:
    entries: dict[str, PackageState]
    actions: list[SkyhookAction]
    decisions: list[SkyhookDecisionNote]
    maintenance_needed: bool = False


def step_node(
    skyhook: Skyhook,
    node: str,
    entries: Mapping[str, PackageState],
    world: World,
    *,
    may_start: bool,
    now: float,
    pull_grace_seconds: float,
    order: Sequence[Package] | None = None,
) -> NodeStep:
    """Advance every package of one node; with `may_start` False, Job endings are recorded
    but no new Job or maintenance request is made."""
    result = NodeStep(dict(entries), [], [])
    maintenance = maintenance_name(skyhook.name, node)
    maintenance_phase = world.maintenances.get(maintenance)
    needs_maintenance = False
    keeps_maintenance = False
    interrupts: list[str] = []
    busy = False  # a package of a serial Skyhook is under way
    spec_names = {p.name for p in skyhook.packages}
    packages = order if order is not None else _package_order(skyhook)
    work: list[tuple[Package | None, str]] = [(p, p.name) for p in packages]
    work += [(None, name) for name in sorted(entries) if name not in spec_names]
    for package, name in work:
        entry = result.entries.get(name)
        if package is not None and (entry is None or entry.state != stages.COMPLETE):
            pending = [
                dep
                for dep, version in package.depends_on
                if not (
                    (d := result.entries.get(dep)) is not None
                    and d.version == version
                    and d.state == stages.COMPLETE
                )
            ]
            not_started = entry is None or entry.version != package.version
            if not_started and (pending or (skyhook.serial and busy)):
                continue  # waits for its dependencies (or, serial, the package before it)
        job: JobFacts | None = None
        if entry is not None:
            job = world.jobs.get(job_name(skyhook.name, name, entry.version, entry.stage, node))
        outcome = step_package(package, entry, job, now=now, pull_grace_seconds=pull_grace_seconds)
        new = outcome.entry
        if outcome.run_job and new is not None:
            if not may_start:
                # Nothing new starts: only a stage that just ended is recorded (its next
                # stage's Job is made on resume); a start or a retry waits entirely.
                if job is None or job.outcome != "complete":
                    new = entry
            elif new.stage == "interrupt" and maintenance_phase != MAINTENANCE_READY:
                pass  # the interrupt waits for the node's maintenance request to be Ready
            else:
                target = job_name(skyhook.name, name, new.version, new.stage, node)
                if target not in world.jobs:
                    spec_package = package or _uninstall_package(new)
                    result.actions.append(
                        CreateJob(skyhook, spec_package, new.stage, node, target, new.restarts)
                    )
        if job is not None and job.outcome == "failed" and job.ttl_seconds is not None:
            attempt = entry.restarts if entry is not None else 0
            result.actions.append(KeepFailedJob(skyhook.name, job.name, attempt))
        if outcome.fail_job and job is not None and new is not None:
            result.actions.append(FailJob(skyhook.name, job.name, new.message))
            result.decisions.append(
                SkyhookDecisionNote(
                    skyhook.name,
                    "fail-job",
                    new.message,
                    reason="image-not-pullable",
                    node=node,
                    package=name,
                    stage=new.stage,
                )
            )
        if new is None:
            result.entries.pop(name, None)
        else:
            result.entries[name] = new
            if new.state != stages.COMPLETE:
                busy = True
            if new.stage in ("interrupt", "post-interrupt") and new.state != stages.COMPLETE:
                # A failed interrupt keeps the node out of service (fail closed) until the
                # stage is retried or the package changes.
                keeps_maintenance = True
                if new.state == stages.IN_PROGRESS:
                    needs_maintenance = True
                    interrupts.append(new.key)
        if outcome.event and new is not entry:
            shown = new or entry
            result.decisions.append(
                SkyhookDecisionNote(
                    skyhook.name,
                    "stage",
                    f"{name} on {node}: {outcome.event}",
                    reason=outcome.event.split(":")[0].replace(" ", "-"),
                    node=node,
                    package=name,
                    stage=shown.stage if shown is not None else "",
                )
            )
    if needs_maintenance and may_start and maintenance_phase is None:
        result.actions.append(
            CreateMaintenance(skyhook, node, maintenance, ",".join(sorted(interrupts)))
        )
        result.decisions.append(
            SkyhookDecisionNote(
                skyhook.name,
                "maintenance",
                f"NodeMaintenance {maintenance} requested for the interrupt of "
                f"{', '.join(sorted(interrupts))} on {node}",
                reason="requested",
                node=node,
            )
        )
    result.maintenance_needed = keeps_maintenance
    return result


def _uninstall_package(entry: PackageState) -> Package:
    return Package(name=entry.name, version=entry.version, image=entry.image)


# --- one Skyhook -----------------------------------------------------------------------------


def _blocked_by_priority(
    skyhook: Skyhook,
    node: str,
    earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]],
) -> str:
    """The earlier Skyhook this node waits for, or ''."""
    for other, statuses, all_complete in earlier:
        if other.disabled:
            continue
        if other.sequencing == "all" and not all_complete:
            return other.name
        status = statuses.get(node)
        if status is not None and status != COMPLETE:
            return other.name
    return ""


def _condition(kind: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:1024],
    }


def overall_status(skyhook: Skyhook, statuses: Sequence[str], blocked: bool) -> str:
    if skyhook.disabled:
        return DISABLED
    if skyhook.paused:
        return PAUSED
    if ERRORING in statuses:
        return ERRORING
    if IN_PROGRESS in statuses:
        return IN_PROGRESS
    if blocked:
        return BLOCKED
    if statuses and all(s == COMPLETE for s in statuses):
        return COMPLETE
    if not statuses:
        return COMPLETE
    if UNKNOWN in statuses and all(s in (UNKNOWN, COMPLETE) for s in statuses):
        return UNKNOWN
    return WAITING


_READY_REASONS = {
    COMPLETE: "NodesConverged",
    IN_PROGRESS: "Progressing",
    BLOCKED: "Blocked",
    ERRORING: "Erroring",
    PAUSED: "Paused",
    WAITING: "Waiting",
    DISABLED: "Disabled",
    UNKNOWN: "Unknown",
}


def plan_round(world: World, *, now: float, pull_grace_seconds: float = 120.0) -> RoundPlan:
    plan = RoundPlan()
    ordered = sorted(world.skyhooks, key=lambda s: (s.priority, s.name))
    earlier: list[tuple[Skyhook, Mapping[str, str], bool]] = []
    in_use: set[str] = {s.deployment_policy for s in world.skyhooks if s.deployment_policy}
    for policy in world.policies.values():
        has = POLICY_FINALIZER in policy.finalizers
        if policy.name in in_use and not has and not policy.deleting:
            plan.actions.append(SetPolicyFinalizer(policy, True))
        elif policy.name not in in_use and has:
            plan.actions.append(SetPolicyFinalizer(policy, False))
    for skyhook in ordered:
        if skyhook.deleting:
            _plan_deletion(skyhook, world, plan)
            continue
        if SKYHOOK_FINALIZER not in skyhook.finalizers:
            # Nothing is written on a node before the finalizer guarantees its removal.
            plan.actions.append(SetSkyhookFinalizer(skyhook, True))
            continue
        summary = _plan_skyhook(skyhook, world, earlier, plan, now, pull_grace_seconds)
        plan.rounds.append(summary)
        earlier.append(
            (
                skyhook,
                summary.node_status,
                all(s == COMPLETE for s in summary.node_status.values()),
            )
        )
    # A request no interrupt needs any more goes, whoever left it: the round that finished
    # post-interrupt, one whose delete was lost, or a Skyhook deleted mid-interrupt.
    for name, (owner, node) in sorted(world.maintenance_owners.items()):
        if name in plan.kept_maintenances:
            continue
        plan.actions.append(
            DeleteMaintenance(owner, node, name, world.maintenance_uids.get(name, ""))
        )
        plan.decisions.append(
            SkyhookDecisionNote(
                owner,
                "maintenance",
                f"NodeMaintenance {name} released: no interrupt left on {node}",
                reason="released",
                node=node,
            )
        )
    return plan


def marks_of(skyhook: str, node: NodeView) -> bool:
    """Whether the node carries anything the Skyhook wrote on it."""
    key = status_key(skyhook)
    return (
        node_state_annotation(skyhook) in node.annotations
        or key in node.annotations
        or key in node.labels
    )


def _plan_deletion(skyhook: Skyhook, world: World, plan: RoundPlan) -> None:
    """Undo the Skyhook's marks on every node (its selector may have changed since it wrote
    them), and drop its finalizer only once no node and no NodeMaintenance of it is left."""
    if SKYHOOK_FINALIZER not in skyhook.finalizers:
        return
    left = 0
    for node in world.nodes:
        if not marks_of(skyhook.name, node):
            continue
        left += 1
        if node.name not in world.settling:
            plan.actions.append(ForgetNode(skyhook.name, node))
    requests = sum(1 for owner, _ in world.maintenance_owners.values() if owner == skyhook.name)
    if left or requests:
        return
    plan.actions.append(SetSkyhookFinalizer(skyhook, False))


def _plan_skyhook(
    skyhook: Skyhook,
    world: World,
    earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]],
    plan: RoundPlan,
    now: float,
    pull_grace_seconds: float,
) -> SkyhookRound:
    conditions: list[dict[str, Any]] = []
    selector = skyhook.node_selector
    # No selector selects every node: skip thousands of calls that could only say yes.
    select_all = not selector.match_labels and not selector.expressions
    targets = [
        n
        for n in world.nodes
        if (select_all or selector.matches(n.labels))
        and (IGNORE_NODE_LABEL not in n.labels or n.labels[IGNORE_NODE_LABEL].lower() != "true")
    ]
    annotation = node_state_annotation(skyhook.name)
    wanted = wanted_versions(skyhook)
    entries_of: dict[str, dict[str, PackageState]] = {}
    readable_of: dict[str, bool] = {}
    before: dict[str, str] = {}
    blocked_by: dict[str, str] = {}
    # Nodes in the same state share one parsed dict (kept alive in entries_of for the round,
    # so its id is not reused): judge each state once.
    status_of_state: dict[tuple[int, bool], str] = {}
    for node in targets:
        parsed, readable = parse_node_state(node.annotations.get(annotation))
        entries_of[node.name], readable_of[node.name] = parsed, readable
        state_id = (id(parsed), readable)
        status = status_of_state.get(state_id) or status_of_state.setdefault(
            state_id, node_status(skyhook, parsed, readable, wanted)
        )
        if status in (WAITING, UNKNOWN) and readable:
            blocker = _blocked_by_priority(skyhook, node.name, earlier)
            if blocker:
                blocked_by[node.name] = blocker
                status = BLOCKED
        before[node.name] = status
    policy = policy_for(skyhook, world.policies)
    problems = list(skyhook.problems)
    if policy is not None and policy.problems:
        problems.append(f"DeploymentPolicy {policy.name}: " + "; ".join(policy.problems))
    may_start = not (skyhook.paused or skyhook.disabled or problems)
    if policy is None:
        conditions.append(
            _condition(
                "DeploymentPolicyNotFound",
                True,
                "DeploymentPolicyNotFound",
                f"DeploymentPolicy {skyhook.deployment_policy} does not exist",
            )
        )
        may_start = False
    priorities = dict(skyhook.status.get("nodePriority") or {})
    previous_compartments = skyhook.status.get("compartmentStatuses") or {}
    compartments: list[CompartmentPlan] = []
    selected: set[str] = set()
    if policy is not None:
        rollout_nodes = [
            RolloutNode(n.name, n.labels, n.created, before[n.name], sticky=n.name in priorities)
            for n in targets
        ]
        for name, members in assign_compartments(policy, rollout_nodes).items():
            if not members and name != DEFAULT_COMPARTMENT:
                continue
            raw = (
                previous_compartments.get(name) if isinstance(previous_compartments, dict) else None
            )
            state = BatchState.from_status((raw or {}).get("batchState"))
            compartment = compartment_of(policy, name)
            decided = plan_compartment(
                compartment,
                members,
                state,
                may_start=may_start,
                fresh=not isinstance((raw or {}).get("batchState"), Mapping),
            )
            compartments.append(decided)
            selected.update(decided.batch)
            if decided.evaluated:
                verdict = "failed" if decided.batch_failed else "succeeded"
                if decided.strategy is None:
                    verdict = "done"  # no strategy judges it (interruptionBudget)
                plan.decisions.append(
                    SkyhookDecisionNote(
                        skyhook.name,
                        "batch",
                        f"compartment {name}: batch {decided.state.current_batch - 1} {verdict}"
                        f" ({decided.state.consecutive_failures} consecutive failures)"
                        + (", rollout stopped" if decided.state.should_stop else ""),
                        reason="stopped" if decided.state.should_stop else verdict,
                        compartment=name,
                    )
                )
            if decided.state.should_stop and decided.strategy is not None:
                conditions.append(
                    _condition(
                        "RolloutStopped",
                        True,
                        "FailureThresholdReached",
                        f"compartment {name} stopped after "
                        f"{decided.state.consecutive_failures} failed batches",
                    )
                )
    summary = SkyhookRound(skyhook.name, UNKNOWN)
    after: dict[str, str] = {}
    final_entries: dict[str, Mapping[str, PackageState]] = {}
    node_by_name = {n.name: n for n in targets}
    order = _package_order(skyhook)
    key = status_key(skyhook.name)
    shared: dict[int, tuple[Mapping[str, PackageState], int]] = {}
    for node in targets:
        name = node.name
        entries: Mapping[str, PackageState] = entries_of[name]
        status = before[name]
        usable = readable_of[name] and name not in world.settling
        working = usable and name in selected and name not in blocked_by
        # A node outside the batch with a stage under way still records its Job's end (the
        # rollout paused or stopped); a node with nothing started, or done, has nothing to do.
        unfinished = usable and bool(entries) and status != COMPLETE
        if working or unfinished:
            step = step_node(
                skyhook,
                name,
                entries,
                world,
                may_start=may_start and working,
                now=now,
                pull_grace_seconds=pull_grace_seconds,
                order=order,
            )
            if working:
                plan.actions.extend(step.actions)
            else:
                plan.actions.extend(
                    a for a in step.actions if isinstance(a, FailJob | KeepFailedJob)
                )
            plan.decisions.extend(step.decisions)
            if step.maintenance_needed:
                plan.kept_maintenances.add(maintenance_name(skyhook.name, name))
            status = node_status(skyhook, step.entries, True, wanted)
            if status == WAITING and step.entries:
                status = IN_PROGRESS
            if status in (WAITING, UNKNOWN) and name in blocked_by:
                status = BLOCKED
            if working and status != COMPLETE:
                priorities.setdefault(name, now)
            changed = step.entries != entries
            entries = step.entries
        else:
            changed = False
            # Not looked at this round (a usable node here has nothing started or is
            # complete): a request it may still be using stays.
            if not usable:
                plan.kept_maintenances.add(maintenance_name(skyhook.name, name))
        if status == COMPLETE:
            priorities.pop(name, None)
        after[name] = status
        if entries:
            final_entries[name] = entries
        if usable:
            shown = (node.annotations.get(key, ""), node.labels.get(key, ""))
            marked = bool(entries) or any(shown)
            if changed or (marked and shown != (status, status)):
                rendered = render_node_state(entries) if entries else ""
                plan.actions.append(PatchNode(skyhook.name, node, rendered, status))
        if entries:
            # Nodes in the same state share one parsed dict: count dicts, expand once below.
            seen = shared.get(id(entries))
            if seen is None:
                shared[id(entries)] = (entries, 1)
            else:
                shared[id(entries)] = (entries, seen[1] + 1)
    for entries, count in shared.values():
        for entry in entries.values():
            state_key = (entry.name, entry.version, entry.state)
            summary.package_states[state_key] = summary.package_states.get(state_key, 0) + count
            stage_key = (entry.name, entry.version, entry.stage)
            summary.package_stages[stage_key] = summary.package_stages.get(stage_key, 0) + count
    for name in list(priorities):
        if name not in node_by_name:
            priorities.pop(name)
    statuses = list(after.values())
    overall = overall_status(skyhook, statuses, bool(problems) or policy is None)
    if problems:
        overall = ERRORING
    summary.status = overall
    summary.node_status = after
    summary.compartments = compartments
    complete_nodes = sum(1 for s in statuses if s == COMPLETE)
    reset = overall == COMPLETE and (policy is None or policy.reset_batch_state_on_completion)
    ready_message = {
        COMPLETE: "all nodes converged",
        IN_PROGRESS: f"{complete_nodes}/{len(statuses)} nodes complete",
        ERRORING: "; ".join(problems)
        or f"{sum(1 for s in statuses if s == ERRORING)} nodes erroring",
        PAUSED: "paused: no new stage starts",
        DISABLED: "disabled",
        BLOCKED: "waiting for its DeploymentPolicy" if policy is None else "blocked",
        WAITING: "waiting for a batch",
        UNKNOWN: "node state unreadable",
    }[overall]
    conditions.insert(
        0, _condition("Ready", overall == COMPLETE, _READY_REASONS[overall], ready_message)
    )
    new_status: dict[str, Any] = {
        "observedGeneration": skyhook.generation,
        "status": overall,
        "nodeStatus": dict(sorted(after.items())),
        "nodeState": _rendered_node_states(final_entries),
        "completeNodes": f"{complete_nodes}/{len(statuses)}",
        "nodesInProgress": sum(1 for s in statuses if s == IN_PROGRESS),
        "packageList": ",".join(f"{p.name}:{p.version}" for p in skyhook.packages),
        "nodePriority": {k: _rfc3339(v) for k, v in sorted(priorities.items())}
        if not reset
        else {},
        # On completion (resetBatchStateOnCompletion) the batch state is dropped: the next
        # rollout starts from the first batch, with what is done as its checkpoint.
        "compartmentStatuses": {
            c.name: {
                "matched": c.matched,
                "ceiling": c.ceiling,
                "inProgress": c.in_progress,
                "completed": c.completed,
                "progressPercent": c.progress_percent,
                **({} if reset else {"batchState": c.state.to_status()}),
            }
            for c in compartments
        },
        "conditions": conditions,
    }
    if _status_differs(skyhook.status, new_status):
        plan.actions.append(SetSkyhookStatus(skyhook, new_status))
    return summary


def _rendered_node_states(
    final_entries: Mapping[str, Mapping[str, PackageState]],
) -> dict[str, dict[str, Any]]:
    """Node name -> its entries in the status's form. Nodes in the same state share one
    entries dict (parse_node_state memoises by the annotation's text): render each once."""
    rendered: dict[int, dict[str, Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for name, entries in sorted(final_entries.items()):
        shown = rendered.get(id(entries))
        if shown is None:
            shown = rendered[id(entries)] = {e.key: e.as_json for e in entries.values()}
        out[name] = shown
    return out


def _rfc3339(at: float | str) -> str:
    return at if isinstance(at, str) else rfc3339(at)


def _status_differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items())

"""One round of the Skyhook controller: every Skyhook's state in, actions out (pure).

Per Skyhook, in priority order (lower first, then name): its target nodes (nodeSelectors)
fall into the policy's compartments; each compartment evaluates its finished batch and picks
the nodes that may work (not one labelled `<group>/ignore` nor one with a taint
the Skyhook does not tolerate: those show `blocked`); on each of those the packages advance
stage by stage (dependsOn first, one at a time when serial),
each stage one Job. A package that will interrupt its node waits for the node's
NodeMaintenance to be Ready (cordoned, podNonInterruptLabels pods gone, drained) before its
apply/upgrade, as upstream drains before applying; several interrupts due on one node are
merged into one (reboot wins, services merged, the others `skipped`), as upstream's
fudgeInterruptWithPriority. A Job counts for a stage only if it ran this Skyhook, node,
package version, run and config (jobs.IDENTITY_ANNOTATION).

nodewright's explicit uninstall (`uninstall.apply`, or `uninstall.enabled` on a deleted object,
whose finalizer waits for it) is routed per node by `_uninstall_routes`: it starts from a
complete install, runs uninstall then (with an interrupt, drained) uninstall-interrupt, and a
cancel goes back to apply; a NodeWright's package removed or downgraded without it stays on
the node as a marker.

Fail closed: a node whose state annotation is unreadable (malformed, an unknown stage or state
included) is left alone (status unknown) and named by the condition NodeStateMalformed;
a paused or disabled Skyhook, a stopped rollout or a missing policy starts no new stage.

Both kinds run here, a Skyhook (skyhook.nvidia.com) and a NodeWright (nodewright.nvidia.com):
`Skyhook.names` gives every key one writes or reads, so the two never touch each other's marks
(nodeflow_contracts.skyhook states the naming contract).

A Skyhook works only once it carries its finalizer (`names.finalizer`), so nothing it writes
on a node can outlive it: deleted, it removes its nodeState_/status_/version_/cordon_
annotations and status_ label from every node and waits for its NodeMaintenances (so their
cordons) to be gone before dropping the finalizer; its Jobs go with it through their ownerReference.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from maintenance_scheduler.skyhook import stages
from maintenance_scheduler.skyhook.api import (
    DEFAULT_COMPARTMENT,
    NODE_STATE_VERSION,
    DeploymentPolicy,
    Interrupt,
    Package,
    Skyhook,
    owner_kind,
    owner_name,
    policy_for,
    resets_batch_state,
)
from maintenance_scheduler.skyhook.configmaps import (
    ConfigMapFacts,
    DeleteConfigMap,
    node_metadata_deletes,
    package_config_map_deletes,
)
from maintenance_scheduler.skyhook.jobs import (
    entry_identity,
    job_identity,
    job_name,
    maintenance_name,
)
from maintenance_scheduler.skyhook.pod import (
    TAINT_UNSCHEDULABLE,
    PodOptions,
    node_metadata_name,
    node_orders,
    package_config_map_name,
)
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
    StepOutcome,
    config_hash,
    effective_interrupt,
    merge_interrupt_list,
    parse_node_state,
    render_node_state,
    step_package,
)
from nodeflow_contracts.skyhook import (
    FLAVORS,
    NODEWRIGHT,
    SKYHOOK,
    SkyhookNames,
    carries_marks,
)
from nodeflow_kube.fields import (
    rfc3339,
)
from nodeflow_kube.taints import NO_SCHEDULE, tolerated

MAINTENANCE_READY = "Ready"


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    created: float
    # spec.taints: a node in a batch with a taint the Skyhook does not tolerate is blocked.
    taints: tuple[Mapping[str, Any], ...] = ()
    # The Skyhooks' own status.conditions (`skyhook.nvidia.com/<name>/NotReady`, `/Erroring`)
    # by type; the kubelet's are not kept.
    conditions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # spec.unschedulable (a runtimeRequiredCordon mark on a schedulable node is stale).
    unschedulable: bool = False


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
    # The identity the Job records (jobs.IDENTITY_ANNOTATION) besides the Skyhook's uid.
    run: str = ""
    config: str = ""
    node_uid: str = ""
    # SKYHOOK_NODE_ORDER: the node's place among the nodes the rollout picked.
    node_order: int = 0


@dataclass(frozen=True)
class WriteNodeMetadata:
    """The node-metadata ConfigMap a package pod mounts (the node's labels, annotations and
    the Skyhook's packages), written before each of its Jobs as upstream does before each
    package pod."""

    skyhook: Skyhook
    node: NodeView


@dataclass(frozen=True)
class WritePackageConfig:
    """The package's configMap as the ConfigMap `<skyhook>-<pkg>-<version>` its pods mount."""

    skyhook: Skyhook
    package: Package


@dataclass(frozen=True)
class FailJob:
    """End a Job whose image never pulled (activeDeadlineSeconds brought to now)."""

    skyhook: str
    name: str
    message: str
    names: SkyhookNames = SKYHOOK


@dataclass(frozen=True)
class KeepFailedJob:
    """Drop a failed Job's ttlSecondsAfterFinished: it stays, with its logs, until the
    controller or a person deletes it (deleting it retries the stage)."""

    skyhook: str
    name: str
    attempt: int = 0
    names: SkyhookNames = SKYHOOK


@dataclass(frozen=True)
class PatchNode:
    """The node's state and status for the Skyhook, with upstream's other marks:
    `version_<skyhook>` and, while its NodeMaintenance holds the node, `cordon_<skyhook>`."""

    skyhook: str
    node: NodeView
    node_state: str
    status: str
    cordon: bool = False
    # The kind of the object (Skyhook or NodeWright) whose keys the patch writes.
    names: SkyhookNames = SKYHOOK


@dataclass(frozen=True)
class SetNodeConditions:
    """A strategic-merge patch of the node's status.conditions touching only the Skyhook's
    own types: `conditions` merged by type, `removed` types deleted."""

    skyhook: str
    node: NodeView
    conditions: tuple[Mapping[str, Any], ...] = ()
    removed: tuple[str, ...] = ()
    names: SkyhookNames = SKYHOOK


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
    names: SkyhookNames = SKYHOOK


@dataclass(frozen=True)
class SetRuntimeTaint:
    """Add the runtime-required taint to a new node (autoTaintNewNodes), or remove it once
    every runtimeRequired Skyhook selecting the node is complete on it."""

    node: NodeView
    taint: Mapping[str, str]
    present: bool
    # Whose taint it is (its autoTaint_<key> annotation is of these names).
    names: SkyhookNames = SKYHOOK
    # With the removal (runtimeRequiredCordonAfter, S57): the node is cordoned first, and the
    # taint goes with the runtimeRequiredCordon mark only once the view shows the cordon, so
    # no pod schedules in between (commands.commands_for).
    cordon: bool = False


@dataclass(frozen=True)
class DropRuntimeCordonMark:
    """The node was uncordoned without its runtimeRequiredCordon mark being removed (upstream
    removes the mark then): a stale mark must not keep a later interrupt's cordon (S57)."""

    node: NodeView
    names: SkyhookNames = SKYHOOK


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
    # The object's kind, Skyhook or NodeWright: both kinds' decisions share the subject.
    object_kind: str = SKYHOOK.kind


SkyhookAction = (
    CreateJob
    | WriteNodeMetadata
    | WritePackageConfig
    | FailJob
    | KeepFailedJob
    | PatchNode
    | CreateMaintenance
    | DeleteMaintenance
    | SetSkyhookStatus
    | SetPolicyFinalizer
    | SetSkyhookFinalizer
    | ForgetNode
    | SetRuntimeTaint
    | DropRuntimeCordonMark
    | SetNodeConditions
    | DeleteConfigMap
)


@dataclass(frozen=True)
class World:
    skyhooks: Sequence[Skyhook]
    # skyhook.nvidia.com's DeploymentPolicies by name (what a Skyhook names).
    policies: Mapping[str, DeploymentPolicy]
    nodes: Sequence[NodeView]
    # Skyhook Jobs by name.
    jobs: Mapping[str, JobFacts]
    # NodeMaintenance phase (Ready condition reason) by name; absent: no request.
    maintenances: Mapping[str, str]
    # NodeMaintenance uid by name (for a delete that cannot hit a newer request).
    maintenance_uids: Mapping[str, str] = field(default_factory=dict)
    # The (owner_key, node) each of our NodeMaintenances is for, by name (from its labels):
    # a Skyhook's and a NodeWright's of one name are told apart.
    maintenance_owners: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # Nodes whose last patch is not yet visible: left as they are this round.
    settling: frozenset[str] = frozenset()
    # The toleration of the runtime-required taint (SKYHOOK_RUNTIME_REQUIRED_TAINT), which
    # a runtimeRequired Skyhook's nodes may carry.
    runtime_required_toleration: Mapping[str, str] = field(
        default_factory=lambda: PodOptions().runtime_required_toleration()
    )
    # nodewright.nvidia.com's DeploymentPolicies by name (what a NodeWright names).
    nodewright_policies: Mapping[str, DeploymentPolicy] = field(default_factory=dict)
    # The NodeWrights' own (SKYHOOK_NODEWRIGHT_RUNTIME_REQUIRED_TAINT).
    nodewright_runtime_required_toleration: Mapping[str, str] = field(
        default_factory=lambda: PodOptions().runtime_required_toleration(NODEWRIGHT)
    )
    # The ConfigMaps the controller wrote, in its namespace, by name (skyhook/configmaps.py).
    config_maps: Mapping[str, ConfigMapFacts] = field(default_factory=dict)

    def policies_of(self, names: SkyhookNames) -> Mapping[str, DeploymentPolicy]:
        """The DeploymentPolicies an object of the kind may name: its own group's."""
        return self.nodewright_policies if names == NODEWRIGHT else self.policies

    def runtime_toleration_of(self, names: SkyhookNames) -> Mapping[str, str]:
        """The toleration of the runtime-required taint of a Skyhook or a NodeWright."""
        if names == NODEWRIGHT:
            return self.nodewright_runtime_required_toleration
        return self.runtime_required_toleration

    def runtime_taint_of(self, names: SkyhookNames) -> Mapping[str, str]:
        toleration = self.runtime_toleration_of(names)
        return {k: toleration[k] for k in ("key", "value", "effect") if toleration.get(k)}

    @property
    def runtime_required_taint(self) -> Mapping[str, str]:
        return self.runtime_taint_of(SKYHOOK)

    @functools.cached_property
    def requests_by_owner(self) -> Mapping[tuple[str, str], str]:
        """The NodeMaintenance names by (owner_key, node), from their labels."""
        found: dict[tuple[str, str], str] = {}
        for name, owner in sorted(self.maintenance_owners.items()):
            found.setdefault(owner, name)
        return found

    def request_of(self, skyhook: Skyhook, node: str) -> str:
        """The object's NodeMaintenance on the node: the one its labels say is its own (one
        an earlier release named is still found), else the name a new one gets."""
        made = maintenance_name(skyhook.name, node, skyhook.names)
        found = self.requests_by_owner.get((skyhook.owner_key, node))
        return made if found is None or made in self.maintenance_owners else found

    @functools.cached_property
    def running_slots(self) -> Mapping[tuple[str, str, str], frozenset[str]]:
        """Running Jobs by (owner_key, package, node), from their labels."""
        found: dict[tuple[str, str, str], set[str]] = {}
        for job in self.jobs.values():
            if job.outcome == "running" and job.slot is not None:
                found.setdefault(job.slot, set()).add(job.name)
        return {slot: frozenset(names) for slot, names in found.items()}

    @functools.cached_property
    def used_runs(self) -> Mapping[tuple[str, str, str], frozenset[str]]:
        """The runs by (owner_key, package, node) that a Job shows went past their first
        stage (a Job of any stage but stages.START_STAGES), whatever its outcome:
        `run_marker` never starts such a run again."""
        found: dict[tuple[str, str, str], set[str]] = {}
        for job in self.jobs.values():
            run = (job.identity or {}).get("run")
            if job.slot and run and job.stage and job.stage not in stages.START_STAGES:
                found.setdefault(job.slot, set()).add(run)
        return {slot: frozenset(runs) for slot, runs in found.items()}

    @functools.cached_property
    def running_on_node(self) -> Mapping[tuple[str, str], Mapping[str, str]]:
        """Running Jobs (name -> stage) by (owner_key, node), from their labels, whatever
        package or run they belong to now."""
        found: dict[tuple[str, str], dict[str, str]] = {}
        for job in self.jobs.values():
            if job.outcome == "running" and job.slot is not None:
                skyhook, _, node = job.slot
                found.setdefault((skyhook, node), {})[job.name] = job.stage
        return found


@dataclass
class SkyhookRound:
    """What one Skyhook's round decided, for metrics and the bench."""

    name: str
    status: str
    # What each node shows (paused, disabled, waiting for an earlier Skyhook...).
    node_status: dict[str, str] = field(default_factory=dict)
    # The nodes on which every package is done (whatever they show).
    complete_nodes: set[str] = field(default_factory=set)
    # The DeploymentPolicy it rolls out under (api.LEGACY_POLICY without one).
    policy: str = ""
    compartments: list[CompartmentPlan] = field(default_factory=list)
    package_states: dict[tuple[str, str, str], int] = field(default_factory=dict)
    package_stages: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # Stage retries by (package, version), summed over nodes.
    package_restarts: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class RoundPlan:
    actions: list[SkyhookAction] = field(default_factory=list)
    decisions: list[SkyhookDecisionNote] = field(default_factory=list)
    rounds: list[SkyhookRound] = field(default_factory=list)
    # NodeMaintenances an interrupt still needs (or may need: the node could not be read).
    kept_maintenances: set[str] = field(default_factory=set)


# --- node status -----------------------------------------------------------------------------


# Each kept package by name with its config hash, and the names kept.
Wanted = tuple[dict[str, tuple[Package, str]], frozenset[str]]


def wanted_versions(skyhook: Skyhook) -> Wanted:
    """What a complete node has: every package but those being uninstalled
    (`uninstall.apply`), which a complete node no longer has (upstream's IsComplete)."""
    kept = [p for p in skyhook.packages if not removing(skyhook, p)]
    return {p.name: (p, config_hash(p)) for p in kept}, frozenset(p.name for p in kept)


def node_status(
    skyhook: Skyhook,
    entries: Mapping[str, PackageState],
    readable: bool,
    wanted_names: Wanted | None = None,
) -> str:
    """complete: every package complete at its version and config (an entry written before
    configs were recorded passes) and nothing left to uninstall."""
    if not readable:
        return UNKNOWN
    wanted, names = wanted_names or wanted_versions(skyhook)
    if any(e.retained for e in entries.values()):
        # Markers (a NodeWright's packages left without uninstall) are not tracked.
        entries = {k: e for k, e in entries.items() if not e.retained}
    if not entries:
        return COMPLETE if not wanted else WAITING
    in_progress = False
    for present in entries.values():
        if present.state == stages.ERRORING and (
            present.name not in wanted or wanted[present.name][0].version == present.version
        ):
            # A stage failed at the version the spec still wants (or of a removed package);
            # one that failed at another version is work again, so a fixed version resumes.
            return ERRORING
        if present.state == stages.IN_PROGRESS:
            in_progress = True
    if not in_progress and entries.keys() <= names:
        done = True
        for name, (package, config) in wanted.items():
            entry = entries.get(name)
            if (
                entry is None
                or entry.version != package.version
                or entry.state != stages.COMPLETE
                or (entry.config and entry.config != config)
                or stages.interrupt_added(package, entry)
            ):
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
    # Packages whose downgrade waits for an uninstall first (a NodeWright's).
    held: tuple[str, ...] = ()


def merge_interrupts(due: Sequence[Package]) -> tuple[str, Interrupt]:
    """The one interrupt that serves every package in `due` (each has an interrupt), and the
    package that runs it (stages.merge_interrupt_list)."""
    owned: list[tuple[str, Interrupt]] = []
    for package in due:
        if package.interrupt is not None:
            owned.append((package.name, package.interrupt))
    return merge_interrupt_list(owned)


def run_marker(
    skyhook: Skyhook,
    node: NodeView | None,
    package: Package | None = None,
    used_runs: Mapping[tuple[str, str, str], frozenset[str]] | None = None,
) -> str:
    """The run a package starting on the node now belongs to. Made of what is durable and
    the same for a controller deciding again on the same state: the Skyhook's uid and
    generation, the node's uid, the run the Skyhook's own status last recorded for the
    package on the node (status.nodeState), and the runs its Jobs show were used
    (`World.used_runs`). Never the node's resourceVersion: a restarted controller whose
    node patch was lost, on a node something else changed since, finds the Jobs it made. A
    start the status records as under way (at apply or upgrade, in progress: its node
    patch may have been lost) keeps that run; after any other recorded run (one past its
    start, failed or complete), a reset node starts a new one; a re-added package or a
    rolled-back version comes with a new generation, hence a new run whose stages run
    again. The status keeps a reset node's record until it starts again (`_plan_skyhook`),
    whatever holds it back meanwhile (paused, disabled, a later batch, a drain not Ready).

    A reset node whose status no longer records it (the status written anew) has no
    recorded run left, so the run made of the rest is its first one again; a Job of that
    run past its first stage shows the run went on and so was reset since (a start whose
    node patch was lost leaves only its apply or upgrade Job): the next run in a chain no
    Job has used is taken instead, so the Complete Jobs of the earlier run (kept a day by
    their TTL) prove nothing."""
    if node is None:
        return ""
    run = _derived_run(skyhook, node, package)
    used = (used_runs or {}).get((skyhook.owner_key, package.name, node.name)) if package else None
    while used and run in used:
        run = hashlib.sha256(f"{run}\x1freset".encode()).hexdigest()[:12]
    return run


def _derived_run(skyhook: Skyhook, node: NodeView, package: Package | None) -> str:
    """`run_marker`'s run before the used runs are passed over."""
    previous = ""
    recorded = _recorded_entry(skyhook, node.name, package.name) if package is not None else None
    if recorded is not None and package is not None:
        version, stage, state, run = recorded
        # Only a start under way may be one whose node patch was lost: the controller moves
        # an entry on (a stage ended, a failure) only from what the node's annotation says,
        # so a node without the entry the status records past that is a reset node.
        under_way = stage in stages.START_STAGES and state == stages.IN_PROGRESS
        if run and version == package.version and under_way:
            return run
        previous = run
    elif package is not None:
        # Never recorded on the node (a first start), or no longer (a package that waited
        # for its dependsOn after a reset: the status was rewritten from the reset node's
        # state since): the runs the node's packages are in now, which a reset renewed.
        runs = _recorded_runs(skyhook, node.name)
        previous = "node:" + ",".join(runs) if runs else ""
    text = "\x1f".join((skyhook.uid, str(skyhook.generation), node.uid, previous))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _recorded_state(skyhook: Skyhook, node: str) -> Mapping[str, Any]:
    """The node's entries as the Skyhook's status last recorded them (status.nodeState)."""
    states = skyhook.status.get("nodeState")
    recorded = states.get(node) if isinstance(states, Mapping) else None
    return recorded if isinstance(recorded, Mapping) else {}


def _recorded_runs(skyhook: Skyhook, node: str) -> list[str]:
    """Every run the Skyhook's status last recorded for the node's packages, sorted."""
    recorded = _recorded_state(skyhook, node)
    return sorted(
        {
            str(value.get("run") or "")
            for value in recorded.values()
            if isinstance(value, Mapping) and value.get("run")
        }
    )


def _recorded_entry(skyhook: Skyhook, node: str, package: str) -> tuple[str, str, str, str] | None:
    """(version, stage, state, run) of the package on the node as the Skyhook's status last
    recorded it (status.nodeState), or None."""
    for value in _recorded_state(skyhook, node).values():
        if isinstance(value, Mapping) and value.get("name") == package:
            return (
                str(value.get("version") or ""),
                str(value.get("stage") or ""),
                str(value.get("state") or ""),
                str(value.get("run") or ""),
            )
    return None


def removing(skyhook: Skyhook, package: Package) -> bool:
    """Whether the package is to be uninstalled from every node: explicitly (uninstall.apply)
    or by the finalizer (uninstall.enabled on a deleted object), as nodewright's
    HandleUninstallRequests."""
    return package.uninstalling or (skyhook.deleting and package.uninstall_enabled)


WorkMode = Literal["install", "uninstall", "removed"]


@dataclass
class UninstallRoutes:
    """How each package of one node goes this round (nodewright's explicit uninstall)."""

    # (package, entry name, mode) in the order to step them: `install` the stage pipeline
    # (step_package), `uninstall` the explicit uninstall cycle (step_uninstall, with the
    # spec's package at the entry's version or None), `removed` a package gone from a
    # Skyhook's spec (step_package without package: the legacy uninstall).
    work: list[tuple[Package | None, str, WorkMode]] = field(default_factory=list)
    # Entries whose uninstall was cancelled (uninstall.apply turned off): back at apply.
    cancelled: list[str] = field(default_factory=list)
    # Entries left on the node as markers (a NodeWright's, without uninstall).
    retained: list[str] = field(default_factory=list)
    # Packages whose downgrade waits for an uninstall first (a NodeWright's, enabled).
    held: list[str] = field(default_factory=list)


def _uninstall_routes(
    skyhook: Skyhook, entries: Mapping[str, PackageState], order: Sequence[Package]
) -> UninstallRoutes:
    """Route every package of the node (pure). An uninstall starts only from a complete
    install (an install under way finishes first; an erroring one never starts it, as
    nodewright); an uninstall-interrupt always runs to its end; uninstall.apply turned off
    while the uninstall stage runs or failed cancels it; a deleted object works only on what
    its finalizer waits for. A NodeWright's package removed from the spec without
    uninstall.enabled, or downgraded so, leaves its entry as a marker (nodewright's D2); one
    removed with it enabled is uninstalled as the finalizer would (nodewright's webhook
    refuses that removal; we have none); one downgraded with it enabled but not applied
    keeps its installed version (the webhook refuses it too)."""
    routes = UninstallRoutes()
    nodewright = skyhook.names == NODEWRIGHT
    spec = {p.name for p in order}
    for package in order:
        entry = entries.get(package.name)
        gone = removing(skyhook, package)
        if entry is None:
            if not gone and not skyhook.deleting:
                routes.work.append((package, package.name, "install"))
            continue
        same = entry.version == package.version
        declared = package if same else None
        if entry.stage == "uninstall-interrupt":
            routes.work.append((declared, package.name, "uninstall"))
            continue
        if entry.stage == "uninstall" and (same or nodewright):
            if gone:
                routes.work.append((declared, package.name, "uninstall"))
            else:
                routes.cancelled.append(package.name)
                if not skyhook.deleting:
                    routes.work.append((package, package.name, "install"))
            continue
        if gone and entry.stage != "uninstall":
            if entry.state == stages.COMPLETE:
                routes.work.append((declared, package.name, "uninstall"))
            else:
                routes.work.append((package, package.name, "install"))
            continue
        if skyhook.deleting:
            continue
        if nodewright and not same and stages.is_downgrade(entry.version, package.version):
            if entry.stage != "uninstall" and not package.uninstall_enabled:
                routes.retained.append(package.name)
            elif entry.stage != "uninstall":
                routes.held.append(package.name)
                continue
        routes.work.append((package, package.name, "install"))
    for name in sorted(entries):
        entry = entries[name]
        if name in spec or entry.retained:
            continue
        if stages.in_uninstall_cycle(entry) and (nodewright or entry.stage != "uninstall"):
            routes.work.append((None, name, "uninstall"))
        elif nodewright and entry.uninstall_enabled:
            # Deleted or not: the finalizer waits for it as for an enabled package still
            # in the spec (pending_uninstall), where upstream's webhook would have kept it.
            routes.work.append((None, name, "uninstall"))
        elif skyhook.deleting:
            continue
        elif not nodewright:
            routes.work.append((None, name, "removed"))
        else:
            routes.retained.append(name)
    return routes


def _blocked_dependencies(skyhook: Skyhook, entries: Mapping[str, PackageState]) -> frozenset[str]:
    """Packages being uninstalled from the node (or to be): a package depending on one of
    them starts no stage (nodewright: it left the completed set); nothing cascades."""
    gone = {p.name for p in skyhook.packages if removing(skyhook, p)}
    gone |= {e.name for e in entries.values() if stages.in_uninstall_cycle(e) and not e.retained}
    return frozenset(gone)


def _interrupts(package: Package | None, entry: PackageState) -> bool:
    """Whether this stage of the package belongs to a run that interrupts the node (its own
    interrupt, or for a config re-run a configInterrupt of a changed key)."""
    return (
        package is not None
        and entry.version == package.version
        and entry.stage not in stages.UNINSTALL_STAGES
        and effective_interrupt(package, entry) is not None
    )


def _drains_to_uninstall(package: Package | None, entry: PackageState) -> bool:
    """Whether the entry's uninstall Job waits for a drained node: its package, as the spec
    declares it at the entry's version, has an interrupt (upstream's ProcessInterrupt
    cordons and drains before the uninstall pod of such a package, as before its apply);
    the node then stays drained through the uninstall-interrupt that follows."""
    return (
        entry.stage == "uninstall"
        and package is not None
        and package.version == entry.version
        and package.interrupt is not None
    )


def _job_name_of(skyhook: Skyhook, node: str, entry: PackageState) -> str:
    """The name of the Job that runs `entry`'s stage on `node` (its run and config in it)."""
    return job_name(
        skyhook.name,
        entry.name,
        entry.version,
        entry.stage,
        node,
        entry_identity(entry.run, entry.config),
    )


def _records_stage_end(entry: PackageState | None, job: JobFacts | None, new: PackageState) -> bool:
    """Whether `new` only records that the Job of `entry`'s current stage completed (the
    same run, version and config going on to its next stage)."""
    return (
        entry is not None
        and job is not None
        and job.outcome == "complete"
        and entry.state != stages.COMPLETE
        and new.version == entry.version
        and new.config == entry.config
        and new.run == entry.run
        and new.stage not in (entry.stage, "uninstall")
    )


@dataclass
class _NodeRound:
    """One node's packages stepped in one round: what every package's step reads and adds to."""

    skyhook: Skyhook
    node: str
    world: World
    node_view: NodeView | None
    result: NodeStep
    may_start: bool
    # The node's maintenance request is Ready: it is cordoned and drained.
    drained: bool
    # Packages whose dependency is being uninstalled: they start nothing.
    held_back: frozenset[str]
    now: float
    pull_grace_seconds: float
    # A package of a serial Skyhook is under way.
    busy: bool = False
    # Interrupt stages due this round, decided together once every package is looked at.
    due: list[tuple[Package, PackageState]] = field(default_factory=list)
    skipped: list[Package] = field(default_factory=list)
    # Jobs made on the node this round: name -> stage.
    made: dict[str, str] = field(default_factory=dict)

    @property
    def node_uid(self) -> str:
        return self.node_view.uid if self.node_view is not None else ""

    def note(
        self,
        kind: Literal["stage", "fail-job", "maintenance"],
        message: str,
        reason: str,
        **about: str,
    ) -> None:
        self.result.decisions.append(
            SkyhookDecisionNote(
                self.skyhook.name,
                kind,
                message,
                reason=reason,
                node=self.node,
                object_kind=self.skyhook.names.kind,
                **about,
            )
        )

    def create(self, package: Package | None, new: PackageState) -> None:
        """The Job of `new`'s stage, unless it exists or must wait for another Job."""
        skyhook, node, world = self.skyhook, self.node, self.world
        target = _job_name_of(skyhook, node, new)
        if target in world.jobs:
            return
        # A Job of an earlier run of this package still runs on the node: never a second pod
        # beside it on the same host paths; this one starts once it has ended.
        others = world.running_slots.get((skyhook.owner_key, new.name, node), frozenset())
        if others - {target}:
            return
        # One interrupt at a time, alone on its node (upstream's Interrupt waits for every
        # package pod of the Skyhook on the node to be gone): an interrupt Job starts only
        # once no other Job of this Skyhook runs there, and while one runs nothing else
        # starts there, whatever package (removed, rolled back) it was for. The Jobs made
        # this round count as running.
        beside = {
            other: stage
            for other, stage in world.running_on_node.get((skyhook.owner_key, node), {}).items()
            if other != target
        }
        beside.update(self.made)
        if beside and (
            new.stage in stages.INTERRUPT_STAGES
            or not stages.INTERRUPT_STAGES.isdisjoint(beside.values())
        ):
            return
        if package is None or package.version != new.version:
            package = _uninstall_package(new)
        elif new.stage == "post-interrupt":
            package = replace(package, interrupt=effective_interrupt(package, new))
        # The ConfigMaps its pod mounts first: a pod whose ConfigMap is missing does not start.
        if self.node_view is not None:
            self.result.actions.append(WriteNodeMetadata(skyhook, self.node_view))
        if package.config_map:
            self.result.actions.append(WritePackageConfig(skyhook, package))
        self.result.actions.append(
            CreateJob(
                skyhook,
                package,
                new.stage,
                node,
                target,
                new.restarts,
                run=new.run,
                config=new.config,
                node_uid=self.node_uid,
            )
        )
        self.made[target] = new.stage


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
    node_view: NodeView | None = None,
) -> NodeStep:
    """Advance every package of one node; with `may_start` False, Job endings are recorded
    but no new Job or maintenance request is made. In phases: the uninstall routes' edits,
    each package's step, the node's one interrupt, then its drain request."""
    result = NodeStep(dict(entries), [], [])
    maintenance = world.request_of(skyhook, node)
    maintenance_phase = world.maintenances.get(maintenance)
    routes = _uninstall_routes(
        skyhook, entries, order if order is not None else _package_order(skyhook)
    )
    _apply_routes(skyhook, node, routes, result, world)
    node_round = _NodeRound(
        skyhook,
        node,
        world,
        node_view,
        result,
        may_start=may_start,
        drained=maintenance_phase == MAINTENANCE_READY,
        held_back=_blocked_dependencies(skyhook, result.entries),
        now=now,
        pull_grace_seconds=pull_grace_seconds,
    )
    for package, name, mode in routes.work:
        _step_on_node(node_round, package, name, mode)
    _decide_interrupts(
        skyhook,
        node,
        result,
        node_round.due,
        node_round.skipped,
        node_round.drained and may_start,
        node_round.create,
    )
    _request_drain(node_round, routes, maintenance, maintenance_phase)
    result.held = tuple(routes.held)
    return result


def _step_on_node(node_round: _NodeRound, package: Package | None, name: str, mode: str) -> None:
    """One package on the node: its Job read, its stage stepped, the next stage's Job made
    (or left for the node's interrupt), and the outcome recorded."""
    skyhook, node, result = node_round.skyhook, node_round.node, node_round.result
    entry = result.entries.get(name)
    if entry is not None and (rerun := stages.rerun_by_hand(entry)) is not entry:
        # Set back to a stage by someone else (package rerun --stage): a new run there.
        node_round.note(
            "stage",
            f"{name} on {node}: set back to {entry.stage} ({entry.state}): run again",
            "rerun",
            package=name,
            stage=entry.stage,
        )
        entry = result.entries[name] = rerun
    # A package depending on one being uninstalled starts nothing (its Job's end is
    # still recorded); one not started yet waits below.
    blocked = (
        mode == "install"
        and package is not None
        and any(dep in node_round.held_back for dep, _ in package.depends_on)
    )
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
        if not_started and (pending or blocked or (skyhook.serial and node_round.busy)):
            return  # waits for its dependencies (or, serial, the package before it)
    job = _job_proving(node_round, entry)
    outcome = _outcome_of(node_round, package, entry, job, mode)
    new = outcome.entry
    if outcome.run_job and new is not None:
        new = _start_stage(node_round, package, entry, job, new, mode, blocked)
    _record_step(node_round, package, name, entry, job, new, outcome)


def _job_proving(node_round: _NodeRound, entry: PackageState | None) -> JobFacts | None:
    """The Job of `entry`'s stage, if it ran what the entry says (a Job recording another
    identity counts for nothing)."""
    if entry is None:
        return None
    skyhook = node_round.skyhook
    found = node_round.world.jobs.get(_job_name_of(skyhook, node_round.node, entry))
    expected = job_identity(
        skyhook.uid, node_round.node_uid, entry.version, entry.run, entry.config
    )
    if found is not None and (found.identity is None or dict(found.identity) == expected):
        return found
    return None


def _outcome_of(
    node_round: _NodeRound,
    package: Package | None,
    entry: PackageState | None,
    job: JobFacts | None,
    mode: str,
) -> StepOutcome:
    """What the package's stage on the node comes to: skipped at a merged interrupt, an
    uninstall step, or an install step (stages.step_package)."""
    config = config_hash(package) if package is not None else ""
    if (
        entry is not None
        and entry.state == stages.SKIPPED
        and package is not None
        and entry.version == package.version
        and (not entry.config or entry.config == config)
    ):
        node_round.skipped.append(package)
        return StepOutcome(entry)
    if mode == "uninstall" and entry is not None:
        return stages.step_uninstall(
            package,
            entry,
            job,
            now=node_round.now,
            pull_grace_seconds=node_round.pull_grace_seconds,
        )
    starts = package is not None and (entry is None or entry.version != package.version)
    return step_package(
        package,
        entry,
        job,
        now=node_round.now,
        pull_grace_seconds=node_round.pull_grace_seconds,
        run=run_marker(
            node_round.skyhook, node_round.node_view, package, node_round.world.used_runs
        )
        if starts
        else "",
        config=config,
    )


def _start_stage(
    node_round: _NodeRound,
    package: Package | None,
    entry: PackageState | None,
    job: JobFacts | None,
    new: PackageState,
    mode: str,
    blocked: bool,
) -> PackageState | None:
    """Make the Job of the stage `new` moves to, where the node may start it; the entry to
    record (the old one when nothing may start and `new` records more than a stage's end)."""
    if not (node_round.may_start and not blocked):
        # Nothing new starts: only a stage that just ended is recorded (its next stage's Job
        # is made on resume); a start, a retry, a version or config change waits entirely,
        # so the node does not enter a run outside its batch.
        return new if _records_stage_end(entry, job, new) else entry
    drained = node_round.drained
    if new.stage == "interrupt" and package is not None and _interrupts(package, new):
        # One interrupt per node: decided after every package, with what this run needs.
        node_round.due.append((replace(package, interrupt=effective_interrupt(package, new)), new))
    elif _interrupts(package, new) and not drained:
        pass  # drain before apply: its node's maintenance request is not Ready yet
    elif new.stage == "uninstall-interrupt":
        if drained:
            node_round.create(_uninstall_job_package(package, new), new)
    elif mode == "uninstall":
        if drained or not _drains_to_uninstall(package, new):
            node_round.create(_uninstall_job_package(package, new), new)
    else:
        node_round.create(package, new)
    return new


def _record_step(
    node_round: _NodeRound,
    package: Package | None,
    name: str,
    entry: PackageState | None,
    job: JobFacts | None,
    new: PackageState | None,
    outcome: StepOutcome,
) -> None:
    """Keep a failed Job for its logs, fail one whose image never pulls, and record the
    package's new entry and what happened."""
    skyhook, node, result = node_round.skyhook, node_round.node, node_round.result
    if job is not None and job.outcome == "failed" and job.ttl_seconds is not None:
        attempt = entry.restarts if entry is not None else 0
        result.actions.append(KeepFailedJob(skyhook.name, job.name, attempt, skyhook.names))
    if outcome.fail_job and job is not None and new is not None:
        result.actions.append(FailJob(skyhook.name, job.name, new.message, skyhook.names))
        node_round.note(
            "fail-job", new.message, "image-not-pullable", package=name, stage=new.stage
        )
    if new is not None and package is not None and skyhook.names == NODEWRIGHT:
        new = _with_uninstall_flag(new, package)
    if new is None:
        result.entries.pop(name, None)
    else:
        result.entries[name] = new
        if new.state != stages.COMPLETE:
            node_round.busy = True
    if outcome.event and new is not entry:
        shown = new or entry
        node_round.note(
            "stage",
            f"{name} on {node}: {outcome.event}",
            outcome.event.split(":")[0].replace(" ", "-"),
            package=name,
            stage=shown.stage if shown is not None else "",
        )


def _request_drain(
    node_round: _NodeRound,
    routes: UninstallRoutes,
    maintenance: str,
    maintenance_phase: str | None,
) -> None:
    """The node is cordoned and drained from before apply until post-interrupt is done: its
    NodeMaintenance is requested while an interrupting package is under way, and kept while
    one is not complete (a failed stage keeps the node out of service, fail closed, until
    the stage is retried or the package changes)."""
    skyhook, node, result = node_round.skyhook, node_round.node, node_round.result
    by_name = {p.name: p for p, _, mode in routes.work if p is not None and mode == "install"}
    uninstalling = {name: p for p, name, mode in routes.work if mode == "uninstall"}
    needs_maintenance = False
    interrupts: list[str] = []
    for name, new in result.entries.items():
        uninstall_interrupt = not new.retained and (
            new.stage == "uninstall-interrupt" or _drains_to_uninstall(uninstalling.get(name), new)
        )
        if (uninstall_interrupt or _interrupts(by_name.get(name), new)) and (
            new.state != stages.COMPLETE
        ):
            result.maintenance_needed = True
            if new.state in (stages.IN_PROGRESS, stages.SKIPPED):
                needs_maintenance = True
                interrupts.append(new.key)
    if needs_maintenance and node_round.may_start and maintenance_phase is None:
        result.actions.append(
            CreateMaintenance(skyhook, node, maintenance, ",".join(sorted(interrupts)))
        )
        node_round.note(
            "maintenance",
            f"NodeMaintenance {maintenance} requested for the interrupt of "
            f"{', '.join(sorted(interrupts))} on {node}",
            "requested",
        )


def _apply_routes(
    skyhook: Skyhook, node: str, routes: UninstallRoutes, result: NodeStep, world: World
) -> None:
    """The entry edits the routes decide before any package steps: a cancelled uninstall
    goes back to apply (its running uninstall Job ended through its deadline, so it cannot
    finish the uninstall behind the new run: nodewright's known gap), a marker moves to its
    `name|version` key."""
    for name in routes.cancelled:
        entry = result.entries[name]
        running = world.jobs.get(_job_name_of(skyhook, node, entry))
        result.entries[name] = stages.cancel_uninstall(entry)
        message = f"{name} on {node}: uninstall cancelled (uninstall.apply off): back to apply"
        if running is not None and running.outcome == "running":
            result.actions.append(FailJob(skyhook.name, running.name, message, skyhook.names))
        result.decisions.append(
            SkyhookDecisionNote(
                skyhook.name,
                "stage",
                message,
                reason="uninstall-cancelled",
                node=node,
                package=name,
                stage="apply",
                object_kind=skyhook.names.kind,
            )
        )
    for name in routes.retained:
        entry = result.entries.pop(name)
        marker = stages.retain(entry)
        result.entries[marker.key] = marker
        result.decisions.append(
            SkyhookDecisionNote(
                skyhook.name,
                "stage",
                f"{name} {entry.version} on {node}: left as a marker, no uninstall "
                "(uninstall.enabled is false)",
                reason="retained",
                node=node,
                package=name,
                stage=entry.stage,
                object_kind=skyhook.names.kind,
            )
        )


def _uninstall_job_package(package: Package | None, entry: PackageState) -> Package:
    """What an uninstall cycle's Job runs: the package's configMap and env (its scripts may
    need them, as nodewright's uninstall pod), with the cycle's interrupt for its
    uninstall-interrupt and none otherwise."""
    base = package if package is not None else _uninstall_package(entry)
    if entry.stage == "uninstall-interrupt":
        return replace(base, interrupt=stages.uninstall_interrupt_of(package, entry))
    return replace(base, interrupt=None, config_interrupts=())


def _with_uninstall_flag(entry: PackageState, package: Package) -> PackageState:
    """A NodeWright's entry records its package's uninstall.enabled (at its version), so a
    package later removed from the spec is uninstalled only if it was enabled."""
    if entry.version != package.version or entry.uninstall_enabled == package.uninstall_enabled:
        return entry
    return replace(entry, uninstall_enabled=package.uninstall_enabled)


def _decide_interrupts(
    skyhook: Skyhook,
    node: str,
    result: NodeStep,
    due: Sequence[tuple[Package, PackageState]],
    skipped: Sequence[Package],
    may_run: bool,
    create: Callable[[Package | None, PackageState], None],
) -> None:
    """One interrupt for the node: once no interrupting package is still before its
    interrupt (nor another interrupt under way), the due ones merge into one Job run by the
    winner; the others are `skipped` and go on to post-interrupt once the winner's
    interrupt is done. Jobs start only when `may_run`: the node drained and nothing paused
    (a paused skipped package is recorded at post-interrupt, its Job made on resume)."""
    by_name = {p.name: p for p in skyhook.packages}
    under_way = [
        e
        for e in result.entries.values()
        if _interrupts(by_name.get(e.name), e)
        and e.state == stages.IN_PROGRESS
        and e.name not in {p.name for p, _ in due}
        and e.stage in ("apply", "upgrade", "config", "interrupt")
    ]
    if due and not under_way and may_run:
        winner, merged = merge_interrupts([p for p, _ in due])
        for package, entry in due:
            if package.name == winner:
                create(replace(package, interrupt=merged), entry)
            else:
                result.entries[package.name] = replace(
                    entry, state=stages.SKIPPED, message=f"interrupt merged into {winner}"
                )
                result.decisions.append(
                    SkyhookDecisionNote(
                        skyhook.name,
                        "stage",
                        f"{package.name} on {node}: interrupt skipped: merged into {winner}'s "
                        f"{merged.type}",
                        reason="interrupt-skipped",
                        node=node,
                        package=package.name,
                        stage="interrupt",
                        object_kind=skyhook.names.kind,
                    )
                )
    for package in skipped:
        entry = result.entries[package.name]
        winner = entry.message.removeprefix("interrupt merged into ")
        ran = result.entries.get(winner)
        if ran is not None and ran.stage == "interrupt" and ran.state != stages.COMPLETE:
            continue  # the merged interrupt is not done yet
        if ran is not None and (ran.stage == "post-interrupt" or ran.state == stages.COMPLETE):
            following = replace(entry, stage="post-interrupt", state=stages.IN_PROGRESS, message="")
            result.entries[package.name] = following
            if may_run:
                create(package, following)
        else:
            # The winner is gone or went back: this package's interrupt is due again.
            result.entries[package.name] = replace(entry, state=stages.IN_PROGRESS, message="")


def _uninstall_package(entry: PackageState) -> Package:
    return Package(name=entry.name, version=entry.version, image=entry.image)


# --- one Skyhook -----------------------------------------------------------------------------


def _blocked_by_priority(
    skyhook: Skyhook,
    node: str,
    earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]],
    world: World,
) -> str:
    """The earlier Skyhook this node waits for, or ''. A disabled one is passed over, but
    not while a Job of it (its reboot) still runs on the node."""
    for other, statuses, all_complete in earlier:
        if other.disabled:
            if world.running_on_node.get((other.owner_key, node)):
                return other.name
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


def stamp_conditions(
    conditions: Sequence[Mapping[str, Any]],
    previous: object,
    generation: int,
    now: float,
) -> list[dict[str, Any]]:
    """metav1.Conditions: each with observedGeneration and a lastTransitionTime that moves
    only when its status does (meta.SetStatusCondition), kept from the previous status
    otherwise, so an unchanged status writes nothing."""
    before: dict[str, Mapping[str, Any]] = {}
    for old in previous if isinstance(previous, list) else ():
        if isinstance(old, Mapping) and isinstance(old.get("type"), str):
            before[old["type"]] = old
    stamped: list[dict[str, Any]] = []
    for condition in conditions:
        old = before.get(str(condition["type"]))
        since = old.get("lastTransitionTime") if old is not None else None
        if old is None or old.get("status") != condition["status"] or not since:
            since = rfc3339(now)
        stamped.append({**condition, "observedGeneration": generation, "lastTransitionTime": since})
    return stamped


# How many nodes a condition's message names before it gives a count instead (upstream's
# ReadyConditionNodeListLimit).
CONDITION_NODE_LIST_LIMIT = 10


def _nodes_condition(
    kind: str, nodes: Sequence[str], named: str, counted: str, clear: str
) -> dict[str, Any]:
    """TaintNotTolerable / NodesIgnored: True naming the nodes (a count past the limit)."""
    if not nodes:
        return _condition(kind, False, kind, clear)
    if len(nodes) > CONDITION_NODE_LIST_LIMIT:
        return _condition(kind, True, kind, f"{len(nodes)} {counted}")
    return _condition(kind, True, kind, f"Node [{', '.join(nodes)}] {named}")


# upstream's maxMalformedNodesListed and truncateNodeName: NodeStateMalformed names at most
# five nodes, each cut to ten characters, so the message stays short on a large cluster.
MALFORMED_NODE_LIST_LIMIT = 5
MALFORMED_NODE_NAME_LIMIT = 10


def node_state_malformed(nodes: Sequence[str]) -> dict[str, Any] | None:
    """upstream's UpdateNodeStateMalformedCondition: `NodeStateMalformed` (ParseError) names
    the target nodes whose nodeState annotation cannot be read (sorted, so the message does not
    churn: the count, then at most five names, then "and N more"); None, the condition gone,
    once every node reads. Stage-agnostic: such a node is left alone whatever is due."""
    if not nodes:
        return None
    ordered = sorted(nodes)
    listed = ", ".join(
        name if len(name) <= MALFORMED_NODE_NAME_LIMIT else name[:MALFORMED_NODE_NAME_LIMIT] + "..."
        for name in ordered[:MALFORMED_NODE_LIST_LIMIT]
    )
    if len(ordered) > MALFORMED_NODE_LIST_LIMIT:
        listed += f" and {len(ordered) - MALFORMED_NODE_LIST_LIMIT} more"
    return _condition(
        "NodeStateMalformed",
        True,
        "ParseError",
        f"nodeState annotation cannot be parsed on {len(ordered)} node(s): {listed}",
    )


def collect_node_status(statuses: Sequence[str]) -> str:
    """upstream's CollectNodeStatus: complete when every node is; in_progress while any node
    is; otherwise the status every remaining (not complete) node shares, or unknown for a
    mix (say erroring beside waiting nodes of a stopped rollout)."""
    remaining = [s for s in statuses if s != COMPLETE]
    if not remaining:
        return COMPLETE
    if IN_PROGRESS in remaining:
        return IN_PROGRESS
    first = remaining[0]
    if first in (ERRORING, BLOCKED, UNKNOWN, WAITING) and all(s == first for s in remaining):
        return first
    return UNKNOWN


def overall_status(
    skyhook: Skyhook,
    statuses: Sequence[str],
    *,
    policy_missing: bool = False,
    waits_for_earlier: bool = False,
) -> str:
    """The Skyhook's status from its nodes' (upstream's IntrospectSkyhook): a Skyhook not
    complete is disabled, paused, blocked (its DeploymentPolicy is missing) or waiting (an
    earlier `sequencing: all` Skyhook is not complete) before its nodes speak; a missing
    policy blocks even a complete one; a paused one is paused whatever its nodes
    (UpdateSkyhookPauseStatus)."""
    collected = collect_node_status(statuses)
    if skyhook.paused:
        return PAUSED
    if collected == COMPLETE:
        return BLOCKED if policy_missing else COMPLETE
    if skyhook.disabled:
        return DISABLED
    if policy_missing:
        return BLOCKED
    if waits_for_earlier:
        return WAITING
    return collected


def _waits_for_earlier(earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]]) -> bool:
    """upstream's isBlockedByGlobalPredecessor: an earlier, not disabled, `sequencing: all`
    Skyhook is not complete on every node."""
    return any(
        other.sequencing == "all" and not other.disabled and not all_complete
        for other, _, all_complete in earlier
    )


def _ignored(node: NodeView, names: SkyhookNames) -> bool:
    return node.labels.get(names.ignore_label, "").lower() == "true"


def picker_tolerations(skyhook: Skyhook, world: World) -> list[Mapping[str, Any]]:
    """What upstream's SelectNodes checks a node's taints against: a cordon, the Skyhook's
    additionalTolerations, and the runtime-required taints for a runtimeRequired Skyhook."""
    found: list[Mapping[str, Any]] = [
        {"key": TAINT_UNSCHEDULABLE, "operator": "Exists", "effect": NO_SCHEDULE},
        *skyhook.additional_tolerations,
    ]
    if skyhook.runtime_required:
        # Every kind's: a node new to a Skyhook and a NodeWright carries both taints, and each
        # runtimeRequired object must work there for its own taint to come off.
        found.extend(world.runtime_toleration_of(names) for names in FLAVORS)
    return found


def _tolerates_all(tolerations: Sequence[Mapping[str, Any]], node: NodeView) -> bool:
    """upstream's CheckTaintToleration: every taint, whatever its effect, is tolerated."""
    return all(tolerated(tolerations, taint) for taint in node.taints)


def _versions_changed(skyhook: Skyhook) -> bool:
    """A package kept in the spec at another version than the status last listed
    (status.packageList): upstream's HandleVersionChange resets the batch state then."""
    listed = skyhook.status.get("packageList")
    if not isinstance(listed, str) or not listed:
        return False
    before = dict(item.partition(":")[::2] for item in listed.split(",") if item)
    return any(
        package.name in before and before[package.name] != package.version
        for package in skyhook.packages
    )


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
    # One order over both kinds (a NodeWright is a renamed Skyhook, and a node serves one
    # rollout at a time whichever kind asks): priority, then name, then the kind, a Skyhook
    # before a NodeWright of its name (one being deleted beside the other; not by owner_key,
    # whose group prefix sorts a NodeWright first past "n"), so the order never depends on
    # how the objects were listed.
    ordered = sorted(world.skyhooks, key=lambda s: (s.priority, s.name, FLAVORS.index(s.names)))
    earlier: list[tuple[Skyhook, Mapping[str, str], bool]] = []
    for names in FLAVORS:
        # A policy is in use by the objects of its own group's kind only.
        in_use = {s.deployment_policy for s in world.skyhooks if s.names == names}
        for policy in world.policies_of(names).values():
            has = names.policy_finalizer in policy.finalizers
            if policy.name in in_use and not has and not policy.deleting:
                plan.actions.append(SetPolicyFinalizer(policy, True))
            elif policy.name not in in_use and has:
                plan.actions.append(SetPolicyFinalizer(policy, False))
    tainting: set[str] = set()
    for names in FLAVORS:
        new_nodes = _auto_taint_nodes(world, [s for s in ordered if s.names == names], names)
        # The taint lands first (upstream's HandleAutoTaint ends its reconcile): nothing else
        # is written on those nodes this round, so they stay new until it has landed. One
        # taint per node and round: a node new to both kinds gets the NodeWright's next round.
        taint = world.runtime_taint_of(names)
        for new_node in new_nodes:
            if new_node.name not in tainting:
                plan.actions.append(SetRuntimeTaint(new_node, taint, True, names))
                tainting.add(new_node.name)
    if tainting:
        world = replace(world, settling=world.settling | tainting)
    planned: list[tuple[Skyhook, SkyhookRound]] = []
    for skyhook in ordered:
        if skyhook.deleting:
            if not _plan_finalizer_uninstall(
                skyhook, world, earlier, plan, now, pull_grace_seconds
            ):
                _plan_deletion(skyhook, world, plan)
            continue
        if skyhook.names.finalizer not in skyhook.finalizers:
            # Nothing is written on a node before the finalizer guarantees its removal.
            plan.actions.append(SetSkyhookFinalizer(skyhook, True))
            continue
        summary = _plan_skyhook(skyhook, world, earlier, plan, now, pull_grace_seconds)
        plan.rounds.append(summary)
        planned.append((skyhook, summary))
        # Later Skyhooks wait per node on what is done, not on what a node shows.
        done = summary.complete_nodes
        earlier.append(
            (
                skyhook,
                {n: COMPLETE if n in done else IN_PROGRESS for n in summary.node_status},
                len(done) == len(summary.node_status),
            )
        )
    _plan_runtime_taints(world, planned, plan)
    _plan_config_map_deletes(world, [skyhook for skyhook, _ in planned], plan)
    # A request no interrupt needs any more goes, whoever left it: the round that finished
    # post-interrupt, one whose delete was lost, or a Skyhook deleted mid-interrupt.
    # (Owners are told apart by kind: a NodeWright's request stays while a shadowed Skyhook
    # of its name goes, and the Skyhook's goes with it.)
    deleting = {s.owner_key for s in world.skyhooks if s.deleting}
    for name, (owner, node) in sorted(world.maintenance_owners.items()):
        if name in plan.kept_maintenances:
            continue
        if owner not in deleting and world.running_on_node.get((owner, node)):
            # A Job of the Skyhook still runs on the drained node (a reboot whose version
            # was rolled back, whose package was removed, on a node now ignored or no
            # longer selected): it stays cordoned until that Job has ended, as upstream
            # uncordons only after post-interrupt. A deleted Skyhook's Jobs go with it.
            continue
        plan.actions.append(
            DeleteMaintenance(owner_name(owner), node, name, world.maintenance_uids.get(name, ""))
        )
        plan.decisions.append(
            SkyhookDecisionNote(
                owner_name(owner),
                "maintenance",
                f"NodeMaintenance {name} released: no interrupt left on {node}",
                reason="released",
                node=node,
                object_kind=owner_kind(owner),
            )
        )
    return plan


def has_taint(node: NodeView, taint: Mapping[str, str]) -> bool:
    """core/v1 Taint.MatchTaint: the same key and effect."""
    return any(
        t.get("key") == taint.get("key") and t.get("effect") == taint.get("effect")
        for t in node.taints
    )


def _auto_taint_nodes(
    world: World, skyhooks: Sequence[Skyhook], names: SkyhookNames
) -> list[NodeView]:
    """upstream's getAutoTaintNodes: nodes a runtimeRequired Skyhook (of one kind) with
    autoTaintNewNodes selects that lack its runtime-required taint and carry no annotation of
    either kind yet (new nodes: a node either kind already works on is not new)."""
    auto = [
        s
        for s in skyhooks
        if s.runtime_required
        and s.auto_taint_new_nodes
        and not s.deleting
        and names.finalizer in s.finalizers
    ]
    if not auto:
        return []
    taint = world.runtime_taint_of(names)
    return [
        node
        for node in world.nodes
        if node.name not in world.settling
        and any(s.node_selector.matches(node.labels) for s in auto)
        and not has_taint(node, taint)
        and not carries_marks(node.annotations)
    ]


def _plan_runtime_taints(
    world: World, planned: Sequence[tuple[Skyhook, SkyhookRound]], plan: RoundPlan
) -> None:
    """upstream's HandleRuntimeRequired: a node keeps the runtime-required taint until every
    runtimeRequired Skyhook selecting it is complete on it (an unreadable state is not
    complete: the taint stays). When one of them sets runtimeRequiredCordonAfter, the removal
    cordons the node and marks it runtimeRequiredCordon (S57, upstream's
    HandleRuntimeRequired with runtimeRequiredCordonAfterEnabled); a mark left on a node
    someone uncordoned is dropped, as upstream does."""
    for names in FLAVORS:
        mark = names.runtime_required_cordon_annotation
        for node in world.nodes:
            if mark in node.annotations and not node.unschedulable:
                plan.actions.append(DropRuntimeCordonMark(node, names))
        required = [(s, r) for s, r in planned if s.runtime_required and s.names == names]
        if not required:
            continue
        taint = world.runtime_taint_of(names)
        done_everywhere: dict[str, bool] = {}
        cordon_after: set[str] = set()
        for skyhook, summary in required:
            for name in summary.node_status:
                done_everywhere[name] = done_everywhere.get(name, True) and (
                    name in summary.complete_nodes
                )
                if skyhook.runtime_required_cordon_after:
                    cordon_after.add(name)
        for node in world.nodes:
            done = done_everywhere.get(node.name)
            if done and node.name not in world.settling and has_taint(node, taint):
                plan.actions.append(
                    SetRuntimeTaint(node, taint, False, names, cordon=node.name in cordon_after)
                )


NOT_READY_REASONS: Final = {True: "Incomplete", False: "Complete"}
ERRORING_REASONS: Final = {True: "Package(s) Erroring or Unknown", False: "Not Erroring"}


def node_conditions(
    skyhook: str,
    node: NodeView,
    entries: Mapping[str, PackageState],
    complete: bool,
    now: float,
    names: SkyhookNames = SKYHOOK,
) -> tuple[Mapping[str, Any], ...]:
    """The Skyhook's node conditions (upstream `operator/internal/wrapper/node.go::
    UpdateCondition`) that differ from what the node shows, ready to write; empty when none
    does. `NotReady` is True (`Incomplete`) until every package is complete on the node, then
    False (`Complete`); `Erroring` is True while a package there is erroring or unknown. A
    condition is written only when its status or reason changes (never once per round):
    lastTransitionTime moves only with its status, lastHeartbeatTime is the time of the write."""
    erroring = any(
        e.state in (stages.ERRORING, stages.UNKNOWN) and not e.retained for e in entries.values()
    )
    wanted = (
        (
            names.not_ready_condition(skyhook),
            not complete,
            NOT_READY_REASONS[not complete],
            f"{names.kind} {skyhook} Ready",
        ),
        (
            names.erroring_condition(skyhook),
            erroring,
            ERRORING_REASONS[erroring],
            f"Package Erroring or Unknown for {skyhook}",
        ),
    )
    written: list[Mapping[str, Any]] = []
    stamp = rfc3339(now)
    for kind, true, reason, message in wanted:
        status = "True" if true else "False"
        shown = node.conditions.get(kind)
        if shown is not None and shown.get("status") == status and shown.get("reason") == reason:
            continue
        moved = shown is None or shown.get("status") != status
        transition = stamp if moved else (shown or {}).get("lastTransitionTime", stamp)
        written.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": transition,
            }
        )
    return tuple(written)


def marks_of(skyhook: str, node: NodeView, names: SkyhookNames = SKYHOOK) -> bool:
    """Whether the node carries anything the Skyhook (or NodeWright) wrote on it."""
    key = names.status_key(skyhook)
    return (
        names.node_state_annotation(skyhook) in node.annotations
        or key in node.annotations
        or key in node.labels
        or names.version_annotation(skyhook) in node.annotations
        or names.cordon_annotation(skyhook) in node.annotations
    )


def conditions_of(skyhook: str, node: NodeView, names: SkyhookNames = SKYHOOK) -> tuple[str, ...]:
    """The Skyhook's (or NodeWright's) own condition types the node shows."""
    mine = (names.not_ready_condition(skyhook), names.erroring_condition(skyhook))
    return tuple(kind for kind in mine if kind in node.conditions)


def pending_uninstall(skyhook: Skyhook, nodes: Sequence[NodeView]) -> tuple[bool, list[str]]:
    """nodewright's HandleFinalizer phase 2: whether a package with uninstall.enabled (or an
    uninstall-interrupt already committed) is still tracked on one of the object's nodes,
    and the nodes whose state cannot be read (only when it has such packages: then whether
    work is left cannot be known)."""
    enabled = {p.name for p in skyhook.packages if p.uninstall_enabled}
    spec = {p.name for p in skyhook.packages}
    # A NodeWright's package removed from the spec with uninstall.enabled recorded is still
    # owed its uninstall (S51), deleted or not.
    removed_owed = skyhook.names == NODEWRIGHT
    annotation = skyhook.names.node_state_annotation(skyhook.name)
    pending = False
    unreadable: list[str] = []
    for node in nodes:
        entries, readable = parse_node_state(node.annotations.get(annotation))
        if not readable:
            unreadable.append(node.name)
            continue
        pending = pending or any(
            not e.retained
            and (
                e.name in enabled
                or e.stage == "uninstall-interrupt"
                or (removed_owed and e.uninstall_enabled and e.name not in spec)
            )
            for e in entries.values()
        )
    return pending, unreadable if enabled else []


def _plan_config_map_deletes(world: World, skyhooks: Sequence[Skyhook], plan: RoundPlan) -> None:
    """The ConfigMaps each planned object no longer wants go (skyhook/configmaps.py), judged
    on the node states as seen and as this round writes them (either may be the one that
    stands: an uninstall in either keeps its configMap)."""
    if not world.config_maps:
        return
    config_maps = list(world.config_maps.values())
    for skyhook in skyhooks:
        names = skyhook.names
        writing: set[str] = set()
        states: list[str | None] = []
        for action in plan.actions:
            if isinstance(action, WritePackageConfig) and action.skyhook is skyhook:
                writing.add(package_config_map_name(skyhook.name, action.package))
            elif isinstance(action, WriteNodeMetadata) and action.skyhook is skyhook:
                writing.add(node_metadata_name(skyhook.name, action.node.name))
            elif (
                isinstance(action, PatchNode)
                and action.skyhook == skyhook.name
                and action.names == names
            ):
                states.append(action.node_state)
        annotation = names.node_state_annotation(skyhook.name)
        settled = True
        for node in world.nodes:
            if annotation in node.annotations:
                states.append(node.annotations[annotation])
                settled = settled and node.name not in world.settling
        running = [
            node
            for (owner, node), jobs in world.running_on_node.items()
            if owner == skyhook.owner_key and jobs
        ]
        plan.actions.extend(
            package_config_map_deletes(
                skyhook,
                config_maps,
                node_states=states,
                states_settled=settled,
                writing=writing,
            )
        )
        plan.actions.extend(
            node_metadata_deletes(
                skyhook,
                config_maps,
                targets=[n.name for n in _targets(skyhook, world)],
                running_on=running,
                writing=writing,
            )
        )


def _targets(skyhook: Skyhook, world: World) -> list[NodeView]:
    selector = skyhook.node_selector
    if not selector.match_labels and not selector.expressions:
        return list(world.nodes)
    return [n for n in world.nodes if selector.matches(n.labels)]


def _plan_finalizer_uninstall(
    skyhook: Skyhook,
    world: World,
    earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]],
    plan: RoundPlan,
    now: float,
    pull_grace_seconds: float,
) -> bool:
    """A deleted object whose uninstall.enabled packages are still on its nodes uninstalls
    them (as an explicit uninstall: from a complete install, with uninstall-interrupt)
    before its finalizer's cleanup; paused or disabled, or with a node state it cannot read,
    it is held with DeletionBlocked (nodewright's HandleFinalizer). True while it is held
    (the cleanup waits). A Skyhook a NodeWright of its name shadows uninstalls nothing: the
    NodeWright serves those nodes now, and its packages stay installed."""
    if skyhook.names.finalizer not in skyhook.finalizers:
        return False
    if skyhook.names == SKYHOOK and any(
        s.names == NODEWRIGHT and s.name == skyhook.name for s in world.skyhooks
    ):
        return False
    pending, unreadable = pending_uninstall(skyhook, _targets(skyhook, world))
    blocked: dict[str, Any] | None = None
    if unreadable:
        blocked = _condition(
            "DeletionBlocked",
            True,
            "MalformedNodeState",
            # Upstream HandleFinalizer's words, word for word (both kinds say Skyhook
            # there), with the nodes it cannot read named.
            "Cannot safely delete Skyhook: malformed nodeState on one or more nodes ("
            + ", ".join(unreadable[:CONDITION_NODE_LIST_LIMIT])
            + "). Repair the nodeState annotation before deletion.",
        )
    elif pending and skyhook.paused:
        blocked = _condition(
            "DeletionBlocked",
            True,
            "PausedWithPendingUninstall",
            "Skyhook is paused with uninstall-enabled packages still tracked in nodeState. "
            "Unpause to let uninstall complete before deletion.",
        )
    elif pending and skyhook.disabled:
        blocked = _condition(
            "DeletionBlocked",
            True,
            "DisabledWithPendingUninstall",
            "Skyhook is disabled with uninstall-enabled packages still tracked in nodeState. "
            "Re-enable the Skyhook to let uninstall complete before deletion.",
        )
    if blocked is None and not pending:
        return False
    plan.rounds.append(
        _plan_skyhook(
            skyhook,
            world,
            earlier,
            plan,
            now,
            pull_grace_seconds,
            extra_conditions=() if blocked is None else (blocked,),
        )
    )
    return True


def _plan_deletion(skyhook: Skyhook, world: World, plan: RoundPlan) -> None:
    """Undo the Skyhook's marks on every node (its selector may have changed since it wrote
    them), and drop its finalizer only once no node and no NodeMaintenance of it is left."""
    names = skyhook.names
    if names.finalizer not in skyhook.finalizers:
        return
    left = 0
    for node in world.nodes:
        marked = marks_of(skyhook.name, node, names)
        conditions = conditions_of(skyhook.name, node, names)
        if not marked and not conditions:
            continue
        left += 1
        if node.name in world.settling:
            continue
        if marked:
            plan.actions.append(ForgetNode(skyhook.name, node, names))
        if conditions:
            plan.actions.append(
                SetNodeConditions(skyhook.name, node, removed=conditions, names=names)
            )
    requests = sum(
        1 for owner, _ in world.maintenance_owners.values() if owner == skyhook.owner_key
    )
    if left or requests:
        return
    plan.actions.append(SetSkyhookFinalizer(skyhook, False))


@dataclass
class _Targets:
    """Phase 1 of a Skyhook's round: the nodes it selects, each as it stands before the round."""

    nodes: list[NodeView]
    # Nodes that run nothing and show blocked: the ignore label, a taint not tolerated.
    ignored: list[str]
    untolerated: list[str]
    held: set[str]
    entries_of: dict[str, dict[str, PackageState]]
    readable_of: dict[str, bool]
    # The status each node had before the round, and the earlier Skyhook holding a node.
    before: dict[str, str]
    blocked_by: dict[str, str]


def _judge_targets(
    skyhook: Skyhook,
    world: World,
    earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]],
    wanted: Wanted,
) -> _Targets:
    selector = skyhook.node_selector
    # No selector selects every node: skip thousands of calls that could only say yes.
    select_all = not selector.match_labels and not selector.expressions
    # An ignored node stays a target (upstream keeps it in the Skyhook, NodesIgnored): it
    # runs nothing and shows blocked, as does one with a taint the Skyhook does not tolerate.
    targets = [n for n in world.nodes if select_all or selector.matches(n.labels)]
    ignore_label = skyhook.names.ignore_label
    ignored = sorted(
        n.name for n in targets if ignore_label in n.labels and _ignored(n, skyhook.names)
    )
    tolerations = picker_tolerations(skyhook, world)
    untolerated = sorted(n.name for n in targets if n.taints and not _tolerates_all(tolerations, n))
    held = {*ignored, *untolerated}
    annotation = skyhook.names.node_state_annotation(skyhook.name)
    judged = _Targets(targets, ignored, untolerated, held, {}, {}, {}, {})
    # Nodes in the same state share one parsed dict (kept alive in entries_of for the round,
    # so its id is not reused): judge each state once.
    status_of_state: dict[tuple[int, bool], str] = {}
    for node in targets:
        parsed, readable = parse_node_state(node.annotations.get(annotation))
        judged.entries_of[node.name], judged.readable_of[node.name] = parsed, readable
        state_id = (id(parsed), readable)
        status = status_of_state.get(state_id) or status_of_state.setdefault(
            state_id, node_status(skyhook, parsed, readable, wanted)
        )
        if status in (WAITING, UNKNOWN) and readable:
            blocker = _blocked_by_priority(skyhook, node.name, earlier, world)
            if blocker:
                judged.blocked_by[node.name] = blocker
                status = BLOCKED
        if held and node.name in held and readable and status not in (COMPLETE, ERRORING):
            # Picked last and never judged a failed node, as a node that waits its turn.
            status = BLOCKED
        judged.before[node.name] = status
    return judged


@dataclass
class _Rollout:
    """Phase 2: the DeploymentPolicy's batches, and whether the Skyhook may start anything."""

    policy: DeploymentPolicy | None
    # Whether the policy resets the batch state on completion.
    resets: bool
    problems: list[str]
    may_start: bool
    compartments: list[CompartmentPlan]
    # The nodes the batches picked this round.
    selected: set[str]
    # status.nodePriority (node -> when it was picked), updated by the steps.
    priorities: dict[str, Any]
    # The conditions the rollout raises (DeploymentPolicyNotFound, RolloutStopped).
    conditions: list[dict[str, Any]]


def _plan_rollout(skyhook: Skyhook, world: World, targets: _Targets, plan: RoundPlan) -> _Rollout:
    policy = policy_for(skyhook, world.policies_of(skyhook.names), len(targets.nodes))
    resets = resets_batch_state(skyhook, policy)
    # A version change resets the batch state (upstream's auto-reset): fixing a package's
    # version resumes a rollout that failureThreshold stopped.
    restart_batches = resets and _versions_changed(skyhook)
    problems = list(skyhook.problems)
    if policy is not None and policy.problems:
        problems.append(f"DeploymentPolicy {policy.name}: " + "; ".join(policy.problems))
    may_start = not (skyhook.paused or skyhook.disabled or problems)
    rollout = _Rollout(
        policy,
        resets,
        problems,
        may_start,
        [],
        set(),
        dict(skyhook.status.get("nodePriority") or {}),
        [],
    )
    if policy is None:
        rollout.conditions.append(
            _condition(
                "DeploymentPolicyNotFound",
                True,
                "DeploymentPolicyNotFound",
                f"DeploymentPolicy {skyhook.deployment_policy} does not exist",
            )
        )
        rollout.may_start = False
        return rollout
    previous_compartments = skyhook.status.get("compartmentStatuses") or {}
    ranks = node_orders(rollout.priorities, 0)
    drained = {n for owner, n in world.maintenance_owners.values() if owner == skyhook.owner_key}
    # A drained node that is not a target counts against every compartment (fail closed).
    drained_outside = len(drained - {n.name for n in targets.nodes})
    rollout_nodes = [
        RolloutNode(
            n.name,
            n.labels,
            n.created,
            targets.before[n.name],
            sticky=n.name in rollout.priorities,
            picked=ranks.get(n.name, -1),
            drained=n.name in drained,
        )
        for n in targets.nodes
    ]
    for name, members in assign_compartments(policy, rollout_nodes).items():
        if not members and name != DEFAULT_COMPARTMENT:
            continue
        raw = previous_compartments.get(name) if isinstance(previous_compartments, dict) else None
        recorded = None if restart_batches else (raw or {}).get("batchState")
        state = BatchState.from_status(recorded)
        compartment = compartment_of(policy, name)
        decided = plan_compartment(
            compartment,
            members,
            state,
            may_start=may_start,
            fresh=not isinstance(recorded, Mapping),
            drained_elsewhere=drained_outside
            + sum(
                1
                for m in members
                if m.drained and m.status not in (IN_PROGRESS, ERRORING, COMPLETE)
            ),
        )
        rollout.compartments.append(decided)
        rollout.selected.update(decided.batch)
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
                    object_kind=skyhook.names.kind,
                )
            )
        if decided.state.should_stop and decided.strategy is not None:
            rollout.conditions.append(
                _condition(
                    "RolloutStopped",
                    True,
                    "FailureThresholdReached",
                    f"compartment {name} stopped after "
                    f"{decided.state.consecutive_failures} failed batches",
                )
            )
    return rollout


@dataclass
class _Stepped:
    """Phase 3: each node after its packages were stepped."""

    # The status each node has now (before paused/disabled/waiting are shown).
    after: dict[str, str] = field(default_factory=dict)
    final_entries: dict[str, Mapping[str, PackageState]] = field(default_factory=dict)
    # status.nodeState of the reset nodes not started again, kept as last recorded.
    kept_records: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # Nodes whose entries changed, and usable nodes with a state or a status mark (their
    # marks may need a patch).
    changed: set[str] = field(default_factory=set)
    marked: list[NodeView] = field(default_factory=list)
    held_downgrades: set[str] = field(default_factory=set)
    # Nodes that left status.nodePriority (complete, or no longer a target).
    removed_picks: int = 0
    # Each distinct entries dict with the number of nodes sharing it.
    shared: dict[int, tuple[Mapping[str, PackageState], int]] = field(default_factory=dict)


def _step_nodes(
    skyhook: Skyhook,
    world: World,
    targets: _Targets,
    rollout: _Rollout,
    plan: RoundPlan,
    wanted: Wanted,
    now: float,
    pull_grace_seconds: float,
) -> _Stepped:
    stepped = _Stepped()
    priorities = rollout.priorities
    order = _package_order(skyhook)
    synced: dict[int, Mapping[str, PackageState]] = {}
    # The node marks that make a node worth a patch (once per Skyhook: read for every node).
    mark_keys = (
        skyhook.names.status_key(skyhook.name),
        skyhook.names.cordon_annotation(skyhook.name),
    )
    for node in targets.nodes:
        name = node.name
        entries: Mapping[str, PackageState] = targets.entries_of[name]
        status = targets.before[name]
        usable = targets.readable_of[name] and name not in world.settling
        if usable and entries and skyhook.names == NODEWRIGHT:
            flagged = synced.get(id(entries))
            if flagged is None:
                flagged = synced[id(entries)] = _synced_uninstall_flags(skyhook, entries)
            if flagged is not entries:
                entries = flagged
                stepped.changed.add(name)
        working = (
            usable
            and name in rollout.selected
            and name not in targets.blocked_by
            and name not in targets.held
        )
        # A node outside the batch with a stage under way still records its Job's end (the
        # rollout paused or stopped); a node with nothing started, or done, has nothing to do.
        unfinished = usable and bool(entries) and status != COMPLETE
        if working or unfinished:
            step = step_node(
                skyhook,
                name,
                entries,
                world,
                may_start=rollout.may_start and working,
                now=now,
                pull_grace_seconds=pull_grace_seconds,
                order=order,
                node_view=node,
            )
            if working:
                plan.actions.extend(step.actions)
            else:
                plan.actions.extend(
                    a for a in step.actions if isinstance(a, FailJob | KeepFailedJob)
                )
            plan.decisions.extend(step.decisions)
            stepped.held_downgrades.update(step.held)
            # An ignored node's request is not kept for its unfinished run: the label tells
            # the Skyhook to leave the node alone, so it goes once no Job runs there.
            if step.maintenance_needed and name not in targets.ignored:
                plan.kept_maintenances.add(world.request_of(skyhook, name))
            status = node_status(skyhook, step.entries, True, wanted)
            # A node with a run under way is in progress; one outside the batch whose
            # packages are all done for an older version or config waits for its batch.
            if status == WAITING and (
                (working and bool(step.entries))
                or any(e.state != stages.COMPLETE for e in step.entries.values())
            ):
                status = IN_PROGRESS
            if status in (WAITING, UNKNOWN) and name in targets.blocked_by:
                status = BLOCKED
            if name in targets.held and status not in (COMPLETE, ERRORING):
                status = BLOCKED
            if working and status != COMPLETE:
                priorities.setdefault(name, now)
            if step.entries != entries:
                stepped.changed.add(name)
            entries = step.entries
        elif not usable:
            # Not looked at this round: a request it may still be using stays. (A usable
            # node not looked at has nothing started or is complete.)
            plan.kept_maintenances.add(world.request_of(skyhook, name))
        if status == COMPLETE and priorities.pop(name, None) is not None:
            stepped.removed_picks += 1
        _record_node(
            skyhook, stepped, node, entries, status, usable, targets.readable_of[name], mark_keys
        )
    node_names = {n.name for n in targets.nodes}
    for name in list(priorities):
        if name not in node_names:
            priorities.pop(name)
            stepped.removed_picks += 1
    return stepped


def _record_node(
    skyhook: Skyhook,
    stepped: _Stepped,
    node: NodeView,
    entries: Mapping[str, PackageState],
    status: str,
    usable: bool,
    readable: bool,
    mark_keys: tuple[str, str],
) -> None:
    """What a node's step leaves for the later phases: its status, whether its marks may need
    a patch, its entries (counted per shared dict), or a reset node's last record."""
    name = node.name
    key, cordon_key = mark_keys
    stepped.after[name] = status
    if usable and (
        entries
        or name in stepped.changed
        or key in node.annotations
        or key in node.labels
        or cordon_key in node.annotations
    ):
        stepped.marked.append(node)
    if entries:
        stepped.final_entries[name] = entries
        # Nodes in the same state share one parsed dict: count dicts, expand once below.
        seen = stepped.shared.get(id(entries))
        stepped.shared[id(entries)] = (entries, 1 if seen is None else seen[1] + 1)
    elif readable and status != COMPLETE:
        # A reset node (its state removed) that has not started again: the status keeps
        # what it last recorded there, so its packages start a new run (run_marker)
        # whatever holds them back meanwhile (paused, disabled, a later batch, a drain).
        recorded = _recorded_state(skyhook, name)
        if recorded:
            stepped.kept_records[name] = recorded


def _shown_statuses(
    skyhook: Skyhook,
    targets: _Targets,
    stepped: _Stepped,
    rollout: _Rollout,
    earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]],
) -> tuple[dict[str, str], str]:
    """Phase 4: what each node shows (status.nodeStatus, its status_ label) and the Skyhook's
    overall status. A node held back by an earlier Skyhook waits (upstream's
    IsNodeReadyForSkyhook); every node of a paused or disabled Skyhook shows that."""
    shown = stepped.after
    if targets.blocked_by:
        shown = {
            name: WAITING
            if status == BLOCKED and name in targets.blocked_by and name not in targets.held
            else status
            for name, status in stepped.after.items()
        }
    overall = overall_status(
        skyhook,
        list(shown.values()),
        policy_missing=rollout.policy is None,
        waits_for_earlier=_waits_for_earlier(earlier),
    )
    if rollout.problems:
        overall = ERRORING
    if overall in (PAUSED, DISABLED):
        shown = dict.fromkeys(shown, overall)
    return shown, overall


def _mark_nodes(
    skyhook: Skyhook,
    world: World,
    stepped: _Stepped,
    shown: Mapping[str, str],
    plan: RoundPlan,
    now: float,
) -> None:
    """Phase 5: each node's marks (node state, status annotation and label, cordon mark,
    node conditions) patched where they differ from the round's."""
    key = skyhook.names.status_key(skyhook.name)
    version_key = skyhook.names.version_annotation(skyhook.name)
    cordon_key = skyhook.names.cordon_annotation(skyhook.name)
    for node in stepped.marked:
        name = node.name
        entries = stepped.final_entries.get(name, {})
        status = shown[name]
        marks = (node.annotations.get(key, ""), node.labels.get(key, ""))
        cordon = world.request_of(skyhook, name) in world.maintenance_owners
        if (
            name in stepped.changed
            or marks != (status, status)
            or (cordon_key in node.annotations) != cordon
            or (entries and node.annotations.get(version_key) != NODE_STATE_VERSION)
            # An entry an older controller wrote gets its `writtenAs` once, so a stage set
            # back there later is seen as a rerun (stages.rerun_by_hand).
            or any(not e.written for e in entries.values())
        ):
            rendered = render_node_state(entries) if entries else ""
            plan.actions.append(
                PatchNode(skyhook.name, node, rendered, status, cordon, skyhook.names)
            )
        node_changes = node_conditions(
            skyhook.name, node, entries, stepped.after[name] == COMPLETE, now, skyhook.names
        )
        if node_changes:
            plan.actions.append(
                SetNodeConditions(skyhook.name, node, node_changes, names=skyhook.names)
            )


def _count_packages(summary: SkyhookRound, stepped: _Stepped) -> None:
    """Phase 6: the nodes in each package state and stage, and the retries, for metrics."""
    for entries, count in stepped.shared.values():
        for entry in entries.values():
            if entry.retained:
                continue
            state_key = (entry.name, entry.version, entry.state)
            summary.package_states[state_key] = summary.package_states.get(state_key, 0) + count
            stage_key = (entry.name, entry.version, entry.stage)
            summary.package_stages[stage_key] = summary.package_stages.get(stage_key, 0) + count
            restarts_key = (entry.name, entry.version)
            summary.package_restarts[restarts_key] = (
                summary.package_restarts.get(restarts_key, 0) + entry.restarts * count
            )


def _skyhook_status(
    skyhook: Skyhook,
    targets: _Targets,
    rollout: _Rollout,
    stepped: _Stepped,
    shown: Mapping[str, str],
    overall: str,
    order_offset: int,
    extra_conditions: Sequence[dict[str, Any]],
    now: float,
) -> dict[str, Any]:
    """Phase 7: the Skyhook's status: node statuses and states, batches, conditions."""
    statuses = list(shown.values())
    complete_nodes = sum(1 for s in stepped.after.values() if s == COMPLETE)
    reset = overall == COMPLETE and rollout.resets
    ready_message = {
        COMPLETE: "all nodes converged",
        IN_PROGRESS: f"{complete_nodes}/{len(statuses)} nodes complete",
        ERRORING: "; ".join(rollout.problems)
        or f"{sum(1 for s in statuses if s == ERRORING)} nodes erroring",
        PAUSED: "paused: no new stage starts",
        DISABLED: "disabled",
        BLOCKED: "waiting for its DeploymentPolicy" if rollout.policy is None else "blocked",
        WAITING: "waiting for a batch",
        UNKNOWN: "node states differ or are unreadable",
    }[overall]
    conditions = [
        _condition("Ready", overall == COMPLETE, _READY_REASONS[overall], ready_message),
        *rollout.conditions,
    ]
    malformed = node_state_malformed(
        [n.name for n in targets.nodes if not targets.readable_of[n.name]]
    )
    if malformed is not None:
        conditions.append(malformed)
    conditions.extend(
        _uninstall_conditions(
            skyhook,
            stepped.final_entries,
            targets.nodes,
            targets.readable_of,
            stepped.held_downgrades,
        )
    )
    conditions.extend(extra_conditions)
    conditions.append(
        _nodes_condition(
            "TaintNotTolerable",
            targets.untolerated,
            "has taints that are not tolerable. Skipping.",
            "nodes have taints that are not tolerable. Skipping.",
            "All nodes have tolerable taints.",
        )
    )
    conditions.append(
        _nodes_condition(
            "NodesIgnored",
            targets.ignored,
            "has ignore label set. Skipping.",
            "nodes have ignore label set. Skipping.",
            "No nodes have ignore label set.",
        )
    )
    node_states = {**_rendered_node_states(stepped.final_entries), **stepped.kept_records}
    return {
        "observedGeneration": skyhook.generation,
        "status": overall,
        "nodeStatus": dict(sorted(shown.items())),
        "nodeState": dict(sorted(node_states.items())),
        "completeNodes": f"{complete_nodes}/{len(statuses)}",
        # Nodes with a run under way, erroring ones included (upstream's printer column).
        "nodesInProgress": sum(1 for s in statuses if s in (IN_PROGRESS, ERRORING)),
        "packageList": ",".join(f"{p.name}:{p.version}" for p in skyhook.packages),
        "nodePriority": {k: _rfc3339(v) for k, v in sorted(rollout.priorities.items())}
        if not reset
        else {},
        # Omitted while 0, as upstream's omitempty.
        **({"nodeOrderOffset": order_offset} if order_offset else {}),
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
            for c in rollout.compartments
        },
        "conditions": stamp_conditions(
            conditions, skyhook.status.get("conditions"), skyhook.generation, now
        ),
    }


def _plan_skyhook(
    skyhook: Skyhook,
    world: World,
    earlier: Sequence[tuple[Skyhook, Mapping[str, str], bool]],
    plan: RoundPlan,
    now: float,
    pull_grace_seconds: float,
    extra_conditions: Sequence[dict[str, Any]] = (),
) -> SkyhookRound:
    """One Skyhook's round, in phases: judge its target nodes, plan the rollout's batches,
    step each node's packages, decide what each node shows, patch the nodes' marks, count
    the packages, and write the status."""
    first_action = len(plan.actions)
    wanted = wanted_versions(skyhook)
    targets = _judge_targets(skyhook, world, earlier, wanted)
    rollout = _plan_rollout(skyhook, world, targets, plan)
    stepped = _step_nodes(skyhook, world, targets, rollout, plan, wanted, now, pull_grace_seconds)
    shown, overall = _shown_statuses(skyhook, targets, stepped, rollout, earlier)
    _mark_nodes(skyhook, world, stepped, shown, plan, now)
    summary = SkyhookRound(skyhook.name, overall)
    _count_packages(summary, stepped)
    # upstream's RemoveNodePriority: each node leaving nodePriority (complete, or no longer a
    # target) bumps nodeOrderOffset, so SKYHOOK_NODE_ORDER keeps counting across batches.
    order_offset = _node_order_offset(skyhook.status) + stepped.removed_picks
    _set_node_orders(plan.actions, first_action, rollout.priorities, order_offset)
    summary.node_status = dict(shown)
    summary.complete_nodes = {n for n, s in stepped.after.items() if s == COMPLETE}
    summary.compartments = rollout.compartments
    summary.policy = (
        rollout.policy.name if rollout.policy is not None else skyhook.deployment_policy
    )
    new_status = _skyhook_status(
        skyhook, targets, rollout, stepped, shown, overall, order_offset, extra_conditions, now
    )
    if _status_differs(skyhook.status, new_status):
        plan.actions.append(SetSkyhookStatus(skyhook, new_status))
    return summary


def _synced_uninstall_flags(
    skyhook: Skyhook, entries: Mapping[str, PackageState]
) -> Mapping[str, PackageState]:
    """The node's entries with their packages' uninstall.enabled recorded (a NodeWright's):
    `entries` itself when every flag already holds."""
    synced: dict[str, PackageState] | None = None
    for package in skyhook.packages:
        entry = entries.get(package.name)
        if entry is None:
            continue
        flagged = _with_uninstall_flag(entry, package)
        if flagged is not entry:
            synced = synced if synced is not None else dict(entries)
            synced[package.name] = flagged
    return synced if synced is not None else entries


def _uninstall_conditions(
    skyhook: Skyhook,
    final_entries: Mapping[str, Mapping[str, PackageState]],
    targets: Sequence[NodeView],
    readable_of: Mapping[str, bool],
    held_downgrades: set[str],
) -> list[dict[str, Any]]:
    """nodewright's UpdateUninstallConditions and UpdateBlockedCondition, from the nodes'
    states after this round: UninstallInProgress while an uninstall cycle is under way on a
    node (whatever the spec says now: an uninstall-interrupt cannot be cancelled),
    UninstallFailed while one is erroring; Blocked (DependencyUninstalled) while a package
    not yet complete everywhere depends on one being (or that has been) uninstalled; and
    DowngradeBlocked for a NodeWright's downgrade that needs its uninstall first. Each only
    while it holds (absent otherwise, as nodewright removes them)."""
    spec = {p.name: p for p in skyhook.packages}
    nodewright = skyhook.names == NODEWRIGHT
    in_cycle: set[str] = set()
    failing = False
    for entries in final_entries.values():
        for entry in entries.values():
            if entry.retained or not stages.in_uninstall_cycle(entry):
                continue
            if entry.name in spec or (nodewright and entry.uninstall_enabled):
                in_cycle.add(entry.name)
                failing = failing or entry.state == stages.ERRORING
    conditions: list[dict[str, Any]] = []
    if in_cycle:
        conditions.append(
            _condition(
                "UninstallInProgress",
                True,
                "UninstallInProgress",
                "One or more packages are being uninstalled",
            )
        )
    if failing:
        conditions.append(
            _condition(
                "UninstallFailed",
                True,
                "UninstallPodFailing",
                "One or more uninstall pods are failing",
            )
        )
    every_node_read = bool(targets) and all(readable_of.get(n.name, False) for n in targets)
    blocked: list[str] = []
    for package in skyhook.packages:
        if removing(skyhook, package) or not package.depends_on:
            continue
        if targets and all(
            (e := final_entries.get(n.name, {}).get(package.name)) is not None
            and e.version == package.version
            and e.state == stages.COMPLETE
            for n in targets
        ):
            continue  # complete everywhere: the broken dependency holds nothing up
        for dependency, _ in package.depends_on:
            other = spec.get(dependency)
            if dependency in in_cycle:
                blocked.append(
                    f"package {package.name} is blocked: dependency {dependency} is being "
                    "uninstalled"
                )
            elif (
                other is not None
                and removing(skyhook, other)
                and every_node_read
                and all(dependency not in final_entries.get(n.name, {}) for n in targets)
            ):
                blocked.append(
                    f"package {package.name} is blocked: dependency {dependency} has been "
                    "uninstalled"
                )
    if blocked:
        conditions.append(
            _condition("Blocked", True, "DependencyUninstalled", "; ".join(sorted(blocked)))
        )
    if held_downgrades:
        conditions.append(
            _condition(
                "DowngradeBlocked",
                True,
                "UninstallFirst",
                "a downgrade of "
                + ", ".join(sorted(held_downgrades))
                + " with uninstall.enabled needs its uninstall first: set uninstall.apply, "
                "wait until the package is gone from every node, then change the version "
                "(the installed version is kept meanwhile)",
            )
        )
    return conditions


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


def _node_order_offset(status: Mapping[str, Any]) -> int:
    offset = status.get("nodeOrderOffset")
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else 0


def _set_node_orders(
    actions: list[SkyhookAction],
    first: int,
    priorities: Mapping[str, object],
    offset: int,
) -> None:
    """Each new Job's SKYHOOK_NODE_ORDER, from the nodes picked as of this round (upstream
    reads status.nodePriority and nodeOrderOffset as it creates the pod)."""
    creates = [i for i in range(first, len(actions)) if isinstance(actions[i], CreateJob)]
    if not creates:
        return
    orders = node_orders(priorities, offset)
    for index in creates:
        action = actions[index]
        assert isinstance(action, CreateJob)
        order = orders.get(action.node, 0)
        if order != action.node_order:
            actions[index] = replace(action, node_order=order)


def _rfc3339(at: float | str) -> str:
    return at if isinstance(at, str) else rfc3339(at)


def _status_differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items())

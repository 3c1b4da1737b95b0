"""A small cluster for the Skyhook plan: every action lands as the API server would apply it.

Jobs are the objects `build_job` makes (so their identity annotation and labels are the real
ones) read back through `observe.job_facts`; a Job created in one round ends in the next
(Complete, unless `fate` says otherwise); every node patch bumps the node's resourceVersion;
a NodeMaintenance is Ready one round after it is made unless held Pending.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from maintenance_scheduler.skyhook.api import (
    NODE_STATE_VERSION,
    SKYHOOK_FINALIZER,
    DeploymentPolicy,
    Skyhook,
    node_state_annotation,
    parse_skyhook,
    status_key,
)
from maintenance_scheduler.skyhook.jobs import build_job, maintenance_name
from maintenance_scheduler.skyhook.observe import job_facts
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    DeleteMaintenance,
    NodeView,
    PatchNode,
    RoundPlan,
    SetSkyhookStatus,
    World,
    plan_round,
)

T0 = 1_000_000.0
NAMESPACE = "skyhook"


def apply_marks(annotations: dict[str, str], action: PatchNode) -> None:
    """A PatchNode's version_ and cordon_ marks, as the merge patch sets or removes them."""
    names = action.names
    marks = {
        names.version_annotation(action.skyhook): NODE_STATE_VERSION if action.node_state else None,
        names.cordon_annotation(action.skyhook): "true" if action.cordon else None,
    }
    for key, value in marks.items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value


def make_skyhook(
    packages: dict[str, Any], *, name: str = "gpu-init", uid: str = "", generation: int = 1
) -> Skyhook:
    return parse_skyhook(
        {
            "metadata": {
                "name": name,
                "uid": uid or f"uid-{name}",
                "generation": generation,
                "finalizers": [SKYHOOK_FINALIZER],
            },
            "spec": {"packages": packages},
        }
    )


@dataclass
class Cluster:
    skyhook: Skyhook
    nodes: dict[str, NodeView]
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    maintenances: dict[str, str] = field(default_factory=dict)
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    held_pending: bool = False
    # Job name -> how it ends ("complete" or "failed"); absent: complete.
    fate: dict[str, Literal["complete", "failed"]] = field(default_factory=dict)
    # Jobs that stay running until released.
    held_jobs: set[str] = field(default_factory=set)
    created: list[CreateJob] = field(default_factory=list)
    # The NodeMaintenance phase of the node at each CreateJob (by Job name).
    phase_at_create: dict[str, str | None] = field(default_factory=dict)
    version: int = 1
    now: float = T0
    # The DeploymentPolicies the Skyhook may name, by name.
    policies: dict[str, DeploymentPolicy] = field(default_factory=dict)

    @classmethod
    def of(cls, skyhook: Skyhook, count: int = 1) -> Cluster:
        nodes = {
            f"node-{i}": NodeView(f"node-{i}", f"node-uid-{i}", "1", {}, {}, created=float(i))
            for i in range(count)
        }
        return cls(skyhook, nodes)

    def world(self) -> World:
        return World(
            skyhooks=[self.skyhook],
            policies=dict(self.policies),
            nodes=list(self.nodes.values()),
            jobs={name: job_facts(obj, []) for name, obj in self.jobs.items()},
            maintenances=dict(self.maintenances),
            maintenance_owners=dict(self.owners),
        )

    def bump(self, node: NodeView, **changes: Any) -> NodeView:
        self.version += 1
        return replace(node, resource_version=str(self.version), **changes)

    def end_jobs(self) -> None:
        for name, obj in self.jobs.items():
            if obj.get("status") or name in self.held_jobs:
                continue
            kind = "Complete" if self.fate.get(name, "complete") == "complete" else "Failed"
            obj["status"] = {"conditions": [{"type": kind, "status": "True"}]}

    def round(self) -> RoundPlan:
        self.now += 1
        self.end_jobs()
        for name in self.maintenances:
            self.maintenances[name] = "Pending" if self.held_pending else "Ready"
        world = self.world()
        plan = plan_round(world, now=self.now)
        for action in plan.actions:
            if isinstance(action, CreateJob):
                assert action.name not in self.jobs, f"{action.name} created twice"
                obj = build_job(
                    action.skyhook,
                    action.package,
                    action.stage,
                    action.node,
                    namespace=NAMESPACE,
                    default_stage_timeout_seconds=0,
                    run=action.run,
                    config=action.config,
                    node_uid=action.node_uid,
                )
                assert obj["metadata"]["name"] == action.name
                self.jobs[action.name] = obj
                self.created.append(action)
                request = maintenance_name(self.skyhook.name, action.node)
                self.phase_at_create[action.name] = world.maintenances.get(request)
            elif isinstance(action, PatchNode):
                node = self.nodes[action.node.name]
                annotations = dict(node.annotations)
                annotations[node_state_annotation(action.skyhook)] = action.node_state
                annotations[status_key(action.skyhook)] = action.status
                apply_marks(annotations, action)
                labels = {**node.labels, status_key(action.skyhook): action.status}
                self.nodes[node.name] = self.bump(node, annotations=annotations, labels=labels)
            elif isinstance(action, CreateMaintenance):
                self.maintenances[action.name] = "Pending"
                self.owners[action.name] = (action.skyhook.owner_key, action.node)
            elif isinstance(action, DeleteMaintenance):
                self.maintenances.pop(action.name, None)
                self.owners.pop(action.name, None)
            elif isinstance(action, SetSkyhookStatus):
                self.skyhook = replace(self.skyhook, status=dict(action.status))
        return plan

    def settle(self, rounds: int = 60) -> None:
        for _ in range(rounds):
            if not self.round().actions:
                return

    def status(self) -> str:
        return str(self.skyhook.status.get("status"))

    def change(self, packages: dict[str, Any]) -> None:
        """The Skyhook's spec edited: a new generation, its status kept."""
        edited = make_skyhook(
            packages,
            name=self.skyhook.name,
            uid=self.skyhook.uid,
            generation=self.skyhook.generation + 1,
        )
        self.skyhook = replace(edited, status=self.skyhook.status)

    def reset_node(self, name: str) -> None:
        """What `kubectl skyhook node reset` does: the node forgets the Skyhook's state."""
        node = self.nodes[name]
        kept = {
            k: v
            for k, v in node.annotations.items()
            if k not in (node_state_annotation(self.skyhook.name), status_key(self.skyhook.name))
        }
        self.nodes[name] = self.bump(node, annotations=kept)

    def stages_created(self, since: int = 0) -> list[tuple[str, str, str]]:
        return [(a.package.name, a.package.version, a.stage) for a in self.created[since:]]

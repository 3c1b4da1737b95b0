"""One round of the Skyhook controller, run round after round against a small fake cluster
that applies its actions (Jobs complete or fail on the next round, patches land)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import (
    POLICY_FINALIZER,
    SKYHOOK_FINALIZER,
    DeploymentPolicy,
    Skyhook,
    node_state_annotation,
    parse_deployment_policy,
    parse_skyhook,
    status_key,
)
from maintenance_scheduler.skyhook.jobs import maintenance_name
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    DeleteMaintenance,
    FailJob,
    ForgetNode,
    KeepFailedJob,
    NodeView,
    PatchNode,
    RoundPlan,
    SetNodeConditions,
    SetPolicyFinalizer,
    SetSkyhookFinalizer,
    SetSkyhookStatus,
    World,
    plan_round,
)
from maintenance_scheduler.skyhook.stages import JobFacts, PackageState, render_node_state
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import apply_marks
from tests.unit.plan_checks import expect_actions, expect_no_actions

T0 = 1_000_000.0


def skyhook(
    name: str = "gpu-init",
    packages: dict[str, Any] | None = None,
    *,
    policy: str = "",
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    sequencing: str | None = None,
    selector: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    finalizers: tuple[str, ...] = (SKYHOOK_FINALIZER,),
) -> Skyhook:
    spec: dict[str, Any] = {
        "packages": packages
        if packages is not None
        else {
            "driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"},
            "tuning": {
                "version": "1.0.0",
                "image": "ghcr.io/x/tuning",
                "dependsOn": {"driver": "1.0.0"},
            },
        }
    }
    if policy:
        spec["deploymentPolicy"] = policy
    if priority is not None:
        spec["priority"] = priority
    if sequencing is not None:
        spec["sequencing"] = sequencing
    if selector is not None:
        spec["nodeSelectors"] = selector
    return parse_skyhook(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "annotations": annotations or {},
                "finalizers": list(finalizers),
            },
            "spec": spec,
            "status": status or {},
        }
    )


def exponential_policy(failure_threshold: int | None = None) -> DeploymentPolicy:
    strategy: dict[str, Any] = {"initialBatch": 1, "growthFactor": 2}
    if failure_threshold is not None:
        strategy["failureThreshold"] = failure_threshold
    return parse_deployment_policy(
        {
            "metadata": {"name": "exp", "finalizers": [POLICY_FINALIZER]},
            "spec": {
                "default": {"budget": {"percent": 100}, "strategy": {"exponential": strategy}}
            },
        }
    )


@dataclass
class FakeCluster:
    skyhooks: list[Skyhook]
    nodes: dict[str, NodeView]
    policies: dict[str, DeploymentPolicy] = field(default_factory=dict)
    jobs: dict[str, JobFacts] = field(default_factory=dict)
    maintenances: dict[str, str] = field(default_factory=dict)
    maintenance_owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    created: Counter[str] = field(default_factory=Counter)
    # Job name -> what it does when it ends ("complete" or "failed").
    fate: dict[str, Literal["complete", "failed"]] = field(default_factory=dict)
    fail_images: tuple[str, ...] = ()
    batches: list[set[str]] = field(default_factory=list)
    started_nodes: set[str] = field(default_factory=set)
    # Maintenance requests the maintenance-scheduler holds Pending (it has not drained the
    # node yet); every other request is Ready one round after it is made.
    held_pending: set[str] = field(default_factory=set)
    # What the last round's plan was made from.
    last_world: World | None = None
    now: float = T0

    def world(self) -> World:
        return World(
            skyhooks=self.skyhooks,
            policies=self.policies,
            nodes=list(self.nodes.values()),
            jobs=dict(self.jobs),
            maintenances=dict(self.maintenances),
            maintenance_owners=dict(self.maintenance_owners),
        )

    def round(self) -> RoundPlan:
        self.now += 1
        # Jobs created last round end now; maintenance requests become Ready.
        for name, job in list(self.jobs.items()):
            if job.outcome == "running":
                self.jobs[name] = replace(job, outcome=self.fate.get(name, "complete"))
        for name in self.maintenances:
            self.maintenances[name] = "Pending" if name in self.held_pending else "Ready"
        self.last_world = self.world()
        plan = plan_round(self.last_world, now=self.now)
        started: set[str] = set()
        for action in plan.actions:
            if isinstance(action, CreateJob):
                self.created[action.name] += 1
                self.jobs[action.name] = JobFacts(name=action.name, outcome="running")
                if action.package.image in self.fail_images:
                    self.fate[action.name] = "failed"
                if action.node not in self.started_nodes:
                    started.add(action.node)
                    self.started_nodes.add(action.node)
            elif isinstance(action, PatchNode):
                node = action.node
                annotations = dict(self.nodes[node.name].annotations)
                labels = dict(self.nodes[node.name].labels)
                # The keys of the object's own kind (Skyhook or NodeWright).
                names = action.names
                annotations[names.node_state_annotation(action.skyhook)] = action.node_state
                annotations[names.status_key(action.skyhook)] = action.status
                labels[names.status_key(action.skyhook)] = action.status
                apply_marks(annotations, action)
                self.nodes[node.name] = replace(
                    self.nodes[node.name], annotations=annotations, labels=labels
                )
            elif isinstance(action, CreateMaintenance):
                self.maintenances[action.name] = "Pending"
                self.maintenance_owners[action.name] = (action.skyhook.owner_key, action.node)
            elif isinstance(action, DeleteMaintenance):
                self.maintenances.pop(action.name, None)
                self.maintenance_owners.pop(action.name, None)
            elif isinstance(action, SetSkyhookStatus):
                self.skyhooks = [
                    replace(s, status=dict(action.status)) if s.name == action.skyhook.name else s
                    for s in self.skyhooks
                ]
            elif isinstance(action, ForgetNode):
                node, names = self.nodes[action.node.name], action.names
                key = names.status_key(action.skyhook)
                forgotten = (
                    key,
                    names.node_state_annotation(action.skyhook),
                    names.version_annotation(action.skyhook),
                    names.cordon_annotation(action.skyhook),
                )
                annotations = {k: v for k, v in node.annotations.items() if k not in forgotten}
                labels = {k: v for k, v in node.labels.items() if k != key}
                self.nodes[node.name] = replace(node, annotations=annotations, labels=labels)
            elif isinstance(action, SetSkyhookFinalizer):
                self.set_finalizer(action.skyhook.name, action.present)
            elif isinstance(action, SetNodeConditions):
                # As the API server merges a strategic patch of conditions: by type.
                node = self.nodes[action.node.name]
                conditions = {k: v for k, v in node.conditions.items() if k not in action.removed}
                conditions.update({str(c["type"]): c for c in action.conditions})
                self.nodes[node.name] = replace(node, conditions=conditions)
        if started:
            self.batches.append(started)
        return plan

    def set_finalizer(self, name: str, present: bool) -> None:
        kept: list[Skyhook] = []
        for one in self.skyhooks:
            if one.name == name:
                mine = one.names.finalizer
                others = tuple(f for f in one.finalizers if f != mine)
                one = replace(one, finalizers=(*others, mine) if present else others)
                if one.deleting and not one.finalizers:
                    continue  # the API server removes it with its last finalizer
            kept.append(one)
        self.skyhooks = kept

    def delete(self, name: str) -> None:
        self.skyhooks = [replace(s, deleting=True) if s.name == name else s for s in self.skyhooks]

    def status(self, name: str = "gpu-init") -> dict[str, Any]:
        return dict(next(s for s in self.skyhooks if s.name == name).status)


def cluster_nodes(count: int, labels: dict[str, str] | None = None) -> dict[str, NodeView]:
    return {
        f"node-{i:02d}": NodeView(
            f"node-{i:02d}", f"uid-{i}", "1", dict(labels or {}), {}, created=float(i)
        )
        for i in range(count)
    }


def run_until_settled(cluster: FakeCluster, rounds: int = 80) -> None:
    for _ in range(rounds):
        plan = cluster.round()
        if not plan.actions:
            return


def test_two_package_skyhook_over_exponential_policy_reaches_complete_one_job_per_stage_node() -> (
    None
):
    cluster = FakeCluster(
        skyhooks=[skyhook(policy="exp")],
        nodes=cluster_nodes(7),
        policies={"exp": exponential_policy()},
    )
    run_until_settled(cluster)
    status = cluster.status()
    assert status["status"] == "complete"
    assert status["completeNodes"] == "7/7"
    # one Job per (package, stage, node), never two
    assert len(cluster.created) == 2 * 2 * 7
    assert set(cluster.created.values()) == {1}
    # exponential batches: 1, 2, 4
    assert [len(b) for b in cluster.batches] == [1, 2, 4]
    assert status["conditions"][0]["type"] == "Ready"
    assert status["conditions"][0]["status"] == "True"
    # batch state reset on completion (resetBatchStateOnCompletion defaults to true)
    assert "batchState" not in status["compartmentStatuses"]["__default__"]
    # ... and a later round judges no phantom batch.
    plan = cluster.round()
    assert not plan.actions and not plan.decisions


def test_dependencies_run_before_their_dependents_on_each_node() -> None:
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=cluster_nodes(1))
    order: list[tuple[str, str]] = []
    for _ in range(20):
        plan = cluster.round()
        order += [(a.package.name, a.stage) for a in plan.actions if isinstance(a, CreateJob)]
    assert order == [
        ("driver", "apply"),
        ("driver", "config"),
        ("tuning", "apply"),
        ("tuning", "config"),
    ]


def test_rule_an_interrupt_waits_for_its_node_maintenance_to_be_ready() -> None:
    """The reboot runs only once the maintenance-scheduler has cordoned and drained the node
    (its NodeMaintenance Ready): never while the request is still Pending. Here the node is
    already at its interrupt (apply and config done), so only the interrupt's own gate holds
    it."""
    packages = {
        "kernel": {"version": "1.0.0", "image": "ghcr.io/x/k", "interrupt": {"type": "reboot"}}
    }
    at_interrupt = render_node_state(
        {"kernel": PackageState("kernel", "1.0.0", "ghcr.io/x/k", "interrupt", "in_progress")}
    )
    nodes = cluster_nodes(1)
    nodes["node-00"] = replace(
        nodes["node-00"], annotations={node_state_annotation("gpu-init"): at_interrupt}
    )
    request = maintenance_name("gpu-init", "node-00")
    cluster = FakeCluster(
        skyhooks=[skyhook(packages=packages)], nodes=nodes, held_pending={request}
    )
    cluster.maintenances[request] = "Pending"
    cluster.maintenance_owners[request] = ("gpu-init", "node-00")
    for _ in range(6):
        plan = cluster.round()
        assert not [a for a in plan.actions if isinstance(a, CreateJob)]
    # The request is kept (not released, not made again) and the node is in progress.
    assert cluster.maintenances == {request: "Pending"}
    assert cluster.status()["nodeStatus"] == {"node-00": "in_progress"}
    # The node is drained: the interrupt starts in the very next round.
    cluster.held_pending.clear()
    plan = cluster.round()
    assert cluster.last_world is not None
    assert cluster.last_world.maintenances == {request: "Ready"}
    expect_actions(plan.actions, CreateJob, count=1, stage="interrupt", node="node-00")


def test_interrupt_stage_is_released_after_it_ran_once() -> None:
    packages = {
        "kernel": {"version": "1.0.0", "image": "ghcr.io/x/k", "interrupt": {"type": "reboot"}}
    }
    cluster = FakeCluster(skyhooks=[skyhook(packages=packages)], nodes=cluster_nodes(1))
    request = maintenance_name("gpu-init", "node-00")
    phases_at_interrupt: list[str | None] = []
    released = False
    for _ in range(20):
        plan = cluster.round()
        assert cluster.last_world is not None
        for action in plan.actions:
            if isinstance(action, CreateJob) and action.stage == "interrupt":
                phases_at_interrupt.append(cluster.last_world.maintenances.get(request))
            if isinstance(action, DeleteMaintenance):
                released = True
    assert phases_at_interrupt == ["Ready"]
    assert released and request not in cluster.maintenances
    assert cluster.status()["status"] == "complete"


def test_rule_a_node_labelled_skyhook_ignore_gets_no_job() -> None:
    nodes = cluster_nodes(2)
    ignored = replace(nodes["node-00"], labels={"skyhook.nvidia.com/ignore": "True"})
    nodes["node-00"] = ignored
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=nodes)
    plan = cluster.round()
    expect_no_actions(plan.actions, CreateJob, node="node-00", while_it_has=CreateJob)
    expect_actions(plan.actions, CreateJob, node="node-01")
    # It stays a target (upstream keeps it): blocked, named by NodesIgnored.
    assert cluster.status()["nodeStatus"]["node-00"] == "blocked"
    conditions = {c["type"]: c for c in cluster.status()["conditions"]}
    assert conditions["NodesIgnored"]["status"] == "True"
    assert "node-00" in conditions["NodesIgnored"]["message"]
    # The label's value decides: "false" ignores nothing.
    alone = {"node-00": replace(ignored, labels={"skyhook.nvidia.com/ignore": "false"})}
    plan = FakeCluster(skyhooks=[skyhook()], nodes=alone).round()
    expect_actions(plan.actions, CreateJob, node="node-00")


def test_rule_serial_true_runs_one_package_at_a_time_on_a_node() -> None:
    packages = {
        "driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"},
        "tuning": {"version": "1.0.0", "image": "ghcr.io/x/tuning"},
    }
    serial = parse_skyhook(
        {
            "metadata": {"name": "gpu-init", "uid": "u", "finalizers": [SKYHOOK_FINALIZER]},
            "spec": {"packages": packages, "serial": True},
        }
    )
    cluster = FakeCluster(skyhooks=[serial], nodes=cluster_nodes(1))
    running: list[set[str]] = []
    for _ in range(12):
        plan = cluster.round()
        started = {a.package.name for a in plan.actions if isinstance(a, CreateJob)}
        if started:
            running.append(started)
    # One package per round, each of its stages before the next package starts.
    assert running == [{"driver"}, {"driver"}, {"tuning"}, {"tuning"}]
    assert cluster.status()["status"] == "complete"
    # Without serial, independent packages start together.
    parallel = FakeCluster(skyhooks=[skyhook(packages=packages)], nodes=cluster_nodes(1))
    expect_actions(parallel.round().actions, CreateJob, count=2, stage="apply")


def test_failed_batches_stop_the_rollout_after_failure_threshold() -> None:
    cluster = FakeCluster(
        skyhooks=[skyhook(policy="exp")],
        nodes=cluster_nodes(16),
        policies={"exp": exponential_policy(failure_threshold=2)},
        fail_images=("ghcr.io/x/driver",),
    )
    run_until_settled(cluster)
    status = cluster.status()
    batch = status["compartmentStatuses"]["__default__"]["batchState"]
    assert batch["shouldStop"] is True
    assert batch["consecutiveFailures"] == 2
    # batch 1 (1 node) failed, so batch 2 shrank to 1 node, which failed too: then nothing.
    assert [len(b) for b in cluster.batches] == [1, 1]
    # Erroring beside waiting nodes is a mix: unknown, as upstream's CollectNodeStatus.
    assert status["status"] == "unknown"
    assert any(c["type"] == "RolloutStopped" for c in status["conditions"])
    assert status["nodeStatus"]["node-15"] == "waiting"


def test_pause_starts_no_new_stage_and_resume_finishes() -> None:
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=cluster_nodes(2))
    cluster.round()  # driver apply created on both nodes
    cluster.skyhooks = [replace(cluster.skyhooks[0], paused=True)]
    creates_while_paused = 0
    for _ in range(5):
        plan = cluster.round()
        creates_while_paused += sum(isinstance(a, CreateJob) for a in plan.actions)
    assert creates_while_paused == 0
    assert cluster.status()["status"] == "paused"
    cluster.skyhooks = [replace(cluster.skyhooks[0], paused=False)]
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    assert set(cluster.created.values()) == {1}


def test_unreadable_node_state_is_left_alone_fail_closed() -> None:
    nodes = cluster_nodes(1)
    nodes["node-00"] = replace(
        nodes["node-00"], annotations={node_state_annotation("gpu-init"): "{broken"}
    )
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=nodes)
    plan = cluster.round()
    assert not [a for a in plan.actions if isinstance(a, CreateJob | PatchNode)]
    assert cluster.status()["nodeStatus"] == {"node-00": "unknown"}


def test_missing_deployment_policy_sets_condition_and_starts_nothing() -> None:
    cluster = FakeCluster(skyhooks=[skyhook(policy="gone")], nodes=cluster_nodes(2))
    plan = cluster.round()
    assert not [a for a in plan.actions if isinstance(a, CreateJob)]
    conditions = {c["type"]: c for c in cluster.status()["conditions"]}
    assert conditions["DeploymentPolicyNotFound"]["status"] == "True"


def test_policy_in_use_gets_the_finalizer_and_loses_it_when_unused() -> None:
    bare = replace(exponential_policy(), finalizers=())
    used = FakeCluster(skyhooks=[skyhook(policy="exp")], nodes={}, policies={"exp": bare})
    assert [
        (a.policy.name, a.present)
        for a in used.round().actions
        if isinstance(a, SetPolicyFinalizer)
    ] == [("exp", True)]
    unused = FakeCluster(skyhooks=[skyhook()], nodes={}, policies={"exp": exponential_policy()})
    assert [
        (a.policy.name, a.present)
        for a in unused.round().actions
        if isinstance(a, SetPolicyFinalizer)
    ] == [("exp", False)]


def test_priority_lower_first_then_name_per_node() -> None:
    first = skyhook("zz-first", priority=10)
    second = skyhook("aa-second", priority=20)
    cluster = FakeCluster(skyhooks=[second, first], nodes=cluster_nodes(1))
    plan = cluster.round()
    assert {a.skyhook.name for a in plan.actions if isinstance(a, CreateJob)} == {"zz-first"}
    assert cluster.status("aa-second")["nodeStatus"] == {"node-00": "waiting"}
    run_until_settled(cluster)
    assert cluster.status("zz-first")["status"] == "complete"
    assert cluster.status("aa-second")["status"] == "complete"


def test_sequencing_all_holds_later_skyhooks_until_every_node_is_complete() -> None:
    packages = {"driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"}}
    done = render_node_state(
        {"driver": PackageState("driver", "1.0.0", "ghcr.io/x/driver", "config", "complete")}
    )
    nodes = cluster_nodes(2)
    # `first` is complete on node-01, not yet on node-00.
    nodes["node-01"] = replace(nodes["node-01"], annotations={node_state_annotation("first"): done})
    for sequencing, second_starts_on_node_01 in (("all", False), ("node", True)):
        first = skyhook("first", packages, priority=10, sequencing=sequencing)
        second = skyhook("second", packages, priority=20)
        world = World([first, second], {}, list(nodes.values()), {}, {})
        plan = plan_round(world, now=T0)
        second_nodes = {
            a.node for a in plan.actions if isinstance(a, CreateJob) and a.skyhook.name == "second"
        }
        assert second_nodes == ({"node-01"} if second_starts_on_node_01 else set())


def test_unpullable_image_fails_the_job_after_the_grace() -> None:
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=cluster_nodes(1))
    cluster.round()
    job = next(iter(cluster.jobs))
    stuck = JobFacts(job, "running", pull_stuck_since=T0, pull_image="ghcr.io/x/driver:1.0.0")
    world = replace(cluster.world(), jobs={job: stuck})
    early = plan_round(world, now=T0 + 60, pull_grace_seconds=120)
    assert not [a for a in early.actions if isinstance(a, FailJob)]
    late = plan_round(world, now=T0 + 121, pull_grace_seconds=120)
    failed = [a for a in late.actions if isinstance(a, FailJob)]
    assert [a.name for a in failed] == [job]
    assert "ghcr.io/x/driver:1.0.0" in failed[0].message
    patch = next(a for a in late.actions if isinstance(a, PatchNode))
    assert patch.status == "erroring"


@settings(max_examples=60, deadline=None)
@given(
    paused=st.booleans(),
    disabled=st.booleans(),
    broken=st.sets(st.integers(0, 5)),
    fates=st.lists(st.sampled_from(("complete", "failed")), min_size=1, max_size=6),
    rounds=st.integers(1, 25),
)
def test_no_job_is_ever_created_twice_nor_on_unreadable_nodes_nor_while_paused(
    paused: bool,
    disabled: bool,
    broken: set[int],
    fates: list[Literal["complete", "failed"]],
    rounds: int,
) -> None:
    nodes = cluster_nodes(6)
    for index in broken:
        name = f"node-{index:02d}"
        nodes[name] = replace(nodes[name], annotations={node_state_annotation("gpu-init"): "["})
    packages = {
        "driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"},
        "kernel": {
            "version": "1.0.0",
            "image": "ghcr.io/x/kernel",
            "interrupt": {"type": "reboot"},
        },
    }
    annotations = {}
    if paused:
        annotations["skyhook.nvidia.com/pause"] = "true"
    if disabled:
        annotations["skyhook.nvidia.com/disable"] = "true"
    cluster = FakeCluster(
        skyhooks=[skyhook(packages=packages, policy="exp", annotations=annotations)],
        nodes=nodes,
        policies={"exp": exponential_policy(failure_threshold=3)},
    )
    for index in range(rounds):
        before_maintenances = dict(cluster.maintenances)
        # Jobs created in this round fail or complete by the fates list.
        plan = cluster.round()
        for action in plan.actions:
            if isinstance(action, CreateJob):
                cluster.fate[action.name] = fates[index % len(fates)]
                assert not paused and not disabled
                assert int(action.node[-2:]) not in broken
                if action.stage == "interrupt":
                    request = maintenance_name("gpu-init", action.node)
                    assert before_maintenances.get(request) is not None
    assert max(cluster.created.values(), default=1) == 1
    # ... and the rollout does run where it may: a planner that starts nothing fails here.
    if not paused and not disabled and len(broken) < len(nodes):
        assert cluster.created


def test_a_left_over_maintenance_request_is_released_once_no_interrupt_needs_it() -> None:
    """The request of a node whose interrupt is over goes even when the round that finished
    it lost its delete, or when its Skyhook is gone -- a cordoned node is never left behind."""
    packages = {
        "kernel": {"version": "1.0.0", "image": "ghcr.io/x/k", "interrupt": {"type": "reboot"}}
    }
    cluster = FakeCluster(skyhooks=[skyhook(packages=packages)], nodes=cluster_nodes(1))
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    request = maintenance_name("gpu-init", "node-00")
    # A request left over from a lost delete, on a complete node:
    cluster.maintenances[request] = "Ready"
    cluster.maintenance_owners[request] = ("gpu-init", "node-00")
    plan = cluster.round()
    assert [a.name for a in plan.actions if isinstance(a, DeleteMaintenance)] == [request]
    # ... and one of a Skyhook that no longer exists:
    cluster.maintenances["skyhook-gone-node-00-x"] = "Ready"
    cluster.maintenance_owners["skyhook-gone-node-00-x"] = ("gone", "node-00")
    plan = cluster.round()
    assert [a.name for a in plan.actions if isinstance(a, DeleteMaintenance)] == [
        "skyhook-gone-node-00-x"
    ]


def test_a_request_is_kept_while_the_node_state_cannot_be_read() -> None:
    nodes = cluster_nodes(1)
    nodes["node-00"] = replace(
        nodes["node-00"], annotations={node_state_annotation("gpu-init"): "{broken"}
    )
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=nodes)
    request = maintenance_name("gpu-init", "node-00")
    cluster.maintenances[request] = "Ready"
    cluster.maintenance_owners[request] = ("gpu-init", "node-00")
    plan = cluster.round()
    expect_no_actions(plan.actions, DeleteMaintenance, while_it_has=SetSkyhookStatus)
    assert cluster.status()["nodeStatus"] == {"node-00": "unknown"}
    # Once the state reads again and no interrupt needs the request, it goes.
    cluster.nodes["node-00"] = replace(nodes["node-00"], annotations={})
    plan = cluster.round()
    expect_actions(plan.actions, DeleteMaintenance, count=1, name=request)


def test_clearing_the_batch_state_resumes_a_stopped_rollout() -> None:
    cluster = FakeCluster(
        skyhooks=[skyhook(policy="exp")],
        nodes=cluster_nodes(8),
        policies={"exp": exponential_policy(failure_threshold=1)},
        fail_images=("ghcr.io/x/driver",),
    )
    run_until_settled(cluster)
    assert cluster.status()["compartmentStatuses"]["__default__"]["batchState"]["shouldStop"]
    assert [len(b) for b in cluster.batches] == [1]
    # A person fixes the image and clears the batch state.
    cluster.fail_images = ()
    status = {k: v for k, v in cluster.status().items() if k != "compartmentStatuses"}
    cluster.skyhooks = [replace(cluster.skyhooks[0], status=status)]
    run_until_settled(cluster)
    status = cluster.status()
    # The failed node stays erroring (its Job kept); the other seven complete.
    assert status["nodeStatus"]["node-00"] == "erroring"
    assert sum(1 for s in status["nodeStatus"].values() if s == "complete") == 7
    assert [len(b) for b in cluster.batches] == [1, 1, 2, 4]


def test_a_failed_interrupt_keeps_the_node_under_maintenance() -> None:
    packages = {
        "kernel": {"version": "1.0.0", "image": "ghcr.io/x/k", "interrupt": {"type": "reboot"}}
    }
    cluster = FakeCluster(skyhooks=[skyhook(packages=packages)], nodes=cluster_nodes(1))
    request = maintenance_name("gpu-init", "node-00")
    for _ in range(20):
        plan = cluster.round()
        for action in plan.actions:
            if isinstance(action, CreateJob) and action.stage == "interrupt":
                cluster.fate[action.name] = "failed"
    assert cluster.status()["nodeStatus"] == {"node-00": "erroring"}
    assert request in cluster.maintenances  # still cordoned and drained


def test_a_failed_job_loses_its_ttl_so_it_stays_for_its_logs() -> None:
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=cluster_nodes(1))
    cluster.round()
    (job,) = cluster.jobs
    failed = JobFacts(job, "failed", reason="BackoffLimitExceeded", ttl_seconds=86400)
    plan = plan_round(replace(cluster.world(), jobs={job: failed}), now=T0 + 5)
    assert [a.name for a in plan.actions if isinstance(a, KeepFailedJob)] == [job]
    kept = JobFacts(job, "failed", reason="BackoffLimitExceeded", ttl_seconds=None)
    plan = plan_round(replace(cluster.world(), jobs={job: kept}), now=T0 + 6)
    assert not [a for a in plan.actions if isinstance(a, KeepFailedJob)]


def test_a_new_version_runs_upgrade_and_a_removed_package_uninstall() -> None:
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=cluster_nodes(2))
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    status = cluster.status()
    changed = skyhook(packages={"driver": {"version": "1.1.0", "image": "ghcr.io/x/driver"}})
    cluster.skyhooks = [replace(changed, status=status)]
    stages: list[tuple[str, str, str]] = []
    for _ in range(20):
        plan = cluster.round()
        stages += [
            (a.package.name, a.package.version, a.stage)
            for a in plan.actions
            if isinstance(a, CreateJob) and a.node == "node-00"
        ]
    assert sorted(stages) == [
        ("driver", "1.1.0", "config"),
        ("driver", "1.1.0", "upgrade"),
        ("tuning", "1.0.0", "uninstall"),
    ]
    assert cluster.status()["status"] == "complete"
    state = cluster.nodes["node-00"].annotations[node_state_annotation("gpu-init")]
    assert list(json.loads(state)) == ["driver|1.1.0"]


def test_rule_skyhook_gets_its_finalizer_before_it_writes_on_any_node() -> None:
    cluster = FakeCluster(skyhooks=[skyhook(finalizers=())], nodes=cluster_nodes(3))
    plan = cluster.round()
    assert [type(a) for a in plan.actions] == [SetSkyhookFinalizer]
    assert cluster.skyhooks[0].finalizers == (SKYHOOK_FINALIZER,)
    plan = cluster.round()
    assert any(isinstance(a, CreateJob) for a in plan.actions)


def test_rule_deleting_a_skyhook_removes_its_node_marks_and_requests_before_its_finalizer() -> None:
    packages = {
        "kernel": {"version": "1.0.0", "image": "ghcr.io/x/k", "interrupt": {"type": "reboot"}}
    }
    other = skyhook("other", {"tool": {"version": "1.0.0", "image": "ghcr.io/x/t"}})
    cluster = FakeCluster(skyhooks=[skyhook(packages=packages), other], nodes=cluster_nodes(3))
    while not cluster.maintenances:  # mid-rollout: an interrupt holds a NodeMaintenance
        cluster.round()
    marked = [n for n in cluster.nodes.values() if status_key("gpu-init") in n.labels]
    assert marked
    cluster.delete("gpu-init")
    # The node a selector no longer matches is cleaned too: marks are looked for everywhere.
    plan = cluster.round()
    assert not any(isinstance(a, CreateJob) and a.skyhook.name == "gpu-init" for a in plan.actions)
    assert {a.node.name for a in plan.actions if isinstance(a, ForgetNode)} == {
        n.name for n in marked
    }
    assert not any(isinstance(a, SetSkyhookFinalizer) for a in plan.actions)
    run_until_settled(cluster)
    assert [s.name for s in cluster.skyhooks] == ["other"]
    assert not cluster.maintenances
    for node in cluster.nodes.values():
        leftover = [k for k in (*node.annotations, *node.labels) if k.endswith("_gpu-init")]
        assert not leftover
        assert node.labels[status_key("other")] == "complete"  # the other Skyhook's stay


def test_rule_deleted_skyhook_keeps_its_finalizer_while_a_node_cannot_be_cleaned_yet() -> None:
    nodes = cluster_nodes(1)
    node = nodes["node-00"]
    nodes["node-00"] = replace(node, labels={status_key("gpu-init"): "in_progress"})
    deleting = replace(skyhook(), deleting=True)
    world = World(
        skyhooks=[deleting],
        policies={},
        nodes=list(nodes.values()),
        jobs={},
        maintenances={},
        settling=frozenset({"node-00"}),  # its last patch is not visible yet
    )
    plan = plan_round(world, now=T0)
    assert plan.actions == []
    # Once the patch is visible, the node is cleaned (and the finalizer goes after that).
    plan = plan_round(replace(world, settling=frozenset()), now=T0)
    expect_actions(plan.actions, ForgetNode, count=1, node__name="node-00")
    expect_no_actions(plan.actions, SetSkyhookFinalizer, while_it_has=ForgetNode)

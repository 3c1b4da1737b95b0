"""Both names of NVIDIA's operator, one controller: a Skyhook (skyhook.nvidia.com/v1alpha1) and
a NodeWright (nodewright.nvidia.com/v1alpha1, its v0.18 rename) each read and write only the
keys of their own group (nodeflow_contracts.skyhook), so a cluster on either release moves to
Nodeflow without rewriting a manifest and the two kinds never touch each other's marks."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from k8s_watcher.kinds import resolve_kind
from k8s_watcher.policy import Allowed, authorize
from maintenance_scheduler.skyhook.api import (
    DeploymentPolicy,
    Skyhook,
    parse_deployment_policy,
    parse_skyhook,
    reconciled,
)
from maintenance_scheduler.skyhook.commands import commands_for, decision_for
from maintenance_scheduler.skyhook.jobs import DRAIN_POD_SELECTOR, build_job, maintenance_name
from maintenance_scheduler.skyhook.observe import job_facts, skyhook_conditions
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    ForgetNode,
    NodeView,
    SetNodeConditions,
    SetPolicyFinalizer,
    SetRuntimeTaint,
    SetSkyhookFinalizer,
    SetSkyhookStatus,
    SkyhookAction,
    World,
    plan_round,
)
from maintenance_scheduler.skyhook.pod import PodOptions
from maintenance_scheduler.skyhook.service import only_skyhook_pods
from nodeflow_contracts.k8s import K8sCommand
from nodeflow_contracts.permissions import BUS_GRANTS
from nodeflow_contracts.skyhook import FLAVORS, NODEWRIGHT, SKYHOOK, SkyhookNames, flavor_of
from nodeflow_contracts.topology import WATCHED_KINDS
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import (
    T0,
    FakeCluster,
    cluster_nodes,
    run_until_settled,
)

OTHER = {SKYHOOK: NODEWRIGHT, NODEWRIGHT: SKYHOOK}
BOTH = pytest.mark.parametrize("names", FLAVORS, ids=[n.kind for n in FLAVORS])
# Any key of either group: `<group>/...` as a label, annotation, condition type or finalizer.
GROUP_KEY = re.compile(r"(skyhook|nodewright)\.nvidia\.com/")


def flavored(
    names: SkyhookNames,
    name: str = "gpu-init",
    spec: dict[str, Any] | None = None,
    *,
    annotations: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
) -> Skyhook:
    packages = {
        "driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"},
        "kernel": {
            "version": "2.0.0",
            "image": "ghcr.io/x/kernel",
            "interrupt": {"type": "reboot"},
            "configMap": {"k": "v"},
        },
    }
    return parse_skyhook(
        {
            "apiVersion": names.api_version,
            "kind": names.kind,
            "metadata": {
                "name": name,
                "uid": f"uid-{names.kind}-{name}",
                "generation": 1,
                "annotations": annotations or {},
                "finalizers": [names.finalizer] if finalizers is None else finalizers,
            },
            "spec": {"packages": packages, **(spec or {})},
        }
    )


def commands(action: SkyhookAction) -> list[K8sCommand]:
    return commands_for(
        action, T0, namespace="skyhook", default_stage_timeout_seconds=0, drain_timeout_seconds=0
    )


def msgspec_to_builtins(operation: Any) -> Any:
    return msgspec.to_builtins(operation)


def group_keys(value: Any) -> set[str]:
    """Every `<group>/...` key or value in a command body (labels, annotations, condition
    types, finalizers)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if isinstance(key, str) and GROUP_KEY.match(key):
                found.add(key)
            found |= group_keys(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= group_keys(inner)
    elif isinstance(value, str) and GROUP_KEY.match(value):
        found.add(value)
    return found


@BOTH
def test_rule_the_kind_of_an_object_is_read_from_its_api_version(names: SkyhookNames) -> None:
    assert flavor_of(names.api_version, names.kind) is names
    parsed = flavored(names, annotations={names.pause_annotation: "true"})
    assert parsed.names is names and parsed.paused and not parsed.problems
    # The other group's pause and disable annotations mean nothing to it.
    other = OTHER[names]
    foreign = {other.pause_annotation: "true", other.disable_annotation: "true"}
    parsed = flavored(names, annotations=foreign)
    assert not parsed.paused and not parsed.disabled


@BOTH
def test_rule_each_kind_writes_only_its_own_keys_and_every_write_is_allowed(
    names: SkyhookNames,
) -> None:
    """A rollout with an interrupt (so a NodeMaintenance and the cordon mark), to complete:
    every key of every command (node annotations and labels, node conditions, Job and pod
    labels and annotations, ConfigMaps, the NodeMaintenance, the finalizer, the status) is of
    the object's own group, and k8s-watcher's policy lets each command through."""
    cluster = FakeCluster(skyhooks=[flavored(names)], nodes=cluster_nodes(2))
    written: set[str] = set()
    targets: set[tuple[str, str]] = set()
    for _ in range(80):
        plan = cluster.round()
        for action in plan.actions:
            for command in commands(action):
                assert isinstance(authorize(command, command.subject), Allowed), command
                body = command.operation
                written |= group_keys(msgspec_to_builtins(body))
                targets.add((command.target.api_version, command.target.kind))
        if not plan.actions:
            break
    assert cluster.status()["status"] == "complete"
    other = OTHER[names]
    assert written and all(key.startswith(names.prefix) for key in written), sorted(written)
    assert (names.api_version, names.kind) in targets
    assert (other.api_version, other.kind) not in targets
    expected = {
        names.node_state_annotation("gpu-init"),
        names.status_key("gpu-init"),
        names.version_annotation("gpu-init"),
        names.cordon_annotation("gpu-init"),
        names.not_ready_condition("gpu-init"),
        names.erroring_condition("gpu-init"),
        names.name_label,
        names.package_label,
        names.node_label,
        names.stage_label,
        names.resource_id_label,
        names.package_annotation,
        names.identity_annotation,
        names.node_metadata_label,
    }
    assert expected <= written
    node = cluster.nodes["node-00"]
    assert node.labels[names.status_key("gpu-init")] == "complete"
    assert node.conditions[names.not_ready_condition("gpu-init")]["status"] == "False"
    assert not any(key.startswith(other.prefix) for key in (*node.annotations, *node.labels))


@BOTH
def test_rule_a_stage_job_belongs_to_its_kind_and_is_read_back_as_such(
    names: SkyhookNames,
) -> None:
    owner = flavored(names)
    package = owner.packages[0]
    job = build_job(
        owner,
        package,
        "apply",
        "node-00",
        namespace="skyhook",
        default_stage_timeout_seconds=0,
        node_uid="uid-0",
    )
    labels = job["metadata"]["labels"]
    assert labels[names.name_label] == "gpu-init" and labels[names.node_label] == "node-00"
    assert job["spec"]["template"]["metadata"]["labels"] == labels
    (reference,) = job["metadata"]["ownerReferences"]
    assert (reference["apiVersion"], reference["kind"]) == (names.api_version, names.kind)
    assert names.identity_annotation in job["metadata"]["annotations"]
    # observe reads its slot and identity from its kind's keys.
    facts = job_facts(job, [])
    assert facts.slot == (owner.owner_key, package.name, "node-00")
    assert facts.identity is not None and facts.identity["skyhook"] == owner.uid
    assert facts.stage == "apply"
    # Its pods stay in the controller's view.
    pod = {"metadata": {"labels": dict(labels)}}
    assert only_skyhook_pods(pod) is pod
    # The pod tolerates its kind's runtime-required taint.
    key = names.runtime_required_taint.split("=")[0]
    assert key in {t.get("key") for t in job["spec"]["template"]["spec"]["tolerations"]}


def test_rule_an_interrupts_drain_never_evicts_a_package_pod_of_either_kind() -> None:
    assert DRAIN_POD_SELECTOR == "!skyhook.nvidia.com/name,!nodewright.nvidia.com/name"


@BOTH
def test_rule_only_the_own_finalizer_lets_an_object_work(names: SkyhookNames) -> None:
    # Carrying the other kind's finalizer is not carrying its own: it asks for its own first.
    bare = flavored(names, finalizers=[OTHER[names].finalizer])
    plan = plan_round(
        World(skyhooks=[bare], policies={}, nodes=[], jobs={}, maintenances={}), now=T0
    )
    (action,) = plan.actions
    assert isinstance(action, SetSkyhookFinalizer) and action.present
    (command,) = commands(action)
    assert (command.target.api_version, command.target.kind) == (names.api_version, names.kind)
    patch = msgspec_to_builtins(command.operation)["patch"]
    assert patch["metadata"]["finalizers"] == [OTHER[names].finalizer, names.finalizer]


@BOTH
def test_rule_only_the_own_ignore_label_keeps_a_node_out(names: SkyhookNames) -> None:
    nodes = cluster_nodes(2)
    nodes["node-00"] = replace(nodes["node-00"], labels={names.ignore_label: "true"})
    nodes["node-01"] = replace(nodes["node-01"], labels={OTHER[names].ignore_label: "true"})
    cluster = FakeCluster(skyhooks=[flavored(names, spec={})], nodes=nodes)
    run_until_settled(cluster)
    status = cluster.status()
    assert status["nodeStatus"]["node-00"] == "blocked"
    assert status["nodeStatus"]["node-01"] == "complete"


@BOTH
def test_rule_the_runtime_required_taint_and_its_mark_are_the_kinds_own(
    names: SkyhookNames,
) -> None:
    spec = {"runtimeRequired": True, "autoTaintNewNodes": True}
    # A node the other kind already works on is not new either.
    nodes = cluster_nodes(2)
    nodes["node-01"] = replace(
        nodes["node-01"], annotations={OTHER[names].status_key("x"): "complete"}
    )
    world = World(
        skyhooks=[flavored(names, spec=spec)],
        policies={},
        nodes=list(nodes.values()),
        jobs={},
        maintenances={},
    )
    plan = plan_round(world, now=T0)
    taints = [a for a in plan.actions if isinstance(a, SetRuntimeTaint)]
    assert [(a.node.name, a.names) for a in taints] == [("node-00", names)]
    key = names.runtime_required_taint.partition("=")[0]
    assert taints[0].taint == {"key": key, "value": "runtime-required", "effect": "NoSchedule"}
    (command,) = commands(taints[0])
    assert isinstance(authorize(command, command.subject), Allowed)
    patch = msgspec_to_builtins(command.operation)["patch"]
    assert patch["metadata"]["annotations"] == {names.auto_taint_annotation(key): "true"}
    assert PodOptions().runtime_required_toleration(names)["key"] == key


def test_rule_a_nodewright_and_a_skyhook_taint_and_untaint_a_node_each_with_its_own_taint() -> None:
    both = [
        flavored(SKYHOOK, "legacy", spec={"runtimeRequired": True}),
        flavored(NODEWRIGHT, "renamed", spec={"runtimeRequired": True}),
    ]
    taints = tuple(World(both, {}, [], {}, {}).runtime_taint_of(n) for n in FLAVORS)
    nodes = {n: replace(v, taints=taints) for n, v in cluster_nodes(1).items()}
    cluster = FakeCluster(skyhooks=both, nodes=nodes)
    removed: list[SetRuntimeTaint] = []
    for _ in range(40):
        removed += [a for a in cluster.round().actions if isinstance(a, SetRuntimeTaint)]
    assert {a.taint["key"] for a in removed} == {"skyhook.nvidia.com", "nodewright.nvidia.com"}
    # Each taint goes with its own kind's mark of ownership.
    assert all(a.names.group == a.taint["key"] for a in removed)


@BOTH
def test_rule_a_deleted_object_removes_only_its_own_marks(names: SkyhookNames) -> None:
    """Both kinds once named `gpu-init` on the node: deleting one leaves the other's keys."""
    marks = {
        key: "complete"
        for n in FLAVORS
        for key in (n.status_key("gpu-init"), n.node_state_annotation("gpu-init"))
    }
    conditions = {
        n.not_ready_condition("gpu-init"): {"type": n.not_ready_condition("gpu-init")}
        for n in FLAVORS
    }
    node = NodeView("node-00", "uid-0", "1", {}, marks, created=0.0, conditions=conditions)
    doomed = replace(flavored(names), deleting=True)
    plan = plan_round(World([doomed], {}, [node], {}, {}), now=T0)
    forget = [a for a in plan.actions if isinstance(a, ForgetNode)]
    gone = [a for a in plan.actions if isinstance(a, SetNodeConditions)]
    assert len(forget) == 1 and len(gone) == 1
    assert gone[0].removed == (names.not_ready_condition("gpu-init"),)
    patch = msgspec_to_builtins(commands(forget[0])[0].operation)["patch"]
    removed = set(patch["metadata"]["annotations"]) | set(patch["metadata"]["labels"])
    assert removed and all(key.startswith(names.prefix) for key in removed)


def test_rule_of_a_name_both_kinds_hold_the_nodewright_is_reconciled() -> None:
    legacy, renamed = flavored(SKYHOOK), flavored(NODEWRIGHT)
    other = flavored(SKYHOOK, "other")
    assert reconciled([legacy, renamed, other]) == [renamed, other]
    # A shadowed Skyhook being deleted still removes its own marks and its finalizer.
    going = replace(legacy, deleting=True)
    assert reconciled([going, renamed]) == [going, renamed]


def test_rule_a_skyhook_and_a_nodewright_of_one_name_never_share_a_node_maintenance() -> None:
    legacy, renamed = flavored(SKYHOOK), flavored(NODEWRIGHT)
    # The Skyhook keeps its name form (its existing requests are found); the NodeWright has
    # its own.
    assert maintenance_name("gpu-init", "node-00") == maintenance_name(
        "gpu-init", "node-00", SKYHOOK
    )
    assert maintenance_name("gpu-init", "node-00", NODEWRIGHT) != maintenance_name(
        "gpu-init", "node-00"
    )
    assert legacy.owner_key != renamed.owner_key
    node = NodeView("node-00", "uid-0", "1", {}, {}, created=0.0)
    legacy_request = maintenance_name("gpu-init", "node-00")
    # The NodeWright's kernel waits for a drain of its own: the Skyhook's Ready request is not
    # it (its own is requested, no interrupting stage starts).
    plan = plan_round(
        World(
            [renamed],
            {},
            [node],
            {},
            {legacy_request: "Ready"},
            maintenance_owners={legacy_request: (legacy.owner_key, "node-00")},
        ),
        now=T0,
    )
    made = [a for a in plan.actions if isinstance(a, CreateMaintenance)]
    assert [(a.skyhook.names, a.name) for a in made] == [
        (NODEWRIGHT, maintenance_name("gpu-init", "node-00", NODEWRIGHT))
    ]
    assert not [a for a in plan.actions if isinstance(a, CreateJob) and a.package.name == "kernel"]
    # A shadowed Skyhook being deleted drops its finalizer while the NodeWright of its name
    # still holds a NodeMaintenance: that request is not the Skyhook's.
    own = maintenance_name("gpu-init", "node-00", NODEWRIGHT)
    going = replace(legacy, deleting=True)
    plan = plan_round(
        World(
            [going, renamed],
            {},
            [node],
            {},
            {own: "Ready"},
            maintenance_owners={own: (renamed.owner_key, "node-00")},
        ),
        now=T0,
    )
    dropped = [a for a in plan.actions if isinstance(a, SetSkyhookFinalizer)]
    assert [(a.skyhook.names, a.present) for a in dropped] == [(SKYHOOK, False)]


def test_rule_a_nodewright_finds_the_request_an_earlier_release_named_as_a_skyhooks() -> None:
    cluster = FakeCluster([flavored(NODEWRIGHT)], cluster_nodes(1))
    own = maintenance_name("gpu-init", "node-00", NODEWRIGHT)
    for _ in range(20):
        cluster.round()
        if own in cluster.maintenances and any("kernel" in name for name in cluster.jobs):
            break
    assert cluster.maintenances.get(own) == "Ready"
    # An earlier release named the NodeWright's request as a Skyhook's: found by its labels,
    # it stays its drain (no second request, not released mid-run) and the kernel goes on.
    earlier = maintenance_name("gpu-init", "node-00")
    cluster.maintenances[earlier] = cluster.maintenances.pop(own)
    cluster.maintenance_owners[earlier] = cluster.maintenance_owners.pop(own)
    assert cluster.world().request_of(cluster.skyhooks[0], "node-00") == earlier
    stages: list[str] = []
    for _ in range(20):
        plan = cluster.round()
        if earlier not in cluster.maintenances:
            break
        assert not [a for a in plan.actions if isinstance(a, CreateMaintenance)]
        stages += [a.stage for a in plan.actions if isinstance(a, CreateJob)]
    assert "post-interrupt" in stages
    assert cluster.maintenances == {}


def test_rule_node_conditions_of_both_kinds_are_kept_in_the_node_view() -> None:
    kinds = [n.not_ready_condition("a") for n in FLAVORS] + ["Ready"]
    node = {"status": {"conditions": [{"type": kind, "status": "True"} for kind in kinds]}}
    assert set(skyhook_conditions(node)) == set(kinds[:2])


@pytest.mark.parametrize(
    ("raw", "seconds"), [("15m", 900), ("1h30m", 5400), ("0", 0), (600, 600), (None, None)]
)
def test_rule_a_stage_timeout_is_seconds_or_a_go_duration(raw: Any, seconds: int | None) -> None:
    package = {"version": "1.0.0", "image": "ghcr.io/x/driver", "stageTimeout": raw}
    parsed = flavored(NODEWRIGHT, spec={"packages": {"driver": package}})
    assert not parsed.problems
    assert parsed.packages[0].stage_timeout_seconds == seconds
    job = build_job(
        parsed,
        parsed.packages[0],
        "apply",
        "node-00",
        namespace="skyhook",
        default_stage_timeout_seconds=3600,
    )
    # "0" removes the bound; unset takes the controller's default.
    expected = 3600 if seconds is None else seconds
    assert job["spec"].get("activeDeadlineSeconds") == (expected or None)
    bad = {**package, "stageTimeout": "soon"}
    assert flavored(NODEWRIGHT, spec={"packages": {"driver": bad}}).problems


def policy_of(names: SkyhookNames, finalizers: tuple[str, ...] = ()) -> DeploymentPolicy:
    return parse_deployment_policy(
        {
            "apiVersion": names.api_version,
            "kind": "DeploymentPolicy",
            "metadata": {"name": "rollout", "uid": f"p-{names.kind}", "finalizers": finalizers},
            "spec": {"default": {"budget": {"percent": 100}}},
        }
    )


def world_with(names: SkyhookNames, owner: Skyhook, policy: DeploymentPolicy) -> World:
    own_group = policy.names == NODEWRIGHT
    return World(
        skyhooks=[owner],
        policies={} if own_group else {policy.name: policy},
        nodewright_policies={policy.name: policy} if own_group else {},
        nodes=list(cluster_nodes(1).values()),
        jobs={},
        maintenances={},
    )


@BOTH
def test_rule_an_object_names_a_deployment_policy_of_its_own_group(names: SkyhookNames) -> None:
    """upstream's rename moves DeploymentPolicy to nodewright.nvidia.com (kind kept): a
    NodeWright's policy is of that group, a Skyhook's of skyhook.nvidia.com; a policy of the
    other group by the same name is not the one it names."""
    owner = flavored(names, spec={"deploymentPolicy": "rollout"})
    other = OTHER[names]
    foreign = policy_of(other, finalizers=(other.policy_finalizer,))
    plan = plan_round(world_with(names, owner, foreign), now=T0)
    assert not [a for a in plan.actions if isinstance(a, CreateJob)]
    (status,) = [a.status for a in plan.actions if isinstance(a, SetSkyhookStatus)]
    assert "DeploymentPolicyNotFound" in {c["type"] for c in status["conditions"]}
    # Not named by an object of its own kind, the other group's policy loses its finalizer.
    (release,) = [a for a in plan.actions if isinstance(a, SetPolicyFinalizer)]
    assert release.policy is foreign and not release.present

    own = policy_of(names)
    plan = plan_round(world_with(names, owner, own), now=T0)
    assert [a for a in plan.actions if isinstance(a, CreateJob)]
    (hold,) = [a for a in plan.actions if isinstance(a, SetPolicyFinalizer)]
    assert hold.present
    (command,) = commands(hold)
    assert isinstance(authorize(command, command.subject), Allowed)
    assert (command.target.api_version, command.target.kind) == (
        names.api_version,
        "DeploymentPolicy",
    )
    patch = msgspec_to_builtins(command.operation)["patch"]
    assert patch["metadata"]["finalizers"] == [names.policy_finalizer]


def test_rule_each_groups_deployment_policy_is_mirrored_into_its_own_bucket() -> None:
    buckets = [kind.bucket for kind in WATCHED_KINDS]
    assert len(buckets) == len(set(buckets))
    for names, bucket in (
        (SKYHOOK, "k8s_deploymentpolicies"),
        (NODEWRIGHT, "k8s_nodewrightdeploymentpolicies"),
    ):
        info = resolve_kind(names.api_version, "DeploymentPolicy")
        assert info is not None and info.bucket == bucket
        assert info.collection_path(None) == f"/apis/{names.group}/v1alpha1/deploymentpolicies"
    assert "k8s_nodewrightdeploymentpolicies" in BUS_GRANTS["maintenance-scheduler"].reads_buckets


@BOTH
def test_rule_each_decision_names_the_kind_of_its_object(names: SkyhookNames) -> None:
    """Both kinds' decisions share `maintenance.v1.skyhook.<name>.decision`: each says which
    kind it is about, the NodeMaintenance released included, and a Skyhook's and a
    NodeWright's of one name and message never share a decision id (JetStream would keep
    only the first)."""
    cluster = FakeCluster(skyhooks=[flavored(names)], nodes=cluster_nodes(1))
    notes = []
    for _ in range(80):
        plan = cluster.round()
        notes.extend(plan.decisions)
        if not plan.actions:
            break
    assert cluster.status()["status"] == "complete"
    assert {note.kind for note in notes} >= {"stage", "batch", "maintenance"}
    assert {note.object_kind for note in notes} == {names.kind}
    decisions = [decision_for(note, T0, "basis") for note in notes]
    assert {d.object_kind for d in decisions} == {names.kind}
    other = decision_for(replace(notes[0], object_kind=OTHER[names].kind), T0, "basis")
    assert other.decision_id != decisions[0].decision_id


def test_rule_skyhooks_and_nodewrights_share_one_priority_order_then_name() -> None:
    """Either kind waits on a node for an earlier object of the other kind (lower priority
    first, then name), as upstream orders the objects of one kind: the node runs one rollout
    at a time."""
    for listed in (0, 1):
        renamed = flavored(NODEWRIGHT, "aa-later", {"priority": 20})
        legacy = flavored(SKYHOOK, "zz-first", {"priority": 10})
        objects = [renamed, legacy] if listed else [legacy, renamed]
        cluster = FakeCluster(skyhooks=objects, nodes=cluster_nodes(1))
        plan = cluster.round()
        assert {a.skyhook.owner_key for a in plan.actions if isinstance(a, CreateJob)} == {
            legacy.owner_key
        }
        assert cluster.status("aa-later")["nodeStatus"] == {"node-00": "waiting"}
    # Of one priority the name decides, whichever the kind.
    renamed = flavored(NODEWRIGHT, "aa-first", {"priority": 10})
    legacy = flavored(SKYHOOK, "bb-later", {"priority": 10})
    cluster = FakeCluster(skyhooks=[legacy, renamed], nodes=cluster_nodes(1))
    plan = cluster.round()
    assert {a.skyhook.owner_key for a in plan.actions if isinstance(a, CreateJob)} == {
        renamed.owner_key
    }
    run_until_settled(cluster)
    assert cluster.status("aa-first")["status"] == "complete"
    assert cluster.status("bb-later")["status"] == "complete"


def test_rule_the_order_of_a_skyhook_and_a_nodewright_of_one_name_never_depends_on_listing() -> (
    None
):
    """A Skyhook being deleted beside a NodeWright of its name and priority: the Skyhook's
    key sorts first, however the two were listed, so two rounds over one cluster never order
    them differently."""
    renamed = flavored(NODEWRIGHT)
    going = replace(flavored(SKYHOOK), deleting=True)
    plans = [
        plan_round(World(objects, {}, list(cluster_nodes(1).values()), {}, {}), now=T0)
        for objects in ([renamed, going], [going, renamed])
    ]
    assert [type(a).__name__ for a in plans[0].actions] == [
        type(a).__name__ for a in plans[1].actions
    ]


@pytest.mark.parametrize("name", ["gpu-init", "zz-tuning"])
def test_rule_a_skyhook_goes_before_a_nodewright_of_its_name_and_priority(name: str) -> None:
    """Of one name and priority the Skyhook comes first, whatever the name: a name that
    sorts past the NodeWright's group prefix ("nodewright.nvidia.com/") too."""
    renamed = flavored(NODEWRIGHT, name)
    going = replace(flavored(SKYHOOK, name), deleting=True)
    for objects in ([renamed, going], [going, renamed]):
        plan = plan_round(World(objects, {}, list(cluster_nodes(1).values()), {}, {}), now=T0)
        first = plan.actions[0]
        assert isinstance(first, SetSkyhookFinalizer)
        assert first.skyhook.names == SKYHOOK and not first.present

"""A NodeWright's spec.drainConfig (S56) and spec.runtimeRequiredCordonAfter (S57), fields of
upstream's renamed operator: a manifest using them applies to our CRD unchanged, drainConfig
reaches the NodeMaintenance drainSpec where the meaning is the same, and the cordon applied when
the runtime-required taint goes outlives later interrupts until it is released."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from k8s_watcher.policy import Allowed, authorize
from maintenance_scheduler.actions import PatchRequest, UncordonNode
from maintenance_scheduler.api import INITIAL_STATE_ANNOTATION, parse_node_maintenance
from maintenance_scheduler.reconcile import reconcile_request
from maintenance_scheduler.service import node_facts, node_fields
from maintenance_scheduler.skyhook.api import DrainConfig, parse_skyhook
from maintenance_scheduler.skyhook.jobs import DRAIN_POD_SELECTOR, build_maintenance
from maintenance_scheduler.skyhook.observe import node_view
from maintenance_scheduler.skyhook.plan import (
    DropRuntimeCordonMark,
    SetRuntimeTaint,
    World,
    plan_round,
)
from maintenance_scheduler.skyhook.service import node_metadata
from nodeflow_contracts import k8s
from nodeflow_contracts.skyhook import NODEWRIGHT, SKYHOOK
from tests.unit.maintenance_scheduler.builders import T0, nm
from tests.unit.maintenance_scheduler.skyhook.test_nodewright import (
    commands,
    flavored,
    msgspec_to_builtins,
)
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import FakeCluster, cluster_nodes
from tests.unit.test_manifests import admitted

MARK = "nodewright.nvidia.com/runtimeRequiredCordon"

# As upstream's docs write them (docs/architecture/interrupt-flow.md,
# docs/user-guide/runtime-required.md).
UPSTREAM_MANIFEST: dict[str, Any] = {
    "apiVersion": "nodewright.nvidia.com/v1alpha1",
    "kind": "NodeWright",
    "metadata": {"name": "gpu-mode-switch"},
    "spec": {
        "runtimeRequired": True,
        "runtimeRequiredCordonAfter": True,
        "drainConfig": {
            "disableEviction": False,
            "deleteEmptyDirData": False,
            "force": False,
            "ignoreDaemonSets": True,
            "timeout": "10m",
            "gracePeriod": "30s",
        },
        "packages": {
            "gpu-driver": {
                "version": "1.0.0",
                "image": "example/gpu-driver",
                "interrupt": {"type": "reboot"},
            }
        },
    },
}


def test_rule_an_upstream_nodewright_manifest_with_drain_config_and_cordon_after_applies() -> None:
    stored, problems = admitted(copy.deepcopy(UPSTREAM_MANIFEST))
    assert problems == []
    skyhook = parse_skyhook(stored)
    assert skyhook.problems == ()
    assert skyhook.runtime_required_cordon_after
    assert skyhook.drain_config == DrainConfig(
        disable_eviction=False,
        delete_empty_dir_data=False,
        force=False,
        ignore_daemon_sets=True,
        timeout_seconds=600,
        grace_period_seconds=30,
    )
    # An empty drainConfig is defaulted as upstream's CRD defaults it: the drain as before.
    empty = copy.deepcopy(UPSTREAM_MANIFEST)
    empty["spec"]["drainConfig"] = {}
    stored, problems = admitted(empty)
    assert problems == []
    assert stored["spec"]["drainConfig"] == {
        "disableEviction": False,
        "deleteEmptyDirData": True,
        "force": True,
        "ignoreDaemonSets": True,
    }
    assert parse_skyhook(stored).drain_config == DrainConfig()
    # The schema still refuses what upstream's would (a flag that is not a boolean).
    wrong = copy.deepcopy(UPSTREAM_MANIFEST)
    wrong["spec"]["drainConfig"]["force"] = "no"
    assert admitted(wrong)[1] != []


def test_rule_cordon_after_is_respected_only_with_runtime_required() -> None:
    spec = {"runtimeRequired": False, "runtimeRequiredCordonAfter": True}
    assert not flavored(NODEWRIGHT, spec=spec).runtime_required_cordon_after


def test_rule_drain_config_reaches_the_nodemaintenance_drain_spec() -> None:
    skyhook = parse_skyhook(UPSTREAM_MANIFEST)
    body = build_maintenance(skyhook, "node-00", namespace="skyhook", drain_timeout_seconds=900)
    assert body["spec"]["drainSpec"] == {
        "force": False,
        "deleteEmptyDir": False,
        "podSelector": DRAIN_POD_SELECTOR,
        "timeoutSeconds": 600,
    }
    # The drain our NodeMaintenance controller runs reads it so.
    drain = parse_node_maintenance(body).drain_spec
    assert drain is not None
    assert (drain.force, drain.delete_empty_dir, drain.timeout_seconds) == (False, False, 600)
    # timeout "0": no timeout, as upstream (ours: timeoutSeconds 0, no limit).
    no_limit = copy.deepcopy(UPSTREAM_MANIFEST)
    no_limit["spec"]["drainConfig"] = {"timeout": "0s"}
    body = build_maintenance(
        parse_skyhook(no_limit), "node-00", namespace="skyhook", drain_timeout_seconds=900
    )
    assert body["spec"]["drainSpec"]["timeoutSeconds"] == 0
    assert body["spec"]["drainSpec"]["force"] is True


def test_rule_without_drain_config_the_drain_spec_is_unchanged() -> None:
    unset = copy.deepcopy(UPSTREAM_MANIFEST)
    del unset["spec"]["drainConfig"]
    body = build_maintenance(
        parse_skyhook(unset), "node-00", namespace="skyhook", drain_timeout_seconds=900
    )
    assert body["spec"]["drainSpec"] == {
        "force": True,
        "deleteEmptyDir": True,
        "podSelector": DRAIN_POD_SELECTOR,
        "timeoutSeconds": 900,
    }


def test_rule_a_negative_drain_duration_is_a_problem() -> None:
    bad = copy.deepcopy(UPSTREAM_MANIFEST)
    bad["spec"]["drainConfig"] = {"timeout": "-1m"}
    assert any("drainConfig.timeout" in p for p in parse_skyhook(bad).problems)


def _removals(spec: dict[str, Any]) -> list[SetRuntimeTaint]:
    wright = flavored(NODEWRIGHT, spec=spec)
    taint = World([wright], {}, [], {}, {}).runtime_taint_of(NODEWRIGHT)
    nodes = {n: replace(v, taints=(taint,)) for n, v in cluster_nodes(1).items()}
    cluster = FakeCluster(skyhooks=[wright], nodes=nodes)
    removed: list[SetRuntimeTaint] = []
    for _ in range(40):
        removed += [
            a for a in cluster.round().actions if isinstance(a, SetRuntimeTaint) and not a.present
        ]
        if removed:
            break
    assert removed, "the runtime-required taint was never removed"
    return removed


def test_rule_cordon_after_cordons_and_marks_the_node_when_the_taint_goes() -> None:
    (removal,) = _removals({"runtimeRequired": True, "runtimeRequiredCordonAfter": True})
    assert removal.cordon and not removal.node.unschedulable
    # The cordon goes first, alone: the taint is removed only once the view shows the node
    # cordoned (were the cordon refused or lost, the taint would stay).
    (cordon,) = commands(removal)
    assert isinstance(cordon.operation, k8s.CordonNode)
    cordoned = replace(removal, node=replace(removal.node, unschedulable=True))
    (untaint,) = commands(cordoned)
    assert untaint.target.resource_version == removal.node.resource_version
    patch = msgspec_to_builtins(untaint.operation)["patch"]
    assert patch["spec"]["taints"] is None
    assert patch["metadata"]["annotations"] == {MARK: "true"}
    for command in (cordon, untaint):
        assert isinstance(authorize(command, command.subject), Allowed)
    # upstream's key, group-prefixed as each flavor's keys are.
    assert NODEWRIGHT.runtime_required_cordon_annotation == MARK
    assert SKYHOOK.runtime_required_cordon_annotation == "skyhook.nvidia.com/runtimeRequiredCordon"


def test_rule_without_cordon_after_the_taint_removal_is_unchanged() -> None:
    (removal,) = _removals({"runtimeRequired": True})
    assert not removal.cordon
    (untaint,) = commands(removal)
    patch = msgspec_to_builtins(untaint.operation)["patch"]
    assert patch == {"spec": {"taints": None}}


def _node(*, unschedulable: bool, marked: bool) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n1",
            "uid": "uid-n1",
            "resourceVersion": "7",
            "annotations": {MARK: "true"} if marked else {},
        },
        "spec": {"unschedulable": unschedulable},
    }


def test_rule_a_later_interrupts_cleanup_keeps_the_persistent_cordon() -> None:
    """Another NodeWright's interrupt cordoned the node (its request says it found the node
    schedulable); the runtime-required taint went meanwhile with runtimeRequiredCordonAfter.
    The request's cleanup leaves the node cordoned and drops its finalizer."""
    done = nm(
        "other-interrupt",
        "n1",
        phase="Ready",
        finalizer=True,
        deleting=True,
        annotations={INITIAL_STATE_ANNOTATION: "false"},
    )
    # The view of the maintenance controller keeps the mark (its projection).
    marked = node_facts(node_fields(_node(unschedulable=True, marked=True)))
    assert marked.runtime_required_cordon
    step = reconcile_request(done, marked, [], [], T0)
    assert [a for a in step.actions if isinstance(a, UncordonNode)] == []
    (patch,) = [a for a in step.actions if isinstance(a, PatchRequest)]
    assert patch.finalizers == ()
    assert "stays cordoned (runtimeRequiredCordon)" in step.decisions[-1].message
    # Without the mark the same cleanup uncordons, as before.
    plain = node_facts(node_fields(_node(unschedulable=True, marked=False)))
    step = reconcile_request(done, plain, [], [], T0)
    assert [a.node for a in step.actions if isinstance(a, UncordonNode)] == ["n1"]


def test_rule_a_mark_left_on_an_uncordoned_node_is_dropped() -> None:
    """Released by clearing unschedulable alone: the stale mark goes, so it cannot keep a
    later interrupt's cordon; a cordoned node keeps its mark."""
    wright = flavored(NODEWRIGHT, spec={"runtimeRequired": True})

    def drops(node: dict[str, Any]) -> list[DropRuntimeCordonMark]:
        view = node_view(node_metadata(node))
        plan = plan_round(World([wright], {}, [view], {}, {}), now=T0)
        return [a for a in plan.actions if isinstance(a, DropRuntimeCordonMark)]

    (drop,) = drops(_node(unschedulable=False, marked=True))
    (command,) = commands(drop)
    assert msgspec_to_builtins(command.operation)["patch"] == {
        "metadata": {"annotations": {MARK: None}}
    }
    assert command.target.resource_version == "7"
    assert isinstance(authorize(command, command.subject), Allowed)
    assert drops(_node(unschedulable=True, marked=True)) == []

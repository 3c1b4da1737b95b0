"""The Skyhook's node conditions `skyhook.nvidia.com/<name>/NotReady` and `/Erroring`
(upstream `operator/internal/wrapper/node.go::UpdateCondition`): decided by the pure round,
written as a strategic-merge patch of the Node's status that touches only those types."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from k8s_watcher.policy import Allowed, authorize
from maintenance_scheduler.skyhook.api import erroring_condition, not_ready_condition
from maintenance_scheduler.skyhook.commands import commands_for
from maintenance_scheduler.skyhook.plan import NodeView, SetNodeConditions, node_conditions
from maintenance_scheduler.skyhook.service import node_metadata
from maintenance_scheduler.skyhook.stages import PackageState
from nodeflow_kube.fields import rfc3339
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import (
    T0,
    FakeCluster,
    cluster_nodes,
    run_until_settled,
    skyhook,
)

NOT_READY = not_ready_condition("gpu-init")
ERRORING = erroring_condition("gpu-init")


def shown(cluster: FakeCluster, node: str = "node-00") -> dict[str, tuple[str, str]]:
    return {k: (c["status"], c["reason"]) for k, c in cluster.nodes[node].conditions.items()}


def condition_writes(cluster: FakeCluster) -> list[SetNodeConditions]:
    return [a for a in cluster.round().actions if isinstance(a, SetNodeConditions)]


def test_rule_not_ready_is_true_while_the_skyhook_is_not_complete_and_false_once_it_is() -> None:
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=cluster_nodes(1))
    cluster.round()
    assert shown(cluster) == {
        NOT_READY: ("True", "Incomplete"),
        ERRORING: ("False", "Not Erroring"),
    }
    first = cluster.nodes["node-00"].conditions[NOT_READY]
    assert first["message"] == "Skyhook gpu-init Ready"
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    assert shown(cluster) == {NOT_READY: ("False", "Complete"), ERRORING: ("False", "Not Erroring")}
    done = cluster.nodes["node-00"].conditions[NOT_READY]
    assert done["lastTransitionTime"] > first["lastTransitionTime"]
    # Erroring never changed status: its transition time is the first write's.
    assert cluster.nodes["node-00"].conditions[ERRORING]["lastTransitionTime"] == rfc3339(T0 + 1)


def test_rule_erroring_is_true_while_a_package_errors_on_the_node() -> None:
    cluster = FakeCluster(
        skyhooks=[skyhook()], nodes=cluster_nodes(1), fail_images=("ghcr.io/x/driver",)
    )
    run_until_settled(cluster)
    assert shown(cluster) == {
        NOT_READY: ("True", "Incomplete"),
        ERRORING: ("True", "Package(s) Erroring or Unknown"),
    }
    assert cluster.nodes["node-00"].conditions[ERRORING]["message"] == (
        "Package Erroring or Unknown for gpu-init"
    )


def test_rule_unchanged_node_conditions_are_not_written_again() -> None:
    cluster = FakeCluster(skyhooks=[skyhook()], nodes=cluster_nodes(2))
    writes = [w for _ in range(40) for w in condition_writes(cluster)]
    assert cluster.status()["status"] == "complete"
    # Per node: the first write of both, then NotReady once, when the node completes.
    per_node: dict[str, list[tuple[str, ...]]] = {}
    for write in writes:
        per_node.setdefault(write.node.name, []).append(
            tuple(str(c["type"]) for c in write.conditions)
        )
    assert per_node == {name: [(NOT_READY, ERRORING), (NOT_READY,)] for name in cluster.nodes}
    assert condition_writes(cluster) == []


def test_rule_a_reason_changed_under_the_same_status_keeps_its_transition_time() -> None:
    node = replace(
        cluster_nodes(1)["node-00"],
        conditions={
            NOT_READY: {
                "type": NOT_READY,
                "status": "True",
                "reason": "SomethingElse",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        },
    )
    entry = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "apply", "in_progress")
    written = {
        str(c["type"]): c for c in node_conditions("gpu-init", node, {"driver": entry}, False, T0)
    }
    assert written[NOT_READY]["reason"] == "Incomplete"
    assert written[NOT_READY]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert written[NOT_READY]["lastHeartbeatTime"] == rfc3339(T0)
    assert written[ERRORING]["lastTransitionTime"] == rfc3339(T0)


def test_rule_the_node_conditions_patch_touches_only_the_skyhooks_condition_types() -> None:
    node = cluster_nodes(1)["node-00"]
    condition = {"type": NOT_READY, "status": "True", "reason": "Incomplete"}
    for action, expected in (
        (SetNodeConditions("gpu-init", node, (condition,)), [condition]),
        (
            SetNodeConditions("gpu-init", node, removed=(NOT_READY, ERRORING)),
            [{"type": NOT_READY, "$patch": "delete"}, {"type": ERRORING, "$patch": "delete"}],
        ),
    ):
        (command,) = commands_for(
            action,
            T0,
            namespace="skyhook",
            default_stage_timeout_seconds=0,
            drain_timeout_seconds=0,
        )
        operation: Any = command.operation
        assert (operation.patch_type, operation.subresource) == ("strategic", "status")
        # A strategic merge by type: the kubelet's Ready, MemoryPressure... are not in it.
        assert operation.patch == {"status": {"conditions": expected}}
        assert isinstance(authorize(command, command.subject), Allowed)


def test_rule_a_deleted_skyhook_removes_its_node_conditions_before_its_finalizer() -> None:
    other = skyhook("other", {"tool": {"version": "1.0.0", "image": "ghcr.io/x/t"}})
    cluster = FakeCluster(skyhooks=[skyhook(), other], nodes=cluster_nodes(2))
    run_until_settled(cluster)
    assert all(NOT_READY in n.conditions for n in cluster.nodes.values())
    cluster.delete("gpu-init")
    run_until_settled(cluster)
    assert [s.name for s in cluster.skyhooks] == ["other"]
    for node in cluster.nodes.values():
        assert set(node.conditions) == {not_ready_condition("other"), erroring_condition("other")}


def test_rule_a_deleted_skyhook_waits_for_a_node_with_only_its_conditions_left() -> None:
    node = replace(
        cluster_nodes(1)["node-00"],
        conditions={NOT_READY: {"type": NOT_READY, "status": "False", "reason": "Complete"}},
    )
    cluster = FakeCluster(skyhooks=[skyhook()], nodes={"node-00": node})
    cluster.delete("gpu-init")
    plan = cluster.round()
    (write,) = [a for a in plan.actions if isinstance(a, SetNodeConditions)]
    assert write.removed == (NOT_READY,)
    assert [s.name for s in cluster.skyhooks] == ["gpu-init"]  # finalizer kept this round
    run_until_settled(cluster)
    assert cluster.skyhooks == [] and cluster.nodes["node-00"].conditions == {}


def test_rule_the_controller_keeps_of_a_node_only_the_skyhooks_conditions() -> None:
    kubelet = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    ours = {"type": NOT_READY, "status": "True", "reason": "Incomplete"}
    node = {
        "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "5"},
        "status": {"conditions": [kubelet, ours], "capacity": {"cpu": "8"}},
    }
    kept = node_metadata(node)
    assert kept["status"] == {"conditions": [ours]}
    from maintenance_scheduler.skyhook.observe import node_view

    view: NodeView = node_view(kept)
    assert dict(view.conditions) == {NOT_READY: ours}
    assert "status" not in node_metadata(
        {"metadata": {"name": "n2"}, "status": {"conditions": [kubelet]}}
    )

"""The placer's commands: only its six operations, each on the kind it may touch, with keys
derived from the state they were decided on."""

from __future__ import annotations

from nodeflow_contracts.k8s import (
    BindPod,
    DeleteObject,
    NominatePod,
    PatchObject,
    RecordEvent,
    UpdateStatus,
)
from topology_placer.commands import SENDER, to_outgoing
from topology_placer.gang import GroupKey
from topology_placer.planner import (
    Bind,
    Decision,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Notice,
    SelectNode,
    UpdateGroupStatus,
    UpdateTopologyStatus,
)
from topology_placer.pods import PodRef

POD = PodRef("default", "w-0", "uid-1", "7")
NOW = 1_767_225_600.0
AT = "2026-01-01T00:00:00Z"


def test_nominate_sets_the_reservation_with_uid_and_resource_version_preconditions() -> None:
    (out,) = to_outgoing(Nominate(POD, "n1"), NOW)
    assert out.command is not None
    assert out.command.sender == SENDER
    assert out.command.operation == NominatePod(node_name="n1")
    assert (out.command.target.uid, out.command.target.resource_version) == ("uid-1", "7")
    assert out.command.op == "nominate"


def test_bind_uses_the_binding_operation_keyed_by_pod_and_node() -> None:
    (first,) = to_outgoing(Bind(POD, "n1"), NOW)
    (again,) = to_outgoing(Bind(PodRef("default", "w-0", "uid-1", "8"), "n1"), NOW + 5)
    assert first.command is not None and first.command.operation == BindPod(node_name="n1")
    assert first.key == again.key


def test_rule_select_node_annotates_the_claim_by_a_merge_patch_conditioned_on_its_uid() -> None:
    """VolumeBinding's PreBind write: the claim's volume.kubernetes.io/selected-node, alone
    (what k8s-watcher's policy lets the placer touch), keyed by the claim version and node."""
    (out,) = to_outgoing(SelectNode("ml", "data-0", "uid-c", "3", "n1"), NOW)
    assert out.command is not None and out.command.op == "patch"
    target = out.command.target
    assert (target.kind, target.namespace, target.name, target.uid) == (
        "PersistentVolumeClaim",
        "ml",
        "data-0",
        "uid-c",
    )
    assert out.command.operation == PatchObject(
        patch_type="merge",
        patch={"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "n1"}}},
    )
    (other,) = to_outgoing(SelectNode("ml", "data-0", "uid-c", "3", "n2"), NOW)
    assert other.key != out.key


def test_unschedulable_patches_the_pod_scheduled_condition_on_the_status() -> None:
    (out,) = to_outgoing(MarkUnschedulable(POD, "Unschedulable", "no room", AT), NOW)
    assert out.command is not None
    operation = out.command.operation
    assert isinstance(operation, PatchObject)
    assert (operation.patch_type, operation.subresource) == ("strategic", "status")
    (condition,) = operation.patch["status"]["conditions"]
    assert condition["type"] == "PodScheduled"
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "Unschedulable",
        "no room",
    )


def test_disrupt_marks_disruption_target_before_the_deletion() -> None:
    patch, deletion = to_outgoing(Disrupt(POD, "PreemptionByScheduler", "why", AT), NOW)
    assert patch.command is not None and deletion.command is not None
    assert isinstance(patch.command.operation, PatchObject)
    (condition,) = patch.command.operation.patch["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "DisruptionTarget",
        "True",
        "PreemptionByScheduler",
    )
    assert isinstance(deletion.command.operation, DeleteObject)
    # One target, so k8s-watcher applies the two in the order sent.
    assert patch.command.target.ordering_key == deletion.command.target.ordering_key


def test_status_updates_go_to_pod_groups_and_the_topology() -> None:
    (group,) = to_outgoing(
        UpdateGroupStatus(GroupKey("default", "g"), "uid-g", {"phase": "Pending"}), NOW
    )
    assert group.command is not None
    assert group.command.target.kind == "PodGroup"
    assert group.command.target.api_version == "scheduling.sigs.k8s.io/v1alpha1"
    assert group.command.operation == UpdateStatus(status={"phase": "Pending"})
    (topology,) = to_outgoing(UpdateTopologyStatus("default", "uid-t", [{"nodeNum": 1}]), NOW)
    assert topology.command is not None
    assert topology.command.target.kind == "ClusterNetworkTopology"
    assert topology.command.target.namespace is None


def test_events_go_to_the_pod_group() -> None:
    (out,) = to_outgoing(
        Notice("PodGroup", "default", "g", "uid-g", "FailedScheduling", "no room", True), NOW
    )
    assert out.command is not None
    assert isinstance(out.command.operation, RecordEvent)
    assert out.command.operation.type == "Warning"


def test_decisions_go_to_the_placement_subject() -> None:
    decision = Decision(
        (GroupKey("ml", "train"), GroupKey("ml", "worker")),
        "nominated",
        "Nominated",
        "4 pods nominated in BlockLayer s1/b2",
        domain="s1/b2",
        layer="BlockLayer",
        assignments=(("train-0", "n1"),),
    )
    (out,) = to_outgoing(decision, NOW)
    assert out.command is None and out.decision is not None
    assert out.decision.subject == "placement.v1.ml.train.decision"
    assert out.decision.gang_group == ("ml/train", "ml/worker")
    assert out.decision.assignments[0].node == "n1"

"""k8s-watcher's judgement of a command: its subject against its payload, and the sender's
policy (nodeflow_contracts.permissions.COMMAND_POLICY)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from k8s_watcher.policy import Allowed, Refused, authorize
from nodeflow_bus.kube_lease import KubeLeaseTarget, lease_commands
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import (
    BindPod,
    CommandOperation,
    CordonNode,
    CreateObject,
    DeleteObject,
    EvictPod,
    K8sCommand,
    NominatePod,
    ObjectRef,
    PatchObject,
    RecordEvent,
    UncordonNode,
    UpdateStatus,
)
from nodeflow_contracts.permissions import ADMIN_USER, COMMAND_POLICY, SERVICES, lease_names
from nodeflow_contracts.pod_protocol import NODESET_LABEL
from nodeflow_contracts.skyhook import DEFAULT_SKYHOOK_NAMESPACE, NODEWRIGHT, SKYHOOK
from nodeflow_contracts.topology import WATCHED_KINDS

POD = ObjectRef(api_version="v1", kind="Pod", name="gpu-001", namespace="slurm", uid="u1")
NODE = ObjectRef(api_version="v1", kind="Node", name="gpu-001", uid="n1")
NODESET = ObjectRef(
    api_version="nodeflow.dev/v1alpha1", kind="NodeSet", name="workers", namespace="slurm"
)


def command(
    sender: str, target: ObjectRef, operation: CommandOperation, expires_at: float | None = 61.0
) -> K8sCommand:
    return K8sCommand(
        idempotency_key="k",
        sender=sender,
        sent_at=1.0,
        expires_at=expires_at,
        target=target,
        operation=operation,
    )


def judged(cmd: K8sCommand, subject: str | None = None) -> Allowed | Refused:
    return authorize(cmd, subject or cmd.subject)


def nodeset_pod(labelled: bool = True) -> dict[str, Any]:
    labels = {NODESET_LABEL: "workers"} if labelled else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": labels}}


@pytest.mark.parametrize("sender", [s for s in SERVICES if COMMAND_POLICY[s]])
def test_a_service_command_without_a_deadline_is_refused(sender: str) -> None:
    allowed = COMMAND_POLICY[sender][0]
    kind = sorted(allowed.kinds)[0]
    target = ObjectRef(api_version="v1", kind=kind, name="x", namespace="slurm")
    by_op: dict[str, CommandOperation] = {
        "record-event": RecordEvent(reason="R", message="m"),
        "cordon": CordonNode(),
        "uncordon": UncordonNode(),
        "evict": EvictPod(),
    }
    operation = by_op.get(allowed.op, DeleteObject())
    verdict = judged(command(sender, target, operation, expires_at=None))
    assert isinstance(verdict, Refused)
    assert "deadline" in verdict.reason


def test_operators_commands_need_no_deadline() -> None:
    verdict = judged(command(ADMIN_USER, POD, DeleteObject(), expires_at=None))
    assert isinstance(verdict, Allowed)


def test_a_command_whose_subject_op_differs_from_its_payload_is_refused() -> None:
    cmd = command(ADMIN_USER, POD, DeleteObject())
    verdict = judged(cmd, subjects.k8s_command(ADMIN_USER, "record-event"))
    assert isinstance(verdict, Refused)
    assert "operation 'record-event'" in verdict.reason and "'delete'" in verdict.reason


def test_a_command_whose_subject_sender_differs_from_its_payload_is_refused() -> None:
    # slurm-syncer's user may publish only under its own prefix, so it would have to claim
    # another sender in the payload to borrow that sender's rights.
    cmd = command("nodeset-controller", POD, DeleteObject())
    verdict = judged(cmd, subjects.k8s_command("slurm-syncer", "delete"))
    assert isinstance(verdict, Refused)
    assert "sender 'slurm-syncer'" in verdict.reason


def test_a_command_on_a_subject_without_sender_is_refused() -> None:
    verdict = judged(command(ADMIN_USER, POD, DeleteObject()), "cmd.k8s.v1.delete")
    assert isinstance(verdict, Refused)


def test_a_sender_without_a_policy_may_do_nothing() -> None:
    assert isinstance(judged(command("pytest", POD, RecordEvent(reason="r", message="m"))), Refused)


def status_patch(*conditions: dict[str, Any]) -> PatchObject:
    return PatchObject(
        patch_type="strategic",
        patch={"status": {"conditions": list(conditions)}},
        subresource="status",
    )


def test_slurm_syncer_may_patch_slurm_node_state_conditions() -> None:
    patch = status_patch(
        {"type": "SlurmNodeStateIdle", "status": "True"},
        {"type": "SlurmNodeStateDrain", "$patch": "delete"},
    )
    assert judged(command("slurm-syncer", POD, patch)) == Allowed()


def test_slurm_syncer_may_not_patch_the_slurm_delete_condition() -> None:
    patch = status_patch({"type": "SlurmDelete", "status": "True"})
    assert isinstance(judged(command("slurm-syncer", POD, patch)), Refused)


def test_rule_skyhook_may_patch_only_its_own_node_conditions_in_the_nodes_status() -> None:
    """maintenance-scheduler's Skyhook controller writes `skyhook.nvidia.com/<name>/NotReady`
    and `/Erroring` on a Node's status, and removes them; never the kubelet's conditions,
    never another status field, and never through the Node's main resource."""
    own = status_patch(
        {"type": "skyhook.nvidia.com/gpu-drivers/NotReady", "status": "True"},
        {"type": "skyhook.nvidia.com/gpu-drivers/Erroring", "$patch": "delete"},
    )
    assert judged(command("maintenance-scheduler", NODE, own)) == Allowed()
    for foreign in (
        status_patch({"type": "Ready", "status": "False"}),
        status_patch({"type": "skyhook.nvidia.com/gpu-drivers/Other", "status": "True"}),
        PatchObject(
            patch_type="strategic",
            patch={"status": {"capacity": {"nvidia.com/gpu": "0"}}},
            subresource="status",
        ),
        PatchObject(
            patch_type="strategic",
            patch={"status": {"conditions": [{"type": "skyhook.nvidia.com/a/NotReady"}]}},
        ),
    ):
        assert isinstance(judged(command("maintenance-scheduler", NODE, foreign)), Refused)
    # No other service may write them.
    assert isinstance(judged(command("nodeset-controller", NODE, own)), Refused)


def test_slurm_syncer_may_patch_only_its_own_pod_annotations() -> None:
    own = PatchObject(
        patch_type="merge",
        patch={"metadata": {"annotations": {"nodeflow.dev/pod-cordon": "true"}}},
    )
    assert judged(command("slurm-syncer", POD, own)) == Allowed()
    for patch in (
        {"metadata": {"annotations": {"nodeflow.dev/nodeset": "x"}}},
        {"metadata": {"labels": {"nodeflow.dev/pod-cordon": "true"}}},
        {"spec": {"nodeName": "other"}},
        {"metadata": {"annotations": {"nodeflow.dev/pod-cordon": "true"}}, "spec": {"x": 1}},
    ):
        verdict = judged(command("slurm-syncer", POD, PatchObject(patch_type="merge", patch=patch)))
        assert isinstance(verdict, Refused), patch


def test_rule_topology_placer_may_patch_only_a_claims_selected_node_annotation() -> None:
    """VolumeBinding's PreBind write, and nothing else of a PersistentVolumeClaim: not its
    spec (the volume it binds), not another annotation; no other service may write it."""
    claim = ObjectRef(
        api_version="v1", kind="PersistentVolumeClaim", name="data", namespace="ml", uid="c1"
    )
    selected = {"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "gpu-001"}}}
    assert judged(
        command("topology-placer", claim, PatchObject(patch_type="merge", patch=selected))
    ) == (Allowed())
    for patch in (
        {"metadata": {"annotations": {"volume.beta.kubernetes.io/storage-class": "x"}}},
        {"spec": {"volumeName": "pv-1"}},
        {**selected, "spec": {"volumeName": "pv-1"}},
    ):
        verdict = judged(
            command("topology-placer", claim, PatchObject(patch_type="merge", patch=patch))
        )
        assert isinstance(verdict, Refused), patch
    for sender in ("nodeset-controller", "maintenance-scheduler", "slurm-syncer"):
        verdict = judged(command(sender, claim, PatchObject(patch_type="merge", patch=selected)))
        assert isinstance(verdict, Refused), sender
    assert isinstance(judged(command("topology-placer", claim, DeleteObject())), Refused)


def test_slurm_syncer_may_never_delete_or_create() -> None:
    for operation in (
        DeleteObject(),
        CreateObject(object=nodeset_pod()),
        EvictPod(),
        BindPod(node_name="n"),
    ):
        assert isinstance(judged(command("slurm-syncer", POD, operation)), Refused), operation


def test_nodeset_controller_may_create_only_nodeset_pods() -> None:
    allowed = command("nodeset-controller", POD, CreateObject(object=nodeset_pod()))
    assert judged(allowed) == Allowed()
    unlabelled = command("nodeset-controller", POD, CreateObject(object=nodeset_pod(False)))
    assert isinstance(judged(unlabelled), Refused)


def test_nodeset_controller_may_delete_only_pods_that_carry_the_nodeset_label() -> None:
    # The label is on the live object, so the executor reads it before deleting.
    assert judged(command("nodeset-controller", POD, DeleteObject())) == Allowed(NODESET_LABEL)
    assert isinstance(judged(command("nodeset-controller", NODE, DeleteObject())), Refused)


def test_nodeset_controller_may_claim_nodes_and_write_nodeset_status() -> None:
    claim = PatchObject(
        patch_type="merge", patch={"metadata": {"annotations": {"nodeflow.dev/nodeset": None}}}
    )
    assert judged(command("nodeset-controller", NODE, claim)) == Allowed()
    status = UpdateStatus(status={"replicas": 1})
    assert judged(command("nodeset-controller", NODESET, status)) == Allowed()
    assert isinstance(judged(command("nodeset-controller", NODE, CordonNode())), Refused)


def test_a_json_patch_is_judged_by_its_paths() -> None:
    annotation = PatchObject(
        patch_type="json",
        patch=[{"op": "add", "path": "/metadata/annotations/nodeflow.dev~1nodeset", "value": "a"}],
    )
    assert judged(command("nodeset-controller", NODE, annotation)) == Allowed()
    taint = PatchObject(
        patch_type="json", patch=[{"op": "add", "path": "/spec/taints", "value": []}]
    )
    assert isinstance(judged(command("nodeset-controller", NODE, taint)), Refused)


# Every (operation, target) a command can take, to try each sender against.
EVERY_OPERATION: list[tuple[CommandOperation, ObjectRef]] = [
    (CreateObject(object=nodeset_pod()), POD),
    (DeleteObject(), POD),
    (DeleteObject(), NODE),
    (PatchObject(patch_type="merge", patch={"spec": {"unschedulable": True}}), NODE),
    (status_patch({"type": "SlurmDelete", "status": "True"}), POD),
    (status_patch({"type": "SlurmNodeStateIdle", "status": "True"}), POD),
    (CordonNode(), NODE),
    (UncordonNode(), NODE),
    (EvictPod(), POD),
    (BindPod(node_name="n"), POD),
    (NominatePod(node_name="n"), POD),
    (UpdateStatus(status={}), NODESET),
    (RecordEvent(reason="r", message="m"), POD),
]

# What each service may do among EVERY_OPERATION (by index), and nothing else.
MAY: dict[str, set[int]] = {
    "k8s-watcher": set(),
    "metrics-exporter": set(),
    "slurm-syncer": {5, 12},
    "nodeset-controller": {0, 1, 4, 11, 12},
    "maintenance-scheduler": {6, 7, 8, 12},
    "topology-placer": {1, 9, 10, 12},
}


@pytest.mark.parametrize("sender", SERVICES)
def test_each_service_may_do_exactly_what_its_policy_says(sender: str) -> None:
    allowed = {
        index
        for index, (operation, target) in enumerate(EVERY_OPERATION)
        if isinstance(judged(command(sender, target, operation)), Allowed)
    }
    assert allowed == MAY[sender]


# Patch fragments, each touching one path: slurm-syncer may touch the first group only.
ALLOWED_STATUS_PARTS: list[dict[str, Any]] = [
    {"conditions": [{"type": "SlurmNodeStateIdle", "status": "True"}]},
    {"conditions": [{"type": "SlurmNodeStateDrain", "$patch": "delete"}]},
]
FORBIDDEN_STATUS_PARTS: list[dict[str, Any]] = [
    {"conditions": [{"type": "SlurmDelete", "status": "True"}]},
    {"conditions": [{"type": "Ready", "status": "False"}]},
    {"conditions": [{"status": "True"}]},
    {"phase": "Failed"},
    {"nominatedNodeName": "n"},
    {"$retainKeys": ["phase"]},
]


@given(
    allowed=st.lists(st.sampled_from(ALLOWED_STATUS_PARTS), max_size=3),
    forbidden=st.lists(st.sampled_from(FORBIDDEN_STATUS_PARTS), max_size=3),
)
def test_slurm_syncer_status_patch_is_allowed_only_when_it_touches_nothing_else(
    allowed: list[dict[str, Any]], forbidden: list[dict[str, Any]]
) -> None:
    status: dict[str, Any] = {}
    for part in [*allowed, *forbidden]:
        for key, value in part.items():
            if key == "conditions":
                status.setdefault("conditions", []).extend(value)
            else:
                status[key] = value
    patch = PatchObject(patch_type="strategic", patch={"status": status}, subresource="status")
    verdict = judged(command("slurm-syncer", POD, patch))
    assert isinstance(verdict, Allowed) == (not forbidden)


# What each service may delete at all: nodeset-controller its NodeSet pods, their NodeSet's
# PodDisruptionBudget and ControllerRevisions (all labelled with the NodeSet), and
# maintenance-scheduler the
# NodeMaintenance requests it garbage-collects and the Skyhook ConfigMaps no longer wanted
# (labelled with a Skyhook or NodeWright). Nothing else.
DELETERS = {
    "nodeset-controller": {"Pod", "PodDisruptionBudget", "ControllerRevision"},
    "maintenance-scheduler": {"NodeMaintenance", "ConfigMap"},
    "topology-placer": {"Pod"},
}


@given(
    sender=st.sampled_from(SERVICES),
    kind=st.sampled_from([k.kind for k in WATCHED_KINDS]),
    name=st.text(alphabet="abcdefgh-0123456789", min_size=1, max_size=20),
    propagation=st.sampled_from([None, "Background", "Foreground", "Orphan"]),
)
def test_no_service_may_delete_anything_but_what_it_owns(
    sender: str, kind: str, name: str, propagation: Any
) -> None:
    namespace = DEFAULT_SKYHOOK_NAMESPACE if kind == "ConfigMap" else "slurm"
    target = ObjectRef(api_version="v1", kind=kind, name=name, namespace=namespace)
    verdict = judged(command(sender, target, DeleteObject(propagation_policy=propagation)))
    if kind not in DELETERS.get(sender, set()):
        assert isinstance(verdict, Refused)
    elif sender == "nodeset-controller":
        # Only an object that carries the NodeSet label (the executor reads it first).
        assert verdict == Allowed(NODESET_LABEL)
    elif kind == "ConfigMap":
        assert verdict == Allowed(required_any=(NODEWRIGHT.name_label, SKYHOOK.name_label))


# --- The leaders' Leases (issue #35: kubectl get leases shows who leads) ---------------------

LEASE_SERVICES = [s for s in SERVICES if lease_names(s)]


def lease_ref(name: str, namespace: str = "nodeflow-system") -> ObjectRef:
    return ObjectRef(
        api_version="coordination.k8s.io/v1", kind="Lease", name=name, namespace=namespace
    )


@pytest.mark.parametrize("sender", LEASE_SERVICES)
def test_lease_mirror_each_leader_may_write_only_the_leases_named_after_its_own(
    sender: str,
) -> None:
    at = 1_000.0
    target = KubeLeaseTarget(sender=sender)
    for name in lease_names(sender):
        for event in ("acquired", "renewed", "released"):
            for cmd in lease_commands(event, name=name, target=target, holder="h", ttl=15, now=at):
                assert isinstance(authorize(cmd, cmd.subject), Allowed), (event, cmd.op)
    # Another service's Lease, or one of Kubernetes' own, is refused.
    for other in ["kube-scheduler", *(n for s in SERVICES if s != sender for n in lease_names(s))]:
        for cmd in lease_commands(
            "acquired", name=other, target=target, holder="h", ttl=15, now=at
        ):
            verdict = authorize(cmd, cmd.subject)
            assert isinstance(verdict, Refused), (sender, other)
            assert "named" in verdict.reason


@pytest.mark.parametrize("sender", LEASE_SERVICES)
def test_lease_mirror_may_touch_only_the_spec_of_its_lease(sender: str) -> None:
    name = lease_names(sender)[0]
    labels = PatchObject(patch_type="merge", patch={"metadata": {"labels": {"x": "y"}}})
    assert isinstance(judged(command(sender, lease_ref(name), labels)), Refused)
    assert isinstance(judged(command(sender, lease_ref(name), DeleteObject())), Refused)


def test_lease_mirror_is_written_in_the_install_namespace_whatever_command_namespaces_say() -> None:
    (cmd, _) = lease_commands(
        "acquired",
        name="nodeset-controller",
        target=KubeLeaseTarget(sender="nodeset-controller"),
        holder="h",
        ttl=15,
        now=1_000.0,
    )
    assert isinstance(authorize(cmd, cmd.subject, ("slurm",)), Allowed)
    # ... while a Pod there is refused as before.
    pod = command("nodeset-controller", POD, CreateObject(object=nodeset_pod()))
    pod_elsewhere = msgspec.structs.replace(
        pod, target=msgspec.structs.replace(POD, namespace="nodeflow-system")
    )
    assert isinstance(authorize(pod_elsewhere, pod_elsewhere.subject, ("slurm",)), Refused)


def test_rule_the_skyhook_controller_deletes_only_config_maps_of_a_skyhook_or_nodewright() -> None:
    """Either flavor's label suffices (a NodeWright's ConfigMap carries only its own): the
    executor reads the ConfigMap and deletes it only if it carries one of them."""
    target = ObjectRef(
        api_version="v1",
        kind="ConfigMap",
        name="gpu-init-driver-1",
        namespace=DEFAULT_SKYHOOK_NAMESPACE,
    )
    verdict = judged(command("maintenance-scheduler", target, DeleteObject()))
    assert verdict == Allowed(
        required_any=("nodewright.nvidia.com/name", "skyhook.nvidia.com/name")
    )
    assert verdict.reads_target
    # Other senders may not delete ConfigMaps at all.
    assert isinstance(judged(command("nodeset-controller", target, DeleteObject())), Refused)


def test_rule_config_maps_are_written_in_the_skyhook_namespace_only() -> None:
    """k8s-watcher's RBAC on ConfigMaps is a Role in SKYHOOK_NAMESPACE (a cluster-wide grant
    would reach kube-system's): a ConfigMap command elsewhere is refused locally, naming the
    setting, even from the Skyhook controller and with every label right."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpu-init-driver-1",
            "labels": {
                SKYHOOK.name_label: "gpu-init",
                "app.kubernetes.io/managed-by": "nodeflow-skyhook",
            },
        },
        "data": {"a": "b"},
    }

    def create_in(namespace: str) -> K8sCommand:
        target = ObjectRef(
            api_version="v1", kind="ConfigMap", name="gpu-init-driver-1", namespace=namespace
        )
        return command("maintenance-scheduler", target, CreateObject(object=config_map))

    assert isinstance(judged(create_in(DEFAULT_SKYHOOK_NAMESPACE)), Allowed)
    for elsewhere in ("kube-system", "default"):
        refused = judged(create_in(elsewhere))
        assert isinstance(refused, Refused)
        assert "SKYHOOK_NAMESPACE=skyhook" in refused.reason
    moved = create_in("tenant-skyhook")
    assert isinstance(authorize(moved, moved.subject, (), "tenant-skyhook"), Allowed)
    assert isinstance(authorize(moved, moved.subject, (), DEFAULT_SKYHOOK_NAMESPACE), Refused)

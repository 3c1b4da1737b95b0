"""Pure command planning: each operation becomes exactly one well-formed API call."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from k8s_watcher.commands import (
    IDEMPOTENCY_ANNOTATION,
    ApiCall,
    Rejected,
    created_by,
    event_name,
    is_retryable,
    outcome_of,
    plan_command,
    proves_itself,
    resource_version_of,
)
from k8s_watcher.kube import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from nodeflow_bus.kube_lease import KubeLeaseTarget, LeaseEvent, lease_commands
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

POD = ObjectRef(api_version="v1", kind="Pod", name="p", namespace="ns", uid="u1")
NODE = ObjectRef(api_version="v1", kind="Node", name="n1", resource_version="7")
SLICE = ObjectRef(
    api_version="nodeflow.dev/v1alpha1", kind="NodeSlice", name="s", namespace="ns", uid="u2"
)


def plan(target: ObjectRef, operation: CommandOperation, key: str = "k1") -> ApiCall | Rejected:
    cmd = K8sCommand(
        idempotency_key=key, sender="tests", sent_at=0.0, target=target, operation=operation
    )
    return plan_command(cmd, now="2025-01-01T00:00:00Z", reporting_instance="w-0")


def call(target: ObjectRef, operation: CommandOperation) -> ApiCall:
    planned = plan(target, operation)
    assert isinstance(planned, ApiCall), planned
    return planned


def test_create_posts_to_the_collection_with_the_idempotency_annotation() -> None:
    manifest: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    planned = call(POD, CreateObject(object=manifest))
    assert (planned.method, planned.path) == ("POST", "/api/v1/namespaces/ns/pods")
    assert planned.body["metadata"]["annotations"] == {IDEMPOTENCY_ANNOTATION: "k1"}
    assert planned.body["metadata"]["namespace"] == "ns"
    assert planned.created_object_path == "/api/v1/namespaces/ns/pods/p"
    assert "annotations" not in manifest["metadata"]  # the command is not mutated


def test_create_of_a_kind_outside_the_rbac_is_refused_locally() -> None:
    refused = plan(NODE, CreateObject(object={"apiVersion": "v1", "kind": "Node"}))
    assert isinstance(refused, Rejected) and refused.outcome == "forbidden"


def test_delete_carries_preconditions_and_propagation_policy() -> None:
    planned = call(POD, DeleteObject(propagation_policy="Foreground", grace_period_seconds=0))
    assert (planned.method, planned.path) == ("DELETE", "/api/v1/namespaces/ns/pods/p")
    assert planned.body == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": "u1"},
        "propagationPolicy": "Foreground",
        "gracePeriodSeconds": 0,
    }


@pytest.mark.parametrize(
    ("patch_type", "content_type"),
    [("merge", MERGE_PATCH), ("strategic", STRATEGIC_MERGE_PATCH)],
)
def test_object_patches_carry_preconditions_in_metadata(patch_type: str, content_type: str) -> None:
    planned = call(NODE, PatchObject(patch_type=patch_type, patch={"spec": {"x": 1}}))  # type: ignore[arg-type]
    assert planned.content_type == content_type
    assert planned.body == {"spec": {"x": 1}, "metadata": {"resourceVersion": "7"}}


def test_json_patch_on_the_status_subresource_starts_with_precondition_ops() -> None:
    ops = [{"op": "add", "path": "/status/x", "value": 1}]
    planned = call(SLICE, PatchObject(patch_type="json", patch=ops, subresource="status"))
    assert planned.path == "/apis/nodeflow.dev/v1alpha1/namespaces/ns/nodeslices/s/status"
    assert planned.content_type == JSON_PATCH
    assert planned.body == [{"op": "replace", "path": "/metadata/uid", "value": "u2"}, *ops]


def test_cordon_and_uncordon_patch_spec_unschedulable() -> None:
    cordon = call(NODE, CordonNode())
    uncordon = call(NODE, UncordonNode())
    assert cordon.path == uncordon.path == "/api/v1/nodes/n1"
    assert cordon.body["spec"] == {"unschedulable": True}
    assert uncordon.body["spec"] == {"unschedulable": None}
    assert isinstance(plan(POD, CordonNode()), Rejected)


def test_evict_bind_and_nominate_use_the_pod_subresources() -> None:
    evict = call(POD, EvictPod(grace_period_seconds=5))
    assert evict.path == "/api/v1/namespaces/ns/pods/p/eviction"
    assert evict.body["deleteOptions"] == {
        "gracePeriodSeconds": 5,
        "preconditions": {"uid": "u1"},
    }
    bind = call(POD, BindPod(node_name="n1"))
    assert bind.path == "/api/v1/namespaces/ns/pods/p/binding"
    assert bind.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    nominate = call(POD, NominatePod(node_name=""))
    assert nominate.path == "/api/v1/namespaces/ns/pods/p/status"
    assert nominate.body["status"] == {"nominatedNodeName": None}
    assert isinstance(plan(NODE, EvictPod()), Rejected)


def test_update_status_replaces_status_through_the_subresource() -> None:
    planned = call(SLICE, UpdateStatus(status={"nodeCount": 1}))
    assert planned.path.endswith("/nodeslices/s/status")
    assert planned.body[-1] == {"op": "add", "path": "/status", "value": {"nodeCount": 1}}
    assert isinstance(plan(POD, UpdateStatus(status={})), Rejected)


def test_record_event_names_the_involved_object_for_kubectl_describe() -> None:
    planned = call(NODE, RecordEvent(reason="Drained", message="why", reporting_component="placer"))
    assert planned.path == "/api/v1/namespaces/default/events"
    event = planned.body
    assert event["metadata"]["name"] == event_name(NODE, "k1")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "n1",
        "resourceVersion": "7",
    }
    assert (event["reason"], event["type"], event["reportingComponent"]) == (
        "Drained",
        "Normal",
        "placer",
    )
    assert event_name(NODE, "k1") != event_name(NODE, "k2")


def test_unknown_kinds_and_missing_namespaces_are_invalid() -> None:
    unknown = ObjectRef(api_version="v1", kind="Secret", name="s", namespace="ns")
    assert isinstance(plan(unknown, DeleteObject()), Rejected)
    no_namespace = ObjectRef(api_version="v1", kind="Pod", name="p")
    assert isinstance(plan(no_namespace, DeleteObject()), Rejected)


@pytest.mark.parametrize(
    ("status", "retryable", "outcome"),
    [
        (200, False, "applied"),
        (201, False, "applied"),
        (409, False, "conflict"),
        (404, False, "not-found"),
        (422, False, "invalid"),
        (400, False, "invalid"),
        (403, False, "forbidden"),
        (401, False, "forbidden"),
        (429, True, None),
        (500, True, None),
        (503, True, None),
        (None, True, None),
    ],
)
def test_answers_map_to_outcomes(status: int | None, retryable: bool, outcome: str | None) -> None:
    assert is_retryable(status) is retryable
    if outcome is not None:
        assert status is not None and outcome_of(status) == outcome


def test_resource_version_and_creator_come_from_the_answer() -> None:
    assert resource_version_of({"metadata": {"resourceVersion": "9"}}) == "9"
    assert resource_version_of({"kind": "Status", "metadata": {}}) is None
    mine = {"metadata": {"annotations": {IDEMPOTENCY_ANNOTATION: "k1"}}}
    assert created_by(mine, "k1") and not created_by(mine, "k2")


def test_writes_outside_the_cluster_role_are_refused_locally() -> None:
    budget = ObjectRef(
        api_version="policy/v1", kind="PodDisruptionBudget", name="b", namespace="ns"
    )
    job = ObjectRef(api_version="batch/v1", kind="Job", name="j", namespace="ns")
    # A Node's status is patchable (the Skyhook controller's node conditions); a Job's is not.
    job_status = PatchObject(patch_type="merge", patch={"status": {}}, subresource="status")
    for target, operation in (
        (NODE, DeleteObject()),
        (budget, PatchObject(patch_type="merge", patch={"spec": {}})),
        (job, job_status),
    ):
        refused = plan(target, operation)
        assert isinstance(refused, Rejected) and refused.outcome == "forbidden", target


def test_only_named_creates_and_events_prove_their_own_idempotency() -> None:
    def command(operation: CommandOperation) -> K8sCommand:
        return K8sCommand(
            idempotency_key="k", sender="t", sent_at=0.0, target=POD, operation=operation
        )

    named = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    generated = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"}}
    assert proves_itself(command(CreateObject(object=named)))
    assert proves_itself(command(RecordEvent(reason="R", message="m")))
    # A generateName create would make a second object: it needs the applied-key record.
    assert not proves_itself(command(CreateObject(object=generated)))
    assert not proves_itself(command(DeleteObject()))
    assert not proves_itself(command(CordonNode()))


def test_lease_mirror_renewals_need_no_applied_key_but_a_takeover_does() -> None:
    """A leader's Lease renewal or release (a JSON patch that tests its holder first) is safe
    to apply twice, so it is not recorded in the applied-key bucket (one every few seconds per
    leader); the takeover patch, which names a new holder, is: a late repeat of it would
    overwrite a successor."""
    target = KubeLeaseTarget(sender="nodeset-controller")

    def mirror(event: LeaseEvent) -> list[K8sCommand]:
        return lease_commands(
            event, name="nodeset-controller", target=target, holder="a", ttl=15.0, now=1e9
        )

    (renew,) = mirror("renewed")
    (release,) = mirror("released")
    create, take = mirror("acquired")
    assert proves_itself(renew) and proves_itself(release)
    assert proves_itself(create)  # a named create, as any other
    assert not proves_itself(take)
    # The same shape on another kind is judged as before.
    assert isinstance(renew.operation, PatchObject)
    on_a_pod = msgspec.structs.replace(renew, target=POD)
    assert not proves_itself(on_a_pod)


def test_rule_a_read_only_kind_takes_no_command() -> None:
    """The Workload API's PodGroup is only read (RBAC list, watch): every write to it is
    refused here, while scheduler-plugins' PodGroup of the same kind name stays writable."""
    workload = ObjectRef(
        api_version="scheduling.k8s.io/v1alpha2", kind="PodGroup", name="g", namespace="ns"
    )
    manifest = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup"}
    for operation in (
        CreateObject(object={**manifest, "metadata": {"name": "g"}}),
        DeleteObject(),
        PatchObject(patch_type="merge", patch={"spec": {}}),
        PatchObject(patch_type="merge", patch={"status": {}}, subresource="status"),
        UpdateStatus(status={}),
    ):
        refused = plan(workload, operation)
        assert isinstance(refused, Rejected) and refused.outcome == "forbidden", operation
    gang = ObjectRef(
        api_version="scheduling.sigs.k8s.io/v1alpha1", kind="PodGroup", name="g", namespace="ns"
    )
    assert isinstance(plan(gang, UpdateStatus(status={"phase": "Running"})), ApiCall)

"""The whole plan: rules working together, restart determinism, status and invalid specs."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any, Literal

from nodeflow_contracts.k8s import PatchObject
from nodeflow_contracts.pod_protocol import ROLLING_DELETE
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeState
from nodeflow_kube.quantity import ResourceList
from nodeset_controller.commands import to_outgoing
from nodeset_controller.planner import (
    CancelDelete,
    Claim,
    ClusterView,
    CreatePod,
    DeletePod,
    Notice,
    Plan,
    PlanMemo,
    PodChangeSent,
    Release,
    ScheduleDelete,
    WriteSlice,
    plan,
)
from nodeset_controller.podspec import revision_hash
from nodeset_controller.protection import (
    CreateDisruptionBudget,
    DeleteDisruptionBudget,
    ProtectPod,
)
from tests.unit.nodeset_controller.builders import (
    DEFAULTS,
    NS,
    T0,
    TEMPLATE_SPEC,
    cluster_status,
    node,
    nodeset,
    pod,
    slurm,
)

KEY = f"{NS}.gpu"
REV = revision_hash(TEMPLATE_SPEC)


def is_protection(action: object) -> bool:
    """Rule 4a's actions, which go on under an invalid spec (no pod change)."""
    return isinstance(action, ProtectPod | CreateDisruptionBudget | DeleteDisruptionBudget)


def nodes(count: int, claim: str | None = None) -> dict[str, dict[str, Any]]:
    return {f"n{i}": node(f"n{i}", f"10.0.1.{i + 1}", claim=claim) for i in range(count)}


def view(
    obj: dict[str, Any],
    node_map: dict[str, dict[str, Any]],
    pods: list[dict[str, Any]] | None = None,
    slurm_states: dict[str, SlurmNodeState] | None = None,
    *,
    now: float = T0,
    slices: dict[str, dict[str, Any]] | None = None,
    foreign: set[str] | None = None,
    requested: dict[str, ResourceList] | None = None,
    status: SlurmClusterStatus | Literal["fresh"] | None = "fresh",
    in_flight: dict[str, PodChangeSent] | None = None,
    absence_grace: float = 300.0,
    slurm_nodes_revision: int | None = None,
) -> ClusterView:
    """`slurm_nodes_revision`: what the view of `slurm_states` has applied (None: caught up
    with the cluster status)."""
    pods = pods or []
    cluster = cluster_status(last_success_at=now) if status == "fresh" else status
    if slurm_nodes_revision is None:
        slurm_nodes_revision = cluster.nodes_revision if cluster is not None else 0
    totals: dict[str, ResourceList] = dict(requested or {})
    for p in pods:
        n = p["spec"]["nodeName"]
        if n:
            totals.setdefault(n, {})
            totals[n] = {"cpu": totals[n].get("cpu", Fraction(0)) + 2}
    return ClusterView(
        nodeset=obj,
        nodes=node_map,
        pods=pods,
        requested=totals,
        foreign_pod_names=foreign or set(),
        slurm=slurm_states or {},
        slurm_cluster=cluster,
        slices=slices or {},
        defaults=DEFAULTS,
        now=now,
        in_flight=in_flight or {},
        absence_grace=absence_grace,
        slurm_nodes_revision=slurm_nodes_revision,
    )


def patch_of(operation: object) -> object:
    assert isinstance(operation, PatchObject)
    return operation.patch


def of(result: Plan, kind: type) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def full(count: int, **pod_kwargs: Any) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    node_map = nodes(count, claim=KEY)
    pod_kwargs.setdefault("revision", REV)
    pods = [pod(f"gpu-001-{i + 1:03d}", f"n{i}", **pod_kwargs) for i in range(count)]
    return node_map, pods


def test_rule_scale_up_claims_nodes_first_then_creates_pods_on_claimed_nodes() -> None:
    first = plan(view(nodeset(replicas=2), nodes(3)))
    assert [a.node for a in of(first, Claim)] == ["n0", "n1"]
    assert of(first, CreatePod) == []
    claimed = nodes(3)
    for name in ("n0", "n1"):
        claimed[name] = node(name, claimed[name]["status"]["addresses"][1]["address"], claim=KEY)
    second = plan(view(nodeset(replicas=2), claimed))
    creates = of(second, CreatePod)
    assert [(c.node, c.name) for c in creates] == [("n0", "gpu-001-001"), ("n1", "gpu-001-002")]
    assert of(second, Claim) == []


def test_rule_scale_up_limited_by_feasible_nodes_and_number_feasible_is_true_count() -> None:
    node_map = nodes(3)
    node_map["n2"] = node("n2", "10.0.1.3", claim="slurm.other")
    result = plan(view(nodeset(replicas=5), node_map))
    assert len(of(result, Claim)) == 2
    assert result.status is not None
    assert result.status["numberFeasible"] == 2
    assert result.status["desiredNumberScheduled"] == 5


def test_rule_unset_replicas_runs_on_every_feasible_node() -> None:
    result = plan(view(nodeset(replicas=None), nodes(4)))
    assert len(of(result, Claim)) == 4
    assert result.status is not None and result.status["desiredNumberScheduled"] == 4


def test_rule_two_nodesets_compete_only_one_claims_each_node() -> None:
    node_map = nodes(2)
    node_map["n0"] = node("n0", "10.0.1.1", claim="slurm.other")
    result = plan(view(nodeset(replicas=2), node_map))
    assert [a.node for a in of(result, Claim)] == ["n1"]


def test_rule_claim_command_carries_the_resource_version_precondition() -> None:
    result = plan(view(nodeset(replicas=1), {"n0": node("n0", "10.0.1.1", rv="77")}))
    (claim,) = of(result, Claim)
    assert result.nodeset is not None
    out = to_outgoing(result.nodeset, claim, T0)
    assert out.command.target.resource_version == "77"
    assert out.command.target.uid == "uid-n0"
    assert patch_of(out.command.operation) == {
        "metadata": {"annotations": {"nodeflow.dev/nodeset": KEY}}
    }


def test_rule_name_collision_second_node_not_used_with_condition_and_notice() -> None:
    node_map = {"a": node("a", "10.1.3.4"), "b": node("b", "10.2.3.4")}
    result = plan(view(nodeset(replicas=2), node_map))
    assert [c.node for c in of(result, Claim)] == ["a"]
    (notice,) = of(result, Notice)
    assert notice.decision == "name-collision" and notice.node == "b"
    assert result.status is not None
    collision = next(c for c in result.status["conditions"] if c["type"] == "NameCollision")
    assert collision["status"] == "True" and "gpu-003-004" in collision["message"]
    # Reported once: with the condition already in the status, no new notice.
    again = plan(view(nodeset(replicas=2, status=result.status), node_map))
    assert of(again, Notice) == []


def test_rule_name_collision_with_a_foreign_pod() -> None:
    result = plan(view(nodeset(replicas=1), nodes(1), foreign={"gpu-001-001"}))
    assert of(result, Claim) == []
    assert of(result, Notice)[0].decision == "name-collision"


def test_rule_scale_down_schedules_delete_condition_by_rank() -> None:
    node_map, pods = full(3)
    states = {
        "gpu-001-001": slurm("gpu-001-001", busy=True),
        "gpu-001-002": slurm("gpu-001-002"),
        "gpu-001-003": slurm("gpu-001-003", drain=True),
    }
    result = plan(view(nodeset(replicas=1), node_map, pods, states))
    scheduled = of(result, ScheduleDelete)
    assert [(s.pod.name, s.reason) for s in scheduled] == [
        ("gpu-001-003", "ScalingDeleteScheduled"),
        ("gpu-001-002", "ScalingDeleteScheduled"),
    ]
    assert "rank 3" in scheduled[0].why and "rank 4" in scheduled[1].why
    assert of(result, DeletePod) == []


def test_rule_safe_deletion_delete_only_when_drained_and_idle_with_uid_precondition() -> None:
    node_map, pods = full(2)
    pods[1] = pod("gpu-001-002", "n1", revision=REV, delete_reason="ScalingDeleteScheduled")
    idle_drained = {
        "gpu-001-002": slurm("gpu-001-002", drain=True),
        "gpu-001-001": slurm("gpu-001-001"),
    }
    result = plan(view(nodeset(replicas=1), node_map, pods, idle_drained))
    (delete,) = of(result, DeletePod)
    assert delete.pod.name == "gpu-001-002" and not delete.forced
    assert result.nodeset is not None
    out = to_outgoing(result.nodeset, delete, T0)
    assert out.command.target.uid == "uid-gpu-001-002"
    assert out.decision is not None and out.decision.kind == "delete"

    busy = {
        "gpu-001-002": slurm("gpu-001-002", drain=True, busy=True),
        "gpu-001-001": slurm("gpu-001-001"),
    }
    assert of(plan(view(nodeset(replicas=1), node_map, pods, busy)), DeletePod) == []


def test_rule_scale_back_up_cancels_the_delete_condition() -> None:
    node_map, pods = full(2)
    pods[1] = pod("gpu-001-002", "n1", revision=REV, delete_reason="ScalingDeleteScheduled")
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"], drain=True) for p in pods}
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    (cancel,) = of(result, CancelDelete)
    assert cancel.pod.name == "gpu-001-002"
    assert of(result, DeletePod) == []
    assert result.nodeset is not None
    out = to_outgoing(result.nodeset, cancel, T0)
    assert patch_of(out.command.operation) == {
        "status": {"conditions": [{"type": "SlurmDelete", "$patch": "delete"}]}
    }


def test_rule_forced_deletion_after_known_timeout_in_plan() -> None:
    node_map, pods = full(2)
    pods[1] = pod(
        "gpu-001-002", "n1", revision=REV, delete_reason="ScalingDeleteScheduled", delete_since=T0
    )
    states = {
        "gpu-001-001": slurm("gpu-001-001", busy=True),
        "gpu-001-002": slurm("gpu-001-002", busy=True, drain=True),
    }
    obj = nodeset(replicas=1, extra={"forceScalingDeleteKnownConditionTimeout": 30})
    early = plan(view(obj, node_map, pods, states, now=T0 + 10))
    assert of(early, DeletePod) == [] and early.wake_at == T0 + 30
    late = plan(view(obj, node_map, pods, states, now=T0 + 31))
    (forced,) = of(late, DeletePod)
    assert forced.forced and forced.reason == "ForcedDeleteKnown"


def test_rule_rolling_update_respects_max_unavailable_and_recreates_on_same_node() -> None:
    node_map, pods = full(4)
    for p in pods:
        p["metadata"]["labels"]["controller-revision-hash"] = "old"
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-004"] = slurm("gpu-001-004", busy=True)
    result = plan(view(nodeset(replicas=4, max_unavailable=2), node_map, pods, states))
    replaced = of(result, ScheduleDelete)
    assert [(r.pod.name, r.reason) for r in replaced] == [
        ("gpu-001-001", "RollingDeleteScheduled"),
        ("gpu-001-002", "RollingDeleteScheduled"),
    ]
    # Once gpu-001-001 is gone, its claimed node gets the new pod, not another node.
    node_map["n9"] = node("n9", "10.0.1.99")
    remaining = pods[1:]
    remaining[0] = pod("gpu-001-002", "n1", revision="old", delete_reason="RollingDeleteScheduled")
    after = plan(view(nodeset(replicas=4, max_unavailable=2), node_map, remaining, states))
    creates = of(after, CreatePod)
    assert [(c.node, c.revision) for c in creates] == [("n0", REV)]
    assert of(after, Claim) == []
    # n0 missing + gpu-001-002 pending deletion = 2: no further replacement.
    assert of(after, ScheduleDelete) == []


def test_rule_rolling_update_replaces_a_pod_only_where_its_replacement_fits() -> None:
    """A template no node can take (more CPU than a node has) must not roll the NodeSet
    away pod by pod: once a replaced pod is gone its node could not take the new pod, would
    leave numberFeasible and free the budget for the next. Nothing is replaced, and a
    rolling mark set before the template changed is cancelled."""
    too_big = {
        "containers": [
            {"name": "slurmd", "image": "slurmd:24.12", "resources": {"requests": {"cpu": "999"}}}
        ]
    }
    obj = nodeset(replicas=4, max_unavailable=1, template_spec=too_big)
    node_map = nodes(4, claim=KEY)
    pods = [pod(f"gpu-001-{i + 1:03d}", f"n{i}", revision="old") for i in range(4)]
    pods[0] = pod("gpu-001-001", "n0", revision="old", delete_reason=ROLLING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    result = plan(view(obj, node_map, pods, states))
    assert of(result, ScheduleDelete) == [] and of(result, DeletePod) == []
    (cancel,) = of(result, CancelDelete)
    assert cancel.pod.name == "gpu-001-001"
    assert "cannot take the replacement" in cancel.why


def test_rule_a_pod_terminating_where_its_replacement_cannot_go_yet_counts_as_unavailable() -> None:
    """maxUnavailable 1: a cordoned node keeps its pod (not replaced while the replacement
    cannot go there), and while a replaced pod is still terminating on a node that was
    cordoned meanwhile, no other pod is replaced."""
    node_map = nodes(4, claim=KEY)
    node_map["n0"] = node("n0", "10.0.1.1", claim=KEY, unschedulable=True)
    pods = [pod(f"gpu-001-{i + 1:03d}", f"n{i}", revision="old") for i in range(4)]
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    first = plan(view(nodeset(replicas=4, max_unavailable=1), node_map, pods, states))
    assert [mark.pod.name for mark in of(first, ScheduleDelete)] == ["gpu-001-002"]
    node_map["n1"] = node("n1", "10.0.1.2", claim=KEY, unschedulable=True)
    pods[1] = pod(
        "gpu-001-002", "n1", revision="old", delete_reason=ROLLING_DELETE, terminating=True
    )
    second = plan(view(nodeset(replicas=4, max_unavailable=1), node_map, pods, states))
    assert of(second, ScheduleDelete) == []
    # The same without replicas (a pod on every feasible node).
    unset = plan(view(nodeset(replicas=None, max_unavailable=1), node_map, pods, states))
    assert of(unset, ScheduleDelete) == []


def test_rule_rolling_update_on_delete_replaces_nothing() -> None:
    node_map, pods = full(2, revision="old")
    result = plan(view(nodeset(replicas=2, strategy="OnDelete"), node_map, pods))
    assert of(result, ScheduleDelete) == []
    assert result.status is not None and result.status["updatedNumberScheduled"] == 0


def test_rule_bad_input_invalid_spec_touches_no_pod() -> None:
    node_map, pods = full(2)
    obj = nodeset(replicas=0, max_unavailable="150%")
    result = plan(view(obj, node_map, pods))
    # Only the protection from eviction goes on (rule 4a): labels and the budget, no pod change.
    assert [type(a) for a in result.actions if not is_protection(a)] == [Notice]
    assert result.status is not None
    invalid = next(c for c in result.status["conditions"] if c["type"] == "InvalidSpec")
    assert invalid["status"] == "True"
    assert invalid["reason"] == "MaxUnavailableOver100Percent"
    assert "spec.updateStrategy.rollingUpdate.maxUnavailable" in invalid["message"]


def test_rule_status_nine_fields_and_running_drain_counts() -> None:
    node_map, pods = full(4)
    pods[3] = pod("gpu-001-004", "n3", revision="old", ready=False)
    states = {
        "gpu-001-001": slurm("gpu-001-001", busy=True),
        "gpu-001-002": slurm("gpu-001-002", drain=True),
        "gpu-001-003": slurm("gpu-001-003", busy=True, drain=True),
        "gpu-001-004": slurm("gpu-001-004", known=False),
    }
    result = plan(
        view(nodeset(replicas=4, strategy="OnDelete", generation=3), node_map, pods, states)
    )
    assert result.status is not None
    status = {k: v for k, v in result.status.items() if k != "conditions"}
    assert status == {
        "currentNumberScheduled": 4,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 4,
        "updatedNumberScheduled": 3,
        "numberFeasible": 4,
        "numberReady": 3,
        "numberUnavailable": 1,
        "numberRunning": 2,
        # Drained only (Drain and not Busy): gpu-001-003 is draining.
        "numberDrain": 1,
        "observedGeneration": 3,
        "selector": "nodeflow.dev/nodeset=gpu",
        # Rule 7e: one pod still runs revision "old" (OnDelete), the template is REV.
        "currentRevision": "gpu-old",
        "updateRevision": f"gpu-{REV}",
    }


def test_rule_status_written_only_when_it_differs() -> None:
    node_map, pods = full(2)
    first = plan(view(nodeset(replicas=2), node_map, pods, now=T0))
    assert first.status is not None
    again = plan(view(nodeset(replicas=2, status=first.status), node_map, pods, now=T0 + 500))
    assert again.status is None


def test_rule_misscheduled_pod_is_removed_safely() -> None:
    node_map, pods = full(2)
    node_map["n1"] = node(
        "n1", "10.0.1.2", claim=KEY, taints=[{"key": "broken", "effect": "NoExecute"}]
    )
    result = plan(view(nodeset(replicas=2), node_map, pods))
    (scheduled,) = of(result, ScheduleDelete)
    assert scheduled.pod.name == "gpu-001-002" and "misscheduled" in scheduled.why
    assert result.status is not None and result.status["numberMisscheduled"] == 1


def test_rule_release_claim_when_pod_is_gone_and_node_not_needed() -> None:
    node_map = nodes(2, claim=KEY)
    pods = [pod("gpu-001-001", "n0", revision=REV)]
    result = plan(view(nodeset(replicas=1), node_map, pods))
    assert [r.node for r in of(result, Release)] == ["n1"]


def test_rule_nodeslices_follow_pods() -> None:
    node_map, pods = full(2)
    result = plan(view(nodeset(replicas=2), node_map, pods))
    (write,) = of(result, WriteSlice)
    assert write.change.create and write.change.nodes == ("n0", "n1")


def test_rule_restart_safety_same_state_same_plan_same_keys() -> None:
    node_map, pods = full(3)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    node_map.update({"n7": node("n7", "10.0.1.70")})
    obj = nodeset(replicas=2)
    a = plan(view(obj, node_map, pods, states, now=T0))
    b = plan(view(obj, node_map, list(reversed(pods)), states, now=T0 + 0.3))
    assert a.nodeset is not None and b.nodeset is not None
    keys_a = [to_outgoing(a.nodeset, x, T0).command.idempotency_key for x in a.actions]
    keys_b = [to_outgoing(b.nodeset, x, T0 + 0.3).command.idempotency_key for x in b.actions]
    assert keys_a == keys_b and keys_a


def test_rule_restart_safety_terminating_pod_is_not_replaced_twice() -> None:
    node_map, pods = full(2)
    pods[1] = pod(
        "gpu-001-002", "n1", revision=REV, terminating=True, delete_reason="RollingDeleteScheduled"
    )
    node_map["n5"] = node("n5", "10.0.1.55")
    result = plan(view(nodeset(replicas=2), node_map, pods))
    assert of(result, CreatePod) == [] and of(result, Claim) == []
    assert of(result, Release) == []


def test_rule_restart_safety_keys_change_with_the_state_they_were_derived_from() -> None:
    node_map, pods = full(2)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    first = plan(view(nodeset(replicas=1), node_map, pods, states))
    pods[1]["metadata"]["resourceVersion"] = "99"
    pods[0]["metadata"]["resourceVersion"] = "98"
    second = plan(view(nodeset(replicas=1), node_map, pods, states))
    assert first.nodeset is not None and second.nodeset is not None
    (a,) = of(first, ScheduleDelete)
    (b,) = of(second, ScheduleDelete)
    key_a = to_outgoing(first.nodeset, a, T0).command.idempotency_key
    key_b = to_outgoing(second.nodeset, b, T0).command.idempotency_key
    assert a.pod.name == b.pod.name and key_a != key_b


def test_rule_restart_safety_a_recreated_pod_name_gets_a_new_create_key() -> None:
    """A pod re-created under the same name on the same, still claimed node must not reuse
    the create key of the pod it replaces (JetStream's duplicate window would drop it and no
    outcome would ever come); the same deletion, seen again after a restart, gives the same
    key (a create still queued is not sent twice)."""
    node_map, _ = full(1)  # n0 claimed by the NodeSet, no pod on it
    result = plan(view(nodeset(replicas=1), node_map, []))
    assert result.nodeset is not None
    (create,) = of(result, CreatePod)

    def key(deleted_at: int) -> str:
        assert result.nodeset is not None
        out = to_outgoing(result.nodeset, create, T0, pod_deleted_revision=deleted_at)
        return out.command.idempotency_key

    assert key(0) != key(41) != key(97)
    assert key(41) == key(41)


def test_plan_with_a_memo_equals_the_plan_without_through_changes() -> None:
    """The memo only saves work: after every change of a node, a pod, the template or the
    other pods' requests, the plan made with it is the plan made from scratch."""
    memo = PlanMemo()
    node_map = nodes(6, claim=None)
    node_map.update(
        {
            name: node(name, f"10.0.1.{i + 1}", claim=KEY)
            for i, name in enumerate(["n0", "n1", "n2"])
        }
    )
    pods = [pod(f"gpu-001-{i + 1:03d}", f"n{i}", revision=REV) for i in range(3)]
    obj = nodeset(replicas=5)

    def same_plan(**changes: Any) -> Plan:
        args: dict[str, Any] = {"obj": obj, "node_map": node_map, "pods": pods, **changes}
        fresh = view(args.pop("obj"), args.pop("node_map"), args.pop("pods"), **args)
        remembered = replace(fresh, memo=memo)
        expected, got = plan(fresh), plan(remembered)
        assert got.actions == expected.actions and got.status == expected.status
        return got

    first = same_plan()
    assert {a.node for a in of(first, Claim)} == {"n3", "n4"}
    same_plan()  # everything from the memo
    node_map["n4"] = node(
        "n4", "10.0.1.5", taints=[{"key": "gpu", "value": "bad", "effect": "NoSchedule"}]
    )
    assert {a.node for a in of(same_plan(), Claim)} == {"n3", "n5"}
    pods[0] = pod("gpu-001-001", "n0", revision=REV, ready=False)
    assert same_plan().wanted_status["numberReady"] == 2
    node_map["n1"] = node("n1", "10.0.1.2", claim="other.ns")  # another NodeSet took it
    same_plan()
    same_plan(requested={"n3": {"cpu": Fraction(8)}})  # n3 is full now
    obj = nodeset(replicas=5, template_spec={"containers": [{"name": "c", "image": "v2"}]})
    same_plan()
    memo.forget_absent(["n0"], ["gpu-001-001"])
    assert set(memo.facts) == {"n0"} and set(memo.pod_states) == {"gpu-001-001"}
    same_plan()


def test_rule_bad_input_host_network_template_touches_no_pod() -> None:
    """A template under which slurmd registers under the node's hostname: InvalidSpec, and
    no pod is marked or deleted though Slurm does not list the pods' names."""
    node_map, pods = full(2)
    template = {**TEMPLATE_SPEC, "hostNetwork": True}
    result = plan(view(nodeset(replicas=1, template_spec=template), node_map, pods, {}))
    assert [a for a in result.actions if not isinstance(a, Notice) and not is_protection(a)] == []
    assert result.status is not None
    (invalid,) = [c for c in result.status["conditions"] if c["type"] == "InvalidSpec"]
    assert (invalid["status"], invalid["reason"]) == ("True", "SlurmNodeNameNotPodName")

"""`kubectl nodeflow` verdicts (issue #35): each a pure function of the object, its Slurm
node and the decisions, that names the cause."""

from __future__ import annotations

from typing import Any

from nodeflow_cli.verdicts import (
    Decision,
    decision_matches,
    decision_of,
    decisions_about,
    format_decision,
    why_gang,
    why_nodemaintenance,
    why_nodeset,
    why_pod,
    why_skyhook,
)
from nodeflow_contracts import subjects

T0 = 1_800_000_000.0


def nodemaintenance(reason: str, message: str = "", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "m1", "namespace": "default"},
        "spec": {"nodeName": "n5", "requestorID": "ops.example.com"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": reason, "message": message}
            ],
            **status,
        },
    }


def maintenance_decision(reason: str, message: str, at: float = T0) -> Decision:
    payload = {
        "decision_id": "d",
        "namespace": "default",
        "name": "m1",
        "kind": "skipped",
        "reason": reason,
        "message": message,
        "decided_at": at,
        "node": "n5",
    }
    decision = decision_of(subjects.maintenance_decision("default", "m1"), payload)
    assert decision is not None
    return decision


def test_why_nodemaintenance_names_the_budget_that_holds_it() -> None:
    held = "waiting for a slot: 2 of 2 maxParallelOperations in progress"
    decision = maintenance_decision("no-slot", held)
    text = why_nodemaintenance(nodemaintenance("Pending", held), [decision])
    first = text.splitlines()[0]
    assert first == (
        "NodeMaintenance default/m1 (node n5, requestor ops.example.com): Pending: " + held
    )
    assert "maintenance-scheduler" in text and "no-slot: " + held in text


def test_why_nodemaintenance_shows_the_drain_and_the_pods_it_waits_for() -> None:
    text = why_nodemaintenance(
        nodemaintenance(
            "Draining",
            drain={
                "totalPods": 4,
                "evictionPods": 1,
                "drainProgress": 75,
                "waitForEviction": ["a/p"],
            },
        ),
        [],
    )
    assert ": Draining" in text
    assert "drain: 75% (1 of 4 pods to evict left)" in text
    assert "waiting for eviction: a/p" in text
    assert "latest decisions: none" in text


def test_why_pod_says_a_busy_node_keeps_its_pod_and_an_unknown_state_fails_closed() -> None:
    pod = {
        "metadata": {
            "name": "gpu-001",
            "namespace": "slurm",
            "labels": {"nodeflow.dev/nodeset": "gpu"},
        },
        "spec": {"nodeName": "gpu-001"},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "SlurmDelete", "status": "True", "reason": "ScaleIn"},
                {"type": "SlurmNodeStateDrain", "status": "True"},
            ],
        },
    }
    busy = {
        "known": True,
        "base_state": "MIXED",
        "flags": ["DRAIN"],
        "busy": True,
        "draining": True,
        "cpus": 8,
        "alloc_cpus": 8,
    }
    text = why_pod(pod, busy, "sim", [])
    assert "marked for deletion: SlurmDelete=True ScaleIn" in text
    assert "Slurm node sim/gpu-001: MIXED+DRAIN; busy: 8 of 8 CPUs" in text
    assert "draining: waits for its jobs to end" in text
    unknown = why_pod(pod, {"known": False}, "sim", [])
    assert "state unknown (fail closed" in unknown
    assert "not known (fail closed" in why_pod(pod, None, "sim", [])


def test_rule_why_pod_names_the_jobs_on_a_busy_node_as_of_when_they_were_read() -> None:
    pod = {
        "metadata": {
            "name": "gpu-001",
            "namespace": "slurm",
            "labels": {"nodeflow.dev/nodeset": "gpu"},
        },
        "status": {"phase": "Running"},
    }
    busy = {"known": True, "base_state": "Mixed", "busy": True, "cpus": 128, "alloc_cpus": 64}
    jobs = {**busy, "jobs": ["4211", "4212"], "jobs_total": 2, "jobs_read_at": 1_800_000_000}
    assert (
        "busy: 64 of 128 CPUs allocated to jobs 4211, 4212 as of 2027-01-15T08:00:00Z "
        "(not deleted while it runs a job)"
    ) in why_pod(pod, jobs, "sim", [])
    # More jobs than a state keeps: how many more.
    many = {**jobs, "jobs_total": 7}
    assert "to jobs 4211, 4212 and 5 more as of" in why_pod(pod, many, "sim", [])
    # Jobs never read (an older syncer, a listing that failed so far): as before.
    assert "CPUs allocated to jobs (not deleted" in why_pod(pod, busy, "sim", [])


def test_why_gang_names_the_domain_it_could_not_find() -> None:
    group = {
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minMember": 16},
        "status": {"phase": "Pending", "scheduled": 0},
    }
    payload = {
        "namespace": "default",
        "group": "train",
        "reason": "Unschedulable",
        "message": "MustGather BlockLayer: no BlockLayer domain offers 16 slots; best s1/b2 12",
        "decided_at": T0,
    }
    decision = decision_of(subjects.placement_decision("default", "train"), payload)
    assert decision is not None and decision.service == "topology-placer"
    text = why_gang(group, [decision])
    assert "PodGroup default/train: Pending; 0 scheduled, 0 running of minMember 16" in text
    assert "no BlockLayer domain offers 16 slots" in text


def test_rule_why_nodeset_says_pods_against_replicas_and_what_a_scale_in_waits_for() -> None:
    """A scale-in keeps the pods it waits for: more pods than replicas is said as such, not
    as more replicas ready than wanted; ScaleDownWaiting names each pod and why."""
    waiting = "2 pods wait: gpu-2 (node busy with jobs, draining), gpu-3 (node busy with jobs)"
    nodeset = {
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {"replicas": 2},
        "status": {
            "currentNumberScheduled": 4,
            "numberReady": 3,
            "updatedNumberScheduled": 4,
            "numberDrain": 1,
            "numberUnavailable": 1,
            "conditions": [
                {
                    "type": "ScaleDownWaiting",
                    "status": "True",
                    "reason": "PodsBusy",
                    "message": waiting,
                }
            ],
        },
    }
    payload = {
        "namespace": "default",
        "nodeset": "gpu",
        "pod": "gpu-2",
        "reason": "ScalingDeleteScheduled",
        "message": "scale down to 2: rank 3: running jobs, not drained",
        "decided_at": T0,
    }
    decision = decision_of(subjects.nodeset_decision("default", "gpu"), payload)
    assert decision is not None and decision.service == "nodeset-controller"
    lines = why_nodeset(nodeset, [decision]).splitlines()
    assert lines[0] == (
        "NodeSet default/gpu: 2 replicas wanted; 4 pods, 3 ready, 4 updated, 1 draining, "
        "1 unavailable"
    )
    assert lines[1] == "ScaleDownWaiting=True PodsBusy: " + waiting
    assert "ScalingDeleteScheduled: scale down to 2: rank 3" in lines[-1]


def test_why_skyhook_says_it_is_paused_and_the_node_it_waits_on() -> None:
    skyhook = {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "tuning", "annotations": {"skyhook.nvidia.com/pause": "true"}},
        "status": {"status": "in_progress", "nodesInProgress": 1, "completeNodes": "3/8"},
    }
    payload = {
        "skyhook": "tuning",
        "reason": "stage-failed",
        "message": "apply failed",
        "decided_at": T0,
        "node": "n7",
    }
    decision = decision_of(subjects.skyhook_decision("tuning"), payload)
    assert decision is not None
    text = why_skyhook(skyhook, [decision])
    assert "Skyhook tuning: in_progress (paused); 1 nodes in progress, 3/8 complete" in text
    assert "Skyhook tuning (node n7)  stage-failed: apply failed" in text


def test_rule_why_skyhook_reads_pause_and_disable_as_the_controller_does_for_each_kind() -> None:
    """The annotations of the object's own group (upstream since v0.8), never `spec.pause`,
    which the controller does not read, nor the other group's annotation."""
    legacy_field = {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "tuning"},
        "spec": {"pause": True},
        "status": {"status": "in_progress"},
    }
    assert "(paused)" not in why_skyhook(legacy_field, [])
    nodewright = {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {
            "name": "tuning",
            "annotations": {
                "nodewright.nvidia.com/disable": "True",
                "skyhook.nvidia.com/pause": "true",
            },
        },
        "status": {"status": "disabled"},
    }
    text = why_skyhook(nodewright, [])
    assert text.startswith("NodeWright tuning: disabled (disabled);")
    assert "(paused)" not in text


def test_decisions_are_filtered_by_service_and_object_and_read_in_order() -> None:
    late = maintenance_decision("scheduled", "go", at=T0 + 5)
    early = maintenance_decision("no-slot", "wait", at=T0)
    nodeset = decision_of(
        subjects.nodeset_decision("slurm", "gpu"),
        {"namespace": "slurm", "nodeset": "gpu", "reason": "Busy", "message": "m", "pod": "p1"},
    )
    assert nodeset is not None
    assert decisions_about([late, nodeset, early], "NodeMaintenance default/m1") == [early, late]
    assert decision_matches(nodeset, service="nodeset-controller", about="p1")
    assert not decision_matches(nodeset, service="maintenance-scheduler")
    assert decision_matches(early, about="default/m1")
    assert format_decision(early).startswith("2027-01-15T08:00:00Z  maintenance-scheduler")
    assert decision_of("k8s.v1.Pod.default.p", {}) is None


def test_rule_why_nodewright_shows_only_its_own_decisions_not_a_skyhooks_of_its_name() -> None:
    """A Skyhook and a NodeWright of one name publish on one subject: each decision names its
    object's kind (a decision without it, of an earlier release, is a Skyhook's)."""
    subject = subjects.skyhook_decision("tuning")
    base = {"skyhook": "tuning", "reason": "apply-complete", "decided_at": T0, "node": "n1"}
    ours = decision_of(subject, {**base, "message": "ours", "object_kind": "NodeWright"})
    theirs = decision_of(subject, {**base, "message": "theirs", "object_kind": "Skyhook"})
    older = decision_of(subject, {**base, "message": "older"})
    assert ours is not None and theirs is not None and older is not None
    assert (ours.about, theirs.about, older.about) == (
        "NodeWright tuning",
        "Skyhook tuning",
        "Skyhook tuning",
    )
    nodewright = {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "tuning"},
        "status": {"status": "in_progress"},
    }
    about = decisions_about([ours, theirs, older], "NodeWright tuning")
    text = why_skyhook(nodewright, about)
    assert "NodeWright tuning (node n1)  apply-complete: ours" in text
    assert "theirs" not in text and "older" not in text

"""The stage Job, the interrupt's NodeMaintenance, what Jobs and pods say, and the commands."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.api import (
    OperatorConfig,
    parse_node_maintenance,
)
from maintenance_scheduler.reconcile import garbage_collect
from maintenance_scheduler.skyhook.api import parse_skyhook
from maintenance_scheduler.skyhook.commands import command_for, decision_for
from maintenance_scheduler.skyhook.jobs import build_job, build_maintenance, job_name
from maintenance_scheduler.skyhook.observe import job_facts
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    NodeView,
    PatchNode,
    SetSkyhookStatus,
    SkyhookDecisionNote,
)
from nodeflow_contracts import k8s
from nodeflow_kube.fields import (
    rfc3339,
)

T0 = 1_800_000_000.0

SKYHOOK = parse_skyhook(
    {
        "metadata": {"name": "gpu-init", "uid": "uid-1", "resourceVersion": "5"},
        "spec": {
            "podNonInterruptLabels": {"matchLabels": {"app": "training"}},
            "additionalTolerations": [{"key": "gpu", "operator": "Exists"}],
            "packages": {
                "kernel": {
                    "version": "2.0.0",
                    "image": "registry.local/kernel",
                    "interrupt": {"type": "reboot"},
                    "stageTimeout": 900,
                    "env": [{"name": "MODE", "value": "fast"}],
                }
            },
        },
    }
)
KERNEL = SKYHOOK.packages[0]


def test_stage_job_has_the_proposal_shape_and_labels() -> None:
    # Every stage but interrupt (whose pod restarts OnFailure: test_interrupt_order.py).
    job = build_job(
        SKYHOOK,
        KERNEL,
        "post-interrupt",
        "node-7",
        namespace="ops",
        default_stage_timeout_seconds=60,
    )
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (1, 1, 0)
    assert spec["ttlSecondsAfterFinished"] == 86400
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["activeDeadlineSeconds"] == 900  # the package's stageTimeout wins
    pod = spec["template"]["spec"]
    assert pod["nodeName"] == "node-7"
    assert {"key": "gpu", "operator": "Exists"} in pod["tolerations"]
    # The package pod contract (test_package_pod.py holds it field by field).
    copy, stage, check = pod["initContainers"]
    assert copy["image"] == "registry.local/kernel:2.0.0"
    assert stage["args"][0] == "post-interrupt" and check["args"][0] == "post-interrupt-check"
    assert {"name": "MODE", "value": "fast"} in stage["env"]
    assert [c["name"] for c in pod["containers"]] == ["done"]
    labels = job["metadata"]["labels"]
    assert labels["skyhook.nvidia.com/name"] == "gpu-init"
    assert labels["skyhook.nvidia.com/package"] == "kernel"
    assert labels["skyhook.nvidia.com/node"] == "node-7"
    assert labels["skyhook.nvidia.com/stage"] == "post-interrupt"
    assert labels["skyhook.nvidia.com/resource-id"]
    assert spec["template"]["metadata"]["labels"] == labels
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Skyhook", "gpu-init", "uid-1")
    # An eviction is not the package's failure.
    assert spec["podFailurePolicy"]["rules"][0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget"}],
    }


@settings(max_examples=200, deadline=None)
@given(
    skyhook=st.from_regex(r"[a-z][a-z0-9-]{0,60}[a-z0-9]", fullmatch=True),
    package=st.from_regex(r"[a-z][-a-z0-9]{0,41}[a-z]", fullmatch=True),
    version=st.from_regex(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", fullmatch=True),
    stage=st.sampled_from(["apply", "config", "interrupt", "post-interrupt", "upgrade"]),
    node=st.from_regex(r"[a-z0-9][a-z0-9.-]{0,80}[a-z0-9]", fullmatch=True),
)
def test_job_names_are_deterministic_valid_and_distinct_per_stage(
    skyhook: str, package: str, version: str, stage: str, node: str
) -> None:
    name = job_name(skyhook, package, version, stage, node)
    assert name == job_name(skyhook, package, version, stage, node)
    assert len(name) <= 63
    assert name[0].isalnum() and name[-1].isalnum()
    assert all(c.isalnum() or c == "-" for c in name) and name == name.lower()
    assert name != job_name(skyhook, package, version, "uninstall", node)
    assert name != job_name(skyhook, package, version + "1", stage, node)


def test_interrupt_maintenance_request_cordons_waits_and_drains_all_but_package_pods() -> None:
    body = build_maintenance(SKYHOOK, "node-7", namespace="ops", drain_timeout_seconds=300)
    body["metadata"]["uid"] = "nm-1"
    request = parse_node_maintenance(body)
    assert request.problems == ()
    assert request.requestor_id == "gpu-init.skyhook.nvidia.com"
    assert request.node_name == "node-7" and request.cordon
    assert request.wait_for_pod_completion is not None
    assert request.wait_for_pod_completion.pod_selector == "app=training"
    assert request.drain_spec is not None
    assert request.drain_spec.pod_selector == "!skyhook.nvidia.com/name,!nodewright.nvidia.com/name"


def test_rule_skyhooks_own_request_is_never_garbage_collected() -> None:
    """A failed interrupt keeps its node out of service through Skyhook's request: the
    garbage collector, an hour after the request went Ready, must not delete it (and
    uncordon a half-upgraded node). The Skyhook controller deletes it itself."""
    body = build_maintenance(SKYHOOK, "node-7", namespace="ops", drain_timeout_seconds=300)
    body["metadata"].update(
        uid="nm-1",
        resourceVersion="9",
        creationTimestamp=rfc3339(T0),
        finalizers=["maintenance.nvidia.com/finalizer"],
    )
    body["metadata"]["annotations"]["maintenance.nvidia.com/ready-time"] = rfc3339(T0)
    ready = {"type": "Ready", "status": "True", "reason": "Ready"}
    body["status"] = {"conditions": [{**ready, "lastTransitionTime": rfc3339(T0)}]}
    due, _ = garbage_collect([parse_node_maintenance(body)], OperatorConfig(), T0 + 10 * 3600)
    assert due == []


def pod(containers: list[dict[str, Any]], phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "creationTimestamp": rfc3339(T0)},
        "status": {"phase": phase, "containerStatuses": containers},
    }


def job(condition: str | None = None, reason: str = "") -> dict[str, Any]:
    conditions = [{"type": condition, "status": "True", "reason": reason}] if condition else []
    return {"metadata": {"name": "j"}, "status": {"conditions": conditions}}


def test_job_completion_truth_is_the_job_condition_and_oom_comes_from_the_pod() -> None:
    assert job_facts(job("Complete"), []).outcome == "complete"
    failed = job_facts(job("Failed", "BackoffLimitExceeded"), [])
    assert (failed.outcome, failed.reason) == ("failed", "BackoffLimitExceeded")
    oom = pod([{"image": "x", "state": {"terminated": {"reason": "OOMKilled"}}}], "Failed")
    assert job_facts(job("Failed", "BackoffLimitExceeded"), [oom]).reason == "OOMKilled"
    # A pod alone never ends a stage: only the Job's condition does.
    done_pod = pod([{"image": "x", "state": {"terminated": {"reason": "Completed"}}}], "Succeeded")
    assert job_facts(job(), [done_pod]).outcome == "running"


def test_image_pull_backoff_is_seen_on_the_pod_with_its_image() -> None:
    stuck = pod(
        [{"image": "registry.local/x:1", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]
    )
    facts = job_facts(job(), [stuck])
    assert facts.pull_stuck_since == T0
    assert facts.pull_image == "registry.local/x:1"


def test_a_retried_stage_is_a_new_create_command_and_the_same_state_the_same_key() -> None:
    def key(attempt: int) -> str:
        action = CreateJob(SKYHOOK, KERNEL, "apply", "node-7", "job-a", attempt)
        return command_for(
            action, T0, namespace="ops", default_stage_timeout_seconds=0, drain_timeout_seconds=0
        ).idempotency_key

    assert key(0) == key(0)
    assert key(0) != key(1)


def test_status_writes_carry_the_resource_version_precondition() -> None:
    command = command_for(
        SetSkyhookStatus(SKYHOOK, {"status": "complete"}),
        T0,
        namespace="ops",
        default_stage_timeout_seconds=0,
        drain_timeout_seconds=0,
    )
    assert command.target.resource_version == "5"
    assert isinstance(command.operation, k8s.UpdateStatus)
    assert command.sender == "maintenance-scheduler"


def test_node_patch_writes_state_annotation_and_status_label() -> None:
    node = NodeView("node-7", "n-uid", "12", {}, {}, T0)
    command = command_for(
        PatchNode("gpu-init", node, '{"x":1}', "in_progress"),
        T0,
        namespace="ops",
        default_stage_timeout_seconds=0,
        drain_timeout_seconds=0,
    )
    assert isinstance(command.operation, k8s.PatchObject)
    metadata = command.operation.patch["metadata"]
    assert metadata["annotations"]["skyhook.nvidia.com/nodeState_gpu-init"] == '{"x":1}'
    assert metadata["annotations"]["skyhook.nvidia.com/status_gpu-init"] == "in_progress"
    assert metadata["labels"]["skyhook.nvidia.com/status_gpu-init"] == "in_progress"


def test_decisions_go_to_the_skyhook_subject() -> None:
    note = SkyhookDecisionNote("gpu-init", "stage", "kernel on node-7: started", reason="started")
    decision = decision_for(note, T0, "5:12")
    assert decision.subject == "maintenance.v1.skyhook.gpu-init.decision"
    assert decision.decision_id == decision_for(note, T0 + 5, "5:12").decision_id

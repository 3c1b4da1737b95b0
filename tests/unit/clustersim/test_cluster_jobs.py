from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from clustersim.cluster.joblogic import (
    JOB_TRACKING_FINALIZER,
    format_time,
    plan_job,
    pod_failure_policy_action,
    pod_from_template,
    retry_delay,
)

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


def job(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": "job-uid"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}},
            **spec,
        },
        "status": {},
    }


def job_pod(
    name: str,
    phase: str = "Running",
    exit_code: int | None = None,
    tracked: bool = True,
    deleting: bool = False,
    finished: datetime = NOW,
    conditions: list[dict[str, str]] | None = None,
    ready: bool = True,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": list(conditions or [])}
    if phase == "Running" and ready:
        status["conditions"].append({"type": "Ready", "status": "True"})
    if exit_code is not None:
        status["containerStatuses"] = [
            {
                "name": "main",
                "state": {
                    "terminated": {"exitCode": exit_code, "finishedAt": format_time(finished)}
                },
            }
        ]
    metadata: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
    if tracked:
        metadata["finalizers"] = [JOB_TRACKING_FINALIZER]
    if deleting:
        metadata["deletionTimestamp"] = format_time(NOW)
    return {"metadata": metadata, "spec": {}, "status": status}


def condition_types(status: dict[str, Any]) -> list[str]:
    return [c["type"] for c in status.get("conditions") or [] if c["status"] == "True"]


def test_new_job_creates_one_pod_and_starts() -> None:
    plan = plan_job(job(), [], NOW)
    assert plan.create_pods == 1
    assert plan.status["active"] == 1
    assert plan.status["startTime"] == format_time(NOW)


def test_running_pod_keeps_job_active() -> None:
    plan = plan_job(job(), [job_pod("a")], NOW)
    assert plan.create_pods == 0
    assert plan.status["active"] == 1 and plan.status["ready"] == 1


def test_success_counts_once_and_completes() -> None:
    plan = plan_job(job(), [job_pod("a", "Succeeded", 0)], NOW)
    assert plan.status["succeeded"] == 1
    assert plan.release_finalizers == ["a"]
    assert condition_types(plan.status) == ["SuccessCriteriaMet", "Complete"]
    assert plan.status["completionTime"] == format_time(NOW)
    again = plan_job(
        dict(job(), status=plan.status), [job_pod("a", "Succeeded", 0, tracked=False)], NOW
    )
    assert again.status["succeeded"] == 1 and again.create_pods == 0


def test_failure_retries_until_backoff_limit() -> None:
    first = plan_job(job(backoffLimit=1), [job_pod("a", "Failed", 1)], NOW, backoff_seconds=0)
    assert first.status["failed"] == 1 and first.create_pods == 1
    second = plan_job(
        dict(job(backoffLimit=1), status=first.status),
        [job_pod("a", "Failed", 1, tracked=False), job_pod("b", "Failed", 1)],
        NOW,
        backoff_seconds=0,
    )
    assert second.status["failed"] == 2
    assert second.create_pods == 0
    assert condition_types(second.status) == ["FailureTarget", "Failed"]
    failed = next(c for c in second.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "completionTime" not in second.status


def test_retry_waits_for_backoff() -> None:
    plan = plan_job(job(), [job_pod("a", "Failed", 1, finished=NOW)], NOW, backoff_seconds=10)
    assert plan.create_pods == 0
    assert plan.requeue_after == 10
    later = plan_job(
        dict(job(), status=plan.status),
        [job_pod("a", "Failed", 1, tracked=False, finished=NOW)],
        NOW + timedelta(seconds=11),
        backoff_seconds=10,
    )
    assert later.create_pods == 1


def test_retry_delay_grows_and_caps() -> None:
    assert [retry_delay(n, 10) for n in (0, 1, 2, 3)] == [0, 10, 20, 40]
    assert retry_delay(30, 10) == 360


def test_active_deadline_fails_and_deletes_active_pods() -> None:
    started = dict(job(activeDeadlineSeconds=5), status={"startTime": format_time(NOW)})
    early = plan_job(started, [job_pod("a")], NOW + timedelta(seconds=2))
    assert early.requeue_after == 3 and not early.delete_pods
    late = plan_job(started, [job_pod("a")], NOW + timedelta(seconds=6))
    assert late.delete_pods == ["a"]
    assert condition_types(late.status) == ["FailureTarget"]
    done = plan_job(
        dict(started, status=late.status), [job_pod("a", "Failed", 143)], NOW + timedelta(seconds=7)
    )
    failed = next(c for c in done.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"


def test_terminating_pods_delay_failed_condition() -> None:
    started = dict(job(activeDeadlineSeconds=1), status={"startTime": format_time(NOW)})
    plan = plan_job(started, [job_pod("a", deleting=True)], NOW + timedelta(seconds=2))
    assert condition_types(plan.status) == ["FailureTarget"]
    assert plan.status["terminating"] == 1


POLICY = {
    "rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                               "values": [42]}},
        {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [42, 43]}},
    ]
}  # fmt: skip


def test_pod_failure_policy_fail_job() -> None:
    plan = plan_job(job(podFailurePolicy=POLICY), [job_pod("a", "Failed", 42)], NOW)
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy"
    assert failed["message"] == (
        "Container main for pod ml/a failed with exit code 42 matching FailJob rule at index 1"
    )
    assert plan.create_pods == 0


def test_pod_failure_policy_ignore_does_not_count() -> None:
    disrupted = job_pod(
        "a", "Failed", 137, conditions=[{"type": "DisruptionTarget", "status": "True"}]
    )
    plan = plan_job(job(podFailurePolicy=POLICY, backoffLimit=0), [disrupted], NOW, 0)
    assert plan.status["failed"] == 0
    assert plan.create_pods == 1
    assert plan.release_finalizers == ["a"]


def test_pod_failure_policy_matching_rules() -> None:
    assert pod_failure_policy_action(job(podFailurePolicy=POLICY), job_pod("a", "Failed", 1)) == (
        "Count",
        "Container main for pod ml/a failed with exit code 1 matching Count rule at index 2",
    )
    assert pod_failure_policy_action(job(podFailurePolicy=POLICY), job_pod("a", "Failed", 43)) is (
        None
    )
    assert pod_failure_policy_action(job(), job_pod("a", "Failed", 42)) is None


def test_ttl_deletes_finished_job() -> None:
    finished = plan_job(job(ttlSecondsAfterFinished=30), [job_pod("a", "Succeeded", 0)], NOW)
    assert finished.requeue_after == 30
    done = dict(job(ttlSecondsAfterFinished=30), status=finished.status)
    assert not plan_job(done, [], NOW + timedelta(seconds=10)).delete_job
    assert plan_job(done, [], NOW + timedelta(seconds=31)).delete_job


def test_suspended_job_creates_nothing() -> None:
    plan = plan_job(job(suspend=True), [job_pod("a")], NOW)
    assert plan.create_pods == 0 and plan.delete_pods == ["a"]
    assert condition_types(plan.status) == ["Suspended"]


def test_pod_from_template_labels_owner_and_finalizer() -> None:
    template_job = job()
    template_job["spec"]["template"]["metadata"] = {"labels": {"app": "x"}}
    pod = pod_from_template(template_job, "train-abcde")
    labels = pod["metadata"]["labels"]
    assert labels["app"] == "x"
    assert labels["job-name"] == labels["batch.kubernetes.io/job-name"] == "train"
    assert labels["controller-uid"] == labels["batch.kubernetes.io/controller-uid"] == "job-uid"
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Job" and owner["uid"] == "job-uid" and owner["controller"]
    assert pod["metadata"]["finalizers"] == [JOB_TRACKING_FINALIZER]
    assert pod["spec"]["restartPolicy"] == "Never"


@given(
    outcomes=st.lists(st.sampled_from(["Succeeded", "Failed"]), min_size=1, max_size=10),
    backoff_limit=st.integers(0, 5),
)
def test_counts_never_exceed_terminal_pods(outcomes: list[str], backoff_limit: int) -> None:
    """Feeding pods one at a time, each terminal pod is counted exactly once."""
    status: dict[str, Any] = {}
    pods: list[dict[str, Any]] = []
    for index, phase in enumerate(outcomes):
        pods.append(job_pod(f"p{index}", phase, 0 if phase == "Succeeded" else 1))
        plan = plan_job(dict(job(backoffLimit=backoff_limit), status=status), pods, NOW, 0)
        status = plan.status
        pods = [dict(p, metadata={**p["metadata"], "finalizers": []}) for p in pods]
        total = status["succeeded"] + status["failed"]
        assert total == len(pods)
        finished = set(condition_types(status)) & {"Complete", "Failed"}
        assert len(finished) <= 1
        if finished:
            break

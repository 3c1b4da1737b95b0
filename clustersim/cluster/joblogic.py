"""The batch/v1 Job state machine as one pure function, `plan_job`.

It follows the upstream job controller (Kubernetes 1.31+) for non-indexed Jobs:
- pods carry the `batch.kubernetes.io/job-tracking` finalizer; a terminal pod is counted
  into status.succeeded/failed exactly once, and then its finalizer is removed;
- failure (backoffLimit, activeDeadlineSeconds, podFailurePolicy FailJob) first adds a
  FailureTarget condition and deletes active pods; Failed is added once none remain;
- success adds SuccessCriteriaMet, then Complete with completionTime once no pod runs;
- podFailurePolicy rules (onExitCodes In/NotIn, onPodConditions) with actions
  FailJob / Ignore / Count, first matching rule wins;
- retries back off exponentially from the newest failed pod's finish time;
- ttlSecondsAfterFinished deletes the Job that long after it finished.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

Obj = Mapping[str, Any]

JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
DEFAULT_BACKOFF_LIMIT = 6
MAX_BACKOFF_FACTOR = 36  # upstream caps the retry delay at 6 minutes from a 10 s base

_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's generateName alphabet


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass
class JobPlan:
    """What the controller should do for one Job, in this order."""

    status: dict[str, Any]
    create_pods: int = 0
    delete_pods: list[str] = field(default_factory=list)
    release_finalizers: list[str] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None


def _condition_true(status: Obj, kind: str) -> Obj | None:
    condition: Obj
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def _set_condition(
    status: dict[str, Any], kind: str, state: bool, reason: str, message: str, now: str
) -> None:
    conditions = status.setdefault("conditions", [])
    for condition in conditions:
        if condition.get("type") == kind:
            wanted = "True" if state else "False"
            if condition.get("status") != wanted:
                condition["lastTransitionTime"] = now
            condition.update(
                {"status": wanted, "reason": reason, "message": message, "lastProbeTime": now}
            )
            return
    conditions.append(
        {
            "type": kind,
            "status": "True" if state else "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": now,
            "lastTransitionTime": now,
        }
    )


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _is_terminal(pod: Obj) -> bool:
    return _phase(pod) in ("Succeeded", "Failed")


def _is_deleting(pod: Obj) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def _tracked(pod: Obj) -> bool:
    return JOB_TRACKING_FINALIZER in (pod.get("metadata", {}).get("finalizers") or [])


def _is_ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def pod_failure_policy_action(job: Obj, pod: Obj) -> tuple[str, str] | None:
    """The first podFailurePolicy rule matching a Failed pod: (action, message), or None."""
    rules = ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
    metadata = pod.get("metadata", {})
    pod_ref = f"{metadata.get('namespace', 'default')}/{metadata.get('name')}"
    status = pod.get("status") or {}
    container_statuses = list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    )
    for index, rule in enumerate(rules):
        action = str(rule.get("action"))
        on_exit = rule.get("onExitCodes")
        if on_exit:
            operator = on_exit.get("operator")
            values = {int(v) for v in on_exit.get("values") or ()}
            for container in container_statuses:
                wanted = on_exit.get("containerName")
                if wanted and container.get("name") != wanted:
                    continue
                terminated = (container.get("state") or {}).get("terminated")
                if not terminated:
                    continue
                code = int(terminated.get("exitCode", 0))
                if code == 0:  # upstream ignores successful containers for both operators
                    continue
                if (operator == "In" and code in values) or (
                    operator == "NotIn" and code not in values
                ):
                    return action, (
                        f"Container {container.get('name')} for pod {pod_ref} failed with exit "
                        f"code {code} matching {action} rule at index {index}"
                    )
        for pattern in rule.get("onPodConditions") or []:
            wanted_status = pattern.get("status") or "True"
            for condition in status.get("conditions") or []:
                if condition.get("type") == pattern.get("type") and (
                    condition.get("status") == wanted_status
                ):
                    return action, (
                        f"Pod {pod_ref} has condition {pattern.get('type')} matching {action} "
                        f"rule at index {index}"
                    )
    return None


def retry_delay(failed: int, base_seconds: float) -> float:
    """Exponential back-off before the next pod: base * 2^(failed-1), capped."""
    if failed <= 0 or base_seconds <= 0:
        return 0.0
    return float(min(base_seconds * 2 ** (failed - 1), base_seconds * MAX_BACKOFF_FACTOR))


def _newest_failure(pods: Sequence[Obj]) -> datetime | None:
    newest: datetime | None = None
    for pod in pods:
        if _phase(pod) != "Failed":
            continue
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            finished = parse_time(
                ((container.get("state") or {}).get("terminated") or {}).get("finishedAt")
            )
            if finished is not None and (newest is None or finished > newest):
                newest = finished
    return newest


def _finished_at(status: Obj) -> datetime | None:
    for kind in ("Complete", "Failed"):
        condition = _condition_true(status, kind)
        if condition is not None:
            return parse_time(status.get("completionTime")) or parse_time(
                condition.get("lastTransitionTime")
            )
    return None


def plan_job(
    job: Obj, pods: Sequence[Obj], now: datetime, backoff_seconds: float = 10.0
) -> JobPlan:
    """Decide the next step for `job` given every pod it owns."""
    spec = job.get("spec") or {}
    status: dict[str, Any] = copy.deepcopy(dict(job.get("status") or {}))
    now_text = format_time(now)
    plan = JobPlan(status=status)

    tracked_terminal = [p for p in pods if _tracked(p) and _is_terminal(p)]
    plan.release_finalizers = [p["metadata"]["name"] for p in tracked_terminal]
    active = [p for p in pods if not _is_terminal(p) and not _is_deleting(p)]
    terminating = [p for p in pods if not _is_terminal(p) and _is_deleting(p)]

    finished_at = _finished_at(status)
    if finished_at is not None:
        plan.delete_pods = [p["metadata"]["name"] for p in active]
        ttl = spec.get("ttlSecondsAfterFinished")
        if ttl is not None:
            remaining = (finished_at + timedelta(seconds=int(ttl)) - now).total_seconds()
            if remaining <= 0:
                plan.delete_job = True
            else:
                plan.requeue_after = remaining
        return plan

    succeeded = int(status.get("succeeded") or 0)
    failed = int(status.get("failed") or 0)
    failure: tuple[str, str] | None = None
    # A Job already failing (FailureTarget) keeps its reason: the pods it kills on the way
    # count as failed but do not re-judge it under the podFailurePolicy.
    judged = _condition_true(status, "FailureTarget") is not None
    for pod in tracked_terminal:
        if _phase(pod) == "Succeeded":
            succeeded += 1
            continue
        matched = pod_failure_policy_action(job, pod)
        action = matched[0] if matched else "Count"
        if action == "Ignore":
            continue
        failed += 1
        if action == "FailJob" and matched and failure is None and not judged:
            failure = ("PodFailurePolicy", matched[1])

    status["succeeded"] = succeeded
    status["failed"] = failed
    status.setdefault("uncountedTerminatedPods", {})
    suspended = bool(spec.get("suspend"))
    if not status.get("startTime") and not suspended:
        status["startTime"] = now_text

    completions = int(spec.get("completions") or 1)
    parallelism = int(spec["parallelism"]) if spec.get("parallelism") is not None else 1
    backoff_limit = int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))

    if failure is None and _condition_true(status, "FailureTarget") is None:
        if failed > backoff_limit:
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        deadline = spec.get("activeDeadlineSeconds")
        started = parse_time(status.get("startTime"))
        if failure is None and deadline is not None and started is not None and not suspended:
            remaining = (started + timedelta(seconds=int(deadline)) - now).total_seconds()
            if remaining <= 0:
                failure = ("DeadlineExceeded", "Job was active longer than specified deadline")
            else:
                plan.requeue_after = remaining
    if failure is not None:
        _set_condition(status, "FailureTarget", True, failure[0], failure[1], now_text)

    failure_target = _condition_true(status, "FailureTarget")
    success = failure_target is None and succeeded >= completions
    if success and _condition_true(status, "SuccessCriteriaMet") is None:
        _set_condition(
            status,
            "SuccessCriteriaMet",
            True,
            "CompletionsReached",
            "Reached expected number of succeeded pods",
            now_text,
        )

    if failure_target is not None or success or suspended:
        plan.delete_pods = [p["metadata"]["name"] for p in active]
        still_running = len(active) + len(terminating)
        if suspended and failure_target is None and not success:
            _set_condition(status, "Suspended", True, "JobSuspended", "Job suspended", now_text)
        elif still_running == 0 and failure_target is not None:
            _set_condition(
                status,
                "Failed",
                True,
                str(failure_target.get("reason")),
                str(failure_target.get("message")),
                now_text,
            )
        elif still_running == 0:
            _set_condition(
                status,
                "Complete",
                True,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now_text,
            )
            status["completionTime"] = now_text
        status["active"] = 0
        status["ready"] = 0
        status["terminating"] = still_running
        if _finished_at(status) is not None and spec.get("ttlSecondsAfterFinished") is not None:
            plan.requeue_after = float(int(spec["ttlSecondsAfterFinished"]))
        return plan

    if _condition_true(status, "Suspended") is not None:
        _set_condition(status, "Suspended", False, "JobResumed", "Job resumed", now_text)

    # Upstream replaces terminating pods at once unless a podFailurePolicy is set, in which
    # case it waits for them to fail (podReplacementPolicy TerminatingOrFailed vs Failed).
    replacement_policy = spec.get("podReplacementPolicy") or (
        "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )
    occupying = len(active) + (len(terminating) if replacement_policy == "Failed" else 0)
    wanted = max(0, min(parallelism, completions - succeeded) - occupying)
    if wanted > 0 and failed > 0:
        newest = _newest_failure(pods)
        if newest is not None:
            wait = (
                newest + timedelta(seconds=retry_delay(failed, backoff_seconds)) - now
            ).total_seconds()
            if wait > 0:
                wanted = 0
                plan.requeue_after = min(wait, plan.requeue_after or wait)
    plan.create_pods = wanted
    status["active"] = len(active) + wanted
    status["ready"] = sum(1 for p in active if _is_ready(p))
    status["terminating"] = len(terminating)
    return plan


def random_suffix(length: int = 5) -> str:
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(length))


def pod_from_template(job: Obj, name: str) -> dict[str, Any]:
    """The pod the job controller creates: template + job labels, owner and tracking finalizer."""
    metadata = job["metadata"]
    template = copy.deepcopy(dict((job.get("spec") or {}).get("template") or {}))
    template_meta = dict(template.get("metadata") or {})
    uid = str(metadata.get("uid", ""))
    labels = dict(template_meta.get("labels") or {})
    labels.update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": metadata["name"],
            "controller-uid": uid,
            "job-name": metadata["name"],
        }
    )
    pod_spec = dict(template.get("spec") or {})
    pod_spec.setdefault("restartPolicy", "Never")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{metadata['name']}-",
            "namespace": metadata.get("namespace", "default"),
            "labels": labels,
            "annotations": dict(template_meta.get("annotations") or {}),
            "finalizers": [JOB_TRACKING_FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": metadata["name"],
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": pod_spec,
    }


def pod_name_for(job: Obj) -> str:
    return f"{job['metadata']['name']}-{random_suffix()}"

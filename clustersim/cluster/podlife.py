"""What a simulated container does, and the pod statuses a kubelet would report for it.

Image suffix decides the outcome: `:unpullable` never pulls (ErrImagePull, then
ImagePullBackOff), `:fail` exits 1, `:oom` is OOMKilled (exit 137), `:sleep` runs until it is
killed (a hung stage, for deadlines); any other image runs for the configured runtime and
exits 0 when the pod is finite (owned by a Job, or restartPolicy is not Always), or runs
until deleted. The suffix may also end a longer tag after a dash (`:1.0.0-unpullable`), so a
semantic version can carry it. A finite container that runs `reboot` reboots its node when it
exits 0 (`requests_reboot`; the Skyhook agent's reboot interrupt: `agent.requests_reboot`).
The annotation `RUNTIME_ANNOTATION` overrides the runtime of one pod. A deleted pod's
containers exit on SIGTERM after the kubelet's stop time (as slurmd does), or after
`STOP_ANNOTATION` seconds for one pod; one that takes longer than the pod's grace period is
killed when the grace ends.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]

RUNTIME_ANNOTATION = "clustersim.nodeflow.dev/runtime-seconds"
STOP_ANNOTATION = "clustersim.nodeflow.dev/stop-seconds"
OOM_EXIT_CODE = 137
SIGTERM_EXIT_CODE = 143


class Outcome(enum.Enum):
    UNPULLABLE = "unpullable"
    FAIL = "fail"
    OOM = "oom"
    SUCCEED = "succeed"
    RUN_FOREVER = "run_forever"


_SUFFIXES = {
    "unpullable": Outcome.UNPULLABLE,
    "fail": Outcome.FAIL,
    "oom": Outcome.OOM,
    "sleep": Outcome.RUN_FOREVER,
}


def image_outcome(image: str, finite: bool) -> Outcome:
    """Behaviour of one container image; `finite` pods finish, others run forever."""
    tag = image.rsplit("/", 1)[-1].rpartition(":")[2] if ":" in image.rsplit("/", 1)[-1] else ""
    suffix = tag.rpartition("-")[2]
    outcome = _SUFFIXES.get(tag) or _SUFFIXES.get(suffix)
    if outcome is not None:
        return outcome
    return Outcome.SUCCEED if finite else Outcome.RUN_FOREVER


_PRECEDENCE = (Outcome.UNPULLABLE, Outcome.OOM, Outcome.FAIL, Outcome.RUN_FOREVER, Outcome.SUCCEED)


def pod_outcome(pod: Obj) -> Outcome:
    """The pod's fate is its worst container's: a stuck pull beats OOM beats failure."""
    finite = is_finite(pod)
    outcomes = {
        image_outcome(str(c.get("image") or ""), finite)
        for c in pod.get("spec", {}).get("containers") or []
    }
    for outcome in _PRECEDENCE:
        if outcome in outcomes:
            return outcome
    return Outcome.SUCCEED if finite else Outcome.RUN_FOREVER


def is_finite(pod: Obj) -> bool:
    owners = pod.get("metadata", {}).get("ownerReferences") or []
    owned_by_job = any(o.get("kind") == "Job" for o in owners)
    return owned_by_job or pod.get("spec", {}).get("restartPolicy", "Always") != "Always"


def runtime_seconds(pod: Obj, default: float) -> float:
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(RUNTIME_ANNOTATION)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        return default


def stop_seconds(pod: Obj, default: float) -> float:
    """How long the pod's containers take to exit once sent SIGTERM."""
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(STOP_ANNOTATION)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        return default


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str
    message: str = ""


def termination_for(outcome: Outcome) -> Termination:
    if outcome is Outcome.OOM:
        return Termination(OOM_EXIT_CODE, "OOMKilled")
    if outcome is Outcome.FAIL:
        return Termination(1, "Error")
    return Termination(0, "Completed")


def _container_id(pod: Obj, container: str, attempt: int) -> str:
    uid = pod.get("metadata", {}).get("uid", "")
    return f"containerd://{uid.replace('-', '')[:24]}{container[:16]}{attempt}"


def _condition(kind: str, status: bool, now: str, reason: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    if reason:
        condition["reason"] = reason
    return condition


def merge_conditions(
    existing: Sequence[Obj], updates: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Replace conditions by type, keeping lastTransitionTime when the status did not change.

    Conditions other components own (DisruptionTarget, SlurmNodeState*, ...) are kept.
    """
    by_type = {str(c.get("type")): dict(c) for c in existing}
    for update in updates:
        previous = by_type.get(update["type"])
        merged = dict(update)
        if previous is not None and previous.get("status") == update["status"]:
            merged["lastTransitionTime"] = previous.get(
                "lastTransitionTime", update.get("lastTransitionTime")
            )
        by_type[update["type"]] = merged
    order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
    ranked = sorted(
        by_type.values(),
        key=lambda c: (
            order.index(c["type"]) if c["type"] in order else len(order),
            str(c["type"]),
        ),
    )
    return ranked


def _base_status(pod: Obj, node_ip: str, pod_ip: str, start_time: str) -> dict[str, Any]:
    status = dict(pod.get("status") or {})
    status.update(
        {
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": start_time,
            "qosClass": qos_class(pod),
        }
    )
    return status


def qos_class(pod: Obj) -> str:
    containers = pod.get("spec", {}).get("containers") or []
    any_set = False
    guaranteed = bool(containers)
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        any_set = any_set or bool(requests) or bool(limits)
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def _container_status(
    pod: Obj,
    container: Obj,
    state: dict[str, Any],
    ready: bool,
    restarts: int = 0,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    name = str(container.get("name"))
    image = str(container.get("image") or "")
    status: dict[str, Any] = {
        "name": name,
        "image": image,
        "imageID": "" if "waiting" in state else f"{image}@sha256:{'0' * 64}",
        "ready": ready,
        "restartCount": restarts,
        "started": "running" in state,
        "state": state,
        "lastState": last_state or {},
    }
    if "waiting" not in state:
        status["containerID"] = _container_id(pod, name, restarts)
    return status


def running_status(
    pod: Obj,
    node_ip: str,
    pod_ip: str,
    start_time: str,
    now: str,
    restarts: int = 0,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """All containers running and the pod Ready (`restarts` times restarted, the last one
    ending as `last_state` says)."""
    status = _base_status(pod, node_ip, pod_ip, start_time)
    status["phase"] = "Running"
    status["containerStatuses"] = [
        _container_status(pod, c, {"running": {"startedAt": now}}, True, restarts, last_state)
        for c in pod.get("spec", {}).get("containers") or []
    ]
    status["conditions"] = merge_conditions(
        status.get("conditions") or [],
        [
            _condition("PodReadyToStartContainers", True, now),
            _condition("Initialized", True, now),
            _condition("ContainersReady", True, now),
            _condition("Ready", True, now),
            _condition("PodScheduled", True, now),
        ],
    )
    return status


def waiting_status(
    pod: Obj, node_ip: str, pod_ip: str, start_time: str, now: str, reason: str, message: str
) -> dict[str, Any]:
    """Pending with every container waiting (image pull trouble)."""
    status = _base_status(pod, node_ip, pod_ip, start_time)
    status["phase"] = "Pending"
    status["containerStatuses"] = [
        _container_status(pod, c, {"waiting": {"reason": reason, "message": message}}, ready=False)
        for c in pod.get("spec", {}).get("containers") or []
    ]
    status["conditions"] = merge_conditions(
        status.get("conditions") or [],
        [
            _condition("PodReadyToStartContainers", True, now),
            _condition("Initialized", True, now),
            _condition("ContainersReady", False, now, "ContainersNotReady"),
            _condition("Ready", False, now, "ContainersNotReady"),
            _condition("PodScheduled", True, now),
        ],
    )
    for condition in status["conditions"]:
        if condition["type"] in ("Ready", "ContainersReady"):
            names = ", ".join(str(c.get("name")) for c in pod["spec"].get("containers") or [])
            condition["message"] = f"containers with unready status: [{names}]"
    return status


def unpullable_message(image: str, backoff: bool) -> tuple[str, str]:
    if backoff:
        return "ImagePullBackOff", f'Back-off pulling image "{image}"'
    return "ErrImagePull", (
        f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
        f"{image}: not found"
    )


def terminated_status(
    pod: Obj,
    node_ip: str,
    pod_ip: str,
    start_time: str,
    now: str,
    outcome: Outcome,
    killed: bool = False,
) -> dict[str, Any]:
    """Terminal phase: Succeeded when every container exited 0, Failed otherwise.

    `killed` means the pod was deleted while running: containers end with SIGTERM (143).
    """
    status = _base_status(pod, node_ip, pod_ip, start_time)
    previous = {
        c.get("name"): c.get("state", {}).get("running", {}).get("startedAt", start_time)
        for c in status.get("containerStatuses") or []
    }
    containers = pod.get("spec", {}).get("containers") or []
    statuses = []
    all_zero = True
    for container in containers:
        finite = is_finite(pod)
        own = image_outcome(str(container.get("image") or ""), finite)
        if killed and own is Outcome.UNPULLABLE:
            # Never started: the kubelet reports a container it cannot find as killed.
            term = Termination(
                OOM_EXIT_CODE,
                "ContainerStatusUnknown",
                "The container could not be located when the pod was terminated",
            )
        elif killed and own in (Outcome.SUCCEED, Outcome.RUN_FOREVER):
            term = Termination(SIGTERM_EXIT_CODE, "Error")
        elif killed or outcome in (Outcome.FAIL, Outcome.OOM):
            term = termination_for(own if own in (Outcome.FAIL, Outcome.OOM) else Outcome.SUCCEED)
        else:
            term = termination_for(outcome)
        all_zero = all_zero and term.exit_code == 0
        terminated = {
            "exitCode": term.exit_code,
            "reason": term.reason,
            "startedAt": previous.get(container.get("name"), start_time),
            "finishedAt": now,
            "containerID": _container_id(pod, str(container.get("name")), 0),
        }
        if term.message:
            terminated["message"] = term.message
        statuses.append(_container_status(pod, container, {"terminated": terminated}, False))
    status["containerStatuses"] = statuses
    status["phase"] = "Succeeded" if all_zero else "Failed"
    reason = "PodCompleted" if all_zero else "PodFailed"
    status["conditions"] = merge_conditions(
        status.get("conditions") or [],
        [
            _condition("PodReadyToStartContainers", False, now),
            _condition("Initialized", True, now, reason if all_zero else ""),
            _condition("ContainersReady", False, now, reason),
            _condition("Ready", False, now, reason),
            _condition("PodScheduled", True, now),
        ],
    )
    return status


def crashloop_status(
    pod: Obj, node_ip: str, pod_ip: str, start_time: str, now: str, outcome: Outcome, restarts: int
) -> dict[str, Any]:
    """restartPolicy Always with a failing image: Running phase, CrashLoopBackOff, not Ready."""
    status = _base_status(pod, node_ip, pod_ip, start_time)
    status["phase"] = "Running"
    term = termination_for(outcome)
    statuses = []
    for container in pod.get("spec", {}).get("containers") or []:
        name = str(container.get("name"))
        last = {
            "terminated": {
                "exitCode": term.exit_code,
                "reason": term.reason,
                "startedAt": start_time,
                "finishedAt": now,
                "containerID": _container_id(pod, name, restarts - 1),
            }
        }
        waiting = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off 10s restarting failed container={name} pod="
                f"{pod['metadata']['name']}_{pod['metadata'].get('namespace', 'default')}",
            }
        }
        statuses.append(_container_status(pod, container, waiting, False, restarts, last))
    status["containerStatuses"] = statuses
    status["conditions"] = merge_conditions(
        status.get("conditions") or [],
        [
            _condition("PodReadyToStartContainers", True, now),
            _condition("Initialized", True, now),
            _condition("ContainersReady", False, now, "ContainersNotReady"),
            _condition("Ready", False, now, "ContainersNotReady"),
            _condition("PodScheduled", True, now),
        ],
    )
    return status


def node_lost_status(pod: Obj, now: str) -> dict[str, Any]:
    """What the node lifecycle controller writes when the pod's node stops being Ready."""
    status = dict(pod.get("status") or {})
    status["conditions"] = merge_conditions(
        status.get("conditions") or [],
        [
            _condition("Ready", False, now, "NodeNotReady"),
        ],
    )
    for condition in status["conditions"]:
        if condition["type"] == "Ready":
            condition["message"] = "Node is not ready"
    return status


def is_pod_ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def scheduled_condition(now: str, message: str = "") -> dict[str, Any]:
    """PodScheduled=False/Unschedulable (message given) or PodScheduled=True."""
    if message:
        condition = _condition("PodScheduled", False, now, "Unschedulable")
        condition["message"] = message
        return condition
    return _condition("PodScheduled", True, now)


def requests_reboot(pod: Obj) -> bool:
    """A finite container whose command line is `reboot ...` (the Skyhook agent's reboot
    interrupt: `agent.requests_reboot`)."""
    if not is_finite(pod):
        return False
    for container in pod.get("spec", {}).get("containers") or []:
        words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
        if words[:1] == ["reboot"]:
            return True
    return False


def killed_by_reboot(started_at: str, now: str) -> dict[str, Any]:
    """How the kubelet reports a container that a node reboot took away: terminated, reason
    Unknown, exit code 255."""
    return {
        "terminated": {
            "exitCode": 255,
            "reason": "Unknown",
            "startedAt": started_at,
            "finishedAt": now,
        }
    }


def lost_in_reboot_status(pod: Obj, now: str) -> dict[str, Any]:
    """restartPolicy Never: a container a reboot killed is not started again; the pod fails."""
    status = dict(pod.get("status") or {})
    statuses = []
    for container in status.get("containerStatuses") or []:
        started = (container.get("state") or {}).get("running", {}).get("startedAt", now)
        statuses.append(
            {
                **container,
                "ready": False,
                "started": False,
                "state": killed_by_reboot(str(started), now),
            }
        )
    status["containerStatuses"] = statuses
    status["phase"] = "Failed"
    status["conditions"] = merge_conditions(
        status.get("conditions") or [],
        [
            _condition("PodReadyToStartContainers", False, now),
            _condition("ContainersReady", False, now, "PodFailed"),
            _condition("Ready", False, now, "PodFailed"),
        ],
    )
    return status

"""The Skyhook package pod contract as the simulated kubelet runs it: init containers in order.

A package stage pod (upstream createPodFromPackage) has a copy container from the package
image (`/bin/sh -c "... cp -r /skyhook-package/* /root/${SKYHOOK_DIR}"`, SKYHOOK_DIR in its
env), then the Skyhook agent twice: `[stage, /root, copyDir]` and `[stage-check, /root,
copyDir]`. An interrupt pod has the agent alone: `[interrupt, /root, copyDir, <base64 JSON>]`.

The simulation "executes" each by image and arguments: the copy puts SKYHOOK_DIR on the node's
simulated host (it stays there across pods and reboots, as /var/lib does); an agent container
exits 0 only when its arguments keep the contract -- a known stage verb, the host's / mounted
at /root from a hostPath, and (for a stage) a copy dir already on the host; otherwise it exits
2 as the agent's argument check does. The package's scripts cannot run here, so the package
image's suffix (`podlife.image_outcome`) says how its stage goes: `-fail`/`-oom`/`-sleep`
make the `<pkg>-<stage>` agent container fail, be OOM-killed or hang; `-unpullable` leaves
the copy container pulling. Any other init container runs by its image alone.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clustersim.cluster.podlife import Outcome, image_outcome

Obj = Mapping[str, Any]

# The agent's verbs (upstream agent: its stage names and their -check twins).
STAGES = frozenset({"apply", "config", "upgrade", "uninstall", "post-interrupt"})
AGENT_VERBS = STAGES | {f"{s}-check" for s in STAGES} | {"interrupt"}
AGENT_INTERRUPTS = frozenset({"node_restart", "service_restart", "no_op", "restart_all_services"})
USAGE_EXIT_CODE = 2


@dataclass(frozen=True)
class Step:
    """How one init container ends (`outcome`), and why when it breaks the contract."""

    name: str
    image: str
    outcome: Outcome
    message: str = ""
    exit_code: int | None = None  # set for a contract failure (the agent's usage exit)


def _words(container: Obj) -> list[str]:
    return [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]


def copy_target(container: Obj) -> str | None:
    """The SKYHOOK_DIR a package's copy container fills, or None for another container."""
    if not any("cp -r /skyhook-package/" in word for word in _words(container)):
        return None
    for entry in container.get("env") or ():
        if entry.get("name") == "SKYHOOK_DIR":
            return str(entry.get("value") or "")
    return None


def _root_is_host(pod: Obj, container: Obj) -> bool:
    host_root = {
        str(v.get("name"))
        for v in pod.get("spec", {}).get("volumes") or ()
        if (v.get("hostPath") or {}).get("path") == "/"
    }
    return any(
        m.get("mountPath") == "/root" and m.get("name") in host_root
        for m in container.get("volumeMounts") or ()
    )


def decode_interrupt(argument: str) -> Mapping[str, Any] | None:
    """The interrupt an agent argument encodes (upstream Interrupt.ToArgs), or None."""
    try:
        body = json.loads(base64.b64decode(argument, validate=True))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(body, dict) or body.get("type") not in AGENT_INTERRUPTS:
        return None
    return body


def is_agent(container: Obj) -> bool:
    args = [str(a) for a in container.get("args") or ()]
    return bool(args) and args[0] in AGENT_VERBS and not container.get("command")


def _contract_problem(pod: Obj, container: Obj, host: frozenset[str]) -> str:
    args = [str(a) for a in container.get("args") or ()]
    verb = args[0]
    if len(args) < 3 or args[1] != "/root":
        return f"usage: {verb} /root <copy dir>{' <interrupt>' if verb == 'interrupt' else ''}"
    if not _root_is_host(pod, container):
        return "the host's / is not mounted at /root"
    if verb == "interrupt":
        if len(args) != 4 or decode_interrupt(args[3]) is None:
            return "usage: interrupt /root <copy dir> <base64 interrupt JSON>"
        return ""
    if args[2] not in host:
        return f"copy dir {args[2]} is not on the host"
    return ""


def run_init_containers(pod: Obj, host: set[str]) -> list[Step]:
    """Run the pod's init containers in order until one does not succeed; `host` (the
    node's copy dirs) gains what the copy containers copied."""
    containers: Sequence[Obj] = pod.get("spec", {}).get("initContainers") or ()
    package_outcome = Outcome.SUCCEED
    steps: list[Step] = []
    for container in containers:
        name = str(container.get("name") or "")
        image = str(container.get("image") or "")
        own = image_outcome(image, True)
        target = copy_target(container)
        if target is not None:
            # The copy runs whatever the package's scripts will do; only a pull stops it.
            package_outcome = own
            outcome = Outcome.UNPULLABLE if own is Outcome.UNPULLABLE else Outcome.SUCCEED
            step = Step(name, image, outcome)
            if outcome is Outcome.SUCCEED:
                host.add(target)
        elif is_agent(container):
            problem = _contract_problem(pod, container, frozenset(host))
            verb = str(container["args"][0])
            if own is not Outcome.SUCCEED:
                step = Step(name, image, own)  # the agent image itself fails or never pulls
            elif problem:
                step = Step(name, image, Outcome.FAIL, problem, USAGE_EXIT_CODE)
            elif verb in STAGES and package_outcome is not Outcome.SUCCEED:
                step = Step(name, image, package_outcome)  # the package's stage script
            else:
                step = Step(name, image, Outcome.SUCCEED)
        else:
            step = Step(name, image, own)
        steps.append(step)
        if step.outcome is not Outcome.SUCCEED:
            break
    return steps


def chain_outcome(steps: Sequence[Step]) -> Outcome | None:
    """The outcome of the first init container that did not succeed; None when all did."""
    for step in steps:
        if step.outcome is not Outcome.SUCCEED:
            return step.outcome
    return None


def requests_reboot(pod: Obj) -> bool:
    """An agent interrupt container whose interrupt is a node restart."""
    for container in pod.get("spec", {}).get("initContainers") or ():
        args = [str(a) for a in container.get("args") or ()]
        if is_agent(container) and args[0] == "interrupt" and len(args) == 4:
            body = decode_interrupt(args[3])
            if body is not None and body.get("type") == "node_restart":
                return True
    return False


def _terminated(step: Step, code: int, reason: str, started: str, now: str) -> dict[str, Any]:
    terminated: dict[str, Any] = {
        "exitCode": code,
        "reason": reason,
        "startedAt": started,
        "finishedAt": now,
    }
    if step.message:
        terminated["message"] = step.message
    return {"terminated": terminated}


def _status(step_or_container: Obj | Step, state: dict[str, Any]) -> dict[str, Any]:
    if isinstance(step_or_container, Step):
        name, image = step_or_container.name, step_or_container.image
    else:
        name = str(step_or_container.get("name") or "")
        image = str(step_or_container.get("image") or "")
    done = "terminated" in state
    return {
        "name": name,
        "image": image,
        "imageID": f"{image}@sha256:{'0' * 64}" if done or "running" in state else "",
        "ready": done and state["terminated"]["exitCode"] == 0,
        "restartCount": 0,
        "started": "running" in state,
        "state": state,
        "lastState": {},
    }


_INITIALIZING = {"waiting": {"reason": "PodInitializing"}}


def with_init_statuses(
    status: dict[str, Any],
    pod: Obj,
    steps: Sequence[Step],
    *,
    mode: str,
    now: str,
    started: str,
    killed: bool = False,
) -> dict[str, Any]:
    """`status` (what podlife wrote for the pod's containers) with its init containers' as
    the kubelet shows them: `mode` "pulling" (the failing step waits on its image, as the
    status already says), "running" (all done and the pod's containers running; or, when one
    fails, that one running and the pod Pending) or "terminated"."""
    if not steps:
        return status
    containers: Sequence[Obj] = pod.get("spec", {}).get("initContainers") or ()
    failed_at = next((i for i, s in enumerate(steps) if s.outcome is not Outcome.SUCCEED), None)
    # Init containers that all succeed are done before the pod's containers run (the runtime
    # is theirs, and a deleted pod's containers are what SIGTERM ends); one that fails is shown
    # running until it ends.
    current = failed_at if failed_at is not None else len(steps) - 1
    done_before = failed_at is None and mode != "pulling"
    statuses: list[dict[str, Any]] = []
    initialised = False
    for index, container in enumerate(containers):
        step = steps[index] if index < len(steps) else None
        if step is None or index > current:
            statuses.append(_status(container, dict(_INITIALIZING)))
            continue
        if index < current or done_before:
            statuses.append(_status(step, _terminated(step, 0, "Completed", started, now)))
            initialised = initialised or index == current
            continue
        if mode == "pulling":
            waiting = next(
                (
                    c.get("state")
                    for c in status.get("containerStatuses") or ()
                    if "waiting" in (c.get("state") or {})
                ),
                None,
            )
            statuses.append(_status(step, dict(waiting or _INITIALIZING)))
        elif mode == "running" and not killed:
            statuses.append(_status(step, {"running": {"startedAt": started}}))
        elif killed:
            statuses.append(_status(step, _terminated(step, 143, "Error", started, now)))
        elif step.outcome is Outcome.SUCCEED:
            statuses.append(_status(step, _terminated(step, 0, "Completed", started, now)))
            initialised = True
        elif step.outcome is Outcome.OOM:
            statuses.append(_status(step, _terminated(step, 137, "OOMKilled", started, now)))
        else:
            code = step.exit_code if step.exit_code is not None else 1
            statuses.append(_status(step, _terminated(step, code, "Error", started, now)))
    out = dict(status)
    out["initContainerStatuses"] = statuses
    if initialised:
        return out
    # The init containers have not all succeeded: the pod's own containers never started.
    out["containerStatuses"] = [
        _status(c, dict(_INITIALIZING)) for c in pod.get("spec", {}).get("containers") or ()
    ]
    ended = mode == "terminated" or killed
    if mode == "running" and not killed:
        out["phase"] = "Pending"
    elif ended:
        out["phase"] = "Failed"
    reason = "PodFailed" if ended else "ContainersNotReady"
    conditions = []
    for condition in out.get("conditions") or ():
        updated = dict(condition)
        if updated.get("type") == "Initialized":
            updated.update(
                status="False", reason="PodFailed" if ended else "ContainersNotInitialized"
            )
        elif updated.get("type") in ("Ready", "ContainersReady"):
            updated.update(status="False", reason=reason)
        conditions.append(updated)
    out["conditions"] = conditions
    return out

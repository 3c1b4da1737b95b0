"""Rules 4 and 5: when a pod scheduled for deletion (SlurmDelete=True) is really deleted.

Safe deletion waits until deleting the pod ends no Slurm job, read from a state that is known and
fresh: the node is drained and idle, or Slurm runs no job there at all (DOWN, or absent from
every successful poll of its reachable cluster for longer than the absence grace) -- and
read after the pod's SlurmDelete was set, so a drain undone since or a job placed since is
not missed. A pod no kubelet has (unbound, Pending) never ran slurmd and has no job either;
a bound Pending pod may run slurmd beside a waiting sidecar, so it leaves like any other.
Forced deletion applies to scale-down only, as the reference says: it deletes a pod whose
condition is older than the timeout for its case -- the known-condition timeout when its
Slurm state is known, the unknown-condition timeout when it is not; 0 disables a timeout, so
with both at 0 a pod whose Slurm state is unknown is never deleted. Nothing else deletes a
pod Slurm reports busy: a rolling or misscheduled deletion waits for the drain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nodeflow_contracts.pod_protocol import SCALING_DELETE
from nodeset_controller.podstate import PodState

Verdict = Literal["delete", "forced-delete", "wait"]


@dataclass(frozen=True)
class DeletionDecision:
    verdict: Verdict
    reason: str  # machine-readable
    message: str


NO_JOB_TEXT = {
    "SlurmNodeDown": "Slurm node is DOWN: slurmctld has already ended or requeued its jobs",
    "NodeNotRegistered": "Slurm node absent from every successful poll for the absence grace",
}


NEVER_STARTED = "NeverStarted"
AWAITING_SLURM_READ = "AwaitingSlurmRead"


def forced_timeout(pod: PodState, known_timeout: float, unknown_timeout: float) -> float:
    return known_timeout if pod.slurm_known else unknown_timeout


def decide_deletion(
    pod: PodState, now: float, known_timeout: float, unknown_timeout: float
) -> DeletionDecision:
    if pod.delete_reason is None:
        return DeletionDecision("wait", "NotScheduled", "no SlurmDelete condition")
    if pod.terminating:
        return DeletionDecision("wait", "Terminating", "already terminating")
    if pod.never_started:
        return DeletionDecision("delete", NEVER_STARTED, "pod never bound to a node: no Slurm work")
    if pod.runs_no_job and not pod.read_since_delete:
        return DeletionDecision(
            "wait", AWAITING_SLURM_READ, "waiting for a Slurm poll after SlurmDelete was set"
        )
    if pod.drained_and_idle:
        return DeletionDecision("delete", "DrainedAndIdle", "drained and idle in Slurm")
    if pod.no_job is not None:
        return DeletionDecision("delete", pod.no_job, NO_JOB_TEXT[pod.no_job])
    state = "known" if pod.slurm_known else "unknown"
    if pod.delete_reason == SCALING_DELETE and pod.delete_since is not None:
        timeout = forced_timeout(pod, known_timeout, unknown_timeout)
        if timeout > 0 and now - pod.delete_since >= timeout:
            return DeletionDecision(
                "forced-delete",
                "ForcedDeleteKnown" if pod.slurm_known else "ForcedDeleteUnknown",
                f"SlurmDelete set {now - pod.delete_since:.0f}s ago, over the {state}-"
                f"condition timeout of {timeout:.0f}s",
            )
    if not pod.slurm_known:
        return DeletionDecision("wait", "SlurmStateUnknown", "Slurm state unknown: fail closed")
    if pod.busy:
        return DeletionDecision("wait", "Busy", "Slurm jobs still running")
    return DeletionDecision("wait", "NotDrained", "not drained yet")


def forced_deadline(pod: PodState, known_timeout: float, unknown_timeout: float) -> float | None:
    """When a waiting scale-down deletion becomes forced (None: never), to wake up then."""
    if pod.delete_reason != SCALING_DELETE or pod.delete_since is None:
        return None
    timeout = forced_timeout(pod, known_timeout, unknown_timeout)
    return pod.delete_since + timeout if timeout > 0 else None

"""Rules 4 and 5: when a pod scheduled for deletion (SlurmDelete=True) is really deleted.

Safe deletion waits until the pod's Slurm node is drained and idle, read from a known
state. Forced deletion (scale-down only, as the reference says) deletes a pod whose
condition is older than the timeout for its case: the known-condition timeout when its
Slurm state is known, the unknown-condition timeout when it is not; 0 disables a timeout,
so with both at 0 a pod whose Slurm state is unknown is never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nodeset_controller.objects import SCALING_DELETE
from nodeset_controller.podstate import PodState

Verdict = Literal["delete", "forced-delete", "wait"]


@dataclass(frozen=True)
class DeletionDecision:
    verdict: Verdict
    reason: str  # machine-readable
    message: str


def forced_timeout(pod: PodState, known_timeout: float, unknown_timeout: float) -> float:
    return known_timeout if pod.slurm_known else unknown_timeout


def decide_deletion(
    pod: PodState, now: float, known_timeout: float, unknown_timeout: float
) -> DeletionDecision:
    if pod.delete_reason is None:
        return DeletionDecision("wait", "NotScheduled", "no SlurmDelete condition")
    if pod.terminating:
        return DeletionDecision("wait", "Terminating", "already terminating")
    if pod.drained_and_idle:
        return DeletionDecision("delete", "DrainedAndIdle", "drained and idle in Slurm")
    if pod.never_started:
        return DeletionDecision("delete", "NeverStarted", "pod never started: no Slurm work")
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

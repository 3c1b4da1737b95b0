"""The syncer's decision core: NodeSet pod facts + Slurm states + what was sent + now ->
pod commands and Slurm updates. Pure: no I/O, no clock, no bus; syncer.py gathers the inputs
and carries the outputs out.

Per pod, in order:
  1. Conditions: the pod's `SlurmNodeState*` conditions follow its Slurm node
     (conditions.py); an unreadable node gets SlurmNodeStateUnknown with the reason why,
     except a node absent or not responding while its pod's slurmd may still be registering
     (`registration_pending`), which gets no condition yet.
  2. Cordon mark: the pod is marked cordoned when its node is, and the node's mark goes with
     the node's uncordon (drain.pod_mark).
  3. Slurm: drain or undrain its node (drain.decide_drain), unless an update of that node is
     already running.
A pod command is not sent twice: the same change to the same pod (uid) is sent again only
after `resend_after` (or the command's lifetime, if shorter), in case the first was lost
(`SentRecord`). Each send is its own command (its key names the send).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nodeflow_contracts.k8s import K8sCommand, ObjectRef, PatchObject, deadline_after
from nodeflow_contracts.pod_protocol import (
    POD_CORDON_ANNOTATION,
    POD_CORDON_FROM_NODE,
    POD_CORDON_SOURCE_ANNOTATION,
)
from nodeflow_contracts.slurm import SlurmNodeState
from slurm_syncer.conditions import (
    conditions_patch,
    desired_conditions,
    patch_digest,
    unknown_because,
)
from slurm_syncer.drain import DrainPlan, decide_drain
from slurm_syncer.nodestate import with_unconfirmed_not_responding
from slurm_syncer.pods import PodFacts
from slurm_syncer.reasons import DEFAULT_DRAIN_REASONS, DrainReasons

# How long a pod command is worth applying. Conditions say what Slurm showed a moment ago: a
# patch held past a few polls (a crashed k8s-watcher's) would show a stale state, so it is
# reported expired, and once its lifetime is over a pass that still finds the pod short of
# the state sends it again (it can no longer land). A cordon mark follows the node's cordon,
# which changes rarely.
CONDITIONS_LIFETIME_SECONDS = 15.0
MARK_LIFETIME_SECONDS = 60.0

PodCommandKind = Literal["conditions", "pod-cordon", "pod-uncordon"]
_LIFETIME: dict[PodCommandKind, float] = {
    "conditions": CONDITIONS_LIFETIME_SECONDS,
    "pod-cordon": MARK_LIFETIME_SECONDS,
    "pod-uncordon": MARK_LIFETIME_SECONDS,
}
# The ledger a kind of pod command is recorded in: a mark replaces an unmark and back.
_LEDGER: dict[PodCommandKind, str] = {
    "conditions": "conditions",
    "pod-cordon": "marks",
    "pod-uncordon": "marks",
}
LEDGERS: tuple[str, ...] = tuple(sorted(set(_LEDGER.values())))


@dataclass(frozen=True)
class ClusterSnapshot:
    """What the syncer knows of one Slurm cluster when it decides."""

    name: str
    # At least one poll since the syncer started: before it, nothing is decided.
    polled: bool
    # The last poll succeeded.
    reachable: bool
    states: Mapping[str, SlurmNodeState]
    # When the last poll (successful or not) began to read the cluster.
    poll_started_at: float
    # Nodes read NOT_RESPONDING in the last poll, confirmed or not.
    not_responding: Collection[str] = ()


@dataclass(frozen=True)
class SentRecord:
    """The last pod command of one ledger sent for a pod."""

    uid: str
    digest: str
    sent_at: float
    attempt: int


# (ledger, pod key) -> the last command sent.
SentLedger = Mapping[tuple[str, str], SentRecord]


@dataclass(frozen=True)
class ReconcileOptions:
    sender: str = "slurm-syncer"
    # A pod command not yet reflected in the pod after this long is sent again.
    resend_after: float = 30.0
    reasons: DrainReasons = DEFAULT_DRAIN_REASONS
    # How long a started pod's slurmd is given to register before its absence is written
    # (`registration_pending`): the syncer's poll interval.
    registration_wait: float = 5.0


@dataclass(frozen=True)
class PodCommand:
    kind: PodCommandKind
    command: K8sCommand


@dataclass
class Reconciliation:
    pods: int = 0
    pod_commands: list[PodCommand] = field(default_factory=list)
    slurm_updates: list[tuple[PodFacts, DrainPlan]] = field(default_factory=list)
    # To record once the pod commands are published (not when the publish failed).
    sent: dict[tuple[str, str], SentRecord] = field(default_factory=dict)


def attempt_to_send(
    sent: SentLedger, ledger: str, facts: PodFacts, digest: str, now: float, resend_after: float
) -> int | None:
    """The attempt number to send with, or None when the same change was sent to the same
    pod less than `resend_after` ago. Not keyed by resourceVersion: a pod changes several
    times while it starts (bound, running, ready), and each change would otherwise send
    the same patch again while the first is still in flight -- 3.4 patches per pod at
    4,000 pods, the largest share of the API writes of a scale-up."""
    previous = sent.get((ledger, facts.key))
    if previous is None or previous.uid != facts.uid or previous.digest != digest:
        return 1
    if now - previous.sent_at < resend_after:
        return None
    return previous.attempt + 1


def registration_pending(
    facts: PodFacts,
    cluster: ClusterSnapshot,
    state: SlurmNodeState | None,
    wait: float = 0.0,
) -> bool:
    """The pod's slurmd may not have had the chance to register yet: no poll has read the
    cluster `wait` (a poll interval) or more after the syncer first saw the pod past Pending,
    and the node is absent from Slurm or NOT_RESPONDING in `state` as read, confirmed or not
    (what is left of an earlier pod's slurmd, gone: a pod recreated on the node of one deleted
    by a scale-in finds its DOWN+DRAIN, its NOT_RESPONDING often too recent to be reported).
    That state says nothing about this pod, so no condition is written for it: a starting pod
    gets one condition patch, its node's state once it registers, instead of
    NodeNotRegistered or the old slurmd's state first and its own one poll later. A slurmd
    starts a moment after its pod runs, so a poll that began just after the pod was seen
    running would still miss it most times: the wait gives it a whole poll interval.
    Deletion is unaffected: nodeset-controller decides on the Slurm states themselves, a
    Pending pod is `never_started` to it, and the absence grace starts no earlier than before
    (later, when the pod started late), which never deletes sooner."""
    if state is not None and "NotResponding" not in state.flags:
        return False  # a slurmd answers for the node: it registered
    if facts.running_seen_at is None:
        return True
    return cluster.poll_started_at < facts.running_seen_at + wait


def _pod_ref(facts: PodFacts) -> ObjectRef:
    return ObjectRef(
        api_version="v1", kind="Pod", name=facts.name, namespace=facts.namespace, uid=facts.uid
    )


def _mark_patch(kind: PodCommandKind) -> dict[str, Any]:
    if kind == "pod-cordon":
        annotations: dict[str, str | None] = {
            POD_CORDON_ANNOTATION: "true",
            POD_CORDON_SOURCE_ANNOTATION: POD_CORDON_FROM_NODE,
        }
    else:
        annotations = {POD_CORDON_ANNOTATION: None, POD_CORDON_SOURCE_ANNOTATION: None}
    return {"metadata": {"annotations": annotations}}


def _mark_reason(kind: PodCommandKind, facts: PodFacts) -> str:
    if kind == "pod-cordon":
        return f"Kubernetes node {facts.node_name} is cordoned: the pod follows it"
    return f"Kubernetes node {facts.node_name} is uncordoned: the node's pod cordon goes with it"


class _Pass:
    """One reconciliation pass: collects commands and the records to keep of them."""

    def __init__(self, sent: SentLedger, now: float, options: ReconcileOptions) -> None:
        self.sent = sent
        self.now = now
        self.options = options
        self.result = Reconciliation()

    def _attempt(self, kind: PodCommandKind, facts: PodFacts, digest: str) -> int | None:
        ledger = _LEDGER[kind]
        key = (ledger, facts.key)
        if key in self.result.sent:  # decided twice in one pass: once is enough
            return None
        # Past its lifetime a command sent earlier can no longer be applied: waiting longer
        # for the pod to show it only leaves the pod wrong.
        resend_after = min(self.options.resend_after, _LIFETIME[kind])
        attempt = attempt_to_send(self.sent, ledger, facts, digest, self.now, resend_after)
        if attempt is not None:
            self.result.sent[key] = SentRecord(facts.uid, digest, self.now, attempt)
        return attempt

    def _command(
        self,
        kind: PodCommandKind,
        facts: PodFacts,
        change: str,
        attempt: int,
        operation: PatchObject,
        reason: str,
    ) -> K8sCommand:
        """The command of one send. Its key names the send (the pass's time in it): a
        republish of this message is deduplicated, but a later send of the same change is a
        new command -- a state that flips back (A, B, A) while the view stands still must
        send A again, and A's first key was already applied, before B."""
        sender = self.options.sender
        return K8sCommand(
            idempotency_key=(
                f"{sender}:{kind}:{facts.uid}:{facts.resource_version}:{change}:{attempt}:"
                f"{self.now:.6f}"
            ),
            sender=sender,
            sent_at=self.now,
            expires_at=deadline_after(_LIFETIME[kind], now=self.now),
            target=_pod_ref(facts),
            operation=operation,
            reason=reason,
        )

    def conditions(self, facts: PodFacts, patch: dict[str, Any], cluster: str) -> None:
        digest = patch_digest(patch)
        attempt = self._attempt("conditions", facts, digest)
        if attempt is None:
            return
        command = self._command(
            "conditions",
            facts,
            digest,
            attempt,
            operation=PatchObject(patch_type="strategic", patch=patch, subresource="status"),
            reason=f"Slurm node {cluster}/{facts.name} state changed",
        )
        self.result.pod_commands.append(PodCommand("conditions", command))

    def mark(self, facts: PodFacts, kind: PodCommandKind) -> None:
        attempt = self._attempt(kind, facts, kind)
        if attempt is None:
            return
        command = self._command(
            kind,
            facts,
            kind,
            attempt,
            operation=PatchObject(patch_type="merge", patch=_mark_patch(kind)),
            reason=_mark_reason(kind, facts),
        )
        self.result.pod_commands.append(PodCommand(kind, command))


def reconcile_pods(
    pods: Iterable[PodFacts],
    clusters: Mapping[str, ClusterSnapshot],
    sent: SentLedger,
    now: float,
    *,
    updating: Collection[tuple[str, str]] = (),
    options: ReconcileOptions | None = None,
) -> Reconciliation:
    """Commands for `pods` (NodeSet pods of managed clusters), given each cluster's states,
    the pod commands already sent, and the Slurm nodes with an update running (`updating`,
    as (cluster, node))."""
    work = _Pass(sent, now, options or ReconcileOptions())
    for facts in pods:
        cluster = clusters.get(facts.cluster)
        if cluster is None or not cluster.polled:
            continue
        work.result.pods += 1
        state = cluster.states.get(facts.name) if cluster.reachable else None
        # As read: a NOT_RESPONDING the reported state does not show yet (unconfirmed) still
        # says no slurmd answers for the node.
        as_read = with_unconfirmed_not_responding(state, facts.name in cluster.not_responding)
        pending = registration_pending(facts, cluster, as_read, work.options.registration_wait)
        if not (cluster.reachable and pending):
            unknown = unknown_because(cluster.name, facts.name, cluster.reachable, state)
            patch = conditions_patch(facts.conditions, desired_conditions(state, unknown), now)
            if patch is not None:
                work.conditions(facts, patch, cluster.name)
        plan = decide_drain(facts, as_read, work.options.reasons)
        if plan.pod_mark == "mark":
            work.mark(facts, "pod-cordon")
        elif plan.pod_mark == "unmark":
            work.mark(facts, "pod-uncordon")
        if plan.action != "none" and (facts.cluster, facts.name) not in updating:
            work.result.slurm_updates.append((facts, plan))
    return work.result

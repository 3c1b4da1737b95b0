"""One NodeMaintenance's next step: state in, actions out (pure).

The phase is the reason of the Ready condition: Pending -> Scheduled -> Cordon ->
WaitForPodCompletion -> Draining -> Ready (<-> RequestorFailed). Each call takes at most one
step for a request, and every step is written to the object (status, annotations,
finalizer) before the next is taken, so the object alone says where a request is: a
restarted service resumes from it, never from memory. Pending -> Scheduled is the
scheduler's (see `scheduler`).

Deletion cleans up by phase: before the cordon there is nothing to undo but the finalizer;
from the cordon on, the node is uncordoned if we cordoned it (the initial-state annotation
says "false") and no other request on the node still needs it cordoned, then the finalizer
goes. A Ready request with additionalRequestors left waits for them to be removed.

A request's node is the one it was made for: its Node ownerReference, written at its first
round as upstream writes it, names the node's uid. When that node is gone (or another took its
name), the request is never scheduled, cordons and drains nothing, and loses its finalizer in
any phase, deleted or not, additionalRequestors or not, as upstream drops it on NotFound.
"Gone" needs evidence: another uid under the name, or an absence from the view that has lasted
the grace (`absent_past_grace`). Until then a request whose node the view lacks (or shows
without a uid) keeps its finalizer, and nothing is cordoned, drained or undone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from maintenance_scheduler.actions import (
    Action,
    CordonNode,
    Decision,
    DeleteRequest,
    Event,
    PatchRequest,
    SetStatus,
    UncordonNode,
)
from maintenance_scheduler.actions import EvictPod as EvictAction
from maintenance_scheduler.api import (
    CORDON,
    DRAIN_SPEC_ANNOTATION,
    DRAIN_START_ANNOTATION,
    DRAINING,
    FINALIZER,
    INITIAL_STATE_ANNOTATION,
    NOT_STARTED,
    PENDING,
    READY,
    READY_CONDITION,
    READY_TIME_ANNOTATION,
    REQUESTOR_FAILED,
    SCHEDULED,
    UNINITIALIZED,
    WAIT_FOR_POD_COMPLETION,
    WAIT_START_ANNOTATION,
    DrainSpec,
    NodeMaintenance,
    OperatorConfig,
    drain_spec_fingerprint,
)
from maintenance_scheduler.drain import DrainPlan, drain_progress, plan_drain
from maintenance_scheduler.pods import PodFacts
from nodeflow_kube.fields import (
    mapping,
    rfc3339,
)
from nodeflow_kube.labels import SelectorError, parse_label_selector

# Our value of the node's cordon-reason annotation starts with this, so an uncordon only
# ever removes a reason we wrote.
CORDON_REASON_PREFIX: Final = "NodeMaintenance "
# A drain past its timeout, or blocked, is looked at again this often.
DRAIN_RETRY_SECONDS: Final = 30.0
PHASES_NEEDING_CORDON: Final = frozenset(
    {CORDON, WAIT_FOR_POD_COMPLETION, DRAINING, READY, REQUESTOR_FAILED}
)


@dataclass(frozen=True)
class NodeFacts:
    name: str
    uid: str
    resource_version: str
    unschedulable: bool
    ready: bool
    cordon_reason: str = ""
    # A NodeWright (or Skyhook) runtimeRequiredCordonAfter cordon holds the node (its
    # `<group>/runtimeRequiredCordon` mark): no request's cleanup uncordons it (S57).
    runtime_required_cordon: bool = False


@dataclass
class Step:
    actions: list[Action] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    # When to look at the request again even if nothing changes (a timeout).
    wake_at: float | None = None
    # The drain is past drainSpec.timeoutSeconds (for the metric).
    drain_timed_out: bool = False
    # The drain plan, when the request is draining (for the metrics).
    drain: DrainPlan | None = None


def cordon_reason_for(request: NodeMaintenance) -> str:
    return f"{CORDON_REASON_PREFIX}{request.key} (requestor {request.requestor_id})"


# --- status ---------------------------------------------------------------------------------

_KEEP: Final[Any] = object()


def next_status(
    request: NodeMaintenance,
    phase: str,
    now: float,
    message: str = "",
    *,
    wait_for_completion: Any = _KEEP,
    drain: Any = _KEEP,
) -> dict[str, Any]:
    """The request's status with the Ready condition at `phase`; other conditions (the
    requestor's RequestorFailed) kept as they are. `drain` None removes status.drain."""
    status: dict[str, Any] = {k: v for k, v in request.status.items() if k != "conditions"}
    conditions = [
        dict(mapping(c))
        for c in request.status.get("conditions") or ()
        if mapping(c).get("type") != READY_CONDITION
    ]
    old = next(
        (
            mapping(c)
            for c in request.status.get("conditions") or ()
            if mapping(c).get("type") == READY_CONDITION
        ),
        None,
    )
    changed = old is None or old.get("reason") != phase
    transition = rfc3339(now) if changed or old is None else old.get("lastTransitionTime")
    conditions.append(
        {
            "type": READY_CONDITION,
            "status": "True" if phase == READY else "False",
            "reason": phase,
            "message": message,
            "lastTransitionTime": transition or rfc3339(now),
            "observedGeneration": request.generation,
        }
    )
    status["conditions"] = sorted(conditions, key=lambda c: str(c.get("type")))
    if wait_for_completion is not _KEEP:
        if wait_for_completion:
            status["waitForCompletion"] = list(wait_for_completion)
        else:
            status.pop("waitForCompletion", None)
    if drain is not _KEEP:
        if drain is None:
            status.pop("drain", None)
        else:
            status["drain"] = drain
    return status


def _same_status(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    def comparable(status: Mapping[str, Any]) -> Any:
        conditions = sorted(
            (
                {k: v for k, v in mapping(c).items() if k != "lastTransitionTime"}
                for c in status.get("conditions") or ()
            ),
            key=lambda c: str(c.get("type")),
        )
        return {**{k: v for k, v in status.items() if k != "conditions"}, "conditions": conditions}

    return bool(comparable(current) == comparable(new))


def set_phase(
    step: Step,
    request: NodeMaintenance,
    phase: str,
    now: float,
    message: str = "",
    **fields: Any,
) -> None:
    """Append the status write that moves (or keeps) the request at `phase`, if it changes
    anything; a phase change also records a ConditionChanged Event and a decision."""
    status = next_status(request, phase, now, message, **fields)
    if _same_status(request.status, status):
        return
    change = (request.phase, phase) if request.phase != phase else None
    step.actions.append(SetStatus(request, status, change))
    if change is not None:
        step.actions.append(Event(request, "ConditionChanged", phase))
        step.decisions.append(
            Decision(
                request,
                "phase-changed",
                phase,
                f"{request.phase or 'new'} -> {phase}" + (f": {message}" if message else ""),
                node=request.node_name,
            )
        )


# --- the phases -----------------------------------------------------------------------------


def reconcile_request(
    request: NodeMaintenance,
    node: NodeFacts | None,
    pods_on_node: Sequence[PodFacts],
    others_on_node: Iterable[NodeMaintenance],
    now: float,
    *,
    absent_past_grace: bool = False,
    waiting_for: str = "",
) -> Step:
    """`node` None: the view lacks the node. `absent_past_grace`: it has lacked it for the
    whole grace, the only absence taken as the node being gone (False by default: an absence
    alone then undoes nothing). `waiting_for`: what holds a Pending request this round (the
    scheduler's `pending_messages`: the budget, or another request on its node), shown as
    its Ready condition's message.

    Phases, in order, each of which may end the round: which node this is (the request's,
    gone, or not known yet); a request held while its node is unsure; deletion (cleanup); a
    gone node under a request in progress; an invalid spec; the node's ownership and the
    finalizer; then one step of the phase machine."""
    step = Step()
    presence = _node_presence(request, node, absent_past_grace)
    node = presence.node
    if presence.unsure is not None and request.has_finalizer:
        _held_while_unsure(step, request)
        return step
    if request.deleting:
        _cleanup(step, request, node, others_on_node)
        return step
    if presence.gone is not None and request.in_progress:
        # Before the spec check: an invalid request on a gone node still loses its finalizer.
        _gone_in_progress(step, request, presence.gone, now)
        return step
    if request.problems:
        _invalid_spec(step, request, now)
        return step
    if presence.unsure is not None and request.in_progress:
        # In progress without a finalizer (a release that set none): nothing to do without
        # the node, and nothing to undo until it is known to be gone.
        return step
    if node is not None and _bind_to_node(step, request, node):
        return step
    _advance_phase(
        step, request, node, pods_on_node, now, presence.gone or presence.unsure, waiting_for
    )
    return step


@dataclass(frozen=True)
class _NodePresence:
    """The request's node as this round sees it: `node` None unless it is the request's own;
    `gone` says why it is known gone; `unsure` why it is not known yet (not for long enough
    absent from the view, or without a uid there)."""

    node: NodeFacts | None
    gone: str | None = None
    unsure: str | None = None


def _node_presence(
    request: NodeMaintenance, node: NodeFacts | None, absent_past_grace: bool
) -> _NodePresence:
    if node is None:
        if absent_past_grace:
            return _NodePresence(None, gone=f"node {request.node_name} does not exist")
        # Absent from the view, but one view is no evidence that the node is gone (a
        # label-filtered view drops live nodes): nothing is undone until the absence has
        # lasted the grace. A Pending request says what it would say after it (it cannot be
        # scheduled either way).
        return _NodePresence(None, unsure=f"node {request.node_name} does not exist")
    verdict = request.meant_for(node.uid)
    if verdict is None:
        return _NodePresence(None, unsure=f"node {request.node_name} has no uid in the view")
    if not verdict:
        # A node that took the name of the one this request was made for: not ours to cordon,
        # drain or uncordon (upstream's garbage collector deletes the request with its node).
        return _NodePresence(
            None,
            gone=(
                f"node {request.node_name} this request was made for (uid "
                f"{request.node_owner_uid}) is gone; the node now named so (uid {node.uid}) "
                "is another"
            ),
        )
    return _NodePresence(node)


def _held_while_unsure(step: Step, request: NodeMaintenance) -> None:
    """Cordon, slot and finalizer are kept; the request goes on once the node is seen again,
    or loses its finalizer once the absence has lasted the grace."""
    message = (
        f"node {request.node_name} is not in the view (or has no uid there): cordon, "
        "slot and finalizer kept until it has been absent for the grace"
    )
    step.decisions.append(
        Decision(request, "node-not-found", "NodeNotInView", message, node=request.node_name)
    )


def _invalid_spec(step: Step, request: NodeMaintenance, now: float) -> None:
    message = "invalid spec: " + "; ".join(request.problems)
    if request.ready_message != message:
        step.actions.append(Event(request, "InvalidSpec", message, "Warning"))
        step.decisions.append(Decision(request, "invalid-spec", "InvalidSpec", message))
    # A request not yet started stays Pending; one in progress keeps its phase (going back
    # to Pending would forget the cordon) and waits until it is fixed or deleted.
    set_phase(step, request, request.phase if request.in_progress else PENDING, now, message)


def _bind_to_node(step: Step, request: NodeMaintenance, node: NodeFacts) -> bool:
    """The Node as owner from the first round, as upstream sets it before anything else: it
    binds the request to this node (a node that later takes its name is another), and has
    the garbage collector delete the request with its node. The finalizer from Scheduled on
    (or for a request in progress from a release that set neither) holds the request until
    its cleanup is done. True when a patch was needed: the round ends with it."""
    owned = request.owned_by_node(node.uid)
    add_finalizer = request.in_progress and not request.has_finalizer
    if owned and not add_finalizer:
        return False
    step.actions.append(
        PatchRequest(
            request,
            finalizers=(*request.finalizers, FINALIZER) if add_finalizer else None,
            owner_references=None if owned else request.with_node_owner(node.name, node.uid),
        )
    )
    return True


def _advance_phase(
    step: Step,
    request: NodeMaintenance,
    node: NodeFacts | None,
    pods_on_node: Sequence[PodFacts],
    now: float,
    node_missing: str | None,
    waiting_for: str,
) -> None:
    """One step of the phase machine: Pending -> Scheduled -> Cordon ->
    WaitForPodCompletion -> Draining -> Ready (or RequestorFailed)."""
    phase = request.phase
    if phase == UNINITIALIZED:
        set_phase(step, request, PENDING, now)
    elif phase == PENDING:
        _pending(step, request, node_missing, now, waiting_for)
    elif node is None:
        return  # in progress without the node: handled before (gone or not yet known to be)
    elif phase == SCHEDULED:
        set_phase(step, request, CORDON, now)
    elif phase == CORDON:
        _cordon(step, request, node, now)
    elif phase == WAIT_FOR_POD_COMPLETION:
        _wait_for_pods(step, request, pods_on_node, now)
    elif phase == DRAINING:
        _drain(step, request, pods_on_node, now)
    elif phase in (READY, REQUESTOR_FAILED):
        desired = REQUESTOR_FAILED if request.requestor_failed else READY
        if phase != desired:
            set_phase(step, request, desired, now)
        elif request.ready_time is None:
            step.actions.append(
                PatchRequest(request, annotations={READY_TIME_ANNOTATION: rfc3339(now)})
            )


def _gone_in_progress(step: Step, request: NodeMaintenance, gone: str, now: float) -> None:
    """In progress on a node that is gone: nothing to cordon, drain or undo. Upstream drops the
    finalizer on NotFound in any phase (first, so a deletion is never held by it); the request
    keeps its phase and says why it stopped."""
    phase = request.phase
    if request.has_finalizer:
        step.actions.append(_without_finalizer(request))
        step.decisions.append(
            Decision(
                request,
                "finalizer-removed",
                "NodeNotFound",
                f"{gone}: nothing to clean up in phase {phase}",
                node=request.node_name,
            )
        )
        return
    if request.ready_message != gone:
        step.actions.append(Event(request, "NodeNotFound", gone, "Warning"))
        step.decisions.append(
            Decision(request, "node-not-found", "NodeNotFound", gone, node=request.node_name)
        )
    set_phase(step, request, phase, now, gone)


def _pending(
    step: Step, request: NodeMaintenance, gone: str | None, now: float, waiting_for: str
) -> None:
    if gone is not None:
        message = gone
        if request.ready_message != message:
            step.actions.append(Event(request, "NodeNotFound", message, "Warning"))
            step.decisions.append(
                Decision(request, "node-not-found", "NodeNotFound", message, node=request.node_name)
            )
        set_phase(step, request, PENDING, now, message)
    elif waiting_for:
        # The budget that holds it, where kubectl looks (`kubectl get nodemaintenance`); the
        # status is written only when the message changes (set_phase compares).
        set_phase(step, request, PENDING, now, waiting_for)
    elif request.ready_message:
        # The node exists (again), the spec was fixed, or the budget no longer holds it:
        # clear the old message.
        set_phase(step, request, PENDING, now)


def _cordon(step: Step, request: NodeMaintenance, node: NodeFacts, now: float) -> None:
    if request.cordon:
        initial = request.initial_unschedulable
        if initial is None:
            # Record the node's state before we touch it: the uncordon on deletion depends on it.
            step.actions.append(
                PatchRequest(
                    request,
                    annotations={
                        INITIAL_STATE_ANNOTATION: "true" if node.unschedulable else "false"
                    },
                )
            )
            return
        if initial == "false" and not node.unschedulable:
            reason = cordon_reason_for(request)
            step.actions.append(
                CordonNode(request, node.name, node.uid, node.resource_version, reason)
            )
            step.decisions.append(
                Decision(request, "cordon", "Cordon", f"cordon node {node.name}", node=node.name)
            )
            return
    set_phase(step, request, WAIT_FOR_POD_COMPLETION, now)


def _wait_for_pods(
    step: Step, request: NodeMaintenance, pods: Sequence[PodFacts], now: float
) -> None:
    wait = request.wait_for_pod_completion
    if wait is None:
        set_phase(step, request, DRAINING, now, wait_for_completion=(), drain=None)
        return
    started = request.wait_started_at
    if started is None:
        # Kept on the object, so a restart does not restart the timeout.
        step.actions.append(
            PatchRequest(request, annotations={WAIT_START_ANNOTATION: rfc3339(now)})
        )
        return
    try:
        selector = parse_label_selector(wait.pod_selector)
    except SelectorError as exc:
        set_phase(step, request, WAIT_FOR_POD_COMPLETION, now, f"invalid podSelector: {exc}")
        return
    waiting = sorted(p.key for p in pods if selector.matches(p.labels) and not p.terminal)
    deadline = started + wait.timeout_seconds if wait.timeout_seconds > 0 else None
    timed_out = deadline is not None and now >= deadline
    if waiting and not timed_out:
        message = f"waiting for {len(waiting)} pods to complete"
        set_phase(step, request, WAIT_FOR_POD_COMPLETION, now, message, wait_for_completion=waiting)
        step.wake_at = deadline
        return
    if waiting:
        message = (
            f"waitForPodCompletion timed out after {wait.timeout_seconds}s; "
            f"{len(waiting)} pods still run: {', '.join(waiting[:10])}"
        )
        step.actions.append(Event(request, "WaitForPodCompletionTimeout", message, "Warning"))
        step.decisions.append(Decision(request, "wait-timeout", "WaitTimeout", message))
    set_phase(step, request, DRAINING, now, wait_for_completion=(), drain=None)


def _drain_annotations(request: NodeMaintenance, fingerprint: str, started: str) -> PatchRequest:
    return PatchRequest(
        request, annotations={DRAIN_SPEC_ANNOTATION: fingerprint, DRAIN_START_ANNOTATION: started}
    )


def drain_status(plan: DrainPlan, eviction_pods: int, total_pods: int) -> dict[str, Any]:
    remaining = sorted(p.key for p in plan.to_go) + sorted(h.pod.key for h in plan.blocking)
    status: dict[str, Any] = {
        "totalPods": total_pods,
        "evictionPods": eviction_pods,
        "drainProgress": drain_progress(eviction_pods, len(remaining)),
    }
    if remaining:
        status["waitForEviction"] = remaining
    return status


def _count(value: object) -> int:
    """A count from status as written (the schema says int32 >= 0); anything else reads 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _drain(step: Step, request: NodeMaintenance, pods: Sequence[PodFacts], now: float) -> None:
    """One round of the drain, in phases: no drainSpec (Ready at once); the drain's record
    and totals (started, restarted for a changed spec, or carried over from an earlier
    release), each ending the round; an invalid selector; done (Ready); else the evictions
    due, the progress message (blocked, waiting for Slurm, timed out) and the next wake."""
    spec = request.drain_spec
    if spec is None:
        set_phase(step, request, READY, now, drain=None)
        return
    plan = plan_drain(spec, pods)
    step.drain = plan
    current = mapping(request.status.get("drain"))
    if _drain_recorded(step, request, spec, plan, current, now):
        return
    eviction_pods = _count(current.get("evictionPods"))
    total_pods = _count(current.get("totalPods"))
    if plan.selector_error:
        set_phase(
            step, request, DRAINING, now, f"invalid drainSpec.podSelector: {plan.selector_error}"
        )
        return
    if plan.done:
        set_phase(step, request, READY, now, drain=drain_status(plan, eviction_pods, total_pods))
        return
    started = request.drain_started_at or request.phase_since or now
    deadline = started + spec.timeout_seconds if spec.timeout_seconds > 0 else None
    timed_out = deadline is not None and now >= deadline
    step.drain_timed_out = timed_out
    _evict(step, request, plan)
    message = _drain_progress(request, plan, spec.timeout_seconds, timed_out)
    if message != request.ready_message:
        _record_drain_progress(step, request, plan, message, timed_out)
    set_phase(
        step, request, DRAINING, now, message, drain=drain_status(plan, eviction_pods, total_pods)
    )
    if deadline is not None and not timed_out:
        step.wake_at = deadline
    elif plan.blocking or plan.waiting_for_slurm or timed_out:
        step.wake_at = now + DRAIN_RETRY_SECONDS


def _drain_recorded(
    step: Step,
    request: NodeMaintenance,
    spec: DrainSpec,
    plan: DrainPlan,
    current: Mapping[str, Any],
    now: float,
) -> bool:
    """The drain's spec, start and totals on the object before it evicts: True when this
    round wrote them (or restarted the drain) and so ends here."""
    fingerprint = drain_spec_fingerprint(spec)
    if current and request.drain_spec_hash is None:
        # A drain an earlier release started: this drainSpec is the one it runs with. It goes
        # on meanwhile (evictions do not touch the request), should the record be refused.
        since = rfc3339(request.phase_since or now)
        step.actions.append(_drain_annotations(request, fingerprint, since))
    if current and request.drain_spec_hash not in (None, fingerprint):
        # The reference operator cancels a drain whose spec changed and starts a new one:
        # new totals, a new timeout. The totals go first; the start is recorded next round.
        message = "drainSpec changed: the drain starts again"
        step.actions.append(Event(request, "DrainRestarted", message))
        step.decisions.append(Decision(request, "drain-restarted", "DrainRestarted", message))
        set_phase(step, request, DRAINING, now, message, drain=None)
        return True
    if current:
        return False
    if request.drain_spec_hash != fingerprint:
        # Recorded before the totals: a drain whose status says it started always has its
        # spec and start time on the object (two writes, never one half lost). A first drain
        # starts with its phase (a stable time: a resent record is the same command); a
        # restarted one now.
        started = now if request.drain_spec_hash is not None else request.phase_since
        since = rfc3339(started or now)
        step.actions.append(_drain_annotations(request, fingerprint, since))
        return True
    # The drain starts: the counts are fixed now and kept on the object, so a restarted
    # service reports progress against the same totals.
    eviction_pods = len(plan.to_go) + len(plan.blocking)
    set_phase(
        step,
        request,
        DRAINING,
        now,
        request.ready_message,
        drain=drain_status(plan, eviction_pods, plan.total_pods),
    )
    return True


def _evict(step: Step, request: NodeMaintenance, plan: DrainPlan) -> None:
    for pod in plan.evict_now:
        step.actions.append(EvictAction(request, pod))
        step.decisions.append(
            Decision(
                request,
                "evict",
                "Evict",
                f"evict pod {pod.key}",
                pod=pod.key,
                node=request.node_name,
            )
        )


def _drain_progress(
    request: NodeMaintenance, plan: DrainPlan, timeout_seconds: int, timed_out: bool
) -> str:
    """What holds the drain, as the Ready condition's message ("" when nothing does)."""
    parts: list[str] = []
    if plan.blocking:
        held = "; ".join(f"{h.pod.key} {h.why}" for h in plan.blocking[:5])
        parts.append(f"drain blocked, nothing evicted: {held}")
    if plan.waiting_for_slurm:
        held = "; ".join(h.why for h in plan.waiting_for_slurm[:5])
        if not request.cordon:
            held += " (spec.cordon is false: nothing drains the Slurm node)"
        parts.append(f"waiting for Slurm to drain before evicting: {held}")
    if timed_out:
        jobs = [h.pod.name for h in plan.waiting_for_slurm]
        text = f"drain timed out after {timeout_seconds}s with {len(plan.to_go)} pods left"
        if jobs:
            text += f"; jobs still run on Slurm nodes {', '.join(jobs[:10])}"
        parts.insert(0, text + "; still retrying")
    return ". ".join(parts)


def _record_drain_progress(
    step: Step, request: NodeMaintenance, plan: DrainPlan, message: str, timed_out: bool
) -> None:
    """The decisions (and the timeout's Warning Event, once) of a changed drain message."""
    if plan.blocking:
        step.decisions.append(Decision(request, "drain-blocked", "DrainBlocked", message))
    for held_pod in plan.waiting_for_slurm:
        step.decisions.append(
            Decision(
                request,
                "waiting-for-slurm",
                "WaitingForSlurm",
                held_pod.why,
                pod=held_pod.pod.key,
                node=request.node_name,
            )
        )
    if timed_out and not request.ready_message.startswith("drain timed out"):
        step.actions.append(Event(request, "DrainTimeout", message, "Warning"))
        step.decisions.append(Decision(request, "drain-timeout", "DrainTimeout", message))


# --- deletion and garbage collection ----------------------------------------------------------


def other_needs_cordon(
    request: NodeMaintenance, others: Iterable[NodeMaintenance], node_uid: str
) -> bool:
    """Whether another request on this node (the one it was made for) still needs it
    cordoned; one made for a node that had the name before is no reason to keep this one."""
    return any(
        o.uid != request.uid
        and o.node_name == request.node_name
        and o.meant_for(node_uid) is not False
        and not o.deleting
        and o.cordon
        and o.phase in PHASES_NEEDING_CORDON
        for o in others
    )


def _cleanup(
    step: Step,
    request: NodeMaintenance,
    node: NodeFacts | None,
    others: Iterable[NodeMaintenance],
) -> None:
    if not request.has_finalizer:
        return
    phase = request.phase
    if node is None:
        # The node is gone (or is another that took its name): nothing to uncordon, and no
        # requestor can still use it. Upstream drops the finalizer on NotFound in any phase,
        # additionalRequestors or not; waiting for them would hold the request for ever.
        step.actions.append(_without_finalizer(request))
        step.decisions.append(
            Decision(
                request,
                "finalizer-removed",
                "Cleanup",
                f"cleanup done in phase {phase or 'new'}: node {request.node_name} is gone",
            )
        )
        return
    if phase in (READY, REQUESTOR_FAILED) and request.additional_requestors:
        message = "deletion waits for additionalRequestors: " + ", ".join(
            request.additional_requestors
        )
        if request.ready_message != message:
            step.decisions.append(
                Decision(request, "waiting-for-requestors", "WaitingForRequestors", message)
            )
        return
    ours = request.cordon and request.initial_unschedulable == "false"
    kept = ""
    if ours and node.runtime_required_cordon and phase not in NOT_STARTED:
        # The persistent cordon applied while we held the node stays: whoever releases it
        # uncordons the node (upstream's hasSkyhookCordon counts the mark as a holder).
        kept = f"; node {node.name} stays cordoned (runtimeRequiredCordon)"
    elif (
        ours
        and phase not in NOT_STARTED
        and phase != SCHEDULED
        and not other_needs_cordon(request, others, node.uid)
    ):
        # Deleted during the Cordon phase, our cordon may still be on its way: an uncordon
        # sent after it is applied after it (one node's commands apply in the order sent).
        if node.unschedulable or phase == CORDON:
            step.actions.append(
                UncordonNode(
                    request,
                    node.name,
                    node.uid,
                    node.resource_version,
                    clear_reason=node.cordon_reason.startswith(CORDON_REASON_PREFIX),
                )
            )
            step.decisions.append(
                Decision(
                    request, "uncordon", "Uncordon", f"uncordon node {node.name}", node=node.name
                )
            )
        if node.unschedulable:
            return
    step.actions.append(_without_finalizer(request))
    step.decisions.append(
        Decision(
            request, "finalizer-removed", "Cleanup", f"cleanup done in phase {phase or 'new'}{kept}"
        )
    )


def _without_finalizer(request: NodeMaintenance) -> PatchRequest:
    return PatchRequest(request, finalizers=tuple(f for f in request.finalizers if f != FINALIZER))


def garbage_collect(
    requests: Iterable[NodeMaintenance], config: OperatorConfig, now: float
) -> tuple[list[DeleteRequest], float | None]:
    """Requests Ready for longer than maxNodeMaintenanceTimeSeconds are deleted -- never one
    in RequestorFailed (the requestor still has to look at it) or annotated
    garbage-collector.ignore: "true". Returns the deletions and when the next one is due."""
    due: list[DeleteRequest] = []
    next_due: float | None = None
    for request in requests:
        if request.deleting or request.phase != READY or request.gc_ignored:
            continue
        ready_at = request.ready_time
        if ready_at is None:
            continue
        expires = ready_at + config.max_node_maintenance_time_seconds
        if expires <= now:
            due.append(DeleteRequest(request))
        elif next_due is None or expires < next_due:
            next_due = expires
    return due, next_due

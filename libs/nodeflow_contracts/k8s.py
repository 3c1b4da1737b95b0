"""Kubernetes object events (k8s-watcher -> everyone) and commands (anyone -> k8s-watcher)."""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec

from nodeflow_contracts import subjects

WatchEventType = Literal["ADDED", "MODIFIED", "DELETED"]


class ObjectRef(msgspec.Struct, frozen=True, kw_only=True):
    """Names one Kubernetes object; uid and resource_version are preconditions when set."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None

    @property
    def ordering_key(self) -> str:
        """One sender's commands with the same key are applied one after another, in the order
        sent (each sender's commands are a queue of their own: see topology.K8S_COMMAND_SENDERS)."""
        return f"{self.kind}/{self.namespace or subjects.CLUSTER_SCOPED}/{self.name}"


class K8sObjectEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a watched object, on `k8s.v1.<kind>.<namespace|_>.<name>`."""

    type: WatchEventType
    kind: str
    api_version: str
    name: str
    namespace: str | None
    uid: str
    resource_version: str
    # The object as the API server returned it, without metadata.managedFields.
    object: dict[str, Any]

    @property
    def subject(self) -> str:
        return subjects.k8s_object_event(self.kind, self.namespace, self.name)

    @property
    def msg_id(self) -> str:
        # uid + resourceVersion identifies one state of one object: a replay is a duplicate.
        return f"{self.uid}:{self.resource_version}:{self.type}"


# --- Commands ----------------------------------------------------------------------------------
# Each operation is its own struct; the `op` tag selects it and names the command subject.


class CreateObject(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="create"):
    """Create the object given in full (Pod, Job, Event, NodeSlice)."""

    object: dict[str, Any]


class DeleteObject(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="delete"):
    propagation_policy: Literal["Background", "Foreground", "Orphan"] | None = None
    grace_period_seconds: int | None = None


PatchType = Literal["merge", "strategic", "json"]


class PatchObject(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="patch"):
    patch_type: PatchType
    patch: Any
    subresource: Literal["", "status"] = ""


class CordonNode(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="cordon"):
    pass


class UncordonNode(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="uncordon"):
    pass


class EvictPod(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="evict"):
    grace_period_seconds: int | None = None


class BindPod(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="bind"):
    node_name: str


class NominatePod(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="nominate"):
    """Set status.nominatedNodeName ("" clears it)."""

    node_name: str


class UpdateStatus(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="update-status"):
    """Replace a custom resource's status through the status subresource."""

    status: dict[str, Any]


class RecordEvent(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="record-event"):
    """A Kubernetes Event about the target, so `kubectl describe` shows why we acted."""

    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"
    action: str = ""
    reporting_component: str = ""


CommandOperation = (
    CreateObject
    | DeleteObject
    | PatchObject
    | CordonNode
    | UncordonNode
    | EvictPod
    | BindPod
    | NominatePod
    | UpdateStatus
    | RecordEvent
)

COMMAND_OPERATIONS: tuple[str, ...] = (
    "create",
    "delete",
    "patch",
    "cordon",
    "uncordon",
    "evict",
    "bind",
    "nominate",
    "update-status",
    "record-event",
)


def deadline_after(seconds: float, *, now: float | None = None) -> float:
    """The `expires_at` of a command that is worth applying for `seconds` from now.

    A sender picks the time after which its decision may no longer hold (a pod condition
    that reflects Slurm's state of a moment ago: seconds; a create: minutes).
    """
    if seconds <= 0:
        raise ValueError("a command deadline must lie in the future")
    return (time.time() if now is None else now) + seconds


class K8sCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A request to change the cluster, on `cmd.k8s.v1.<sender>.<op>`.

    Its JetStream Nats-Msg-Id is `msg_id`, the idempotency key and `sent_at`: a repeated
    publish of one send is dropped by the stream, a later send of the same key (a new
    leader's, after the first can no longer land) is not; an already-applied key is
    reported as already-applied, never applied twice.
    k8s-watcher applies it only when the subject's sender and op are the payload's and the
    sender's policy allows it; one that arrives after `expires_at` is reported `expired`.
    """

    idempotency_key: str
    sender: str
    sent_at: float
    target: ObjectRef
    operation: CommandOperation
    # Free text for the audit trail: why the sender decided this.
    reason: str = ""
    # Epoch seconds after which the command must not be applied (`deadline_after`). Optional
    # only so that payloads from before it existed still decode; every sender sets it.
    expires_at: float | None = None

    @property
    def op(self) -> str:
        return str(self.operation.__struct_config__.tag)

    @property
    def subject(self) -> str:
        return subjects.k8s_command(self.sender, self.op)

    @property
    def msg_id(self) -> str:
        """One send of the key: the key alone would let JetStream's duplicate window drop a
        second send of it (a new leader's resend within two minutes of the first)."""
        return send_msg_id(self.idempotency_key, self.sent_at)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now > self.expires_at


Outcome = Literal[
    "applied",
    "already-applied",
    "conflict",
    "not-found",
    "invalid",
    "forbidden",
    "expired",
    "retrying",
    "failed",
]

FINAL_OUTCOMES: frozenset[str] = frozenset(
    {
        "applied",
        "already-applied",
        "conflict",
        "not-found",
        "invalid",
        "forbidden",
        "expired",
        "failed",
    }
)


# Final outcomes after which the command's change can never be made: the API server refused
# it. (`failed`, and `expired` after an attempt, follow a request that may still have been
# applied: see `CommandOutcome.never_lands`.)
REFUSED_OUTCOMES: frozenset[str] = frozenset({"conflict", "not-found", "invalid", "forbidden"})


class CommandOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What became of a command, on `outcome.k8s.v1.<op>`."""

    idempotency_key: str
    op: str
    sender: str
    target: ObjectRef
    outcome: Outcome
    # The API server's message (or the error) verbatim.
    message: str = ""
    http_status: int | None = None
    attempt: int = 1
    sent_at: float
    finished_at: float
    # resourceVersion of the object after the command, when the API returned one.
    resource_version: str | None = None

    @property
    def subject(self) -> str:
        return subjects.k8s_command_outcome(self.op)

    @property
    def never_lands(self) -> bool:
        """The command's change can never be made: refused by the API server, or expired
        before k8s-watcher ever sent it (its first attempt). Not `failed` nor a later
        `expired`: the last request went unanswered and may still be applied."""
        return self.outcome in REFUSED_OUTCOMES or (self.outcome == "expired" and self.attempt == 1)

    @property
    def msg_id(self) -> str:
        # The send it answers (`sent_at`) is part of it: the same outcome of a second send
        # of the key must not be dropped as a duplicate of the first's.
        return f"{send_msg_id(self.idempotency_key, self.sent_at)}:{self.outcome}:{self.attempt}"


def send_msg_id(idempotency_key: str, sent_at: float) -> str:
    """The Nats-Msg-Id naming one send of a command: its key and its `sent_at`."""
    return f"{idempotency_key}@{sent_at!r}"

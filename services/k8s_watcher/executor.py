"""The command executor: applies `cmd.k8s.v1.*` commands and publishes their outcomes.

One sender's commands for one object run in the order sent (each sender has its own consumer,
whose ordering key is the target), others concurrently. Each command's idempotency key is
remembered in a KV bucket once it was applied, so a repeat (even after a restart) is answered
`already-applied` without a call; creates need no record, the key stamped on the object they
make answers for them.
Answers that may pass (no answer, 429 including a PodDisruptionBudget refusal, 5xx) are
reported `retrying` and retried with backoff by the consumer; when the deliveries run out
the outcome is `failed` and the command goes to the dead-letter subject. Every other answer
is final: a failed precondition (409) is `conflict` and never retried, the sender decides
again from fresh state.

Before any of that, a command is judged (policy.py): one whose subject disagrees with its
payload, that acts in a namespace outside COMMAND_NAMESPACES (when set), or that its sender's
policy does not allow, is reported `forbidden` and
dead-lettered with the reason; one whose deadline passed before it could be applied is
reported `expired` and not applied.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Collection
from datetime import UTC, datetime

import msgspec
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from k8s_watcher.commands import (
    ApiCall,
    Rejected,
    created_by,
    is_retryable,
    outcome_of,
    plan_command,
    proves_itself,
    resource_version_of,
)
from k8s_watcher.kinds import resolve_kind
from k8s_watcher.kube import ApiResponse, ApiUnavailable, KubeClient
from k8s_watcher.policy import Refused, authorize
from nodeflow_bus import Bus, Delivery, PermanentError, RetryableError
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, ObjectRef, Outcome
from nodeflow_contracts.skyhook import DEFAULT_SKYHOOK_NAMESPACE
from nodeflow_contracts.topology import APPLIED_COMMANDS_BUCKET

log = structlog.get_logger("k8s_watcher.executor")


class AppliedRecord(msgspec.Struct, frozen=True, kw_only=True):
    idempotency_key: str
    op: str
    target: ObjectRef
    applied_at: float
    resource_version: str | None = None
    message: str = ""


def applied_key(idempotency_key: str) -> str:
    """A KV-safe key for any idempotency key."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


class AppliedCommands:
    """Which idempotency keys were applied, in the KV bucket APPLIED_COMMANDS_BUCKET."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._bus.js.key_value(APPLIED_COMMANDS_BUCKET)
        return self._kv

    async def get(self, idempotency_key: str) -> AppliedRecord | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(applied_key(idempotency_key))
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return msgspec.json.decode(entry.value, type=AppliedRecord)

    async def remember(self, record: AppliedRecord) -> None:
        kv = await self._bucket()
        await kv.put(applied_key(record.idempotency_key), msgspec.json.encode(record))


def rfc3339_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CommandExecutor:
    def __init__(
        self,
        *,
        kube: KubeClient,
        bus: Bus,
        max_deliver: int,
        instance_id: str,
        command_namespaces: Collection[str] = (),
        skyhook_namespace: str = DEFAULT_SKYHOOK_NAMESPACE,
    ) -> None:
        self.kube = kube
        # Empty: every namespace (policy.authorize).
        self.command_namespaces = frozenset(command_namespaces)
        self.skyhook_namespace = skyhook_namespace
        self.bus = bus
        self.applied = AppliedCommands(bus)
        self.max_deliver = max_deliver
        self.instance_id = instance_id

    async def handle(self, cmd: K8sCommand, delivery: Delivery) -> None:
        attempt = delivery.num_delivered
        verdict = authorize(cmd, delivery.subject, self.command_namespaces, self.skyhook_namespace)
        if isinstance(verdict, Refused):
            await self._report(cmd, "forbidden", attempt, message=verdict.reason)
            # Never retried: the dead letter keeps the command and the reason for an audit.
            raise PermanentError(f"refused: {verdict.reason}")
        # A create proves its own idempotency: the object it makes carries the key (its
        # annotation), so a repeat meets AlreadyExists and is recognised as already applied
        # (`_created_earlier`). Only other operations need the applied-key record, which
        # saves creates two NATS round trips (the lookup and the record).
        recorded = not proves_itself(cmd)
        previous = await self.applied.get(cmd.idempotency_key) if recorded else None
        if previous is not None:
            await self._report(
                cmd,
                "already-applied",
                attempt,
                message=f"applied at {previous.applied_at:.3f}",
                resource_version=previous.resource_version,
            )
            return
        # While the API server is down, wait here (the consumer keeps the message's lease)
        # instead of burning deliveries on calls that cannot succeed.
        await self.kube.health.wait_available()
        if cmd.expired(time.time()):
            assert cmd.expires_at is not None
            late = time.time() - cmd.expires_at
            await self._report(
                cmd, "expired", attempt, message=f"{late:.1f}s past its deadline: not applied"
            )
            return
        if verdict.reads_target:
            checked = await self._with_labelled_target(
                cmd,
                attempt,
                verdict.required_label,
                verdict.forbidden_label,
                verdict.required_any,
            )
            if checked is None:
                return
            cmd = checked
        plan = plan_command(cmd, now=rfc3339_now(), reporting_instance=self.instance_id)
        if isinstance(plan, Rejected):
            await self._report(cmd, plan.outcome, attempt, message=plan.message)
            return
        try:
            response = await self.kube.request(
                plan.method, plan.path, body=plan.body, content_type=plan.content_type
            )
        except ApiUnavailable as exc:
            await self._retry_or_fail(cmd, attempt, None, str(exc))
            return
        if is_retryable(response.status):
            await self._retry_or_fail(cmd, attempt, response.status, response.message)
            return
        outcome = outcome_of(response.status)
        if outcome == "conflict" and await self._created_earlier(plan, cmd, response):
            outcome = "already-applied"
        resource_version = resource_version_of(response.body)
        report = self._report(
            cmd,
            outcome,
            attempt,
            message=response.message,
            http_status=response.status,
            resource_version=resource_version,
        )
        if outcome != "applied" or not recorded:
            await report
            return
        # Both must be stored before the command is acknowledged; neither needs the other.
        remember = self.applied.remember(
            AppliedRecord(
                idempotency_key=cmd.idempotency_key,
                op=cmd.op,
                target=cmd.target,
                applied_at=time.time(),
                resource_version=resource_version,
            )
        )
        await asyncio.gather(remember, report)

    async def _with_labelled_target(
        self,
        cmd: K8sCommand,
        attempt: int,
        label: str | None,
        forbidden: str | None,
        any_of: tuple[str, ...] = (),
    ) -> K8sCommand | None:
        """The command, bound to the uid of the object read, when that object carries
        `label` (and one of `any_of`, if any) and not `forbidden`; None after reporting why
        not. The uid precondition makes the API server refuse the call if the name meanwhile
        belongs to another object."""
        target = cmd.target
        kind = resolve_kind(target.api_version, target.kind)
        if kind is None or (kind.namespaced and not target.namespace):
            await self._report(cmd, "invalid", attempt, message=f"no such kind {target.kind}")
            return None
        try:
            answer = await self.kube.request("GET", kind.object_path(target.namespace, target.name))
        except ApiUnavailable as exc:
            await self._retry_or_fail(cmd, attempt, None, str(exc))
            return None
        if is_retryable(answer.status):
            await self._retry_or_fail(cmd, attempt, answer.status, answer.message)
            return None
        if not answer.ok or not isinstance(answer.body, dict):
            outcome = outcome_of(answer.status)
            await self._report(
                cmd, outcome, attempt, message=answer.message, http_status=answer.status
            )
            return None
        meta = answer.body.get("metadata") or {}
        uid = meta.get("uid")
        if target.uid and uid != target.uid:
            await self._report(
                cmd, "not-found", attempt, message=f"{target.ordering_key} is another object now"
            )
            return None
        labels = meta.get("labels") or {}
        reason = ""
        if label is not None and label not in labels:
            reason = f"{cmd.sender} may {cmd.op} only {target.kind} objects labelled {label}"
        elif any_of and not any(one in labels for one in any_of):
            reason = f"{cmd.sender} may {cmd.op} only {target.kind} objects labelled one of " + (
                ", ".join(any_of)
            )
        elif forbidden is not None and forbidden in labels:
            reason = f"{cmd.sender} may not {cmd.op} {target.kind} objects labelled {forbidden}"
        if reason:
            await self._report(cmd, "forbidden", attempt, message=reason)
            raise PermanentError(f"refused: {reason}")
        if target.uid or not uid:
            return cmd
        return msgspec.structs.replace(cmd, target=msgspec.structs.replace(target, uid=str(uid)))

    async def _created_earlier(self, plan: ApiCall, cmd: K8sCommand, answer: ApiResponse) -> bool:
        """A create refused with AlreadyExists whose object carries this command's key was
        applied by an earlier delivery (before a crash could record it)."""
        if plan.created_object_path is None or answer.reason != "AlreadyExists":
            return False
        try:
            existing = await self.kube.request("GET", plan.created_object_path)
        except ApiUnavailable:
            return False
        return existing.ok and created_by(existing.body, cmd.idempotency_key)

    async def _retry_or_fail(
        self, cmd: K8sCommand, attempt: int, status: int | None, message: str
    ) -> None:
        last = self.max_deliver > 0 and attempt >= self.max_deliver
        outcome: Outcome = "failed" if last else "retrying"
        await self._report(cmd, outcome, attempt, message=message, http_status=status)
        # The consumer retries with backoff, or dead-letters the command after the last try.
        raise RetryableError(f"{cmd.op} {cmd.target.ordering_key}: HTTP {status}: {message}")

    async def _report(
        self,
        cmd: K8sCommand,
        outcome: Outcome,
        attempt: int,
        *,
        message: str = "",
        http_status: int | None = None,
        resource_version: str | None = None,
    ) -> None:
        result = CommandOutcome(
            idempotency_key=cmd.idempotency_key,
            op=cmd.op,
            sender=cmd.sender,
            target=cmd.target,
            outcome=outcome,
            message=message,
            http_status=http_status,
            attempt=attempt,
            sent_at=cmd.sent_at,
            finished_at=time.time(),
            resource_version=resource_version,
        )
        await self.bus.publish(result.subject, result, msg_id=result.msg_id)
        log_method = log.debug if outcome in ("applied", "already-applied") else log.warning
        log_method(
            "command.outcome",
            op=cmd.op,
            target=cmd.target.ordering_key,
            key=cmd.idempotency_key,
            outcome=outcome,
            http_status=http_status,
            attempt=attempt,
            message=message,
        )

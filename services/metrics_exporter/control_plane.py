"""Control-plane health: commands sent, their outcomes and latency, decisions, dead letters.

Each `on_*` method turns one message into counter increments with bounded labels (see
labels.py); none of them does I/O, so they are tested without NATS.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram

from metrics_exporter.labels import (
    OTHER,
    LabelLimiter,
    RecentIds,
    command_op_of_subject,
    dead_letter_error_kind,
    decision_source,
    k8s_op,
    machine_kind,
    machine_reason,
    subject_family,
)
from nodeflow_bus import dead_letter
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import FINAL_OUTCOMES, CommandOutcome
from nodeflow_contracts.nodeset import NodeSetDecision

# Send-to-outcome latency: sub-second when the API answers at once, minutes when a command
# waits behind retries.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

KNOWN_OUTCOMES = frozenset({*FINAL_OUTCOMES, "retrying"})


class DecisionSummary(msgspec.Struct, kw_only=True):
    """The fields a controller decision is expected to share, for sources whose contract is
    not in nodeflow_contracts yet (maintenance, placement). Lenient on purpose: other fields
    are ignored and a missing kind counts as `other`, so a valid message of another service
    is never dead-lettered here; only malformed JSON or a non-string kind/reason is."""

    kind: str = ""
    reason: str = ""


class ControlPlaneMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        label_value_limit: int = 100,
        recent_command_ids: int = 8192,
    ) -> None:
        self.commands_sent = Counter(
            "nodeflow_k8s_commands_sent",
            "Kubernetes commands published, by operation (a re-sent Msg-Id counts once).",
            ["op"],
            registry=registry,
        )
        self.outcomes = Counter(
            "nodeflow_k8s_command_outcomes",
            "Outcomes of Kubernetes commands, by operation and outcome.",
            ["op", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "nodeflow_k8s_command_latency_seconds",
            "Time from sending a command to its final outcome, by operation.",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.decisions = Counter(
            "nodeflow_decisions",
            "Controller decisions by source, kind and machine reason.",
            ["source", "kind", "reason"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "nodeflow_dead_letters",
            "Dead-lettered messages by the family of their original subject and error kind.",
            ["subject", "error_kind"],
            registry=registry,
        )
        self.collectors: tuple[Counter | Histogram, ...] = (
            self.commands_sent,
            self.outcomes,
            self.latency,
            self.decisions,
            self.dead_letters,
        )
        self._reasons = LabelLimiter(label_value_limit)
        self._kinds = LabelLimiter(label_value_limit)
        self._recent_commands = RecentIds(recent_command_ids)

    def on_command(self, subject: str, msg_id: str | None) -> None:
        """A command seen on `cmd.k8s.v1.<op>`; publish retries reuse the Msg-Id."""
        if msg_id is not None and self._recent_commands.seen_before(msg_id):
            return
        self.commands_sent.labels(command_op_of_subject(subject)).inc()

    def on_outcome(self, outcome: CommandOutcome) -> None:
        op = k8s_op(outcome.op)
        result = outcome.outcome if outcome.outcome in KNOWN_OUTCOMES else OTHER
        self.outcomes.labels(op, result).inc()
        # A `retrying` outcome is followed by a final one; timing it too would count twice.
        if outcome.outcome in FINAL_OUTCOMES:
            # Sender and applier clocks may differ slightly: never a negative latency.
            self.latency.labels(op).observe(max(0.0, outcome.finished_at - outcome.sent_at))

    def on_nodeset_decision(self, decision: NodeSetDecision) -> None:
        # The kind is one of the contract's closed set (the decoder checked it).
        reason = self._bounded(self._reasons, machine_reason(decision.reason))
        self.decisions.labels("nodeset", decision.kind, reason).inc()

    def on_decision_summary(self, subject: str, decision: DecisionSummary) -> None:
        kind = self._bounded(self._kinds, machine_kind(decision.kind))
        reason = self._bounded(self._reasons, machine_reason(decision.reason))
        self.decisions.labels(decision_source(subject), kind, reason).inc()

    @staticmethod
    def _bounded(limiter: LabelLimiter, value: str) -> str:
        return value if value == OTHER else limiter.admit(value)

    def on_dead_letter(self, subject: str, headers: Mapping[str, str]) -> None:
        """A copy on `dlq.<original subject>`, its headers naming the error."""
        original = headers.get(dead_letter.SUBJECT)
        if not original:
            try:
                original = subjects.original_of_dead_letter(subject)
            except ValueError:
                original = ""
        kind = dead_letter_error_kind(headers.get(dead_letter.ERROR_KIND))
        self.dead_letters.labels(subject_family(original), kind).inc()

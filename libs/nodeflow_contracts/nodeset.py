"""NodeSet controller decisions, published for audit on `nodeset.v1.<ns>.<name>.decision`."""

from __future__ import annotations

from typing import Literal

import msgspec

from nodeflow_contracts import subjects

DecisionKind = Literal[
    "create",
    "delete-scheduled",
    "cancel",
    "delete",
    "forced-delete",
    "rolling-replace",
    "invalid-spec",
    "name-collision",
    # A PodDisruptionBudget of the NodeSet's budget name that it does not own: its pods running
    # jobs are not protected from eviction (rule 4a) until that budget is removed.
    "protection-disabled",
]


class NodeSetDecision(msgspec.Struct, frozen=True, kw_only=True):
    decision_id: str
    namespace: str
    nodeset: str
    kind: DecisionKind
    # Short machine-readable reason (a condition reason such as ScalingDeleteScheduled).
    reason: str
    # Human-readable explanation, e.g. "rank 2: idle, drained, delete condition set".
    message: str
    decided_at: float
    pod: str = ""
    node: str = ""

    @property
    def subject(self) -> str:
        return subjects.nodeset_decision(self.namespace, self.nodeset)

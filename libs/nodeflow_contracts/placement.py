"""topology-placer decisions, published for audit on `placement.v1.<namespace>.<group>.decision`.

One decision per GangGroup outcome: its pods were nominated or bound (with the domain that
took them), it cannot be placed (with the reason in numbers), it timed out, it preempted
lower-priority jobs (with the victims), or its PodGroup could not be read.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from nodeflow_contracts import subjects

PlacementDecisionKind = Literal[
    "nominated",
    "bound",
    "unschedulable",
    "waiting",
    "timed-out",
    "preempted",
    "gang-evicted",
    "invalid",
]


class PodAssignment(msgspec.Struct, frozen=True, kw_only=True):
    pod: str
    node: str


class PlacementDecision(msgspec.Struct, frozen=True, kw_only=True):
    decision_id: str
    # The PodGroup that names the GangGroup (the first of its sorted members).
    namespace: str
    group: str
    # Every PodGroup of the GangGroup as "namespace/name".
    gang_group: tuple[str, ...]
    kind: PlacementDecisionKind
    # Short machine-readable reason (an Event reason such as Unschedulable).
    reason: str
    # Human-readable explanation in numbers, e.g. "MustGather BlockLayer: no BlockLayer
    # domain offers 16 slots; best s1/b2 offers 12".
    message: str
    decided_at: float
    # The topology domain that took the gang, as its path ("s1/b2"), and its layer.
    domain: str = ""
    layer: str = ""
    assignments: tuple[PodAssignment, ...] = ()
    # Preemption: the evicted pods as "namespace/name".
    victims: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return subjects.placement_decision(self.namespace, self.group)

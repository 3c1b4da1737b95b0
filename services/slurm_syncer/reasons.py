"""Who owns a Slurm drain reason: us, slurmctld, or someone else (external).

Ours: the reason starts with the configured drain-reason prefix (DRAIN_REASON_PREFIX, by
default the reference operators' `slurm-operator:`) or with a prefix an older Nodeflow wrote
(`nodeflow:`). The old prefix stays recognised so that drains written before an upgrade are
still ours to lift: without it every node drained by the previous version would look
external after the upgrade and stay drained for ever. We only ever write the configured one.

slurmctld's own: `Not responding`, which slurmctld sets on a node whose slurmd stopped
answering and clears itself when the node registers again. It is nobody's decision to keep
the node out of service, so it is not external (see drain.py for what the syncer does with
such a node).

Slinky's: the fixed reasons SchedMD's slurm-operator writes (nodeset_sync.go, its worker pod's
preStop), always after its own `slurm-operator: ` whatever our prefix is. They are ours, of the
same kind as ours (a cordon, a deletion), so a node Slinky drained before the switch to Nodeflow
is undrained once nothing asks for the drain any more. Only these formats: a reason Slinky took
from a node annotation or from node conditions is free text that cannot be told apart from a
drain command's, so it stays drained as a command's drain would (lifted by an undrain command).

External: any other non-empty reason (an administrator's `scontrol`, a health check): never
changed or cleared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from nodeflow_contracts.pod_protocol import (
    CORDON_REASON_KIND,
    DEFAULT_DRAIN_REASON_PREFIX,
    DELETE_REASON_KIND,
)

# Prefixes written by earlier versions; recognised as ours, never written.
LEGACY_DRAIN_REASON_PREFIXES: Final = ("nodeflow:",)
# Reasons slurmctld sets by itself.
SLURMCTLD_REASONS: Final = ("Not responding",)
# What slurmctld appends to the reason a node had when it stops answering.
SLURMCTLD_SUFFIX: Final = " : Not responding"

# The reasons Slinky's slurm-operator writes, each `slurm-operator: ` + text; `(...)` holds a
# Kubernetes node name or `<namespace>/<pod>`. The whole reason must match (a person who
# writes more after it wrote something else), save what slurmctld appends on a node that
# stopped answering.
SLINKY_REASON_PREFIX: Final = "slurm-operator: "
_SLINKY_OBJECT = r"\([^()]*\)"
SLINKY_CORDON_REASONS: Final = (
    # A cordoned Kubernetes node: the drain of its pod's Slurm node.
    re.compile(rf"Node {_SLINKY_OBJECT} was cordoned, Pod {_SLINKY_OBJECT} must be cordoned"),
    # The pod's pod-cordon annotation.
    re.compile(rf"Pod {_SLINKY_OBJECT} was cordoned"),
    # Left behind by its undrain (the node is no longer drained).
    re.compile(rf"Pod {_SLINKY_OBJECT} was uncordoned"),
)
SLINKY_DELETE_REASONS: Final = (
    # Scale-in: drained before the pod is deleted.
    re.compile(rf"Pod {_SLINKY_OBJECT} is pending termination for scale-in"),
    # The slurmd container's preStop sets the node DOWN with this reason.
    re.compile(r"Pod is terminating"),
)


def _is_slinkys(reason: str, patterns: tuple[re.Pattern[str], ...]) -> bool:
    if not reason.startswith(SLINKY_REASON_PREFIX):
        return False
    text = reason[len(SLINKY_REASON_PREFIX) :].removesuffix(SLURMCTLD_SUFFIX)
    return any(pattern.fullmatch(text) for pattern in patterns)


def is_slinky_cordon(reason: str) -> bool:
    """A cordon drain Slinky's slurm-operator wrote."""
    return _is_slinkys(reason, SLINKY_CORDON_REASONS)


def is_slinky_delete(reason: str) -> bool:
    """A scale-in drain (or terminating pod's DOWN) Slinky's slurm-operator wrote."""
    return _is_slinkys(reason, SLINKY_DELETE_REASONS)


@dataclass(frozen=True)
class DrainReasons:
    """The drain reasons of one deployment, built from its DRAIN_REASON_PREFIX."""

    prefix: str = DEFAULT_DRAIN_REASON_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix.strip():
            raise ValueError("the drain reason prefix must not be empty")

    @property
    def our_prefixes(self) -> tuple[str, ...]:
        return (self.prefix, *(p for p in LEGACY_DRAIN_REASON_PREFIXES if p != self.prefix))

    def _kind_prefixes(self, kind: str) -> tuple[str, ...]:
        return tuple(f"{prefix} {kind}" for prefix in self.our_prefixes)

    @property
    def cordon_prefix(self) -> str:
        """What a cordon drain written now starts with."""
        return f"{self.prefix} {CORDON_REASON_KIND}"

    @property
    def delete_prefix(self) -> str:
        """What a drain for deletion written now starts with."""
        return f"{self.prefix} {DELETE_REASON_KIND}"

    def is_ours(self, reason: str) -> bool:
        return (
            reason.startswith(self.our_prefixes)
            or is_slinky_cordon(reason)
            or is_slinky_delete(reason)
        )

    def is_cordon(self, reason: str) -> bool:
        return reason.startswith(self._kind_prefixes(CORDON_REASON_KIND)) or is_slinky_cordon(
            reason
        )

    def is_delete(self, reason: str) -> bool:
        return reason.startswith(self._kind_prefixes(DELETE_REASON_KIND)) or is_slinky_delete(
            reason
        )

    def owned_by_reconcile(self, reason: str) -> bool:
        """A cordon or deletion drain: the reconciliation that set it may lift it."""
        return self.is_cordon(reason) or self.is_delete(reason)

    def is_external(self, reason: str) -> bool:
        """A non-empty reason that neither we nor slurmctld wrote: never changed or cleared."""
        return bool(reason) and not self.is_ours(reason) and not is_slurmctlds(reason)

    def without_prefix(self, text: str) -> str:
        """`text` with any of our prefixes taken off its start, stripped."""
        stripped = text.strip()
        for prefix in self.our_prefixes:
            if stripped.startswith(prefix):
                return stripped[len(prefix) :].strip()
        return stripped

    def is_written_prefix(self, reason: str) -> bool:
        """Does `reason` start with the configured prefix and say something after it?"""
        return reason.startswith(self.prefix) and bool(reason[len(self.prefix) :].strip())


def is_slurmctlds(reason: str) -> bool:
    """A reason slurmctld set by itself (exactly, not appended to someone else's)."""
    return reason.strip() in SLURMCTLD_REASONS


DEFAULT_DRAIN_REASONS: Final = DrainReasons()

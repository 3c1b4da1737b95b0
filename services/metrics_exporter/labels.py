"""Label values taken from messages, bounded so that no series set grows without limit.

A label value is either from a closed vocabulary (operations, outcomes, decision kinds, the
topology's streams) or checked against a short machine-name pattern and capped by
`LabelLimiter`. Anything else (a pod name, a namespace, free text) becomes `other`.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import COMMAND_OPERATIONS
from nodeflow_contracts.slurm import FLAGS
from nodeflow_contracts.topology import WATCHED_KINDS

OTHER = "other"

# A Kubernetes condition reason in the CamelCase style the controllers use
# (ScalingDeleteScheduled); free text like "rank 2: idle" never matches.
_MACHINE_REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")
# A decision kind in the style of the contracts (delete-scheduled, rolling-replace).
_MACHINE_KIND = re.compile(r"^[a-z][a-z0-9-]{0,31}$")

_K8S_OPS = frozenset(COMMAND_OPERATIONS)
_SLURM_OPS = frozenset({"drain", "undrain"})
_WATCHED_KIND_TOKENS = frozenset(kind.kind.lower() for kind in WATCHED_KINDS)
_FLAGS = frozenset(FLAGS)
DECISION_SOURCES: tuple[str, ...] = ("nodeset", "maintenance", "placement")

DEAD_LETTER_ERROR_KINDS = frozenset({"decode", "permanent", "max_deliveries"})


class LabelLimiter:
    """Admits at most `limit` distinct values of one label; later new values become `other`.

    The first values seen keep their own series for the life of the process, so a counter
    never moves from one series to another.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a label limit must be at least 1")
        self.limit = limit
        self._admitted: set[str] = set()

    def admit(self, value: str) -> str:
        if value in self._admitted:
            return value
        if len(self._admitted) >= self.limit:
            return OTHER
        self._admitted.add(value)
        return value

    def __len__(self) -> int:
        return len(self._admitted)


class RecentIds:
    """The last `capacity` message ids, to count a re-sent message (same Nats-Msg-Id) once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def seen_before(self, msg_id: str) -> bool:
        """Record `msg_id`; True if it was already among the recent ids."""
        if msg_id in self._ids:
            self._ids.move_to_end(msg_id)
            return True
        self._ids[msg_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
        return False

    def __len__(self) -> int:
        return len(self._ids)


def k8s_op(op: str) -> str:
    return op if op in _K8S_OPS else OTHER


def slurm_flag(flag: str) -> str:
    return flag if flag in _FLAGS else OTHER


def machine_reason(reason: str) -> str:
    return reason if _MACHINE_REASON.match(reason) else OTHER


def machine_kind(kind: str) -> str:
    return kind if _MACHINE_KIND.match(kind) else OTHER


def dead_letter_error_kind(kind: str | None) -> str:
    return kind if kind in DEAD_LETTER_ERROR_KINDS else OTHER


def command_op_of_subject(subject: str) -> str:
    """The op of `cmd.k8s.v1.<sender>.<op>` (bounded to the known operations)."""
    parsed = subjects.parse_k8s_command(subject)
    return k8s_op(parsed[1]) if parsed is not None else OTHER


def subject_family(subject: str) -> str:
    """A bounded name for the kind of message on `subject`: its fixed leading tokens plus the
    operation or kind where that set is closed, never a name, namespace or cluster.

    cmd.k8s.v1.delete -> cmd.k8s.v1.delete; k8s.v1.pod.default.worker-0 -> k8s.v1.pod;
    cmd.slurm.v1.<cluster>.drain -> cmd.slurm.v1.drain; slurm.v1.<cluster>.poll -> slurm.v1.poll.
    """
    tokens = subject.split(".")
    head = tokens[:3]
    if len(tokens) == 4 and head == ["outcome", "k8s", "v1"]:
        return ".".join([*head, k8s_op(tokens[3])])
    if len(tokens) == 5 and head == ["cmd", "k8s", "v1"]:
        return f"cmd.k8s.v1.{command_op_of_subject(subject)}"
    if len(tokens) == 5 and head == ["cmd", "slurm", "v1"]:
        op = tokens[4] if tokens[4] in _SLURM_OPS else OTHER
        return f"cmd.slurm.v1.{op}"
    if len(tokens) >= 3 and tokens[:2] == ["k8s", "v1"]:
        kind = tokens[2] if tokens[2] in _WATCHED_KIND_TOKENS else OTHER
        return f"k8s.v1.{kind}"
    if len(tokens) >= 4 and tokens[:2] == ["slurm", "v1"]:
        if len(tokens) == 5 and tokens[3] == "node":
            return "slurm.v1.node"
        if len(tokens) == 4 and tokens[3] == "poll":
            return "slurm.v1.poll"
        return f"slurm.v1.{OTHER}"
    if len(tokens) >= 2 and tokens[0] in DECISION_SOURCES and tokens[1] == "v1":
        return f"{tokens[0]}.v1"
    return OTHER


def decision_source(subject: str) -> str:
    root = subject.split(".", 1)[0]
    return root if root in DECISION_SOURCES else OTHER

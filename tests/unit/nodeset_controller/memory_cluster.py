"""The service's decision loop without NATS: the controller's KV views are in-memory dicts
and its bus is a command sink. A test applies the commands it chooses, when it chooses,
as k8s-watcher would (uid preconditions, each idempotency key applied once), so it can
interleave delivery delays with Slurm and pod changes freely.

The sink keeps the command ledger's records and the cluster the outcomes it reported, so a
leader change is the ledger a successor rebuilds from them (`rebuilt_ledger`, what
`LedgerSender.rebuild` does with the records and outcomes it reads from NATS:
tests/integration/bus/test_command_ledger.py)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from nats.aio.msg import Msg

from nodeflow_bus import Bus, BusOptions, KVView, LeaderLease, OutgoingMessage
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import (
    CommandOutcome,
    CreateObject,
    DeleteObject,
    K8sCommand,
    PatchObject,
)
from nodeflow_contracts.ledger import CommandLedger, LedgerRecord, rebuilt_ledger
from nodeflow_contracts.pod_protocol import SLURM_DELETE_CONDITION
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeState
from nodeflow_kube.fields import (
    rfc3339,
)
from nodeset_controller import SERVICE
from nodeset_controller.commands import SENDER
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.objects import OtherPod, keep_in_view
from nodeset_controller.service import NodeSetController

V = TypeVar("V")
Listener = Callable[[str, Any, Any], None]


class MemoryView(Generic[V]):
    """What the controller reads of a KVView, kept in a dict; changes call its listener."""

    def __init__(self, listener: Listener) -> None:
        self._data: dict[str, V] = {}
        self._deleted: dict[str, int] = {}
        self._revision = 0
        self._listener = listener
        self.ready = asyncio.Event()
        self.ready.set()

    def get(self, key: str) -> V | None:
        return self._data.get(key)

    def items(self) -> list[tuple[str, V]]:
        return list(self._data.items())

    def values(self) -> list[V]:
        return list(self._data.values())

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def deleted_revision(self, key: str) -> int | None:
        return self._deleted.get(key)

    @property
    def last_revision(self) -> int:
        """The revision of the last change applied (a KV view's stream sequence)."""
        return self._revision

    def put(self, key: str, value: V) -> None:
        self._revision += 1
        old = self._data.get(key)
        self._data[key] = value
        self._deleted.pop(key, None)
        self._listener(key, old, value)

    def delete(self, key: str) -> None:
        self._revision += 1
        old = self._data.pop(key, None)
        self._deleted[key] = self._revision
        if old is not None:
            self._listener(key, old, None)


def kept(pod: dict[str, Any] | None) -> dict[str, Any] | OtherPod | None:
    """A raw pod as the controller's view keeps it (its KVView projection)."""
    return None if pod is None else keep_in_view(pod)


class KeptPods:
    """The controller's side of the raw pods: what it reads of its pods view (a pod as the
    view keeps it, its deletion revision, readiness)."""

    def __init__(self, raw: MemoryView[dict[str, Any]]) -> None:
        self._raw = raw
        self.ready = raw.ready

    def get(self, key: str) -> dict[str, Any] | OtherPod | None:
        return kept(self._raw.get(key))

    def deleted_revision(self, key: str) -> int | None:
        return self._raw.deleted_revision(key)


@dataclass
class Sent:
    command: K8sCommand
    msg_id: str
    sent_at: float


@dataclass
class CommandSink:
    """The bus as the controller uses it to send: every message is recorded; a message id
    seen before is dropped, as JetStream's duplicate window would."""

    sent: list[Sent] = field(default_factory=list)
    # A bus's options, as the lease reads them.
    options: BusOptions = field(default_factory=BusOptions)
    msg_ids: set[str] = field(default_factory=set)
    dropped_as_duplicates: int = 0
    now: float = 0.0
    # The command ledger's records, stored before their commands (as on COMMAND_LEDGER).
    records: list[LedgerRecord] = field(default_factory=list)

    async def publish(self, subject: str, message: Any, *, msg_id: str | None = None) -> None:
        assert isinstance(message, LedgerRecord), subject
        self.records.append(message)

    async def publish_batch(
        self, messages: list[OutgoingMessage], *, max_in_flight: int = 512
    ) -> None:
        for message in messages:
            if message.msg_id is not None and message.msg_id in self.msg_ids:
                self.dropped_as_duplicates += 1
                continue
            if message.msg_id is not None:
                self.msg_ids.add(message.msg_id)
            if isinstance(message.message, K8sCommand):
                self.sent.append(Sent(message.message, message.msg_id or "", self.now))


@dataclass
class HeldLease:
    """The controller's lease as the ledger asks it before each send step: held unless a
    test lets it lapse."""

    is_leader: bool = True


class MemoryCluster:
    """A controller wired to in-memory views, and the API writes its commands make."""

    def __init__(
        self,
        config: NodeSetControllerConfig,
        *,
        predecessor: MemoryCluster | None = None,
        leading_since: float = 0.0,
    ) -> None:
        """A controller leading with an empty ledger, or (`predecessor`) one that took the lead
        at `leading_since` from the controller of `predecessor` and rebuilt its ledger from
        what that one recorded and was told."""
        self.sink = CommandSink()
        self.outcomes: list[CommandOutcome] = []
        self.controller = NodeSetController(cast(Bus, self.sink), config)
        c = self.controller
        self.lease = HeldLease()
        c.lease = cast(LeaderLease, self.lease)
        if predecessor is None:
            c.ledger.adopt(CommandLedger(SENDER, max_lifetime=c.ledger.ledger.max_lifetime))
        else:
            self.sink.records = list(predecessor.sink.records)
            self.outcomes = list(predecessor.outcomes)
            self.regain_lead(leading_since)
        self.nodesets: MemoryView[dict[str, Any]] = MemoryView(c._on_nodeset)
        self.nodes: MemoryView[dict[str, Any]] = MemoryView(c._on_node)
        # Raw pods for the tests; the controller sees them as its KV view keeps them.
        self.pods: MemoryView[dict[str, Any]] = MemoryView(
            lambda key, old, new: c._on_pod(key, kept(old), kept(new))
        )
        self.slices: MemoryView[dict[str, Any]] = MemoryView(c._on_slice)
        self.slurm: MemoryView[SlurmNodeState] = MemoryView(c._on_slurm)
        self.clusters: MemoryView[SlurmClusterStatus] = MemoryView(c._on_slurm_cluster)
        # The NodeSets' ControllerRevisions (none unless a test puts them).
        self.revisions: MemoryView[dict[str, Any]] = MemoryView(c._on_revision)
        c.nodesets = cast(KVView[dict[str, Any]], self.nodesets)
        c.nodes = cast(KVView[dict[str, Any]], self.nodes)
        c.pods = cast(KVView[dict[str, Any] | OtherPod], KeptPods(self.pods))
        c.slices = cast(KVView[dict[str, Any]], self.slices)
        c.slurm = cast(KVView[SlurmNodeState], self.slurm)
        c.slurm_clusters = cast(KVView[SlurmClusterStatus], self.clusters)
        c.revisions = cast(KVView[dict[str, Any]], self.revisions)
        self.applied_keys: set[str] = set()
        self.delivered = 0
        self._rv = 100
        self._uid = 0

    def next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def next_uid(self) -> str:
        self._uid += 1
        return f"uid-{self._uid}"

    def regain_lead(self, now: float) -> None:
        """The controller loses the lead and takes it again at `now` (or a successor takes
        over): its ledger is what the records and outcomes so far rebuild."""
        c = self.controller
        c._on_leadership(False)
        assert not c.ledger.ready
        c.ledger.adopt(
            rebuilt_ledger(
                SENDER,
                SERVICE,
                self.sink.records,
                self.outcomes,
                now,
                max_lifetime=c.ledger.ledger.max_lifetime,
            )
        )

    async def report(self, outcome: CommandOutcome) -> None:
        """k8s-watcher publishes `outcome`: the controller's outcome subscription hears it."""
        self.outcomes.append(outcome)
        await self.controller.ledger.handle_outcome(
            cast(Msg, _Delivered(codec.encode(outcome), outcome.subject))
        )

    async def round(self, nodeset_key: str, now: float) -> list[K8sCommand]:
        """One decision round of the service for one NodeSet: plan, then send."""
        self.sink.now = now
        before = len(self.sink.sent)
        self.controller._mark(nodeset_key)
        await self.controller.reconcile_dirty(now)
        return [s.command for s in self.sink.sent[before:]]

    # --- the API writes of k8s-watcher ---------------------------------------------------------

    async def deliver(self, command: K8sCommand, now: float) -> bool:
        """Apply a command as k8s-watcher would, and tell the controller its outcome."""
        repeat = command.idempotency_key in self.applied_keys
        applied = self.apply(command)
        target = command.target
        key = f"{target.namespace}.{target.name}"
        current = self.pods.get(key) if target.kind == "Pod" else None
        outcome = CommandOutcome(
            idempotency_key=command.idempotency_key,
            op=type(command.operation).__name__,
            sender=command.sender,
            target=target,
            outcome="applied" if applied else "already-applied" if repeat else "conflict",
            sent_at=command.sent_at,
            finished_at=now,
            resource_version=current["metadata"]["resourceVersion"]
            if applied and current is not None
            else None,
        )
        await self.report(outcome)
        return applied

    def apply(self, command: K8sCommand) -> bool:
        """Apply a pod command as the API would; False when refused or a repeat."""
        target, operation = command.target, command.operation
        if target.kind != "Pod" or command.idempotency_key in self.applied_keys:
            return False
        key = f"{target.namespace}.{target.name}"
        current = self.pods.get(key)
        if isinstance(operation, CreateObject):
            if current is not None:
                return False
            pod = copy.deepcopy(dict(operation.object))
            pod["metadata"].update(
                uid=self.next_uid(), resourceVersion=self.next_rv(), creationTimestamp=rfc3339(0)
            )
            pod["spec"]["nodeName"] = _pinned_node(pod)
            pod["status"] = {
                "phase": "Pending",
                "conditions": [{"type": "Ready", "status": "False"}],
            }
            self.applied_keys.add(command.idempotency_key)
            self.pods.put(key, pod)
            return True
        if current is None or (target.uid and current["metadata"]["uid"] != target.uid):
            return False
        pod = copy.deepcopy(current)
        if isinstance(operation, DeleteObject):
            if pod["metadata"].get("deletionTimestamp"):
                return False
            pod["metadata"]["deletionTimestamp"] = rfc3339(0)
        elif isinstance(operation, PatchObject):
            _apply_condition_patch(pod, operation.patch)
        else:
            return False
        pod["metadata"]["resourceVersion"] = self.next_rv()
        self.applied_keys.add(command.idempotency_key)
        self.pods.put(key, pod)
        return True


@dataclass(frozen=True)
class _Delivered:
    data: bytes
    subject: str


def _pinned_node(pod: dict[str, Any]) -> str:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return str(terms[0]["matchFields"][0]["values"][0])


def _apply_condition_patch(pod: dict[str, Any], patch: Any) -> None:
    """The strategic merge of `status.conditions` by type (set, or `$patch: delete`)."""
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    for entry in patch.get("status", {}).get("conditions", []):
        kept = [c for c in conditions if c.get("type") != entry["type"]]
        if entry.get("$patch") != "delete":
            kept.append(dict(entry))
        conditions[:] = kept


def is_marked(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == SLURM_DELETE_CONDITION and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )

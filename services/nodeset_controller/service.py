"""Wiring of nodeset-controller: KV views in, plans, commands/decisions/Events out.

The controller reads only KV (k8s_nodesets, k8s_nodes, k8s_pods, k8s_nodeslices from
k8s-watcher; slurm_nodes and slurm_clusters from slurm-syncer) and acts only through
`cmd.k8s.v1.*` commands.
One replica is active (leader lease). Every command goes through the command ledger
(`nodeflow_bus.ledger`, protocol in `nodeflow_contracts.ledger`): a command holds its slot
(the pod, node claim, NodeSet status or NodeSlice it changes) until its outcome says it can
never land, or it applied and KV shows its effect (or `in_flight_timeout_seconds` has passed
since it was sent), or its deadline plus the landing margin has passed -- so a lost outcome
or a restart cannot wedge anything (the anchors' "expectations" bug), and no second command
for a slot goes out while the first may still land. A new leader rebuilds the ledger from
the streams before its first plan, so it holds what an earlier leader sent, across a
handover. The same ledger bounds how many pod and claim changes are in flight at once
(`max_commands_in_flight`, the holders of `WINDOW_SLOT`), so a scale of thousands of pods
proceeds in waves and a status update never queues behind thousands of commands. The
SlurmDelete sets and pod deletes it holds are also an input of the plan
(`ClusterView.in_flight`, from their `pod-change:` slots): a change sent and not yet visible
already counts against the rolling budget, whichever leader sent it.

A command sent again on purpose (its in-flight entry expired, or it was refused) keeps its
idempotency key -- k8s-watcher and the preconditions keep it idempotent -- but its
Nats-Msg-Id names the attempt, so JetStream's duplicate window cannot swallow the resend.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from nodeflow_bus import Bus, KVView, LeaderLease, OutgoingMessage
from nodeflow_bus.leader_loop import LeaderLoop, run_round
from nodeflow_bus.ledger import LedgerSender, Sending
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, RecordEvent
from nodeflow_contracts.ledger import HeldSlots, LedgerEntry
from nodeflow_contracts.pod_protocol import NODESET_LABEL
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeState
from nodeflow_contracts.subjects import slurm_cluster_key
from nodeflow_contracts.topology import SLURM_CLUSTERS_BUCKET
from nodeflow_kube.fields import (
    labels_of,
    mapping,
    name_of,
    namespace_of,
    resource_version_of,
    resource_version_reached,
    uid_of,
)
from nodeflow_kube.quantity import ResourceList
from nodeflow_runtime.service import ServiceContext
from nodeset_controller import SERVICE, metrics
from nodeset_controller.commands import (
    COMMAND_LIFETIME_SECONDS,
    SENDER,
    Outgoing,
    action_blockers,
    action_slot,
    invalid_status_outgoing,
    notice_outgoing,
    pod_slot,
    stable_key,
    status_outgoing,
    to_outgoing,
)
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.objects import (
    OtherPod,
    keep_in_view,
    keep_node_in_view,
    pod_node,
    pod_occupies_node,
    pod_requests,
)
from nodeset_controller.planner import (
    ClusterView,
    CreatePod,
    Notice,
    PlanMemo,
    PodChangeSent,
    plan,
    slurm_trust,
)
from nodeset_controller.podstate import DELETE_TIME_RESOLUTION
from nodeset_controller.protection import (
    CreateDisruptionBudget,
    DeleteDisruptionBudget,
    ProtectPod,
    budget_name,
)

log = structlog.get_logger("nodeset_controller")

# The `_wake_at` entry that wakes the loop when in-flight commands may have expired.
IN_FLIGHT_WAKE = "__in_flight__"
# Attempt counts kept for this many idempotency keys at most (oldest forgotten first).
MAX_REMEMBERED_ATTEMPTS = 65_536
# Held by every pod and claim change: its holders are the changes in flight, at most
# `max_commands_in_flight`.
WINDOW_SLOT = "nodeset-window"
# A SlurmDelete set or a pod delete also holds `pod-change:<kind>:<reason>:<pod slot>`, so a
# new leader counts it in the plan as the leader that sent it did.
POD_CHANGE_PREFIX = "pod-change:"

Obj = dict[str, Any]


def pod_change_slot(slot: str, sent: PodChangeSent) -> str:
    return f"{POD_CHANGE_PREFIX}{sent.kind}:{sent.reason or ''}:{slot}"


def pod_changes_held(held: HeldSlots) -> dict[str, PodChangeSent]:
    """Pod slot -> the SlurmDelete set or delete held for it (the latest sent)."""
    found: dict[str, PodChangeSent] = {}
    for ledger_slot, entries in held.with_prefix(POD_CHANGE_PREFIX).items():
        kind, reason, slot = ledger_slot[len(POD_CHANGE_PREFIX) :].split(":", 2)
        if kind not in ("schedule-delete", "delete"):
            continue
        sent_at = max(entry.sent_at for entry in entries)
        change = PodChangeSent(
            kind,  # type: ignore[arg-type]
            sent_at,
            reason or None,  # type: ignore[arg-type]
        )
        previous = found.get(slot)
        if previous is None or previous.sent_at < sent_at:
            found[slot] = change
    return found


@dataclass
class Stats:
    plans: int = 0
    commands: int = 0
    decisions: int = 0
    skipped_in_flight: int = 0
    # Pod and claim changes left for a later round: max_commands_in_flight were in flight.
    deferred: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class ForeignNames(Collection[str]):
    """Pod names of a namespace minus the NodeSet's own, without building the set."""

    def __init__(self, names: set[str], ours: Mapping[str, Any]) -> None:
        self._names = names
        self._ours = ours

    def __contains__(self, item: object) -> bool:
        return item in self._names and item not in self._ours

    def __iter__(self) -> Iterator[str]:
        return (n for n in self._names if n not in self._ours)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def view_behind(current: str, target: str) -> bool:
    """Does the view demonstrably hold the object at a resourceVersion before `target` (both
    numeric, so comparable; absent or opaque proves nothing)?"""
    return current.isdigit() and target.isdigit() and int(current) < int(target)


def aggregate_events(events: list[K8sCommand]) -> list[K8sCommand]:
    """One Event per (target, reason) per round: a scale-up of thousands of pods records a
    few Events, not thousands (they would queue behind each other on the NodeSet)."""
    groups: dict[tuple[str, str], list[K8sCommand]] = {}
    for event in events:
        assert isinstance(event.operation, RecordEvent)
        groups.setdefault((event.target.ordering_key, event.operation.reason), []).append(event)
    merged: list[K8sCommand] = []
    for group in groups.values():
        if len(group) == 1:
            merged.append(group[0])
            continue
        first = group[0]
        assert isinstance(first.operation, RecordEvent)
        messages = [e.operation.message for e in group if isinstance(e.operation, RecordEvent)]
        text = f"{len(group)} decisions: " + "; ".join(messages)
        if len(text) > 1024:
            text = text[:1000] + f" ... ({len(group)} in all)"
        key = stable_key("events", *sorted(e.idempotency_key for e in group))
        merged.append(
            K8sCommand(
                idempotency_key=key,
                sender=first.sender,
                sent_at=first.sent_at,
                expires_at=first.expires_at,
                target=first.target,
                operation=RecordEvent(
                    reason=first.operation.reason,
                    message=text,
                    type=first.operation.type,
                    action=first.operation.action,
                    reporting_component=first.operation.reporting_component,
                ),
                reason=f"{len(group)} {first.operation.action} decisions",
            )
        )
    return merged


class NodeSetController:
    def __init__(self, bus: Bus, config: NodeSetControllerConfig) -> None:
        self.bus = bus
        self.config = config
        self.nodesets: KVView[Obj] = KVView(bus, "k8s_nodesets", dict)
        self.nodes: KVView[Obj] = KVView(bus, "k8s_nodes", dict, project=keep_node_in_view)
        # The view's nodes by node name (its keys carry a namespace token), kept by _on_node:
        # building it for every plan cost a pass over every node.
        self._nodes_by_name: dict[str, Obj] = {}
        # Deletes tracked: a re-created pod's create command is keyed by its predecessor's
        # deletion (see commands.to_outgoing).
        self.pods: KVView[Obj | OtherPod] = KVView.projected(
            bus, "k8s_pods", dict, keep_in_view, track_deletes=True
        )
        self.slices: KVView[Obj] = KVView(bus, "k8s_nodeslices", dict)
        self.slurm: KVView[SlurmNodeState] = KVView(bus, "slurm_nodes", SlurmNodeState)
        self.slurm_clusters: KVView[SlurmClusterStatus] = KVView(
            bus, SLURM_CLUSTERS_BUCKET, SlurmClusterStatus
        )
        # The NodeSets' PodDisruptionBudgets (workloadDisruptionProtection, see `protection`).
        self.budgets: KVView[Obj] = KVView(bus, "k8s_poddisruptionbudgets", dict)
        # The NodeSets' ControllerRevisions (revision history, see `history`).
        self.revisions: KVView[Obj] = KVView(bus, "k8s_controllerrevisions", dict)
        self.lease = LeaderLease(
            bus, SERVICE, holder=config.instance_id or None, ttl=config.leader_lease_ttl_seconds
        )
        # Indexes kept up to date by the KV listeners.
        self._pods_of: dict[str, dict[str, Obj]] = {}  # "<ns>.<nodeset>" -> pod name -> pod
        self._pod_names: dict[str, set[str]] = {}  # namespace -> pod names
        self._pod_requests: dict[str, tuple[str, ResourceList]] = {}  # pod key -> (node, req)
        self._requested: dict[str, ResourceList] = {}  # node -> summed requests
        self._slices_of: dict[str, dict[str, Obj]] = {}
        self._revisions_of: dict[str, dict[str, Obj]] = {}  # "<ns>.<nodeset>" -> name -> obj
        self._slurm_of: dict[str, dict[str, SlurmNodeState]] = {}  # cluster -> name -> state
        self.ledger = LedgerSender(
            bus,
            ledger=SERVICE,
            sender=SENDER,
            # Status writes and Events live the default lifetime whatever the setting.
            max_lifetime=max(config.command_lifetime_seconds, COMMAND_LIFETIME_SECONDS),
            on_outcome=self._on_outcome,
            # The lease as it stands at each step of a send (a lapse mid-round sends nothing).
            leading=lambda: self.lease.is_leader,
        )
        self.ledger.on_ready = lambda: self._mark(None)
        # What the ledger held at the start of the round (the plan's pod changes in flight).
        self._held = HeldSlots()
        self._pod_changes: dict[str, PodChangeSent] = {}
        # Idempotency key -> how many times it was published (names each attempt's msg id).
        self._attempts: dict[str, int] = {}
        self._memos: dict[str, PlanMemo] = {}  # nodeset key -> reusable per-object checks
        self._room = config.max_commands_in_flight
        self._last_round_seconds = 0.0
        self._salt: dict[str, int] = {}
        self._dirty: set[str] = set()
        # NodeSets with changes deferred for want of room in the in-flight window.
        self._starved: set[str] = set()
        self._all_dirty = True
        self._wake = asyncio.Event()
        self._wake_at: dict[str, float] = {}
        # NodeSet key -> the SlurmDelete time its pods wait to see a Slurm poll after.
        self._awaiting_read: dict[str, float] = {}
        # The `slurm_nodes` stream sequence `_slurm_of` holds (what its listener has applied).
        self._slurm_nodes_revision = 0
        # Cluster -> when the newest poll whose node states `_slurm_of` was seen to hold whole
        # was read (planner.slurm_trust's `held_poll_at`).
        self._slurm_held_poll: dict[str, float] = {}
        self._leader_loop = LeaderLoop(
            bus,
            self.lease,
            self._views(),
            outcomes_subject=subjects.K8S_OUTCOMES,
            on_outcome=self.ledger.handle_outcome,
            on_leadership=self._on_leadership,
            loop=self._run,
            name="nodeset-controller loop",
        )
        self.stats = Stats()
        self.last_plan_at = 0.0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.nodesets.add_listener(self._on_nodeset)
        self.nodes.add_listener(self._on_node)
        self.pods.add_listener(self._on_pod)
        self.slices.add_listener(self._on_slice)
        self.slurm.add_listener(self._on_slurm)
        self.slurm_clusters.add_listener(self._on_slurm_cluster)
        self.budgets.add_listener(self._on_budget)
        self.revisions.add_listener(self._on_revision)
        await self._leader_loop.start()

    async def watch(self) -> None:
        """Raises once the decision loop ended without `stop()` (the process then exits)."""
        await self._leader_loop.watch()

    async def stop(self, grace: float = 5.0) -> None:
        await self._leader_loop.stop()
        await self.ledger.stop()

    def _views(self) -> tuple[KVView[Any], ...]:
        return (
            self.nodesets,
            self.nodes,
            self.pods,
            self.slices,
            self.slurm,
            self.slurm_clusters,
            self.budgets,
            self.revisions,
        )

    def views_ready(self) -> bool:
        return all(v.ready.is_set() for v in self._views())

    def not_ready_reason(self) -> str | None:
        return None if self.views_ready() else "KV views loading"

    # --- indexes -----------------------------------------------------------------------------

    def _mark(self, nodeset_key: str | None) -> None:
        if nodeset_key is None:
            self._all_dirty = True
        else:
            self._dirty.add(nodeset_key)
        self._wake.set()

    def _on_nodeset(self, key: str, old: Obj | None, new: Obj | None) -> None:
        self._mark(key)

    def _on_node(self, key: str, old: Obj | None, new: Obj | None) -> None:
        name = key.partition(".")[2]
        if new is None:
            self._nodes_by_name.pop(name, None)
        else:
            self._nodes_by_name[name] = new
        # A node change can matter to every NodeSet (feasibility, claims).
        self._mark(None)

    @staticmethod
    def _nodeset_of_pod(pod: Obj | OtherPod) -> str | None:
        if isinstance(pod, OtherPod):
            return None
        owner = labels_of(pod).get(NODESET_LABEL)
        return f"{namespace_of(pod)}.{owner}" if isinstance(owner, str) and owner else None

    def _on_pod(self, key: str, old: Obj | OtherPod | None, new: Obj | OtherPod | None) -> None:
        for pod, adding in ((old, False), (new, True)):
            if pod is None:
                continue
            if isinstance(pod, OtherPod):
                namespace, name, owner = pod.namespace, pod.name, None
            else:
                namespace, name, owner = namespace_of(pod), name_of(pod), self._nodeset_of_pod(pod)
            if adding:
                self._pod_names.setdefault(namespace, set()).add(name)
                if owner is not None and not isinstance(pod, OtherPod):
                    self._pods_of.setdefault(owner, {})[name] = pod
            else:
                if new is None:
                    self._pod_names.get(namespace, set()).discard(name)
                if owner is not None and (new is None or self._nodeset_of_pod(new) != owner):
                    self._pods_of.get(owner, {}).pop(name, None)
            if owner is not None:
                self._mark(owner)
        self._account(key, old, new)

    def _account(self, key: str, old: Obj | OtherPod | None, pod: Obj | OtherPod | None) -> None:
        """Keep the per-node request totals (other pods' requests limit feasibility)."""
        previous = self._pod_requests.pop(key, None)
        if previous is not None:
            node, requests = previous
            total = self._requested.get(node, {})
            for resource, amount in requests.items():
                total[resource] = total.get(resource, 0) - amount
        occupied = self._occupied(pod, old, previous)
        if occupied is not None:
            node, requests = occupied
            self._pod_requests[key] = occupied
            total = self._requested.setdefault(node, {})
            for resource, amount in requests.items():
                total[resource] = total.get(resource, 0) + amount
            changed_node = previous != occupied
        else:
            changed_node = previous is not None
        if changed_node and self._nodesets_count() > 1:
            # Resources freed or taken on a node matter to the other NodeSets too.
            self._mark(None)

    @staticmethod
    def _occupied(
        pod: Obj | OtherPod | None,
        old: Obj | OtherPod | None,
        previous: tuple[str, ResourceList] | None,
    ) -> tuple[str, ResourceList] | None:
        """(node, requests) of a pod that counts against a node; None for one that does not."""
        if pod is None:
            return None
        if isinstance(pod, OtherPod):
            return (pod.node or "", pod.requests) if pod.occupies_node else None
        if not pod_occupies_node(pod):
            return None
        spec = mapping(pod.get("spec"))
        if previous is not None and isinstance(old, dict) and old.get("spec") == spec:
            return (pod_node(pod) or "", previous[1])  # most updates are status only: no re-parse
        return (pod_node(pod) or "", pod_requests(spec))

    def _nodesets_count(self) -> int:
        return len(self.nodesets)

    def _on_slice(self, key: str, old: Obj | None, new: Obj | None) -> None:
        for obj in (old, new):
            if obj is None:
                continue
            owner = mapping(obj.get("spec")).get("nodeSetName") or labels_of(obj).get(NODESET_LABEL)
            if not isinstance(owner, str):
                continue
            nodeset_key = f"{namespace_of(obj)}.{owner}"
            if obj is new:
                self._slices_of.setdefault(nodeset_key, {})[name_of(obj)] = obj
            elif new is None:
                self._slices_of.get(nodeset_key, {}).pop(name_of(obj), None)
            self._mark(nodeset_key)

    def _on_budget(self, key: str, old: Obj | None, new: Obj | None) -> None:
        """A budget labelled with a NodeSet (ours, or one in the way of ours) re-plans it."""
        for obj in (old, new):
            owner = labels_of(obj).get(NODESET_LABEL) if obj is not None else None
            if obj is not None and isinstance(owner, str) and owner:
                self._mark(f"{namespace_of(obj)}.{owner}")

    def _on_revision(self, key: str, old: Obj | None, new: Obj | None) -> None:
        """A ControllerRevision labelled with a NodeSet is indexed under it and re-plans it."""
        for obj in (old, new):
            owner = labels_of(obj).get(NODESET_LABEL) if obj is not None else None
            if obj is None or not isinstance(owner, str) or not owner:
                continue
            nodeset_key = f"{namespace_of(obj)}.{owner}"
            if obj is new:
                self._revisions_of.setdefault(nodeset_key, {})[name_of(obj)] = obj
            elif new is None or labels_of(new).get(NODESET_LABEL) != owner:
                by_name = self._revisions_of.get(nodeset_key, {})
                by_name.pop(name_of(obj), None)
                if not by_name:
                    self._revisions_of.pop(nodeset_key, None)
            self._mark(nodeset_key)

    def _on_slurm(self, key: str, old: SlurmNodeState | None, new: SlurmNodeState | None) -> None:
        state = new or old
        if state is None:
            return
        by_name = self._slurm_of.setdefault(state.cluster, {})
        if new is None:
            by_name.pop(state.name, None)
        else:
            by_name[state.name] = new
        caught_up_from = self._slurm_nodes_revision
        # The view calls this once it holds the change (a snapshot: once it holds all of it).
        self._slurm_nodes_revision = max(caught_up_from, self.slurm.last_revision)
        self._note_held_poll(state.cluster, self._cluster_status(state.cluster))
        self._mark_awaiting_read(state.cluster, caught_up_from)
        # The Slurm node is named after the pod; find the pod's NodeSet.
        for nodeset_key, pods in self._pods_of.items():
            if state.name in pods:
                self._mark(nodeset_key)
                return

    def _on_slurm_cluster(
        self, key: str, old: SlurmClusterStatus | None, new: SlurmClusterStatus | None
    ) -> None:
        """Re-plan the cluster's NodeSets when what may be believed of it changes (fresh or
        not, reachable or not); a status that only moved forward changes no plan (going
        stale without a write is a wake-up the plan asks for)."""
        now = time.time()
        max_age = self.config.slurm_state_max_age_seconds
        grace = self.config.slurm_absence_grace_seconds
        before = slurm_trust(old, now, max_age, grace, self._slurm_nodes_revision)
        after = slurm_trust(new, now, max_age, grace, self._slurm_nodes_revision)
        status = new or old
        cluster = status.cluster if status is not None else key
        self._note_held_poll(cluster, new)
        if new is not None and not new.reachable and (old is None or old.reachable):
            # The NodeSet status names only the last read (an error text that changed each
            # poll would rewrite it each poll): the error that began the outage is logged here,
            # the later ones by slurm-syncer.
            log.warning(
                "slurm_cluster.unreachable",
                cluster=cluster,
                last_success_at=new.last_success_at,
                error=new.error,
            )
        if (before.fresh, before.reachable) == (after.fresh, after.reachable):
            # Only a poll that pods on their way out were waiting for changes a plan.
            if new is not None and self._awaiting_read:
                for nodeset_key, since in list(self._awaiting_read.items()):
                    nodeset = self.nodesets.get(nodeset_key)
                    if (
                        nodeset is not None
                        and mapping(nodeset.get("spec")).get("slurmCluster") == cluster
                        and new.last_success_at >= since + DELETE_TIME_RESOLUTION
                    ):
                        self._mark(nodeset_key)
            return
        for nodeset_key, nodeset in self.nodesets.items():
            if mapping(nodeset.get("spec")).get("slurmCluster") == cluster:
                self._mark(nodeset_key)

    def _note_held_poll(self, cluster: str, status: SlurmClusterStatus | None) -> None:
        """Remember when the poll `status` names was read once the view holds its states (or
        at once for a poll that listed no node)."""
        revision = self._slurm_nodes_revision
        read = status.absence_read_at(revision) if status is not None else None
        if read is not None and read > self._slurm_held_poll.get(cluster, 0.0):
            self._slurm_held_poll[cluster] = read

    def _mark_awaiting_read(self, cluster: str, caught_up_from: int) -> None:
        """Re-plan the NodeSets of `cluster` whose pods wait for a Slurm read once the node
        states of the poll they wait for have arrived after its status (the status came
        first: its poll time was no evidence then)."""
        if not self._awaiting_read:
            return
        status = self._cluster_status(cluster)
        if status is None or not (
            caught_up_from < status.nodes_revision <= self._slurm_nodes_revision
        ):
            return
        for nodeset_key, since in list(self._awaiting_read.items()):
            nodeset = self.nodesets.get(nodeset_key)
            if (
                nodeset is not None
                and mapping(nodeset.get("spec")).get("slurmCluster") == cluster
                and status.last_success_at >= since + DELETE_TIME_RESOLUTION
            ):
                self._mark(nodeset_key)

    # --- outcomes and the in-flight table -------------------------------------------------------

    def _on_outcome(self, outcome: CommandOutcome, entry: LedgerEntry | None) -> None:
        """An outcome of ours, decoded and already settled in the ledger."""
        if outcome.outcome == "retrying":
            return
        self.stats.outcomes[outcome.outcome] = self.stats.outcomes.get(outcome.outcome, 0) + 1
        metrics.OUTCOMES.labels(outcome.outcome).inc()
        if entry is None:
            return
        if outcome.never_lands and outcome.outcome != "conflict":
            log.warning(
                "command.refused",
                key=outcome.idempotency_key,
                op=outcome.op,
                target=outcome.target.ordering_key,
                outcome=outcome.outcome,
                message=outcome.message,
            )
        self._wake.set()
        self._mark(self._nodeset_of_slot_target(outcome))

    @staticmethod
    def _nodeset_of_slot_target(outcome: CommandOutcome) -> str | None:
        if outcome.target.kind == "NodeSet" and outcome.target.namespace:
            return f"{outcome.target.namespace}.{outcome.target.name}"
        return None

    def _watched_rv(self, watch: tuple[str, str]) -> str:
        bucket, key = watch
        if bucket == "k8s_pods":
            pod = self.pods.get(key)
            if isinstance(pod, OtherPod):
                return pod.resource_version
            return resource_version_of(pod) if pod is not None else ""
        view = {
            "k8s_nodes": self.nodes,
            "k8s_nodeslices": self.slices,
            "k8s_nodesets": self.nodesets,
            "k8s_poddisruptionbudgets": self.budgets,
            "k8s_controllerrevisions": self.revisions,
        }.get(bucket)
        if view is None:
            return ""
        obj = view.get(key)
        return resource_version_of(obj) if obj is not None else ""

    def _busy(self, slot: str, now: float) -> bool:
        """Does a command that may still land hold `slot` (see the module docstring)?"""
        return self.ledger.ledger.holds(slot, now)

    def _effect_seen(self, entry: LedgerEntry, outcome: str, rv: str | None, now: float) -> bool:
        """Does KV show what an applied command did (so its slot is free again)?"""
        target = entry.target
        bucket = subjects.k8s_bucket(target.kind)
        current = self._watched_rv((bucket, subjects.object_key(target.namespace, target.name)))
        if now - entry.sent_at > self.config.in_flight_timeout_seconds:
            if rv and view_behind(current, rv):
                # The view shows the object at an older resourceVersion than the write: a
                # plan on it would spend the slot again. Held until the view reaches the
                # write, or at the latest until the ledger drops it at its landing bound.
                return False
            log.info("command.in_flight_expired", key=entry.idempotency_key)
            return True
        is_create = entry.op == "create"
        if outcome == "already-applied" and is_create and current == "":
            # Applied long ago (before a restart) and gone since: a new create needs a new key.
            base = entry.idempotency_key.split("~", 1)[0]
            self._salt[base] = self._salt.get(base, 0) + 1
            return True
        if not rv:
            return True
        if entry.op == "delete" and current == "":
            # Gone from the view, whatever its kind (a pod, the NodeSet's budget deleted to
            # be made again): the delete's effect.
            return True
        if bucket == "k8s_pods" and not is_create and current == "":
            return True  # a pod's patch: the pod is gone since (its effect can never show)
        return current != "" and resource_version_reached(current, rv)

    # --- leadership and the loop ---------------------------------------------------------------

    def _on_leadership(self, leader: bool) -> None:
        # The ledger is rebuilt from the streams before this replica plans as leader: it then
        # holds whatever an earlier leader (another replica, or this one before it lost the
        # lease or restarted) sent that may still land, so no fixed pause is needed.
        self.ledger.on_leadership(leader)
        self._mark(None)

    async def _run(self) -> None:
        while True:
            timeout = self.config.resync_seconds
            if self._wake_at:
                timeout = max(0.0, min(timeout, min(self._wake_at.values()) - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            if not self.lease.is_leader or not self.views_ready() or not self.ledger.ready:
                # A leader whose ledger is not rebuilt yet plans nothing: it may not know an
                # earlier leader's commands (the ledger wakes the loop once rebuilt).
                if not self.lease.is_leader:
                    await asyncio.sleep(0.2)
                continue
            # A round costs CPU that k8s-watcher and slurm-syncer may share (one process in
            # small deployments): wait at least as long as the last round took, so planning
            # never takes more than half of it, however fast changes arrive.
            pause = max(self.config.debounce_seconds, self._last_round_seconds)
            if pause:
                await asyncio.sleep(pause)
            now = time.time()
            due = {k for k, at in self._wake_at.items() if at <= now}
            if IN_FLIGHT_WAKE in due:
                # Commands may have expired: whatever they held back is re-planned.
                self._all_dirty = True
            if due or timeout == self.config.resync_seconds:
                self._all_dirty = True if not due else self._all_dirty
                self._dirty |= due
            round_started = time.perf_counter()
            if not await run_round(self.reconcile_dirty, event="nodeset.round_failed"):
                # The round's dirty marks were taken: plan everything again next round.
                self._mark(None)
            self._last_round_seconds = time.perf_counter() - round_started
            metrics.PLAN_SECONDS.observe(self._last_round_seconds)
            metrics.IN_FLIGHT.set(len(self.ledger.ledger))
            # Commands in flight need a look again once they may have expired.
            expiry = self.ledger.ledger.next_expiry()
            if expiry is not None:
                self._wake_at[IN_FLIGHT_WAKE] = min(
                    expiry, now + self.config.in_flight_timeout_seconds
                )
            else:
                self._wake_at.pop(IN_FLIGHT_WAKE, None)

    async def reconcile_dirty(self, now: float | None = None) -> None:
        """Plan every NodeSet marked dirty and send the result (`now`: the clock's reading
        unless a caller drives the clock)."""
        if now is None:
            now = time.time()
        if self._all_dirty:
            keys = set(self.nodesets)
            self._all_dirty = False
            self._dirty.clear()
        else:
            keys, self._dirty = self._dirty, set()
        keys.discard(IN_FLIGHT_WAKE)
        outgoing: list[Outgoing] = []
        # Release what KV shows done and drop what can no longer land, so finished commands
        # never linger.
        ledger = self.ledger.ledger
        ledger.release_seen(lambda entry, result, rv: self._effect_seen(entry, result, rv, now))
        ledger.expire(now)
        self._held = ledger.held(now)
        self._pod_changes = pod_changes_held(self._held)
        self._room = self.config.max_commands_in_flight - len(ledger.holders(WINDOW_SLOT, now))
        if self._room > 0:
            # NodeSets whose changes waited for room get it now, whichever change freed it
            # (a NodeSet deferred again in this round adds itself back).
            keys |= self._starved
            self._starved = set()
        for key in sorted(keys):
            self._wake_at.pop(key, None)
            nodeset = self.nodesets.get(key)
            if nodeset is None:
                self._memos.pop(key, None)
                self._awaiting_read.pop(key, None)
                continue
            outgoing.extend(self.plan_nodeset(key, nodeset, now))
        self.last_plan_at = now
        if outgoing:
            await self.send(outgoing, now)

    def _pod_changes_in_flight(
        self, namespace: str, ours: Mapping[str, Obj], now: float
    ) -> dict[str, PodChangeSent]:
        """SlurmDelete sets and deletes of the NodeSet's pods that may still land or are not
        yet visible, by whichever leader they were sent (the ledger at the round's start)."""
        if not self._pod_changes:
            return {}
        prefix = pod_slot(namespace, "")
        return {
            slot[len(prefix) :]: change
            for slot, change in self._pod_changes.items()
            if slot.startswith(prefix) and slot[len(prefix) :] in ours
        }

    def plan_nodeset(self, key: str, nodeset: Obj, now: float) -> list[Outgoing]:
        cluster = str(mapping(nodeset.get("spec")).get("slurmCluster") or "")
        ours = self._pods_of.get(key, {})
        nodes = self._nodes_by_name
        memo = self._memos.setdefault(key, PlanMemo())
        if len(memo.facts) > len(nodes) or len(memo.pod_states) > len(ours):
            memo.forget_absent(nodes, ours)
        view = ClusterView(
            nodeset=nodeset,
            nodes=nodes,
            pods=list(ours.values()),
            requested=self._requested,
            foreign_pod_names=ForeignNames(self._pod_names.get(namespace_of(nodeset), set()), ours),
            slurm=self._slurm_of.get(cluster, {}),
            slurm_cluster=self._cluster_status(cluster),
            slices=self._slices_of.get(key, {}),
            defaults=self.config.defaults,
            now=now,
            in_flight=self._pod_changes_in_flight(namespace_of(nodeset), ours, now),
            slurm_max_age=self.config.slurm_state_max_age_seconds,
            absence_grace=self.config.slurm_absence_grace_seconds,
            pending_replace_after=self.config.pending_pod_replace_seconds,
            memo=memo,
            slurm_nodes_revision=self._slurm_nodes_revision,
            slurm_held_poll_at=self._slurm_held_poll.get(cluster),
            disruption_budget=self.budgets.get(
                f"{namespace_of(nodeset)}.{budget_name(name_of(nodeset))}"
            ),
            revisions=list(self._revisions_of.get(key, {}).values()),
        )
        result = plan(view)
        self.stats.plans += 1
        metrics.PLANS.inc()
        if result.wake_at is not None:
            self._wake_at[key] = result.wake_at
        else:
            self._wake_at.pop(key, None)
        if result.awaits_slurm_read_after is not None:
            self._awaiting_read[key] = result.awaits_slurm_read_after
        else:
            self._awaiting_read.pop(key, None)
        produced: list[Outgoing] = []
        if result.nodeset is None:
            namespace, name = namespace_of(nodeset), name_of(nodeset)
            for action in result.actions:
                if isinstance(action, Notice):
                    produced.append(notice_outgoing(namespace, name, uid_of(nodeset), action, now))
                elif result.protection_spec is not None and isinstance(
                    action, ProtectPod | CreateDisruptionBudget | DeleteDisruptionBudget
                ):
                    # Rule 4a goes on under an invalid spec (`planner._protect_under_invalid_spec`).
                    produced.append(
                        to_outgoing(
                            result.protection_spec,
                            action,
                            now,
                            lifetime=self.config.command_lifetime_seconds,
                        )
                    )
            if result.status is not None:
                produced.append(
                    invalid_status_outgoing(
                        namespace,
                        name,
                        uid_of(nodeset),
                        resource_version_of(nodeset),
                        result.status,
                        now,
                    )
                )
            if result.problems:
                log.info(
                    "nodeset.invalid", nodeset=key, problems=[p.describe() for p in result.problems]
                )
            return produced
        namespace = result.nodeset.namespace
        for action in result.actions:
            slot = action_slot(namespace, action)
            if slot is not None:
                # A pod or claim change: not while its slot is busy, and only while there is
                # room in the window.
                if self._busy(slot, now) or any(
                    self._busy(blocker, now) for blocker in action_blockers(namespace, action)
                ):
                    self.stats.skipped_in_flight += 1
                    continue
                if self._room <= 0:
                    self.stats.deferred += 1
                    metrics.DEFERRED.inc()
                    self._starved.add(key)
                    continue
                self._room -= 1
            deleted_at = 0
            if isinstance(action, CreatePod):
                deleted_at = self.pods.deleted_revision(f"{namespace}.{action.name}") or 0
            produced.append(
                to_outgoing(
                    result.nodeset,
                    action,
                    now,
                    pod_deleted_revision=deleted_at,
                    lifetime=self.config.command_lifetime_seconds,
                )
            )
        if result.status is not None:
            produced.append(status_outgoing(result.nodeset, result.status, now))
        return produced

    async def send(self, outgoing: list[Outgoing], now: float) -> None:
        """Send through the ledger: a tracked command holds its slot (and, for a pod or claim
        change, a place in the window; for a SlurmDelete set or delete, its pod change)."""
        sendings: list[Sending] = []
        messages: list[OutgoingMessage] = []
        events: list[K8sCommand] = []
        # Slots taken by this batch (the ledger records them when it sends the batch).
        taken: set[str] = set()

        def busy(slot: str) -> bool:
            return slot in taken or self._busy(slot, now)

        for out in outgoing:
            tracked = out.tracked
            if tracked and (busy(out.slot) or any(busy(s) for s in out.also_blocked_by)):
                self.stats.skipped_in_flight += 1
                continue
            command = out.command
            salt = self._salt.get(command.idempotency_key, 0)
            if salt:
                command = msgspec.structs.replace(
                    command, idempotency_key=f"{command.idempotency_key}~{salt}"
                )
            slots: list[str] = []
            if tracked:
                taken.add(out.slot)
                slots.append(out.slot)
                if out.windowed:
                    slots.append(WINDOW_SLOT)
                if out.pod_change is not None:
                    slots.append(pod_change_slot(out.slot, out.pod_change))
            msg_id = self._attempt_msg_id(command.idempotency_key) if tracked else None
            sendings.append(Sending(command, tuple(slots), msg_id, fenced=out.fenced))
            if out.decision is not None:
                messages.append(
                    OutgoingMessage(
                        subject=out.decision.subject,
                        message=out.decision,
                        msg_id=out.decision.decision_id,
                    )
                )
                self.stats.decisions += 1
                log.info(
                    "nodeset.decision",
                    nodeset=f"{out.decision.namespace}.{out.decision.nodeset}",
                    kind=out.decision.kind,
                    reason=out.decision.reason,
                    pod=out.decision.pod,
                    node=out.decision.node,
                    message=out.decision.message,
                )
            if out.event is not None:
                events.append(out.event)
        sendings.extend(Sending(event) for event in aggregate_events(events))
        self.stats.commands += len(messages) + len(sendings)
        metrics.MESSAGES.inc(len(messages) + len(sendings))
        if sendings or messages:
            await self.ledger.send(sendings, messages, publish_window=self.config.publish_window)

    def _attempt_msg_id(self, key: str) -> str:
        """The name of this attempt at sending `key`: the key itself the first time,
        `<key>#<n>` for the n-th deliberate resend (the ledger adds the send's `sent_at` to
        make the Nats-Msg-Id, so a new leader's first resend is not a duplicate either)."""
        attempt = self._attempts.pop(key, 0) + 1
        self._attempts[key] = attempt
        while len(self._attempts) > MAX_REMEMBERED_ATTEMPTS:
            del self._attempts[next(iter(self._attempts))]
        return key if attempt == 1 else f"{key}#{attempt}"

    def _cluster_status(self, cluster: str) -> SlurmClusterStatus | None:
        try:
            return self.slurm_clusters.get(slurm_cluster_key(cluster))
        except ValueError:
            return None  # a name that cannot be a key has no status: unknown


async def setup(ctx: ServiceContext[NodeSetControllerConfig]) -> None:
    controller = NodeSetController(ctx.bus, ctx.config)
    ctx.health.add_check("kv", controller.not_ready_reason)
    await controller.start()
    ctx.on_stop(controller.stop)
    ctx.spawn(controller.watch(), name="nodeset-controller loop watch")

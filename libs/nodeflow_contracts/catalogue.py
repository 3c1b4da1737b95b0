"""Which message travels on which subject, who publishes it and who consumes it.

proto/ (the subject catalogue, JSON Schemas and the AsyncAPI document) is generated from this.
"""

from __future__ import annotations

from typing import Any

import msgspec

from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, K8sObjectEvent
from nodeflow_contracts.ledger import LedgerRecord
from nodeflow_contracts.maintenance import MaintenanceDecision, SkyhookDecision
from nodeflow_contracts.nodeset import NodeSetDecision
from nodeflow_contracts.placement import PlacementDecision
from nodeflow_contracts.slurm import SlurmNodeChanged, SlurmNodeCommand, SlurmPollResult
from nodeflow_contracts.topology import STREAMS, stream_for_subject, subject_matches


class MessageSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    # Subject with {placeholders} for the variable tokens, for readers.
    subject_template: str
    # The same subject as a NATS wildcard, for subscribers.
    subscribe: str
    payload: Any
    publishers: tuple[str, ...]
    consumers: tuple[str, ...]
    description: str

    @property
    def stream(self) -> str:
        try:
            return stream_for_subject(_example(self.subscribe)).name
        except LookupError:
            # A stream that stores one prefix per sender (K8S_COMMANDS) stores no example of
            # the wildcard over all of them; it is the stream whose every prefix falls under it.
            for spec in STREAMS:
                if all(subject_matches(self.subscribe, _example(p)) for p in spec.subjects):
                    return spec.name
            raise


def _example(pattern: str) -> str:
    return pattern.replace(">", "x").replace("*", "x")


MESSAGES: tuple[MessageSpec, ...] = (
    MessageSpec(
        name="K8sObjectEvent",
        subject_template="k8s.v1.{kind}.{namespace}.{name}",
        subscribe=subjects.K8S_EVENTS,
        payload=K8sObjectEvent,
        publishers=("k8s-watcher",),
        # The services read the same facts from the KV buckets, not from this stream.
        consumers=("integrations",),
        description=(
            "Every ADDED/MODIFIED/DELETED change of a watched Kubernetes object; `namespace` is "
            "`_` for cluster-scoped kinds. The latest object of each kind is also in KV bucket "
            "`k8s_<plural>` under `<namespace>.<name>` (what the services read)."
        ),
    ),
    MessageSpec(
        name="K8sCommand",
        subject_template="cmd.k8s.v1.{sender}.{op}",
        subscribe=subjects.K8S_COMMANDS,
        payload=K8sCommand,
        publishers=(
            "slurm-syncer",
            "nodeset-controller",
            "maintenance-scheduler",
            "topology-placer",
        ),
        consumers=("k8s-watcher",),
        description=(
            "A change to apply to the Kubernetes API. `sender` is the sending service (its NATS "
            "user may publish under its own prefix only); `op` is one of create, delete, patch, "
            "cordon, uncordon, evict, bind, nominate, update-status, record-event. The "
            "idempotency key is the Nats-Msg-Id; uid/resourceVersion in the target are "
            "preconditions. k8s-watcher refuses (outcome `forbidden`, dead letter) a command "
            "whose subject disagrees with its payload or that the sender's policy does not "
            "allow, and reports one received after `expires_at` as `expired`. Each sender's "
            "commands wait in a queue of their own (a durable consumer of k8s-watcher per "
            "sender), behind that sender's earlier commands only."
        ),
    ),
    MessageSpec(
        name="CommandOutcome",
        subject_template="outcome.k8s.v1.{op}",
        subscribe=subjects.K8S_OUTCOMES,
        payload=CommandOutcome,
        publishers=("k8s-watcher",),
        consumers=("metrics-exporter", "nodeset-controller"),
        description=(
            "The outcome of a command: applied, already-applied, conflict, not-found, invalid, "
            "forbidden, expired, retrying or failed, with the API server's message."
        ),
    ),
    MessageSpec(
        name="LedgerRecord",
        subject_template="ledger.k8s.v1.{ledger}",
        subscribe=subjects.COMMAND_LEDGER,
        payload=LedgerRecord,
        publishers=("nodeset-controller", "maintenance-scheduler", "topology-placer"),
        consumers=("nodeset-controller", "maintenance-scheduler", "topology-placer"),
        description=(
            "The commands a controller is about to send, each with the slots it holds (a pod, "
            "a node, a budget) and its deadline; stored before the commands are published. A "
            "new leader reads its ledger's records and the outcomes since the earliest send "
            "that may still land, and plans around what is still held (docs/protocols.md)."
        ),
    ),
    MessageSpec(
        name="SlurmNodeChanged",
        subject_template="slurm.v1.{cluster}.node.{name}",
        subscribe=subjects.SLURM_NODE_EVENTS,
        payload=SlurmNodeChanged,
        publishers=("slurm-syncer",),
        # metrics-exporter and nodeset-controller read the KV bucket `slurm_nodes` instead.
        consumers=("integrations",),
        description=(
            "A Slurm node's state changed (base state, flags, reason, CPUs, derived Busy/Drain/"
            "Drained/Draining). The latest state is in KV bucket `slurm_nodes` under "
            "`<cluster>.<node>` (what the services read)."
        ),
    ),
    MessageSpec(
        name="SlurmPollResult",
        subject_template="slurm.v1.{cluster}.poll",
        subscribe=subjects.SLURM_POLLS,
        payload=SlurmPollResult,
        publishers=("slurm-syncer",),
        consumers=("metrics-exporter",),
        description="The result of one poll of one Slurm cluster, successful or not.",
    ),
    MessageSpec(
        name="SlurmNodeCommand",
        subject_template="cmd.slurm.v1.{cluster}.{op}",
        subscribe=subjects.SLURM_COMMANDS,
        payload=SlurmNodeCommand,
        publishers=("integrations",),
        consumers=("slurm-syncer",),
        description=(
            "Drain or undrain a Slurm node with a reason of slurm-syncer's prefix "
            "(`slurm-operator:` by default)."
        ),
    ),
    MessageSpec(
        name="NodeSetDecision",
        subject_template="nodeset.v1.{namespace}.{name}.decision",
        subscribe=subjects.NODESET_DECISIONS,
        payload=NodeSetDecision,
        publishers=("nodeset-controller",),
        consumers=("metrics-exporter", "integrations"),
        description=(
            "Every create, delete-scheduled, cancel, delete, forced delete and rolling "
            "replacement of the NodeSet controller, with its reason."
        ),
    ),
    MessageSpec(
        name="MaintenanceDecision",
        subject_template="maintenance.v1.nodemaintenance.{namespace}.{name}.decision",
        subscribe=subjects.MAINTENANCE_DECISIONS,
        payload=MaintenanceDecision,
        publishers=("maintenance-scheduler",),
        consumers=("metrics-exporter", "integrations"),
        description=(
            "Every scheduling (or skip, with the budget that held it), cordon, eviction, wait "
            "for a Slurm job, timeout and cleanup of the maintenance-scheduler, by NodeMaintenance."
        ),
    ),
    MessageSpec(
        name="PlacementDecision",
        subject_template="placement.v1.{namespace}.{group}.decision",
        subscribe=subjects.PLACEMENT_DECISIONS,
        payload=PlacementDecision,
        publishers=("topology-placer",),
        consumers=("metrics-exporter", "integrations"),
        description=(
            "Every gang outcome of topology-placer: nominated, bound (with the domain and each "
            "pod's node), unschedulable or timed out (why, in numbers), preempted (the victims)."
        ),
    ),
    MessageSpec(
        name="SkyhookDecision",
        subject_template="maintenance.v1.skyhook.{skyhook}.decision",
        subscribe=subjects.SKYHOOK_DECISIONS,
        payload=SkyhookDecision,
        publishers=("maintenance-scheduler",),
        consumers=("metrics-exporter", "integrations"),
        description=(
            "Every package stage started, finished, failed or retried on a node, every rollout "
            "batch judged (and a rollout stopped), every Job failed by the controller and every "
            "NodeMaintenance requested or released by maintenance-scheduler's Skyhook controller."
        ),
    ),
)

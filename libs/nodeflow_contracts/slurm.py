"""Slurm node state (slurm-syncer -> everyone) and Slurm commands (-> slurm-syncer)."""

from __future__ import annotations

from typing import Literal

import msgspec

from nodeflow_contracts import subjects
from nodeflow_contracts.pod_protocol import DEFAULT_DRAIN_REASON_PREFIX

# Base states and flags as docs/protocols.md names them (pod condition suffixes).
BASE_STATES: tuple[str, ...] = (
    "Allocated",
    "Down",
    "Error",
    "Future",
    "Idle",
    "Mixed",
    "Unknown",
)
FLAGS: tuple[str, ...] = (
    "Completing",
    "Drain",
    "Fail",
    "Invalid",
    "InvalidReg",
    "Maintenance",
    "NotResponding",
    "Undrain",
)

# How many job ids a SlurmNodeState keeps (SlurmNodeState.jobs).
JOBS_KEPT = 20

BaseState = Literal["Allocated", "Down", "Error", "Future", "Idle", "Mixed", "Unknown"]

# The default start of every drain reason Nodeflow writes; slurm-syncer's DRAIN_REASON_PREFIX
# setting replaces it and is what the syncer checks commands against. Any other non-empty
# reason is external.
REASON_PREFIX = DEFAULT_DRAIN_REASON_PREFIX


class SlurmNodeState(msgspec.Struct, frozen=True, kw_only=True):
    """One Slurm node as last read. `known` is False when it could not be read: fail closed."""

    cluster: str
    name: str
    known: bool
    base_state: BaseState
    flags: tuple[str, ...] = ()
    reason: str = ""
    reason_is_ours: bool = False
    reason_set_by: str = ""
    reason_changed_at: float | None = None
    cpus: int = 0
    alloc_cpus: int = 0
    # The reservation slurmctld shows the node in (`nodes[].reservation`: set while one is
    # active on it), "" for none. With the Maintenance flag: a MAINT reservation holds it.
    reservation: str = ""
    # Derived states, exactly as the reference defines them.
    busy: bool = False
    drain: bool = False
    drained: bool = False
    draining: bool = False
    observed_at: float = 0.0
    # The jobs Slurm's job listing showed on the node (running, suspended or completing), by
    # id in numeric order: the first JOBS_KEPT of them, `jobs_total` counts them all. For
    # people only (`kubectl nodeflow why pod`): `busy` comes from the node's own state, never
    # from these. A change of jobs alone is not published (job churn would cost a KV write
    # per job), so a stored state names the jobs as of `jobs_read_at` (0.0: never read).
    jobs: tuple[str, ...] = ()
    jobs_total: int = 0
    jobs_read_at: float = 0.0

    @property
    def key(self) -> str:
        return subjects.slurm_node_key(self.cluster, self.name)


class SlurmNodeChanged(msgspec.Struct, frozen=True, kw_only=True):
    """Published on `slurm.v1.<cluster>.node.<name>` only when the node's state changed."""

    cluster: str
    name: str
    change: Literal["upsert", "removed"]
    state: SlurmNodeState | None = None

    @property
    def subject(self) -> str:
        return subjects.slurm_node_event(self.cluster, self.name)


class SlurmClusterStatus(msgspec.Struct, frozen=True, kw_only=True):
    """How fresh slurm-syncer's view of one cluster is: KV `slurm_clusters`, key `<cluster>`,
    written after every poll, successful or not.

    A reader trusts the `slurm_nodes` states of a cluster only while `last_success_at` is
    younger than its maximum age (by default `STALE_AFTER_POLLS` x `poll_interval_seconds`):
    if slurm-syncer stops, its last states go stale and count as unknown (fail closed).
    `reachable` is the last poll's result; a node absent from a reachable, fresh cluster is
    not registered in Slurm.

    The record and the node states travel in two buckets, each read by its own consumer, so a
    reader may see this record before the node states written just before it. Before it
    takes `last_success_at` as the time its node states were read (evidence that a state is
    newer than some event), a reader checks that its view of `slurm_nodes` has applied every
    write up to `nodes_revision`.
    """

    cluster: str
    reachable: bool
    last_poll_at: float
    # 0.0 until a poll has succeeded.
    last_success_at: float = 0.0
    poll_interval_seconds: float
    error: str = ""
    syncer: str = ""
    # The `slurm_nodes` stream sequence up to which every node state of this cluster that the
    # poll read (or confirmed unchanged) was written: a view of `slurm_nodes` that has applied
    # this sequence holds the poll's states (or newer ones). 0: unknown (a syncer that did not
    # say): `last_success_at` then proves nothing about any node state (fail closed).
    nodes_revision: int = 0
    # How many nodes the poll's listing held; -1: not said (a failed poll, or a syncer that
    # does not say). A listing of none proves every node of the cluster not registered,
    # whatever a reader's view of `slurm_nodes` holds (`absence_read_at`).
    nodes_listed: int = -1
    # The slurmrestd API version slurm-syncer speaks with the cluster ("": not negotiated yet):
    # what it can ask of Slurm, e.g. reservations (nodeflow_contracts.nodeset).
    api_version: str = ""

    def absence_read_at(self, applied_nodes_revision: int) -> float | None:
        """When Slurm's listing was last read by a `slurm_nodes` view that has applied
        `applied_nodes_revision`, so that a node missing from the view was missing from it:
        `nodes_read_at`, or for a successful poll that listed no node at all its time (every
        node was missing, whatever the view holds). None when neither holds."""
        read = self.nodes_read_at(applied_nodes_revision)
        if read is None and self.reachable and self.nodes_listed == 0 and self.last_success_at > 0:
            return self.last_success_at
        return read

    def nodes_read_at(self, applied_nodes_revision: int) -> float | None:
        """When the states of a `slurm_nodes` view that has applied `applied_nodes_revision`
        were read at the latest: `last_success_at` once the view holds this poll's states;
        None while it may not (it lags, or the record does not say)."""
        if self.last_success_at <= 0 or self.nodes_revision <= 0:
            return None
        if applied_nodes_revision < self.nodes_revision:
            return None
        return self.last_success_at

    @property
    def key(self) -> str:
        return subjects.slurm_cluster_key(self.cluster)

    def fresh(self, now: float, max_age_seconds: float | None = None) -> bool:
        """Are this cluster's node states current at `now`? (None: the default age.)"""
        limit = (
            max_age_seconds
            if max_age_seconds is not None and max_age_seconds > 0
            else STALE_AFTER_POLLS * self.poll_interval_seconds
        )
        return self.last_success_at > 0 and now - self.last_success_at <= limit


# Slurm state older than this many poll intervals is unknown (issue: stale Slurm state).
STALE_AFTER_POLLS = 4


class SlurmPollResult(msgspec.Struct, frozen=True, kw_only=True):
    """One poll of one cluster, on `slurm.v1.<cluster>.poll`, successful or not."""

    cluster: str
    ok: bool
    started_at: float
    duration_seconds: float
    node_count: int = 0
    error: str = ""

    @property
    def subject(self) -> str:
        return subjects.slurm_poll_event(self.cluster)


SlurmOp = Literal["drain", "undrain"]


class SlurmNodeCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Drain or undrain a Slurm node, on `cmd.slurm.v1.<cluster>.<op>`.

    The reason must start with slurm-syncer's drain-reason prefix (DRAIN_REASON_PREFIX, by
    default REASON_PREFIX) and say something after it; slurm-syncer never overwrites an
    external reason.
    """

    idempotency_key: str
    sender: str
    sent_at: float
    cluster: str
    node: str
    op: SlurmOp
    reason: str = ""

    @property
    def subject(self) -> str:
        return subjects.slurm_command(self.cluster, self.op)

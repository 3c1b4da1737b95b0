"""The syncer's I/O: polls Slurm, keeps KV `slurm_nodes`, publishes node changes and poll
results, projects node state onto NodeSet pods through k8s-watcher, and drains/undrains.

Decisions are made by pure functions: `nodestate` (what a poll changed) and `reconcile` (pod
facts + Slurm states + what was sent + now -> commands, through `conditions` and `drain`).
This module only gathers their inputs (KV views of pods, nodes and NodeSets; slurmrestd) and
carries out their outputs (publishes and Slurm calls). After every poll, successful or not,
the cluster's SlurmClusterStatus goes to KV `slurm_clusters` once the poll's node states are
acknowledged, naming their `slurm_nodes` sequence (`nodes_revision`), so a reader can tell a
fresh view from the last word of a syncer that stopped, and whether its view of the node
states holds that poll's yet. One
decision pass at a time, under a lock; Slurm updates run in the background, bounded, at most
one per node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
from nats.js.api import PubAck

from nodeflow_bus import (
    BatchPublishError,
    Bus,
    Delivery,
    KVView,
    OutgoingMessage,
    PermanentError,
    PublishError,
    RetryableError,
)
from nodeflow_bus.kv_writes import kv_delete, kv_put
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import subjects
from nodeflow_contracts.nodeset import RESERVATION_PREFIX
from nodeflow_contracts.pod_protocol import NODE_CORDON_REASON_ANNOTATION
from nodeflow_contracts.slurm import (
    SlurmClusterStatus,
    SlurmNodeChanged,
    SlurmNodeCommand,
    SlurmNodeState,
    SlurmPollResult,
)
from nodeflow_contracts.topology import (
    SLURM_CLUSTERS_BUCKET,
    SLURM_NODES_BUCKET,
    WATCHED_KINDS,
)
from slurm_syncer import metrics
from slurm_syncer.client import SlurmClient, SlurmError
from slurm_syncer.drain import DrainPlan, decide_command, decide_drain
from slurm_syncer.jobs import carry_jobs, jobs_by_node
from slurm_syncer.nodestate import (
    DEFAULT_NOT_RESPONDING_CONFIRM_SECONDS,
    MalformedNode,
    apply_jobs,
    apply_poll,
    parse_node,
    same_state,
    settle_not_responding,
    with_unconfirmed_not_responding,
)
from slurm_syncer.pods import (
    PodFacts,
    is_past_pending,
    node_cordon_facts,
    nodeset_of,
    only_nodeset_pods,
    pod_facts,
)
from slurm_syncer.prune import decide_prune, is_dynamic, nodeset_names, owner_of, plan_prunes
from slurm_syncer.reasons import DEFAULT_DRAIN_REASONS, DrainReasons
from slurm_syncer.reconcile import (
    LEDGERS,
    ClusterSnapshot,
    ReconcileOptions,
    SentRecord,
    reconcile_pods,
)
from slurm_syncer.reservations import plan_reservations, reservation_names, scheduled_nodesets

log = structlog.get_logger("slurm_syncer")

PODS_BUCKET = subjects.k8s_bucket("Pod")
NODES_BUCKET = subjects.k8s_bucket("Node")
NODESETS_BUCKET = subjects.k8s_bucket("NodeSet")
NODESET_API_VERSION = next(k.api_version for k in WATCHED_KINDS if k.kind == "NodeSet")

Obj = dict[str, Any]


@dataclass(frozen=True)
class SyncerOptions:
    sender: str = "slurm-syncer"
    poll_interval: float = 5.0
    max_concurrent_updates: int = 16
    # A pod command not yet reflected in the pod after this long is sent again.
    resend_after: float = 30.0
    # NOT_RESPONDING is reported once seen for this long (nodestate.settle_not_responding).
    not_responding_confirm: float = DEFAULT_NOT_RESPONDING_CONFIRM_SECONDS
    # Which drain reasons are ours (DRAIN_REASON_PREFIX) and how ours are written.
    drain_reasons: DrainReasons = DEFAULT_DRAIN_REASONS
    # How long a started pod's slurmd may take to register before NodeNotRegistered is
    # written (reconcile.registration_pending); None: the poll interval.
    registration_wait: float | None = None
    # How long a poll's job listing (`GET /jobs`, for `why pod` only, read once the node
    # states are published) may take, in one try; None: half the poll interval.
    jobs_timeout: float | None = None


@dataclass
class ClusterView:
    """What the syncer knows of one Slurm cluster."""

    name: str
    client: SlurmClient
    states: dict[str, SlurmNodeState] = field(default_factory=dict)
    # Nodes last read NOT_RESPONDING -> since when, confirmed or not.
    not_responding_since: dict[str, float] = field(default_factory=dict)
    polled: bool = False
    reachable: bool = False
    last_error: str = ""
    # When a poll last succeeded (0.0: never), kept across restarts through KV.
    last_success_at: float = 0.0
    # When the last poll of this syncer began (0.0: none yet).
    last_poll_started_at: float = 0.0
    # Nodes whose state in `states` is not yet acknowledged in KV `slurm_nodes`: a failed
    # publish leaves them here for the next one, so KV never keeps a state the syncer left.
    unpublished: set[str] = field(default_factory=set)
    # Node states reach KV one batch at a time, each built inside this lock from `states` as
    # it then is: whichever batch lands last carries the newest state of every node in it.
    publish_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Node -> monotonic time of its last one-node read (a command's read-back); a poll whose
    # listing was sent before then keeps that state (apply_poll's read_since_listing).
    read_at: dict[str, float] = field(default_factory=dict)
    # The `slurm_nodes` stream sequence up to which every state in `states` (but those in
    # `unpublished`) has been written: the KV snapshot the term started from, then each
    # acknowledged write. The cluster status names it (SlurmClusterStatus.nodes_revision).
    nodes_revision: int = 0
    # The reservation names Slurm last listed (None: not listed this term), see reservations.py.
    reservations: set[str] | None = None

    def forget_term(self) -> None:
        """Start a term as a new process would: from KV (the last leader's word), not from
        what this replica knew when it last led (states since changed or removed; owed
        publishes another leader has since made moot)."""
        self.states.clear()
        self.not_responding_since.clear()
        self.unpublished.clear()
        self.read_at.clear()
        self.nodes_revision = 0
        self.reservations = None
        self.polled = self.reachable = False
        self.last_poll_started_at = 0.0

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            name=self.name,
            polled=self.polled,
            reachable=self.reachable,
            states=self.states,
            poll_started_at=self.last_poll_started_at,
            not_responding=self.not_responding_since.keys(),
        )


@dataclass
class ReconcileReport:
    pods: int = 0
    condition_patches: int = 0
    cordon_marks: int = 0
    slurm_updates: int = 0


def _interesting_node_fields(node: Obj | None) -> tuple[object, object]:
    if node is None:
        return (None, None)
    spec = node.get("spec") or {}
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return (bool(spec.get("unschedulable")), annotations.get(NODE_CORDON_REASON_ANNOTATION))


def _slurm_cluster_of_nodeset(nodeset: Obj | None) -> object:
    return ((nodeset or {}).get("spec") or {}).get("slurmCluster")


class Syncer:
    """Usage: `syncer = Syncer(bus, {"a": client}); await syncer.start(); ...; await
    syncer.stop()`. Start it only on the replica that holds the leader lease."""

    def __init__(
        self,
        bus: Bus,
        clients: Mapping[str, SlurmClient],
        options: SyncerOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._bus = bus
        self.options = options or SyncerOptions()
        self._clock = clock
        self.clusters = {name: ClusterView(name, client) for name, client in clients.items()}
        self._pods_by_node: dict[str, set[str]] = {}
        self._node_of_pod: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._dirty_event = asyncio.Event()
        self._reconcile_lock = asyncio.Lock()
        self._slurm_slots = asyncio.Semaphore(self.options.max_concurrent_updates)
        self._in_flight: dict[tuple[str, str], asyncio.Task[None]] = {}
        # (cluster, node) -> its lock and how many hold or wait for it: one Slurm update of a
        # node at a time, whoever asks (a command or the reconciliation), each deciding on
        # the node as read under the lock.
        self._node_locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self._sent: dict[tuple[str, str], SentRecord] = {}
        # Pod key -> (uid, when this syncer first saw it past Pending): see registration_pending.
        self._running_seen: dict[str, tuple[str, float]] = {}
        # (cluster, NodeSet key, API version) already warned as unable to hold its window:
        # the NodeSet's ScheduledUpdate condition says it for good, the log says it once.
        self._unsupported_warned: set[tuple[str, str, str]] = set()
        self._reconcile_options = ReconcileOptions(
            sender=self.options.sender,
            resend_after=self.options.resend_after,
            reasons=self.options.drain_reasons,
            registration_wait=(
                self.options.poll_interval
                if self.options.registration_wait is None
                else self.options.registration_wait
            ),
        )
        self._jobs_timeout = (
            self.options.poll_interval / 2
            if self.options.jobs_timeout is None
            else self.options.jobs_timeout
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._wakeups: dict[str, asyncio.Event] = {}
        self._poll_locks = {name: asyncio.Lock() for name in clients}
        self.ready = asyncio.Event()
        self._views_used = False
        self._make_views()

    # --- lifecycle -------------------------------------------------------------------------

    def _make_views(self) -> None:
        """Fresh views (a KVView starts once): a replica may lose and regain the lease."""
        self._pods: KVView[Obj] = KVView(self._bus, PODS_BUCKET, dict, project=only_nodeset_pods)
        self._nodes: KVView[Obj] = KVView(self._bus, NODES_BUCKET, dict, project=node_cordon_facts)
        self._nodesets: KVView[Obj] = KVView(self._bus, NODESETS_BUCKET, dict)
        self._pods_by_node.clear()
        self._node_of_pod.clear()
        self._sent.clear()
        self._running_seen.clear()
        for cluster in self.clusters.values():
            cluster.forget_term()

    async def start(self) -> None:
        if self._views_used:
            self._make_views()
        self._views_used = True
        self._pods.add_listener(self._on_pod)
        self._nodes.add_listener(self._on_node)
        self._nodesets.add_listener(self._on_nodeset)
        for view in (self._pods, self._nodes, self._nodesets):
            await view.start()
        for view in (self._pods, self._nodes, self._nodesets):
            await view.ready.wait()
        await self._load_known_states()
        self._tasks.append(asyncio.create_task(self._reconcile_loop(), name="reconcile"))
        for name in self.clusters:
            self._wakeups[name] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._poll_loop(name), name=f"poll-{name}"))
        self.ready.set()
        log.info("syncer.started", clusters=sorted(self.clusters), pods=len(self._pods))

    async def stop(self) -> None:
        self.ready.clear()
        tasks = [*self._tasks, *self._in_flight.values()]
        # One cancel() can be swallowed by nats-py's wait_for on Python 3.11; a cancellation of
        # stop() itself still goes through.
        await asyncio.gather(*(cancel_and_wait(task) for task in tasks))
        self._tasks.clear()
        self._in_flight.clear()
        for view in (self._pods, self._nodes, self._nodesets):
            await view.stop()
        log.info("syncer.stopped")

    def poll_now(self, cluster: str) -> None:
        """Poll `cluster` at once instead of waiting for the interval."""
        self._wakeups[cluster].set()

    async def _load_known_states(self) -> None:
        """Start from what KV holds, so a restart republishes only what really changed.

        The views are read once and closed: kept open, they would hold a second copy of every
        node's state for the whole term (10,000 states of this service's memory)."""
        known: KVView[SlurmNodeState] = KVView(self._bus, SLURM_NODES_BUCKET, SlurmNodeState)
        statuses: KVView[SlurmClusterStatus] = KVView(
            self._bus, SLURM_CLUSTERS_BUCKET, SlurmClusterStatus
        )
        try:
            for view in (known, statuses):
                await view.start()
            await known.ready.wait()
            await statuses.ready.wait()
            for _, state in known.items():
                cluster = self.clusters.get(state.cluster)
                if cluster is not None:
                    cluster.states[state.name] = state
            for cluster in self.clusters.values():
                # Every state just loaded was written at or before this sequence.
                cluster.nodes_revision = max(cluster.nodes_revision, known.last_revision)
            for _, status in statuses.items():
                cluster = self.clusters.get(status.cluster)
                if cluster is not None:
                    cluster.last_success_at = max(cluster.last_success_at, status.last_success_at)
        finally:
            for view in (known, statuses):
                await view.stop()

    # --- KV listeners: what changed in Kubernetes ---------------------------------------------

    def _mark_dirty(self, keys: Iterable[str]) -> None:
        self._dirty.update(keys)
        if self._dirty:
            self._dirty_event.set()

    def _on_pod(self, key: str, old: Obj | None, new: Obj | None) -> None:
        previous_node = self._node_of_pod.pop(key, None)
        if previous_node is not None:
            self._pods_by_node.get(previous_node, set()).discard(key)
        if new is None:
            for ledger in LEDGERS:
                self._sent.pop((ledger, key), None)
            self._running_seen.pop(key, None)
            return
        uid = str((new.get("metadata") or {}).get("uid") or "")
        seen = self._running_seen.get(key)
        if not is_past_pending(new):
            self._running_seen.pop(key, None)
        elif seen is None or seen[0] != uid:
            self._running_seen[key] = (uid, self._clock())
        node_name = (new.get("spec") or {}).get("nodeName")
        if isinstance(node_name, str) and node_name:
            self._node_of_pod[key] = node_name
            self._pods_by_node.setdefault(node_name, set()).add(key)
        if nodeset_of(new) is not None:
            self._mark_dirty([key])

    def _on_node(self, key: str, old: Obj | None, new: Obj | None) -> None:
        if _interesting_node_fields(old) == _interesting_node_fields(new):
            return
        _, name = subjects.split_object_key(key)
        self._mark_dirty(self._pods_by_node.get(name, ()))

    def _on_nodeset(self, key: str, old: Obj | None, new: Obj | None) -> None:
        if _slurm_cluster_of_nodeset(old) == _slurm_cluster_of_nodeset(new):
            return
        namespace, name = subjects.split_object_key(key)
        self._mark_dirty(
            pod_key
            for pod_key, pod in self._pods.items()
            if nodeset_of(pod) == name and pod_key.startswith(f"{namespace}.")
        )

    # --- polling -------------------------------------------------------------------------------

    async def _poll_loop(self, cluster: str) -> None:
        wakeup = self._wakeups[cluster]
        while True:
            started = time.monotonic()
            try:
                await self.poll_once(cluster)
            except Exception:
                # A bug or a bus failure must not end polling: log it and poll again.
                log.exception("syncer.poll_failed", cluster=cluster)
            wait = max(0.0, self.options.poll_interval - (time.monotonic() - started))
            wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), wait)

    async def poll_once(self, cluster: str) -> SlurmPollResult:
        """Read every node of `cluster`, publish what changed, then reconcile its pods."""
        async with self._poll_locks[cluster]:
            return await self._poll(cluster)

    async def _poll(self, cluster: str) -> SlurmPollResult:
        view = self.clusters[cluster]
        started_at = self._clock()
        started = time.perf_counter()
        raw_nodes: list[dict[str, Any]] | None
        error = ""
        listing_sent = time.monotonic()
        try:
            raw_nodes = await view.client.list_nodes()
        except SlurmError as exc:
            raw_nodes, error = None, str(exc)
            log.warning("syncer.poll_unreachable", cluster=cluster, error=error)
        view.read_at = {name: at for name, at in view.read_at.items() if at > listing_sent}
        outcome = apply_poll(
            cluster,
            view.states,
            raw_nodes,
            started_at,
            view.not_responding_since,
            self.options.not_responding_confirm,
            self.options.drain_reasons,
            read_since_listing=view.read_at.keys(),
        )
        view.states = outcome.states
        if raw_nodes is not None:
            # A failed poll says nothing about responding: keep when each node was first seen.
            view.not_responding_since = outcome.not_responding_since
        view.polled = True
        view.last_poll_started_at = started_at
        view.reachable = raw_nodes is not None
        view.last_error = error
        if view.reachable:
            view.last_success_at = started_at
        if outcome.malformed:
            metrics.MALFORMED_NODES.labels(cluster).inc(len(outcome.malformed))
            log.error("syncer.malformed_nodes", cluster=cluster, problems=outcome.malformed[:5])
            error = f"{len(outcome.malformed)} malformed node entries: {outcome.malformed[0]}"
        result = SlurmPollResult(
            cluster=cluster,
            ok=raw_nodes is not None,
            started_at=started_at,
            duration_seconds=time.perf_counter() - started,
            node_count=len(outcome.states),
            error=error,
        )
        view.unpublished.update(state.name for state in outcome.changed)
        view.unpublished.update(outcome.removed)
        if outcome.changed or outcome.removed:
            metrics.NODE_CHANGES.labels(cluster).inc(len(outcome.changed) + len(outcome.removed))

        def trailer(nodes_revision: int) -> list[OutgoingMessage]:
            # Built once the poll's node states are acknowledged: it names their sequence.
            status = SlurmClusterStatus(
                cluster=cluster,
                reachable=view.reachable,
                last_poll_at=started_at,
                last_success_at=view.last_success_at,
                poll_interval_seconds=self.options.poll_interval,
                error=error,
                syncer=self.options.sender,
                nodes_revision=nodes_revision,
                nodes_listed=len(raw_nodes) if raw_nodes is not None else -1,
                api_version=view.client.version.name if view.client.version else "",
            )
            return [
                kv_put(SLURM_CLUSTERS_BUCKET, status.key, status),
                OutgoingMessage(subject=result.subject, message=result),
            ]

        await self._publish_states(view, trailer)
        metrics.POLLS.labels(cluster, "ok" if result.ok else "failed").inc()
        metrics.NODES.labels(cluster).set(len(outcome.states))
        metrics.CLUSTER_REACHABLE.labels(cluster).set(1 if result.ok else 0)
        await self.reconcile(None, cluster=cluster)
        if view.reachable:
            await self.prune(cluster)
            await self.sync_reservations(cluster)
        metrics.POLL_SECONDS.labels(cluster).observe(time.perf_counter() - started)
        if view.reachable:
            # Last, once the poll's node states are out and acted on: the jobs are for
            # `why pod` only, so a slow or failing job listing never holds a node state back.
            await self._read_jobs(view)
        return result

    async def _read_jobs(self, view: ClusterView) -> None:
        """Name on each node of `view` the jobs holding it (jobs.jobs_by_node) and publish the
        states that this changes (nodestate.apply_jobs). One try, bounded by `jobs_timeout`:
        the next poll is the retry. When Slurm does not answer in time each node keeps the
        jobs it was last read with (and when). Only `why pod` shows them: neither a failure
        nor a malformed entry changes what the poll made of the nodes."""
        read_at = self._clock()
        try:
            async with asyncio.timeout(self._jobs_timeout):
                raw_jobs = await view.client.list_jobs(attempts=1)
        except (SlurmError, TimeoutError) as exc:
            log.warning(
                "syncer.jobs_unreadable",
                cluster=view.name,
                error=str(exc) or f"no answer within {self._jobs_timeout}s",
            )
            return
        read = jobs_by_node(raw_jobs)
        if read.malformed:
            log.error("syncer.malformed_jobs", cluster=view.name, problems=read.malformed[:5])
        # Read into the states without awaiting: no read-back lands between the two.
        outcome = apply_jobs(view.states, read.by_node, read_at)
        view.states = outcome.states
        if not outcome.changed:
            return
        # States still owed (the poll's batch failed, or a read-back's waits for the lock)
        # go with the publish already due: the next poll's, beside its cluster status.
        owed = bool(view.unpublished)
        view.unpublished.update(outcome.changed)
        metrics.NODE_CHANGES.labels(view.name).inc(len(outcome.changed))
        if not owed:
            await self._publish_states(view)

    async def _publish_states(
        self,
        view: ClusterView,
        trailer: Callable[[int], list[OutgoingMessage]] | None = None,
    ) -> None:
        """Publish every unpublished node state of `view` (KV and event), then `trailer`
        (built with the `slurm_nodes` sequence every state of `view` is now written by).

        The batch is built from `view.states` inside the cluster's publish lock, so a batch
        that waited behind another still carries each node's newest state: an older poll's
        batch can never land after, and undo, a drain's read-back. A batch that fails (or is
        interrupted) leaves its nodes unpublished for the next one, and its trailer (the
        poll's SlurmClusterStatus) is not sent: a fresh status beside node states KV did not
        take would make stale states look fresh (fail open).
        """
        async with view.publish_lock:
            names = sorted(view.unpublished)
            view.unpublished.clear()
            messages: list[OutgoingMessage] = []
            kv_writes: list[int] = []  # indexes of the `slurm_nodes` writes in `messages`
            for name in names:
                state = view.states.get(name)
                kv_writes.append(len(messages))
                if state is None:
                    messages.append(
                        kv_delete(SLURM_NODES_BUCKET, subjects.slurm_node_key(view.name, name))
                    )
                    event = SlurmNodeChanged(cluster=view.name, name=name, change="removed")
                else:
                    messages.append(kv_put(SLURM_NODES_BUCKET, state.key, state))
                    event = SlurmNodeChanged(
                        cluster=view.name, name=name, change="upsert", state=state
                    )
                messages.append(OutgoingMessage(subject=event.subject, message=event))
            try:
                acks = await self._publish(messages, "slurm state")
            except BaseException:
                view.unpublished.update(names)
                raise
            if acks is None:
                view.unpublished.update(names)
                return
            for index in kv_writes:
                view.nodes_revision = max(view.nodes_revision, acks[index].seq)
            if trailer is not None:
                await self._publish(trailer(view.nodes_revision), "slurm cluster status")

    async def _publish(self, messages: list[OutgoingMessage], what: str) -> list[PubAck] | None:
        """The acks of `messages` in their order; None when the batch failed."""
        if not messages:
            return []
        try:
            return await self._bus.publish_batch(messages)
        except (BatchPublishError, PublishError) as exc:
            log.error("syncer.publish_failed", what=what, error=str(exc))
            return None

    # --- reconciling pods --------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            await self._dirty_event.wait()
            self._dirty_event.clear()
            keys, self._dirty = self._dirty, set()
            try:
                await self.reconcile(keys)
            except Exception:
                log.exception("syncer.reconcile_failed", pods=len(keys))
                self._mark_dirty(keys)
                await asyncio.sleep(1.0)

    async def reconcile(
        self, keys: Iterable[str] | None, *, cluster: str | None = None
    ) -> ReconcileReport:
        """Project Slurm state onto the given pods (None: every pod) and act on drains."""
        async with self._reconcile_lock:
            return await self._reconcile(keys, cluster)

    async def _reconcile(self, keys: Iterable[str] | None, cluster: str | None) -> ReconcileReport:
        now = self._clock()
        pods = self._pods.as_dict() if keys is None else None
        # Read in place: nothing below awaits before the decisions are made, so the views
        # cannot change under them, and copying 4,000 nodes for every pod event cost more
        # than the work.
        nodes, nodesets = self._nodes, self._nodesets
        facts_of: list[PodFacts] = []
        for key in keys if keys is not None else list(pods or ()):
            pod = pods.get(key) if pods is not None else self._pods.get(key)
            if pod is None:
                continue
            seen = self._running_seen.get(key)
            facts = pod_facts(pod, nodes, nodesets, running_seen_at=seen[1] if seen else None)
            if facts is None or (cluster is not None and facts.cluster != cluster):
                continue
            facts_of.append(facts)
        decided = reconcile_pods(
            facts_of,
            {name: view.snapshot() for name, view in self.clusters.items()},
            self._sent,
            now,
            updating=self._in_flight.keys() | self._node_locks.keys(),
            options=self._reconcile_options,
        )
        report = ReconcileReport(pods=decided.pods, slurm_updates=len(decided.slurm_updates))
        for pod_command in decided.pod_commands:
            metrics.POD_PATCHES.labels(pod_command.kind).inc()
            if pod_command.kind == "conditions":
                report.condition_patches += 1
            else:
                report.cordon_marks += 1
        commands = [c.command for c in decided.pod_commands]
        sent = await self._publish(
            [
                OutgoingMessage(subject=c.subject, message=c, msg_id=c.idempotency_key)
                for c in commands
            ],
            "pod commands",
        )
        if sent is not None:
            # Recorded only once published: a failed publish is sent again on the next pass.
            self._sent.update(decided.sent)
        for facts, plan in decided.slurm_updates:
            self._start_update(facts, plan)
        return report

    # --- Slurm updates ---------------------------------------------------------------------

    def _start_update(self, facts: PodFacts, plan: DrainPlan) -> None:
        node = (facts.cluster, facts.name)
        task = asyncio.create_task(self._run_update(facts, plan), name=f"update-{facts.name}")
        self._in_flight[node] = task
        task.add_done_callback(partial(self._forget_update, node))

    def _forget_update(self, node: tuple[str, str], done: asyncio.Task[None]) -> None:
        # Only its own entry: a newer update of the node may have taken the slot already.
        if self._in_flight.get(node) is done:
            del self._in_flight[node]

    @property
    def updates_running(self) -> int:
        """Slurm node updates under way (decided by the reconciliation or asked by commands)."""
        return len(self._in_flight.keys() | self._node_locks.keys())

    @contextlib.asynccontextmanager
    async def _node_updating(self, cluster: str, node: str) -> AsyncIterator[None]:
        """Hold the node's update lock (forgotten once nobody holds or waits for it)."""
        key = (cluster, node)
        lock, users = self._node_locks.get(key, (asyncio.Lock(), 0))
        self._node_locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._node_locks[key]
            if users > 1:
                self._node_locks[key] = (lock, users - 1)
            else:
                del self._node_locks[key]

    async def _still_decided(self, facts: PodFacts, plan: DrainPlan) -> bool:
        """Read the node again (under its lock) and decide again: the plan was made on the
        last listing, and a command may have drained or undrained the node since -- acting
        on the old state could overwrite a maintenance drain's reason, or lift it."""
        view = self.clusters[facts.cluster]
        async with self._slurm_slots:
            requested_at = time.monotonic()
            raw = await view.client.get_node(facts.name)
        if raw is not None:
            try:
                read = parse_node(facts.cluster, raw, self._clock(), self.options.drain_reasons)
            except MalformedNode:
                read = None
            if read is not None:
                seen = facts.name in view.not_responding_since
                fresh = decide_drain(
                    facts,
                    with_unconfirmed_not_responding(read, seen),
                    self.options.drain_reasons,
                )
                if (fresh.action, fresh.reason) == (plan.action, plan.reason):
                    return True
        log.info(
            "syncer.update_superseded",
            cluster=facts.cluster,
            node=facts.name,
            action=plan.action,
            why="the node changed since the listing the update was decided on",
        )
        await self._record_node(facts.cluster, facts.name, raw, requested_at)
        return False

    async def _run_update(self, facts: PodFacts, plan: DrainPlan) -> None:
        node = (facts.cluster, facts.name)
        try:
            decide_again = await self._apply_update(facts, plan)
        finally:
            # Out of the in-flight set before the pod is marked: the reconciliation that
            # mark wakes must not find the node still updating and skip it.
            current = asyncio.current_task()
            if current is not None:
                self._forget_update(node, current)
        if decide_again:
            # The pod's conditions follow the node's new state at once; a superseded update
            # is decided again on what was read.
            self._mark_dirty([facts.key])

    async def _apply_update(self, facts: PodFacts, plan: DrainPlan) -> bool:
        """The update, unless the node changed since it was decided; whether the node was read
        (and the pod should be reconciled again)."""
        origin = plan.origin or "cordon"
        try:
            async with self._node_updating(facts.cluster, facts.name):
                if not await self._still_decided(facts, plan):
                    return True
                await self._update_node(facts.cluster, facts.name, plan.action, plan.reason)
        except SlurmError as exc:
            metrics.NODE_UPDATES.labels(facts.cluster, plan.action, origin, "failed").inc()
            log.warning(
                "syncer.update_failed",
                cluster=facts.cluster,
                node=facts.name,
                action=plan.action,
                error=str(exc),
            )
            return False
        metrics.NODE_UPDATES.labels(facts.cluster, plan.action, origin, "ok").inc()
        log.info(
            "syncer.node_updated",
            cluster=facts.cluster,
            node=facts.name,
            action=plan.action,
            reason=plan.reason,
            why=plan.why,
        )
        return True

    async def _update_node(self, cluster: str, node: str, action: str, reason: str) -> None:
        """Send the drain/undrain, then read the node back and publish its new state."""
        view = self.clusters[cluster]
        async with self._slurm_slots:
            if action == "drain":
                await view.client.update_node(node, ["DRAIN"], reason)
            else:
                await view.client.update_node(node, ["UNDRAIN"])
            # From here on Slurm has the update: a listing sent earlier may not show it.
            requested_at = time.monotonic()
            raw = await view.client.get_node(node)
        await self._record_node(cluster, node, raw, requested_at)

    async def _record_node(
        self, cluster: str, node: str, raw: dict[str, Any] | None, requested_at: float
    ) -> None:
        """Keep and publish a one-node read; `requested_at` (monotonic) is when the read was
        sent, or the update behind it was answered: a listing sent before then cannot
        overwrite it."""
        view = self.clusters[cluster]
        previous = view.states.get(node)
        if raw is None:
            if previous is None:
                return
            view.states.pop(node, None)
            view.not_responding_since.pop(node, None)
            view.read_at[node] = requested_at
            view.unpublished.add(node)
            metrics.NODE_CHANGES.labels(cluster).inc()
            await self._publish_states(view)
            return
        try:
            read = parse_node(cluster, raw, self._clock(), self.options.drain_reasons)
        except MalformedNode as exc:
            log.error("syncer.malformed_node", cluster=cluster, node=node, error=str(exc))
            return
        # A one-node read has no job listing: the node keeps the jobs the last poll read.
        read = carry_jobs(read, previous)
        # Right after our own UNDRAIN this read usually shows NOT_RESPONDING for a moment.
        settled = settle_not_responding(
            read,
            previous,
            view.not_responding_since.get(node),
            self.options.not_responding_confirm,
        )
        state = settled.state
        if settled.not_responding_since is None:
            view.not_responding_since.pop(node, None)
        else:
            view.not_responding_since[node] = settled.not_responding_since
        view.states[node] = state
        view.read_at[node] = requested_at
        if not same_state(previous, state):
            view.unpublished.add(node)
            metrics.NODE_CHANGES.labels(cluster).inc()
        if view.unpublished:
            await self._publish_states(view)

    # --- pruning Slurm node records (prune.py) --------------------------------------------

    async def prune(self, cluster: str) -> list[str]:
        """Delete the records `plan_prunes` picks on the last poll of `cluster`, each decided
        again on the node as read under its lock; the names of those deleted."""
        view = self.clusters[cluster]
        nodesets = [nodeset for _, nodeset in self._nodesets.items()]
        planned = plan_prunes(
            cluster, view.states, nodesets, self._pods, self.options.drain_reasons
        )
        deleted = []
        for node in planned:
            if (cluster, node) in self._in_flight:
                continue
            try:
                async with self._node_updating(cluster, node):
                    if await self._prune_node(view, node, nodesets):
                        deleted.append(node)
            except SlurmError as exc:
                metrics.NODE_UPDATES.labels(cluster, "delete", "prune", "failed").inc()
                log.warning("syncer.prune_failed", cluster=cluster, node=node, error=str(exc))
        return deleted

    async def _prune_node(self, view: ClusterView, node: str, nodesets: list[Obj]) -> bool:
        async with self._slurm_slots:
            requested_at = time.monotonic()
            raw = await view.client.get_node(node)
        if raw is None:
            await self._record_node(view.name, node, None, requested_at)
            return False
        try:
            read = parse_node(view.name, raw, self._clock(), self.options.drain_reasons)
        except MalformedNode:
            return False
        owner = owner_of(
            node,
            [n for n in (nodeset_names(ns) for ns in nodesets) if n and n.cluster == view.name],
        )
        exists = owner is not None and subjects.object_key(owner.namespace, node) in self._pods
        decision = decide_prune(read, owner, exists, self.options.drain_reasons)
        if not decision.prune or not is_dynamic(raw):
            log.debug(
                "syncer.prune_skipped",
                cluster=view.name,
                node=node,
                why=decision.why if not decision.prune else "not a dynamic node",
            )
            await self._record_node(view.name, node, raw, requested_at)
            return False
        async with self._slurm_slots:
            await view.client.delete_node(node)
            requested_at = time.monotonic()
        metrics.NODE_UPDATES.labels(view.name, "delete", "prune", "ok").inc()
        log.info("syncer.node_pruned", cluster=view.name, node=node, why=decision.why)
        await self._record_node(view.name, node, None, requested_at)
        return True

    # --- scheduled-update reservations (reservations.py) ----------------------------------

    async def sync_reservations(self, cluster: str) -> None:
        """Create and delete the reservations `plan_reservations` picks on the last poll of
        `cluster`. Slurm's listing is read only while a NodeSet of the cluster asks for a
        scheduled update, the last listing held a reservation of ours to delete, or none was
        read yet this term."""
        view = self.clusters[cluster]
        nodesets = [nodeset for _, nodeset in self._nodesets.items()]
        asking = scheduled_nodesets(cluster, nodesets, ())
        # None: not listed this term; a reservation of ours may be left from before (the
        # NodeSet stopped asking while no syncer ran), so the first poll lists them.
        if not asking and view.reservations is not None and not view.reservations:
            return
        version = view.client.version
        if version is None or not version.writes_reservations:
            spoken = version.name if version else ""
            for entry in asking:
                warned = (cluster, entry.key, spoken)
                if warned not in self._unsupported_warned:
                    self._unsupported_warned.add(warned)
                    log.warning(
                        "syncer.reservations_unsupported",
                        cluster=cluster,
                        nodeset=entry.key,
                        api_version=spoken,
                    )
            return
        try:
            async with self._slurm_slots:
                existing = reservation_names(await view.client.list_reservations())
        except SlurmError as exc:
            log.warning("syncer.reservations_unread", cluster=cluster, error=str(exc))
            return
        plan = plan_reservations(
            cluster, self._clock(), nodesets, view.states.keys(), existing, version
        )
        for key, why in plan.held:
            log.info("syncer.reservation_held", cluster=cluster, nodeset=key, why=why)
        for new in plan.create:
            window = new.window
            try:
                async with self._slurm_slots:
                    await view.client.create_reservation(
                        window.reservation,
                        list(new.nodes),
                        new.start,
                        new.minutes,
                        list(window.flags),
                    )
            except (SlurmError, ValueError) as exc:
                metrics.RESERVATION_CHANGES.labels(cluster, "create", "failed").inc()
                log.warning(
                    "syncer.reservation_create_failed",
                    cluster=cluster,
                    reservation=window.reservation,
                    error=str(exc),
                )
                continue
            existing.add(window.reservation)
            metrics.RESERVATION_CHANGES.labels(cluster, "create", "ok").inc()
            log.info(
                "syncer.reservation_created",
                cluster=cluster,
                reservation=window.reservation,
                nodes=len(new.nodes),
                flags=list(window.flags),
            )
        for name in plan.delete:
            try:
                async with self._slurm_slots:
                    await view.client.delete_reservation(name)
            except (SlurmError, ValueError) as exc:
                metrics.RESERVATION_CHANGES.labels(cluster, "delete", "failed").inc()
                log.warning(
                    "syncer.reservation_delete_failed",
                    cluster=cluster,
                    reservation=name,
                    error=str(exc),
                )
                continue
            existing.discard(name)
            metrics.RESERVATION_CHANGES.labels(cluster, "delete", "ok").inc()
            log.info("syncer.reservation_deleted", cluster=cluster, reservation=name)
        view.reservations = {name for name in existing if name.startswith(RESERVATION_PREFIX)}

    # --- drain commands ----------------------------------------------------------------------

    async def handle_command(self, command: SlurmNodeCommand, delivery: Delivery) -> None:
        """Apply a SlurmNodeCommand (the durable consumer's handler)."""
        view = self.clusters.get(command.cluster)
        if view is None:
            raise PermanentError(f"this syncer does not manage Slurm cluster {command.cluster!r}")
        # From the read it decides on to its update, no other update of the node runs.
        async with self._node_updating(command.cluster, command.node):
            await self._apply_command(view, command)
        key_pods = [
            key
            for key, pod in self._pods.items()
            if key.endswith(f".{command.node}") and nodeset_of(pod) is not None
        ]
        self._mark_dirty(key_pods)

    async def _apply_command(self, view: ClusterView, command: SlurmNodeCommand) -> None:
        try:
            async with self._slurm_slots:
                requested_at = time.monotonic()
                raw = await view.client.get_node(command.node)
        except SlurmError as exc:
            # Unreachable, refused or garbled: the command waits for Slurm to answer properly.
            raise RetryableError(str(exc)) from exc
        if raw is None:
            raise PermanentError(f"Slurm cluster {command.cluster} has no node {command.node}")
        try:
            state = parse_node(command.cluster, raw, self._clock(), self.options.drain_reasons)
        except MalformedNode as exc:
            raise RetryableError(f"node {command.node} could not be read: {exc}") from exc
        decision = decide_command(command, state, self.options.drain_reasons)
        log.info(
            "syncer.command",
            cluster=command.cluster,
            node=command.node,
            op=command.op,
            sender=command.sender,
            verdict=decision.verdict,
            why=decision.why,
        )
        if decision.verdict == "refuse":
            metrics.NODE_UPDATES.labels(command.cluster, command.op, "command", "refused").inc()
            raise PermanentError(f"{command.op} {command.cluster}/{command.node}: {decision.why}")
        if decision.verdict == "noop":
            await self._record_node(command.cluster, command.node, raw, requested_at)
            return
        try:
            await self._update_node(command.cluster, command.node, command.op, command.reason)
        except SlurmError as exc:
            metrics.NODE_UPDATES.labels(command.cluster, command.op, "command", "failed").inc()
            raise RetryableError(str(exc)) from exc
        metrics.NODE_UPDATES.labels(command.cluster, command.op, "command", "ok").inc()

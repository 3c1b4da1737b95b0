"""Wiring of maintenance-scheduler: KV views in, one round of decisions, commands out.

The service reads only KV (k8s_nodemaintenances, k8s_maintenanceoperatorconfigs, k8s_nodes,
k8s_pods from k8s-watcher; slurm_clusters from slurm-syncer, for the freshness of the Slurm
states projected on NodeSet pods) and acts only through `cmd.k8s.v1.*` commands. One replica
is active (leader lease). A round runs on every change of those views (debounced), on a
timeout a request is waiting for, and at least every `resync_seconds`.

Every command goes through the command ledger (`nodeflow_bus.ledger`, protocol in
`nodeflow_contracts.ledger`). A request's Scheduled write holds its `maintenance-slot:<uid>`
there: the request counts as scheduled (it takes one of maxParallelOperations) until KV
shows it past Pending, its outcome says the write can never land, or the write can no longer
land (its deadline plus the landing margin). A new leader rebuilds the ledger from the
streams before its first round, so an earlier leader's scheduling still in flight keeps its
slot across the handover. What else it keeps in memory is an optimisation, never a source of
truth: which evictions are in flight (so a pod is not evicted again while k8s-watcher retries
a PodDisruptionBudget refusal) and which commands it has just sent, each ending on the
command's outcome or after `in_flight_timeout_seconds`; after a restart, the same state
yields the same idempotency keys, so nothing is applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from maintenance_scheduler import SERVICE, metrics
from maintenance_scheduler.actions import ConfigEvent, Decision, EvictPod, SetStatus
from maintenance_scheduler.api import (
    CONFIG_NAME,
    PENDING,
    PHASES,
    SCHEDULED,
    NodeMaintenance,
    OperatorConfig,
    config_warnings,
    parse_node_maintenance,
    parse_operator_config,
)
from maintenance_scheduler.commands import (
    COMMAND_LIFETIME_SECONDS,
    SENDER,
    commands_for,
    decision_message,
)
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.pods import PodFacts, kept_pod_facts, with_fresh_slurm
from maintenance_scheduler.reconcile import (
    NodeFacts,
    Step,
    garbage_collect,
    reconcile_request,
    set_phase,
)
from maintenance_scheduler.scheduler import (
    NodeInfo,
    ScheduleResult,
    names_absent_past_grace,
    pending_messages,
    schedule,
    track_absences,
)
from maintenance_scheduler.skyhook.service import SkyhookController
from nodeflow_bus import Bus, KVView, LeaderLease, OutgoingMessage
from nodeflow_bus.leader_loop import LeaderLoop, run_round
from nodeflow_bus.ledger import LedgerSender, Sending
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand
from nodeflow_contracts.ledger import LedgerEntry, maintenance_slot
from nodeflow_contracts.maintenance import MaintenanceDecision
from nodeflow_contracts.pod_protocol import NODE_CORDON_REASON_ANNOTATION
from nodeflow_contracts.skyhook import FLAVORS
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeflow_contracts.topology import SLURM_CLUSTERS_BUCKET
from nodeflow_kube.fields import (
    condition,
    mapping,
    meta,
)
from nodeflow_runtime.service import ServiceContext

log = structlog.get_logger("maintenance_scheduler")

LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "error": logging.ERROR}
# A garbage-collection delete is sent again at most this often (the reference collects every
# five minutes): one refused by k8s-watcher's policy must not be re-sent every round.
GC_RESEND_SECONDS = 300.0

Obj = dict[str, Any]
APPLIED = frozenset({"applied", "already-applied"})


@dataclass
class Eviction:
    attempt: int
    sent_at: float
    key: str
    outcome: str | None = None
    retry_at: float = 0.0


@dataclass
class Stats:
    rounds: int = 0
    commands: int = 0
    decisions: int = 0
    evictions: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    last_schedule: ScheduleResult | None = None


def next_eviction_attempt(
    eviction: Eviction | None, now: float, in_flight_timeout: float
) -> int | None:
    """The attempt number of the eviction to send now, or None: never a second one while one
    is in flight (k8s-watcher retries a PodDisruptionBudget's 429 itself) or applied and not
    yet visible; after a refusal, the next attempt once its backoff has passed."""
    if eviction is None:
        return 0
    if eviction.outcome is None or eviction.outcome in APPLIED:
        if now - eviction.sent_at <= in_flight_timeout:
            return None
        return eviction.attempt + 1
    if now < eviction.retry_at:
        return None
    return eviction.attempt + 1


# Either flavor's persistent cordon mark (runtimeRequiredCordonAfter, S57).
RUNTIME_REQUIRED_CORDON_MARKS: Final = tuple(
    names.runtime_required_cordon_annotation for names in FLAVORS
)


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    metadata = meta(node)
    ready = condition(node, "Ready")
    return NodeFacts(
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        unschedulable=bool(mapping(node.get("spec")).get("unschedulable")),
        # No Ready condition counts as ready, as upstream.
        ready=ready is None or ready.get("status") == "True",
        cordon_reason=str(
            mapping(metadata.get("annotations")).get(NODE_CORDON_REASON_ANNOTATION) or ""
        ),
        runtime_required_cordon=any(
            key in RUNTIME_REQUIRED_CORDON_MARKS for key in mapping(metadata.get("annotations"))
        ),
    )


def node_fields(node: dict[str, Any]) -> dict[str, Any]:
    """The node as this controller keeps it in its view: only what `node_facts` reads."""
    metadata = meta(node)
    annotations = mapping(metadata.get("annotations"))
    kept = (NODE_CORDON_REASON_ANNOTATION, *RUNTIME_REQUIRED_CORDON_MARKS)
    ready = condition(node, "Ready")
    return {
        "metadata": {
            "name": metadata.get("name"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
            "annotations": {k: annotations[k] for k in kept if annotations.get(k) is not None},
        },
        "spec": {"unschedulable": mapping(node.get("spec")).get("unschedulable")},
        "status": {"conditions": [] if ready is None else [dict(ready)]},
    }


def _scheduled_steps(result: ScheduleResult, now: float) -> list[Step]:
    """Each request the schedule admitted: Scheduled, with the budgets it was admitted under."""
    steps: list[Step] = []
    message = (
        f"scheduled: {result.slots} slots, {result.can_become_unavailable} nodes may "
        "become unavailable"
    )
    for request in result.scheduled:
        step = Step()
        set_phase(step, request, SCHEDULED, now)
        step.decisions.append(
            Decision(request, "scheduled", "Scheduled", message, node=request.node_name)
        )
        steps.append(step)
    return steps


class MaintenanceScheduler:
    def __init__(self, bus: Bus, config: MaintenanceSchedulerConfig) -> None:
        self.bus = bus
        self.config = config
        self.requests: KVView[Obj] = KVView(bus, "k8s_nodemaintenances", dict)
        self.configs: KVView[Obj] = KVView(bus, "k8s_maintenanceoperatorconfigs", dict)
        self.nodes: KVView[Obj] = KVView(bus, "k8s_nodes", dict, project=node_fields)
        self.pods = KVView.projected(bus, "k8s_pods", dict, kept_pod_facts)
        self.clusters: KVView[SlurmClusterStatus] = KVView(
            bus, SLURM_CLUSTERS_BUCKET, SlurmClusterStatus
        )
        self.views: tuple[KVView[Any], ...] = (
            self.requests,
            self.configs,
            self.nodes,
            self.pods,
            self.clusters,
        )
        self.lease = LeaderLease(
            bus, SERVICE, holder=config.instance_id or None, ttl=config.leader_lease_ttl_seconds
        )
        self._wake = asyncio.Event()
        self._pods_on: dict[str, dict[str, PodFacts]] = {}  # node -> pod key -> pod
        self._operator_config = OperatorConfig()
        self._config_seen: Obj | None = None
        # Warning Events about the config version last seen, sent with the next round.
        self._config_events: list[ConfigEvent] = []
        self.ledger = LedgerSender(
            bus,
            ledger=SERVICE,
            sender=SENDER,
            max_lifetime=COMMAND_LIFETIME_SECONDS,
            on_outcome=self._on_outcome,
            leading=lambda: self.lease.is_leader,
        )
        self.ledger.on_ready = self._wake.set
        self._evictions: dict[str, Eviction] = {}  # pod uid -> eviction in flight
        self._by_key: dict[str, tuple[str, str]] = {}  # idempotency key -> (what, uid)
        self._sent: dict[str, float] = {}  # command key / decision id -> sent at
        self._skip_memo: dict[str, str] = {}  # request uid -> last skip message published
        self._phase_seen: dict[str, tuple[str, float]] = {}  # uid -> (phase, since)
        self._parse_cache: dict[str, tuple[str, NodeMaintenance]] = {}  # key -> (rv, parsed)
        self._gc_sent: dict[str, float] = {}  # request uid -> when its GC delete was sent
        # Node name -> when this replica first saw it absent from the view while a request
        # names it. In memory on purpose: it only delays the destructive step (a slot freed,
        # a finalizer dropped); after a restart or a change of leader the grace starts again,
        # which fails closed.
        self._absent_since: dict[str, float] = {}
        self._wake_at: float | None = None
        self._leader_loop = LeaderLoop(
            bus,
            self.lease,
            self.views,
            outcomes_subject=subjects.K8S_OUTCOMES,
            on_outcome=self.ledger.handle_outcome,
            on_leadership=self._on_leadership,
            loop=self._run,
            name="maintenance-scheduler loop",
        )
        self.stats = Stats()

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.pods.add_listener(self._on_pod)
        for view in self.views:
            if view is not self.pods:
                view.add_listener(self._on_change)
        await self._leader_loop.start()

    async def watch(self) -> None:
        """Raises once the decision loop ended without `stop()` (the process then exits)."""
        await self._leader_loop.watch()

    async def stop(self, grace: float = 5.0) -> None:
        await self._leader_loop.stop()
        await self.ledger.stop()

    def views_ready(self) -> bool:
        return all(v.ready.is_set() for v in self.views)

    def not_ready_reason(self) -> str | None:
        return None if self.views_ready() else "KV views loading"

    # --- change listeners ----------------------------------------------------------------------

    def _on_change(self, key: str, old: Any, new: Any) -> None:
        self._wake.set()

    def _on_pod(self, key: str, old: PodFacts | None, new: PodFacts | None) -> None:
        for pod, adding in ((old, False), (new, True)):
            if pod is None:
                continue
            node = pod.node
            if not node:
                continue
            if adding:
                self._pods_on.setdefault(node, {})[key] = pod
            else:
                on_node = self._pods_on.get(node, {})
                on_node.pop(key, None)
                if not on_node:
                    self._pods_on.pop(node, None)
        self._wake.set()

    def _on_leadership(self, leader: bool) -> None:
        # The ledger is rebuilt before this replica decides as leader: an earlier leader's
        # schedulings that may still land keep their slots. Its evictions and sent commands
        # are deduplicated by key, so empty tables here only cost a few repeats.
        self.ledger.on_leadership(leader)
        self._evictions.clear()
        self._by_key.clear()
        self._sent.clear()
        # Absences seen before a pause in leadership may have ended meanwhile: start again.
        self._absent_since.clear()
        # A new leader tells again what it reads of the config (the same key: one Event).
        self._config_seen = None
        self._wake.set()

    def _on_outcome(self, outcome: CommandOutcome, entry: LedgerEntry | None) -> None:
        """An outcome of ours, decoded and already settled in the ledger (a Scheduled write
        that can never land has freed its slot there)."""
        metrics.OUTCOMES.labels(outcome.op, outcome.outcome).inc()
        self.stats.outcomes[outcome.outcome] = self.stats.outcomes.get(outcome.outcome, 0) + 1
        tracked = self._by_key.get(outcome.idempotency_key)
        if tracked is None:
            if outcome.outcome not in APPLIED and outcome.outcome != "retrying":
                # Not applied: the same state may decide the same command again.
                self._sent.pop(outcome.idempotency_key, None)
                # A conflict is routine (the object changed after the decision): decide again.
                report = log.info if outcome.outcome == "conflict" else log.warning
                report(
                    "command.refused",
                    key=outcome.idempotency_key,
                    op=outcome.op,
                    target=outcome.target.ordering_key,
                    outcome=outcome.outcome,
                    message=outcome.message,
                )
                self._wake.set()
            return
        what, uid = tracked
        now = time.time()
        if what == "evict":
            eviction = self._evictions.get(uid)
            if eviction is None or eviction.key != outcome.idempotency_key:
                return
            if outcome.outcome == "retrying":
                # k8s-watcher backs off (a PodDisruptionBudget said 429): still in flight.
                eviction.sent_at = now
                return
            eviction.outcome = outcome.outcome
            if outcome.outcome not in APPLIED:
                backoff = min(
                    self.config.eviction_retry_max_seconds,
                    self.config.eviction_retry_initial_seconds * 2**eviction.attempt,
                )
                eviction.retry_at = now + backoff
                log.info(
                    "eviction.refused",
                    pod=outcome.target.ordering_key,
                    outcome=outcome.outcome,
                    message=outcome.message,
                    retry_in=backoff,
                )
        self._wake.set()

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            timeout = self.config.resync_seconds
            if self._wake_at is not None:
                timeout = max(0.0, min(timeout, self._wake_at - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            if not self.lease.is_leader or not self.views_ready() or not self.ledger.ready:
                # A leader whose ledger is not rebuilt yet decides nothing: an earlier
                # leader's scheduling may still land (the ledger wakes the loop once rebuilt).
                if not self.lease.is_leader:
                    await asyncio.sleep(0.2)
                continue
            if self.config.debounce_seconds:
                await asyncio.sleep(self.config.debounce_seconds)
            self._wake.clear()
            started = time.perf_counter()
            # One bad round (a publish timeout) must not end the loop; the next retries.
            await run_round(lambda: self.round(time.time()), event="round.failed")
            metrics.ROUND_SECONDS.observe(time.perf_counter() - started)

    def operator_config(self) -> OperatorConfig:
        """The `default` config of the operator namespace; its last values while absent."""
        obj = self.configs.get(f"{self.config.operator_namespace}.{CONFIG_NAME}")
        if obj is not None and obj is not self._config_seen:
            self._config_seen = obj
            parsed = parse_operator_config(obj)
            if parsed != self._operator_config:
                log.info(
                    "operator_config.changed",
                    max_parallel_operations=str(parsed.max_parallel_operations),
                    max_unavailable=str(parsed.max_unavailable),
                    max_node_maintenance_time_seconds=parsed.max_node_maintenance_time_seconds,
                    problems=list(parsed.problems),
                )
            self._operator_config = parsed
            metadata = meta(obj)
            self._config_events = [
                ConfigEvent(
                    namespace=str(metadata.get("namespace") or ""),
                    name=str(metadata.get("name") or ""),
                    uid=str(metadata.get("uid") or ""),
                    resource_version=str(metadata.get("resourceVersion") or ""),
                    reason=reason,
                    message=message,
                )
                for reason, message in config_warnings(parsed)
            ]
            for event in self._config_events:
                log.warning("operator_config.warning", reason=event.reason, message=event.message)
            # The config's logLevel (debug, info, error) sets this service's own loggers, as
            # it sets the reference operator's.
            logging.getLogger("maintenance_scheduler").setLevel(LOG_LEVELS[parsed.log_level])
        return self._operator_config

    def _pods_of(self, node: str, now: float) -> list[PodFacts]:
        return [self._with_fresh_slurm(p, now) for p in self._pods_on.get(node, {}).values()]

    def _with_fresh_slurm(self, pod: PodFacts, now: float) -> PodFacts:
        return with_fresh_slurm(
            pod, self.clusters.as_dict(), now, self.config.slurm_state_max_age_seconds or None
        )

    async def round(self, now: float) -> None:
        """One round, in phases: the requests and nodes read; the budgets' schedule; the
        Scheduled writes; every other request reconciled one step; garbage collection; the
        round's gauges; then every step sent."""
        self.stats.rounds += 1
        config = self.operator_config()
        requests = self._parsed_requests()
        by_uid = {r.uid: r for r in requests}
        self._observe_phases(requests, now)
        scheduling = self._scheduling(by_uid, now)
        seen = [
            dataclasses.replace(r, phase=SCHEDULED) if r.uid in scheduling else r for r in requests
        ]
        nodes = {name.partition(".")[2]: obj for name, obj in self.nodes.items()}
        facts = {name: node_facts(obj) for name, obj in nodes.items()}
        infos = {
            name: NodeInfo(name=name, unschedulable=f.unschedulable, ready=f.ready, uid=f.uid)
            for name, f in facts.items()
        }
        self._absent_since = track_absences(
            self._absent_since, {r.node_name for r in requests}, facts.keys(), now
        )
        gone_nodes = names_absent_past_grace(
            self._absent_since, now, self.config.node_gone_grace_seconds
        )
        result = schedule(infos, seen, config, absent_past_grace=gone_nodes)
        self.stats.last_schedule = result
        self._report_schedule(result)

        steps: list[Step] = []
        if self._config_events:
            steps.append(Step(actions=list(self._config_events)))
            self._config_events = []
        steps.extend(_scheduled_steps(result, now))
        skip = {r.uid for r in result.scheduled} | scheduling
        reconciled = self._reconcile_each(
            [r for r in requests if r.uid not in skip],
            requests,
            facts,
            gone_nodes,
            pending_messages(result),
            now,
        )
        steps.extend(reconciled)
        wake_at = min((s.wake_at for s in reconciled if s.wake_at is not None), default=None)
        gc_due = self._garbage_collect(requests, config, now, steps)
        if gc_due is not None:
            wake_at = gc_due if wake_at is None else min(wake_at, gc_due)
        self._wake_at = wake_at
        drains = [s for s in reconciled if s.drain is not None]
        metrics.DRAIN_PODS_REMAINING.set(sum(len(s.drain.to_go) for s in drains if s.drain))
        metrics.DRAIN_PODS_WAITING_FOR_SLURM.set(
            sum(len(s.drain.waiting_for_slurm) for s in drains if s.drain)
        )
        metrics.DRAINS_TIMED_OUT.set(sum(int(s.drain_timed_out) for s in drains))
        self._forget_gone(by_uid, now)
        await self._send(steps, now)

    def _reconcile_each(
        self,
        due: Sequence[NodeMaintenance],
        requests: Sequence[NodeMaintenance],
        facts: Mapping[str, NodeFacts],
        gone_nodes: AbstractSet[str],
        waiting_for: Mapping[str, str],
        now: float,
    ) -> list[Step]:
        """One step of each request in `due` (every request but those scheduled this round
        or whose Scheduled write may still land); `waiting_for`: what holds each Pending
        request the scheduler skipped (its Ready message)."""
        on_node: dict[str, list[NodeMaintenance]] = {}
        for request in requests:
            on_node.setdefault(request.node_name, []).append(request)
        steps: list[Step] = []
        for request in due:
            node = facts.get(request.node_name)
            pods = (
                self._pods_of(request.node_name, now)
                if node is not None and request.phase in ("WaitForPodCompletion", "Draining")
                else []
            )
            try:
                step = reconcile_request(
                    request,
                    node,
                    pods,
                    on_node.get(request.node_name, []),
                    now,
                    absent_past_grace=request.node_name in gone_nodes,
                    waiting_for=waiting_for.get(request.uid, ""),
                )
            except Exception:
                # One odd object must not stop every other request's progress.
                log.exception("request.reconcile_failed", request=request.key)
                continue
            steps.append(step)
        return steps

    def _garbage_collect(
        self,
        requests: Sequence[NodeMaintenance],
        config: OperatorConfig,
        now: float,
        steps: list[Step],
    ) -> float | None:
        """The Ready requests past maxNodeMaintenanceTimeSeconds deleted (each resent no
        sooner than GC_RESEND_SECONDS), appended to `steps`; when the next one falls due."""
        collected, gc_due = garbage_collect(requests, config, now)
        collected = [
            d for d in collected if now - self._gc_sent.get(d.request.uid, 0.0) >= GC_RESEND_SECONDS
        ]
        for deletion in collected:
            self._gc_sent[deletion.request.uid] = now
        if collected:
            gc_step = Step(actions=list(collected))
            for deletion in collected:
                gc_step.decisions.append(
                    Decision(
                        deletion.request,
                        "garbage-collect",
                        "GarbageCollected",
                        "Ready for longer than maxNodeMaintenanceTimeSeconds "
                        f"({config.max_node_maintenance_time_seconds}s)",
                    )
                )
            steps.append(gc_step)
        return gc_due

    def _scheduling(self, by_uid: Mapping[str, NodeMaintenance], now: float) -> set[str]:
        """The Pending requests whose Scheduled write (this leader's or an earlier one's)
        may still land: they count as scheduled. A write counts until KV shows the request
        past Pending (or gone), its outcome says it can never land, or it can no longer land
        (the ledger: k8s-watcher retries it -- a 429, a 5xx, no answer -- until its deadline,
        and a request sent just before may land a request timeout later). Forgetting it
        sooner would let a second request take the same slot and exceed
        maxParallelOperations once both land."""
        ledger = self.ledger.ledger

        prefix = maintenance_slot("")

        def shown(entry: LedgerEntry, outcome: str, rv: str | None) -> bool:
            for slot in entry.slots:
                request = by_uid.get(slot[len(prefix) :]) if slot.startswith(prefix) else None
                if request is not None and request.phase == PENDING:
                    return False
            return True

        ledger.release_seen(shown)
        ledger.expire(now)
        held = ledger.held(now)
        return {
            uid
            for uid, request in by_uid.items()
            if request.phase == PENDING and maintenance_slot(uid) in held
        }

    def _parsed_requests(self) -> list[NodeMaintenance]:
        """Every request, parsed once per resourceVersion (a round at 2,000 requests would
        spend most of its time parsing the same objects again)."""
        parsed: dict[str, tuple[str, NodeMaintenance]] = {}
        for key, obj in self.requests.items():
            rv = str(meta(obj).get("resourceVersion") or "")
            cached = self._parse_cache.get(key)
            if cached is not None and cached[0] == rv and rv:
                parsed[key] = cached
            else:
                try:
                    parsed[key] = (rv, parse_node_maintenance(obj))
                except Exception:
                    log.exception("request.unreadable", key=key)
        self._parse_cache = parsed
        return [request for _, request in parsed.values()]

    def _observe_phases(self, requests: list[NodeMaintenance], now: float) -> None:
        counts = Counter(r.phase or "New" for r in requests)
        for phase in ("New", *PHASES):
            metrics.REQUESTS.labels(phase).set(counts.get(phase, 0))
        current: dict[str, tuple[str, float]] = {}
        for request in requests:
            since = request.phase_since or now
            previous = self._phase_seen.get(request.uid)
            if previous is not None and previous[0] != request.phase and previous[0]:
                metrics.PHASE_SECONDS.labels(previous[0]).observe(max(0.0, since - previous[1]))
            current[request.uid] = (request.phase, since)
        self._phase_seen = current

    def _report_schedule(self, result: ScheduleResult) -> None:
        metrics.SLOTS.set(result.slots)
        metrics.CAN_BECOME_UNAVAILABLE.set(result.can_become_unavailable)
        metrics.UNAVAILABLE_NODES.set(result.unavailable_nodes)
        metrics.SCHEDULED.inc(len(result.scheduled))
        for skipped in result.skipped:
            metrics.SKIPPED.labels(skipped.reason).inc()

    def _forget_gone(self, by_uid: Mapping[str, NodeMaintenance], now: float) -> None:
        live_pods = {p.uid for on in self._pods_on.values() for p in on.values()}
        for uid in [u for u in self._evictions if u not in live_pods]:
            eviction = self._evictions.pop(uid)
            self._by_key.pop(eviction.key, None)
        for memo in (self._skip_memo, self._gc_sent):
            for uid in [u for u in memo if u not in by_uid]:
                memo.pop(uid, None)
        horizon = now - self.config.in_flight_timeout_seconds
        for key in [k for k, at in self._sent.items() if at < horizon]:
            self._sent.pop(key, None)

    # --- sending -----------------------------------------------------------------------------

    def _eviction_attempt(self, pod: PodFacts, now: float) -> int | None:
        return next_eviction_attempt(
            self._evictions.get(pod.uid), now, self.config.in_flight_timeout_seconds
        )

    async def _send(self, steps: list[Step], now: float) -> None:
        sendings: list[Sending] = []
        messages: list[OutgoingMessage] = []

        def add_command(command: K8sCommand, *slots: str) -> None:
            sendings.append(Sending(command, slots))

        def add_decision(decision: MaintenanceDecision) -> None:
            if decision.decision_id in self._sent:
                return
            self._sent[decision.decision_id] = now
            messages.append(
                OutgoingMessage(
                    subject=decision.subject, message=decision, msg_id=decision.decision_id
                )
            )
            self.stats.decisions += 1
            log.info(
                "maintenance.decision",
                request=f"{decision.namespace}/{decision.name}",
                kind=decision.kind,
                reason=decision.reason,
                node=decision.node,
                pod=decision.pod,
                message=decision.message,
            )

        for step in steps:
            evicted: set[str] = set()
            for action in step.actions:
                if isinstance(action, EvictPod):
                    attempt = self._eviction_attempt(action.pod, now)
                    if attempt is None:
                        continue
                    [command] = commands_for(action, now, eviction_attempt=attempt)
                    if attempt == 0 and command.idempotency_key in self._sent:
                        continue
                    self._evictions[action.pod.uid] = Eviction(
                        attempt=attempt, sent_at=now, key=command.idempotency_key
                    )
                    self._by_key[command.idempotency_key] = ("evict", action.pod.uid)
                    self._sent[command.idempotency_key] = now
                    evicted.add(action.pod.key)
                    metrics.EVICTIONS.inc()
                    self.stats.evictions += 1
                    add_command(command)
                    continue
                for command in commands_for(action, now):
                    if command.idempotency_key in self._sent:
                        continue
                    self._sent[command.idempotency_key] = now
                    if isinstance(action, SetStatus) and action.phase_change == (
                        PENDING,
                        SCHEDULED,
                    ):
                        # It takes a maxParallelOperations slot until the ledger frees it.
                        add_command(command, maintenance_slot(action.request.uid))
                        continue
                    add_command(command)
                if step.drain_timed_out and isinstance(action, SetStatus):
                    message = str(
                        (condition({"status": action.status}, "Ready") or {}).get("message")
                    )
                    if message.startswith("drain timed out") and not (
                        action.request.ready_message.startswith("drain timed out")
                    ):
                        metrics.DRAIN_TIMEOUTS.inc()
            for decision in step.decisions:
                if decision.kind == "evict" and decision.pod not in evicted:
                    continue
                basis = decision.message if decision.kind != "evict" else ""
                add_decision(decision_message(decision, now, basis))
        self._skipped_decisions(now, add_decision)
        self.stats.commands += len(messages) + len(sendings)
        metrics.MESSAGES.inc(len(messages) + len(sendings))
        if sendings or messages:
            await self.ledger.send(sendings, messages, publish_window=self.config.publish_window)

    def _skipped_decisions(self, now: float, add: Any) -> None:
        """One decision per request each time the reason it waits changes."""
        result = self.stats.last_schedule
        if result is None:
            return
        for skipped in result.skipped:
            if skipped.reason == "node-not-found":
                continue  # the request's own status and Event say it
            uid = skipped.request.uid
            if self._skip_memo.get(uid) == skipped.message:
                continue
            self._skip_memo[uid] = skipped.message
            decision = Decision(
                skipped.request,
                "skipped",
                skipped.reason,
                skipped.message,
                node=skipped.request.node_name,
            )
            add(decision_message(decision, now, skipped.message))
        for request in result.scheduled:
            self._skip_memo.pop(request.uid, None)


async def setup(ctx: ServiceContext[MaintenanceSchedulerConfig]) -> None:
    scheduler = MaintenanceScheduler(ctx.bus, ctx.config)
    ctx.health.add_check("kv", scheduler.not_ready_reason)
    await scheduler.start()
    ctx.on_stop(scheduler.stop)
    ctx.spawn(scheduler.watch(), name="maintenance-scheduler loop watch")
    if ctx.config.skyhook_enabled:
        # The second controller: Skyhook packages, whose interrupts go through the first.
        skyhook = SkyhookController(ctx.bus, ctx.config)
        ctx.health.add_check("skyhook-kv", skyhook.not_ready_reason)
        await skyhook.start()
        ctx.on_stop(skyhook.stop)
        ctx.spawn(skyhook.watch(), name="skyhook loop watch")

"""Wiring of topology-placer: KV views in, one planning pass, commands/decisions/Events out.

The placer reads only KV (k8s_pods, k8s_nodes, k8s_podgroups, k8s_clusternetworktopologies,
k8s_poddisruptionbudgets, k8s_persistentvolumeclaims, k8s_persistentvolumes from k8s-watcher)
and acts only through `cmd.k8s.v1.*` commands. One replica is active (leader lease). The
reservations are the pods' nominations, in Kubernetes, and the plan is re-derived from KV on
every pass. What may still land is the command ledger's (`nodeflow_bus.ledger`, slots in
`inflight.py`): a pod's command holds the pod (and a nomination or bind its gang) until its
outcome says it never lands, or it applied and KV shows its effect (or
`in_flight_timeout_seconds` has passed since it was sent), or its deadline plus the landing
margin has passed. The plan reads what is held (`InFlight`), so no pod is nominated on a view
that lacks its previous command's effect, and a new leader, which rebuilds the ledger before its
first pass, leaves an earlier leader's gangs alone until their commands have landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import Counter as Tally
from typing import Any, get_args

import msgspec
import structlog

from nodeflow_bus import Bus, KVView, LeaderLease, OutgoingMessage
from nodeflow_bus.leader_loop import LeaderLoop, run_round
from nodeflow_bus.ledger import LedgerSender, Sending, log_refused
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_contracts.ledger import LedgerEntry
from nodeflow_contracts.topology import WORKLOAD_POD_GROUP_MIRROR
from nodeflow_kube.fields import resource_version_of, resource_version_reached
from nodeflow_runtime.service import ServiceContext
from topology_placer import SERVICE, metrics
from topology_placer.commands import COMMAND_LIFETIME_SECONDS, SENDER, Outgoing, to_outgoing
from topology_placer.config import TopologyPlacerConfig
from topology_placer.gang import GroupKey, pod_group_of
from topology_placer.inflight import POD_PREFIX, STATUS_PREFIX, in_flight_of, slots_of
from topology_placer.planner import Action, ClusterState, GangState, Plan, plan
from topology_placer.pods import placement_fields, placement_node_fields
from topology_placer.volumes import claim_fields, storage_class_fields, volume_fields

log = structlog.get_logger("topology_placer")

Obj = dict[str, Any]

# The Workload API's PodGroups (scheduling.k8s.io), beside scheduler-plugins' k8s_podgroups.
WORKLOAD_POD_GROUPS = subjects.k8s_bucket(WORKLOAD_POD_GROUP_MIRROR)
BUCKETS = (
    "k8s_pods",
    "k8s_nodes",
    "k8s_podgroups",
    WORKLOAD_POD_GROUPS,
    "k8s_clusternetworktopologies",
    "k8s_poddisruptionbudgets",
    "k8s_persistentvolumeclaims",
    "k8s_persistentvolumes",
    "k8s_storageclasses",
)
GANG_STATES: tuple[GangState, ...] = get_args(GangState)
# Kinds whose KV view shows what a status write (or a claim's selected-node annotation) did:
# an applied one is released once seen, so it is not sent again before.
STATUS_BUCKETS = {
    "PodGroup": "k8s_podgroups",
    "ClusterNetworkTopology": "k8s_clusternetworktopologies",
    "PersistentVolumeClaim": "k8s_persistentvolumeclaims",
}
# Slots one command of a pass takes for itself (a pod, a status).
EXCLUSIVE_PREFIXES = (POD_PREFIX, STATUS_PREFIX)
# The shortest wait for a wake-up when a held command's landing bound has passed.
MIN_WAIT_SECONDS = 0.1
# Refusal counts kept for this many idempotency keys at most.
MAX_SALTED_KEYS = 100_000
# How often the long-lived heap is collected whole and frozen again (freeze_long_lived_heap).
HEAP_REFREEZE_SECONDS = 300.0


def freeze_long_lived_heap() -> None:
    """Collect every generation, then move what is alive into the collector's permanent
    generation (gc.freeze), where no collection scans it.

    Why: the placer's process holds its whole cluster view (every pod and node of the KV
    views, and the facts memoised from them) for as long as it runs, and a pass allocates
    enough (a preemption pass over a full cluster of 16,384 nodes: a victim unit per pod) to
    set off full collections that walk all of it, to free nothing: a third of such a pass's
    CPU. Frozen, it is still freed by reference counting when a view drops an object; only
    a reference cycle frozen while alive and dropped later waits for the next refreeze (the
    unfreeze and full collection here, every HEAP_REFREEZE_SECONDS)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class TopologyPlacer:
    def __init__(
        self, bus: Bus, config: TopologyPlacerConfig, *, freeze_heap: bool = False
    ) -> None:
        self.bus = bus
        self.config = config
        # The service's own process freezes its long-lived heap after a pass over loaded
        # views (freeze_long_lived_heap); a placer sharing a process (tests, the in-process
        # benchmark stack) leaves the process's collector alone.
        self.freeze_heap = freeze_heap
        self.heap_frozen_at: float | None = None
        # Pods and nodes are kept as far as a placement reads them: every pod of the cluster
        # is in this view.
        projections = {
            "k8s_pods": placement_fields,
            "k8s_nodes": placement_node_fields,
            "k8s_persistentvolumeclaims": claim_fields,
            "k8s_persistentvolumes": volume_fields,
            "k8s_storageclasses": storage_class_fields,
        }
        self.views: dict[str, KVView[Obj]] = {
            bucket: KVView(bus, bucket, dict, project=projections.get(bucket)) for bucket in BUCKETS
        }
        self.lease = LeaderLease(
            bus, SERVICE, holder=config.instance_id or None, ttl=config.leader_lease_ttl_seconds
        )
        self.ledger = LedgerSender(
            bus,
            ledger=SERVICE,
            sender=SENDER,
            max_lifetime=COMMAND_LIFETIME_SECONDS,
            on_outcome=self._on_outcome,
            leading=lambda: self.lease.is_leader,
        )
        # Commands refused before: the count goes into a repeat's key ("<key>~<n>").
        self.salt: dict[str, int] = {}
        self.outcomes: Tally[str] = Tally()
        self.passes = 0
        self.last_plan: Plan | None = None
        self._wake = asyncio.Event()
        self.ledger.on_ready = self._wake.set
        self._leader_loop = LeaderLoop(
            bus,
            self.lease,
            tuple(self.views.values()),
            outcomes_subject=subjects.K8S_OUTCOMES,
            on_outcome=self.ledger.handle_outcome,
            on_leadership=self._on_leadership,
            loop=self._run,
            name="topology-placer loop",
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        for view in self.views.values():
            view.add_listener(self._on_change)
        await self._leader_loop.start()

    async def watch(self) -> None:
        """Raises once the decision loop ended without `stop()` (the process then exits)."""
        await self._leader_loop.watch()

    async def stop(self, grace: float = 5.0) -> None:
        await self._leader_loop.stop()
        await self.ledger.stop()

    def views_ready(self) -> bool:
        return all(view.ready.is_set() for view in self.views.values())

    def not_ready_reason(self) -> str | None:
        return None if self.views_ready() else "KV views loading"

    # --- inputs ------------------------------------------------------------------------------

    def _on_change(self, key: str, old: Obj | None, new: Obj | None) -> None:
        self._wake.set()

    def _on_leadership(self, leader: bool) -> None:
        # The ledger is rebuilt from the streams before this replica plans as leader: it then
        # holds whatever an earlier leader sent that may still land.
        self.ledger.on_leadership(leader)
        self._wake.set()

    def _on_outcome(self, outcome: CommandOutcome, entry: LedgerEntry | None) -> None:
        """An outcome of ours, decoded and already settled in the ledger."""
        if outcome.outcome == "retrying":
            return
        self.outcomes[outcome.outcome] += 1
        metrics.OUTCOMES.labels(outcome.outcome).inc()
        if outcome.outcome not in ("applied", "already-applied"):
            # A refused command (a bind to a node that went away, a stale nomination) is
            # re-planned from the state as it is now. If the new plan is the same command, it
            # needs a new key: JetStream would drop a repeat of the refused one as a duplicate.
            base = outcome.idempotency_key.split("~", 1)[0]
            self.salt[base] = self.salt.get(base, 0) + 1
            log_refused(outcome)
        self._wake.set()

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            timeout = self.config.resync_seconds
            expiry = self.ledger.ledger.next_expiry()
            if expiry is not None:
                # Wake when a held command can no longer land: its gang is planned again (not
                # at once over and over while a pass cannot drop it: not leading, not ready).
                timeout = max(MIN_WAIT_SECONDS, min(timeout, expiry - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            if not self.lease.is_leader or not self.views_ready() or not self.ledger.ready:
                # A leader whose ledger is not rebuilt yet plans nothing: it may not know an
                # earlier leader's commands (the ledger wakes the loop once rebuilt).
                if not self.lease.is_leader:
                    await asyncio.sleep(0.2)
                continue
            if self.config.debounce_seconds:
                await asyncio.sleep(self.config.debounce_seconds)
                self._wake.clear()
            # One bad pass (a publish timeout) must not end the service: the next pass
            # re-derives everything from KV.
            await run_round(self.run_pass, event="placer.pass_failed")

    def state(self, now: float) -> ClusterState:
        def values(bucket: str) -> list[Obj]:
            return [value for _, value in self.views[bucket].items()]

        return ClusterState(
            nodes=values("k8s_nodes"),
            pods=values("k8s_pods"),
            pod_groups=values("k8s_podgroups"),
            topologies=values("k8s_clusternetworktopologies"),
            budgets=values("k8s_poddisruptionbudgets"),
            claims=values("k8s_persistentvolumeclaims"),
            volumes=values("k8s_persistentvolumes"),
            storage_classes=values("k8s_storageclasses"),
            workload_pod_groups=values(WORKLOAD_POD_GROUPS),
            now=now,
            scheduler_names=frozenset(self.config.scheduler_names),
            in_flight=in_flight_of(self.ledger.ledger.held(now)),
        )

    def _effect_seen(self, entry: LedgerEntry, rv: str | None, now: float) -> bool:
        """Does KV show what an applied command did (so what it held is free again)?"""
        if now - entry.sent_at > self.config.in_flight_timeout_seconds:
            log.info("command.in_flight_expired", key=entry.idempotency_key)
            return True
        target = entry.target
        bucket = "k8s_pods" if target.kind == "Pod" else STATUS_BUCKETS.get(target.kind)
        if bucket is None or not rv:
            return True
        current = self.views[bucket].get(subjects.object_key(target.namespace, target.name))
        if current is None:
            return True  # deleted: nothing of it is left to see
        return resource_version_reached(resource_version_of(current), rv)

    async def run_pass(self) -> Plan:
        now = time.time()
        ledger = self.ledger.ledger
        ledger.release_seen(lambda entry, _, rv: self._effect_seen(entry, rv, now))
        ledger.expire(now)
        started = time.perf_counter()
        result = plan(self.state(now))
        metrics.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
        self.passes += 1
        self.last_plan = result
        states: Tally[str] = Tally(result.gang_states.values())
        for state in GANG_STATES:
            metrics.GANGS.labels(state).set(states.get(state, 0))
        for attempt in result.attempts:
            metrics.ATTEMPTS.labels(attempt).inc()
        for layer, count in result.domains_by_layer.items():
            metrics.DOMAINS.labels(layer).set(count)
        await self.send(result.actions, now)
        if self.freeze_heap and (
            self.heap_frozen_at is None or now - self.heap_frozen_at >= HEAP_REFREEZE_SECONDS
        ):
            # After a pass (run only once every view is loaded): the views and the memoised
            # facts are in the heap then, and stay there.
            freeze_long_lived_heap()
            self.heap_frozen_at = now
        return result

    def _group_of(self, namespace: str | None, name: str) -> GroupKey | None:
        pod = self.views["k8s_pods"].get(subjects.object_key(namespace, name))
        return None if pod is None else pod_group_of(pod)

    async def send(self, actions: list[Action], now: float) -> None:
        """Send the plan's commands through the ledger. An action whose slots are held (a
        command on the same pod still on its way, this pass's included) is left for a later
        pass, which plans it from a view that shows that command's effect."""
        if len(self.salt) > MAX_SALTED_KEYS:
            self.salt.clear()
        held = self.ledger.ledger.held(now)
        taken: set[str] = set()
        sendings: list[Sending] = []
        messages: list[OutgoingMessage] = []
        for action in actions:
            outgoing = to_outgoing(action, now)
            planned: list[Sending] = []
            for out in outgoing:
                if out.command is not None:
                    command = out.command
                    group = None
                    if command.target.kind == "Pod":
                        group = self._group_of(command.target.namespace, command.target.name)
                    salt = self.salt.get(out.key, 0)
                    if salt:
                        command = msgspec.structs.replace(
                            command, idempotency_key=f"{out.key}~{salt}"
                        )
                    planned.append(Sending(command, slots_of(command, group)))
            slots = {slot for sending in planned for slot in sending.slots}
            # Within the pass only a pod (or a status) is one command's at a time: a gang's
            # members go out together.
            exclusive = {slot for slot in slots if slot.startswith(EXCLUSIVE_PREFIXES)}
            if any(slot in held for slot in slots) or not exclusive.isdisjoint(taken):
                continue
            taken |= exclusive
            sendings.extend(planned)
            messages.extend(self._decisions(outgoing))
        metrics.MESSAGES.inc(len(sendings) + len(messages))
        if sendings or messages:
            await self.ledger.send(sendings, messages, publish_window=self.config.publish_window)

    def _decisions(self, outgoing: list[Outgoing]) -> list[OutgoingMessage]:
        messages: list[OutgoingMessage] = []
        for out in outgoing:
            decision = out.decision
            if decision is None:
                continue
            messages.append(
                OutgoingMessage(
                    subject=decision.subject, message=decision, msg_id=decision.decision_id
                )
            )
            if decision.kind == "preempted":
                metrics.PREEMPTIONS.inc()
                metrics.VICTIMS.inc(len(decision.victims))
            log.info(
                "placement.decision",
                gang=",".join(decision.gang_group),
                kind=decision.kind,
                reason=decision.reason,
                domain=decision.domain,
                layer=decision.layer,
                message=decision.message,
                victims=list(decision.victims),
            )
        return messages


async def setup(ctx: ServiceContext[TopologyPlacerConfig]) -> None:
    placer = TopologyPlacer(ctx.bus, ctx.config, freeze_heap=True)
    ctx.health.add_check("kv", placer.not_ready_reason)
    await placer.start()
    ctx.on_stop(placer.stop)
    ctx.spawn(placer.watch(), name="topology-placer loop watch")

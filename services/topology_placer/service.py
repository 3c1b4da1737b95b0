"""Wiring of topology-placer: KV views in, one planning pass, commands/decisions/Events out.

The placer reads only KV (k8s_pods, k8s_nodes, k8s_podgroups, k8s_clusternetworktopologies,
k8s_poddisruptionbudgets from k8s-watcher) and acts only through `cmd.k8s.v1.*` commands.
One replica is active (leader lease). Nothing it keeps in memory is a source of truth: the
reservations are the pods' nominations, in Kubernetes, and the plan is re-derived from KV on
every pass. The `recently_sent` table only spares re-publishing a command whose effect has
not reached KV yet; every entry expires after `in_flight_timeout_seconds`, and a repeat is in
any case dropped by its idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter as Tally
from typing import Any

import msgspec
import structlog
from nats.aio.msg import Msg

from nodeflow_bus import Bus, KVView, LeaderLease, OutgoingMessage
from nodeflow_bus.leader_loop import LeaderLoop
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.codec import ContractDecodeError
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_runtime.service import ServiceContext
from topology_placer import SERVICE, metrics
from topology_placer.commands import SENDER, Outgoing, to_outgoing
from topology_placer.config import TopologyPlacerConfig
from topology_placer.planner import ClusterState, Plan, plan
from topology_placer.pods import placement_fields, placement_node_fields

log = structlog.get_logger("topology_placer")

Obj = dict[str, Any]

BUCKETS = (
    "k8s_pods",
    "k8s_nodes",
    "k8s_podgroups",
    "k8s_clusternetworktopologies",
    "k8s_poddisruptionbudgets",
)
GANG_STATES = ("bound", "binding", "nominated", "waiting", "unschedulable", "preempting", "invalid")


class TopologyPlacer:
    def __init__(self, bus: Bus, config: TopologyPlacerConfig) -> None:
        self.bus = bus
        self.config = config
        # Pods and nodes are kept as far as a placement reads them: every pod of the cluster
        # is in this view.
        projections = {"k8s_pods": placement_fields, "k8s_nodes": placement_node_fields}
        self.views: dict[str, KVView[Obj]] = {
            bucket: KVView(bus, bucket, dict, project=projections.get(bucket)) for bucket in BUCKETS
        }
        self.lease = LeaderLease(
            bus, SERVICE, holder=config.instance_id or None, ttl=config.leader_lease_ttl_seconds
        )
        self.recently_sent: dict[str, float] = {}
        # Commands refused before: the count goes into a repeat's key ("<key>~<n>").
        self.salt: dict[str, int] = {}
        self.outcomes: Tally[str] = Tally()
        self.passes = 0
        self.last_plan: Plan | None = None
        self._wake = asyncio.Event()
        self._leader_loop = LeaderLoop(
            bus,
            self.lease,
            tuple(self.views.values()),
            outcomes_subject=subjects.K8S_OUTCOMES,
            on_outcome=self._on_outcome,
            on_leadership=self._on_leadership,
            loop=self._run,
            name="topology-placer loop",
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        for view in self.views.values():
            view.add_listener(self._on_change)
        await self._leader_loop.start()

    async def stop(self, grace: float = 5.0) -> None:
        await self._leader_loop.stop()

    def views_ready(self) -> bool:
        return all(view.ready.is_set() for view in self.views.values())

    def not_ready_reason(self) -> str | None:
        return None if self.views_ready() else "KV views loading"

    # --- inputs ------------------------------------------------------------------------------

    def _on_change(self, key: str, old: Obj | None, new: Obj | None) -> None:
        self._wake.set()

    def _on_leadership(self, leader: bool) -> None:
        # What another replica sent is unknown here: its commands are deduped by key anyway.
        self.recently_sent.clear()
        self._wake.set()

    async def _on_outcome(self, msg: Msg) -> None:
        try:
            outcome = codec.decode(CommandOutcome, msg.data, subject=msg.subject)
        except ContractDecodeError:
            return
        if outcome.sender != SENDER or outcome.outcome == "retrying":
            return
        self.outcomes[outcome.outcome] += 1
        metrics.OUTCOMES.labels(outcome.outcome).inc()
        if outcome.outcome not in ("applied", "already-applied"):
            # A refused command (a bind to a node that went away, a stale nomination) is
            # re-planned from the state as it is now. If the new plan is the same command, it
            # needs a new key: JetStream would drop a repeat of the refused one as a duplicate.
            base = outcome.idempotency_key.split("~", 1)[0]
            self.recently_sent.pop(base, None)
            self.salt[base] = self.salt.get(base, 0) + 1
            log.info(
                "command.refused",
                key=outcome.idempotency_key,
                op=outcome.op,
                target=outcome.target.ordering_key,
                outcome=outcome.outcome,
                message=outcome.message,
            )
            self._wake.set()

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.resync_seconds)
            self._wake.clear()
            if not self.lease.is_leader or not self.views_ready():
                if not self.lease.is_leader:
                    await asyncio.sleep(0.2)
                continue
            if self.config.debounce_seconds:
                await asyncio.sleep(self.config.debounce_seconds)
                self._wake.clear()
            try:
                await self.run_pass()
            except Exception:
                # One bad pass (a publish timeout) must not end the service: the next pass
                # re-derives everything from KV.
                log.exception("placer.pass_failed")

    def state(self, now: float) -> ClusterState:
        def values(bucket: str) -> list[Obj]:
            return [value for _, value in self.views[bucket].items()]

        return ClusterState(
            nodes=values("k8s_nodes"),
            pods=values("k8s_pods"),
            pod_groups=values("k8s_podgroups"),
            topologies=values("k8s_clusternetworktopologies"),
            budgets=values("k8s_poddisruptionbudgets"),
            now=now,
            scheduler_names=frozenset(self.config.scheduler_names),
        )

    async def run_pass(self) -> Plan:
        now = time.time()
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
        outgoing = [out for action in result.actions for out in to_outgoing(action, now)]
        await self.send(outgoing, now)
        return result

    async def send(self, outgoing: list[Outgoing], now: float) -> None:
        expired = [k for k, at in self.recently_sent.items() if now - at > self._timeout]
        for key in expired:
            del self.recently_sent[key]
        if len(self.salt) > 100_000:
            self.salt.clear()
        messages: list[OutgoingMessage] = []
        for out in outgoing:
            if out.key in self.recently_sent:
                continue
            self.recently_sent[out.key] = now
            if out.command is not None:
                command = out.command
                salt = self.salt.get(out.key, 0)
                if salt:
                    command = msgspec.structs.replace(command, idempotency_key=f"{out.key}~{salt}")
                messages.append(
                    OutgoingMessage(
                        subject=command.subject, message=command, msg_id=command.idempotency_key
                    )
                )
            if out.decision is not None:
                decision = out.decision
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
        metrics.MESSAGES.inc(len(messages))
        if messages:
            await self.bus.publish_batch(messages, max_in_flight=self.config.publish_window)

    @property
    def _timeout(self) -> float:
        return self.config.in_flight_timeout_seconds


async def setup(ctx: ServiceContext[TopologyPlacerConfig]) -> None:
    placer = TopologyPlacer(ctx.bus, ctx.config)
    ctx.health.add_check("kv", placer.not_ready_reason)
    await placer.start()
    ctx.on_stop(placer.stop)

"""The adapters: KV views, durable consumers and a command subscription feeding the metrics.

- NodeSet and Slurm gauges render from KV views (`k8s_nodesets`, `slurm_nodes`, and the
  names and labels of `k8s_pods`) at scrape time.
- Outcomes, decisions, Slurm poll results and dead letters arrive through the exporter's
  durable consumers of the topology table. A message that does not decode is dead-lettered
  by the bus (ContractDecodeError), never retried forever.
- Commands are counted with a plain core-NATS subscription: K8S_COMMANDS is a work queue that
  k8s-watcher consumes, and a second consumer there would take commands away from it.
- JetStream's own health (API answering, each stream's leader and replicas) comes from a
  periodic probe (jetstream.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import REGISTRY, CollectorRegistry

from metrics_exporter import SERVICE
from metrics_exporter.control_plane import ControlPlaneMetrics, DecisionSummary
from metrics_exporter.jetstream import PROBE_INTERVAL_SECONDS, JetStreamCollector, JetStreamProbe
from metrics_exporter.nodeset_draining import NodeSetDrainingCollector, PodOwnership
from metrics_exporter.nodesets import NodeSetCollector
from metrics_exporter.slurm import PollTracker, SlurmCollector
from nodeflow_bus import MSG_ID_HEADER, Bus, ConsumerOptions, Delivery, KVView, PullConsumer
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_contracts.nodeset import NodeSetDecision
from nodeflow_contracts.slurm import SlurmNodeState, SlurmPollResult
from nodeflow_contracts.topology import CONSUMERS, SLURM_NODES_BUCKET, ConsumerSpec, subject_matches

log = structlog.get_logger("metrics_exporter")

NODESETS_BUCKET = subjects.k8s_bucket("NodeSet")
PODS_BUCKET = subjects.k8s_bucket("Pod")


def consumer_spec(stream: str, specs: Sequence[ConsumerSpec] | None = None) -> ConsumerSpec:
    """The exporter's durable consumer of `stream` in the topology table."""
    for spec in specs if specs is not None else CONSUMERS[SERVICE]:
        if spec.stream == stream:
            return spec
    raise LookupError(f"{SERVICE} has no consumer of stream {stream}")


class Exporter:
    """Everything the service runs. `start()`, `ready`/`not_ready_reason()`, later `stop()`.

    Its collectors and counters live in `registry` (the process-wide REGISTRY the runtime
    serves, or a private one in tests and benchmarks).
    """

    def __init__(
        self,
        bus: Bus,
        registry: CollectorRegistry = REGISTRY,
        *,
        clock: Callable[[], float] = time.time,
        label_value_limit: int = 100,
        max_slurm_clusters: int = 256,
        consumer_options: ConsumerOptions | None = None,
        jetstream_probe_interval: float = PROBE_INTERVAL_SECONDS,
    ) -> None:
        self._bus = bus
        self._registry = registry
        self.nodesets: KVView[dict[str, Any]] = KVView(bus, NODESETS_BUCKET, dict)
        self.slurm_nodes: KVView[SlurmNodeState] = KVView(bus, SLURM_NODES_BUCKET, SlurmNodeState)
        self.pods: KVView[PodOwnership] = KVView(bus, PODS_BUCKET, PodOwnership)
        self.polls = PollTracker(max_clusters=max_slurm_clusters)
        self.control_plane = ControlPlaneMetrics(registry, label_value_limit=label_value_limit)
        self.jetstream = JetStreamProbe(bus, interval=jetstream_probe_interval)
        self._collectors = (
            NodeSetCollector(self.nodesets),
            SlurmCollector(self.slurm_nodes, self.polls, clock),
            NodeSetDrainingCollector(self.nodesets, self.pods, self.slurm_nodes),
            JetStreamCollector(self.jetstream),
        )
        for collector in self._collectors:
            registry.register(collector)
        options = consumer_options or ConsumerOptions(concurrency=8)
        self._consumers: tuple[PullConsumer[Any], ...] = (
            PullConsumer(
                bus, consumer_spec("COMMAND_OUTCOMES"), CommandOutcome, self._on_outcome, options
            ),
            PullConsumer(bus, consumer_spec("DECISIONS"), bytes, self._on_decision, options),
            PullConsumer(
                bus, consumer_spec("SLURM_EVENTS"), SlurmPollResult, self._on_poll, options
            ),
            PullConsumer(bus, consumer_spec("DEAD_LETTERS"), bytes, self._on_dead_letter, options),
        )
        self._command_subscription: Subscription | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def _views(self) -> tuple[KVView[Any], ...]:
        return (self.nodesets, self.slurm_nodes, self.pods)

    async def start(self) -> None:
        self._command_subscription = await self._bus.nc.subscribe(
            subjects.K8S_COMMANDS, cb=self._on_command
        )
        for view in self._views:
            await view.start()
        for consumer in self._consumers:
            await consumer.start()
        self.jetstream.start()
        log.info(
            "exporter.started",
            consumers=[consumer.spec.durable for consumer in self._consumers],
            buckets=[view.bucket for view in self._views],
        )

    def not_ready_reason(self) -> str | None:
        waiting = [view.bucket for view in self._views if not view.ready.is_set()]
        if waiting:
            return f"loading KV views: {', '.join(waiting)}"
        broken = [
            f"{consumer.spec.durable}: {reason}"
            for consumer in self._consumers
            if (reason := consumer.not_ready_reason())
        ]
        return "; ".join(broken) or None

    async def wait_ready(self, timeout: float | None = None) -> None:
        for view in self._views:
            await view.wait_ready(timeout)

    async def stop(self, timeout: float = 10.0) -> None:
        await self.jetstream.stop()
        per_consumer = timeout / max(1, len(self._consumers))
        await asyncio.gather(
            *(consumer.stop(per_consumer) for consumer in self._consumers),
            return_exceptions=True,
        )
        if self._command_subscription is not None:
            subscription, self._command_subscription = self._command_subscription, None
            try:
                await subscription.unsubscribe()
            except Exception as exc:  # the connection may already be closing
                log.debug("exporter.unsubscribe_failed", error=repr(exc))
        for view in self._views:
            await view.stop()
        # Unregistered so that a new Exporter can register the same names in this registry.
        for collector in (*self._collectors, *self.control_plane.collectors):
            self._registry.unregister(collector)
        log.info("exporter.stopped")

    # --- handlers ----------------------------------------------------------------------------

    async def _on_command(self, msg: Msg) -> None:
        msg_id = (msg.headers or {}).get(MSG_ID_HEADER)
        self.control_plane.on_command(msg.subject, msg_id)

    async def _on_outcome(self, outcome: CommandOutcome, _: Delivery) -> None:
        self.control_plane.on_outcome(outcome)

    async def _on_decision(self, payload: bytes, delivery: Delivery) -> None:
        # Decoding errors raise ContractDecodeError, which the consumer dead-letters.
        if subject_matches(subjects.NODESET_DECISIONS, delivery.subject):
            decision = codec.decode(NodeSetDecision, payload, subject=delivery.subject)
            self.control_plane.on_nodeset_decision(decision)
        else:
            summary = codec.decode(DecisionSummary, payload, subject=delivery.subject)
            self.control_plane.on_decision_summary(delivery.subject, summary)

    async def _on_poll(self, result: SlurmPollResult, _: Delivery) -> None:
        self.polls.record(result)

    async def _on_dead_letter(self, _: bytes, delivery: Delivery) -> None:
        # Only the subject and headers are read: a dead letter is often undecodable itself.
        self.control_plane.on_dead_letter(delivery.subject, delivery.headers)

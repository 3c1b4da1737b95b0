"""JetStream health as the alerts read it: is the JetStream API answering, and does each of
Nodeflow's streams (KV buckets included) have a leader and all its replicas current?

Every service talks to JetStream, but a service only notices trouble when one of its own
requests fails, and then it retries quietly (fail closed). This probe asks JetStream itself,
on a fixed period, so an operator learns that the bus is broken before work stops:
- `nodeflow_jetstream_api_up`: 1 when the last account-info request was answered;
- `nodeflow_jetstream_stream_leader{stream}`: 1 when the stream answered and has a leader
  (a stream that is missing, or whose replicas lost their quorum, reads 0);
- `nodeflow_jetstream_stream_replicas_desired|current{stream}`: the replicas configured and
  those caught up with the leader (the leader counts as current).

`assess_stream` is the pure part; `JetStreamProbe` asks NATS and keeps the last answers,
which its collector renders at scrape time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
import structlog
from nats.js.api import StreamInfo
from prometheus_client.core import GaugeMetricFamily, Metric

from nodeflow_bus import Bus
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS

log = structlog.get_logger("metrics_exporter.jetstream")

# As often as Prometheus scrapes by default, and each request bounded well inside it.
PROBE_INTERVAL_SECONDS = 15.0
PROBE_TIMEOUT_SECONDS = 5.0

PROBE_ERRORS = (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError, OSError)


def probed_streams() -> tuple[str, ...]:
    """Every stream Nodeflow declares, the KV buckets' `KV_<bucket>` streams included."""
    return (
        *(stream.name for stream in STREAMS),
        *(f"KV_{bucket.bucket}" for bucket in KV_BUCKETS),
    )


@dataclass(frozen=True)
class StreamHealth:
    stream: str
    has_leader: bool
    replicas_desired: int
    replicas_current: int


def assess_stream(stream: str, info: StreamInfo | None) -> StreamHealth:
    """What one stream-info answer (None: no answer, or the stream does not exist) says."""
    if info is None:
        return StreamHealth(stream, has_leader=False, replicas_desired=0, replicas_current=0)
    desired = info.config.num_replicas or 1
    cluster = info.cluster
    if cluster is None:
        # A single server (no cluster): the server that answered holds the only replica.
        return StreamHealth(stream, has_leader=True, replicas_desired=desired, replicas_current=1)
    followers_current = sum(
        1 for peer in cluster.replicas or () if peer.current and not peer.offline
    )
    has_leader = bool(cluster.leader)
    return StreamHealth(
        stream,
        has_leader=has_leader,
        replicas_desired=desired,
        replicas_current=followers_current + (1 if has_leader else 0),
    )


class JetStreamCollector:
    """Renders the probe's last answers; nothing before the first probe has finished."""

    def __init__(self, probe: JetStreamProbe) -> None:
        self._probe = probe

    def collect(self) -> Iterator[Metric]:
        if self._probe.api_up is None:
            return
        api_up = GaugeMetricFamily(
            "nodeflow_jetstream_api_up",
            "1 when JetStream answered the exporter's last account-info request.",
        )
        api_up.add_metric([], 1.0 if self._probe.api_up else 0.0)
        yield api_up
        leader = GaugeMetricFamily(
            "nodeflow_jetstream_stream_leader",
            "1 when the stream answered and has a leader (0: missing or without quorum).",
            labels=["stream"],
        )
        desired = GaugeMetricFamily(
            "nodeflow_jetstream_stream_replicas_desired",
            "Replicas the stream is configured with.",
            labels=["stream"],
        )
        current = GaugeMetricFamily(
            "nodeflow_jetstream_stream_replicas_current",
            "Replicas caught up with the stream's leader, the leader included.",
            labels=["stream"],
        )
        for health in self._probe.streams:
            leader.add_metric([health.stream], 1.0 if health.has_leader else 0.0)
            desired.add_metric([health.stream], float(health.replicas_desired))
            current.add_metric([health.stream], float(health.replicas_current))
        yield from (leader, desired, current)


class JetStreamProbe:
    """Asks JetStream every `interval` seconds; `probe_once()` is one round."""

    def __init__(
        self,
        bus: Bus,
        *,
        streams: Sequence[str] | None = None,
        interval: float = PROBE_INTERVAL_SECONDS,
        timeout: float = PROBE_TIMEOUT_SECONDS,
    ) -> None:
        self._bus = bus
        self._stream_names = tuple(streams) if streams is not None else probed_streams()
        self._interval = interval
        self._timeout = timeout
        self.api_up: bool | None = None
        self.streams: tuple[StreamHealth, ...] = ()
        self._task: asyncio.Task[None] | None = None

    async def probe_once(self) -> None:
        js = self._bus.js
        try:
            await js.account_info()
            api_up = True
        except PROBE_ERRORS as exc:
            api_up = False
            log.warning("jetstream.api_unanswered", error=repr(exc))
        answers = await asyncio.gather(*(self._stream_info(name) for name in self._stream_names))
        self.streams = tuple(
            assess_stream(name, info)
            for name, info in zip(self._stream_names, answers, strict=True)
        )
        self.api_up = api_up
        unhealthy = unhealthy_streams(self.streams)
        if unhealthy:
            log.warning("jetstream.streams_unhealthy", streams=unhealthy)

    async def _stream_info(self, name: str) -> StreamInfo | None:
        try:
            return await self._bus.js.stream_info(name)
        except PROBE_ERRORS as exc:
            log.debug("jetstream.stream_unanswered", stream=name, error=repr(exc))
            return None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.probe_once(), self._interval + self._timeout)
            except TimeoutError:
                self.api_up = False
                log.warning("jetstream.probe_timed_out")
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="jetstream-probe")

    async def stop(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def unhealthy_streams(streams: Iterable[StreamHealth]) -> list[str]:
    """The streams without a leader or with replicas behind, for the log line."""
    return [
        health.stream
        for health in streams
        if not health.has_leader or health.replicas_current < health.replicas_desired
    ]

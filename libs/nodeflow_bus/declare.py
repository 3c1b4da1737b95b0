"""Apply the topology table (streams, KV buckets, durable consumers) idempotently.

Every service calls `ensure_topology` on start: a missing object is created, one whose
settings differ from the table is updated in place, an identical one is left alone. A setting
JetStream cannot change in place (a stream's retention, a consumer's deliver policy) is
reported as a conflict and logged; the object keeps running with its old setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from nodeflow_contracts.topology import (
    CONSUMERS,
    KV_BUCKETS,
    STREAMS,
    ConsumerSpec,
    KVSpec,
    StreamSpec,
)

log = structlog.get_logger("nodeflow_bus")

Action = Literal["created", "updated", "unchanged", "conflict"]

# Durations are floats of seconds here and integer nanoseconds on the server: equal within 1 us.
_TIME_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Declared:
    kind: Literal["stream", "kv", "consumer"]
    name: str
    action: Action
    changed: tuple[str, ...] = ()


@dataclass
class TopologyReport:
    items: list[Declared] = field(default_factory=list)

    def by_action(self, action: Action) -> list[Declared]:
        return [item for item in self.items if item.action == action]

    @property
    def conflicts(self) -> list[Declared]:
        return self.by_action("conflict")


# --- pure: desired settings and differences ------------------------------------------------


def kv_stream_name(bucket: str) -> str:
    return f"KV_{bucket}"


def stream_settings(spec: StreamSpec) -> dict[str, Any]:
    return {
        "description": spec.description,
        "subjects": sorted(spec.subjects),
        "retention": spec.retention,
        "max_age": spec.max_age_seconds,
        "max_bytes": spec.max_bytes,
        "max_msgs_per_subject": spec.max_msgs_per_subject,
        "duplicate_window": spec.duplicate_window_seconds,
        "num_replicas": spec.replicas,
    }


def kv_settings(spec: KVSpec) -> dict[str, Any]:
    return {
        "description": spec.description,
        "max_msgs_per_subject": spec.history,
        "max_age": spec.ttl_seconds,
        "num_replicas": spec.replicas,
    }


def server_max_deliver(spec: ConsumerSpec) -> int:
    """The max_deliver declared on the server: always unlimited (-1).

    PullConsumer enforces `spec.max_deliver` itself and dead-letters a message on its last
    allowed delivery. If the server enforced it too, a message whose last delivery could not
    be dead-lettered (dead-letter stream unavailable, replica stopping) would never be
    delivered again yet stay in its work-queue stream for good. Unlimited on the server, it is
    redelivered, and the consumer dead-letters any delivery past the limit without running
    the handler.
    """
    return -1


def consumer_settings(spec: ConsumerSpec) -> dict[str, Any]:
    return {
        "description": spec.description,
        "filter_subjects": sorted(spec.filter_subjects),
        "ack_wait": spec.ack_wait_seconds,
        "max_deliver": server_max_deliver(spec),
        "max_ack_pending": spec.max_ack_pending,
        "deliver_policy": spec.deliver_policy,
    }


STREAM_IMMUTABLE = frozenset({"retention"})
CONSUMER_IMMUTABLE = frozenset({"deliver_policy"})


def _enum_value(value: object, default: str) -> str:
    """nats-py leaves enums from server responses as plain strings; accept both."""
    if value is None:
        return default
    return str(getattr(value, "value", value))


def actual_stream_settings(config: StreamConfig) -> dict[str, Any]:
    retention = _enum_value(config.retention, "limits")
    return {
        "description": config.description,
        "subjects": sorted(config.subjects or ()),
        "retention": retention,
        "max_age": config.max_age or 0.0,
        "max_bytes": config.max_bytes if config.max_bytes is not None else -1,
        "max_msgs_per_subject": config.max_msgs_per_subject,
        "duplicate_window": config.duplicate_window or 0.0,
        "num_replicas": config.num_replicas or 1,
    }


def actual_kv_settings(config: StreamConfig) -> dict[str, Any]:
    return {
        "description": config.description,
        "max_msgs_per_subject": config.max_msgs_per_subject,
        "max_age": config.max_age or 0.0,
        "num_replicas": config.num_replicas or 1,
    }


def actual_consumer_settings(config: ConsumerConfig) -> dict[str, Any]:
    filters = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    deliver = _enum_value(config.deliver_policy, "all")
    return {
        "description": config.description,
        "filter_subjects": sorted(filters),
        "ack_wait": config.ack_wait or 0.0,
        "max_deliver": config.max_deliver,
        "max_ack_pending": config.max_ack_pending,
        "deliver_policy": deliver,
    }


def differences(desired: dict[str, Any], actual: dict[str, Any]) -> tuple[str, ...]:
    """Names of the settings whose actual value is not the desired one (times within 1 us)."""
    changed = []
    for name, want in desired.items():
        have = actual.get(name)
        if isinstance(want, float) and isinstance(have, int | float):
            if abs(want - have) > _TIME_TOLERANCE:
                changed.append(name)
        elif want != have:
            changed.append(name)
    return tuple(changed)


def stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy(spec.retention),
        max_age=spec.max_age_seconds,
        max_bytes=spec.max_bytes,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=spec.duplicate_window_seconds,
        num_replicas=spec.replicas,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
    )


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    single = len(spec.filter_subjects) == 1
    return ConsumerConfig(
        durable_name=spec.durable,
        description=spec.description,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_seconds,
        max_deliver=server_max_deliver(spec),
        max_ack_pending=spec.max_ack_pending,
        deliver_policy=DeliverPolicy(spec.deliver_policy),
        filter_subject=spec.filter_subjects[0] if single else None,
        filter_subjects=None if single else list(spec.filter_subjects),
    )


def _split_immutable(
    changed: tuple[str, ...], immutable: frozenset[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (
        tuple(name for name in changed if name in immutable),
        tuple(name for name in changed if name not in immutable),
    )


# --- I/O -------------------------------------------------------------------------------------


async def _update_stream(
    js: JetStreamContext,
    kind: Literal["stream", "kv"],
    name: str,
    config: StreamConfig,
    changed: tuple[str, ...],
    updates: dict[str, Any],
) -> Declared:
    """Update a stream (or a KV bucket's stream) in place, unless an immutable setting
    changed: that is reported as a conflict and the object keeps its old settings."""
    named = {"stream": name} if kind == "stream" else {"bucket": name}
    immutable, mutable = _split_immutable(changed, STREAM_IMMUTABLE)
    if immutable:
        log.error(
            f"topology.{kind}_conflict",
            **named,
            cannot_change=immutable,
            hint=f"delete the {kind} to apply these settings",
        )
        return Declared(kind, name, "conflict", immutable)
    await js.update_stream(config.evolve(**updates))
    log.info(f"topology.{kind}_updated", **named, changed=mutable)
    return Declared(kind, name, "updated", mutable)


async def ensure_stream(js: JetStreamContext, spec: StreamSpec) -> Declared:
    try:
        info = await js.stream_info(spec.name)
    except nats.js.errors.NotFoundError:
        await js.add_stream(stream_config(spec))
        log.info("topology.stream_created", stream=spec.name)
        return Declared("stream", spec.name, "created")
    changed = differences(stream_settings(spec), actual_stream_settings(info.config))
    if not changed:
        return Declared("stream", spec.name, "unchanged")
    desired = stream_config(spec)
    updates = {
        "description": desired.description,
        "subjects": desired.subjects,
        "max_age": desired.max_age,
        "max_bytes": desired.max_bytes,
        "max_msgs_per_subject": desired.max_msgs_per_subject,
        "duplicate_window": desired.duplicate_window,
        "num_replicas": desired.num_replicas,
    }
    return await _update_stream(js, "stream", spec.name, info.config, changed, updates)


async def ensure_kv(js: JetStreamContext, spec: KVSpec) -> Declared:
    stream = kv_stream_name(spec.bucket)
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        await js.create_key_value(
            bucket=spec.bucket,
            description=spec.description,
            history=spec.history,
            ttl=spec.ttl_seconds or None,
            replicas=spec.replicas,
            storage=StorageType.FILE,
        )
        log.info("topology.kv_created", bucket=spec.bucket)
        return Declared("kv", spec.bucket, "created")
    changed = differences(kv_settings(spec), actual_kv_settings(info.config))
    if not changed:
        return Declared("kv", spec.bucket, "unchanged")
    updates = {
        "description": spec.description,
        "max_msgs_per_subject": spec.history,
        "max_age": spec.ttl_seconds,
        "num_replicas": spec.replicas,
    }
    return await _update_stream(js, "kv", spec.bucket, info.config, changed, updates)


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec) -> Declared:
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except nats.js.errors.NotFoundError:
        await js.add_consumer(spec.stream, consumer_config(spec))
        log.info("topology.consumer_created", stream=spec.stream, consumer=spec.durable)
        return Declared("consumer", spec.durable, "created")
    changed = differences(consumer_settings(spec), actual_consumer_settings(info.config))
    if not changed:
        return Declared("consumer", spec.durable, "unchanged")
    immutable, mutable = _split_immutable(changed, CONSUMER_IMMUTABLE)
    if immutable:
        log.error(
            "topology.consumer_conflict",
            stream=spec.stream,
            consumer=spec.durable,
            cannot_change=immutable,
            hint="delete the consumer to apply these settings",
        )
        return Declared("consumer", spec.durable, "conflict", immutable)
    # Creating a durable that exists with editable differences updates it in place.
    await js.add_consumer(spec.stream, consumer_config(spec))
    log.info(
        "topology.consumer_updated", stream=spec.stream, consumer=spec.durable, changed=mutable
    )
    return Declared("consumer", spec.durable, "updated", mutable)


async def ensure_topology(
    js: JetStreamContext,
    *,
    streams: Iterable[StreamSpec] = STREAMS,
    kv_buckets: Iterable[KVSpec] = KV_BUCKETS,
    consumers: Sequence[ConsumerSpec] | None = None,
) -> TopologyReport:
    """Declare streams, then KV buckets, then consumers in the order given (they need their
    streams; an update that narrows one consumer may have to come before another is made).

    `consumers` defaults to every consumer of the table; a service passes its own
    (`topology.CONSUMERS[service]`) so it only creates what it consumes.
    """
    report = TopologyReport()
    for stream in streams:
        report.items.append(await ensure_stream(js, stream))
    for bucket in kv_buckets:
        report.items.append(await ensure_kv(js, bucket))
    if consumers is None:
        consumers = [spec for specs in CONSUMERS.values() for spec in specs]
    for consumer in consumers:
        report.items.append(await ensure_consumer(js, consumer))
    return report

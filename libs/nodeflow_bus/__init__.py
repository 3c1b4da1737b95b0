"""nodeflow_bus: the JetStream bus every service uses.

Typical service wiring (the runtime does this)::

    bus = await Bus.connect(url, credentials=Credentials.from_env(), options=BusOptions(name=svc))
    await ensure_topology(bus.js, consumers=topology.CONSUMERS[svc])
    consumer = PullConsumer(bus, spec, MessageType, handler, ConsumerOptions(concurrency=16))
    await consumer.start()
    view = KVView(bus, "k8s_pods", Pod); await view.start(); await view.ready.wait()
    lease = LeaderLease(bus, svc, ttl=15); await lease.start()
    ...
    await consumer.stop(); await view.stop(); await lease.stop(); await bus.close()

Readiness: `bus.is_connected` / `bus.state`, `view.ready.is_set()`, `lease.is_leader`,
`consumer.not_ready_reason()` (None when fine; `consumer.failed` once a loop crashed).
"""

from nodeflow_bus.backoff import Backoff, redelivery_delay
from nodeflow_bus.connection import (
    MSG_ID_HEADER,
    Bus,
    BusOptions,
    ConnectionState,
    OutgoingMessage,
    attempt_msg_id,
)
from nodeflow_bus.consumer import (
    ConsumerOptions,
    Delivery,
    Handler,
    PullConsumer,
    Settlement,
    settle,
)
from nodeflow_bus.credentials import Credentials, Secret
from nodeflow_bus.declare import Declared, TopologyReport, ensure_topology
from nodeflow_bus.errors import (
    BatchPublishError,
    BusError,
    NotConnectedError,
    PermanentError,
    PublishError,
    RetryableError,
)
from nodeflow_bus.kv_view import Change, ChangesOverflowError, KVView
from nodeflow_bus.lease import LeaderLease, LeaseRecord
from nodeflow_bus.scheduler import KeyedScheduler
from nodeflow_bus.tls import NatsTls, TlsConfigError

__all__ = [
    "MSG_ID_HEADER",
    "Backoff",
    "BatchPublishError",
    "Bus",
    "BusError",
    "BusOptions",
    "Change",
    "ChangesOverflowError",
    "ConnectionState",
    "ConsumerOptions",
    "Credentials",
    "Declared",
    "Delivery",
    "Handler",
    "KVView",
    "KeyedScheduler",
    "LeaderLease",
    "LeaseRecord",
    "NatsTls",
    "NotConnectedError",
    "OutgoingMessage",
    "PermanentError",
    "PublishError",
    "PullConsumer",
    "RetryableError",
    "Secret",
    "Settlement",
    "TlsConfigError",
    "TopologyReport",
    "attempt_msg_id",
    "ensure_topology",
    "redelivery_delay",
    "settle",
]

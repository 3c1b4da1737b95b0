"""Wiring of k8s-watcher: Kubernetes client, one informer per kind (and namespace), one
command consumer per sender, readiness. `setup(ctx)` is what `python -m k8s_watcher` runs."""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
import structlog
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from k8s_watcher import SERVICE
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.executor import CommandExecutor
from k8s_watcher.informer import Informer
from k8s_watcher.kinds import KindInfo, watched_kind_infos
from k8s_watcher.kube import KubeClient, load_api_client
from k8s_watcher.ratelimit import TokenBucket
from k8s_watcher.sync import Stamp, StoredObject
from nodeflow_bus import Bus, ConsumerOptions, LeaderLease, PullConsumer
from nodeflow_bus.declare import kv_stream_name
from nodeflow_bus.kv_view import is_delete
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.codec import ContractDecodeError
from nodeflow_contracts.k8s import K8sCommand
from nodeflow_contracts.topology import CONSUMERS
from nodeflow_runtime.service import ServiceContext

log = structlog.get_logger("k8s_watcher")

COMMAND_CONSUMERS = CONSUMERS[SERVICE]


async def load_index(bus: Bus, kind: KindInfo, batch: int = 2000) -> dict[str, Stamp]:
    """uid and resourceVersion of every object mirrored in the kind's KV bucket, so that a
    restart publishes only what changed meanwhile.

    A one-shot read with an ephemeral pull consumer (last message per key, no acks).
    """
    bucket = kind.bucket
    stream = kv_stream_name(bucket)
    info = await bus.js.stream_info(stream)
    index: dict[str, Stamp] = {}
    if info.state.messages == 0:
        return index
    prefix = subjects.kv_entry(bucket, "")
    subscription = await bus.js.pull_subscribe(
        f"{prefix}>",
        stream=stream,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
        ),
    )
    try:
        pending = 1
        while pending:
            try:
                messages = await subscription.fetch(batch=batch, timeout=5.0)
            except nats.errors.TimeoutError:
                break  # nothing left (the stream held only what the filter skips)
            for message in messages:
                key = message.subject[len(prefix) :]
                if is_delete(message.headers) or not message.data:
                    index.pop(key, None)
                    continue
                try:
                    stored = codec.decode(StoredObject, message.data, subject=message.subject)
                except ContractDecodeError:
                    # Re-listing will overwrite it.
                    log.warning("k8s_watcher.undecodable_kv_value", bucket=bucket, key=key)
                    continue
                index[key] = stored.stamp
            pending = messages[-1].metadata.num_pending if messages else 0
    finally:
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()
    return index


def split_index(
    index: dict[str, Stamp], namespaces: tuple[str, ...]
) -> dict[str | None, dict[str, Stamp]]:
    """The part of a kind's index each informer owns: one per namespace, or all of it."""
    if not namespaces:
        return {None: index}
    owned: dict[str | None, dict[str, Stamp]] = {ns: {} for ns in namespaces}
    for key, stamp in index.items():
        namespace, _ = subjects.split_object_key(key)
        if namespace in owned:
            owned[namespace][key] = stamp
    return owned


class K8sWatcher:
    """The mirror (one informer per kind and namespace) and the command executor.

    Every replica applies commands (they share the work queue); only one mirrors the cluster
    into KV and events, the holder of the `k8s-watcher` lease (`setup`), since two mirrors
    could write an older object over a newer one. A single instance (tests) runs both with
    `start()`.
    """

    def __init__(self, config: K8sWatcherConfig, bus: Bus, kube: KubeClient) -> None:
        self.config = config
        self.bus = bus
        self.kube = kube
        self.informers: list[Informer] = []
        self.executor = CommandExecutor(
            kube=kube,
            bus=bus,
            max_deliver=max(spec.max_deliver for spec in COMMAND_CONSUMERS),
            instance_id=config.instance_id,
            command_namespaces=config.command_namespaces,
            skyhook_namespace=config.skyhook_namespace,
        )
        self.consumers: list[PullConsumer[K8sCommand]] = []
        self._tasks: list[asyncio.Task[None]] = []
        # Set when an informer dies (a bug: they retry forever); `supervise` raises it.
        self._failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(cls, config: K8sWatcherConfig, bus: Bus) -> K8sWatcher:
        api = await load_api_client(config.kubeconfig, config.kube_context)
        kube = KubeClient(
            api,
            limiter=TokenBucket(config.kube_qps, config.kube_burst),
            request_timeout=config.kube_request_timeout_seconds,
            probe_interval=config.kube_probe_interval_seconds,
        )
        return cls(config, bus, kube)

    async def start(self) -> None:
        """Mirror the cluster and apply commands: one instance doing all of it."""
        await self.start_mirror()
        await self.start_commands()

    async def start_mirror(self) -> None:
        """Informers for every watched kind, from the KV index (only what changed is
        published again)."""
        if self.informers:
            return
        for kind in watched_kind_infos(self.config.watched_kinds):
            index = await load_index(self.bus, kind)
            namespaces = self.config.mirrored_namespaces(kind)
            for namespace, owned in split_index(index, namespaces).items():
                self.informers.append(
                    Informer(
                        kube=self.kube,
                        bus=self.bus,
                        kind=kind,
                        namespace=namespace,
                        label_selector=self.config.label_selector(kind.kind),
                        index=owned,
                        page_size=self.config.list_page_size,
                        watch_timeout=self.config.watch_timeout_seconds,
                        backoff=self.config.list_watch_backoff,
                    )
                )
        for informer in self.informers:
            task = asyncio.create_task(informer.run(), name=f"informer {informer.name}")
            task.add_done_callback(self._informer_ended)
            self._tasks.append(task)
        log.info("k8s_watcher.mirroring", informers=[i.name for i in self.informers])

    async def stop_mirror(self) -> None:
        tasks, self._tasks, self.informers = self._tasks, [], []
        # One cancel() can be swallowed by nats-py's wait_for on Python 3.11.
        await asyncio.gather(*(cancel_and_wait(task) for task in tasks))
        if tasks:
            log.info("k8s_watcher.mirror_stopped")

    @property
    def mirroring(self) -> bool:
        return bool(self.informers)

    def _informer_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._failed.done():
            return
        error = task.exception()
        if error is not None:
            failure = RuntimeError(f"{task.get_name()} failed")
            failure.__cause__ = error
            self._failed.set_exception(failure)

    async def start_commands(self) -> None:
        """One consumer per sender (topology.K8S_COMMANDS_CONSUMERS), each applying up to
        COMMAND_CONCURRENCY commands at once. They share the client's rate limit, which serves
        waiting requests in arrival order: while the API server is the bottleneck, each busy
        sender gets an equal share of it, and a sender with a few commands waits for a few
        requests, not for another sender's backlog."""
        for spec in COMMAND_CONSUMERS:
            consumer = PullConsumer(
                self.bus,
                spec,
                K8sCommand,
                self.executor.handle,
                ConsumerOptions(
                    concurrency=self.config.command_concurrency,
                    ordering_key=lambda cmd: cmd.target.ordering_key,
                    backoff=self.config.command_backoff,
                    stop_timeout=min(10.0, self.config.shutdown_deadline_seconds / 2),
                ),
            )
            await consumer.start()
            self.consumers.append(consumer)
        log.info(
            "k8s_watcher.applying_commands",
            qps=self.config.kube_qps,
            burst=self.config.kube_burst,
        )

    async def supervise(self) -> None:
        """Ends with the error of the first informer that died (a bug: they retry forever)."""
        await asyncio.shield(self._failed)

    def not_ready_reason(self) -> str | None:
        reason = self.kube.health.not_ready_reason()
        if reason:
            return reason
        waiting = [informer.name for informer in self.informers if not informer.synced.is_set()]
        if waiting:
            return f"initial list not done: {', '.join(waiting)}"
        # A crashed or deleted command consumer means some sender's commands are not applied.
        reasons = [r for r in (c.not_ready_reason() for c in self.consumers) if r is not None]
        return "; ".join(reasons) or None

    async def wait_synced(self) -> None:
        await asyncio.gather(*(informer.synced.wait() for informer in self.informers))

    async def stop(self, grace: float = 10.0) -> None:
        await asyncio.gather(*(consumer.stop(timeout=grace) for consumer in self.consumers))
        await self.stop_mirror()
        await self.kube.close()
        log.info("k8s_watcher.stopped")


class MirrorLeadership:
    """Starts the mirror on gaining the `k8s-watcher` lease and stops it on losing it, one
    transition at a time and off the lease's task (a start reads the KV index, which may take
    seconds, and must not delay the lease's renewals)."""

    def __init__(self, watcher: K8sWatcher) -> None:
        self._watcher = watcher
        # True/False: leadership gained/lost; None: the service is stopping.
        self._transitions: asyncio.Queue[bool | None] = asyncio.Queue()

    def on_leadership(self, leader: bool) -> None:
        self._transitions.put_nowait(leader)

    def finish(self) -> None:
        self._transitions.put_nowait(None)

    async def run(self) -> None:
        while True:
            leader = await self._transitions.get()
            if leader is None:
                return
            if leader:
                await self._watcher.start_mirror()
            else:
                await self._watcher.stop_mirror()


async def setup(ctx: ServiceContext[K8sWatcherConfig]) -> None:
    watcher = await K8sWatcher.connect(ctx.config, ctx.bus)
    ctx.health.add_check("kubernetes", watcher.not_ready_reason)
    await watcher.start_commands()
    mirror = MirrorLeadership(watcher)
    lease = LeaderLease(
        ctx.bus, SERVICE, holder=ctx.config.instance_id, ttl=ctx.config.leader_lease_ttl_seconds
    )
    lease.add_listener(mirror.on_leadership)
    transitions = ctx.spawn(mirror.run(), name="k8s-watcher mirror leadership")
    await lease.start()

    async def stop(seconds_left: float) -> None:
        await lease.stop()  # queues the loss of leadership: the mirror stops in order
        mirror.finish()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(transitions), max(1.0, seconds_left / 2))
        await watcher.stop(grace=max(1.0, seconds_left / 2))

    ctx.on_stop(stop)
    ctx.spawn(watcher.supervise(), name="k8s-watcher informers")

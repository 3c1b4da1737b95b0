"""Wiring of the slurm-syncer process: config -> Slurm clients -> Syncer, run by the leader.

Only the replica holding the `slurm-syncer` lease polls Slurm, projects pod conditions, drains
and consumes Slurm commands; the others wait to take over.
"""

from __future__ import annotations

import asyncio
import os

from nodeflow_bus import Backoff, ConsumerOptions, LeaderLease, PullConsumer
from nodeflow_contracts.slurm import SlurmNodeCommand
from nodeflow_contracts.topology import CONSUMERS
from nodeflow_runtime.config import ConfigError
from nodeflow_runtime.service import ServiceContext
from slurm_syncer import SERVICE
from slurm_syncer.auth import token_source
from slurm_syncer.client import ClientOptions, SlurmClient, SlurmError, SlurmVersionMismatch
from slurm_syncer.reasons import DrainReasons
from slurm_syncer.settings import SlurmSyncerConfig, cluster_settings
from slurm_syncer.syncer import Syncer, SyncerOptions


def build_clients(config: SlurmSyncerConfig) -> dict[str, SlurmClient]:
    options = ClientOptions(
        timeout_seconds=config.slurm_request_timeout_seconds,
        attempts=config.slurm_request_attempts,
        backoff=Backoff(
            initial=config.slurm_retry_initial_seconds,
            factor=2.0,
            maximum=max(config.slurm_retry_initial_seconds, config.slurm_retry_max_seconds),
        ),
    )
    clients: dict[str, SlurmClient] = {}
    for name, settings in cluster_settings(config.slurm_clusters, os.environ).items():
        tokens = token_source(
            settings,
            lifespan=config.slurm_token_lifespan_seconds,
            margin=config.slurm_token_refresh_margin_seconds,
        )
        clients[name] = SlurmClient(
            name,
            settings.url,
            tokens,
            options,
            ca_file=settings.ca_file,
            api_version=settings.api_version,
        )
    return clients


async def choose_api_versions(
    ctx: ServiceContext[SlurmSyncerConfig], clients: dict[str, SlurmClient]
) -> None:
    """Choose every cluster's API version now, so that a slurmrestd that speaks none of ours
    stops the service at start with one line (ConfigError) instead of failing every poll. A
    cluster that cannot be reached now is asked again on its first call."""

    async def choose(client: SlurmClient) -> None:
        try:
            await client.negotiate()
        except SlurmVersionMismatch:
            raise
        except SlurmError as exc:
            ctx.log.warning(
                "slurm_syncer.api_version_later", cluster=client.cluster, error=str(exc)
            )

    try:
        await asyncio.gather(*(choose(client) for client in clients.values()))
    except SlurmVersionMismatch as exc:
        for client in clients.values():
            await client.close()
        raise ConfigError(str(exc)) from None


class LeaderWork:
    """Starts the syncer and its command consumer on gaining the lease, stops them on losing
    it; transitions are handled one at a time, in order, off the lease's own task."""

    def __init__(self, ctx: ServiceContext[SlurmSyncerConfig], syncer: Syncer) -> None:
        self._ctx = ctx
        self._syncer = syncer
        self._consumer: PullConsumer[SlurmNodeCommand] | None = None
        # True/False: leadership gained/lost; None: the service is stopping.
        self._transitions: asyncio.Queue[bool | None] = asyncio.Queue()
        self.active = False

    def on_leadership(self, leader: bool) -> None:
        self._transitions.put_nowait(leader)

    def finish(self) -> None:
        self._transitions.put_nowait(None)

    async def run(self) -> None:
        while True:
            leader = await self._transitions.get()
            if leader is None:
                return
            if leader and not self.active:
                await self._activate()
            elif not leader and self.active:
                await self.deactivate()

    async def _activate(self) -> None:
        await self._syncer.start()
        self._consumer = PullConsumer(
            self._ctx.bus,
            CONSUMERS[SERVICE][0],
            SlurmNodeCommand,
            self._syncer.handle_command,
            ConsumerOptions(concurrency=8, ordering_key=lambda c: (c.cluster, c.node)),
        )
        await self._consumer.start()
        self.active = True
        self._ctx.log.info("slurm_syncer.active")

    async def deactivate(self) -> None:
        if not self.active:
            return
        self.active = False
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        await self._syncer.stop()
        self._ctx.log.info("slurm_syncer.standby")


async def setup(ctx: ServiceContext[SlurmSyncerConfig]) -> None:
    config = ctx.config
    clients = build_clients(config)
    if not clients:
        ctx.log.warning(
            "slurm_syncer.no_clusters", hint="set SLURM_CLUSTERS and SLURM_<CLUSTER>_URL"
        )
    await choose_api_versions(ctx, clients)
    syncer = Syncer(
        ctx.bus,
        clients,
        SyncerOptions(
            sender=SERVICE,
            poll_interval=config.slurm_poll_interval_seconds,
            max_concurrent_updates=config.slurm_max_concurrent_updates,
            not_responding_confirm=config.slurm_not_responding_confirm_seconds,
            drain_reasons=DrainReasons(config.drain_reason_prefix.strip()),
        ),
    )
    work = LeaderWork(ctx, syncer)
    lease = LeaderLease(
        ctx.bus,
        SERVICE,
        holder=f"{config.instance_id}-{os.getpid()}",
        ttl=config.leader_lease_ttl_seconds,
    )
    lease.add_listener(work.on_leadership)
    runner = ctx.spawn(work.run(), name="leader-work")
    await lease.start()

    async def stop(seconds_left: float) -> None:
        await lease.stop()  # queues the loss of leadership: the work is stopped in order
        work.finish()
        try:
            await asyncio.wait_for(asyncio.shield(runner), max(1.0, seconds_left - 1.0))
        except TimeoutError:
            runner.cancel()
        await work.deactivate()
        for client in clients.values():
            await client.close()

    ctx.on_stop(stop)

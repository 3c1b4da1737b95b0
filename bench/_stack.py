"""The in-process stack that the benchmarks and the integration tests both run: the simulator,
the NATS topology, k8s-watcher and, when given Slurm clients, slurm-syncer, all in this process
on a nats-server the caller provides. The controller under study is the caller's to start.

Its name starts with "_" so `python -m bench` does not take it for a benchmark.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from clustersim.runner import Simulator, SimulatorConfig, run_simulator
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import K8sWatcher
from nodeflow_bus import Bus, BusOptions, ensure_topology
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from slurm_syncer.client import SlurmClient
from slurm_syncer.syncer import Syncer, SyncerOptions


@dataclass
class InProcessStack:
    sim: Simulator
    bus: Bus
    nats_url: str
    watcher: K8sWatcher
    syncer: Syncer | None = None


StackT = TypeVar("StackT", bound=InProcessStack)


@contextlib.asynccontextmanager
async def scratch_nats_server() -> AsyncIterator[NatsServerProcess]:
    """A nats-server with its store in a temporary folder, removed after."""
    with tempfile.TemporaryDirectory() as folder:
        server = NatsServerProcess(Path(folder) / "nats")
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


@contextlib.asynccontextmanager
async def run_inprocess_stack(
    nats_url: str,
    simulator: SimulatorConfig,
    stack_type: type[StackT],
    *,
    watcher_settings: Mapping[str, Any],
    bus_options: BusOptions | None = None,
    slurm_clients: Callable[[Simulator], dict[str, SlurmClient]] | None = None,
    syncer_options: SyncerOptions | None = None,
    prepare: Callable[[Simulator], None] | None = None,
) -> AsyncIterator[StackT]:
    """Start the stack and yield it as a `stack_type`; stop it in reverse order after.

    `watcher_settings` are k8s-watcher's settings beside its NATS URL and kubeconfig.
    `slurm_clients` (the clusters slurm-syncer polls) starts slurm-syncer, and creates its
    consumers as well as k8s-watcher's; without it there is no syncer. `prepare` edits the
    simulated cluster before k8s-watcher first lists it.
    """
    async with run_simulator(simulator) as sim:
        if prepare is not None:
            prepare(sim)
        bus = await Bus.connect(nats_url, options=bus_options)
        async with contextlib.AsyncExitStack() as teardown:
            teardown.push_async_callback(bus.close)
            await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
            services = ("k8s-watcher", "slurm-syncer") if slurm_clients else ("k8s-watcher",)
            for service in services:
                await ensure_topology(bus.js, consumers=CONSUMERS[service])
            watcher = await K8sWatcher.connect(
                K8sWatcherConfig(
                    nats_url=(nats_url,), kubeconfig=str(sim.kubeconfig_path), **watcher_settings
                ),
                bus,
            )
            await watcher.start()
            teardown.push_async_callback(watcher.stop, 2.0)
            await watcher.wait_synced()
            syncer: Syncer | None = None
            if slurm_clients is not None:
                clients = slurm_clients(sim)
                for client in clients.values():
                    teardown.push_async_callback(client.close)
                syncer = Syncer(bus, clients, syncer_options or SyncerOptions())
                await syncer.start()
                teardown.push_async_callback(syncer.stop)
            yield stack_type(sim=sim, bus=bus, nats_url=nats_url, watcher=watcher, syncer=syncer)

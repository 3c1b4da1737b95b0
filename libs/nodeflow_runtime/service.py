"""The life of a service process: configure, serve health, connect, run, stop cleanly.

    def main() -> None:
        run_main("k8s-watcher", K8sWatcherConfig, setup)

`setup(ctx)` starts the service's own work (consumers, KV views, loops) through `ctx`, which
stops all of it on SIGTERM/SIGINT: readiness goes false first, then each stopper runs (last
registered first) within `shutdown_deadline_seconds`, then the NATS connection is drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

from nodeflow_bus import Bus, BusOptions, Credentials, ensure_topology
from nodeflow_bus.kube_lease import KubeLeaseTarget
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS, replicated
from nodeflow_runtime.config import ConfigError, ServiceConfig, load_config, redacted
from nodeflow_runtime.http import Health, build_app, start_http
from nodeflow_runtime.logs import configure_logging

C = TypeVar("C", bound=ServiceConfig)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2

Stopper = Callable[[float], Awaitable[None]]


@dataclass
class ServiceContext(Generic[C]):
    """What a service's setup gets: its config, logger, bus and a place to hang its work."""

    name: str
    config: C
    log: structlog.stdlib.BoundLogger
    health: Health
    bus: Bus
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    failure: BaseException | None = None
    _stoppers: list[Stopper] = field(default_factory=list)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def on_stop(self, stopper: Stopper) -> None:
        """Run `stopper(seconds_left)` at shutdown, after everything registered later."""
        self._stoppers.append(stopper)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run a long-lived task; if it dies with an error, the whole service stops (exit 1)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self.stopping.is_set():
            return
        error = task.exception()
        if error is not None:
            self.log.error("service.task_failed", task=task.get_name(), error=repr(error))
            self.failure = error
            self.stopping.set()

    async def shutdown(self) -> None:
        deadline = time.monotonic() + self.config.shutdown_deadline_seconds
        for stopper in reversed(self._stoppers):
            left = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(stopper(left), timeout=left + 1.0)
            except Exception as exc:  # one stopper must not block the others (TimeoutError too)
                self.log.warning("service.stopper_failed", error=repr(exc))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            # A task that swallows its cancellation must not hold the process past the deadline.
            left = max(0.0, deadline - time.monotonic()) + 1.0
            _, stuck = await asyncio.wait(self._tasks, timeout=left)
            for task in stuck:
                self.log.warning("service.task_stuck_at_shutdown", task=task.get_name())


Setup = Callable[[ServiceContext[C]], Coroutine[Any, Any, None]]


async def run_service(
    name: str, config: C, setup: Setup[C], credentials: Credentials | None = None
) -> int:
    log = configure_logging(name, config.log_level)
    log.info("service.starting", config=redacted(config))
    health = Health()
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)

    bus_ready = asyncio.Event()
    setup_done = asyncio.Event()
    health.add_check("nats", lambda: None if bus_ready.is_set() else "connecting to NATS")
    health.add_check("setup", lambda: None if setup_done.is_set() else "starting")
    runner = await start_http(
        build_app(name, health), config.http_host, config.http_port, config.http_listen_fd
    )
    log.info("service.http", host=config.http_host, port=config.http_port)

    bus: Bus | None = None
    ctx: ServiceContext[C] | None = None
    try:
        connect = asyncio.create_task(
            Bus.connect(
                list(config.nats_url),
                credentials=credentials or Credentials(),
                options=BusOptions(
                    name=f"{name}/{config.instance_id}",
                    kube_lease=(
                        KubeLeaseTarget(sender=name, namespace=config.kube_lease_namespace)
                        if config.kube_lease_namespace
                        else None
                    ),
                ),
                tls=config.nats_tls(),
            )
        )
        stop_wait = asyncio.create_task(stop_requested.wait())
        await asyncio.wait({connect, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not connect.done():
            connect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connect
            log.info("service.stopped_before_connect")
            return EXIT_OK
        bus = connect.result()
        health.checks["nats"] = lambda: None if bus and bus.is_connected else "NATS disconnected"
        bus_ready.set()
        await ensure_topology(
            bus.js,
            streams=replicated(STREAMS, config.nats_replicas),
            kv_buckets=replicated(KV_BUCKETS, config.nats_replicas),
            consumers=CONSUMERS.get(name, ()),
        )
        ctx = ServiceContext(name=name, config=config, log=log, health=health, bus=bus)
        # A SIGTERM while setup still waits (on a KV snapshot, an API) stops it too.
        setting_up: asyncio.Task[None] = asyncio.create_task(setup(ctx))
        await asyncio.wait({setting_up, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if setting_up.done():
            setting_up.result()
            setup_done.set()
            log.info("service.ready")
        else:
            setting_up.cancel()
            await asyncio.gather(setting_up, return_exceptions=True)
        ctx_stop = asyncio.create_task(ctx.stopping.wait())
        await asyncio.wait({stop_wait, ctx_stop}, return_when=asyncio.FIRST_COMPLETED)
        ctx_stop.cancel()
        stop_wait.cancel()
        health.shutting_down = True
        ctx.stopping.set()
        log.info("service.stopping")
        await ctx.shutdown()
        return EXIT_FAILED if ctx.failure else EXIT_OK
    except ConfigError as exc:
        # A setup that finds its configuration unusable once it can look (slurm-syncer: a
        # slurmrestd that speaks none of our API versions): one line, as run_main says it.
        print(f"{name}: {exc}", file=sys.stderr)
        log.error("service.bad_config", error=str(exc))
        health.shutting_down = True
        if ctx is not None:
            await ctx.shutdown()
        return EXIT_BAD_CONFIG
    except Exception as exc:
        log.exception("service.failed", error=repr(exc))
        health.shutting_down = True
        if ctx is not None:
            await ctx.shutdown()
        return EXIT_FAILED
    finally:
        if bus is not None:
            await bus.close()
        await runner.cleanup()
        log.info("service.stopped")


async def runtime_only(ctx: ServiceContext[Any]) -> None:
    """Setup of a service whose own behaviour has not landed yet: the runtime alone declares
    its streams, KV buckets and consumers, serves health and metrics, and stops cleanly."""
    ctx.log.info("service.runtime_only", consumers=[c.durable for c in CONSUMERS[ctx.name]])


def run_main(name: str, config_type: type[C], setup: Setup[C]) -> None:
    """Entry point for `python -m <service>`: exits 2 on bad configuration, 0 on clean stop."""
    try:
        config = load_config(config_type)
        credentials = Credentials.from_env()
        tls = config.nats_tls()
        if tls.required_for(config.nats_url):
            # Unreadable or mismatched certificate files are bad configuration (exit 2).
            tls.ssl_context()
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG) from None
    except OSError as exc:  # a NATS_*_FILE that cannot be read, or a bad certificate
        print(f"{name}: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG) from None
    raise SystemExit(asyncio.run(run_service(name, config, setup, credentials)))

"""Harness for k8s-watcher against the Kubernetes API emulator (over HTTP) and real NATS.

NATS runs with authorization on, as `make run` starts it: one user per service with the
allow lists of nodeflow_contracts.permissions, and the admin. k8s-watcher connects as
`k8s-watcher`; the test's own bus (`bus`, `harness.bus`) is the admin's, and `service_bus`
connects as any service.

`harness` gives an emulator with the project's CRDs, a bus with the whole topology declared,
and helpers to start/stop k8s-watcher, send commands, and read what it published.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats.js.errors
import pytest
from nats.js.api import DeliverPolicy

from clustersim.kube.server import RunningServer, serve
from clustersim.kube.store import Store
from clustersim.runner import DEFAULT_CRD_DIR, apply_crds
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import K8sWatcher
from nodeflow_bus import Bus, ensure_topology
from nodeflow_bus.credentials import Secret
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import (
    CommandOperation,
    CommandOutcome,
    K8sCommand,
    K8sObjectEvent,
    ObjectRef,
    deadline_after,
)
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess, generate_users, user_credentials
from tests.fixtures.nats import TEST_BUS_OPTIONS

POD_SPEC = {"containers": [{"name": "main", "image": "busybox"}]}


def pod(name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": dict(POD_SPEC),
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


async def wait_until(
    condition: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


@dataclass
class Collected:
    """Messages of one subject filter, decoded, in stream order."""

    items: list[Any] = field(default_factory=list)


@dataclass
class Harness:
    bus: Bus
    connect_as: Callable[[str], Any]
    server: RunningServer
    tmp_path: Path
    stack: contextlib.AsyncExitStack
    watcher: K8sWatcher | None = None
    events: Collected = field(default_factory=Collected)
    outcomes: Collected = field(default_factory=Collected)

    @property
    def store(self) -> Store:
        return self.server.store

    def config(self, **overrides: Any) -> K8sWatcherConfig:
        settings: dict[str, Any] = {
            "kubeconfig": str(self.server.kubeconfig_path),
            "instance_id": "pytest",
            "retry_initial_seconds": 0.05,
            "retry_max_seconds": 0.3,
            "command_retry_initial_seconds": 0.05,
            "command_retry_max_seconds": 0.2,
            "watch_timeout_seconds": 30.0,
            "kube_request_timeout_seconds": 5.0,
            "shutdown_deadline_seconds": 4.0,
        }
        settings.update(overrides)
        return K8sWatcherConfig(**settings)

    async def start_watcher(self, **overrides: Any) -> K8sWatcher:
        watcher_bus: Bus = await self.connect_as("k8s-watcher")
        watcher = await K8sWatcher.connect(self.config(**overrides), watcher_bus)
        await watcher.start()
        await asyncio.wait_for(watcher.wait_synced(), 10.0)
        self.watcher = watcher
        return watcher

    async def stop_watcher(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop(grace=2.0)
            self.watcher = None

    async def api_down(self) -> None:
        """Stop the API server (the store, the cluster state, lives on)."""
        closing = asyncio.create_task(self.stack.aclose())
        # serve() ends the watches open when it stops; a watch that k8s-watcher opens at that
        # very moment would keep the server's shutdown waiting, so end those too.
        while not closing.done():
            self.store.close_all_watches()
            await asyncio.sleep(0.02)
        await closing

    async def api_up(self) -> None:
        """Serve the same store on the same port again."""
        self.stack = contextlib.AsyncExitStack()
        self.server = await self.stack.enter_async_context(
            serve(self.store, port=self.server.port, kubeconfig_path=self.server.kubeconfig_path)
        )

    async def faults(self, **settings: Any) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.server.url}/_sim/faults", json=settings) as response,
        ):
            assert response.status == 200, await response.text()

    async def clear_faults(self) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.delete(f"{self.server.url}/_sim/faults") as response,
        ):
            assert response.status == 200

    # --- what k8s-watcher published ------------------------------------------------------

    def events_of(self, kind: str, name: str, namespace: str | None = None) -> list[K8sObjectEvent]:
        subject = subjects.k8s_object_event(kind, namespace, name)
        return [e for e in self.events.items if e.subject == subject]

    def event_types(self, kind: str, name: str, namespace: str | None = None) -> list[str]:
        return [e.type for e in self.events_of(kind, name, namespace)]

    def outcomes_of(self, key: str) -> list[CommandOutcome]:
        return [o for o in self.outcomes.items if o.idempotency_key == key]

    async def stored_event_count(self) -> int:
        info = await self.bus.js.stream_info("K8S_EVENTS")
        return int(info.state.messages)

    async def kv_get(self, kind: str, key: str) -> dict[str, Any] | None:
        kv = await self.bus.js.key_value(subjects.k8s_bucket(kind))
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value:
            return None
        value: dict[str, Any] = msgspec.json.decode(entry.value)
        return value

    async def kv_keys(self, kind: str) -> set[str]:
        kv = await self.bus.js.key_value(subjects.k8s_bucket(kind))
        try:
            return set(await kv.keys())
        except nats.js.errors.NoKeysError:
            return set()

    # --- commands ------------------------------------------------------------------------

    async def send(
        self,
        target: ObjectRef,
        operation: CommandOperation,
        *,
        key: str | None = None,
        msg_id: str | None = None,
        sender: str = ADMIN_USER,
        bus: Bus | None = None,
        subject: str | None = None,
        expires_at: float | None = None,
    ) -> K8sCommand:
        """Send as `sender` (the admin by default, whose policy allows everything) on
        `bus` (the admin's by default), on the command's own subject unless told. A service's
        command gets a minute's deadline unless told, as the services' own do."""
        if expires_at is None and sender != ADMIN_USER:
            expires_at = deadline_after(60)
        cmd = K8sCommand(
            idempotency_key=key or uuid.uuid4().hex,
            sender=sender,
            sent_at=time.time(),
            target=target,
            operation=operation,
            reason="test",
            expires_at=expires_at,
        )
        await (bus or self.bus).publish(
            subject or cmd.subject, cmd, msg_id=msg_id or cmd.idempotency_key
        )
        return cmd

    async def final_outcome(self, key: str, timeout: float = 5.0) -> CommandOutcome:
        def done() -> bool:
            return any(o.outcome not in ("retrying",) for o in self.outcomes_of(key))

        await wait_until(done, timeout)
        return next(o for o in self.outcomes_of(key) if o.outcome != "retrying")


async def _collect(bus: Bus, subject: str, message_type: type[Any], into: Collected) -> Any:
    async def on_message(msg: Any) -> None:
        into.items.append(msgspec.json.decode(msg.data, type=message_type))

    return await bus.js.subscribe(
        subject, cb=on_message, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )


@pytest.fixture
def nats_users() -> dict[str, Secret]:
    """Per-user authorization on the shared `nats_server`, as deployed."""
    return generate_users()


@pytest.fixture
async def service_bus(
    nats_server: NatsServerProcess, nats_users: dict[str, Secret]
) -> AsyncIterator[Callable[[str], Any]]:
    """`await service_bus(user)`: a Bus connected as that user, closed after the test."""
    opened: list[Bus] = []

    async def connect(user: str) -> Bus:
        # Named after the user, so the server's log tells whose publish it refused.
        connected = await Bus.connect(
            nats_server.url,
            credentials=user_credentials(nats_users, user),
            options=dataclasses.replace(TEST_BUS_OPTIONS, name=f"as-{user}"),
        )
        opened.append(connected)
        return connected

    try:
        yield connect
    finally:
        for connected in opened:
            await connected.close()


@pytest.fixture
async def bus(service_bus: Callable[[str], Any]) -> Bus:
    """The test's own view: the admin user."""
    admin: Bus = await service_bus(ADMIN_USER)
    return admin


@pytest.fixture
async def harness(
    bus: Bus,
    service_bus: Callable[[str], Any],
    nats_server: NatsServerProcess,
    tmp_path: Path,
) -> AsyncIterator[Harness]:
    await ensure_topology(
        bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=CONSUMERS["k8s-watcher"]
    )
    store = Store(bookmark_interval=0.2)
    apply_crds(store, DEFAULT_CRD_DIR)
    stack = contextlib.AsyncExitStack()
    server = await stack.enter_async_context(serve(store, kubeconfig_path=tmp_path / "kubeconfig"))
    h = Harness(bus=bus, connect_as=service_bus, server=server, tmp_path=tmp_path, stack=stack)
    subs = [
        await _collect(bus, subjects.K8S_EVENTS, K8sObjectEvent, h.events),
        await _collect(bus, subjects.K8S_OUTCOMES, CommandOutcome, h.outcomes),
    ]
    try:
        yield h
    finally:
        await h.stop_watcher()
        for sub in subs:
            await sub.unsubscribe()
        await h.stack.aclose()
    # k8s-watcher's allow lists are enough for everything it did (its minimal set works).
    refused = violations_of(nats_server.log_file, "as-k8s-watcher")
    assert refused == [], refused


def violations_of(log_file: Path, client_name: str) -> list[str]:
    """The server's permission violations of the connections named `client_name`."""
    if not log_file.exists():
        return []
    return [
        line
        for line in log_file.read_text(errors="replace").splitlines()
        if "Violation" in line and f':{client_name}" - ' in line
    ]

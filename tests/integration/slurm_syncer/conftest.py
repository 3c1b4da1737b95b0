"""slurm-syncer against the Slurm emulator over HTTP and a real NATS.

Kubernetes input goes straight into the k8s_* KV buckets (the contract with k8s-watcher);
`FakeWatcher` takes the K8sCommands the syncer publishes off the K8S_COMMANDS work queue with a
JetStream consumer, records them, and (when asked) applies them to the pods in KV the way the
API server would, so a test sees the whole loop converge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from clustersim.kube.patch import merge_patch, strategic_merge_patch
from clustersim.slurm import SLURM_RELEASES, ManualClock, RunningSlurm, run_slurm_emulator
from nodeflow_bus import Backoff, Bus, ConsumerOptions, PullConsumer, ensure_topology
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.k8s import K8sCommand, PatchObject
from nodeflow_contracts.slurm import SlurmNodeCommand, SlurmOp
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from slurm_syncer.auth import SigningKeyTokens
from slurm_syncer.client import ClientOptions, SlurmClient
from slurm_syncer.syncer import Syncer, SyncerOptions

NAMESPACE = "slurm"
NODESET = "gpu"
CLUSTER = "a"
FAST_CLIENT = ClientOptions(
    timeout_seconds=2.0, attempts=2, backoff=Backoff(initial=0.02, maximum=0.05)
)


async def eventually(
    condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02
) -> Any:
    """The condition's value once true. The bound only ends a wait that went wrong: a loaded
    2-core CI machine once took more than 5 s to deliver a KV delete to the syncer's view."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def make_pod(
    name: str,
    node: str | None,
    *,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    nodeset: str = NODESET,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"nodeflow.dev/nodeset": nodeset},
            "annotations": annotations or {},
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running", "conditions": conditions or []},
    }


def make_node(
    name: str, *, unschedulable: bool = False, cordon_reason: str | None = None
) -> dict[str, Any]:
    annotations = {"nodeflow.dev/node-cordon-reason": cordon_reason} if cordon_reason else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations, "resourceVersion": "1"},
        "spec": {"unschedulable": True} if unschedulable else {},
    }


def make_nodeset(name: str = NODESET, cluster: str = CLUSTER) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"slurmCluster": cluster, "template": {}},
    }


class KubeKV:
    """Writes objects into the k8s_* buckets as k8s-watcher does."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        # One write at a time, as the API server orders them: a patch read before a delete
        # must not land after it (each write awaits a bucket lookup before it publishes).
        self._writes = asyncio.Lock()

    async def put(self, bucket: str, key: str, obj: dict[str, Any]) -> None:
        async with self._writes:
            await self._put(bucket, key, obj)

    async def _put(self, bucket: str, key: str, obj: dict[str, Any]) -> None:
        self.objects[(bucket, key)] = obj
        self.written(bucket, obj)
        kv = await self.bus.js.key_value(bucket)
        await kv.put(key, json.dumps(obj).encode())

    def written(self, bucket: str, obj: dict[str, Any]) -> None:
        """Each object as it is written (a put or a patch), in order: for recording."""

    async def delete(self, bucket: str, key: str) -> None:
        async with self._writes:
            self.objects.pop((bucket, key), None)
            kv = await self.bus.js.key_value(bucket)
            await kv.delete(key)

    async def patch(
        self, bucket: str, key: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """As the API server patches: the object as it is now, changed; nothing once it is
        deleted (a patch of a deleted pod is a 404, never the pod again)."""
        async with self._writes:
            current = self.objects.get((bucket, key))
            if current is not None:
                await self._put(bucket, key, change(current))

    async def put_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        await self.put("k8s_pods", subjects.object_key(meta["namespace"], meta["name"]), pod)

    async def put_node(self, node: dict[str, Any]) -> None:
        await self.put("k8s_nodes", subjects.object_key(None, node["metadata"]["name"]), node)

    async def put_nodeset(self, nodeset: dict[str, Any]) -> None:
        meta = nodeset["metadata"]
        await self.put(
            "k8s_nodesets", subjects.object_key(meta["namespace"], meta["name"]), nodeset
        )

    def pod(self, name: str) -> dict[str, Any]:
        return self.objects[("k8s_pods", subjects.object_key(NAMESPACE, name))]

    async def update_pod(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        pod = json.loads(json.dumps(self.pod(name)))
        change(pod)
        meta = pod["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        await self.put_pod(pod)


def slurm_conditions(pod: dict[str, Any]) -> dict[str, str]:
    """SlurmNodeState* condition type -> message of a pod."""
    return {
        c["type"]: c.get("message", "")
        for c in pod.get("status", {}).get("conditions", [])
        if c["type"].startswith("SlurmNodeState") and c.get("status") == "True"
    }


class FakeWatcher:
    """Consumes cmd.k8s.v1.> with a JetStream pull consumer; optionally applies patches."""

    def __init__(self, bus: Bus, kube: KubeKV, *, apply: bool = True) -> None:
        self.bus = bus
        self.kube = kube
        self.apply = apply
        self.commands: list[K8sCommand] = []
        self._task: asyncio.Task[None] | None = None
        self._subscription: Any = None

    async def start(self) -> None:
        self._subscription = await self.bus.js.pull_subscribe(
            subjects.K8S_COMMANDS, durable="test-watcher", stream="K8S_COMMANDS"
        )
        self._task = asyncio.create_task(self._run(self._subscription))

    async def stop(self) -> None:
        if self._task is not None:
            # nats-py can swallow a single cancel() of a fetch (the loop below then carries
            # on): cancel until it ends.
            await cancel_and_wait(self._task)
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()

    async def _run(self, subscription: Any) -> None:
        while True:
            try:
                msgs = await subscription.fetch(batch=256, timeout=0.2)
            except Exception:
                # nats-py may turn a cancellation into its own timeout error: give the cancel
                # an await to land on, and stop once the connection is gone (a closed client
                # fails every fetch at once, and the loop would spin through teardown).
                if self.bus.nc.is_closed:
                    return
                await asyncio.sleep(0.05)
                continue
            for msg in msgs:
                command = codec.decode(K8sCommand, msg.data, subject=msg.subject)
                self.commands.append(command)
                if self.apply:
                    await self._apply(command)
                await msg.ack()

    async def _apply(self, command: K8sCommand) -> None:
        operation = command.operation
        target = command.target
        if target.kind != "Pod":
            # The leader's Lease mirror (coordination.k8s.io Lease writes) is k8s-watcher's
            # business, not these tests': only pod patches are applied here.
            return
        assert isinstance(operation, PatchObject), operation

        def patched(pod: dict[str, Any]) -> dict[str, Any]:
            changed: dict[str, Any] = (
                strategic_merge_patch(pod, operation.patch)
                if operation.patch_type == "strategic"
                else merge_patch(pod, operation.patch)
            )
            meta = changed["metadata"]
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            return changed

        await self.kube.patch(
            "k8s_pods", subjects.object_key(target.namespace, target.name), patched
        )

    def of_kind(self, kind: str) -> list[K8sCommand]:
        """`conditions` (status patches), `pod-cordon` or `pod-uncordon` (annotation patches)."""
        return [c for c in self.commands if f":{kind}:" in c.idempotency_key]


@pytest.fixture
async def topology(bus: Bus) -> Bus:
    await ensure_topology(
        bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=CONSUMERS["slurm-syncer"]
    )
    return bus


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=sorted(SLURM_RELEASES))
async def slurm(clock: ManualClock, request: pytest.FixtureRequest) -> AsyncIterator[RunningSlurm]:
    """Time in the emulator moves only when a test advances `clock`. Every test runs against
    each emulated release (24.11: the syncer speaks v0.0.42; 26.05: v0.0.45)."""
    async with run_slurm_emulator(CLUSTER, clock=clock, slurm_version=request.param) as running:
        yield running


@pytest.fixture
def kube(topology: Bus) -> KubeKV:
    return KubeKV(topology)


@pytest.fixture
async def watcher(topology: Bus, kube: KubeKV) -> AsyncIterator[FakeWatcher]:
    fake = FakeWatcher(topology, kube)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def slurm_client(slurm: RunningSlurm, user: str = "slurm") -> SlurmClient:
    clock = slurm.emulator.clock
    tokens = SigningKeyTokens(user, slurm.key_path, lifespan=600, margin=60, clock=clock.now)
    return SlurmClient(CLUSTER, slurm.url, tokens, FAST_CLIENT)


@pytest.fixture
async def syncer(topology: Bus, slurm: RunningSlurm) -> AsyncIterator[Syncer]:
    client = slurm_client(slurm)
    # Tests poll by hand: a slurmd gets one poll after its pod runs to register, not an hour.
    options = SyncerOptions(poll_interval=3600.0, registration_wait=0.0)
    running = Syncer(topology, {CLUSTER: client}, options)
    try:
        yield running
    finally:
        await running.stop()
        await client.close()


@pytest.fixture
async def consumer(topology: Bus, syncer: Syncer) -> AsyncIterator[PullConsumer[SlurmNodeCommand]]:
    """The syncer's durable consumer of SLURM_COMMANDS, running its handler."""
    running = PullConsumer(
        topology,
        CONSUMERS["slurm-syncer"][0],
        SlurmNodeCommand,
        syncer.handle_command,
        ConsumerOptions(fetch_timeout=0.2, backoff=Backoff(initial=0.05, maximum=0.1)),
    )
    await running.start()
    try:
        yield running
    finally:
        await running.stop(1.0)


async def send_command(
    bus: Bus,
    op: SlurmOp,
    node: str,
    reason: str = "",
    cluster: str = CLUSTER,
    sender: str = "maintenance-scheduler",
) -> None:
    """Publish a SlurmNodeCommand as `sender` would."""
    command = SlurmNodeCommand(
        idempotency_key=f"test:{op}:{node}:{time.monotonic()}",
        sender=sender,
        sent_at=time.time(),
        cluster=cluster,
        node=node,
        op=op,
        reason=reason,
    )
    await bus.publish(command.subject, command, msg_id=command.idempotency_key)

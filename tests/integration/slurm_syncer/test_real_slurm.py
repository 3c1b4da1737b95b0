"""slurm-syncer against a real Slurm 24.11 (CI: `make test-real-slurm`), else the emulator.

The syncer runs in-process on a real NATS as in the other integration tests; the NodeSet pods
are named after real Slurm nodes and carry the cluster label. Each step acts on Slurm (a job,
an operator's drain) or on Kubernetes (SlurmDelete, a cordon) and then checks three things:
Slurm itself as slurmrestd reports it, the node state the syncer keeps in KV, and the pod's
conditions as the syncer's status patches leave them. See real_slurm_support.py for how the
Slurm is chosen.

Real Slurm shows a node `["IDLE", "NOT_RESPONDING"]` for 0.2-0.8 s after every UNDRAIN, until
slurmctld's fresh ping of slurmd is answered; the emulator here models that
(`resume_ping_seconds`), and every undrain below checks that the pod never shows it while a
node whose slurmd is really stopped is still reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

from clustersim.slurm import SLURM_RELEASES, RunningSlurm, run_slurm_emulator
from clustersim.slurm.auth import mint_rs256_token, new_rsa_key, write_jwks
from nodeflow_bus import Bus
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.slurm import SlurmNodeState
from slurm_syncer.auth import StaticToken
from slurm_syncer.client import SlurmAuthError, SlurmClient
from slurm_syncer.syncer import Syncer, SyncerOptions
from tests.conformance.slurm.support import wait_for
from tests.integration.slurm_syncer.conftest import (
    NAMESPACE,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_pod,
    slurm_conditions,
)
from tests.integration.slurm_syncer.real_slurm_support import (
    CLUSTER,
    EMULATED_CPUS,
    SYNCER_CLIENT,
    SlurmUnderTest,
    emulated_slurm_running,
    real_slurm,
    real_slurm_configured,
)

SLURM_CLUSTER_LABEL = "nodeflow.dev/slurm-cluster"
POD_CORDON = "nodeflow.dev/pod-cordon"
# How long Slurm may take to show a step: scheduling, job end and completion, a poll or two.
STEP_TIMEOUT = 20.0
Conditions = dict[str, str]

IDLE = "SlurmNodeStateIdle"
ALLOCATED = "SlurmNodeStateAllocated"
DRAIN = "SlurmNodeStateDrain"
NOT_RESPONDING = "SlurmNodeStateNotResponding"
DOWN = "SlurmNodeStateDown"
# How long the emulated slurmd takes to answer the ping after an UNDRAIN (real: 0.2-0.8 s).
EMULATED_PING_SECONDS = 0.3
# tools/slurm/real_slurm.sh's root, where the slurmd pid files are (its start prints it).
REAL_SLURM_ROOT = Path(os.environ.get("NODEFLOW_SLURM_ROOT", "/var/tmp/nodeflow-slurm/trixie/root"))


class RecordingKube(KubeKV):
    """KubeKV that remembers every distinct set of Slurm conditions each pod went through,
    so a test can check the order of the steps, not only where they ended."""

    def __init__(self, bus: Bus) -> None:
        super().__init__(bus)
        self.history: dict[str, list[Conditions]] = {}

    def written(self, bucket: str, obj: dict[str, Any]) -> None:
        if bucket != "k8s_pods":
            return
        seen = self.history.setdefault(obj["metadata"]["name"], [])
        current = slurm_conditions(obj)
        if not seen or seen[-1] != current:
            seen.append(current)


def went_through(history: Sequence[Conditions], steps: Sequence[Conditions]) -> bool:
    """`steps` appear in `history` in this order (other, passing states may come between)."""
    remaining = iter(history)
    return all(any(seen == step for seen in remaining) for step in steps)


class Slurmd:
    """Stops and starts one node's slurmd: the real daemon in real_slurm.sh's root, or the
    emulator's node (lost: DOWN and NOT_RESPONDING at once; back: registered again)."""

    def __init__(self, emulated: RunningSlurm | None) -> None:
        self.emulated = emulated
        self.stopped: set[str] = set()

    async def stop(self, node: str) -> None:
        self.stopped.add(node)
        if self.emulated is not None:
            self.emulated.emulator.cluster.mark_lost(node)
            return
        pid = int((REAL_SLURM_ROOT / "run" / f"slurmd-{node}.pid").read_text().strip())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, f"slurmd of {node} (pid {pid}) did not exit"
            await asyncio.sleep(0.05)

    async def start(self, node: str) -> None:
        self.stopped.discard(node)
        if self.emulated is not None:
            self.emulated.emulator.register_node(node, cpus=EMULATED_CPUS, real_memory=1000)
            return
        path = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
        command = ["chroot", str(REAL_SLURM_ROOT), "/usr/bin/env", "-i", path]
        process = await asyncio.create_subprocess_exec(*command, "/usr/sbin/slurmd", "-N", node)
        assert await process.wait() == 0, f"slurmd -N {node} did not start"


@contextlib.asynccontextmanager
async def emulated_slurm_pinging(
    session: aiohttp.ClientSession, slurm_version: str
) -> AsyncIterator[tuple[SlurmUnderTest, RunningSlurm]]:
    """real_slurm_support's emulator, but with real Slurm's ping after an UNDRAIN and its
    ReturnToService=2 (a node whose slurmd comes back returns to service)."""
    async with emulated_slurm_running(
        session,
        resume_ping_seconds=EMULATED_PING_SECONDS,
        return_to_service=2,
        slurm_version=slurm_version,
    ) as pair:
        yield pair


# The real Slurm is the one release NODEFLOW_SLURM_URL names; the emulator runs as each.
@pytest.fixture(params=["real"] if real_slurm_configured() else sorted(SLURM_RELEASES))
async def slurm_and_slurmd(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[SlurmUnderTest, Slurmd]]:
    async with aiohttp.ClientSession() as session, contextlib.AsyncExitStack() as stack:
        if real_slurm_configured():
            slurm = await stack.enter_async_context(real_slurm(session))
            slurmd = Slurmd(None)
        else:
            slurm, running = await stack.enter_async_context(
                emulated_slurm_pinging(session, request.param)
            )
            slurmd = Slurmd(running)
        try:
            yield slurm, slurmd
        finally:
            for node in sorted(slurmd.stopped):
                await slurmd.start(node)
            await slurm.clean_up()


@pytest.fixture
def under_test(slurm_and_slurmd: tuple[SlurmUnderTest, Slurmd]) -> SlurmUnderTest:
    return slurm_and_slurmd[0]


@pytest.fixture
def slurmd(slurm_and_slurmd: tuple[SlurmUnderTest, Slurmd]) -> Slurmd:
    return slurm_and_slurmd[1]


@pytest.fixture
def kube(topology: Bus) -> RecordingKube:
    return RecordingKube(topology)


class SlurmReads:
    """Every node state the syncer read from Slurm (polls and reads after its updates)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[str]]] = []

    def record_from(self, client: SlurmClient) -> None:
        get_node, list_nodes = client.get_node, client.list_nodes

        async def recording_get_node(name: str) -> dict[str, Any] | None:
            node = await get_node(name)
            if node is not None:
                self.seen.append((name, list(node["state"])))
            return node

        async def recording_list_nodes() -> list[dict[str, Any]]:
            nodes = await list_nodes()
            self.seen.extend((node["name"], list(node["state"])) for node in nodes)
            return nodes

        setattr(client, "get_node", recording_get_node)  # noqa: B010
        setattr(client, "list_nodes", recording_list_nodes)  # noqa: B010

    def not_responding(self, node: str) -> bool:
        return any(name == node and "NOT_RESPONDING" in state for name, state in self.seen)


@pytest.fixture
def reads() -> SlurmReads:
    return SlurmReads()


@pytest.fixture
async def syncer(
    topology: Bus, under_test: SlurmUnderTest, reads: SlurmReads
) -> AsyncIterator[Syncer]:
    """The syncer polling every half second, as deployed but faster."""
    client = under_test.syncer_client()
    reads.record_from(client)
    running = Syncer(topology, {CLUSTER: client}, SyncerOptions(poll_interval=0.5))
    try:
        yield running
    finally:
        await running.stop()
        await client.close()


def nodeset_pod(slurm_node: str, kube_node: str) -> dict[str, Any]:
    """A NodeSet pod named after its Slurm node; the label names the Slurm cluster."""
    pod = make_pod(slurm_node, kube_node)
    pod["metadata"]["labels"][SLURM_CLUSTER_LABEL] = CLUSTER
    return pod


async def stored_state(bus: Bus, node: str) -> SlurmNodeState:
    kv = await bus.js.key_value("slurm_nodes")
    entry = await kv.get(subjects.slurm_node_key(CLUSTER, node))
    return codec.decode(SlurmNodeState, entry.value or b"", subject="kv")


async def slurm_state(slurm: SlurmUnderTest, node: str) -> list[str]:
    return list((await slurm.node(node))["state"])


async def becomes(slurm: SlurmUnderTest, node: str, state: list[str]) -> None:
    async def reached() -> bool:
        return await slurm_state(slurm, node) == state

    await wait_for(reached, f"{node} to be {state}", timeout=STEP_TIMEOUT)


def assert_never_not_responding(
    history: Sequence[Conditions], reads: SlurmReads, node: str
) -> None:
    """The pod never showed NotResponding, though Slurm did show it after the undrain."""
    assert reads.not_responding(node), f"no read of {node} showed the UNDRAIN's NOT_RESPONDING"
    assert not [seen for seen in history if NOT_RESPONDING in seen], history


async def test_job_then_drain_for_deletion_shows_draining_drained_and_undrains(
    topology: Bus,
    under_test: SlurmUnderTest,
    kube: RecordingKube,
    watcher: FakeWatcher,
    syncer: Syncer,
    reads: SlurmReads,
) -> None:
    slurm = under_test
    name = await slurm.take_free_node()
    await kube.put_node(make_node("k8s-1"))
    await kube.put_pod(nodeset_pod(name, "k8s-1"))
    await syncer.start()

    def conditions() -> Conditions:
        return slurm_conditions(kube.pod(name))

    await eventually(lambda: conditions() == {IDLE: ""}, STEP_TIMEOUT)

    # A job on the node: ALLOCATED, and the pod follows.
    job = await slurm.submit_sleep(name)
    await eventually(lambda: conditions() == {ALLOCATED: ""}, STEP_TIMEOUT)
    assert (await slurm.job_state(job))[:1] == ["RUNNING"]
    assert (await stored_state(topology, name)).busy

    # The NodeSet schedules the pod for deletion while the job runs: the syncer drains with a
    # reason of ours; ALLOCATED+DRAIN is Draining.
    scheduled = {"type": "SlurmDelete", "status": "True", "reason": "ScalingDeleteScheduled"}
    await kube.update_pod(name, lambda p: p["status"]["conditions"].append(scheduled))
    await eventually(lambda: DRAIN in conditions(), STEP_TIMEOUT)
    node = await slurm.node(name)
    reason = node["reason"]
    assert reason.startswith("slurm-operator: delete: ScalingDeleteScheduled: ")
    assert f"pod {NAMESPACE}/{name}" in reason
    assert node["state"] == ["ALLOCATED", "DRAIN"]
    assert conditions() == {ALLOCATED: reason, DRAIN: reason}
    assert (await slurm.job_state(job))[:1] == ["RUNNING"], "the job ended before the drain"
    draining = await stored_state(topology, name)
    assert draining.draining and not draining.drained and draining.reason_is_ours

    # The job ends: IDLE+DRAIN, Drained, the reason kept.
    await eventually(lambda: conditions() == {IDLE: reason, DRAIN: reason}, STEP_TIMEOUT)
    assert await slurm_state(slurm, name) == ["IDLE", "DRAIN"]
    assert (await slurm.node(name))["reason"] == reason
    drained = await stored_state(topology, name)
    assert drained.drained and not drained.draining and drained.reason == reason

    # The NodeSet scales back up: SlurmDelete removed, the node undrained. Slurm shows
    # IDLE+NOT_RESPONDING for a moment after the UNDRAIN; the pod never does.
    await kube.update_pod(
        name,
        lambda p: p["status"].update(
            conditions=[c for c in p["status"]["conditions"] if c["type"] != "SlurmDelete"]
        ),
    )
    await eventually(lambda: conditions() == {IDLE: ""}, STEP_TIMEOUT)
    # Slurm itself may still show the UNDRAIN's NOT_RESPONDING for a moment.
    await becomes(slurm, name, ["IDLE"])
    assert not (await stored_state(topology, name)).drain

    steps = [
        {IDLE: ""},
        {ALLOCATED: ""},
        {ALLOCATED: reason, DRAIN: reason},
        {IDLE: reason, DRAIN: reason},
        {IDLE: ""},
    ]
    assert went_through(kube.history[name], steps), kube.history[name]
    assert_never_not_responding(kube.history[name], reads, name)
    # Drains for deletion never touch the Kubernetes node or mark the pod cordoned.
    assert not watcher.of_kind("pod-cordon")


async def test_cordon_drains_and_an_operators_drain_is_left_untouched(
    topology: Bus,
    under_test: SlurmUnderTest,
    kube: RecordingKube,
    watcher: FakeWatcher,
    syncer: Syncer,
    reads: SlurmReads,
) -> None:
    slurm = under_test
    ours, theirs = await slurm.take_free_node(), await slurm.take_free_node()
    external = f"bad DIMM, ticket {uuid.uuid4().hex[:8]} (operator)"
    await slurm.drain_as_admin(theirs, external)
    # Both pods on one Kubernetes node: one cordon reaches both in the same pass, so the drain
    # of `ours` shows that the syncer has seen the cordon of `theirs` too.
    await kube.put_node(make_node("k8s-1"))
    await kube.put_pod(nodeset_pod(ours, "k8s-1"))
    scheduled = {"type": "SlurmDelete", "status": "True", "reason": "RollingDeleteScheduled"}
    theirs_pod = nodeset_pod(theirs, "k8s-1")
    theirs_pod["status"]["conditions"].append(scheduled)
    await kube.put_pod(theirs_pod)
    await syncer.start()

    def of(node: str) -> Conditions:
        return slurm_conditions(kube.pod(node))

    await eventually(lambda: of(ours) == {IDLE: ""}, STEP_TIMEOUT)
    await eventually(lambda: of(theirs) == {IDLE: external, DRAIN: external}, STEP_TIMEOUT)
    before = await slurm.node(theirs)

    await kube.put_node(make_node("k8s-1", unschedulable=True, cordon_reason="disk failing"))
    reason = "slurm-operator: cordon: disk failing"
    await eventually(lambda: of(ours) == {IDLE: reason, DRAIN: reason}, STEP_TIMEOUT)
    assert await slurm_state(slurm, ours) == ["IDLE", "DRAIN"]
    assert (await slurm.node(ours))["reason"] == reason
    await eventually(lambda: kube.pod(ours)["metadata"]["annotations"].get(POD_CORDON) == "true")
    # Two more full passes for good measure: the operator's drain is still exactly as set,
    # through the cordon and a SlurmDelete, and that pod is not even marked.
    for _ in range(2):
        assert (await syncer.poll_once(CLUSTER)).ok
    after = await slurm.node(theirs)
    for key in ("state", "reason", "reason_set_by_user", "reason_changed_at"):
        assert after[key] == before[key], key
    assert POD_CORDON not in kube.pod(theirs)["metadata"]["annotations"]
    assert of(theirs) == {IDLE: external, DRAIN: external}

    # Uncordoned: the pod's mark came from the node and goes with it; our drain is undone.
    await kube.put_node(make_node("k8s-1"))
    await eventually(
        lambda: POD_CORDON not in kube.pod(ours)["metadata"]["annotations"], STEP_TIMEOUT
    )
    await eventually(lambda: of(ours) == {IDLE: ""}, STEP_TIMEOUT)
    await becomes(slurm, ours, ["IDLE"])
    assert went_through(
        kube.history[ours], [{IDLE: ""}, {IDLE: reason, DRAIN: reason}, {IDLE: ""}]
    ), kube.history[ours]
    assert_never_not_responding(kube.history[ours], reads, ours)

    assert (await syncer.poll_once(CLUSTER)).ok
    after = await slurm.node(theirs)
    for key in ("state", "reason", "reason_set_by_user", "reason_changed_at"):
        assert after[key] == before[key], key
    assert of(theirs) == {IDLE: external, DRAIN: external}
    assert len(watcher.of_kind("pod-cordon")) == 1
    assert len(watcher.of_kind("pod-uncordon")) == 1


async def test_a_node_whose_slurmd_stopped_is_reported_not_responding_after_the_undrain(
    topology: Bus,
    under_test: SlurmUnderTest,
    slurmd: Slurmd,
    kube: RecordingKube,
    watcher: FakeWatcher,
    syncer: Syncer,
) -> None:
    """The confirmation rule holds a NOT_RESPONDING back only until it is confirmed: a node
    whose slurmd is gone when the syncer undrains it stays NOT_RESPONDING in Slurm (the ping
    slurmctld sends after the UNDRAIN is never answered), and the pod shows it."""
    slurm = under_test
    name = await slurm.take_free_node()
    await kube.put_node(make_node("k8s-1"))
    scheduled = {"type": "SlurmDelete", "status": "True", "reason": "ScalingDeleteScheduled"}
    pod = nodeset_pod(name, "k8s-1")
    pod["status"]["conditions"].append(scheduled)
    await kube.put_pod(pod)
    await syncer.start()

    def conditions() -> Conditions:
        return slurm_conditions(kube.pod(name))

    await eventually(lambda: DRAIN in conditions(), STEP_TIMEOUT)
    await slurmd.stop(name)
    # Scaled back up while slurmd is gone: the syncer undrains (on the emulator the node is
    # already DOWN, so it is left alone); either way Slurm keeps the node NOT_RESPONDING.
    await kube.update_pod(
        name,
        lambda p: p["status"].update(
            conditions=[c for c in p["status"]["conditions"] if c["type"] != "SlurmDelete"]
        ),
    )
    shown = await eventually(
        lambda: conditions() if NOT_RESPONDING in conditions() else None, STEP_TIMEOUT
    )
    assert "NOT_RESPONDING" in await slurm_state(slurm, name)
    assert (await stored_state(topology, name)).flags[-1:] == ("NotResponding",)
    # Reported once and kept while Slurm shows it: no flapping back.
    for _ in range(2):
        assert (await syncer.poll_once(CLUSTER)).ok
    assert NOT_RESPONDING in conditions(), kube.history[name]
    if DOWN in shown:
        assert "DOWN" in await slurm_state(slurm, name)
    await slurmd.start(name)

    async def responding_again() -> bool:
        return "NOT_RESPONDING" not in await slurm_state(slurm, name)

    await wait_for(responding_again, f"{name} to answer again", timeout=STEP_TIMEOUT)
    await eventually(lambda: NOT_RESPONDING not in conditions(), STEP_TIMEOUT)


# ---- RS256 tokens from a token file, where slurmctld runs with jwks= (issue 30 item 4) ----

EMULATED_JWKS_KID = "idp-rs256"


@contextlib.asynccontextmanager
async def rs256_slurm(tmp_path: Path) -> AsyncIterator[tuple[str, RSAPrivateKey, str]]:
    """A slurmrestd whose slurmctld takes RS256 tokens through `jwks=`, the private key that
    signs them and its `kid`: the real Slurm as tools/slurm/real_slurm.sh configures it (the
    key stands in for an identity provider's), else the emulator given a JWKS."""
    if real_slurm_configured():
        key_file = os.environ.get("NODEFLOW_SLURM_JWKS_PRIVATE_KEY", "")
        kid = os.environ.get("NODEFLOW_SLURM_JWKS_KID", "")
        if not (key_file and kid):
            pytest.fail("the real Slurm's start printed no NODEFLOW_SLURM_JWKS_* (jwks=) settings")
        private = serialization.load_pem_private_key(Path(key_file).read_bytes(), None)
        assert isinstance(private, RSAPrivateKey)
        yield os.environ["NODEFLOW_SLURM_URL"].rstrip("/"), private, kid
        return
    private = new_rsa_key()
    jwks_path = tmp_path / "jwks.json"
    write_jwks(jwks_path, {EMULATED_JWKS_KID: private})
    async with run_slurm_emulator(CLUSTER, jwks_path=jwks_path) as running:
        for name in ("a-000-001", "a-000-002"):
            running.emulator.register_node(name, cpus=EMULATED_CPUS, real_memory=1000)
        yield running.url, private, EMULATED_JWKS_KID


async def test_rs256_tokens_from_a_rotated_token_file_are_accepted_through_jwks(
    tmp_path: Path,
) -> None:
    async with rs256_slurm(tmp_path) as (url, private, kid):
        token_file = tmp_path / "token"

        def refresh(signing: RSAPrivateKey = private) -> str:
            # As an operator's refresher: a new token from the identity provider, written whole.
            token = mint_rs256_token(signing, kid, "root", time.time(), lifespan=300)
            staged = tmp_path / "token.new"
            staged.write_text(token + "\n", encoding="utf-8")
            staged.replace(token_file)
            return token

        first = refresh()
        tokens = StaticToken("root", path=token_file, margin=30)
        client = SlurmClient(CLUSTER, url, tokens, SYNCER_CLIENT)
        try:
            assert await client.list_nodes()
            assert tokens.token() == first
            second = refresh()  # rotated: picked up at once, accepted as well
            assert await client.list_nodes()
            assert tokens.token() == second
            # A token signed by a key the JWKS does not hold is refused by slurmctld.
            refresh(new_rsa_key())
            with pytest.raises(SlurmAuthError):
                await client.list_nodes()
        finally:
            await client.close()

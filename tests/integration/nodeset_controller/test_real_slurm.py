"""NodeSet safe deletion end to end on a real Slurm 24.11 (CI: `make test-real-slurm`), else on
the Slurm emulator (the normal suite); see real_slurm_support.py for how the Slurm is chosen.

The whole stack runs in-process: real NATS, the Kubernetes API emulator with its simulated
scheduler and kubelet, k8s-watcher, slurm-syncer polling the Slurm under test, and the
nodeset-controller. The two Kubernetes nodes get the InternalIPs whose NodeSet pods (prefix
`a`) are named like two free Slurm nodes (10.174.0.3 -> a-000-003), so each pod owns its Slurm
node as slurmd in a NodeSet pod would. The Slurm under test runs its slurmd beside the stack,
so a node outlives its pod: after the pod is deleted it stays registered (IDLE+DRAIN) until a
new pod comes and the syncer undrains it.

Every check reads Slurm through slurmrestd and the pods through the Kubernetes API (a watch
records every version of every pod), never the services' internals.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
import pytest

from clustersim.runner import Simulator
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_runtime.natsd import NatsServerProcess
from tests.conformance.slurm.support import wait_for
from tests.integration.nodeset_controller.conftest import (
    NS,
    SLURM_DELETE,
    Stack,
    condition,
    is_ready,
    run_stack,
)
from tests.integration.slurm_syncer.conftest import slurm_conditions
from tests.integration.slurm_syncer.real_slurm_support import (
    CLUSTER,
    SlurmUnderTest,
    slurm_under_test,
)

NODESET = "compute"
PREFIX = "a"
NODESET_LABEL = "nodeflow.dev/nodeset"
IP_PREFIX = "10.174"
# Upper bound for one step on the real Slurm: a syncer poll or two, scheduling, a job's
# completion, a pod's termination grace; several times that for a machine under load.
STEP_TIMEOUT = 45.0
# The syncer polls this often; with the controller's 0.5 s resync a few rounds fit in HOLD.
POLL_SECONDS = 0.5
HOLD_SECONDS = 2.0
# The jobs are cancelled once the test has seen what it needs; this only bounds a job whose
# test failed first (SlurmUnderTest.clean_up cancels it too). Under the submit's 1 min limit.
JOB_SECONDS = 55
SCHEDULED_FOR_SCALING = "ScalingDeleteScheduled"

IDLE = "SlurmNodeStateIdle"
ALLOCATED = "SlurmNodeStateAllocated"
DRAIN = "SlurmNodeStateDrain"
Json = dict[str, Any]


def internal_ip_for(slurm_node: str) -> str:
    """The InternalIP whose NodeSet pod is named `slurm_node`: a-000-003 -> 10.174.0.3."""
    prefix, third, fourth = (
        slurm_node.rsplit("-", 2) if slurm_node.count("-") >= 2 else ("", "", "")
    )
    if prefix != PREFIX or not (third.isdigit() and fourth.isdigit()):
        pytest.fail(
            f"Slurm node {slurm_node!r} cannot be a NodeSet pod: {PREFIX}-<octet>-<octet> needed "
            "(tools/slurm/real_slurm.sh names them a-000-001 ...)"
        )
    return f"{IP_PREFIX}.{int(third)}.{int(fourth)}"


def give_addresses(slurm_nodes: Sequence[str]) -> Callable[[Simulator], None]:
    """Before anything watches the cluster: Kubernetes node i gets the IP of Slurm node i."""

    def prepare(sim: Simulator) -> None:
        for kube_node, slurm_node in zip(sorted(sim.node_names()), slurm_nodes, strict=True):
            addresses = [
                {"type": "InternalIP", "address": internal_ip_for(slurm_node)},
                {"type": "Hostname", "address": kube_node},
            ]
            sim.store.patch(
                "nodes", kube_node, {"status": {"addresses": addresses}}, subresource="status"
            )

    return prepare


@dataclass
class PodWatch:
    """Every version of the NodeSet's pods, as a watch on the Kubernetes API delivers them."""

    session: aiohttp.ClientSession
    kube_url: str
    versions: dict[str, list[Json]] = field(default_factory=dict)
    current: dict[str, Json] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        response = await self.session.get(
            f"{self.kube_url}/api/v1/namespaces/{NS}/pods",
            params={"watch": "true", "labelSelector": f"{NODESET_LABEL}={NODESET}"},
            timeout=aiohttp.ClientTimeout(total=None),
        )
        response.raise_for_status()
        self._task = asyncio.create_task(self._read(response), name="pod-watch")

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        async with response:
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
                    raise AssertionError(f"unexpected watch event: {event}")
                pod = event["object"]
                name = pod["metadata"]["name"]
                self.versions.setdefault(name, []).append(pod)
                if event["type"] == "DELETED":
                    self.current.pop(name, None)
                else:
                    self.current[name] = pod
        raise AssertionError("the pod watch ended while the test ran")

    async def stop(self) -> None:
        if self._task is not None:
            # One cancel() can be swallowed by a wait inside the library on Python 3.11.
            await cancel_and_wait(self._task)

    def _alive(self) -> None:
        if self._task is not None and self._task.done():
            self._task.result()  # raises what ended it

    def pod(self, name: str) -> Json | None:
        """The pod as it is now (None: never created, or deleted)."""
        self._alive()
        return self.current.get(name)

    def gone(self, name: str) -> bool:
        self._alive()
        return name in self.versions and name not in self.current

    def ever(self, name: str, predicate: Callable[[Json], bool]) -> bool:
        return any(predicate(pod) for pod in self.versions.get(name, ()))


@dataclass
class Scene:
    stack: Stack
    slurm: SlurmUnderTest
    pods: PodWatch
    nodes: tuple[str, str]  # two free Slurm nodes, the names the NodeSet's pods get


@pytest.fixture
async def scene(nats_server: NatsServerProcess) -> AsyncIterator[Scene]:
    # Leaving the blocks in reverse stops the stack first, so the syncer cannot drain again
    # after slurm_under_test has cancelled the jobs and undrained the nodes.
    async with slurm_under_test() as slurm:
        first, second = await slurm.take_free_node(), await slurm.take_free_node()
        nodes = (first, second) if first < second else (second, first)
        async with (
            run_stack(
                nats_server.url,
                nodes=2,
                slurm_clients=lambda _: {CLUSTER: slurm.syncer_client()},
                prepare=give_addresses(nodes),
                poll_interval=POLL_SECONDS,
            ) as stack,
            aiohttp.ClientSession() as session,
        ):
            pods = PodWatch(session, stack.sim.kube_url)
            await pods.start()
            try:
                yield Scene(stack=stack, slurm=slurm, pods=pods, nodes=nodes)
            finally:
                await pods.stop()


def scheduled_for_scaling(pod: Json) -> bool:
    found = condition(pod, SLURM_DELETE)
    return (
        found is not None
        and found.get("status") == "True"
        and found.get("reason") == SCHEDULED_FOR_SCALING
    )


def terminating(pod: Json) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def live_with(pods: PodWatch, name: str, conditions: dict[str, str]) -> Json | None:
    """The pod, Ready and not terminating, with exactly these Slurm conditions; else None."""
    pod = pods.pod(name)
    if pod is None or terminating(pod) or not is_ready(pod):
        return None
    return pod if slurm_conditions(pod) == conditions else None


async def slurm_state(slurm: SlurmUnderTest, name: str) -> list[str]:
    return list((await slurm.node(name))["state"])


async def state_is(slurm: SlurmUnderTest, name: str, expected: list[str]) -> list[str] | None:
    state = await slurm_state(slurm, name)
    return state if state == expected else None


async def until(predicate: Callable[[], Any], what: str, timeout: float = STEP_TIMEOUT) -> Any:
    """`predicate` may be sync or async; polled until truthy."""

    async def probe() -> Any:
        value = predicate()
        return await value if asyncio.iscoroutine(value) else value

    return await wait_for(probe, what, timeout=timeout, interval=0.1)


async def nodeset_ready_and_idle(scene: Scene, replicas: int) -> dict[str, str]:
    """Create the NodeSet; wait until its pods (named like our Slurm nodes) are Ready and the
    syncer has reported their nodes IDLE on them. Pod name -> uid."""
    stack, pods, nodes = scene.stack, scene.pods, scene.nodes
    await stack.start_controller()
    stack.create_nodeset(NODESET, replicas, slurmCluster=CLUSTER, podNamePrefix=PREFIX)
    for name in nodes[:replicas]:
        await until(partial(live_with, pods, name, {IDLE: ""}), f"pod {name} Ready and Idle")
        assert await slurm_state(scene.slurm, name) == ["IDLE"]
    assert sorted(pods.current) == sorted(nodes[:replicas])
    return {name: pods.current[name]["metadata"]["uid"] for name in pods.current}


async def running_on(slurm: SlurmUnderTest, pods: PodWatch, node: str) -> int:
    """A job on every CPU of `node`, running, and the syncer showing it on the pod."""
    job = await slurm.submit_sleep(node, seconds=JOB_SECONDS)
    await until(
        lambda: live_with(pods, node, {ALLOCATED: ""}), f"job {job} on {node}, pod Allocated"
    )
    assert (await slurm.job_state(job))[:1] == ["RUNNING"]
    return job


async def drained_for_deletion(slurm: SlurmUnderTest, name: str) -> str:
    """The reason the syncer drained `name` with, checked to be the deletion's."""
    reason = str((await slurm.node(name))["reason"])
    assert reason.startswith(f"slurm-operator: delete: {SCHEDULED_FOR_SCALING}: "), reason
    assert f"pod {NS}/{name}" in reason, reason
    return reason


async def holds(check: Callable[[], Any], seconds: float, what: str) -> None:
    """`check` stays truthy for `seconds` (a few syncer polls and controller rounds)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        assert await value if asyncio.iscoroutine(value) else value, what
        await asyncio.sleep(0.1)


async def test_scale_to_zero_deletes_the_idle_pod_and_waits_for_the_job_then_scale_up_undrains(
    scene: Scene,
) -> None:
    stack, slurm, pods = scene.stack, scene.slurm, scene.pods
    idle, busy = scene.nodes
    await nodeset_ready_and_idle(scene, 2)
    job = await running_on(slurm, pods, busy)

    stack.patch_nodeset(NODESET, {"replicas": 0})
    # Both pods are scheduled for deletion; the idle one is drained in Slurm and deleted.
    await until(lambda: pods.gone(idle), f"idle pod {idle} deleted")
    assert pods.ever(idle, scheduled_for_scaling), pods.versions[idle]
    assert await slurm_state(slurm, idle) == ["IDLE", "DRAIN"]
    await drained_for_deletion(slurm, idle)

    # The busy one is draining (ALLOCATED+DRAIN) and kept while its job runs.
    await until(lambda: state_is(slurm, busy, ["ALLOCATED", "DRAIN"]), f"{busy} draining")
    reason = await drained_for_deletion(slurm, busy)
    await until(
        lambda: live_with(pods, busy, {ALLOCATED: reason, DRAIN: reason}),
        f"pod {busy} showing Allocated+Drain",
    )
    pod = pods.pod(busy)
    assert pod is not None and scheduled_for_scaling(pod), pod

    async def busy_kept() -> bool:
        current = pods.pod(busy)
        running = (await slurm.job_state(job))[:1] == ["RUNNING"]
        return running and current is not None and not terminating(current)

    await holds(busy_kept, HOLD_SECONDS, f"pod {busy} kept while job {job} runs")

    # The job ends: drained and idle, so the pod goes too (and only now).
    seen_while_running = len(pods.versions[busy])
    (await slurm.target.cancel(job)).ok()
    await until(lambda: pods.gone(busy), f"pod {busy} deleted after its job ended")
    assert not any(terminating(p) for p in pods.versions[busy][:seen_while_running])
    assert await slurm_state(slurm, busy) == ["IDLE", "DRAIN"]
    assert (await slurm.node(busy))["reason"] == reason
    assert (await slurm.job_state(job))[:1] in (["CANCELLED"], [])

    # Scaled back up: new pods on the same nodes, and the syncer undrains their Slurm nodes.
    stack.patch_nodeset(NODESET, {"replicas": 2})
    for name in scene.nodes:
        await until(partial(live_with, pods, name, {IDLE: ""}), f"pod {name} back and Idle")
        await until(partial(state_is, slurm, name, ["IDLE"]), f"{name} undrained")
        current = pods.pod(name)
        assert current is not None and condition(current, SLURM_DELETE) is None, current


async def test_scale_down_then_up_while_the_job_runs_cancels_the_deletion_and_undrains(
    scene: Scene,
) -> None:
    stack, slurm, pods = scene.stack, scene.slurm, scene.pods
    uids = await nodeset_ready_and_idle(scene, 2)
    # Jobs on both: whichever pod the scale-down picks is running one.
    jobs = {name: await running_on(slurm, pods, name) for name in scene.nodes}

    stack.patch_nodeset(NODESET, {"replicas": 1})
    marked = await until(
        lambda: next((n for n, p in pods.current.items() if scheduled_for_scaling(p)), None),
        "one pod scheduled for deletion",
    )
    (kept,) = set(scene.nodes) - {marked}
    await until(lambda: state_is(slurm, marked, ["ALLOCATED", "DRAIN"]), f"{marked} draining")
    reason = await drained_for_deletion(slurm, marked)
    await until(
        lambda: live_with(pods, marked, {ALLOCATED: reason, DRAIN: reason}),
        f"pod {marked} showing Allocated+Drain",
    )
    assert await slurm_state(slurm, kept) == ["ALLOCATED"]
    kept_pod = pods.pod(kept)
    assert kept_pod is not None and condition(kept_pod, SLURM_DELETE) is None

    # Back to 2 before the job ends: the condition goes, the node is undrained, the pod stays.
    stack.patch_nodeset(NODESET, {"replicas": 2})
    await until(lambda: live_with(pods, marked, {ALLOCATED: ""}), f"pod {marked} undrained")
    pod = pods.pod(marked)
    assert pod is not None and not scheduled_for_scaling(pod), pod
    # slurmctld shows NOT_RESPONDING for up to a second after an undrain (the syncer does not
    # report it to the pod): wait for Slurm to settle rather than read it once.
    await until(lambda: state_is(slurm, marked, ["ALLOCATED"]), f"{marked} undrained in Slurm")
    for name, job in jobs.items():
        assert (await slurm.job_state(job))[:1] == ["RUNNING"], name
        current = pods.pod(name)
        assert current is not None and current["metadata"]["uid"] == uids[name]
        assert not pods.ever(name, terminating), name
    await until(lambda: stack.events("DeleteCancelled"), "a DeleteCancelled event")
